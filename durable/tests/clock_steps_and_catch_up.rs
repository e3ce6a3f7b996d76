//! Timing logic on the manual wall clock (clock steps, catch-up rate,
//! extreme due times, bucket edges, the loader racing upserts and cancels).

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use corewheel_durable::{DurableTimers, ManualWallClock, Options, RetryPolicy, WallClock};

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

fn t0() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000 / 3600 * 3600)
}

#[derive(Debug, Clone)]
struct Got {
    id: Vec<u8>,
    payload: Vec<u8>,
    attempt: u32,
    due: SystemTime,
    at: SystemTime,
}

fn manual() -> (Arc<ManualWallClock>, Options) {
    let clock = Arc::new(ManualWallClock::new(t0()));
    (clock.clone(), Options::default().clock(clock))
}

/// Handler on `threads` threads that reports every delivery; fails when `fail` says so.
fn collect(
    timers: &DurableTimers,
    clock: Arc<dyn WallClock>,
    threads: usize,
    fail: impl Fn(&[u8], u32) -> bool + Send + Sync + 'static,
) -> Receiver<Got> {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    timers
        .run_handler(threads, move |task| {
            let at = clock.now();
            let got = Got {
                id: task.id().to_vec(),
                payload: task.payload().to_vec(),
                attempt: task.attempt(),
                due: task.due(),
                at,
            };
            let failed = fail(task.id(), task.attempt());
            let _ = tx.lock().unwrap().send(got);
            if failed { Err("fail") } else { Ok(()) }
        })
        .unwrap();
    rx
}

fn within(rx: &Receiver<Got>, ms: u64) -> Option<Got> {
    rx.recv_timeout(Duration::from_millis(ms)).ok()
}

fn quiet(rx: &Receiver<Got>, ms: u64) {
    if let Some(g) = within(rx, ms) {
        panic!("unexpected delivery {g:?}");
    }
}

fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("not within 5 s: {what}");
}

/// A task handed to the handler threads (up to the 2 ms lead early) sits in the ready
/// queue; if the clock then steps back, a task already overdue by the stepped-back clock
/// must not wait for it. (It did while the queue was in arrival order.)
#[test]
fn hostile_backward_step_front_task_blocks_overdue_tasks_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = manual();
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, clock.clone(), 2, |_, _| false);
    timers.schedule("front", b"", t0() + MS).unwrap();
    // The dispatcher hands it over 2 ms ahead: it leaves the wheel.
    eventually("front handed over", || timers.in_memory() == 0);
    std::thread::sleep(Duration::from_millis(50));
    quiet(&rx, 20);
    clock.set(t0() - Duration::from_secs(3600));
    // Due two hours before the clock's new reading: overdue, due at once.
    timers
        .schedule("overdue", b"", t0() - Duration::from_secs(7200))
        .unwrap();
    let got = within(&rx, 3000);
    assert_eq!(
        got.as_ref().map(|g| g.id.as_slice()),
        Some(b"overdue".as_slice()),
        "a task overdue by the clock as it reads now must be delivered at once"
    );
}

