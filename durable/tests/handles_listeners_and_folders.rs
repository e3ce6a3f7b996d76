//! On the real clock: races, re-entrant handlers, shutdown, directories.
//! Real-clock tests assert only never early, exactly once after an ack, nothing lost.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use corewheel_durable::{DurableTimers, Error, MAX_ID_LEN, Options, RetryPolicy};

#[allow(dead_code)]
#[derive(Debug, Clone)]
struct Got {
    id: Vec<u8>,
    payload: Vec<u8>,
    attempt: u32,
    due: SystemTime,
    at: SystemTime,
}

fn collect(timers: &DurableTimers, threads: usize) -> Receiver<Got> {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    timers
        .run_handler(threads, move |task| {
            let at = SystemTime::now();
            let _ = tx.lock().unwrap().send(Got {
                id: task.id().to_vec(),
                payload: task.payload().to_vec(),
                attempt: task.attempt(),
                due: task.due(),
                at,
            });
            Ok::<(), String>(())
        })
        .unwrap();
    rx
}

fn drain(rx: &Receiver<Got>, idle_ms: u64) -> Vec<Got> {
    let mut out = Vec::new();
    while let Ok(g) = rx.recv_timeout(Duration::from_millis(idle_ms)) {
        assert!(g.at >= g.due, "early: {g:?}");
        out.push(g);
    }
    out
}

/// Runs `f` on a thread and fails if it does not return within `secs`.
fn with_timeout<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs)).ok()
}

/// One delivery as a handler saw it: id, attempt, due time, time of the call.
type Delivery = (Vec<u8>, u32, SystemTime, SystemTime);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A handler that keeps a `Weak` to its timers (to schedule follow-ups) ends up dropping
/// the last strong handle on a handler thread when the owner lets go meanwhile. The drop
/// must not join its own thread, and must still stop the writer and release the
/// directory. (The join used to fail, cutting shutdown short and leaking the lock.)
#[test]
fn hostile_last_handle_dropped_inside_handler_releases_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let timers = Arc::new(DurableTimers::open(dir.path(), Options::default()).unwrap());
    let weak: Weak<DurableTimers> = Arc::downgrade(&timers);
    let (entered_tx, entered) = mpsc::channel();
    let entered_tx = Mutex::new(entered_tx);
    timers
        .run_handler(1, move |task| {
            if let Some(strong) = weak.upgrade() {
                let _ = entered_tx.lock().unwrap().send(());
                std::thread::sleep(ms(300));
                // A follow-up, as a workflow step would schedule.
                let _ = strong.schedule([task.id(), b"-next"].concat(), b"", SystemTime::now());
            }
            Ok::<(), String>(())
        })
        .unwrap();
    timers.schedule("step-1", b"", SystemTime::now()).unwrap();
    entered.recv_timeout(Duration::from_secs(5)).unwrap();
    drop(timers); // the handler now holds the last strong handle
    std::thread::sleep(Duration::from_secs(2));
    let reopened = DurableTimers::open(dir.path(), Options::default());
    assert!(
        reopened.is_ok(),
        "the directory is still locked 2 s after the last handle was dropped: {:?}",
        reopened.err()
    );
}

/// An `Options::on_ack` listener that schedules (a natural "chain the next step when this
/// one is durably done") must not hang. (It deadlocked every later call while the
/// listener ran on the writer thread.)
#[test]
fn hostile_on_ack_listener_that_schedules_does_not_hang() {
    let dir = tempfile::tempdir().unwrap();
    let slot: Arc<OnceLock<Weak<DurableTimers>>> = Arc::new(OnceLock::new());
    let listener_slot = slot.clone();
    let options = Options::default().on_ack(move |id| {
        if id == b"first"
            && let Some(t) = listener_slot.get().and_then(Weak::upgrade)
        {
            let _ = t.schedule("second", b"", SystemTime::now());
        }
    });
    let timers = Arc::new(DurableTimers::open(dir.path(), options).unwrap());
    slot.set(Arc::downgrade(&timers)).unwrap();
    let rx = collect(&timers, 1);
    timers.schedule("first", b"", SystemTime::now()).unwrap();
    let t = timers.clone();
    let ok = with_timeout(5, move || {
        std::thread::sleep(ms(300));
        t.schedule("third", b"", SystemTime::now()).is_ok()
    });
    assert_eq!(
        ok,
        Some(true),
        "schedule hung after an on_ack listener scheduled"
    );
    let ids: HashSet<Vec<u8>> = drain(&rx, 500).into_iter().map(|g| g.id).collect();
    assert!(ids.contains(b"second".as_slice()));
}

