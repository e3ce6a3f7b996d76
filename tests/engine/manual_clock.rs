//! The engine's timing logic, driven by a manual clock: every decision is deterministic, and
//! no test sleeps.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{manual as engine, ms, run_for};

use corewheel::{
    BuildError, Clock, ManualClock, MissedTicks, PendingTimers, ScheduleError, ShutdownReport,
    TimerEngine, TimerHandle,
};

/// A counter and a callback that bumps it.
fn counter() -> (Arc<AtomicUsize>, impl Fn() -> Box<dyn FnOnce() + Send>) {
    let count = Arc::new(AtomicUsize::new(0));
    let make = {
        let count = Arc::clone(&count);
        move || {
            let count = Arc::clone(&count);
            Box::new(move || {
                count.fetch_add(1, Ordering::Relaxed);
            }) as Box<dyn FnOnce() + Send>
        }
    };
    (count, make)
}

#[test]
fn a_timer_fires_at_its_deadline_and_not_a_tick_before() {
    let (engine, clock) = engine(2);
    let (fired, callback) = counter();
    engine.schedule(ms(30), callback()).unwrap();
    run_for(&engine, &clock, 29);
    assert_eq!(fired.load(Ordering::Relaxed), 0);
    run_for(&engine, &clock, 1);
    assert_eq!(fired.load(Ordering::Relaxed), 1);
    run_for(&engine, &clock, 100);
    assert_eq!(fired.load(Ordering::Relaxed), 1, "exactly once");
}

#[test]
fn zero_delays_and_past_deadlines_fire_on_the_next_tick() {
    let (engine, clock) = engine(1);
    let (fired, callback) = counter();
    engine.schedule(Duration::ZERO, callback()).unwrap();
    let past = clock.now().checked_sub(ms(5000)).unwrap_or(clock.now());
    engine.schedule_at(past, callback()).unwrap();
    engine.turn();
    let now_fired = fired.load(Ordering::Relaxed);
    run_for(&engine, &clock, 1);
    assert_eq!(
        fired.load(Ordering::Relaxed),
        2,
        "{now_fired} before the tick"
    );
}

#[test]
fn a_huge_delay_never_fires_but_can_be_cancelled() {
    let (engine, clock) = engine(1);
    let (fired, callback) = counter();
    let handle = engine.schedule(Duration::MAX, callback()).unwrap();
    clock.advance(Duration::from_secs(86_400 * 365 * 100));
    engine.turn();
    assert_eq!(fired.load(Ordering::Relaxed), 0);
    assert!(engine.is_pending(handle));
    assert!(engine.cancel(handle));
}

#[test]
fn cancel_wins_once_and_the_callback_never_runs() {
    let (engine, clock) = engine(2);
    let (fired, callback) = counter();
    let handle = engine.schedule(ms(10), callback()).unwrap();
    assert!(engine.cancel(handle));
    assert!(!engine.cancel(handle), "double cancel");
    assert!(!engine.is_pending(handle));
    run_for(&engine, &clock, 20);
    assert_eq!(fired.load(Ordering::Relaxed), 0);
    assert_eq!(engine.nodes_in_use(), 0);
}

#[test]
fn a_cancelled_timer_leaves_the_wheel_within_the_lane_horizon_not_at_its_deadline() {
    let (engine, clock) = engine(1);
    let (fired, callback) = counter();
    // Far enough ahead that the worker files it in the wheel when its lane comes due...
    let handle = engine.schedule(ms(3), callback()).unwrap();
    run_for(&engine, &clock, 1);
    // ...and then pushed back so that it sits in the wheel for an hour.
    assert!(engine.reset(handle, Duration::from_secs(3600)));
    run_for(&engine, &clock, 3);
    assert_eq!(engine.nodes_in_use(), 1);
    assert!(engine.cancel(handle));
    // The cancel's message travels on this thread's lane, which the worker takes by its
    // need: its own next wake-up, or 32 ticks on (the idle lane horizon) at the latest.
    run_for(&engine, &clock, 32);
    assert_eq!(engine.nodes_in_use(), 0, "the node is back in its pool");
    assert_eq!(fired.load(Ordering::Relaxed), 0);
}

