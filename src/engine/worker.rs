//! A worker thread: the owner of one shard's [`HeldWheel`](crate::engine::held_wheel).

use crate::engine::counters::{Planned, Woke};
use crate::engine::idle_workers::UserCode;
use crate::engine::reentrancy;
use crate::engine::runner;
use crate::engine::shard_state::AWAKE;
use crate::engine::shared::EngineShared;
use crate::sync::Arc;
use crate::sync::atomic::Ordering;
use crate::sync::run_queue::MAX_RUN;

/// A worker thread's life: look at the wheel, run what came due, help other shards when
/// idle, sleep until the next deadline or a wake-up; at shutdown, one last turn.
pub(crate) fn run(shared: &Arc<EngineShared>, index: usize) {
    reentrancy::become_worker();
    crate::engine::context::set_home(shared, index);
    let shard = &shared.shards[index];
    let shards = &shared.shards[..];
    let idle_workers = &shared.idle_workers;
    shard.beat(shared.now_tick());
    let mut woke_up: Option<Woke> = None;
    loop {
        let (now, now_tick) = shared.now_at(shared.clock.now());
        let look = shard.owner_look(now, now_tick);
        if let Some(woke) = woke_up.take() {
            shard.counters.wakes.count(woke, look.claimed);
        }
        if !look.deferred_drops.is_empty() {
            idle_workers.with_user_code((shards, shard), now_tick, UserCode::Drops, || {
                look.deferred_drops.free(shard);
            });
        }
        if shared.shutdown.load(Ordering::SeqCst) {
            shard.finish(shared.pending_mode(), now);
            return;
        }
        if look.handed_out {
            idle_workers.wake_one(shards);
        } else if look.claimed > 0 {
            idle_workers.offer(shards, shard, look.more_due);
        }
        // Timed, for the owner's cost per callback.
        let run_own = |claimed: &[u32], now_tick: u64| {
            let started = std::time::Instant::now();
            let ran =
                idle_workers.with_user_code((shards, shard), now_tick, UserCode::Callbacks, || {
                    runner::run(shard, claimed, now_tick, true)
                });
            shard.note_run(ran, started.elapsed());
        };
        // One run at a time, to keep the heartbeat fresh.
        if let Some(run) = shard.run.take(MAX_RUN) {
            run_own(run.indices(), now_tick);
            continue;
        }
        if look.lists_out {
            let walked = shard.walk_hand_outs(&shared.shutdown, index, |batch, due| {
                run_own(batch, now_tick.max(due));
            });
            if !walked {
                crate::sync::yield_now();
            }
            continue;
        }
        if look.more_due || idle_workers.help(shards, &shared.shutdown, index, (now, now_tick)) {
            continue;
        }
        let plan = look.next.unwrap_or(u64::MAX);
        if plan <= now_tick {
            continue;
        }
        let mut planned_for = look.next_for;
        shard.plan_wake(plan);
        let idle = idle_workers.begin_idle(shards, index, now_tick);
        let must_turn = shard.with_wheel_waiting(|wheel| wheel.must_turn_before(shard, plan));
        let wake = match &idle {
            Some(idle) if !must_turn && !shared.shutdown.load(Ordering::SeqCst) => {
                match idle.watch {
                    Some(watch) if watch < plan => {
                        planned_for = Planned::Watch;
                        watch
                    }
                    _ => plan,
                }
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
            let woke = shared.now_tick();
            woke_up = Some(Woke {
                planned: planned_for,
                early: woke < wake,
            });
        }
        if let Some(idle) = idle {
            idle_workers.end_idle(idle);
        }
        shard.plan_wake(AWAKE);
        shard.beat(shared.now_tick());
    }
}
