//! Stealing: an idle worker takes about half of a backlog worth waking for, or walks a batch of
//! handed-out lists ([`due_lists`](crate::engine::due_lists)), and runs what it took.

#![cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]

use crate::sync::atomic::AtomicBool;

use crate::engine::counters::add;
use crate::engine::idle_workers::{Helper, IdleWorkers, UserCode};
use crate::engine::runner;
use crate::engine::shard::Shard;
pub(crate) use crate::tuning::STEAL_MIN;

impl IdleWorkers {
    /// An owner with a fresh backlog (a burst when `more_due`) wakes a helper if it is worth it.
    pub(crate) fn offer(&self, shards: &[Shard], shard: &Shard, more_due: bool) {
        if self.stealing && self.worth_waking(shard, shard.run.len(), more_due) {
            self.wake_one(shards);
        }
    }

    /// Whether `backlog` callbacks queued on `shard` are worth waking a parked worker for:
    /// [`STEAL_MIN`] at least, and a share of a tick's work at the shard's recent cost per
    /// callback.
    pub(super) fn worth_waking(&self, shard: &Shard, backlog: usize, more_due: bool) -> bool {
        if backlog < STEAL_MIN {
            return false;
        }
        let per_callback = shard.callback_ns();
        more_due
            || per_callback == 0
            || (backlog as u64).saturating_mul(per_callback) >= self.wake_for_ns
    }

    /// Walks a batch of `shard`'s handed-out lists and runs what it claimed, waking another worker
    /// if lists are left. Returns whether it walked one.
    pub(super) fn walk(
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
            // Its own reading, unless the hand-out's was later.
            let now_tick = now_tick.max(due);
            Helper::with_user_code(Some(helper), now_tick, UserCode::Callbacks, || {
                runner::run(shard, batch, now_tick, false)
            });
        })
    }

    /// Takes about half of `shard`'s backlog (at most a run) and runs it. Returns the callbacks
    /// run, `None` if it took nothing.
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
