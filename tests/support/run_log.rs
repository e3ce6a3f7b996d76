//! A log of which timer ran when, on a hand-driven engine, and the check that each ran
//! exactly once at the millisecond a test expects.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corewheel::{ManualClock, TimerEngine};

use super::since;

/// (timer id, milliseconds since the start when it ran), one entry per run.
pub type Log = Arc<Mutex<Vec<(usize, u64)>>>;

/// A callback that logs `id` and the time it ran.
pub fn record(
    log: &Log,
    clock: &ManualClock,
    start: Instant,
    id: usize,
) -> impl FnOnce() + Send + use<> {
    let (log, clock) = (Arc::clone(log), clock.clone());
    move || log.lock().unwrap().push((id, since(&clock, start)))
}

/// Advances `clock` to `ms` milliseconds after `start` in one step and turns until quiet.
pub fn jump_to(engine: &TimerEngine, clock: &ManualClock, start: Instant, ms: u64) {
    clock.advance_to(start + Duration::from_millis(ms));
    while engine.turn() > 0 {}
}

/// Checks the log against `expected`: timer `id` ran exactly once, at `expected[id]`
/// milliseconds, or never where that is `None`.
pub fn assert_ran_exactly(log: &Log, expected: &[Option<u64>], what: &str) {
    let log = log.lock().unwrap();
    let mut runs: Vec<Vec<u64>> = vec![Vec::new(); expected.len()];
    for &(id, at) in log.iter() {
        runs[id].push(at);
    }
    for (id, (runs, want)) in runs.iter().zip(expected).enumerate() {
        match want {
            Some(at) => assert_eq!(
                runs.as_slice(),
                &[*at],
                "{what}: timer {id} should have run once, at {at} ms"
            ),
            None => assert!(
                runs.is_empty(),
                "{what}: timer {id} cancelled, ran at {runs:?}"
            ),
        }
    }
}

/// What [`assert_ran_exactly`] should find for timers whose callbacks change one another:
/// timer `id` runs once at `deadline[id]`, its last deadline, or never where
/// `cancelled[id]` is set.
pub fn expected_runs(deadline: &[AtomicU64], cancelled: &[AtomicBool]) -> Vec<Option<u64>> {
    deadline
        .iter()
        .zip(cancelled)
        .map(|(deadline, cancelled)| {
            (!cancelled.load(Ordering::SeqCst)).then(|| deadline.load(Ordering::SeqCst))
        })
        .collect()
}
