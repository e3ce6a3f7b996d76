//! Expiry balancing: idle workers take part of another shard's burst of due timers
//! (stealing), and stand in for an owner stuck in a slow callback (rescue).
//!
//! Balancing happens at expiry, never at insert: a timer stays on the shard that armed it
//! until it is due. The owner claims due timers onto its shard's run queue; an idle worker
//! takes runs from a queue with a backlog. An owner that is awake but has not looked at its
//! wheel for more than `rescue_after` ticks is stuck, and an idle worker takes its wheel
//! for a moment to claim what has come due, then runs it.
//!
//! Waking helpers costs system calls, so they are woken only when there is something to
//! do: an owner with a backlog wakes one parked worker, which wakes the next if a backlog
//! remains. For rescue, someone must notice a stuck owner while every other worker sleeps:
//! one worker that goes to sleep while another owner is running callbacks (or ran some
//! lately) sleeps no longer than `rescue_after` ticks, and an owner that starts running
//! callbacks while nobody watches wakes a parked worker to watch, unless another worker
//! sleeps only until within `rescue_after` ticks anyway and will see it then. Only a
//! worker running user code can be stuck: an owner running its own callbacks, or dropping
//! the captures of timers its look freed (after letting the wheel go, see
//! [`deferred_drops`](crate::engine::deferred_drops)), or a worker doing either for another shard as it
//! helps, which marks its own shard running meanwhile (its wheel goes unlooked at too).
//! At most one worker watches, so an idle engine costs no CPU at any worker count; while
//! an owner is stuck, the watcher stands in when its timers come due and otherwise looks
//! once every `rescue_after` ticks, so a long-blocked callback costs a few wake-ups a
//! second rather than a core.
//!
//! Who may touch what, and when: the ground rules in [`engine`](crate::engine).

#![cfg_attr(
    loom,
    allow(
        dead_code,
        reason = "loom models drive engines by hand, without worker threads"
    )
)]

use std::time::Instant;

use crate::engine::counters::add;
use crate::engine::runner;
use crate::engine::shard::Shard;
use crate::engine::shard_state::AWAKE;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use crate::sync::run_queue::MAX_RUN;
pub(crate) use crate::tuning::STEAL_MIN;
use crate::tuning::{LINGER_PERIODS, WAKE_FOR_TICK_PARTS};

/// The engine's balancing settings and its record of parked workers.
pub(crate) struct Balance {
    pub(crate) stealing: bool,
    /// Ticks an awake owner may go without looking at its wheel before another worker
    /// stands in; `None`: never.
    pub(crate) rescue_after: Option<u64>,
    /// Bit `i % 64` of word `i / 64`: worker `i` is parked and may be woken to help.
    idle: Box<[AtomicU64]>,
    /// 1 while a parked worker's sleep is bounded so that it looks for stuck owners (at
    /// most one does), 0 otherwise.
    watching: AtomicU64,
    /// Nanoseconds of callbacks a backlog must hold before a parked worker is woken for it
    /// (see [`WAKE_FOR_TICK_PARTS`]).
    wake_for_ns: u64,
}

impl Balance {
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

    /// An owner with a fresh backlog on its run queue wakes a helper, if the backlog is worth
    /// it (see [`worth_waking`](Self::worth_waking)); `more_due`: its queue filled with
    /// timers still due.
    pub(crate) fn offer(&self, shards: &[Shard], shard: &Shard, more_due: bool) {
        if self.stealing && self.worth_waking(shard, shard.run.len(), more_due) {
            self.wake_one(shards);
        }
    }

    /// An owner begins running timers at `now_tick` (it has just marked itself running):
    /// if nobody watches for stuck owners, and no other worker will go to sleep within
    /// `rescue_after` ticks anyway (and then see it running), it wakes a parked worker to
    /// watch. Returns whether it did.
    pub(crate) fn running(&self, shards: &[Shard], shard: &Shard, now_tick: u64) -> bool {
        if self.rescue_after.is_none() {
            return false;
        }
        shard.mark_run(now_tick);
        self.watched(shards, shard, now_tick)
    }

    /// An owner begins dropping the captures of timers its look freed (it has just marked
    /// itself running; see [`DeferredDrops`](crate::engine::deferred_drops::DeferredDrops)): someone must
    /// watch, as in [`running`](Self::running), but it records no run, so a watcher woken
    /// for it does not linger. Lingering keeps owners that run timers now and then from
    /// waking each other at every run; a drop of cancelled captures rarely takes long,
    /// and a watcher lingering after each one cost an otherwise idle engine a wake-up
    /// every `rescue_after` ticks for half a second (dropped `Sleep`s, captured `Arc`s).
    /// Returns whether it woke one.
    pub(crate) fn dropping(&self, shards: &[Shard], shard: &Shard, now_tick: u64) -> bool {
        self.watched(shards, shard, now_tick)
    }