/// Many threads upsert one id with random near due times; at the end one more upsert with
/// a known payload. That final version is delivered exactly once; no version twice; never
/// early.
#[test]
fn hostile_upsert_storm_on_one_id() {
    let dir = tempfile::tempdir().unwrap();
    let timers = Arc::new(DurableTimers::open(dir.path(), Options::default()).unwrap());
    let rx = collect(&timers, 4);
    let mut threads = Vec::new();
    for w in 0..8u32 {
        let timers = timers.clone();
        threads.push(std::thread::spawn(move || {
            for i in 0..150u32 {
                let due = SystemTime::now() + ms(fastrand::u64(0..20));
                timers.schedule("hot", format!("{w}-{i}"), due).unwrap();
                if fastrand::u8(0..10) == 0 {
                    timers.cancel("hot").unwrap();
                }
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    timers
        .schedule("hot", b"final", SystemTime::now() + ms(200))
        .unwrap();
    let got = drain(&rx, 800);
    let mut per_payload: HashMap<Vec<u8>, u32> = HashMap::new();
    for g in &got {
        *per_payload.entry(g.payload.clone()).or_default() += 1;
    }
    assert_eq!(
        per_payload.get(b"final".as_slice()),
        Some(&1),
        "final version once"
    );
    assert!(
        per_payload.values().all(|&n| n == 1),
        "a version delivered twice"
    );
    assert_eq!(got.last().unwrap().payload, b"final", "final version last");
}

/// Cancels racing their tasks' due times: a cancel that returned before the due time stops
/// the task.
#[test]
fn hostile_cancel_racing_due_time() {
    let dir = tempfile::tempdir().unwrap();
    let timers = Arc::new(DurableTimers::open(dir.path(), Options::default()).unwrap());
    let rx = collect(&timers, 4);
    let returned: Arc<Mutex<HashMap<String, (SystemTime, SystemTime)>>> = Arc::default();
    let mut threads = Vec::new();
    for w in 0..8 {
        let timers = timers.clone();
        let returned = returned.clone();
        threads.push(std::thread::spawn(move || {
            for i in 0..100 {
                let id = format!("c{w}-{i}");
                let due = SystemTime::now() + ms(fastrand::u64(1..8));
                timers.schedule(&id, b"", due).unwrap();
                std::thread::sleep(Duration::from_micros(fastrand::u64(0..6000)));
                timers.cancel(&id).unwrap();
                returned
                    .lock()
                    .unwrap()
                    .insert(id, (SystemTime::now(), due));
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    let got = drain(&rx, 500);
    let returned = returned.lock().unwrap();
    let mut count: HashMap<Vec<u8>, u32> = HashMap::new();
    for g in &got {
        *count.entry(g.id.clone()).or_default() += 1;
        let (ret, due) = returned[std::str::from_utf8(&g.id).unwrap()];
        assert!(
            ret >= due,
            "{g:?} delivered though its cancel returned before it was due"
        );
    }
    assert!(count.values().all(|&n| n == 1));
}

/// Handlers that schedule, upsert and cancel (their own id too), panic, or block.
#[test]
fn hostile_reentrant_panicking_and_blocking_handlers() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::default().retry(RetryPolicy {
        max_attempts: 3,
        initial_backoff: ms(10),
        multiplier: 1,
        max_backoff: ms(10),
    });
    let timers = Arc::new(DurableTimers::open(dir.path(), options).unwrap());
    let weak = Arc::downgrade(&timers);
    let log: Arc<Mutex<Vec<Delivery>>> = Arc::default();
    let handler_log = log.clone();
    let periodic = Arc::new(AtomicU32::new(0));
    let p = periodic.clone();
    timers
        .run_handler(3, move |task| {
            let now = SystemTime::now();
            handler_log
                .lock()
                .unwrap()
                .push((task.id().to_vec(), task.attempt(), task.due(), now));
            let t = weak.upgrade().ok_or("gone")?;
            match task.id() {
                b"periodic" => {
                    if p.fetch_add(1, Ordering::SeqCst) < 3 {
                        t.schedule("periodic", b"", now + ms(20))
                            .map_err(|e| e.to_string())?;
                    }
                    Ok(())
                }
                b"self-cancel-then-fail" => {
                    t.cancel(task.id()).map_err(|e| e.to_string())?;
                    Err("fail after cancelling myself".to_string())
                }
                b"self-upsert-then-fail" if task.payload() == b"v1" => {
                    t.schedule(task.id(), b"v2", now + ms(30))
                        .map_err(|e| e.to_string())?;
                    Err("fail after replacing myself".to_string())
                }
                b"panic" => panic!("handler panic on purpose"),
                b"block" => {
                    std::thread::sleep(Duration::from_secs(2));
                    Ok(())
                }
                _ => Ok(()),
            }
        })
        .unwrap();
    let now = SystemTime::now();
    for id in [
        "periodic",
        "self-cancel-then-fail",
        "self-upsert-then-fail",
        "panic",
        "block",
    ] {
        timers.schedule(id, b"v1", now + ms(5)).unwrap();
    }
    for i in 0..50 {
        timers
            .schedule(format!("plain-{i}"), b"", now + ms(10 + i))
            .unwrap();
    }
    std::thread::sleep(Duration::from_secs(3));
    let log = log.lock().unwrap().clone();
    for (id, _, due, at) in &log {
        assert!(at >= due, "early: {:?}", String::from_utf8_lossy(id));
    }
    let count = |name: &[u8]| log.iter().filter(|e| e.0 == name).count();
    assert_eq!(count(b"periodic"), 4);
    assert_eq!(
        count(b"self-cancel-then-fail"),
        1,
        "a cancelled task is not retried"
    );
    assert_eq!(
        count(b"self-upsert-then-fail"),
        2,
        "old version not retried, new once"
    );
    assert_eq!(
        count(b"panic"),
        3,
        "a panic is a failure, retried up to max_attempts"
    );
    assert_eq!(count(b"block"), 1);
    for i in 0..50 {
        assert_eq!(count(format!("plain-{i}").as_bytes()), 1);
    }
    let dead: Vec<_> = timers
        .dead_letters()
        .iter()
        .map(|t| t.id().to_vec())
        .collect();
    assert_eq!(dead, vec![b"panic".to_vec()]);
}

/// Close and reopen repeatedly while tasks come due and handlers are slow: every task is
/// delivered, nothing acked is delivered again.
#[test]
fn hostile_close_reopen_cycles_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let acked: Arc<Mutex<HashSet<Vec<u8>>>> = Arc::default();
    let delivered: Arc<Mutex<HashMap<Vec<u8>, u32>>> = Arc::default();
    let total = 600;
    let mut next = 0;
    for cycle in 0..8 {
        let a = acked.clone();
        let options = Options::default().bucket_width(ms(50)).on_ack(move |id| {
            assert!(a.lock().unwrap().insert(id.to_vec()), "acked twice");
        });
        let timers = DurableTimers::open(dir.path(), options).unwrap();
        let (d, a) = (delivered.clone(), acked.clone());
        timers
            .run_handler(3, move |task| {
                assert!(task.due() <= SystemTime::now(), "early");
                assert!(
                    !a.lock().unwrap().contains(task.id()),
                    "delivered after a durable ack: {:?}",
                    String::from_utf8_lossy(task.id())
                );
                *d.lock().unwrap().entry(task.id().to_vec()).or_default() += 1;
                std::thread::sleep(Duration::from_micros(fastrand::u64(0..3000)));
                Ok::<(), String>(())
            })
            .unwrap();
        if cycle < 6 {
            let batch: Vec<_> = (next..next + 100)
                .map(|i| {
                    (
                        format!("x{i}"),
                        Vec::new(),
                        SystemTime::now() + ms(fastrand::u64(0..300)),
                    )
                })
                .collect();
            next += 100;
            timers.schedule_batch(batch).unwrap();
            std::thread::sleep(ms(fastrand::u64(0..250)));
        } else {
            std::thread::sleep(ms(1500));
        }
        timers.close().unwrap();
    }
    let delivered = delivered.lock().unwrap();
    assert_eq!(delivered.len(), total, "lost tasks");
    assert_eq!(acked.lock().unwrap().len(), total);
}

/// Id and payload limits, non-UTF-8 ids, an empty batch, a batch with one bad task.
#[test]
fn hostile_input_edges() {
    let dir = tempfile::tempdir().unwrap();
    let timers = DurableTimers::open(dir.path(), Options::default()).unwrap();
    let rx = collect(&timers, 2);
    let now = SystemTime::now();
    assert!(matches!(timers.cancel(""), Err(Error::BadId { len: 0 })));
    assert!(
        timers
            .schedule_batch(Vec::<(&str, &[u8], SystemTime)>::new())
            .is_ok()
    );
    let r = timers.schedule_batch([
        (b"good".to_vec(), Vec::new(), now),
        (vec![b'x'; MAX_ID_LEN + 1], Vec::new(), now),
    ]);
    assert!(matches!(r, Err(Error::BadId { len }) if len == MAX_ID_LEN + 1));
    let weird: Vec<u8> = vec![0xff, 0x00, 0xfe, b'\n', 0x80];
    timers.schedule(&weird, b"\x00\xff", now + ms(50)).unwrap();
    timers
        .schedule(vec![0u8; MAX_ID_LEN], b"", now + ms(50))
        .unwrap();
    timers.schedule([0xc3u8], b"", now + ms(5000)).unwrap();
    timers.cancel([0xc3u8]).unwrap();
    let got = drain(&rx, 600);
    let ids: Vec<_> = got.iter().map(|g| g.id.clone()).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids.contains(&weird));
    assert!(
        !ids.contains(&b"good".to_vec()),
        "a batch with a bad task wrote its good one"
    );
}

/// The directory: open twice, garbage files, a file where a folder should be, META and
/// EPOCH mismatches: typed errors, no panics.
#[test]
fn hostile_directory_abuse() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t");
    {
        let a = DurableTimers::open(&path, Options::default()).unwrap();
        assert!(matches!(
            DurableTimers::open(&path, Options::default()),
            Err(Error::Locked)
        ));
        assert!(matches!(
            DurableTimers::open(path.join("."), Options::default()),
            Err(Error::Locked)
        ));
        a.close().unwrap();
    }
    // Garbage beside the journal.
    std::fs::write(path.join("buckets").join("README"), b"hi").unwrap();
    std::fs::create_dir_all(path.join("buckets").join("not-a-number")).unwrap();
    std::fs::write(path.join("control").join("junk.seg"), b"\x01\x02").unwrap();
    std::fs::write(
        path.join("control").join("0000000001-000099.seg"),
        vec![0xAB; 100],
    )
    .unwrap();
    std::fs::write(
        path.join("dead").join("0000000001-000098.seg"),
        vec![0xCD; 100],
    )
    .unwrap();
    std::fs::write(path.join("stray.tmp"), b"x").unwrap();
    let t = DurableTimers::open(&path, Options::default()).unwrap();
    let rx = collect(&t, 1);
    t.schedule("after-garbage", b"", SystemTime::now()).unwrap();
    assert_eq!(drain(&rx, 300).len(), 1);
    t.close().unwrap();
    // Bucket width mismatch is typed.
    assert!(matches!(
        DurableTimers::open(&path, Options::default().bucket_width(ms(1000))),
        Err(Error::BucketWidthMismatch { .. })
    ));
    // META / EPOCH garbage is typed.
    let meta = std::fs::read(path.join("META")).unwrap();
    std::fs::write(path.join("META"), b"something else").unwrap();
    assert!(matches!(
        DurableTimers::open(&path, Options::default()),
        Err(Error::BadFormat(_))
    ));
    std::fs::write(path.join("META"), &meta).unwrap();
    let epoch = std::fs::read(path.join("EPOCH")).unwrap();
    std::fs::write(path.join("EPOCH"), b"\xff\xfe").unwrap();
    assert!(DurableTimers::open(&path, Options::default()).is_err());
    std::fs::write(path.join("EPOCH"), &epoch).unwrap();
    // A file where the directory should be; a file where a subfolder should be.
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    assert!(matches!(
        DurableTimers::open(&file, Options::default()),
        Err(Error::Io(_))
    ));
    let sub = dir.path().join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join("buckets"), b"x").unwrap();
    assert!(DurableTimers::open(&sub, Options::default()).is_err());
    // A missing subfolder is recreated.
    std::fs::remove_dir_all(path.join("dead")).unwrap();
    let t = DurableTimers::open(&path, Options::default()).unwrap();
    t.close().unwrap();
}

/// A stray file whose name is a number (a backup, an editor's file) in `buckets/` is
/// skipped. (Open used to fail with NotADirectory, making every task unreachable.)
#[test]
fn hostile_numeric_stray_file_in_buckets_does_not_brick_open() {
    let dir = tempfile::tempdir().unwrap();
    let t = DurableTimers::open(dir.path(), Options::default()).unwrap();
    t.schedule("keep", b"", SystemTime::now() + Duration::from_secs(3600))
        .unwrap();
    t.close().unwrap();
    std::fs::write(dir.path().join("buckets").join("12345"), b"stray").unwrap();
    let r = DurableTimers::open(dir.path(), Options::default());
    assert!(r.is_ok(), "open refused: {:?}", r.err());
}

/// Close while a handler blocks: close waits for it; a run_handler second call is refused;
/// zero threads means one.
#[test]
fn hostile_handler_setup_and_close() {
    let dir = tempfile::tempdir().unwrap();
    let timers = DurableTimers::open(dir.path(), Options::default()).unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    timers
        .run_handler(0, move |_| {
            r.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(ms(500));
            Ok::<(), String>(())
        })
        .unwrap();
    assert!(timers.run_handler(1, |_| Ok::<(), String>(())).is_err());
    timers.schedule("a", b"", SystemTime::now()).unwrap();
    std::thread::sleep(ms(100));
    let start = Instant::now();
    let closed = with_timeout(10, move || timers.close().is_ok());
    assert_eq!(closed, Some(true));
    assert!(
        start.elapsed() >= ms(300),
        "close waited for the running handler"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    // The ack was written: nothing delivered after reopen.
    let timers = DurableTimers::open(dir.path(), Options::default()).unwrap();
    let rx = collect(&timers, 1);
    assert!(drain(&rx, 500).is_empty());
}

/// EPOCH deleted (or restored from an older backup) between runs: the epoch, the high part
/// of every sequence number, is taken past every segment on disk, so an earlier open's
/// cancel of an id (a tombstone) cannot void a schedule of it acknowledged after the
/// reopen, across the next restart too.
#[test]
fn a_deleted_epoch_file_does_not_let_old_tombstones_void_new_schedules() {
    let dir = tempfile::tempdir().unwrap();
    // Open 1 writes nothing; open 2 schedules and cancels "x" (tombstone of epoch 2).
    DurableTimers::open(dir.path(), Options::default())
        .unwrap()
        .close()
        .unwrap();
    {
        let t = DurableTimers::open(dir.path(), Options::default()).unwrap();
        t.schedule("x", b"old", SystemTime::now() + Duration::from_secs(7200))
            .unwrap();
        t.cancel("x").unwrap();
        t.close().unwrap();
    }
    std::fs::remove_file(dir.path().join("EPOCH")).unwrap();
    let t =
        DurableTimers::open(dir.path(), Options::default()).expect("open reads past the damage");
    // Acknowledged, then the process restarts before it is due.
    t.schedule("x", b"new", SystemTime::now() + ms(1500))
        .unwrap();
    t.close().unwrap();
    let Ok(t) = DurableTimers::open(dir.path(), Options::default()) else {
        panic!("the acknowledged schedule is unreachable: open refused after it was acked");
    };
    let rx = collect(&t, 1);
    let got = drain(&rx, 3000);
    assert_eq!(
        got.iter().map(|g| g.payload.clone()).collect::<Vec<_>>(),
        vec![b"new".to_vec()],
        "the acknowledged schedule of x after the reopen was not delivered"
    );
    t.close().unwrap();
}

#[test]
fn a_segment_named_for_the_last_epoch_is_a_typed_error_at_open_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    DurableTimers::open(dir.path(), Options::default())
        .unwrap()
        .close()
        .unwrap();
    for epoch in [u64::MAX, u64::MAX - 1, 1 << 40] {
        let stray = dir.path().join("control").join(format!("{epoch}-0.seg"));
        std::fs::write(&stray, b"").unwrap();
        match DurableTimers::open(dir.path(), Options::default()) {
            Err(Error::BadFormat(why)) => assert!(why.contains("epoch"), "{why}"),
            Err(e) => panic!("epoch {epoch}: {e}"),
            Ok(_) => panic!("epoch {epoch}: opened past the last epoch"),
        }
        std::fs::remove_file(&stray).unwrap();
    }
    DurableTimers::open(dir.path(), Options::default())
        .expect("opens again once the stray segment is gone")
        .close()
        .unwrap();
}
