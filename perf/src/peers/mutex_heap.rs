//! The naive multi-thread baseline: one `BinaryHeap` (the tombstone heap of `binary_heap`) behind one `Mutex`, shared
//! by every application thread, and one timer thread that sleeps on a `Condvar` until the earliest deadline and fires
//! what is due. This is the timer service most hand-rolled servers start with.
//!
//! Every arm, cancel and reset takes the lock, so the threads of a run take turns on one cache line and one
//! structure; an arm that becomes the new earliest deadline also wakes the timer thread.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::SharedTimers;
use super::binary_heap::{HeapKey, TombstoneHeap};
use crate::sys as cpu_time;

/// The timer thread's name; `cpu_time` finds it by this prefix.
pub const TIMER_THREAD_PREFIX: &str = "mutex-heap-";

struct State {
    heap: TombstoneHeap<u64>,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    fired: AtomicU64,
}

impl Shared {
    /// A poisoned lock only means a thread panicked while holding it; the heap itself is still whole (its methods do
    /// not panic halfway), and the run reports the panic.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A shared heap with its timer thread running. Dropping it stops the thread, with whatever timers are left unfired.
pub struct SharedHeap {
    shared: Arc<Shared>,
    timer_thread: Option<JoinHandle<()>>,
}

impl SharedHeap {
    /// A fresh heap with its timer thread started.
    pub fn start() -> Result<Self, String> {
        let state = Mutex::new(State {
            heap: TombstoneHeap::new(),
            stop: false,
        });
        let shared = Arc::new(Shared {
            state,
            wake: Condvar::new(),
            fired: AtomicU64::new(0),
        });
        let for_thread = Arc::clone(&shared);
        let timer_thread = std::thread::Builder::new()
            .name(format!("{TIMER_THREAD_PREFIX}0"))
            .spawn(move || fire_loop(&for_thread))
            .map_err(|error| format!("could not start the heap's timer thread: {error}"))?;
        Ok(Self {
            shared,
            timer_thread: Some(timer_thread),
        })
    }

    /// Timers the timer thread has fired so far.
    pub fn fired(&self) -> u64 {
        self.shared.fired.load(Ordering::Acquire)
    }

    /// CPU time the timer thread has used so far.
    pub fn timer_thread_cpu_time() -> Option<Duration> {
        cpu_time::named_threads_cpu_time(TIMER_THREAD_PREFIX)
    }
}

impl SharedTimers for SharedHeap {
    type Handle = HeapKey;

    #[inline]
    fn arm(&self, delay: Duration, id: u64) -> Result<HeapKey, String> {
        let deadline = Instant::now() + delay;
        let mut state = self.shared.lock();
        let earliest = state.heap.next_deadline();
        let key = state.heap.insert(deadline, id);
        drop(state);
        self.wake_if_earliest(deadline, earliest);
        Ok(key)
    }

    #[inline]
    fn cancel(&self, key: HeapKey) -> bool {
        self.shared.lock().heap.cancel(key).is_some()
    }

    #[inline]
    fn reset(&self, key: HeapKey, delay: Duration) -> Option<HeapKey> {
        let deadline = Instant::now() + delay;
        let mut state = self.shared.lock();
        let earliest = state.heap.next_deadline();
        let moved = state.heap.reset(key, deadline);
        drop(state);
        self.wake_if_earliest(deadline, earliest);
        moved
    }

    fn is_pending(&self, key: HeapKey) -> bool {
        self.shared.lock().heap.contains(key)
    }
}

impl SharedHeap {
    /// Wakes the timer thread when `deadline` comes before the `earliest` it sleeps towards.
    fn wake_if_earliest(&self, deadline: Instant, earliest: Option<Instant>) {
        if earliest.is_none_or(|earliest| deadline < earliest) {
            self.shared.wake.notify_one();
        }
    }
}

impl Drop for SharedHeap {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.timer_thread.take() {
            // A panic on the timer thread was already reported through the counts.
            let _ = thread.join();
        }
    }
}

/// The timer thread: fires everything due, then waits for the earliest deadline or for an arm that moves it earlier.
/// Callbacks run under the lock, as the simplest such services do; the harness's callbacks only count.
fn fire_loop(shared: &Shared) {
    let mut state = shared.lock();
    while !state.stop {
        let now = Instant::now();
        while let Some(id) = state.heap.pop_expired(now) {
            black_box(id);
            shared.fired.fetch_add(1, Ordering::Release);
        }
        state = match state
            .heap
            .next_deadline()
            .map(|next| next.saturating_duration_since(Instant::now()))
        {
            Some(wait) => {
                shared
                    .wake
                    .wait_timeout(state, wait)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
            None => shared
                .wake
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::SharedHeap;
    use crate::peers::SharedTimers;
    use std::time::{Duration, Instant};

    /// Timers armed from two threads fire on the timer thread, cancelled and reset ones as the keys say, and a short
    /// timer armed while the thread sleeps towards a long one still fires in time. A cancel may find its 1-5 ms timer
    /// fired only once its delay has passed (a descheduled thread); such a timer counts among those that must fire.
    #[test]
    fn fires_cancels_and_resets_across_threads() {
        let heap = SharedHeap::start().expect("a timer thread");
        let far = heap.arm(Duration::from_secs(3600), 0).expect("armed");
        let arm_and_cancel = |thread: u64| {
            let mut missed = 0;
            for i in 0..100 {
                let (delay, armed) = (Duration::from_millis(1 + i % 5), Instant::now());
                let key = heap.arm(delay, thread * 1000 + i).expect("armed");
                if i % 2 == 0 && !heap.cancel(key) {
                    assert!(
                        armed.elapsed() >= delay,
                        "a cancel failed {:?} into a {delay:?} timer",
                        armed.elapsed()
                    );
                    missed += 1;
                }
            }
            missed
        };
        let missed: u64 = std::thread::scope(|s| {
            [s.spawn(|| arm_and_cancel(0)), s.spawn(|| arm_and_cancel(1))]
                .map(|t| t.join().expect("no panic"))
                .iter()
                .sum()
        });
        let moved = heap
            .reset(
                heap.arm(Duration::from_secs(3600), 9).expect("armed"),
                Duration::from_millis(2),
            )
            .expect("pending");
        let (expected, started) = (101 + missed, Instant::now());
        while heap.fired() < expected && started.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            heap.fired(),
            expected,
            "100 uncancelled timers, {missed} cancelled too late, and the reset one"
        );
        assert!(!heap.cancel(moved) && heap.is_pending(far) && heap.cancel(far));
    }
}
