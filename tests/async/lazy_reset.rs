//! The lazy later reset of `Sleep` (the timer stays at the old deadline; the poll its wake
//! brings re-arms), `fired_for_deadline` (the clock's tick against the deadline's), and
//! deadlines kept as signed nanoseconds since the engine's origin; and that the lazy cycle
//! allocates nothing once warm.
//!
//! Manual-clock tests check exact behaviour against a reference model (property tests,
//! whose regressions are kept in `lazy_reset.proptest-regressions` beside this file);
//! real-clock tests assert only what holds on a loaded 2-core machine (never early,
//! nothing lost, nothing leaked) with generous limits.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crate::support::allocs::{allocations_in, watch};
use crate::support::leaked_unpinned_tick as leaked_real;
use crate::support::{Wakes, poll, tokio_next, within};
use corewheel::{HyperTimer, ManualClock, MissedTicks, PendingTimers, Sleep, TimerEngine};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

const MS: Duration = Duration::from_millis(1);
const LIMIT: Duration = Duration::from_secs(120);
/// Past the engine's 292-year range: a deadline that never comes.
const CENTURIES: Duration = Duration::from_secs(300 * 365 * 86_400);

fn manual_tick(tick: Duration) -> (TimerEngine, ManualClock) {
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(1)
        .tick(tick)
        .capacity(1024)
        .manual_clock(clock.clone())
        .build()
        .unwrap();
    (engine, clock)
}

fn leaked_manual(tick: Duration) -> (&'static TimerEngine, ManualClock) {
    let (engine, clock) = manual_tick(tick);
    (Box::leak(Box::new(engine)), clock)
}

/// The earliest instant a `Sleep` at `deadline` may complete on an engine started at
/// `origin` with ticks of `tick`: the deadline rounded up to a tick boundary.
fn rounded(origin: Instant, tick: Duration, deadline: Instant) -> Instant {
    let Some(after) = deadline.checked_duration_since(origin) else {
        return origin;
    };
    let tick_ns = tick.as_nanos();
    let ticks = after.as_nanos().div_ceil(tick_ns);
    origin + Duration::from_nanos(u64::try_from(ticks * tick_ns).unwrap())
}

/// Turns `engine` until nothing is left to free, advancing a tick at a time.
fn settle(engine: &TimerEngine, clock: &ManualClock) {
    // A cancel's message waits on an idle thread's lane for up to the lane's idle horizon
    // (32 ticks) before the owner frees the node: twice that.
    for _ in 0..64 {
        clock.advance(engine.tick());
        engine.turn();
    }
}

// ------------------------------------------------------------------ (1) reference model

#[derive(Debug, Clone)]
enum Op {
    /// Reset to now + `ticks` ticks + `sub` ns (`ticks` may be negative: a past deadline),
    /// then (unless `bare`) the task polls the sleep, as it must after a reset.
    ResetFromNow { ticks: i64, sub: u64, bare: bool },
    /// Reset to a deadline `delta` ns from the current one (same tick, or a tick either
    /// side).
    ResetNear { delta: i64, bare: bool },
    /// Reset past the engine's range (never), then back on a later op.
    ResetNever { bare: bool },
    /// A poll from task A or B (a spurious poll, or the sleep moving to another task).
    Poll { b: bool },
    /// The clock moves `ticks` ticks and `sub` ns.
    Advance { ticks: u32, sub: u64 },
    /// The engine turns; the executor then polls the task if a waker was woken.
    Turn,
}

fn op(tick_ns: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (-3i64..25, 0..tick_ns, any::<bool>())
            .prop_map(|(ticks, sub, bare)| Op::ResetFromNow { ticks, sub, bare }),
        2 => (-(2 * tick_ns as i64)..(2 * tick_ns as i64), any::<bool>())
            .prop_map(|(delta, bare)| Op::ResetNear { delta, bare }),
        1 => any::<bool>().prop_map(|bare| Op::ResetNever { bare }),
        2 => any::<bool>().prop_map(|b| Op::Poll { b }),
        4 => (0u32..6, 0..tick_ns).prop_map(|(ticks, sub)| Op::Advance { ticks, sub }),
        4 => Just(Op::Turn),
    ]
}

/// What the test knows of the sleep: its deadline (`None`: never), whether the task last
/// saw it complete, the wakes seen, and a bound on the spurious ones.
struct Model {
    origin: Instant,
    tick: Duration,
    deadline: Option<Instant>,
    owner_b: bool,
    seen_wakes: usize,
    spurious: usize,
    later_resets: usize,
}

fn check_honest(model: &Model, sleep: &Sleep<'_>, now: Instant, ready: bool, what: &str) {
    if !(ready || sleep.is_elapsed()) {
        return;
    }
    match model.deadline {
        None => panic!("{what}: a sleep reset to never completed (ready {ready})"),
        Some(deadline) => {
            assert_eq!(sleep.deadline(), deadline, "{what}: deadline read back");
            let earliest = rounded(model.origin, model.tick, deadline);
            assert!(
                now >= earliest,
                "{what}: complete {:?} before its deadline rounded up (ready {ready}, \
                 is_elapsed {})",
                earliest - now,
                sleep.is_elapsed()
            );
        }
    }
}

fn run_model(tick: Duration, ops: &[Op]) {
    run_model_on(tick, 1, ops);
}

