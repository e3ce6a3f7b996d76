//! Timing logic on a manual wall clock: due times, the window loader, retries and
//! backoff, catch-up after downtime, and clock steps.

mod common;

use std::time::Duration;

use common::{collect, eventually, manual, next, quiet, t0};
use corewheel_durable::{DurableTimers, RetryPolicy};

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

#[test]
fn fires_at_its_due_millisecond_and_not_before() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = manual();
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, |_, _| false);
    timers.schedule("a", b"x", t0() + 10 * SEC).unwrap();
    quiet(&rx, 50);
    clock.advance(10 * SEC - MS);
    quiet(&rx, 50);
    clock.advance(MS);
    let seen = next(&rx);
    assert_eq!(
        (seen.id.as_str(), seen.attempt, seen.payload.as_slice()),
        ("a", 1, b"x".as_slice())
    );
    assert_eq!(seen.due, t0() + 10 * SEC);
    quiet(&rx, 50);
}

#[test]
fn far_tasks_stay_on_disk_until_their_bucket_is_near() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = manual();
    let options = options
        .bucket_width(Duration::from_secs(3600))
        .load_ahead(Duration::from_secs(300));
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, |_, _| false);
    let due = t0() + Duration::from_secs(3 * 3600 + 1800);
    timers.schedule("far", b"", due).unwrap();
    timers.schedule("near", b"", t0() + SEC).unwrap();
    eventually(|| timers.in_memory() == 1);
    clock.advance(Duration::from_secs(2 * 3600 + 50 * 60));
    assert_eq!(next(&rx).id, "near");
    quiet(&rx, 100);
    assert_eq!(
        timers.in_memory(),
        0,
        "the far bucket is not loaded 10 minutes ahead"
    );
    clock.advance(Duration::from_secs(6 * 60));
    eventually(|| timers.in_memory() == 1);
    clock.set(due - MS);
    quiet(&rx, 50);
    clock.set(due);
    assert_eq!(next(&rx).id, "far");
}

#[test]
fn failures_back_off_then_dead_letter_then_requeue() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = manual();
    let options = options.retry(RetryPolicy {
        max_attempts: 3,
        initial_backoff: SEC,
        multiplier: 2,
        max_backoff: Duration::from_secs(60),
    });
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, |_, _| true);
    timers.schedule("job", b"p", t0() + SEC).unwrap();
    clock.advance(SEC);
    assert_eq!(next(&rx).attempt, 1);
    // The retry is due one backoff after the failure was recorded, by the manual clock.
    quiet(&rx, 100);
    clock.advance(SEC - MS);
    quiet(&rx, 50);
    clock.advance(MS);
    assert_eq!(next(&rx).attempt, 2);
    quiet(&rx, 100);
    clock.advance(2 * SEC - MS);
    quiet(&rx, 50);
    clock.advance(MS);
    assert_eq!(next(&rx).attempt, 3);
    eventually(|| timers.dead_letters().len() == 1);
    let dead = &timers.dead_letters()[0];
    assert_eq!(
        (dead.id(), dead.attempt(), dead.payload()),
        (b"job".as_slice(), 3, b"p".as_slice())
    );
    clock.advance(Duration::from_secs(3600));
    quiet(&rx, 50);
    timers.requeue("job").unwrap();
    assert_eq!(next(&rx).attempt, 1);
    assert!(matches!(
        timers.requeue("nope"),
        Err(corewheel_durable::Error::NotDead)
    ));
}

#[test]
fn dead_letters_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = manual();
    let options = options.retry(RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    });
    let timers = DurableTimers::open(dir.path(), options.clone()).unwrap();
    let rx = collect(&timers, |_, _| true);
    timers.schedule("bad", b"", t0()).unwrap();
    assert_eq!(next(&rx).id, "bad");
    eventually(|| timers.dead_letters().len() == 1);
    timers.close().unwrap();
    clock.advance(Duration::from_secs(7200));
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, |_, _| false);
    assert_eq!(timers.dead_letters().len(), 1);
    quiet(&rx, 100);
    timers.requeue("bad").unwrap();
    assert_eq!(next(&rx).id, "bad");
    assert!(timers.dead_letters().is_empty());
}

