//! Timing logic on a manual wall clock: due times, the window loader, retries and
//! backoff, catch-up after downtime, and clock steps.

mod common;

use std::time::Duration;

use common::{collect, eventually, manual, next, one_attempt, quiet, t0};
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
    let options = options.retry(one_attempt());
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

/// Bytes of the dead-letter log's segments.
fn dead_log_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir.join("dead"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

/// The dead letters as (id, payload, attempt), sorted.
fn letters(timers: &DurableTimers) -> Vec<(Vec<u8>, Vec<u8>, u32)> {
    let mut all: Vec<_> = timers
        .dead_letters()
        .iter()
        .map(|d| (d.id().to_vec(), d.payload().to_vec(), d.attempt()))
        .collect();
    all.sort();
    all
}

#[test]
fn requeue_after_requeue_does_not_grow_the_dead_letter_log_for_ever() {
    let dir = tempfile::tempdir().unwrap();
    let (_clock, options) = manual();
    let options = options.retry(one_attempt());
    let timers = DurableTimers::open(dir.path(), options.clone()).unwrap();
    let rx = collect(&timers, |_, _| true);
    for i in 0..3 {
        timers
            .schedule(format!("keep-{i}"), format!("p{i}"), t0())
            .unwrap();
    }
    timers.schedule("churn", b"c", t0()).unwrap();
    let dead = |id: &[u8]| timers.dead_letters().iter().any(|d| d.id() == id);
    // Dies, is requeued and dies again: two records a cycle, one letter in the end.
    for _ in 0..530 {
        while !dead(b"churn") {
            std::thread::sleep(Duration::from_micros(200));
        }
        timers.requeue("churn").unwrap();
    }
    eventually(|| timers.dead_letters().len() == 4);
    while rx.try_recv().is_ok() {}
    let before = letters(&timers);
    timers.close().unwrap();
    let grown = dead_log_bytes(dir.path());

    let timers = DurableTimers::open(dir.path(), options.clone()).unwrap();
    assert_eq!(
        letters(&timers),
        before,
        "the rewrite kept exactly the live letters"
    );
    let rewritten = dead_log_bytes(dir.path());
    assert!(
        rewritten * 20 < grown,
        "the log was not rewritten: {grown} bytes, then {rewritten}"
    );
    // Requeue state and new letters still work after the rewrite, and across a reopen.
    timers.requeue("keep-0").unwrap();
    let rx = collect(&timers, |_, _| false);
    assert_eq!(next(&rx).id, "keep-0");
    quiet(&rx, 50);
    timers.close().unwrap();
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let ids: Vec<Vec<u8>> = letters(&timers).into_iter().map(|l| l.0).collect();
    assert_eq!(
        ids,
        [b"churn".to_vec(), b"keep-1".to_vec(), b"keep-2".to_vec()]
    );
    let rx = collect(&timers, |_, _| false);
    quiet(&rx, 50);
}

#[test]
fn a_dead_letter_log_rewrite_cut_by_a_crash_leaves_the_old_log_or_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let (_clock, options) = manual();
    let options = options.retry(one_attempt());
    let timers = DurableTimers::open(dir.path(), options.clone()).unwrap();
    let rx = collect(&timers, |_, _| true);
    timers.schedule("a", b"1", t0()).unwrap();
    timers.schedule("b", b"2", t0()).unwrap();
    assert_eq!([next(&rx).attempt, next(&rx).attempt], [1, 1]);
    eventually(|| timers.dead_letters().len() == 2);
    let before = letters(&timers);
    timers.close().unwrap();
    let (dead, next_log) = (dir.path().join("dead"), dir.path().join("dead.next"));
    // Cut after the old log was moved out: the new one, complete, is moved in.
    std::fs::rename(&dead, &next_log).unwrap();
    let timers = DurableTimers::open(dir.path(), options.clone()).unwrap();
    assert_eq!(letters(&timers), before);
    timers.close().unwrap();
    assert!(!next_log.exists());
    // Cut while the new one was written beside the old: it is dropped, unread.
    std::fs::create_dir(&next_log).unwrap();
    for entry in std::fs::read_dir(&dead).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, next_log.join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(next_log.join("0000000001-000001.seg"), b"half a segm").unwrap();
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    assert_eq!(letters(&timers), before, "letters read twice or lost");
    timers.close().unwrap();
    assert!(!next_log.exists());
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

/// A directory holding the task "x" (payload "old"), due at t0 + 1 s, and `filler` tasks a
/// hundred hours out: at the next open the writer reads every one of them (to fill its
/// upsert filter) before it takes any op, while the loader and dispatcher already deliver
/// "x". Ops sent meanwhile wait, and the writer then takes them all in one batch.
fn dir_with_x_and_a_busy_writer_at_open(filler: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let (_clock, options) = manual();
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    timers.schedule("x", b"old", t0() + SEC).unwrap();
    let far = t0() + Duration::from_secs(100 * 3600);
    for chunk in 0..filler / 10_000 {
        timers
            .schedule_batch((0..10_000).map(|i| (format!("filler-{chunk}-{i}"), [0u8; 64], far)))
            .unwrap();
    }
    timers.close().unwrap();
    dir
}

/// Reopens `dir` at t0 + 2 s with a handler that fails "x" on attempt 1 only when told
/// to, after `during` (run while the handler holds "x") has sent its op. Returns the
/// timers, the clock and the deliveries. Panics if the op was answered before the
/// handler's failure was sent (then the two were not in one batch and the run proves
/// nothing).
fn fail_x_while(
    dir: &std::path::Path,
    during: impl FnOnce(std::sync::Arc<DurableTimers>) + Send + 'static,
) -> (
    std::sync::Arc<DurableTimers>,
    std::sync::Arc<corewheel_durable::ManualWallClock>,
    std::sync::mpsc::Receiver<common::Seen>,
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex, mpsc};
    let (clock, options) = manual();
    clock.set(t0() + 2 * SEC);
    let options = options.retry(RetryPolicy {
        max_attempts: 5,
        initial_backoff: SEC,
        multiplier: 1,
        max_backoff: SEC,
    });
    let timers = Arc::new(DurableTimers::open(dir, options).unwrap());
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let (held_tx, held_rx) = mpsc::channel::<()>();
    let held_tx = Mutex::new(held_tx);
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    timers
        .run_handler(1, move |task| {
            let seen = common::Seen {
                id: String::from_utf8_lossy(task.id()).into_owned(),
                attempt: task.attempt(),
                payload: task.payload().to_vec(),
                due: task.due(),
            };
            let first = seen.id == "x" && seen.attempt == 1;
            let _ = tx.lock().unwrap().send(seen);
            if first {
                let _ = held_tx.lock().unwrap().send(());
                let _ = go_rx.lock().unwrap().recv();
                return Err("x fails its first attempt");
            }
            Ok(())
        })
        .unwrap();
    held_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("x delivered while the writer reads the filler");
    let answered = Arc::new(AtomicBool::new(false));
    let op = std::thread::spawn({
        let timers = Arc::clone(&timers);
        let answered = Arc::clone(&answered);
        move || {
            during(timers);
            answered.store(true, Ordering::SeqCst);
        }
    });
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !answered.load(Ordering::SeqCst),
        "precondition: the writer was still busy when the op was sent (raise the filler)"
    );
    go_tx.send(()).unwrap();
    op.join().unwrap();
    (timers, clock, rx)
}