/// The model on an engine of `workers` shards; with more than one, task B polls from a
/// new thread each time, so its timers are armed on other lanes and shards than A's.
fn run_model_on(tick: Duration, workers: usize, ops: &[Op]) {
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(workers)
        .tick(tick)
        .capacity(1024)
        .manual_clock(clock.clone())
        .build()
        .unwrap();
    let (wakes_a, waker_a) = Wakes::waker();
    let (wakes_b, waker_b) = Wakes::waker();
    let origin = engine.now();
    let first = origin + 5 * tick;
    let mut sleep = engine.sleep_until(first);
    let mut model = Model {
        origin,
        tick,
        deadline: Some(first),
        owner_b: false,
        seen_wakes: 0,
        spurious: 0,
        later_resets: 0,
    };
    let total = |model: &Model| {
        let _ = model;
        wakes_a.count() + wakes_b.count()
    };
    let waker_of = |b: bool| if b { &waker_b } else { &waker_a };
    let tick_of = |model: &Model, at: Option<Instant>| -> u64 {
        match at {
            None => u64::MAX,
            Some(at) => {
                let after = at.saturating_duration_since(model.origin).as_nanos();
                u64::try_from(after.div_ceil(model.tick.as_nanos())).unwrap()
            }
        }
    };
    let mut armed_once = false;
    // Whether the task has polled the sleep since its last reset (and it was pending
    // then), and whether it has completed since.
    let mut polled_since_reset = false;
    let mut done = false;
    for (i, op) in ops.iter().enumerate() {
        let what = format!("op {i} {op:?}");
        let mut poll_after = false;
        let reset_to = |model: &mut Model, sleep: &mut Sleep<'_>, to: Option<Instant>| {
            if armed_once && tick_of(model, to) > tick_of(model, model.deadline) {
                model.later_resets += 1;
            }
            match to {
                Some(at) => sleep.reset(at),
                None => sleep.reset(engine.now() + CENTURIES),
            }
            model.deadline = to;
            if let Some(at) = to {
                assert_eq!(sleep.deadline(), at, "{what}: read back exactly");
            }
        };
        match *op {
            Op::ResetFromNow { ticks, sub, bare } => {
                let now = engine.now();
                let at = if ticks >= 0 {
                    now + tick * u32::try_from(ticks).unwrap() + Duration::from_nanos(sub)
                } else {
                    now - tick * u32::try_from(-ticks).unwrap() + Duration::from_nanos(sub)
                };
                reset_to(&mut model, &mut sleep, Some(at));
                poll_after = !bare;
                polled_since_reset = false;
                done = false;
            }
            Op::ResetNear { delta, bare } => {
                let base = model.deadline.unwrap_or(engine.now());
                let at = if delta >= 0 {
                    base + Duration::from_nanos(delta as u64)
                } else {
                    base - Duration::from_nanos(delta.unsigned_abs())
                };
                reset_to(&mut model, &mut sleep, Some(at));
                poll_after = !bare;
                polled_since_reset = false;
                done = false;
            }
            Op::ResetNever { bare } => {
                reset_to(&mut model, &mut sleep, None);
                poll_after = !bare;
                polled_since_reset = false;
                done = false;
            }
            Op::Poll { b } => {
                model.owner_b = b;
                poll_after = true;
            }
            Op::Advance { ticks, sub } => clock.advance(tick * ticks + Duration::from_nanos(sub)),
            Op::Turn => {
                engine.turn();
            }
        }
        let turned_when_due = matches!(op, Op::Turn)
            && polled_since_reset
            && model
                .deadline
                .is_some_and(|d| engine.now() >= rounded(model.origin, model.tick, d));
        let woken = total(&model) > model.seen_wakes;
        if poll_after || woken {
            model.seen_wakes = total(&model);
            let ready = if workers > 1 && model.owner_b {
                std::thread::scope(|s| s.spawn(|| poll(&mut sleep, &waker_b).is_ready()).join())
                    .unwrap()
            } else {
                poll(&mut sleep, waker_of(model.owner_b)).is_ready()
            };
            armed_once = true;
            if woken && !poll_after && !ready {
                model.spurious += 1;
            }
            check_honest(&model, &sleep, engine.now(), ready, &what);
            done |= ready;
            polled_since_reset = true;
        } else {
            check_honest(&model, &sleep, engine.now(), false, &what);
        }
        assert!(
            !turned_when_due || done,
            "{what}: late: the engine turned at or after the deadline ({:?} ago) of a sleep \
             polled since its last reset, and the task was not woken to complete it \
             (is_elapsed {})",
            engine.now() - model.deadline.unwrap(),
            sleep.is_elapsed()
        );
    }
    // The end: the task polls (as after its last reset), then only on wakes. A deadline
    // that comes must complete the sleep within a few turns, and one never stays pending.
    if model.deadline.is_none() {
        let at = engine.now() + 7 * tick + Duration::from_nanos(1);
        sleep.reset(at);
        model.deadline = Some(at);
    }
    model.seen_wakes = total(&model);
    let mut ready = poll(&mut sleep, waker_of(model.owner_b)).is_ready();
    check_honest(&model, &sleep, engine.now(), ready, "final poll");
    let deadline = model.deadline.unwrap();
    let due_from = rounded(origin, tick, deadline).max(engine.now());
    let max_rounds =
        due_from.saturating_duration_since(engine.now()).as_nanos() / tick.as_nanos() + 5;
    let mut rounds = 0;
    while !ready {
        rounds += 1;
        assert!(
            rounds <= max_rounds,
            "lost wake-up: deadline {:?} from now, is_elapsed {}, wakes {}",
            deadline.saturating_duration_since(engine.now()),
            sleep.is_elapsed(),
            total(&model)
        );
        clock.advance(tick);
        engine.turn();
        if total(&model) > model.seen_wakes {
            model.seen_wakes = total(&model);
            ready = poll(&mut sleep, waker_of(model.owner_b)).is_ready();
            if !ready && engine.now() >= due_from + 2 * tick {
                model.spurious += 1;
            }
            check_honest(&model, &sleep, engine.now(), ready, "final wake");
        }
    }
    assert!(
        engine.now() <= due_from + 2 * tick,
        "completed {:?} after it was due",
        engine.now() - due_from
    );
    assert!(
        model.spurious <= model.later_resets,
        "{} spurious wakes for {} later resets",
        model.spurious,
        model.later_resets
    );
    drop(sleep);
    settle(&engine, &clock);
    assert_eq!(engine.nodes_in_use(), 0, "node leaked");
    assert_eq!(Arc::strong_count(&wakes_a), 2, "waker A clone leaked");
    assert_eq!(Arc::strong_count(&wakes_b), 2, "waker B clone leaked");
}

proptest! {
    // Regressions beside this file (lazy_reset.proptest-regressions).
    #![proptest_config(ProptestConfig {
        cases: 400,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions"
        ))),
        ..ProptestConfig::default()
    })]

    /// Random resets (later, earlier, same tick, past, never and back), polls from two
    /// tasks, clock moves and turns: never complete before the deadline rounded up, never
    /// a lost wake, at most one spurious wake per later reset, no leaked node.
    #[test]
    fn model_random_resets_1ms(ops in proptest::collection::vec(op(1_000_000), 1..60)) {
        run_model(MS, &ops);
    }

    /// The same on a coarse 10 ms tick, where same-tick resets are common.
    #[test]
    fn model_random_resets_10ms(ops in proptest::collection::vec(op(10_000_000), 1..60)) {
        run_model(10 * MS, &ops);
    }

    /// The same on two shards, task B polling from other threads (other lanes and shards).
    #[test]
    fn model_random_resets_two_shards(ops in proptest::collection::vec(op(1_000_000), 1..40)) {
        run_model_on(MS, 2, &ops);
    }
}

// ------------------------------------------------------------------ (2) Interval model

#[derive(Debug, Clone)]
enum IOp {
    Advance {
        ticks: u32,
        sub: u64,
    },
    Turn,
    /// A poll of `tick` from the task, woken or not.
    Poll,
    Reset,
    ResetImmediately,
    ResetAfter {
        ticks: u32,
        sub: u64,
    },
    ResetAt {
        back: bool,
        ticks: u32,
        sub: u64,
    },
    Policy(u8),
}

