//! Bad input, the directory lock, and the real-clock promises: never early, exactly
//! once after an ack, nothing lost across a reopen.

mod common;

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use common::{collect, next, quiet};
use corewheel_durable::{DurableTimers, Error, MAX_ID_LEN, MAX_PAYLOAD_LEN, Options};

#[test]
fn bad_input_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let timers = DurableTimers::open(dir.path(), Options::default()).unwrap();
    let now = SystemTime::now();
    assert!(matches!(
        timers.schedule("", b"", now),
        Err(Error::BadId { len: 0 })
    ));
    let long = vec![b'i'; MAX_ID_LEN + 1];
    assert!(matches!(
        timers.schedule(&long, b"", now),
        Err(Error::BadId { .. })
    ));
    assert!(matches!(timers.cancel(&long), Err(Error::BadId { .. })));
    let big = vec![0u8; MAX_PAYLOAD_LEN + 1];
    assert!(matches!(
        timers.schedule("id", &big, now),
        Err(Error::PayloadTooLarge { .. })
    ));
    timers
        .schedule(vec![b'i'; MAX_ID_LEN], vec![0u8; MAX_PAYLOAD_LEN], now)
        .unwrap();
    // Before the epoch and far in the future are accepted: due now, and pending.
    timers
        .schedule("old", b"", SystemTime::UNIX_EPOCH - Duration::from_secs(1))
        .unwrap();
    timers
        .schedule("late", b"", now + Duration::from_secs(100 * 365 * 86400))
        .unwrap();
    assert!(matches!(
        DurableTimers::open(dir.path(), Options::default()),
        Err(Error::Locked)
    ));
    timers.close().unwrap();
    assert!(matches!(
        DurableTimers::open(
            dir.path(),
            Options::default().bucket_width(Duration::from_secs(60))
        ),
        Err(Error::BucketWidthMismatch {
            on_disk_ms: 3_600_000,
            requested_ms: 60_000
        })
    ));
    assert!(matches!(
        DurableTimers::open(dir.path(), Options::default().bucket_width(Duration::ZERO)),
        Err(Error::BadOptions(_))
    ));
    let timers = DurableTimers::open(dir.path(), Options::default()).unwrap();
    let rx = collect(&timers, |_, _| false);
    let mut ids: Vec<String> = (0..2).map(|_| next(&rx).id).collect();
    ids.sort();
    assert_eq!(ids, ["i".repeat(MAX_ID_LEN), "old".to_string()]);
    assert!(timers.run_handler(1, |_| Ok::<(), ()>(())).is_err());
}

#[test]
fn real_clock_never_early_once_each_and_nothing_lost_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::default()
        .bucket_width(Duration::from_millis(100))
        .load_ahead(Duration::from_millis(50));
    let timers = DurableTimers::open(dir.path(), options.clone()).unwrap();
    let rx = collect(&timers, |_, _| false);
    let mut due = HashMap::new();
    let start = SystemTime::now();
    for i in 0..2000u64 {
        let at = start + Duration::from_millis(i % 700);
        due.insert(format!("t{i}"), at);
    }
    timers
        .schedule_batch(due.iter().map(|(id, at)| (id, b"", *at)))
        .unwrap();
    let mut seen = HashMap::new();
    // Half are delivered, then the timers close and the rest come after a reopen.
    std::thread::sleep(Duration::from_millis(350));
    timers.close().unwrap();
    let mut check = |s: common::Seen, at: SystemTime| {
        assert!(at >= due[&s.id], "{} fired early", s.id);
        *seen.entry(s.id).or_insert(0) += 1;
    };
    while let Ok(s) = rx.try_recv() {
        check(s, SystemTime::now());
    }
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, |_, _| false);
    while let Ok(s) = rx.recv_timeout(Duration::from_millis(1500)) {
        check(s, SystemTime::now());
    }
    assert_eq!(seen.len(), 2000, "every task delivered");
    // A task handed over at close but not yet acked may come twice; none more.
    assert!(seen.values().all(|&n| n <= 2));
    quiet(&rx, 100);
    let _ = next;
}
