//! Stuck owners: an owner running user code that has not looked at its wheel for more
//! than `rescue_after` ticks is stuck, and an idle worker stands in: it takes the wheel for
//! a moment to claim what has come due, then runs it.
//!
//! Someone must notice while every other worker sleeps: a worker going to sleep while
//! another owner runs callbacks (or ran some lately) sleeps at most `rescue_after` ticks,
//! and an owner that starts running callbacks while nobody watches wakes a parked worker to
//! watch, unless another will look within `rescue_after` ticks anyway. User code is an
//! owner's callbacks or the captures its look freed
//! ([`deferred_drops`](crate::engine::deferred_drops)), or either run for another shard by a
//! helper, which marks its own shard running meanwhile. At most one worker watches, so an
//! idle engine costs no CPU; while an owner is stuck, the watcher stands in when its timers
//! come due and otherwise looks every `rescue_after` ticks, not spinning a core.

#![cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]

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
    /// An owner, just marked running, begins running timers at `now_tick`: records the run
    /// and sees to a watcher ([`watched`](Self::watched)). Returns whether it woke one.
    pub(crate) fn running(&self, shards: &[Shard], shard: &Shard, now_tick: u64) -> bool {
        if self.rescue_after.is_none() {
            return false;
        }
        shard.mark_run(now_tick);
        self.watched(shards, shard, now_tick)
    }

    /// Does `work`, user code a worker runs for `shard`, with `shard` marked running and a
    /// watcher seen to: user code may block, and then `shard`'s timers must be rescued.
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
            UserCode::Drops => self.watched(shards, shard, now_tick),
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
/// the latest: going back to sleep then, [`IdleWorkers::begin_idle`] sees `shard` running
/// and watches it. An awake worker does not count: it may be about to block in callbacks.
/// Without this, two owners with timers due now and then wake each other at every run.
///
/// The caller stores its running mark, fences (SeqCst), then loads the plans; a worker
/// going to sleep stores its plan, fences, then loads the marks: one sees the other.
fn another_looks_by(shards: &[Shard], shard: &Shard, tick: u64) -> bool {
    shards.iter().any(|other| {
        let plan = other.wake_plan();
        !std::ptr::eq(other, shard) && plan != AWAKE && plan <= tick && !other.is_running()
    })
}

impl IdleWorkers {
    /// Stands in for `shard`'s owner: claims what has come due in its wheel (unless the
    /// owner holds it), then runs up to `runs` runs of its queue (`None`: until empty), as
    /// `helper` if a worker. Returns the callbacks run.
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
