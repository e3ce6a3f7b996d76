//! tokio-util's `DelayQueue` as a subject: owned by one task of a current_thread runtime with the time driver
//! enabled, which is where its users run it.

use std::task::{Context, Poll, Waker};
use std::time::Instant;

use tokio::runtime::{Builder, Runtime};
use tokio_util::time::DelayQueue;
use tokio_util::time::delay_queue::{Expired, Key};

use super::TimerQueue;

/// The runtime every DelayQueue measurement runs in. DelayQueue arms a tokio `Sleep` for its earliest deadline, which
/// needs a runtime with the time driver.
pub fn runtime() -> Result<Runtime, String> {
    Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|error| format!("could not start a tokio runtime: {error}"))
}

/// Runs `work` on a fresh queue inside a fresh runtime.
pub fn with_queue<T, R>(work: impl FnOnce(&mut DelayQueue<T>) -> R) -> Result<R, String> {
    Ok(runtime()?.block_on(async move { work(&mut DelayQueue::new()) }))
}

impl<T> TimerQueue<T> for DelayQueue<T> {
    type Key = Key;

    #[inline]
    fn arm(&mut self, deadline: Instant, value: T) -> Key {
        self.insert_at(value, deadline.into())
    }

    #[inline]
    fn cancel(&mut self, key: Key) -> Option<T> {
        self.try_remove(&key).map(Expired::into_inner)
    }

    #[inline]
    fn reset(&mut self, key: Key, deadline: Instant) -> Key {
        self.reset_at(&key, deadline.into());
        key
    }

    fn settle(&mut self) -> Result<(), String> {
        // A queue that its task has polled holds a registered Sleep and the task's waker, and its later inserts and
        // resets go through that Sleep. Measuring a never-polled queue would skip that cost. The no-op waker stands
        // in for the task's: nothing here waits on it.
        let mut context = Context::from_waker(Waker::noop());
        let stalled = "a timer fired while the queue was being set up: the machine stalled for milliseconds; run again";
        match self.poll_expired(&mut context) {
            Poll::Pending | Poll::Ready(None) => Ok(()),
            Poll::Ready(Some(_)) => Err(stalled.to_string()),
        }
    }

    fn release_spare_memory(&mut self) -> bool {
        self.shrink_to_fit();
        true
    }
}
