//! Idle workers: who is parked, and where a worker with nothing of its own helps: stealing part of
//! a backlog ([`stealing`](crate::engine::stealing)) or standing in for a stuck owner
//! ([`stuck_owners`](crate::engine::stuck_owners)). Waking costs system calls, so a helper is woken
//! only for something to do.

#![cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]

use std::time::Instant;

use crate::engine::shard::Shard;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::tuning::{STEAL_MIN, WAKE_FOR_TICK_PARTS};

/// The engine's balancing settings and its record of parked workers.
pub(crate) struct IdleWorkers {
    pub(crate) stealing: bool,
    /// Ticks an owner may go without looking at its wheel before another stands in.
    pub(crate) rescue_after: Option<u64>,
    /// Bit `i % 64` of word `i / 64`: worker `i` is parked.
    idle: Box<[AtomicU64]>,
    /// 1 while a parked worker watches for stuck owners (at most one).
    pub(super) watching: AtomicU64,
    /// Nanoseconds of callbacks a backlog must hold before a parked worker is woken for it.
    pub(super) wake_for_ns: u64,
}

impl IdleWorkers {
    /// `tick_ns`: the engine's tick, in nanoseconds.
    pub(crate) fn new(
        workers: usize,
        stealing: bool,
        rescue_after: Option<u64>,
        tick_ns: u64,
    ) -> Self {
        Self {
            stealing,
            rescue_after,
            wake_for_ns: tick_ns / WAKE_FOR_TICK_PARTS,
            idle: (0..workers.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            watching: AtomicU64::new(0),
        }
    }

    /// Wakes one parked worker, if any, to help.
    pub(crate) fn wake_one(&self, shards: &[Shard]) {
        for (word_index, word) in self.idle.iter().enumerate() {
            let mut bits = word.load(Ordering::SeqCst);
            while bits != 0 {
                let bit = 1 << bits.trailing_zeros();
                let before = word.fetch_and(!bit, Ordering::SeqCst);
                if before & bit != 0 {
                    let worker = word_index * 64 + bit.trailing_zeros() as usize;
                    if let Some(thread) = shards.get(worker).and_then(|s| s.thread.get()) {
                        thread.unpark();
                    }
                    return;
                }
                bits = before & !bit;
            }
        }
    }

    /// Worker `me` is about to park: it becomes wakeable, and learns until when to watch for stuck
    /// owners. `None` if work is already waiting: then it must not park.
    pub(crate) fn begin_idle(&self, shards: &[Shard], me: usize, now_tick: u64) -> Option<Idle> {
        self.set_idle(me, true);
        // One watcher at a time.
        let watch = self.watch_until(shards, me, now_tick).filter(|_| {
            self.watching
                .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        });
        let idle = Idle { watch, me };
        // After publishing the idle bit (SeqCst): an owner that filled its queue since wakes this
        // worker, or this look sees the backlog.
        if self.work_waiting(shards, me, now_tick) {
            self.end_idle(idle);
            return None;
        }
        Some(idle)
    }

    /// The worker is awake again.
    pub(crate) fn end_idle(&self, idle: Idle) {
        if idle.watch.is_some() {
            self.watching.fetch_sub(1, Ordering::SeqCst);
        }
        self.set_idle(idle.me, false);
    }

    fn set_idle(&self, me: usize, idle: bool) {
        let Some(word) = self.idle.get(me / 64) else {
            return;
        };
        let bit = 1 << (me % 64);
        if idle {
            word.fetch_or(bit, Ordering::SeqCst);
        } else {
            word.fetch_and(!bit, Ordering::SeqCst);
        }
    }

    /// Whether another shard has a backlog to steal, lists to walk, or a stuck owner with timers
    /// due (one with nothing due is left to the watch).
    fn work_waiting(&self, shards: &[Shard], me: usize, now_tick: u64) -> bool {
        shards.iter().enumerate().any(|(index, shard)| {
            index != me
                && ((self.stealing && (shard.run.len() >= STEAL_MIN || shard.hand_outs.is_open()))
                    || self.rescue_after.is_some_and(|after| {
                        shard.is_stuck(now_tick, after)
                            && (shard.next_due() <= now_tick || shard.run.len() > 0)
                    }))
        })
    }

    /// Worker `me`, idle, helps one other shard once: walks its lists, stands in for its stuck
    /// owner, or steals a run. Returns whether it did.
    pub(crate) fn help(
        &self,
        shards: &[Shard],
        shutdown: &AtomicBool,
        me: usize,
        (now, now_tick): (Instant, u64),
    ) -> bool {
        let helper = Helper {
            idle_workers: self,
            shards,
            me,
        };
        (1..shards.len()).any(|offset| {
            let index = (me + offset) % shards.len();
            let shard = &shards[index];
            // First: the shard's wheel waits for its lists.
            if self.stealing && self.walk(shard, shutdown, now_tick, &helper) {
                return true;
            }
            if self
                .rescue_after
                .is_some_and(|after| shard.is_stuck(now_tick, after))
            {
                return Self::stand_in(shard, shutdown, (now, now_tick), Some(1), Some(&helper))
                    > 0;
            }
            let backlog = shard.run.len();
            self.stealing
                && backlog >= STEAL_MIN
                && self
                    .steal(shards, shard, shutdown, now_tick, backlog, Some(&helper))
                    .is_some()
        })
    }
}

/// A worker's idle spell: see [`IdleWorkers::begin_idle`].
#[must_use]
pub(crate) struct Idle {
    /// Sleep no later than this tick, to watch for stuck owners.
    pub(crate) watch: Option<u64>,
    me: usize,
}

/// A worker, `me`, running another shard's timers.
pub(crate) struct Helper<'a> {
    pub(super) idle_workers: &'a IdleWorkers,
    pub(super) shards: &'a [Shard],
    pub(super) me: usize,
}