/// After a backward step the catch-up token bucket must keep refilling as the clock moves
/// on. (It stalled for the step's length while it remembered the latest reading.)
#[test]
fn hostile_catch_up_stalls_after_backward_step() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = manual();
    let timers = DurableTimers::open(dir.path(), options.catch_up_rate(10)).unwrap();
    let rx = collect(&timers, clock.clone(), 2, |_, _| false);
    let batch: Vec<_> = (0..30)
        .map(|i| {
            (
                format!("old-{i:02}"),
                Vec::new(),
                t0() - Duration::from_secs(3600) + i * MS,
            )
        })
        .collect();
    timers.schedule_batch(batch).unwrap();
    let mut seen = 0;
    while within(&rx, 300).is_some() {
        seen += 1;
    }
    assert!(
        (1..30).contains(&seen),
        "{seen} delivered before the clock moved"
    );
    // Control: a second by the clock, with no step, refills ~10 tokens.
    for _ in 0..10 {
        clock.advance(Duration::from_millis(100));
        std::thread::sleep(Duration::from_millis(5));
    }
    while within(&rx, 300).is_some() {
        seen += 1;
    }
    assert!(
        (8..30).contains(&seen),
        "{seen} delivered after 1 s with no step"
    );
    // Step the clock back 30 minutes (the tasks are still an half hour overdue), then let
    // 10 seconds pass by it: 100 tokens' worth, more than the 29 still waiting.
    clock.set(t0() - Duration::from_secs(1800));
    for _ in 0..100 {
        clock.advance(Duration::from_millis(100));
        std::thread::sleep(Duration::from_millis(5));
    }
    while within(&rx, 500).is_some() {
        seen += 1;
    }
    assert_eq!(seen, 30, "overdue tasks delivered after 10 s at 10/s");
}

/// The catch-up rate is documented for overdue tasks (more than a second late); a task
/// due now must not wait behind the overdue backlog. (It did while the hand-over stopped
/// at the first overdue task without a token.)
#[test]
fn hostile_on_time_task_waits_behind_catch_up_backlog() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = manual();
    let timers = DurableTimers::open(dir.path(), options.catch_up_rate(1)).unwrap();
    let rx = collect(&timers, clock.clone(), 2, |_, _| false);
    let batch: Vec<_> = (0..20)
        .map(|i| {
            (
                format!("old-{i:02}"),
                Vec::new(),
                t0() - Duration::from_secs(600) + i * MS,
            )
        })
        .collect();
    timers.schedule_batch(batch).unwrap();
    timers.schedule("fresh", b"", t0() + 100 * MS).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // 100 ms pass: "fresh" is due, on time, not overdue.
    for _ in 0..10 {
        clock.advance(10 * MS);
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut got = Vec::new();
    while let Some(g) = within(&rx, 500) {
        got.push(String::from_utf8(g.id).unwrap());
    }
    assert!(
        got.iter().any(|id| id == "fresh"),
        "the on-time task was held behind the overdue backlog; delivered: {got:?}"
    );
}

/// Forward step then back: nothing early by the clock as it reads at delivery.
#[test]
fn hostile_steps_back_and_forth_never_early() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = manual();
    let timers =
        DurableTimers::open(dir.path(), options.bucket_width(Duration::from_secs(60))).unwrap();
    let rx = collect(&timers, clock.clone(), 3, |_, _| false);
    let batch: Vec<_> = (0..200u64)
        .map(|i| {
            (
                format!("t{i}"),
                Vec::new(),
                t0() + Duration::from_millis(i * 997),
            )
        })
        .collect();
    timers.schedule_batch(batch).unwrap();
    let mut seen: HashMap<Vec<u8>, u32> = HashMap::new();
    let check = |rx: &Receiver<Got>, seen: &mut HashMap<Vec<u8>, u32>| {
        while let Some(g) = within(rx, 100) {
            assert!(g.at >= g.due, "early: {g:?}");
            *seen.entry(g.id).or_default() += 1;
        }
    };
    clock.advance(Duration::from_secs(50));
    check(&rx, &mut seen);
    clock.set(t0() + Duration::from_secs(20));
    check(&rx, &mut seen);
    clock.advance(Duration::from_secs(100));
    check(&rx, &mut seen);
    clock.set(t0());
    check(&rx, &mut seen);
    clock.set(t0() + Duration::from_secs(400));
    check(&rx, &mut seen);
    assert_eq!(seen.len(), 200);
    assert!(seen.values().all(|&n| n == 1), "delivered more than once");
}