/// A cancel committed in the same group commit as the failure of the task's running
/// handler (the cancel first) stops the retry, in this process and after a reopen: a task
/// whose handler is already running is not stopped, but if that handler fails, the task
/// is not retried.
#[test]
fn cancel_in_the_same_group_commit_as_a_failing_handler_stops_the_retry() {
    let dir = dir_with_x_and_a_busy_writer_at_open(300_000);
    let (timers, clock, rx) = fail_x_while(dir.path(), |t| t.cancel("x").unwrap());
    let first = next(&rx);
    assert_eq!((first.id.as_str(), first.attempt), ("x", 1));
    // Past the 1 s backoff: a retry would come now.
    clock.advance(10 * SEC);
    quiet(&rx, 500);
    drop(timers);
    let (clock, options) = manual();
    clock.set(t0() + 20 * SEC);
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, |_, _| false);
    quiet(&rx, 500);
}

/// The same race with an upsert instead of a cancel: the new version ("new", due at
/// t0 + 30 s) was acknowledged, and it is what is delivered, not a retry of the old.
#[test]
fn upsert_in_the_same_group_commit_as_a_failing_handler_is_not_lost() {
    let dir = dir_with_x_and_a_busy_writer_at_open(300_000);
    let (timers, clock, rx) = fail_x_while(dir.path(), |t| {
        t.schedule("x", b"new", t0() + 30 * SEC).unwrap()
    });
    let first = next(&rx);
    assert_eq!((first.id.as_str(), first.attempt), ("x", 1));
    clock.set(t0() + 29 * SEC);
    quiet(&rx, 500);
    clock.set(t0() + 30 * SEC);
    let seen = next(&rx);
    assert_eq!(
        (seen.id.as_str(), seen.payload.as_slice()),
        ("x", b"new".as_slice()),
        "the acknowledged upsert is what is delivered"
    );
    quiet(&rx, 300);
    drop(timers);
}

