//! Stuck owners: an owner that is awake but has not looked at its wheel for more than
//! `rescue_after` ticks is stuck in user code, and an idle worker takes its wheel for a
//! moment to claim what has come due, then runs it (it stands in).
//!
//! Someone must notice a stuck owner while every other worker sleeps: one worker that goes
//! to sleep while another owner is running callbacks (or ran some lately) sleeps no longer
//! than `rescue_after` ticks, and an owner that starts running callbacks while nobody
//! watches wakes a parked worker to watch, unless another worker sleeps only until within
//! `rescue_after` ticks anyway and will see it then. Only a worker running user code can be
//! stuck: an owner running its own callbacks, or dropping the captures of timers its look
//! freed (after letting the wheel go, see [`deferred_drops`](crate::engine::deferred_drops)),
//! or a worker doing either for another shard as it helps, which marks its own shard
//! running meanwhile (its wheel goes unlooked at too). At most one worker watches, so an
//! idle engine costs no CPU at any worker count; while an owner is stuck, the watcher
//! stands in when its timers come due and otherwise looks once every `rescue_after` ticks,
//! so a long-blocked callback costs a few wake-ups a second rather than a core.

#![cfg_attr(
    loom,
    allow(
        dead_code,
        reason = "loom models drive engines by hand, without worker threads"
    )
)]

use std::time::Instant;

use crate::engine::counters::add;
use crate::engine::idle_workers::{Helper, IdleWorkers, UserCode};
use crate::engine::runner;
use crate::engine::shard::Shard;
use crate::engine::shard_state::AWAKE;
use crate::sync::atomic::{AtomicBool, Ordering, fence};
use crate::sync::run_queue::MAX_RUN;
use crate::tuning::LINGER_PERIODS;

impl IdleWorkers {
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

    /// The tick by which a worker going to sleep must look for stuck owners again.
    pub(super) fn watch_until(&self, shards: &[Shard], me: usize, now_tick: u64) -> Option<u64> {
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
}

/// Whether a worker other than `shard`'s owner sleeps, not running timers, until `tick` at
/// the latest: on its way back to sleep then, [`IdleWorkers::begin_idle`] looks at every
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

impl IdleWorkers {
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
}