/// A retry with an enormous backoff (Duration::MAX): no panic, no redelivery, timers still
/// work and close.
#[test]
fn hostile_retry_with_maximal_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = manual();
    let options = options.retry(RetryPolicy {
        max_attempts: 3,
        initial_backoff: Duration::MAX,
        multiplier: u32::MAX,
        max_backoff: Duration::MAX,
    });
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, clock.clone(), 1, |id, _| id == b"bad");
    timers.schedule("bad", b"", t0()).unwrap();
    assert_eq!(within(&rx, 3000).unwrap().attempt, 1);
    clock.advance(Duration::from_secs(10 * 365 * 86400));
    quiet(&rx, 200);
    timers.schedule("good", b"", clock.now()).unwrap();
    assert_eq!(within(&rx, 3000).unwrap().id, b"good");
    timers.close().unwrap();
}

/// Due at the largest SystemTime, with everything loaded (load_ahead MAX): no panic, never
/// delivered, timers keep working; the same after a reopen.
#[test]
fn hostile_extreme_due_times_with_everything_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let mut max = UNIX_EPOCH;
    let mut step = Duration::from_secs(1 << 62);
    while step >= Duration::from_nanos(1) {
        if let Some(t) = max.checked_add(step) {
            max = t;
        } else {
            step /= 2;
        }
    }
    let y9999 = UNIX_EPOCH + Duration::from_secs(253_402_300_799);
    for round in 0..2 {
        let (clock, options) = manual();
        let options = options.load_ahead(Duration::MAX);
        let timers = DurableTimers::open(dir.path(), options).unwrap();
        let rx = collect(&timers, clock.clone(), 2, |_, _| false);
        if round == 0 {
            timers.schedule("max", b"", max).unwrap();
            timers.schedule("y9999", b"", y9999).unwrap();
            timers.schedule("epoch", b"", UNIX_EPOCH).unwrap();
            timers
                .schedule(
                    "pre1970",
                    b"",
                    UNIX_EPOCH - Duration::from_secs(86400 * 365),
                )
                .unwrap();
            let mut got: Vec<_> = (0..2).map(|_| within(&rx, 3000).unwrap().id).collect();
            got.sort();
            assert_eq!(got, vec![b"epoch".to_vec(), b"pre1970".to_vec()]);
        }
        eventually("far tasks in memory", || timers.in_memory() == 2);
        clock.advance(Duration::from_secs(1000 * 365 * 86400));
        quiet(&rx, 200);
        timers.schedule("now", b"", clock.now()).unwrap();
        assert_eq!(within(&rx, 3000).unwrap().id, b"now");
        timers.close().unwrap();
    }
}

/// Tasks due exactly on bucket edges, a millisecond either side, and many due in the same
/// millisecond: each once, never early.
#[test]
fn hostile_bucket_edges_and_same_millisecond() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = manual();
    let options = options
        .bucket_width(Duration::from_secs(10))
        .load_ahead(Duration::from_secs(1));
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, clock.clone(), 4, |_, _| false);
    let mut batch = Vec::new();
    for edge in 1..5u64 {
        let e = t0() + Duration::from_secs(10 * edge);
        batch.push((format!("e{edge}-before"), Vec::new(), e - MS));
        batch.push((format!("e{edge}-at"), Vec::new(), e));
        batch.push((format!("e{edge}-after"), Vec::new(), e + MS));
    }
    for i in 0..3000 {
        batch.push((
            format!("same-{i}"),
            Vec::new(),
            t0() + Duration::from_secs(20),
        ));
    }
    timers.schedule_batch(batch).unwrap();
    let mut seen: HashMap<Vec<u8>, u32> = HashMap::new();
    let mut t = t0();
    while t < t0() + Duration::from_secs(51) {
        t += Duration::from_millis(500);
        clock.set(t);
        std::thread::sleep(Duration::from_millis(2));
        while let Some(g) = within(&rx, 1) {
            assert!(g.at >= g.due, "early: {g:?}");
            *seen.entry(g.id).or_default() += 1;
        }
    }
    while let Some(g) = within(&rx, 300) {
        assert!(g.at >= g.due, "early: {g:?}");
        *seen.entry(g.id).or_default() += 1;
    }
    assert_eq!(seen.len(), 3012);
    assert!(seen.values().all(|&n| n == 1));
}