fn iop(tick_ns: u64) -> impl Strategy<Value = IOp> {
    prop_oneof![
        5 => (0u32..8, 0..tick_ns).prop_map(|(ticks, sub)| IOp::Advance { ticks, sub }),
        5 => Just(IOp::Turn),
        3 => Just(IOp::Poll),
        1 => Just(IOp::Reset),
        1 => Just(IOp::ResetImmediately),
        1 => (0u32..12, 0..tick_ns).prop_map(|(ticks, sub)| IOp::ResetAfter { ticks, sub }),
        1 => (any::<bool>(), 0u32..12, 0..tick_ns)
            .prop_map(|(back, ticks, sub)| IOp::ResetAt { back, ticks, sub }),
        1 => (0u8..3).prop_map(IOp::Policy),
    ]
}

fn run_interval_model(tick: Duration, period: Duration, ops: &[IOp]) {
    let (engine, clock) = manual_tick(tick);
    let (wakes, waker) = Wakes::waker();
    let mut cx = Context::from_waker(&waker);
    let start = engine.now();
    let mut interval = engine.interval(period);
    let mut policy = MissedTicks::Burst;
    let mut expected = start;
    let mut seen = 0;
    let ticks = std::cell::Cell::new(0usize);
    let mut check = |interval: &mut corewheel::Interval<'_>,
                     expected: &mut Instant,
                     policy: MissedTicks,
                     what: &str| {
        if let Poll::Ready(due) = interval.poll_tick(&mut cx) {
            let now = engine.now();
            assert_eq!(due, *expected, "{what}: tick returned");
            assert!(now >= due, "{what}: tick {:?} early", due - now);
            *expected = tokio_next(policy, due, now, period);
            ticks.set(ticks.get() + 1);
            true
        } else {
            false
        }
    };
    for (i, op) in ops.iter().enumerate() {
        let what = format!("op {i} {op:?}");
        let mut polled = false;
        match *op {
            IOp::Advance { ticks, sub } => clock.advance(tick * ticks + Duration::from_nanos(sub)),
            IOp::Turn => {
                engine.turn();
            }
            IOp::Poll => polled = true,
            IOp::Reset => {
                interval.reset();
                expected = engine.now() + period;
                polled = true;
            }
            IOp::ResetImmediately => {
                interval.reset_immediately();
                expected = engine.now();
                polled = true;
            }
            IOp::ResetAfter { ticks, sub } => {
                let after = tick * ticks + Duration::from_nanos(sub);
                interval.reset_after(after);
                expected = engine.now() + after;
                polled = true;
            }
            IOp::ResetAt { back, ticks, sub } => {
                let by = tick * ticks + Duration::from_nanos(sub);
                let at = if back {
                    engine.now() - by
                } else {
                    engine.now() + by
                };
                interval.reset_at(at);
                expected = at;
                polled = true;
            }
            IOp::Policy(p) => {
                policy = [MissedTicks::Burst, MissedTicks::Delay, MissedTicks::Skip][p as usize];
                interval.set_missed_tick_behavior(policy);
            }
        }
        if polled || wakes.count() > seen {
            seen = wakes.count();
            // A task ticks in a loop: after a tick it polls again at once.
            while check(&mut interval, &mut expected, policy, &what) {}
        }
    }
    // No lost tick: the next one comes, woken, within a few ticks of when it is due.
    seen = wakes.count();
    let before = ticks.get();
    let _ = check(&mut interval, &mut expected, policy, "final");
    let due_by = rounded(start, tick, expected).max(engine.now()) + 3 * tick;
    while ticks.get() == before {
        assert!(
            engine.now() <= due_by,
            "lost tick: expected {:?}, now {:?} past it",
            expected,
            engine.now().saturating_duration_since(expected)
        );
        clock.advance(tick);
        engine.turn();
        if wakes.count() > seen {
            seen = wakes.count();
            let _ = check(&mut interval, &mut expected, policy, "final wake");
        }
    }
    drop(interval);
    settle(&engine, &clock);
    assert_eq!(engine.nodes_in_use(), 0);
}

proptest! {
    // Regressions beside this file (lazy_reset.proptest-regressions).
    #![proptest_config(ProptestConfig {
        cases: 300,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions"
        ))),
        ..ProptestConfig::default()
    })]

    /// An `Interval` driven by random clock moves, turns, polls, resets of every kind and
    /// policy changes returns exactly tokio's deadlines, never early, and never loses a tick.
    #[test]
    fn interval_model_matches_tokio(
        period_us in prop_oneof![Just(100u64), Just(1_000), Just(2_500), Just(7_000), Just(20_000)],
        coarse in any::<bool>(),
        ops in proptest::collection::vec(iop(1_000_000), 1..80),
    ) {
        let tick = if coarse { 4 * MS } else { MS };
        run_interval_model(tick, Duration::from_micros(period_us), &ops);
    }
}

// ------------------------------------------------------------------ (3) targeted, manual

