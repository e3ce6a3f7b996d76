//! `stats().wakes`: what woke the workers. Real-clock tests, asserting only what holds on a
//! loaded machine: a wake-up with a timer due, and a watch for a stuck owner, are counted,
//! and an idle engine's counts stay still.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use corewheel::WorkerWakes;

use crate::support;

use crate::support::{eventually, ms, run_for, settle_wakes, unpinned};

/// A worker woken for its timer counts a wake-up with timers due; once nothing is
/// pending and its last run is long past, it sleeps until woken, and the counts stay
/// still. One worker, so nobody watches for stuck owners.
#[test]
fn a_timer_wakes_its_worker_at_its_tick_and_an_idle_engine_wakes_not_at_all() {
    let engine = unpinned(1);
    // The arm wakes the sleeping worker early; a worker kept off its core past the
    // deadline then claims the timer in that wake-up, counted as woken alone. So rounds,
    // until one shows the tick counted.
    let mut after_fire = engine.stats().total.wakes;
    for _ in 0..5 {
        let fired = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&fired);
        engine
            .schedule(ms(30), move || flag.store(true, Ordering::SeqCst))
            .unwrap();
        assert!(eventually(Duration::from_secs(60), || fired.load(Ordering::SeqCst)));
        after_fire = engine.stats().total.wakes;
        if after_fire.due >= 1 {
            break;
        }
    }
    assert!(
        after_fire.due >= 1,
        "in five rounds, no timer's tick was counted: {after_fire:?}"
    );
    // Past any lingering of the worker's own (a lane's messages, up to 32 ticks).
    settle_wakes(
        &engine,
        ms(300),
        Duration::from_secs(20),
        "after the timers",
    );
    let idle = engine.stats().total.wakes;
    std::thread::sleep(Duration::from_millis(500));
    let later = engine.stats().total.wakes;
    assert_eq!(idle, later, "an idle engine's worker woke up");
    assert_eq!(
        later.total(),
        later.due + later.wheel + later.lane + later.watch + later.woken
    );
}

/// An owner blocked in a callback for a while is watched: the other worker wakes to look
/// at it (counted as a watch), and stands in for its timers.
#[test]
fn a_worker_watching_a_stuck_owner_counts_its_watch() {
    let engine = unpinned(2);
    let released = Arc::new(AtomicBool::new(false));
    let release = Arc::clone(&released);
    let started = Instant::now();
    engine
        .schedule(ms(1), move || {
            // Blocks far longer than `rescue_after` (8 ticks), however slow the machine.
            while !release.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(ms(1));
            }
        })
        .unwrap();
    let watched = eventually(Duration::from_secs(30), || {
        engine.stats().total.wakes.watch >= 3
    });
    released.store(true, Ordering::SeqCst);
    let wakes = engine.stats().total.wakes;
    assert!(
        watched,
        "no worker woke to watch the stuck owner: {wakes:?}"
    );
}

/// A hand-driven engine has no workers, and counts no wake-up however far it is driven.
#[test]
fn a_hand_driven_engine_counts_no_wake_up() {
    let (engine, clock) = support::manual(2);
    engine.schedule(ms(5), || {}).unwrap();
    run_for(&engine, &clock, 50);
    assert_eq!(engine.stats().total.fired, 1);
    assert_eq!(engine.stats().total.wakes, WorkerWakes::default());
}
