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

/// Two wake-ups before the planned tick within this many ticks make a worker sleep close
/// (see [`Closeness`]): about 500 a second or more.
const EARLY_WAKES_WITHIN: u64 = 2;

/// How long a worker sleeps close after the last time two early wake-ups made it.
const CLOSE_FOR: u64 = 64;

/// The most ticks a worker sleeping close plans ahead: it wakes every two to three ticks.
const CLOSE_SLEEP: u64 = 3;

/// Whether a worker's plan is being undercut: threads arming timers due before the tick it
/// planned to wake at must wake it (a system call for them, a context switch for it, about
/// 10 µs of CPU in all on this project's VMs). Under a stream of timers with varied delays,
/// as request timeouts are, the earliest of them keeps falling before a plan that looks as
/// far ahead as the wheel allows: measured with `async-sleep` at 1 thread, about 11,500
/// such wake-ups a second, a tenth of the process's CPU. While that goes on, the worker
/// plans no more than [`CLOSE_SLEEP`] ticks ahead, so a timer needs it woken only when due
/// sooner than that, and it wakes on its own every two to three ticks instead. Any return
/// from its sleep before the planned tick counts, whatever woke it (a helper's or a
/// watcher's wake-up, a lane closed by an exiting thread): the cost of a spell begun for
/// another reason is 64 ticks of short sleeps, and only while something is pending. A
/// worker with nothing planned at all (`u64::MAX`) still sleeps until woken: an idle engine
/// costs nothing.
#[derive(Default)]
struct Closeness {
    /// The tick of the last early wake-up.
    last_early: Option<u64>,
    /// Sleep close until this tick.
    until: u64,
}

impl Closeness {
    /// The tick to plan for, `plan` or closer.
    fn plan(&self, plan: u64, now_tick: u64) -> u64 {
        if now_tick < self.until && plan != u64::MAX {
            plan.min(now_tick.saturating_add(CLOSE_SLEEP))
        } else {
            plan
        }
    }

    /// The worker woke at `tick`, before its planned tick.
    fn woke_early(&mut self, tick: u64) {
        if self
            .last_early
            .is_some_and(|last| tick.saturating_sub(last) <= EARLY_WAKES_WITHIN)
        {
            self.until = tick.saturating_add(CLOSE_FOR);
        }
        self.last_early = Some(tick);
    }
}

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
    let mut closeness = Closeness::default();
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
        let plan = closeness.plan(look.next.unwrap_or(u64::MAX), now_tick);
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
            let woke = shared.now_tick();
            if woke < wake {
                closeness.woke_early(woke);
            }
        }
        if let Some(idle) = idle {
            balance.end_idle(idle);
        }
        shard.plan_wake(AWAKE);
        shard.beat(shared.now_tick());
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{CLOSE_FOR, CLOSE_SLEEP, Closeness, EARLY_WAKES_WITHIN};

    #[test]
    fn one_early_wake_up_changes_nothing() {
        let mut closeness = Closeness::default();
        closeness.woke_early(100);
        assert_eq!(closeness.plan(130, 100), 130);
    }

    #[test]
    fn two_early_wake_ups_close_together_cap_the_plan_for_a_while() {
        let mut closeness = Closeness::default();
        closeness.woke_early(100);
        closeness.woke_early(100 + EARLY_WAKES_WITHIN);
        let now = 100 + EARLY_WAKES_WITHIN;
        assert_eq!(closeness.plan(now + 30, now), now + CLOSE_SLEEP);
        assert_eq!(closeness.plan(now + 1, now), now + 1, "a sooner plan stays");
        let last = now + CLOSE_FOR - 1;
        assert_eq!(closeness.plan(last + 30, last), last + CLOSE_SLEEP);
        let over = now + CLOSE_FOR;
        assert_eq!(closeness.plan(over + 30, over), over + 30);
    }

    #[test]
    fn early_wake_ups_far_apart_do_not_cap() {
        let mut closeness = Closeness::default();
        closeness.woke_early(100);
        closeness.woke_early(101 + EARLY_WAKES_WITHIN);
        assert_eq!(closeness.plan(200, 110), 200);
    }

    #[test]
    fn nothing_planned_still_sleeps_until_woken() {
        let mut closeness = Closeness::default();
        closeness.woke_early(100);
        closeness.woke_early(101);
        assert_eq!(closeness.plan(u64::MAX, 101), u64::MAX);
    }
}