#[test]
fn reset_later_moves_the_deadline_and_never_fires_at_the_old_one() {
    let (engine, clock) = engine(1);
    let (fired, callback) = counter();
    let handle = engine.schedule(ms(10), callback()).unwrap();
    run_for(&engine, &clock, 5);
    assert!(engine.reset(handle, ms(20)));
    run_for(&engine, &clock, 19);
    assert_eq!(
        fired.load(Ordering::Relaxed),
        0,
        "still before the new deadline"
    );
    run_for(&engine, &clock, 1);
    assert_eq!(fired.load(Ordering::Relaxed), 1);
    assert!(
        !engine.reset(handle, ms(5)),
        "a fired timer cannot be reset"
    );
}

#[test]
fn reset_earlier_fires_at_the_new_deadline() {
    for filed_first in [false, true] {
        let (engine, clock) = engine(1);
        let (fired, callback) = counter();
        // A deadline far enough out that the timer waits on its lane unless a turn files it.
        let handle = engine
            .schedule(Duration::from_secs(10), callback())
            .unwrap();
        if filed_first {
            // Make the lane due by pushing the clock past the need only for this timer:
            // schedule another short one so the worker takes the lane and files both.
            engine.schedule(ms(1), || {}).unwrap();
            run_for(&engine, &clock, 1);
        }
        assert!(engine.reset(handle, ms(5)));
        run_for(&engine, &clock, 4);
        assert_eq!(
            fired.load(Ordering::Relaxed),
            0,
            "filed first: {filed_first}"
        );
        run_for(&engine, &clock, 1);
        assert_eq!(
            fired.load(Ordering::Relaxed),
            1,
            "filed first: {filed_first}"
        );
    }
}

#[test]
fn stale_handles_never_touch_the_timer_that_reuses_the_node() {
    let (engine, clock) = engine(1);
    let (fired, callback) = counter();
    let old = engine.schedule(ms(1), callback()).unwrap();
    run_for(&engine, &clock, 2);
    assert_eq!(fired.load(Ordering::Relaxed), 1);
    // Arm enough timers that one of them reuses the old node.
    let fresh: Vec<_> = (0..200)
        .map(|_| engine.schedule(ms(50), callback()).unwrap())
        .collect();
    assert!(!engine.cancel(old));
    assert!(!engine.reset(old, ms(1)));
    assert!(!engine.is_pending(old));
    assert!(fresh.iter().all(|&handle| engine.is_pending(handle)));
    run_for(&engine, &clock, 50);
    assert_eq!(fired.load(Ordering::Relaxed), 201);
}

#[test]
fn a_handle_from_another_engine_is_stale() {
    let (first, _) = engine(1);
    let (second, _) = engine(1);
    let handle = first.schedule(ms(10), || {}).unwrap();
    assert!(!second.cancel(handle));
    assert!(!second.reset(handle, ms(1)));
    assert!(!second.is_pending(handle));
    assert!(first.is_pending(handle));
}

/// Runs a 10 ms repeating timer under `policy`, advances 35 ms in one step (the worker was
/// away), then turns until idle, and returns how many runs happened and the clock-relative
/// milliseconds of the next run.
fn missed_ticks(policy: MissedTicks) -> (usize, u64) {
    let (engine, clock) = engine(1);
    let start = clock.now();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&runs);
    let time = clock.clone();
    engine
        .schedule_repeating_with(ms(10), policy, move || {
            log.lock().unwrap().push(time.now() - start);
        })
        .unwrap();
    clock.advance(ms(35));
    while engine.turn() > 0 {}
    let caught_up = runs.lock().unwrap().len();
    let mut next = 36;
    loop {
        clock.advance_to(start + ms(next));
        engine.turn();
        if runs.lock().unwrap().len() > caught_up {
            return (caught_up, next);
        }
        next += 1;
    }
}

#[test]
fn missed_ticks_burst_delay_or_skip_as_asked() {
    // Due at 10, 20, 30; run late at 35.
    assert_eq!(missed_ticks(MissedTicks::Burst), (3, 40));
    assert_eq!(missed_ticks(MissedTicks::Skip), (1, 40), "Go's formula");
    assert_eq!(missed_ticks(MissedTicks::Delay), (1, 45));
}

