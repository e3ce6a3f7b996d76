//! A worker thread: the owner of one shard. It looks at its wheel, runs what came due, helps
//! other shards when it has nothing of its own to do, and sleeps until its next deadline or
//! a wake-up. The wheel it looks at is its shard's [`WheelSide`](crate::engine::wheel_side).
//!
//! Who may touch what, and when: the ground rules in [`engine`](crate::engine).

use crate::engine::runner;
use crate::engine::shard_parts::AWAKE;
use crate::engine::shared::EngineShared;
use crate::engine::thread_role;
use crate::sync::Arc;
use crate::sync::atomic::Ordering;
use crate::sync::run_queue::MAX_RUN;

/// A worker thread's life: look at the wheel, run what came due, help other shards when
/// there is nothing of its own to do, sleep until the next deadline or a wake-up, repeat;
/// at shutdown, one last turn that settles every pending timer.
pub(crate) fn run(shared: &Arc<EngineShared>, index: usize) {
    thread_role::become_worker();
    crate::engine::context::set_home(shared, index);
    let shard = &shared.shards[index];
    let shards = &shared.shards[..];
    let balance = &shared.balance;
    shard.beat(shared.now_tick());
    loop {
        let now = shared.clock.now();
        let now_tick = shared.ticks.floor(now);
        let look = shard.owner_look(now, now_tick);
        if !look.unfreed.is_empty() {
            // Captures' `Drop`s are user code, run like callbacks: a watcher stands in if
            // one blocks.
            shard.set_running(true);
            balance.dropping(shards, shard, now_tick);
            look.unfreed.free(shard);
            shard.set_running(false);
        }
        if shared.shutdown.load(Ordering::SeqCst) {
            shard.finish(shared.pending_mode(), now);
            return;
        }
        if look.claimed > 0 {
            balance.offer(shards, shard);
        }
        // One run at a time, looking at the wheel in between, so that the heartbeat stays
        // fresh while the owner makes progress.
        if let Some(run) = shard.run.take(MAX_RUN) {
            shard.set_running(true);
            balance.running(shards, shard, now_tick);
            runner::run(shard, &run, now_tick, true);
            shard.set_running(false);
            continue;
        }
        if look.more_due || balance.help(shards, &shared.shutdown, index, (now, now_tick)) {
            continue;
        }
        let plan = look.next.unwrap_or(u64::MAX);
        if plan <= now_tick {
            continue;
        }
        shard.plan_wake(plan);
        let idle = balance.begin_idle(shards, index, now_tick);
        let must_turn = shard.with_wheel_waiting(|wheel| wheel.must_turn_before(shard, plan));
        let wake = match &idle {
            Some(idle) if !must_turn && !shared.shutdown.load(Ordering::SeqCst) => {
                idle.watch.map_or(plan, |watch| watch.min(plan))
            }
            _ => now_tick,
        };
        if wake > now_tick {
            if wake == u64::MAX {
                std::thread::park();
            } else {
                let at = shared.ticks.instant_at(wake);
                std::thread::park_timeout(at.saturating_duration_since(shared.clock.now()));
            }
        }
        if let Some(idle) = idle {
            balance.end_idle(idle);
        }
        shard.plan_wake(AWAKE);
        shard.beat(shared.now_tick());
    }
}
