//! A worker thread: the owner of one shard's [`WheelSide`](crate::engine::wheel_side). Who
//! may touch what, and when: the ground rules in [`engine`](crate::engine).

use crate::engine::balance::UserCode;
use crate::engine::hand_out;
use crate::engine::runner;
use crate::engine::shard_parts::AWAKE;
use crate::engine::shared::EngineShared;
use crate::engine::thread_role;
use crate::engine::wakes::{Planned, Woke};
use crate::sync::Arc;
use crate::sync::atomic::Ordering;
use crate::sync::run_queue::MAX_RUN;

/// The window, in ticks, over which a worker counts wake-ups for timers due before its
/// plan, and how many in one window make it sleep close ([`Closeness`]): more than sleeping
/// close costs. Over a window, not between two wake-ups, which fall close by chance.
const UNDERCUT_WINDOW: u64 = 16;
const UNDERCUTS_TO_CLOSE: u32 = 8;

/// How long a worker sleeps close: long enough that the window of wake-ups it takes to
/// begin the next spell is rare.
const CLOSE_FOR: u64 = 256;

/// The most ticks a worker sleeping close plans ahead: it wakes every two to three ticks.
const CLOSE_SLEEP: u64 = 3;

/// Whether a worker's plan is being undercut: threads arming timers due before its planned
/// wake-up must wake it (a system call for them, a context switch for it), and under varied
/// delays the earliest keeps falling before a far plan. While that goes on, the worker plans
/// at most [`CLOSE_SLEEP`] ticks ahead and wakes on its own instead. Only wake-ups for a
/// timer count ([`ShardParts::wake_for_timer`](crate::engine::shard_parts::ShardParts::wake_for_timer)),
/// not the watch for stuck owners. With nothing planned (`u64::MAX`) it still sleeps until
/// woken: an idle engine costs nothing.
#[derive(Default)]
struct Closeness {
    /// The tick the current window of counted wake-ups began at.
    window_start: u64,
    /// Wake-ups for timers counted in it.
    undercuts: u32,
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

    /// A thread woke the worker at `tick`, before its planned tick, for a timer due sooner.
    fn undercut(&mut self, tick: u64) {
        if self.undercuts == 0 || tick >= self.window_start.saturating_add(UNDERCUT_WINDOW) {
            self.window_start = tick;
            self.undercuts = 0;
        }
        self.undercuts += 1;
        if self.undercuts >= UNDERCUTS_TO_CLOSE {
            self.until = tick.saturating_add(CLOSE_FOR);
            self.undercuts = 0;
        }
    }
}

/// A worker thread's life: look at the wheel, run what came due, help other shards when
/// idle, sleep until the next deadline or a wake-up; at shutdown, one last turn.
pub(crate) fn run(shared: &Arc<EngineShared>, index: usize) {
    thread_role::become_worker();
    crate::engine::context::set_home(shared, index);
    let shard = &shared.shards[index];
    let shards = &shared.shards[..];
    let balance = &shared.balance;
    shard.beat(shared.now_tick());
    let mut closeness = Closeness::default();
    // The last wake-up, counted once the look after it shows whether timers were due.
    let mut woke_up: Option<Woke> = None;
    loop {
        let now = shared.clock.now();
        let now_tick = shared.ticks.floor(now);
        let look = shard.owner_look(now, now_tick);
        if let Some(woke) = woke_up.take() {
            shard.counters.wakes.count(woke, look.claimed);
        }
        if !look.unfreed.is_empty() {
            // Captures' `Drop`s are user code: a watcher stands in if one blocks.
            balance.with_user_code((shards, shard), now_tick, UserCode::Drops, || {
                look.unfreed.free(shard);
            });
        }
        if shared.shutdown.load(Ordering::SeqCst) {
            shard.finish(shared.pending_mode(), now);
            return;
        }
        if look.handed_out {
            balance.wake_one(shards);
        } else if look.claimed > 0 {
            balance.offer(shards, shard, look.more_due);
        }
        // Timed, for the owner's cost per callback.
        let run_own = |claimed: &[u32], now_tick: u64| {
            let started = std::time::Instant::now();
            let ran =
                balance.with_user_code((shards, shard), now_tick, UserCode::Callbacks, || {
                    runner::run(shard, claimed, now_tick, true)
                });
            shard.note_run(ran, started.elapsed());
        };
        // One run at a time, looking at the wheel in between, to keep the heartbeat fresh.
        if let Some(run) = shard.run.take(MAX_RUN) {
            run_own(run.indices(), now_tick);
            continue;
        }
        if look.lists_out {
            // Walks its lists with the helpers; the rest is being walked for a batch at
            // most, and the next look takes them back.
            let walked = hand_out::walk(shard, &shared.shutdown, index, |batch, due| {
                run_own(batch, now_tick.max(due));
            });
            if !walked {
                crate::sync::yield_now();
            }
            continue;
        }
        if look.more_due || balance.help(shards, &shared.shutdown, index, (now, now_tick)) {
            continue;
        }
        let planned = look.next.unwrap_or(u64::MAX);
        let plan = closeness.plan(planned, now_tick);
        if plan <= now_tick {
            continue;
        }
        let mut planned_for = if plan < planned {
            Planned::Close
        } else {
            look.next_for
        };
        shard.plan_wake(plan);
        let idle = balance.begin_idle(shards, index, now_tick);
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
            if shard.take_undercut() && woke < wake {
                closeness.undercut(woke);
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
    use super::{CLOSE_FOR, CLOSE_SLEEP, Closeness, UNDERCUT_WINDOW, UNDERCUTS_TO_CLOSE};

    /// `n` undercuts, one a tick from `from`.
    fn undercut_from(closeness: &mut Closeness, from: u64, n: u32) -> u64 {
        let mut tick = from;
        for _ in 0..n {
            closeness.undercut(tick);
            tick += 1;
        }
        tick - 1
    }

    #[test]
    fn fewer_undercuts_than_a_window_needs_change_nothing() {
        let mut closeness = Closeness::default();
        let last = undercut_from(&mut closeness, 100, UNDERCUTS_TO_CLOSE - 1);
        assert_eq!(closeness.plan(last + 30, last), last + 30);
    }

    #[test]
    fn a_window_of_undercuts_caps_the_plan_for_a_while() {
        let mut closeness = Closeness::default();
        let now = undercut_from(&mut closeness, 100, UNDERCUTS_TO_CLOSE);
        assert_eq!(closeness.plan(now + 30, now), now + CLOSE_SLEEP);
        assert_eq!(closeness.plan(now + 1, now), now + 1, "a sooner plan stays");
        let last = now + CLOSE_FOR - 1;
        assert_eq!(closeness.plan(last + 30, last), last + CLOSE_SLEEP);
        let over = now + CLOSE_FOR;
        assert_eq!(closeness.plan(over + 30, over), over + 30);
    }

    #[test]
    fn undercuts_spread_over_more_than_a_window_do_not_cap() {
        let mut closeness = Closeness::default();
        let mut tick = 100;
        for _ in 0..10 * UNDERCUTS_TO_CLOSE {
            closeness.undercut(tick);
            tick += UNDERCUT_WINDOW / u64::from(UNDERCUTS_TO_CLOSE - 1) + 1;
        }
        assert_eq!(closeness.plan(tick + 30, tick), tick + 30);
    }

    #[test]
    fn nothing_planned_still_sleeps_until_woken() {
        let mut closeness = Closeness::default();
        let now = undercut_from(&mut closeness, 100, UNDERCUTS_TO_CLOSE);
        assert_eq!(closeness.plan(u64::MAX, now), u64::MAX);
    }
}