    /// Does `work`, user code a worker runs for `shard` (its callbacks, or the drops of
    /// captures its look freed), with `shard` marked running meanwhile, having first seen
    /// to a watcher as [`running`](Self::running) or [`dropping`](Self::dropping) does:
    /// user code may block, and then `shard`'s timers must be rescued.
    pub(crate) fn with_user_code<R>(
        &self,
        (shards, shard): (&[Shard], &Shard),
        now_tick: u64,
        code: UserCode,
        work: impl FnOnce() -> R,
    ) -> R {
        shard.set_running(true);
        match code {
            UserCode::Callbacks => self.running(shards, shard, now_tick),
            UserCode::Drops => self.dropping(shards, shard, now_tick),
        };
        let done = work();
        shard.set_running(false);
        done
    }

    /// Whether `backlog` callbacks queued on `shard` (with more still due in its wheel when
    /// `more_due`: a burst) are worth waking a parked worker for: [`STEAL_MIN`] at least,
    /// and a share of a tick's work at the shard's recent cost per callback (unknown before
    /// its owner's first run: then [`STEAL_MIN`] alone, as for callbacks that take long).
    fn worth_waking(&self, shard: &Shard, backlog: usize, more_due: bool) -> bool {
        if backlog < STEAL_MIN {
            return false;
        }
        let per_callback = shard.callback_ns();
        more_due
            || per_callback == 0
            || (backlog as u64).saturating_mul(per_callback) >= self.wake_for_ns
    }

    /// Wakes a parked worker to watch `shard`, marked running, unless someone watches or
    /// another worker will look by `rescue_after` ticks on anyway. Returns whether it did.
    fn watched(&self, shards: &[Shard], shard: &Shard, now_tick: u64) -> bool {
        let Some(after) = self.rescue_after else {
            return false;
        };
        if self.watching.load(Ordering::SeqCst) != 0 {
            return false;
        }
        // Orders the running mark before the other workers' plans (see `another_looks_by`).
        fence(Ordering::SeqCst);
        if another_looks_by(shards, shard, now_tick.saturating_add(after)) {
            return false;
        }
        self.wake_one(shards);
        true
    }