/// A later reset leaves the timer at 10 ms; a reset back to 15 ms (earlier than 30, later
/// than the timer) moves the timer *later* than where it is, in place, a case the code's
/// comment ("this moves it earlier or leaves it") does not name. The sleep must neither
/// complete before 15 ms nor wake spuriously at 10 ms any more, nor be lost.
#[test]
fn reset_later_then_back_between_moves_the_left_timer_later_correctly() {
    let (engine, clock) = manual_tick(MS);
    let (wakes, waker) = Wakes::waker();
    let start = engine.now();
    let mut sleep = engine.sleep_until(start + 10 * MS);
    assert!(poll(&mut sleep, &waker).is_pending());
    sleep.reset(start + 30 * MS);
    sleep.reset(start + 15 * MS);
    assert_eq!(sleep.deadline(), start + 15 * MS);
    for ms in 1..=14 {
        clock.advance(MS);
        engine.turn();
        assert!(!sleep.is_elapsed(), "{ms} ms: complete before 15");
        if wakes.count() > 0 {
            assert!(
                poll(&mut sleep, &waker).is_pending(),
                "{ms} ms: ready before 15"
            );
        }
    }
    assert_eq!(wakes.count(), 0, "the timer moved to 15 ms: no wake at 10");
    clock.advance(MS);
    engine.turn();
    assert_eq!(wakes.count(), 1);
    assert_eq!(poll(&mut sleep, &waker), Poll::Ready(()));
    drop(sleep);
    settle(&engine, &clock);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Wakes whose `wake` polls the sleep at once, inline, inside the engine's turn (an
/// executor that runs the task on the waking thread): the old timer's wake after a later
/// reset re-arms from inside the turn that fired it. Never early, never lost.
#[test]
fn an_inline_wake_rearms_the_lazily_reset_sleep_inside_the_turn() {
    struct Inline {
        slot: Mutex<Option<Sleep<'static>>>,
        engine: &'static TimerEngine,
        readies: AtomicUsize,
        polls: AtomicUsize,
        early: AtomicBool,
        me: Mutex<Option<Waker>>,
    }
    impl Wake for Inline {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            let waker = self.me.lock().unwrap().clone().unwrap();
            let mut slot = self.slot.lock().unwrap();
            let Some(sleep) = slot.as_mut() else { return };
            self.polls.fetch_add(1, Ordering::SeqCst);
            if poll(sleep, &waker).is_ready() {
                if self.engine.now() < sleep.deadline() {
                    self.early.store(true, Ordering::SeqCst);
                }
                self.readies.fetch_add(1, Ordering::SeqCst);
                // Go again: a later deadline, polled at once.
                let next = self.engine.now() + 3 * MS + Duration::from_micros(200);
                sleep.reset(next);
                let _ = poll(sleep, &waker);
            }
        }
    }
    let (engine, clock) = leaked_manual(MS);
    let task = Arc::new(Inline {
        slot: Mutex::new(None),
        engine,
        readies: AtomicUsize::new(0),
        polls: AtomicUsize::new(0),
        early: AtomicBool::new(false),
        me: Mutex::new(None),
    });
    let waker = Waker::from(Arc::clone(&task));
    *task.me.lock().unwrap() = Some(waker.clone());
    let mut sleep = engine.sleep(2 * MS);
    assert!(poll(&mut sleep, &waker).is_pending());
    *task.slot.lock().unwrap() = Some(sleep);
    for step in 0..400u32 {
        clock.advance(Duration::from_micros(500));
        engine.turn();
        // Every seventh step (3.5 ms) a read pushes the deadline back 2 ms (lazily) from outside.
        if step % 7 == 0 {
            let mut slot = task.slot.lock().unwrap();
            let sleep = slot.as_mut().unwrap();
            if !sleep.is_elapsed() {
                sleep.reset(engine.now() + 2 * MS);
            }
        }
        assert!(!task.early.load(Ordering::SeqCst), "step {step}: early");
    }
    let readies = task.readies.load(Ordering::SeqCst);
    assert!(
        readies > 20,
        "only {readies} completions in 200 ms of 3.2 ms sleeps"
    );
    // Stop pushing back: the current deadline must still come.
    let before = task.readies.load(Ordering::SeqCst);
    for _ in 0..20 {
        clock.advance(MS);
        engine.turn();
    }
    assert!(
        task.readies.load(Ordering::SeqCst) > before,
        "lost wake after the last reset"
    );
    task.slot.lock().unwrap().take();
    task.me.lock().unwrap().take();
    settle(engine, &clock);
    assert_eq!(engine.nodes_in_use(), 0);
    drop(waker);
    assert_eq!(Arc::strong_count(&task), 1, "waker clones leaked");
}

/// Drops at each point of a lazy reset's life: after the old timer fired but before the
/// poll, after the re-arm, after completing, after a reset of a completed one. Every node
/// and every waker clone comes back.
#[test]
fn drops_around_a_lazy_fire_free_every_node_and_waker_clone() {
    let (engine, clock) = manual_tick(MS);
    let (wakes, waker) = Wakes::waker();
    let (_, other) = Wakes::waker();
    for stage in 0..6 {
        let mut sleep = engine.sleep(2 * MS);
        assert!(poll(&mut sleep, &waker).is_pending());
        sleep.reset(engine.now() + 5 * MS);
        if stage >= 1 {
            clock.advance(2 * MS);
            engine.turn(); // the old timer fires: one spurious wake
        }
        if stage >= 2 {
            assert!(
                poll(&mut sleep, &other).is_pending(),
                "re-armed with another waker"
            );
        }
        if stage >= 3 {
            clock.advance(3 * MS);
            engine.turn();
            assert_eq!(poll(&mut sleep, &other), Poll::Ready(()));
        }
        if stage >= 4 {
            sleep.reset(engine.now() + 4 * MS);
        }
        if stage >= 5 {
            assert!(poll(&mut sleep, &waker).is_pending());
        }
        drop(sleep);
        settle(&engine, &clock);
        assert_eq!(engine.nodes_in_use(), 0, "stage {stage}: node leaked");
        // The counting waker is held by `waker` and its Wakes by `wakes`.
        assert_eq!(
            Arc::strong_count(&wakes),
            2,
            "stage {stage}: waker clone leaked"
        );
    }
}

/// A lazily reset sleep on an engine that then shuts down (in both modes), and resets of
/// every kind after the shutdown: no panic, no hang; the documented completion at
/// shutdown; nothing left behind.
#[test]
fn lazy_resets_around_shutdown_complete_as_documented_and_leak_nothing() {
    for mode in [PendingTimers::Drop, PendingTimers::Run] {
        let (engine, clock) = manual_tick(MS);
        let (wakes, waker) = Wakes::waker();
        let mut lazy = engine.sleep(2 * MS);
        let mut never = engine.sleep(Duration::MAX);
        let mut fired = engine.sleep(MS);
        for sleep in [&mut lazy, &mut never, &mut fired] {
            assert!(poll(sleep, &waker).is_pending());
        }
        lazy.reset(engine.now() + 50 * MS);
        never.reset(engine.now() + CENTURIES);
        clock.advance(MS);
        engine.turn();
        fired.reset(engine.now() + 50 * MS); // fired, not polled: reset later
        engine.shutdown(mode);
        assert!(wakes.count() >= 3, "{mode:?}: every waiting sleep woken");
        for sleep in [&mut lazy, &mut never, &mut fired] {
            assert_eq!(poll(sleep, &waker), Poll::Ready(()), "{mode:?}");
            sleep.reset(engine.now() + 10 * MS);
            assert_eq!(
                poll(sleep, &waker),
                Poll::Ready(()),
                "{mode:?}: after shutdown"
            );
            sleep.reset(engine.now() - 10 * MS);
            sleep.reset(engine.now() + CENTURIES);
            assert_eq!(
                poll(sleep, &waker),
                Poll::Ready(()),
                "{mode:?}: never after shutdown"
            );
        }
        drop((lazy, never, fired));
        assert_eq!(engine.nodes_in_use(), 0, "{mode:?}");
    }
}

