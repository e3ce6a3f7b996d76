//! Stuck owners: an owner running user code (callbacks, or captures' drops) that has not looked at
//! its wheel for more than `rescue_after` ticks is stuck, and an idle worker stands in: it takes
//! the wheel for a moment to claim what has come due, then runs it.
//!
//! Someone must notice while the others sleep: a worker going to sleep while another owner runs
//! callbacks (or ran some lately) sleeps at most `rescue_after` ticks, and an owner that starts
//! running callbacks while nobody watches wakes one to watch. At most one worker watches, so an
//! idle engine costs no CPU.
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
    /// An owner, just marked running, begins running timers: records the run and sees to a watcher.
    /// Returns whether it woke one.
    pub(crate) fn running(&self, shards: &[Shard], shard: &Shard, now_tick: u64) -> bool {
        if self.rescue_after.is_none() {
            return false;
        }
        shard.mark_run(now_tick);
        self.watched(shards, shard, now_tick)
    }

    /// Does `work`, user code a worker runs for `shard`, with `shard` marked running and a watcher
    /// seen to.
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

    /// Wakes a parked worker to watch `shard` unless someone watches or another worker will look
    /// within `rescue_after` ticks anyway. Returns whether it did.
    fn watched(&self, shards: &[Shard], shard: &Shard, now_tick: u64) -> bool {
        let Some(after) = self.rescue_after else {
            return false;
        };
        if self.watching.load(Ordering::SeqCst) != 0 {
            return false;
        }
        // Orders the running mark before the plans' loads (see `another_looks_by`).
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
                // A timer armed since the last stand-in is on a lane: look again within `after`.
                shard
                    .next_due()
                    .min(now_tick.saturating_add(after))
                    .max(now_tick + 1)
            } else {
                shard.heartbeat().saturating_add(after + 1)
            };
            until = Some(until.map_or(tick, |until| until.min(tick)));
        }
        // At least a tick on, or it would never park.
        until.or_else(|| recent.then(|| now_tick.saturating_add(after.max(1))))
    }
}

/// Whether another worker sleeps, not running timers, until `tick` at the latest: going back to
/// sleep, it will see `shard` running and watch it. The caller stores its running mark, fences,
/// then loads the plans; a worker going to sleep stores its plan, fences, then loads the marks: one
/// sees the other.
fn another_looks_by(shards: &[Shard], shard: &Shard, tick: u64) -> bool {
    shards.iter().any(|other| {
        let plan = other.wake_plan();
        !std::ptr::eq(other, shard) && plan != AWAKE && plan <= tick && !other.is_running()
    })
}

impl IdleWorkers {
    /// Stands in for `shard`'s owner: claims what is due in its wheel (unless the owner holds it),
    /// then runs up to `runs` runs of its queue (`None`: all). Returns the callbacks run.
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