impl Helper<'_> {
    /// Does `work`, user code for another shard, with the helper's own shard marked running: if it
    /// blocks, the helper's own timers must be rescued. Only around work actually taken, or every
    /// look at a stuck owner would wake a watcher.
    pub(super) fn with_user_code<R>(
        helper: Option<&Self>,
        now_tick: u64,
        code: UserCode,
        work: impl FnOnce() -> R,
    ) -> R {
        match helper.and_then(|h| Some((h, h.shards.get(h.me)?))) {
            Some((helper, mine)) => {
                helper
                    .idle_workers
                    .with_user_code((helper.shards, mine), now_tick, code, work)
            }
            None => work(),
        }
    }
}

/// What user code a worker runs, which decides how a watcher is seen to.
#[derive(Clone, Copy)]
pub(crate) enum UserCode {
    /// Callbacks: a run, recorded, so that a watcher lingers after it.
    Callbacks,
    /// Captures' drops: no run is recorded, so an idle engine's watcher does not linger.
    Drops,
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::STEAL_MIN;
    use crate::sync::run_queue::MAX_RUN;
    use crate::{Clock, ManualClock, TimerEngine};

    /// The bar for waking a parked worker: a backlog of [`STEAL_MIN`] at least, and a
    /// thirty-second of a tick's work at the shard's recent cost per callback, unless
    /// timers are still due behind a full queue or no run has been timed yet.
    #[test]
    fn a_parked_worker_is_woken_only_for_a_backlog_worth_a_share_of_a_tick() {
        let (engine, _clock) = hand_driven(true);
        let shared = engine.shared();
        let (idle_workers, shard) = (&shared.idle_workers, &shared.shards[0]);
        // 1 ms tick: the bar is 31.25 us of callbacks.
        assert!(!idle_workers.worth_waking(shard, STEAL_MIN - 1, true));
        assert!(
            idle_workers.worth_waking(shard, STEAL_MIN, false),
            "no run timed yet: the old bar"
        );
        shard.note_run(1_000, Duration::from_micros(40));
        assert!(
            !idle_workers.worth_waking(shard, 50, false),
            "steady-mix's 50 due a tick at 40 ns"
        );
        assert!(
            idle_workers.worth_waking(shard, 50, true),
            "a burst behind a full queue"
        );
        assert!(!idle_workers.worth_waking(shard, 750, false), "30 us");
        assert!(idle_workers.worth_waking(shard, 800, false), "32 us");
        // Slow callbacks: a backlog of STEAL_MIN is worth it again.
        for _ in 0..64 {
            shard.note_run(10, Duration::from_micros(100));
        }
        assert!(idle_workers.worth_waking(shard, STEAL_MIN, false));
    }

    /// A two-shard engine on a manual clock, which tests drive by hand.
    fn hand_driven(stealing: bool) -> (TimerEngine, ManualClock) {
        let clock = ManualClock::new();
        let engine = TimerEngine::builder()
            .workers(2)
            .stealing(stealing)
            .manual_clock(clock.clone())
            .build()
            .unwrap();
        (engine, clock)
    }

    /// The shard the calling thread's timers went to.
    fn home_shard(engine: &TimerEngine) -> usize {
        engine
            .stats()
            .shards
            .iter()
            .position(|shard| shard.scheduled > 0)
            .unwrap()
    }