/// hyper resets its header-read sleep after it fired and after it completed: the box
/// stays the same, the sleep is pending again and completes at the new deadline, not
/// before; a reset before the first poll, and a pending one pushed back many times.
#[test]
fn hyper_reset_of_fired_and_pending_sleeps_stays_in_place_and_on_time() {
    use hyper::rt::Timer;
    let (engine, clock) = leaked_manual(MS);
    let timer = HyperTimer::new(engine);
    let (wakes, waker) = Wakes::waker();
    let mut cx = Context::from_waker(&waker);
    let mut sleep = timer.sleep(Duration::from_millis(3));
    let addr = |s: &Pin<Box<dyn hyper::rt::Sleep>>| {
        let r: &dyn hyper::rt::Sleep = &**s;
        (r as *const dyn hyper::rt::Sleep).cast::<()>()
    };
    let first = addr(&sleep);
    timer.reset(&mut sleep, timer.now() + 4 * MS); // before any poll
    assert!(sleep.as_mut().poll(&mut cx).is_pending());
    clock.advance(3 * MS);
    engine.turn();
    assert!(
        sleep.as_mut().poll(&mut cx).is_pending(),
        "ready at 3 ms of 4"
    );
    clock.advance(MS);
    engine.turn();
    assert!(sleep.as_mut().poll(&mut cx).is_ready());
    // Completed: reset later; and fired-but-not-polled: reset later.
    for polled in [true, false] {
        let target = timer.now() + 6 * MS;
        timer.reset(&mut sleep, target);
        assert_eq!(addr(&sleep), first, "reset in place");
        let mut done = false;
        for _ in 0..6 {
            assert!(sleep.as_mut().poll(&mut cx).is_pending(), "early");
            // Push back twice within the window: lazily, no engine work.
            clock.advance(MS);
            engine.turn();
        }
        for _ in 0..3 {
            if sleep.as_mut().poll(&mut cx).is_ready() {
                assert!(timer.now() >= target);
                done = true;
                break;
            }
            clock.advance(MS);
            engine.turn();
        }
        assert!(done, "polled {polled}: never completed");
        if !polled {
            // Fired but not yet polled before the next reset.
            timer.reset(&mut sleep, timer.now() + MS);
            assert!(sleep.as_mut().poll(&mut cx).is_pending());
            clock.advance(MS);
            engine.turn();
        }
    }
    let _ = wakes;
    drop(sleep);
    settle(engine, &clock);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Inputs at the edges, each with resets between them in every order: Duration::MAX,
/// instants far before the engine (beyond i64 nanoseconds), far after it (past 292 years,
/// and past the end of `Instant`), a 1 ns tick and a one-day tick, intervals of zero, 1 ns
/// and `Duration::MAX` periods. Nothing panics, nothing completes early, a real deadline
/// after each comes.
#[test]
fn edge_inputs_with_lazy_resets_never_panic_nor_complete_early() {
    for tick in [Duration::from_nanos(1), MS, Duration::from_secs(86_400)] {
        let (engine, clock) = manual_tick(tick);
        let (_, waker) = Wakes::waker();
        let now = engine.now();
        let mut targets = vec![
            now,
            now + Duration::from_nanos(1),
            now + CENTURIES,
            now + Duration::from_secs(200 * 365 * 86_400),
        ];
        for back in [1u64, 1_000, 400 * 365 * 86_400, u64::MAX / 4] {
            if let Some(at) = now.checked_sub(Duration::from_secs(back)) {
                targets.push(at);
            }
        }
        for ahead in [u64::MAX / 4, u64::MAX / 2, u64::MAX] {
            if let Some(at) = now.checked_add(Duration::from_secs(ahead)) {
                targets.push(at);
            }
        }
        let mut sleeps = vec![engine.sleep(Duration::MAX), engine.sleep(Duration::ZERO)];
        for &t in &targets {
            sleeps.push(engine.sleep_until(t));
        }
        for (i, sleep) in sleeps.iter_mut().enumerate() {
            let _ = poll(sleep, &waker);
            for &a in &targets {
                for &b in &targets {
                    sleep.reset(a);
                    let _ = poll(sleep, &waker);
                    sleep.reset(b);
                    let _ = format!("{sleep:?}");
                    let _ = sleep.deadline();
                    if sleep.is_elapsed() {
                        assert!(
                            engine.now() >= sleep.deadline(),
                            "tick {tick:?} sleep {i}: complete before {:?}",
                            sleep.deadline()
                        );
                    }
                }
            }
            // A real deadline after all that comes, and not early.
            let at = engine.now() + 3 * tick;
            sleep.reset(at);
            let mut rounds = 0;
            while poll(sleep, &waker).is_pending() {
                rounds += 1;
                assert!(rounds < 10, "tick {tick:?} sleep {i}: lost");
                clock.advance(tick);
                engine.turn();
            }
            assert!(engine.now() >= at, "tick {tick:?} sleep {i}: early");
        }
        for period in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
            let mut cx = Context::from_waker(&waker);
            let mut interval = engine.interval(period);
            assert!(interval.poll_tick(&mut cx).is_ready());
            for &t in &targets {
                interval.reset_at(t);
                let _ = interval.poll_tick(&mut cx);
                interval.reset_after(Duration::MAX);
                let _ = interval.poll_tick(&mut cx);
                interval.reset_immediately();
                let _ = interval.poll_tick(&mut cx);
            }
        }
        drop(sleeps);
        settle(&engine, &clock);
        assert_eq!(engine.nodes_in_use(), 0, "tick {tick:?}");
    }
}

// ------------------------------------------------------------------ (4) real clock