#[test]
fn repeating_timers_stay_phase_aligned() {
    let (engine, clock) = engine(1);
    let start = clock.now();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&runs);
    let time = clock.clone();
    engine
        .schedule_repeating(ms(7), move || log.lock().unwrap().push(time.now() - start))
        .unwrap();
    run_for(&engine, &clock, 50);
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs, (1..=7).map(|k| ms(7 * k)).collect::<Vec<_>>());
}

#[test]
fn a_repeating_timer_cancelled_from_its_own_callback_stops() {
    let (engine, clock) = engine(1);
    let engine = Arc::new(engine);
    let runs = Arc::new(AtomicUsize::new(0));
    let handle = Arc::new(Mutex::new(None));
    let (inner_engine, inner_runs, inner_handle) =
        (Arc::clone(&engine), Arc::clone(&runs), Arc::clone(&handle));
    let cancelled = Arc::new(AtomicUsize::new(0));
    let inner_cancelled = Arc::clone(&cancelled);
    let repeating = engine
        .schedule_repeating(ms(5), move || {
            if inner_runs.fetch_add(1, Ordering::Relaxed) == 2 {
                let handle = inner_handle.lock().unwrap().expect("stored");
                if inner_engine.cancel(handle) {
                    inner_cancelled.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .unwrap();
    *handle.lock().unwrap() = Some(repeating);
    run_for(&engine, &clock, 100);
    assert_eq!(runs.load(Ordering::Relaxed), 3);
    assert_eq!(cancelled.load(Ordering::Relaxed), 1);
    assert!(!engine.is_pending(repeating));
    assert_eq!(engine.nodes_in_use(), 0);
}

#[test]
fn a_panicking_callback_is_counted_and_the_worker_goes_on() {
    let (engine, clock) = engine(1);
    let (fired, callback) = counter();
    engine
        .schedule(ms(1), || panic!("a callback failure"))
        .unwrap();
    engine.schedule(ms(2), callback()).unwrap();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    run_for(&engine, &clock, 3);
    std::panic::set_hook(hook);
    assert_eq!(fired.load(Ordering::Relaxed), 1);
    let stats = engine.stats();
    assert_eq!(stats.total.panicked, 1);
    assert_eq!(stats.total.fired, 2);
}

#[test]
fn shutdown_runs_pending_timers_when_asked_and_reports_them() {
    let (engine, clock) = engine(2);
    let (fired, callback) = counter();
    for _ in 0..10 {
        engine
            .schedule(Duration::from_secs(60), callback())
            .unwrap();
    }
    let cancelled = engine
        .schedule(Duration::from_secs(60), callback())
        .unwrap();
    assert!(engine.cancel(cancelled));
    run_for(&engine, &clock, 1);
    let report = engine.shutdown(PendingTimers::Run);
    assert_eq!(
        report,
        ShutdownReport {
            ran: 10,
            dropped: 0
        }
    );
    assert_eq!(fired.load(Ordering::Relaxed), 10);
    assert_eq!(engine.nodes_in_use(), 0);
    assert_eq!(
        engine.shutdown(PendingTimers::Drop),
        report,
        "a second call reports the first"
    );
}

#[test]
fn shutdown_drops_pending_timers_unrun() {
    let (engine, _clock) = engine(2);
    let witness = Arc::new(());
    for _ in 0..10 {
        let held = Arc::clone(&witness);
        engine
            .schedule(Duration::from_secs(60), move || drop(held))
            .unwrap();
    }
    let report = engine.shutdown(PendingTimers::Drop);
    assert_eq!(
        report,
        ShutdownReport {
            ran: 0,
            dropped: 10
        }
    );
    assert_eq!(Arc::strong_count(&witness), 1, "every callback was dropped");
    assert_eq!(engine.nodes_in_use(), 0);
}

#[test]
fn everything_after_shutdown_is_an_error_or_false() {
    let (engine, _clock) = engine(1);
    let handle = engine.schedule(ms(10), || {}).unwrap();
    engine.shutdown(PendingTimers::Drop);
    assert_eq!(
        engine.schedule(ms(1), || {}).unwrap_err(),
        ScheduleError::Shutdown
    );
    assert_eq!(
        engine.schedule_repeating(ms(1), || {}).unwrap_err(),
        ScheduleError::Shutdown
    );
    assert!(!engine.cancel(handle));
    assert!(!engine.reset(handle, ms(1)));
    assert!(!engine.is_pending(handle));
    assert_eq!(engine.turn(), 0);
}

#[test]
fn dropping_the_engine_drops_pending_callbacks() {
    let witness = Arc::new(());
    {
        let (engine, _clock) = engine(2);
        for _ in 0..100 {
            let held = Arc::clone(&witness);
            engine
                .schedule(Duration::from_secs(60), move || drop(held))
                .unwrap();
        }
    }
    assert_eq!(Arc::strong_count(&witness), 1);
}

#[test]
fn large_closures_are_boxed_and_still_run_once() {
    let (engine, clock) = engine(1);
    let (fired, _) = counter();
    let big = [3_u64; 16];
    let count = Arc::clone(&fired);
    engine
        .schedule(ms(1), move || {
            assert_eq!(big.iter().sum::<u64>(), 48);
            count.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
    run_for(&engine, &clock, 2);
    assert_eq!(fired.load(Ordering::Relaxed), 1);
}

#[test]
fn bad_builder_input_is_a_typed_error() {
    assert!(matches!(
        TimerEngine::builder().workers(0).build(),
        Err(BuildError::NoWorkers)
    ));
    assert!(matches!(
        TimerEngine::builder().tick(Duration::ZERO).build(),
        Err(BuildError::ZeroTick)
    ));
    assert!(matches!(
        TimerEngine::builder().workers(1 << 20).build(),
        Err(BuildError::TooManyWorkers(_))
    ));
}

#[test]
fn stats_count_what_happened() {
    let (engine, clock) = engine(2);
    let (_, callback) = counter();
    let handles: Vec<_> = (0..10)
        .map(|k| engine.schedule(ms(5 + k), callback()).unwrap())
        .collect();
    assert!(engine.cancel(handles[0]));
    assert!(engine.reset(handles[1], ms(100)));
    run_for(&engine, &clock, 20);
    let stats = engine.stats();
    assert_eq!(stats.total.scheduled, 10);
    assert_eq!(stats.total.cancelled, 1);
    assert_eq!(stats.total.reset, 1);
    assert_eq!(stats.total.fired, 8);
    assert_eq!(stats.total.pending, 1);
    assert_eq!(stats.shards.len(), 2);
    // The worker was late by 10 ticks for this one.
    engine.schedule(ms(1), callback()).unwrap();
    clock.advance(ms(12));
    engine.turn();
    assert_eq!(engine.stats().total.late, 1);
}

#[test]
fn timers_from_an_exited_thread_still_fire() {
    let (engine, clock) = engine(2);
    let engine = Arc::new(engine);
    let (fired, callback) = counter();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            let engine = Arc::clone(&engine);
            let callback = &callback;
            scope.spawn(move || {
                for k in 0..100 {
                    engine.schedule(ms(1 + k % 20), callback()).unwrap();
                }
            });
        }
    });
    run_for(&engine, &clock, 25);
    assert_eq!(fired.load(Ordering::Relaxed), 400);
    assert_eq!(engine.stats().total.pending, 0);
    assert_eq!(engine.nodes_in_use(), 0);
}

#[test]
fn arm_and_cancel_at_once_is_recycled_on_the_arming_thread() {
    let (engine, clock) = engine(1);
    let first = engine.schedule(Duration::from_secs(5), || {}).unwrap();
    assert!(engine.cancel(first));
    let one_chunk = engine.stats().pool_bytes;
    for _ in 0..100_000 {
        let handle = engine.schedule(Duration::from_secs(5), || {}).unwrap();
        assert!(engine.cancel(handle));
    }
    // The thread reuses its own nodes: the first chunk of the pool is all it ever needs.
    assert_eq!(engine.stats().pool_bytes, one_chunk);
    run_for(&engine, &clock, 1);
    assert_eq!(engine.stats().total.cancelled, 100_001);
    assert_eq!(engine.stats().total.pending, 0);
    // The last few wait on the lane for the thread's next claim, or for the worker to take
    // the lane when its earliest deadline comes.
    assert!(engine.nodes_in_use() < 64, "{}", engine.nodes_in_use());
    clock.advance(Duration::from_secs(5));
    engine.turn();
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Timers that note their id and the engine's millisecond when they fire.
struct FireLog {
    fired: Arc<Mutex<Vec<(usize, u64)>>>,
    clock: ManualClock,
    started: Instant,
}

impl FireLog {
    fn new(clock: &ManualClock) -> Self {
        Self {
            fired: Arc::default(),
            clock: clock.clone(),
            started: clock.now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.clock.now().duration_since(self.started).as_millis() as u64
    }

    fn schedule(&self, engine: &TimerEngine, id: usize, delay: Duration) -> TimerHandle {
        let (fired, clock, started) = (Arc::clone(&self.fired), self.clock.clone(), self.started);
        engine
            .schedule(delay, move || {
                let at = clock.now().duration_since(started).as_millis() as u64;
                fired.lock().unwrap().push((id, at));
            })
            .unwrap()
    }

    /// What fired, by id.
    fn sorted(&self) -> Vec<(usize, u64)> {
        let mut fired = self.fired.lock().unwrap().clone();
        fired.sort_unstable();
        fired
    }
}

/// One look at the wheel receives many messages at once (filed timers being cancelled,
/// pushed back and pulled in, beside new ones), in a count that is no multiple of the
/// look-ahead the worker takes them with: each lands exactly as it would alone.
#[test]
fn a_turn_receiving_a_thousand_mixed_messages_settles_each_as_if_alone() {
    let (engine, clock) = engine(1);
    let log = FireLog::new(&clock);
    let schedule = |id: usize, delay: Duration| log.schedule(&engine, id, delay);
    // Filed first, so that the messages below unlink them from busy wheel lists.
    let handles: Vec<_> = (0..1_003)
        .map(|id| schedule(id, ms(100 + (id % 7) as u64)))
        .collect();
    run_for(&engine, &clock, 40);
    assert_eq!(engine.nodes_in_use(), 1_003);
    let mut expected = Vec::new();
    for (id, &handle) in handles.iter().enumerate() {
        match id % 4 {
            0 => assert!(engine.cancel(handle)),
            1 => {
                assert!(engine.reset(handle, ms(200)));
                expected.push((id, 240));
            }
            2 => {
                assert!(engine.reset(handle, ms(10)));
                expected.push((id, 50));
            }
            _ => expected.push((id, 100 + (id % 7) as u64)),
        }
    }
    for id in 2_000..2_037 {
        schedule(id, ms(30));
        expected.push((id, 70));
    }
    run_for(&engine, &clock, 300);
    let fired = log.sorted();
    expected.sort_unstable();
    assert_eq!(
        fired, expected,
        "each timer fired once, at its own deadline"
    );
    assert_eq!(engine.nodes_in_use(), 0, "every node is back in its pool");
}

/// A thread whose timers outlive the lane's hold-back (none is cancelled while the lane
/// holds it): timers forwarded after their hold fire at their own ticks, and cancels of
/// either kind free every node.
#[test]
fn timers_outliving_the_lanes_hold_back_fire_and_cancel_as_ever() {
    let (engine, clock) = engine(1);
    let log = FireLog::new(&clock);
    let schedule = |id: usize, delay: Duration| log.schedule(&engine, id, delay);
    // A thousand schedules a tick, so that this thread's lane takes its old stacks back
    // (every few ticks) before the worker's need for them comes: what they held comes back
    // uncaught. The long timers are cancelled a second later.
    let mut long = Vec::new();
    let mut expected = Vec::new();
    for round in 0..40 {
        for i in 0..1_000 {
            let id = round * 1_000 + i;
            if i % 100 == 0 {
                let at = log.now_ms();
                schedule(id, ms(500));
                expected.push((id, at + 500));
            } else {
                long.push(schedule(id, Duration::from_secs(30)));
            }
        }
        run_for(&engine, &clock, 1);
    }
    run_for(&engine, &clock, 1_000);
    for handle in long {
        assert!(engine.cancel(handle));
    }
    run_for(&engine, &clock, 100);
    let fired = log.sorted();
    expected.sort_unstable();
    assert_eq!(
        fired, expected,
        "each short timer fired once, at its own tick"
    );
    assert_eq!(engine.nodes_in_use(), 0, "every node is back in its pool");
}
