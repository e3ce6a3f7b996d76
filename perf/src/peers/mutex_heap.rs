//! The naive multi-thread baseline, the timer service most hand-rolled servers start with: one tombstone heap behind
//! one `Mutex` shared by every application thread, and one timer thread that sleeps on a `Condvar` until the earliest
//! deadline and fires what is due. An arm that becomes the new earliest deadline wakes the timer thread.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::binary_heap::{HeapKey, TombstoneHeap};
use super::{PolledQueue, SharedTimers, TimerQueue};

/// The timer thread's name, by which its CPU time is found.
pub const TIMER_THREAD_PREFIX: &str = "mutex-heap-";

/// The heap and whether to stop, the timer thread's wake-up, and its count of fires.
#[derive(Default)]
struct Shared(Mutex<(TombstoneHeap<u64>, bool)>, Condvar, AtomicU64);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, (TombstoneHeap<u64>, bool)> {
        crate::runner::lock(&self.0)
    }
}

/// A shared heap with its timer thread running. Dropping it stops the thread, with whatever timers are left unfired.
pub struct SharedHeap(Arc<Shared>, Option<JoinHandle<()>>);

impl SharedHeap {
    pub fn start() -> Result<Self, String> {
        let shared = Arc::new(Shared::default());
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new().name(format!("{TIMER_THREAD_PREFIX}0"));
        let thread = thread.spawn(move || fire_loop(&for_thread));
        let thread = thread.map_err(|e| format!("could not start the heap's timer thread: {e}"))?;
        Ok(Self(shared, Some(thread)))
    }

    /// Timers the timer thread has fired so far.
    pub fn fired(&self) -> u64 {
        self.0.2.load(Ordering::Acquire)
    }

    pub fn timer_thread_cpu_time() -> Option<Duration> {
        crate::sys::named_threads_cpu_time(TIMER_THREAD_PREFIX)
    }

    /// Moves or arms a timer at `deadline` under the lock, and wakes the timer thread if it is now the earliest.
    fn put<R>(&self, deadline: Instant, put: impl FnOnce(&mut TombstoneHeap<u64>) -> R) -> R {
        let mut state = self.0.lock();
        let earliest = state.0.next_deadline();
        let put = put(&mut state.0);
        drop(state);
        if earliest.is_none_or(|earliest| deadline < earliest) {
            self.0.1.notify_one();
        }
        put
    }
}

impl SharedTimers for SharedHeap {
    type Handle = HeapKey;

    #[inline]
    fn arm(&self, delay: Duration, id: u64) -> Result<HeapKey, String> {
        let deadline = Instant::now() + delay;
        Ok(self.put(deadline, |heap| heap.arm(deadline, id)))
    }

    #[inline]
    fn cancel(&self, key: HeapKey) -> bool {
        self.0.lock().0.cancel(key).is_some()
    }

    #[inline]
    fn reset(&self, key: HeapKey, delay: Duration) -> Option<HeapKey> {
        let deadline = Instant::now() + delay;
        self.put(deadline, |heap| heap.reset(key, deadline))
    }

    fn is_pending(&self, key: HeapKey) -> bool {
        self.0.lock().0.contains(key)
    }
}

impl Drop for SharedHeap {
    fn drop(&mut self) {
        self.0.lock().1 = true;
        self.0.1.notify_one();
        // A panic on the timer thread was already reported through the counts.
        let _ = self.1.take().map(JoinHandle::join);
    }
}

/// The timer thread: fires everything due, then waits for the earliest deadline or for an arm that moves it earlier.
/// Callbacks run under the lock, as the simplest such services do; the harness's only count.
fn fire_loop(shared: &Shared) {
    let mut state = shared.lock();
    while !state.1 {
        let now = Instant::now();
        while let Some(id) = state.0.pop_expired(now) {
            black_box(id);
            shared.2.fetch_add(1, Ordering::Release);
        }
        let next = state.0.next_deadline();
        state = match next.map(|next| next.saturating_duration_since(Instant::now())) {
            Some(wait) => {
                let woken = shared.1.wait_timeout(state, wait);
                woken.unwrap_or_else(PoisonError::into_inner).0
            }
            None => shared.1.wait(state).unwrap_or_else(PoisonError::into_inner),
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
    /// fired once its delay has passed (a descheduled thread); such a timer counts among those that must fire.
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
            let threads = [s.spawn(|| arm_and_cancel(0)), s.spawn(|| arm_and_cancel(1))];
            threads.map(|t| t.join().expect("no panic")).iter().sum()
        });
        let long = heap.arm(Duration::from_secs(3600), 9).expect("armed");
        let moved = heap.reset(long, Duration::from_millis(2)).expect("pending");
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