/// Wakes a parked thread, counting its wakes.
struct Unpark(Thread, AtomicUsize);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0.unpark();
    }
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Threads share a pool of idle-timeout sleeps and, for about two seconds, each picks one
/// at random, polls it with its own waker (so sleeps move between threads and tasks), and
/// pushes it back, earlier or to never and back, while two workers fire the old timers on
/// the real clock. No completion before the deadline, by `Instant::now()`. Then each
/// thread takes its share and waits only on wakes: every deadline comes.
#[test]
fn real_clock_shared_idle_timeouts_never_early_nor_lost() {
    let engine = leaked_real(2, MS);
    const SLEEPS: usize = 24;
    const THREADS: usize = 4;
    let pool: &'static [Mutex<Sleep<'static>>] = Box::leak(
        (0..SLEEPS)
            .map(|i| Mutex::new(engine.sleep(Duration::from_micros(300 * i as u64))))
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    );
    let early = Arc::new(AtomicUsize::new(0));
    let completions = Arc::new(AtomicUsize::new(0));
    within(LIMIT, "shared idle timeouts", {
        let early = Arc::clone(&early);
        let completions = Arc::clone(&completions);
        move || {
            let stop = Instant::now() + Duration::from_secs(2);
            let threads: Vec<_> = (0..THREADS)
                .map(|t| {
                    let early = Arc::clone(&early);
                    let completions = Arc::clone(&completions);
                    std::thread::spawn(move || {
                        let me = Arc::new(Unpark(std::thread::current(), AtomicUsize::new(0)));
                        let waker = Waker::from(Arc::clone(&me));
                        let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1);
                        while Instant::now() < stop {
                            let i = (xorshift(&mut rng) % SLEEPS as u64) as usize;
                            let mut sleep = pool[i].lock().unwrap();
                            if poll(&mut *sleep, &waker).is_ready() {
                                let now = Instant::now();
                                if now < sleep.deadline() {
                                    early.fetch_add(1, Ordering::SeqCst);
                                }
                                completions.fetch_add(1, Ordering::SeqCst);
                            }
                            if sleep.is_elapsed() && Instant::now() < sleep.deadline() {
                                early.fetch_add(1, Ordering::SeqCst);
                            }
                            let r = xorshift(&mut rng);
                            let micros = r % 2500;
                            match r % 8 {
                                0 => sleep.reset(Instant::now() + CENTURIES),
                                1 => {
                                    let d = sleep.deadline();
                                    sleep.reset(d - Duration::from_micros(micros / 4));
                                }
                                _ => sleep.reset(Instant::now() + Duration::from_micros(micros)),
                            }
                            let _ = poll(&mut *sleep, &waker);
                            drop(sleep);
                            std::thread::park_timeout(Duration::from_micros(100 + r % 300));
                        }
                        // Stop pushing back: every sleep of this thread's share must come,
                        // woken (polls only after a wake, or a long timeout that counts).
                        for i in (t..SLEEPS).step_by(THREADS) {
                            let mut sleep = pool[i].lock().unwrap();
                            sleep.reset(Instant::now() + Duration::from_micros(1500));
                            let deadline = sleep.deadline();
                            let mut timeouts = 0;
                            loop {
                                let before = me.1.load(Ordering::SeqCst);
                                if poll(&mut *sleep, &waker).is_ready() {
                                    if Instant::now() < deadline {
                                        early.fetch_add(1, Ordering::SeqCst);
                                    }
                                    break;
                                }
                                let parked = Instant::now();
                                while me.1.load(Ordering::SeqCst) == before
                                    && parked.elapsed() < Duration::from_secs(10)
                                {
                                    std::thread::park_timeout(Duration::from_millis(100));
                                }
                                if me.1.load(Ordering::SeqCst) == before {
                                    timeouts += 1;
                                    assert!(
                                        timeouts < 2,
                                        "thread {t} sleep {i}: no wake 10 s after a 1.5 ms \
                                         deadline (now {:?} past it)",
                                        Instant::now() - deadline
                                    );
                                }
                            }
                        }
                    })
                })
                .collect();
            for thread in threads {
                thread.join().expect("a racing thread panicked");
            }
        }
    });
    assert_eq!(
        early.load(Ordering::SeqCst),
        0,
        "completed before the deadline"
    );
    assert!(completions.load(Ordering::SeqCst) > 0);
    for sleep in pool {
        // Leaked slice: drop each sleep by replacing it with an unpolled one.
        let mut guard = sleep.lock().unwrap();
        *guard = engine.sleep(Duration::MAX);
    }
    let settle_until = Instant::now() + Duration::from_secs(5);
    while engine.nodes_in_use() != 0 && Instant::now() < settle_until {
        std::thread::sleep(MS);
    }
    assert_eq!(engine.nodes_in_use(), 0, "nodes leaked");
}

/// A sleep pushed back lazily on one thread and then sent, mid-wait, to another that polls
/// it with its own waker (block_on): the timer left at the old deadline wakes the first
/// thread's waker or the second's, and the second must still complete, at or after the
/// deadline.
#[test]
fn a_lazily_reset_sleep_sent_to_another_thread_completes_on_time() {
    let engine = leaked_real(2, MS);
    within(LIMIT, "sent sleeps", move || {
        let (_, waker) = Wakes::waker();
        for i in 0..300u64 {
            let mut sleep = engine.sleep(Duration::from_micros(i % 700));
            assert!(poll(&mut sleep, &waker).is_pending() || i % 700 == 0);
            let target = Instant::now() + Duration::from_micros(300 + (i * 37) % 1200);
            sleep.reset(target); // later, usually: lazy
            if i % 3 == 0 {
                std::thread::sleep(Duration::from_micros(i % 900)); // the old timer may fire here
            }
            let end = std::thread::spawn(move || {
                futures::executor::block_on(&mut sleep);
                (Instant::now(), sleep.deadline())
            })
            .join()
            .unwrap();
            assert_eq!(end.1, target);
            assert!(end.0 >= target, "sleep {i}: {:?} early", target - end.0);
        }
    });
}

// ------------------------------------------------------------------ (5) allocations

/// The whole lazy cycle, many times once warm: sleep, poll, reset later (lazy), the old
/// timer's fire, the re-arming poll (with another waker), completion, a reset of the
/// completed sleep, its re-arm, an earlier reset, a reset to never and back, and the drop.
/// Counted on the task's thread with the engine's turns left out, then with them in.
#[test]
fn the_lazy_reset_cycle_allocates_nothing_once_warm() {
    let (engine, clock) = manual_tick(MS);
    let first = Waker::from(Arc::new(Wakes::default()));
    let second = Waker::from(Arc::new(Wakes::default()));
    let cycle = |count_turns: bool| {
        let turn = |by: Duration| {
            if !count_turns {
                watch(false);
            }
            clock.advance(by);
            engine.turn();
            if !count_turns {
                watch(true);
            }
        };
        let mut sleep = engine.sleep(2 * MS);
        assert!(poll(&mut sleep, &first).is_pending());
        sleep.reset(engine.now() + 4 * MS);
        turn(2 * MS);
        assert!(poll(&mut sleep, &second).is_pending());
        turn(2 * MS);
        assert!(poll(&mut sleep, &second).is_ready());
        sleep.reset(engine.now() + 3 * MS);
        assert!(poll(&mut sleep, &first).is_pending());
        sleep.reset(engine.now() + 2 * MS);
        sleep.reset(engine.now() + CENTURIES);
        turn(2 * MS);
        assert!(poll(&mut sleep, &first).is_pending());
        sleep.reset(engine.now() + MS);
        turn(MS);
        assert!(poll(&mut sleep, &first).is_ready());
        drop(sleep);
    };
    for _ in 0..3_000 {
        cycle(true);
    }
    for count_turns in [false, true] {
        let made = allocations_in(|| {
            for _ in 0..5_000 {
                cycle(count_turns);
            }
        });
        assert_eq!(
            made, 0,
            "turns counted: {count_turns}: allocations in 5 000 cycles"
        );
    }
}

// ------------------------------------------------------------------ (6) more, manual

