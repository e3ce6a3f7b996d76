//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use corewheel_durable::{DurableTimers, ManualWallClock, Options, RetryPolicy};

/// A start time on an hour boundary, so bucket arithmetic in tests is easy to read.
pub fn t0() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000 / 3600 * 3600)
}

/// One delivery as a handler saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub id: String,
    pub attempt: u32,
    pub payload: Vec<u8>,
    pub due: SystemTime,
}

/// Options on a manual clock starting at [`t0`].
pub fn manual() -> (Arc<ManualWallClock>, Options) {
    let clock = Arc::new(ManualWallClock::new(t0()));
    let options = Options::default().clock(clock.clone());
    (clock, options)
}

/// A retry policy of one attempt: a failure is a dead letter at once.
pub fn one_attempt() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    }
}

/// Runs a handler that reports every delivery and succeeds unless `fail` says so.
pub fn collect(
    timers: &DurableTimers,
    fail: impl Fn(&str, u32) -> bool + Send + Sync + 'static,
) -> Receiver<Seen> {
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    timers
        .run_handler(2, move |task| {
            let id = String::from_utf8_lossy(task.id()).into_owned();
            let failed = fail(&id, task.attempt());
            let seen = Seen {
                id,
                attempt: task.attempt(),
                payload: task.payload().to_vec(),
                due: task.due(),
            };
            let _ = tx.lock().unwrap().send(seen);
            if failed { Err("told to fail") } else { Ok(()) }
        })
        .unwrap();
    rx
}

/// The next delivery within a few seconds of real time.
pub fn next(rx: &Receiver<Seen>) -> Seen {
    rx.recv_timeout(Duration::from_secs(5))
        .expect("a delivery within 5 s")
}

/// Asserts nothing is delivered in the next `ms` of real time.
pub fn quiet(rx: &Receiver<Seen>, ms: u64) {
    if let Ok(seen) = rx.recv_timeout(Duration::from_millis(ms)) {
        panic!("unexpected delivery {seen:?}");
    }
}

/// Waits until `check` holds, for up to five seconds.
pub fn eventually(mut check: impl FnMut() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("condition not met within 5 s");
}