/// Two concurrent requeues of one dead letter that land in one group commit: one returns
/// `Ok`, the other `NotDead`; one dead letter is requeued once.
#[test]
fn two_requeues_of_one_dead_letter_in_one_group_commit_do_not_both_succeed() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let one_try = one_attempt();
    {
        let (clock, options) = manual();
        let timers = DurableTimers::open(dir.path(), options.retry(one_try.clone())).unwrap();
        let rx = collect(&timers, |id, _| id == "x");
        timers.schedule("x", b"p", t0() + SEC).unwrap();
        clock.advance(SEC);
        assert_eq!(next(&rx).id, "x");
        eventually(|| timers.dead_letters().len() == 1);
        let far = t0() + Duration::from_secs(100 * 3600);
        for chunk in 0..30 {
            timers
                .schedule_batch(
                    (0..10_000).map(|i| (format!("filler-{chunk}-{i}"), [0u8; 64], far)),
                )
                .unwrap();
        }
        timers.close().unwrap();
    }
    // At this open the writer reads the 300k filler ids before it takes any op, so the two
    // requeues below wait together and are committed in one batch.
    let (clock, options) = manual();
    clock.set(t0() + 10 * SEC);
    let timers = Arc::new(DurableTimers::open(dir.path(), options.retry(one_try)).unwrap());
    assert_eq!(timers.dead_letters().len(), 1);
    let a = std::thread::spawn({
        let t = Arc::clone(&timers);
        move || t.requeue("x").is_ok()
    });
    let b = std::thread::spawn({
        let t = Arc::clone(&timers);
        move || t.requeue("x").is_ok()
    });
    let oks = usize::from(a.join().unwrap()) + usize::from(b.join().unwrap());
    assert!(timers.dead_letters().is_empty());
    assert_eq!(oks, 1, "one dead letter was requeued twice");
}

/// The same race, then a restart before anything else happens: what is on disk delivers
/// the acknowledged upsert, once, and not the old version.
#[test]
fn upsert_in_the_same_group_commit_as_a_failing_handler_survives_a_restart() {
    let dir = dir_with_x_and_a_busy_writer_at_open(300_000);
    let (timers, _clock, rx) = fail_x_while(dir.path(), |t| {
        t.schedule("x", b"new", t0() + 30 * SEC).unwrap()
    });
    assert_eq!(next(&rx).attempt, 1);
    std::thread::sleep(Duration::from_millis(200));
    drop(timers);
    let (clock, options) = manual();
    clock.set(t0() + 30 * SEC);
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, |_, _| false);
    let mut got = Vec::new();
    while let Ok(s) = rx.recv_timeout(Duration::from_millis(1500)) {
        got.push((
            s.id,
            String::from_utf8_lossy(&s.payload).into_owned(),
            s.attempt,
        ));
    }
    assert_eq!(got, vec![("x".to_string(), "new".to_string(), 1)]);
}