#[test]
fn upsert_replaces_in_memory_on_disk_and_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = manual();
    let timers = DurableTimers::open(dir.path(), options.clone()).unwrap();
    let rx = collect(&timers, |_, _| false);
    timers.schedule("x", b"old", t0() + 10 * SEC).unwrap();
    timers.schedule("x", b"new", t0() + 20 * SEC).unwrap();
    // A far task moved near, and a near one moved far.
    timers
        .schedule("y", b"old", t0() + Duration::from_secs(5 * 3600))
        .unwrap();
    timers.schedule("z", b"old", t0() + 5 * SEC).unwrap();
    timers.close().unwrap();
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx2 = collect(&timers, |_, _| false);
    drop(rx);
    timers.schedule("y", b"new", t0() + 30 * SEC).unwrap();
    timers
        .schedule("z", b"new", t0() + Duration::from_secs(6 * 3600))
        .unwrap();
    clock.advance(15 * SEC);
    quiet(&rx2, 100);
    clock.advance(5 * SEC);
    let seen = next(&rx2);
    assert_eq!(
        (seen.id.as_str(), seen.payload.as_slice()),
        ("x", b"new".as_slice())
    );
    clock.advance(10 * SEC);
    let seen = next(&rx2);
    assert_eq!(
        (seen.id.as_str(), seen.payload.as_slice()),
        ("y", b"new".as_slice())
    );
    clock.advance(Duration::from_secs(5 * 3600));
    quiet(&rx2, 200);
    clock.advance(Duration::from_secs(3600));
    let seen = next(&rx2);
    assert_eq!(
        (seen.id.as_str(), seen.payload.as_slice()),
        ("z", b"new".as_slice())
    );
    quiet(&rx2, 200);
}

#[test]
fn cancel_is_durable_near_and_far() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = manual();
    let timers = DurableTimers::open(dir.path(), options.clone()).unwrap();
    timers.schedule("near", b"", t0() + SEC).unwrap();
    timers
        .schedule("far", b"", t0() + Duration::from_secs(3 * 3600))
        .unwrap();
    timers
        .schedule("kept", b"", t0() + Duration::from_secs(4 * 3600))
        .unwrap();
    timers.cancel("near").unwrap();
    timers.cancel("far").unwrap();
    timers.cancel("never-scheduled").unwrap();
    drop(timers);
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, |_, _| false);
    clock.advance(Duration::from_secs(5 * 3600));
    assert_eq!(next(&rx).id, "kept");
    quiet(&rx, 200);
}

#[test]
fn downtime_is_caught_up_oldest_first_at_the_capped_rate() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = manual();
    let timers = DurableTimers::open(dir.path(), options.clone()).unwrap();
    // Scheduled newest first, and across two buckets, so order comes from due times.
    for i in (0..6u64).rev() {
        let due = t0() + Duration::from_secs(1 + i * 1000);
        timers.schedule(format!("t{i}"), b"", due).unwrap();
    }
    timers.close().unwrap();
    clock.advance(Duration::from_secs(3 * 3600));
    let timers = DurableTimers::open(dir.path(), options.catch_up_rate(2)).unwrap();
    let rx = collect(&timers, |_, _| false);
    let mut order = vec![next(&rx).id];
    quiet(&rx, 200);
    for _ in 0..5 {
        clock.advance(Duration::from_millis(500));
        order.push(next(&rx).id);
    }
    assert_eq!(order, ["t0", "t1", "t2", "t3", "t4", "t5"]);
}

#[test]
fn a_clock_step_backwards_never_fires_early_and_forwards_fires_the_skipped_span() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = manual();
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, |_, _| false);
    timers.schedule("a", b"", t0() + 10 * SEC).unwrap();
    timers.schedule("b", b"", t0() + 30 * SEC).unwrap();
    clock.advance(5 * SEC);
    quiet(&rx, 50);
    clock.set(t0() - Duration::from_secs(60));
    quiet(&rx, 50);
    clock.advance(Duration::from_secs(70) - MS);
    quiet(&rx, 50);
    clock.advance(MS);
    assert_eq!(next(&rx).id, "a");
    clock.set(t0() + Duration::from_secs(2 * 86400));
    assert_eq!(next(&rx).id, "b");
    timers
        .schedule("c", b"", t0() + Duration::from_secs(2 * 86400) + SEC)
        .unwrap();
    quiet(&rx, 50);
    clock.advance(SEC);
    assert_eq!(next(&rx).id, "c");
}

#[test]
fn a_cancel_after_the_hand_over_to_the_handlers_still_stops_the_task() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = manual();
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, |_, _| false);
    timers.schedule("a", b"", t0() + 10 * SEC).unwrap();
    timers.schedule("b", b"", t0() + 10 * SEC).unwrap();
    // A millisecond before they are due, both have left the wheel for the handler
    // threads, which wait for the due time.
    clock.set(t0() + 10 * SEC - MS);
    eventually(|| timers.in_memory() == 0);
    quiet(&rx, 50);
    timers.cancel("a").unwrap();
    timers.schedule("b", b"new", t0() + 20 * SEC).unwrap();
    clock.advance(MS);
    quiet(&rx, 200);
    clock.advance(10 * SEC);
    let seen = next(&rx);
    assert_eq!(
        (seen.id.as_str(), seen.payload.as_slice()),
        ("b", b"new".as_slice())
    );
    quiet(&rx, 200);
}