/// The pool fills between the old timer's fire and the poll that must re-arm: the poll
/// cannot arm, so it must stay pending (woken to poll again), never complete early, and
/// complete once nodes come back; nothing leaks.
#[test]
fn a_full_pool_at_the_lazy_rearm_is_neither_early_nor_lost() {
    let (engine, clock) = manual_tick(MS);
    let (wakes, waker) = Wakes::waker();
    let start = engine.now();
    let mut sleep = engine.sleep_until(start + 2 * MS);
    assert!(poll(&mut sleep, &waker).is_pending());
    sleep.reset(start + 6 * MS);
    clock.advance(2 * MS);
    engine.turn();
    assert_eq!(wakes.count(), 1, "the old timer's wake");
    let mut fillers = Vec::new();
    while let Ok(handle) = engine.schedule(Duration::from_secs(3600), || {}) {
        fillers.push(handle);
        assert!(fillers.len() < 1 << 20, "the pool never filled");
    }
    for step in 0..8 {
        let before = wakes.count();
        assert!(
            poll(&mut sleep, &waker).is_pending(),
            "step {step}: no node, must wait"
        );
        assert!(!sleep.is_elapsed() || engine.now() >= start + 6 * MS);
        assert!(
            wakes.count() > before,
            "step {step}: not woken to poll again"
        );
        clock.advance(MS);
        engine.turn();
    }
    for handle in fillers {
        assert!(engine.cancel(handle));
    }
    settle(&engine, &clock);
    let mut rounds = 0;
    while poll(&mut sleep, &waker).is_pending() {
        rounds += 1;
        assert!(rounds < 10, "never completed once the pool had room");
        clock.advance(MS);
        engine.turn();
    }
    assert!(engine.now() >= start + 6 * MS);
    drop(sleep);
    settle(&engine, &clock);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// After a later reset has left the timer at an old deadline that has fired, a reset
/// earlier to a deadline already past completes at the next poll, and `is_elapsed` turns
/// true, with no turn (the clock alone decides, as documented); the same for a completed
/// sleep reset later to a past deadline. (Fixed, as a mismatch with the
/// docs, which said the next turn; the docs now say what happens.)
#[test]
fn a_past_deadline_after_a_fired_timer_completes_at_the_next_poll() {
    let (engine, clock) = manual_tick(MS);
    let (_, waker) = Wakes::waker();
    let start = engine.now();
    // Pending at 2 ms, pushed to 10 ms; the old timer fires at 3 ms, unpolled.
    let mut sleep = engine.sleep_until(start + 2 * MS);
    assert!(poll(&mut sleep, &waker).is_pending());
    sleep.reset(start + 10 * MS);
    clock.advance(3 * MS);
    engine.turn();
    // The clock runs on to 20 ms with no turn; the deadline is brought back to 5 ms (past).
    clock.advance(17 * MS);
    sleep.reset(start + 5 * MS);
    let is_elapsed_before_turn = sleep.is_elapsed();
    let ready_before_turn = poll(&mut sleep, &waker).is_ready();
    // A completed sleep (due 21 ms, done at 22), reset later to 21.5 ms, already past.
    let mut done = engine.sleep_until(start + 21 * MS);
    assert!(poll(&mut done, &waker).is_pending());
    clock.advance(2 * MS);
    engine.turn();
    assert!(poll(&mut done, &waker).is_ready());
    done.reset(start + 21 * MS + Duration::from_micros(500));
    let done_ready_before_turn = poll(&mut done, &waker).is_ready();
    assert_eq!(
        (
            is_elapsed_before_turn,
            ready_before_turn,
            done_ready_before_turn
        ),
        (true, true, true),
        "(is_elapsed, ready, completed-then-reset ready) before any turn"
    );
}

/// Threads keep idle sleeps pushed back lazily (so old timers fire and polls re-arm all
/// the time) while the engine shuts down under them: every task is woken and its sleep
/// completes (as documented for a shutdown), resets after the shutdown neither panic nor
/// hang, and every node comes back.
#[test]
fn lazy_rearms_racing_shutdown_lose_no_wake_and_leak_nothing() {
    for round in 0..4 {
        let engine = leaked_real(2, MS);
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..3)
            .map(|t| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let me = Arc::new(Unpark(std::thread::current(), AtomicUsize::new(0)));
                    let waker = Waker::from(Arc::clone(&me));
                    let mut sleeps: Vec<Sleep<'static>> = (0..8)
                        .map(|i| engine.sleep(Duration::from_micros(200 * i)))
                        .collect();
                    let mut rng = 0x2545_F491_4F6C_DD1Du64 ^ ((t as u64 + 1) << 8) ^ round;
                    while !stop.load(Ordering::SeqCst) {
                        for sleep in &mut sleeps {
                            let _ = poll(sleep, &waker);
                            let r = xorshift(&mut rng);
                            sleep.reset(Instant::now() + Duration::from_micros(300 + r % 1500));
                            let _ = poll(sleep, &waker);
                        }
                        std::thread::park_timeout(Duration::from_micros(200));
                    }
                    // Shut down (or shutting down): each sleep, polled, must complete,
                    // woken rather than by a timeout.
                    let limit = Instant::now() + Duration::from_secs(20);
                    for (i, sleep) in sleeps.iter_mut().enumerate() {
                        loop {
                            let before = me.1.load(Ordering::SeqCst);
                            if poll(sleep, &waker).is_ready() {
                                break;
                            }
                            while me.1.load(Ordering::SeqCst) == before {
                                assert!(
                                    Instant::now() < limit,
                                    "round {round} thread {t} sleep {i}: never woken after \
                                     the shutdown"
                                );
                                std::thread::park_timeout(Duration::from_millis(10));
                            }
                        }
                        sleep.reset(Instant::now() + Duration::from_secs(1));
                        assert!(poll(sleep, &waker).is_ready(), "after shutdown: at once");
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(150 + 40 * round));
        engine.shutdown(if round % 2 == 0 {
            PendingTimers::Drop
        } else {
            PendingTimers::Run
        });
        stop.store(true, Ordering::SeqCst);
        within(LIMIT, "threads after shutdown", move || {
            for thread in threads {
                thread.join().expect("a thread panicked");
            }
        });
        assert_eq!(engine.nodes_in_use(), 0, "round {round}: nodes leaked");
    }
}

/// A manual clock 270 and 300 years on (only a `ManualClock` gets there): a `Sleep` that
/// never comes (Duration::MAX, or a reset to "never") reads about 30 years on as its
/// deadline, but never past the end of the engine's range, 292 years after its start (as
/// documented, since the docs were silent on it): 22 years on at 270 years,
/// and that end, now past, at 300. Only `deadline()` is affected; the sleep stays pending.
#[test]
fn a_never_sleep_reads_thirty_years_on_or_the_end_of_the_range() {
    for years in [270u64, 300] {
        let (engine, clock) = manual_tick(MS);
        let started = engine.now();
        let (_, waker) = Wakes::waker();
        clock.advance(Duration::from_secs(years * 365 * 86_400));
        engine.turn();
        let mut never = engine.sleep(Duration::MAX);
        assert!(poll(&mut never, &waker).is_pending());
        let mut soon = engine.sleep(Duration::from_secs(1));
        assert!(poll(&mut soon, &waker).is_pending());
        soon.reset(engine.now() + CENTURIES);
        let end_of_range = started + Duration::from_nanos(i64::MAX as u64);
        let expected = (engine.now() + Duration::from_secs(29 * 365 * 86_400))
            .min(end_of_range - Duration::from_secs(1));
        for (what, sleep) in [("Duration::MAX", &never), ("a reset to never", &soon)] {
            assert!(
                sleep.deadline() >= expected,
                "{years} years: {what} reads {:?} on, {:?} back",
                sleep.deadline().saturating_duration_since(engine.now()),
                engine.now().saturating_duration_since(sleep.deadline())
            );
        }
        assert!(poll(&mut never, &waker).is_pending());
        assert!(poll(&mut soon, &waker).is_pending());
    }
}

/// Inside the turn, the wake of a timer left at an old deadline polls the sleep (which
/// re-arms), then brings the deadline back to now and polls again: the timer just armed
/// is moved to a tick the running turn may already have passed. It must complete within
/// two turns, never before its deadline, and leave nothing behind.
#[test]
fn an_inline_wake_that_rearms_then_resets_earlier_inside_the_turn() {
    struct Task {
        slot: Mutex<Option<Sleep<'static>>>,
        engine: &'static TimerEngine,
        me: Mutex<Option<Waker>>,
        pulled_in_at: Mutex<Option<Instant>>,
        done_at: Mutex<Option<Instant>>,
        early: AtomicBool,
    }
    impl Wake for Task {
        fn wake(self: Arc<Self>) {
            let waker = self.me.lock().unwrap().clone().unwrap();
            let mut slot = self.slot.lock().unwrap();
            let Some(sleep) = slot.as_mut() else { return };
            let mut ready = poll(sleep, &waker).is_ready();
            if !ready && self.pulled_in_at.lock().unwrap().is_none() {
                let now = self.engine.now();
                sleep.reset(now);
                *self.pulled_in_at.lock().unwrap() = Some(now);
                ready = poll(sleep, &waker).is_ready();
            }
            if ready {
                if self.engine.now() < sleep.deadline() {
                    self.early.store(true, Ordering::SeqCst);
                }
                *self.done_at.lock().unwrap() = Some(self.engine.now());
                *slot = None;
            }
        }
    }
    for sub_us in [0u64, 1, 500, 999] {
        let (engine, clock) = leaked_manual(MS);
        let task = Arc::new(Task {
            slot: Mutex::new(None),
            engine,
            me: Mutex::new(None),
            pulled_in_at: Mutex::new(None),
            done_at: Mutex::new(None),
            early: AtomicBool::new(false),
        });
        let waker = Waker::from(Arc::clone(&task));
        *task.me.lock().unwrap() = Some(waker.clone());
        let mut sleep = engine.sleep(2 * MS);
        assert!(poll(&mut sleep, &waker).is_pending());
        sleep.reset(engine.now() + 50 * MS); // lazy: the timer stays at 2 ms
        *task.slot.lock().unwrap() = Some(sleep);
        clock.advance(2 * MS + Duration::from_micros(sub_us));
        engine.turn(); // the old timer's wake: re-arm for 50 ms, then pull in to now
        let pulled = task
            .pulled_in_at
            .lock()
            .unwrap()
            .expect("the wake ran inline");
        for _ in 0..2 {
            if task.done_at.lock().unwrap().is_some() {
                break;
            }
            clock.advance(MS);
            engine.turn();
        }
        let done = task
            .done_at
            .lock()
            .unwrap()
            .expect("lost: not complete two turns on");
        assert!(!task.early.load(Ordering::SeqCst), "early");
        assert!(done >= pulled);
        task.me.lock().unwrap().take();
        drop(waker);
        settle(engine, &clock);
        assert_eq!(engine.nodes_in_use(), 0, "sub {sub_us} us");
        assert_eq!(Arc::strong_count(&task), 1, "waker clones leaked");
    }
}

/// Reads arrive on the engine's own worker threads (a repeating callback) and push a
/// task's idle timeout back lazily, from another thread than the task's, 150 times, while
/// the task waits only on wakes. It completes only after the last push's deadline, and
/// does complete, woken.
#[test]
fn idle_timeout_pushed_back_from_worker_callbacks_completes_woken_and_not_early() {
    let engine = leaked_real(2, MS);
    within(LIMIT, "worker pushes", move || {
        let idle = 4 * MS;
        let shared: Arc<Mutex<Sleep<'static>>> = Arc::new(Mutex::new(engine.sleep(idle)));
        let last_push = Arc::new(Mutex::new(Instant::now()));
        let pushes = Arc::new(AtomicUsize::new(0));
        let me = Arc::new(Unpark(std::thread::current(), AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&me));
        assert!(poll(&mut *shared.lock().unwrap(), &waker).is_pending());
        let reader = engine
            .schedule_repeating(MS, {
                let shared = Arc::clone(&shared);
                let last_push = Arc::clone(&last_push);
                let pushes = Arc::clone(&pushes);
                move || {
                    if pushes.load(Ordering::SeqCst) >= 150 {
                        return;
                    }
                    let mut sleep = shared.lock().unwrap();
                    if sleep.is_elapsed() {
                        return;
                    }
                    let now = Instant::now();
                    sleep.reset(now + idle);
                    *last_push.lock().unwrap() = now;
                    pushes.fetch_add(1, Ordering::SeqCst);
                }
            })
            .unwrap();
        let mut wakes_seen = 0;
        loop {
            let mut sleep = shared.lock().unwrap();
            if poll(&mut *sleep, &waker).is_ready() {
                let now = Instant::now();
                assert!(
                    now >= sleep.deadline(),
                    "early by {:?}",
                    sleep.deadline() - now
                );
                assert!(
                    now >= *last_push.lock().unwrap() + idle,
                    "before idle that long"
                );
                break;
            }
            drop(sleep);
            let parked = Instant::now();
            while me.1.load(Ordering::SeqCst) == wakes_seen {
                assert!(
                    parked.elapsed() < Duration::from_secs(10),
                    "no wake for 10 s after {} pushes",
                    pushes.load(Ordering::SeqCst)
                );
                std::thread::park_timeout(Duration::from_millis(50));
            }
            wakes_seen = me.1.load(Ordering::SeqCst);
        }
        assert!(engine.cancel(reader));
        let pushes = pushes.load(Ordering::SeqCst);
        let wakes = me.1.load(Ordering::SeqCst);
        // One spurious wake per old deadline at most: with pushes every ~1 ms and a 4 ms
        // idle time, far fewer wakes than pushes (a loaded machine may stall the reads).
        assert!(wakes <= pushes / 2 + 4, "{wakes} wakes for {pushes} pushes");
    });
}