    /// Worker `me` is about to park: it becomes wakeable for help, and learns until which
    /// tick at most it should sleep to watch for stuck owners. `None` if helpers' work is
    /// already waiting: then it must not park (and has nothing to end).
    pub(crate) fn begin_idle(&self, shards: &[Shard], me: usize, now_tick: u64) -> Option<Idle> {
        self.set_idle(me, true);
        // One watcher at a time is enough, and keeps the wake-ups it costs from growing
        // with the worker count.
        let watch = self.watch_until(shards, me, now_tick).filter(|_| {
            self.watching
                .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        });
        let idle = Idle { watch, me };
        // After publishing the idle bit (SeqCst): an owner that filled its queue after
        // this looks at the bits and wakes this worker, or this look sees the backlog.
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

    /// The tick by which a worker going to sleep must look for stuck owners again.
    fn watch_until(&self, shards: &[Shard], me: usize, now_tick: u64) -> Option<u64> {
        let after = self.rescue_after?;
        let mut until: Option<u64> = None;
        let mut recent = false;
        for (index, shard) in shards.iter().enumerate() {
            if index == me {
                continue;
            }
            recent |= shard.ran_within(LINGER_PERIODS * after, now_tick);
            if !shard.is_running() {
                continue;
            }
            let tick = if shard.is_stuck(now_tick, after) {
                // A timer armed on the stuck shard after the last stand-in is on a lane,
                // not in the published deadline: look again within `after` ticks for it.
                shard
                    .next_due()
                    .min(now_tick.saturating_add(after))
                    .max(now_tick + 1)
            } else {
                shard.heartbeat().saturating_add(after + 1)
            };
            until = Some(until.map_or(tick, |until| until.min(tick)));
        }
        // At least a tick on: a watch of `now` (with `rescue_after` 0) would never park.
        until.or_else(|| recent.then(|| now_tick.saturating_add(after.max(1))))
    }

    /// Whether some other shard has a backlog to steal or lists to walk, or a stuck owner
    /// with timers due to stand in for. A stuck owner with nothing due is left to the watch (see
    /// [`watch_until`](Self::watch_until)): standing in for it again and again until its
    /// callback returns kept a core busy for nothing.
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

    /// Worker `me`, with nothing of its own to do, helps one other shard once: walks a batch
    /// of the lists it handed out, stands in for a stuck owner, or steals a run from a
    /// backlog. Returns whether it did anything.
    pub(crate) fn help(
        &self,
        shards: &[Shard],
        shutdown: &AtomicBool,
        me: usize,
        (now, now_tick): (Instant, u64),
    ) -> bool {
        let helper = Helper {
            balance: self,
            shards,
            me,
        };
        (1..shards.len()).any(|offset| {
            let index = (me + offset) % shards.len();
            let shard = &shards[index];
            // First: while its lists are out, the shard's wheel waits for them.
            if self.stealing && self.walk(shard, shutdown, now_tick, &helper) {
                return true;
            }
            if self
                .rescue_after
                .is_some_and(|after| shard.is_stuck(now_tick, after))
            {
                return stand_in(shard, shutdown, (now, now_tick), Some(1), Some(&helper)) > 0;
            }
            let backlog = shard.run.len();
            self.stealing
                && backlog >= STEAL_MIN
                && self
                    .steal(shards, shard, shutdown, now_tick, backlog, Some(&helper))
                    .is_some()
        })
    }

    /// Walks a batch of the lists `shard` handed out, as `helper`, and runs what it claimed;
    /// wakes another parked worker first if lists are left open. Returns whether it found a
    /// list to walk.
    fn walk(
        &self,
        shard: &Shard,
        shutdown: &AtomicBool,
        now_tick: u64,
        helper: &Helper<'_>,
    ) -> bool {
        shard.walk_hand_outs(shutdown, helper.me, |batch, due| {
            add(&shard.counters.claimed_elsewhere, batch.len() as u64);
            if shard.hand_outs.is_open() {
                self.wake_one(helper.shards);
            }
            // Its own reading, for the runs' lateness and repeating timers' next deadlines,
            // unless the owner's at the hand-out was later.
            let now_tick = now_tick.max(due);
            Helper::with_user_code(Some(helper), now_tick, UserCode::Callbacks, || {
                runner::run(shard, batch, now_tick, false)
            });
        })
    }

    /// Takes about half of `shard`'s backlog (at most a run) and runs it, as `helper` if
    /// a worker. Returns the callbacks run, `None` if it took nothing.
    pub(crate) fn steal(
        &self,
        shards: &[Shard],
        shard: &Shard,
        shutdown: &AtomicBool,
        now_tick: u64,
        backlog: usize,
        helper: Option<&Helper<'_>>,
    ) -> Option<usize> {
        if !shard.enter_hands(shutdown) {
            return None;
        }
        let run = shard.run.take(backlog.div_ceil(2));
        if run.is_some() && self.worth_waking(shard, shard.run.len(), false) {
            // Enough left for one more helper.
            self.wake_one(shards);
        }
        let ran = run.map(|run| {
            Helper::with_user_code(helper, now_tick, UserCode::Callbacks, || {
                runner::run(shard, run.indices(), now_tick, false)
            })
        });
        shard.leave_hands();
        ran
    }
}

/// A worker, `me`, running another shard's timers (stolen, or standing in for a stuck
/// owner).
pub(crate) struct Helper<'a> {
    balance: &'a Balance,
    shards: &'a [Shard],
    me: usize,
}

impl Helper<'_> {
    /// Does `work`, user code for another shard (its timers' callbacks, taken from its run
    /// queue, or the drops of captures a stand-in's look freed), with the helper's own
    /// shard counted as running meanwhile, as when it runs its own (see
    /// [`Balance::with_user_code`]): a callback there may block like any other, and then its
    /// own shard's timers must be rescued (its wheel goes unlooked at), and an owner that
    /// begins running must not count on it to watch. Only around work actually taken: a
    /// stand-in that finds nothing to run marks nothing, or every look at a stuck owner
    /// would wake another worker to watch.
    fn with_user_code<R>(
        helper: Option<&Self>,
        now_tick: u64,
        code: UserCode,
        work: impl FnOnce() -> R,
    ) -> R {
        match helper.and_then(|h| Some((h, h.shards.get(h.me)?))) {
            Some((helper, mine)) => {
                helper
                    .balance
                    .with_user_code((helper.shards, mine), now_tick, code, work)
            }
            None => work(),
        }
    }
}

