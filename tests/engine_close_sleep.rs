//! A worker whose planned wake-up keeps being undercut by new timers sleeps close instead
//! of being woken for each. A thread arming request timeouts, each cancelled at once (a
//! proxy's request answered in time), must wake its shard's worker whenever a timer is due
//! before the tick the worker planned to wake at; with varied delays (the harness's
//! `async-sleep`: 1 ms to 30 s) that was about 11,500 wake-ups a second at 1 thread. Here
//! the delays are 4 ms to 3 s: the worker, woken for each timer due before its plan while
//! it plans ahead as far as it can, now plans no more than three ticks ahead once such
//! wake-ups come fast, and no timer here is due that soon.
//!
//! Counted in the worker's voluntary context switches, so the bounds hold on a loaded
//! machine: a slower machine gives fewer timers and more ticks, and the bound grows with
//! the ticks that passed.

mod common;

use std::time::{Duration, Instant};

use common::{Rng, can_count_worker_switches, serial, unpinned, worker_switches_total};
use corewheel::{PendingTimers, TimerEngine};

/// Arms timers due 4 ms to 3 s out (uniform) on `engine` from this thread for `run`,
/// cancelling each at once, and returns how many, the workers' wake-ups meanwhile, and the
/// milliseconds that passed.
fn undercut_for(engine: &TimerEngine, run: Duration) -> (u64, u64, u64) {
    let before = worker_switches_total();
    let start = Instant::now();
    let mut timers = 0_u64;
    let mut rng = Rng(15);
    while start.elapsed() < run {
        for _ in 0..64 {
            let delay = Duration::from_micros(4_000 + rng.below(2_996_000));
            let handle = engine.schedule(delay, || {}).expect("the engine runs");
            assert!(engine.cancel(handle), "cancelled before its deadline");
            timers += 1;
        }
    }
    let elapsed = start.elapsed().as_millis() as u64;
    let after = worker_switches_total();
    (timers, after - before, elapsed)
}

#[test]
fn a_stream_of_timers_due_before_the_plan_does_not_wake_the_worker_for_each() {
    let _serial = serial();
    let engine = unpinned(1);
    // The worker has started and settled before the count begins.
    std::thread::sleep(Duration::from_millis(20));
    if !can_count_worker_switches(&engine) {
        eprintln!("skipped: /proc/self/task cannot be read here");
        return;
    }
    let (timers, wakes, elapsed) = undercut_for(&engine, Duration::from_millis(500));
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
    // Sleeping close, the worker wakes on its own every two to three ticks, and is woken
    // early only to begin sleeping close again (after each spell of `CLOSE_FOR` ticks) or
    // for a lane's ring filling up: 239-368 wake-ups here, 419 beside a busy loop. Woken
    // for every timer due before its plan (about one in 1,200 here), it wakes more than
    // once a tick: 837 in 500 ms when that was fixed. So the bound is a wake-up a tick.
    let bound = elapsed + 40;
    eprintln!("{wakes} wake-ups of the worker in {elapsed} ms for {timers} timers");
    assert!(
        wakes <= bound,
        "{wakes} wake-ups of the worker in {elapsed} ms for {timers} timers (bound {bound})"
    );
}
