//! A book of one-shot timers' fires, for bursts checked timer by timer: how often each ran
//! and when, checked against its deadline and whether its cancel returned `true`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use corewheel::{TimerEngine, TimerHandle};

use super::Rng;

/// A duration in nanoseconds.
pub fn nanos(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// Per timer: how often it ran and when it last ran (ns since `origin`).
pub struct Book {
    pub origin: Instant,
    pub fires: Vec<AtomicU32>,
    at: Vec<AtomicU64>,
    total: AtomicUsize,
}

impl Book {
    pub fn new(n: usize) -> Arc<Self> {
        Arc::new(Self {
            origin: Instant::now(),
            fires: (0..n).map(|_| AtomicU32::new(0)).collect(),
            at: (0..n).map(|_| AtomicU64::new(0)).collect(),
            total: AtomicUsize::new(0),
        })
    }

    pub fn hit(&self, id: usize) {
        self.at[id].store(nanos(self.origin.elapsed()), Ordering::SeqCst);
        self.fires[id].fetch_add(1, Ordering::SeqCst);
        self.total.fetch_add(1, Ordering::SeqCst);
    }

    pub fn ns(&self, t: Instant) -> u64 {
        nanos(t.saturating_duration_since(self.origin))
    }

    pub fn total(&self) -> usize {
        self.total.load(Ordering::SeqCst)
    }

    /// Checks: a timer marked cancelled never ran; every other ran exactly once (or at most
    /// once with `at_most`), never before its deadline. Returns how many ran.
    pub fn check(&self, deadlines: &[u64], cancelled: &[bool], at_most: bool) -> usize {
        let mut ran = 0;
        for id in 0..deadlines.len() {
            let fires = self.fires[id].load(Ordering::SeqCst);
            if cancelled[id] {
                assert_eq!(fires, 0, "timer {id} ran after a cancel that returned true");
                continue;
            }
            if at_most {
                assert!(fires <= 1, "timer {id} ran {fires} times");
            } else {
                assert_eq!(fires, 1, "timer {id} ran {fires} times");
            }
            if fires == 1 {
                let at = self.at[id].load(Ordering::SeqCst);
                assert!(
                    at >= deadlines[id],
                    "timer {id} ran {} ns early",
                    deadlines[id] - at
                );
                ran += 1;
            }
        }
        ran
    }
}

/// Arms one one-shot timer per timer of `book` from this thread, due within `spread` from
/// `first`, each recording into `book`; returns deadlines (ns since the book's origin) and
/// handles.
pub fn arm(
    engine: &TimerEngine,
    book: &Arc<Book>,
    window: (Instant, Duration),
    seed: u64,
) -> (Vec<u64>, Vec<TimerHandle>) {
    arm_then(engine, book, window, seed, |_| {})
}

/// [`arm`], each timer's callback then calling `then` with its id after recording.
pub fn arm_then(
    engine: &TimerEngine,
    book: &Arc<Book>,
    (first, spread): (Instant, Duration),
    seed: u64,
    then: impl Fn(usize) + Clone + Send + 'static,
) -> (Vec<u64>, Vec<TimerHandle>) {
    let n = book.fires.len();
    let mut rng = Rng(seed);
    let mut deadlines = Vec::with_capacity(n);
    let handles = (0..n)
        .map(|id| {
            let deadline = first + Duration::from_nanos(rng.below(nanos(spread).max(1)));
            deadlines.push(book.ns(deadline));
            let (book, then) = (Arc::clone(book), then.clone());
            engine
                .schedule_at(deadline, move || {
                    book.hit(id);
                    then(id);
                })
                .expect("scheduled")
        })
        .collect();
    (deadlines, handles)
}