/// What user code a worker runs for a shard, which decides how a watcher is seen to.
#[derive(Clone, Copy)]
pub(crate) enum UserCode {
    /// Timers' callbacks: a run, recorded, so that a watcher lingers after it.
    Callbacks,
    /// The drops of captures a look freed: no run is recorded, so that a watcher woken for
    /// them does not linger (see [`Balance::dropping`]).
    Drops,
}

/// Whether a worker other than `shard`'s owner sleeps, not running timers, until `tick` at
/// the latest: on its way back to sleep then, [`Balance::begin_idle`] looks at every
/// running owner, `shard`'s included, so it watches `shard` from then on. A worker that is
/// awake does not count: it may be about to run callbacks that block, of its shard or
/// (helping) of another.
///
/// Without this, two owners with timers due now and then wake each other at every run:
/// the one that watched stops watching when its own timers wake it, and its run then
/// finds nobody watching. The caller stores its running mark, then fences (`SeqCst`), then
/// this loads the plans; a worker going to sleep stores its plan, fences, then loads the
/// marks. So either this sees the plan, or that worker sees the mark and watches.
fn another_looks_by(shards: &[Shard], shard: &Shard, tick: u64) -> bool {
    shards.iter().any(|other| {
        let plan = other.wake_plan();
        !std::ptr::eq(other, shard) && plan != AWAKE && plan <= tick && !other.is_running()
    })
}

/// A worker's idle spell: see [`Balance::begin_idle`].
#[must_use]
pub(crate) struct Idle {
    /// Sleep no later than this tick, to watch for stuck owners.
    pub(crate) watch: Option<u64>,
    me: usize,
}

/// Stands in for `shard`'s owner at `now` (tick `now_tick`): claims what has come due in
/// its wheel (if the owner is not holding it), then runs up to `runs` runs of its queue
/// (`None`: until it is empty), as `helper` if a worker. Returns the callbacks run.
pub(crate) fn stand_in(
    shard: &Shard,
    shutdown: &AtomicBool,
    (now, mut now_tick): (Instant, u64),
    runs: Option<usize>,
    helper: Option<&Helper<'_>>,
) -> usize {
    if !shard.enter_hands(shutdown) {
        return 0;
    }
    if let Some(look) = shard.with_wheel(|wheel| wheel.extract(shard, now)) {
        add(&shard.counters.rescued, look.claimed as u64);
        now_tick = look.now_tick;
        if !look.deferred_drops.is_empty() {
            Helper::with_user_code(helper, now_tick, UserCode::Drops, || {
                look.deferred_drops.free(shard);
            });
        }
    }
    let mut fired = 0;
    let mut left = runs.unwrap_or(usize::MAX);
    while left > 0 {
        let Some(run) = shard.run.take(MAX_RUN) else {
            break;
        };
        fired += Helper::with_user_code(helper, now_tick, UserCode::Callbacks, || {
            runner::run(shard, run.indices(), now_tick, false)
        });
        left -= 1;
    }
    shard.leave_hands();
    fired
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
        let (balance, shard) = (&shared.balance, &shared.shards[0]);
        // 1 ms tick: the bar is 31.25 us of callbacks.
        assert!(!balance.worth_waking(shard, STEAL_MIN - 1, true));
        assert!(
            balance.worth_waking(shard, STEAL_MIN, false),
            "no run timed yet: the old bar"
        );
        shard.note_run(1_000, Duration::from_micros(40));
        assert!(
            !balance.worth_waking(shard, 50, false),
            "steady-mix's 50 due a tick at 40 ns"
        );
        assert!(
            balance.worth_waking(shard, 50, true),
            "a burst behind a full queue"
        );
        assert!(!balance.worth_waking(shard, 750, false), "30 us");
        assert!(balance.worth_waking(shard, 800, false), "32 us");
        // Slow callbacks: a backlog of STEAL_MIN is worth it again.
        for _ in 0..64 {
            shard.note_run(10, Duration::from_micros(100));
        }
        assert!(balance.worth_waking(shard, STEAL_MIN, false));
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
            !shared.balance.help(
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
        assert!(
            shared
                .balance
                .help(&shared.shards, &shared.shutdown, thief, shared.now_at(now))
        );
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
            .balance
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
        assert!(!shared.balance.help(
            &shared.shards,
            &shared.shutdown,
            1 - home,
            shared.now_at(clock.now())
        ));
        assert_eq!(engine.turn(), 2 * STEAL_MIN);
        assert_eq!(engine.stats().total.stolen, 0);
    }
}