    /// A hand-driven two-shard engine with `timers` timers due at tick 1 on the calling
    /// thread's shard, the clock at tick 1, and the owner having claimed them onto its run
    /// queue. Returns the engine and the home shard.
    fn claimed_backlog(
        stealing: bool,
        timers: usize,
        f: impl Fn() + Clone + Send + 'static,
    ) -> (TimerEngine, ManualClock, usize) {
        let (engine, clock) = hand_driven(stealing);
        for _ in 0..timers {
            let f = f.clone();
            engine.schedule(Duration::from_millis(1), f).unwrap();
        }
        let home = home_shard(&engine);
        clock.advance(Duration::from_millis(1));
        let shared = engine.shared();
        assert!(
            !shared.idle_workers.help(
                &shared.shards,
                &shared.shutdown,
                1 - home,
                shared.now_at(clock.now())
            ),
            "nothing claimed yet"
        );
        let shard = &shared.shards[home];
        let look = shard.with_wheel_waiting(|wheel| wheel.extract(shard, clock.now()));
        assert_eq!(look.claimed, timers);
        look.deferred_drops.free(shard);
        (engine, clock, home)
    }

    /// An owner claims a backlog; an idle worker's help takes half of it (at most a run)
    /// and runs it, counted as stolen; the owner's turn runs the rest, each timer once.
    #[test]
    fn an_idle_worker_steals_part_of_a_backlog_and_each_timer_runs_once() {
        let fired = Arc::new(AtomicUsize::new(0));
        let timers = 4 * MAX_RUN;
        let counter = Arc::clone(&fired);
        let (engine, clock, home) = claimed_backlog(true, timers, move || {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        let (shared, now) = (engine.shared(), clock.now());
        let thief = 1 - home;
        assert!(timers >= STEAL_MIN);
        assert!(shared.idle_workers.help(
            &shared.shards,
            &shared.shutdown,
            thief,
            shared.now_at(now)
        ));
        assert_eq!(fired.load(Ordering::Relaxed), MAX_RUN);
        assert_eq!(engine.stats().shards[home].stolen, MAX_RUN as u64);
        assert_eq!(engine.turn(), timers - MAX_RUN);
        assert_eq!(fired.load(Ordering::Relaxed), timers);
        let stats = engine.stats().total;
        assert_eq!(
            (stats.fired, stats.stolen, stats.pending),
            (timers as u64, MAX_RUN as u64, 0)
        );
    }

    /// A worker standing in for a stuck owner drops the captures of timers cancelled in
    /// that owner's wheel: user code, so its own shard is marked running meanwhile, but it
    /// records no run of timers, so that a watcher woken for it does not linger.
    #[test]
    fn a_stand_in_dropping_freed_captures_records_no_run() {
        let (engine, clock) = hand_driven(true);
        let capture = Arc::new(());
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let capture = Arc::clone(&capture);
                engine
                    .schedule(Duration::from_secs(5), move || drop(capture))
                    .unwrap()
            })
            .collect();
        let home = home_shard(&engine);
        let shared = engine.shared();
        let shard = &shared.shards[home];
        let look = shard.with_wheel_waiting(|wheel| wheel.extract(shard, clock.now()));
        look.deferred_drops.free(shard);
        for handle in handles {
            assert!(engine.cancel(handle));
        }
        shard.set_running(true);
        clock.advance(Duration::from_millis(200));
        let (now, now_tick) = shared.now_at(clock.now());
        let helper = 1 - home;
        assert!(shard.is_stuck(now_tick, 8));
        shared
            .idle_workers
            .help(&shared.shards, &shared.shutdown, helper, (now, now_tick));
        assert_eq!(Arc::strong_count(&capture), 1, "the stand-in dropped them");
        assert!(
            !shared.shards[helper].ran_within(u64::MAX / 2, now_tick),
            "no run recorded for the stand-in's shard"
        );
        shard.set_running(false);
    }

    /// With stealing off, a backlog is left to its owner.
    #[test]
    fn with_stealing_off_nobody_takes_a_backlog() {
        let (engine, clock, home) = claimed_backlog(false, 2 * STEAL_MIN, || {});
        let shared = engine.shared();
        assert!(!shared.idle_workers.help(
            &shared.shards,
            &shared.shutdown,
            1 - home,
            shared.now_at(clock.now())
        ));
        assert_eq!(engine.turn(), 2 * STEAL_MIN);
        assert_eq!(engine.stats().total.stolen, 0);
    }
}