/// Upserts and cancels land in a big bucket while the loader reads it.
#[test]
fn hostile_upserts_and_cancels_while_a_bucket_loads() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = manual();
    let options = options
        .bucket_width(Duration::from_secs(3600))
        .load_ahead(Duration::from_secs(300));
    let n = 20_000;
    let due = t0() + Duration::from_secs(2 * 3600 + 60);
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, clock.clone(), 4, |_, _| false);
    for chunk in (0..n).collect::<Vec<_>>().chunks(5000) {
        timers
            .schedule_batch(chunk.iter().map(|i| (format!("k{i}"), b"v1".to_vec(), due)))
            .unwrap();
    }
    assert_eq!(timers.in_memory(), 0);
    let timers = Arc::new(timers);
    let mover = {
        let clock = clock.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            clock.set(t0() + Duration::from_secs(2 * 3600 - 200));
        })
    };
    let mut workers = Vec::new();
    for w in 0..4 {
        let timers = timers.clone();
        workers.push(std::thread::spawn(move || {
            for i in (w..4000).step_by(4) {
                if i < 2000 {
                    timers.schedule(format!("k{i}"), b"v2", due).unwrap();
                } else {
                    timers.cancel(format!("k{i}")).unwrap();
                }
            }
        }));
    }
    mover.join().unwrap();
    for w in workers {
        w.join().unwrap();
    }
    clock.set(due + SEC);
    let mut seen: HashMap<Vec<u8>, Vec<Vec<u8>>> = HashMap::new();
    while let Some(g) = within(&rx, 1000) {
        assert!(g.at >= g.due);
        seen.entry(g.id).or_default().push(g.payload);
    }
    for i in 0..n {
        let v = seen.get(format!("k{i}").as_bytes());
        match i {
            0..2000 => assert_eq!(v, Some(&vec![b"v2".to_vec()]), "k{i}"),
            2000..4000 => assert_eq!(v, None, "k{i} was cancelled"),
            _ => assert_eq!(v, Some(&vec![b"v1".to_vec()]), "k{i}"),
        }
    }
}

/// Upsert to earlier and later times, near (in the wheel) and far (on disk), then reopen.
#[test]
fn hostile_upsert_moves_between_wheel_and_disk() {
    let dir = tempfile::tempdir().unwrap();
    let hour = Duration::from_secs(3600);
    {
        let (clock, options) = manual();
        let timers = DurableTimers::open(dir.path(), options).unwrap();
        let rx = collect(&timers, clock.clone(), 2, |_, _| false);
        timers.schedule("a", b"1", t0() + 10 * SEC).unwrap(); // near
        timers.schedule("a", b"2", t0() + 5 * hour).unwrap(); // far
        timers.schedule("b", b"1", t0() + 5 * hour).unwrap(); // far
        timers.schedule("b", b"2", t0() + 10 * SEC).unwrap(); // near
        timers.schedule("c", b"1", t0() + 3 * hour).unwrap(); // far
        timers.schedule("c", b"2", t0() + 6 * hour).unwrap(); // farther
        clock.advance(20 * SEC);
        let g = within(&rx, 3000).unwrap();
        assert_eq!(
            (g.id.as_slice(), g.payload.as_slice()),
            (b"b".as_slice(), b"2".as_slice())
        );
        quiet(&rx, 200);
        timers.close().unwrap();
    }
    let (clock, options) = manual();
    clock.set(t0() + 20 * SEC);
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, clock.clone(), 2, |_, _| false);
    clock.set(t0() + 3 * hour + SEC);
    quiet(&rx, 300);
    clock.set(t0() + 5 * hour + SEC);
    let g = within(&rx, 3000).unwrap();
    assert_eq!(
        (g.id.as_slice(), g.payload.as_slice()),
        (b"a".as_slice(), b"2".as_slice())
    );
    quiet(&rx, 200);
    clock.set(t0() + 6 * hour + SEC);
    let g = within(&rx, 3000).unwrap();
    assert_eq!(
        (g.id.as_slice(), g.payload.as_slice()),
        (b"c".as_slice(), b"2".as_slice())
    );
    quiet(&rx, 200);
}

/// Dead letters: requeue of a live (not dead) id, double requeue, requeue after reopen.
#[test]
fn hostile_dead_letter_edges() {
    let dir = tempfile::tempdir().unwrap();
    let policy = RetryPolicy {
        max_attempts: 2,
        initial_backoff: SEC,
        multiplier: 1,
        max_backoff: SEC,
    };
    {
        let (clock, options) = manual();
        let timers = DurableTimers::open(dir.path(), options.retry(policy.clone())).unwrap();
        let rx = collect(&timers, clock.clone(), 2, |id, _| id == b"d");
        timers.schedule("d", b"p", t0()).unwrap();
        timers.schedule("live", b"", t0() + hour()).unwrap();
        assert_eq!(within(&rx, 3000).unwrap().attempt, 1);
        std::thread::sleep(Duration::from_millis(100));
        clock.advance(2 * SEC);
        assert_eq!(within(&rx, 3000).unwrap().attempt, 2);
        eventually("dead", || timers.dead_letters().len() == 1);
        assert!(matches!(
            timers.requeue("live"),
            Err(corewheel_durable::Error::NotDead)
        ));
        assert!(timers.requeue("").is_err());
        timers.close().unwrap();
    }
    let (clock, options) = manual();
    clock.set(t0() + 10 * SEC);
    let timers = DurableTimers::open(dir.path(), options.retry(policy)).unwrap();
    let rx = collect(&timers, clock.clone(), 2, |_, _| false);
    let dead = timers.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].id(), dead[0].payload(), dead[0].attempt()),
        (b"d".as_slice(), b"p".as_slice(), 2)
    );
    timers.requeue("d").unwrap();
    assert!(matches!(
        timers.requeue("d"),
        Err(corewheel_durable::Error::NotDead)
    ));
    let g = within(&rx, 3000).unwrap();
    assert_eq!((g.id.as_slice(), g.attempt), (b"d".as_slice(), 1));
    quiet(&rx, 200);
    assert!(timers.dead_letters().is_empty());
}

fn hour() -> Duration {
    Duration::from_secs(3600)
}

/// Downtime spanning many buckets, written in shuffled order, with duplicate ids in one
/// batch: at open everything is delivered oldest first (one handler thread), each once,
/// the last version of a duplicated id winning.
#[test]
fn hostile_downtime_over_many_buckets_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, options) = manual();
    let options = options.bucket_width(SEC).load_ahead(SEC);
    {
        let timers = DurableTimers::open(dir.path(), options.clone()).unwrap();
        let mut batch: Vec<_> = (0..1000u64)
            .map(|i| {
                (
                    format!("d{i}"),
                    b"v1".to_vec(),
                    t0() + Duration::from_millis(100_000 + i * 53),
                )
            })
            .collect();
        fastrand::shuffle(&mut batch);
        batch.push((
            "d7".into(),
            b"v2".to_vec(),
            t0() + Duration::from_millis(100_000 + 7 * 53),
        ));
        timers.schedule_batch(batch).unwrap();
        timers.close().unwrap();
    }
    clock.set(t0() + Duration::from_secs(1000));
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, clock.clone(), 1, |_, _| false);
    let mut got = Vec::new();
    while let Some(g) = within(&rx, 1000) {
        got.push(g);
    }
    assert_eq!(got.len(), 1000);
    for w in got.windows(2) {
        assert!(
            w[0].due <= w[1].due,
            "out of order: {:?} before {:?}",
            w[0],
            w[1]
        );
    }
    let d7: Vec<_> = got.iter().filter(|g| g.id == b"d7").collect();
    assert_eq!(d7.len(), 1);
    assert_eq!(d7[0].payload, b"v2");
}
