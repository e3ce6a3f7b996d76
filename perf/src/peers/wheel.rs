//! corewheel's `Wheel` as a subject, driven by the one thread that owns it.

use std::time::{Duration, Instant};

use corewheel::{TimerKey, Wheel};

use super::{PolledQueue, TimerQueue};

/// The resolution DelayQueue has too, so lateness compares like with like.
pub const TICK: Duration = Duration::from_millis(1);

/// A wheel as an event loop would make one: default geometry, no capacity hint.
pub fn new_wheel<T>() -> Wheel<T> {
    new_wheel_ticking(TICK)
}

/// The same at another tick.
pub fn new_wheel_ticking<T>(tick: Duration) -> Wheel<T> {
    Wheel::new(tick, Instant::now())
}

impl<T> TimerQueue<T> for Wheel<T> {
    type Key = TimerKey;

    #[inline]
    fn arm(&mut self, deadline: Instant, value: T) -> TimerKey {
        self.insert(deadline, value)
    }

    #[inline]
    fn cancel(&mut self, key: TimerKey) -> Option<T> {
        Wheel::cancel(self, key)
    }

    #[inline]
    fn reset(&mut self, key: TimerKey, deadline: Instant) -> TimerKey {
        let moved = Wheel::reset(self, key, deadline);
        debug_assert!(moved, "the harness reset a stale key");
        key
    }

    fn release_spare_memory(&mut self) -> bool {
        self.shrink_to_fit();
        true
    }

    fn accounted_bytes(&self) -> Option<usize> {
        Some(self.allocated_bytes())
    }
}

impl<T> PolledQueue<T> for Wheel<T> {
    fn next_deadline(&mut self) -> Option<Instant> {
        Wheel::next_deadline(self)
    }

    fn pop_expired(&mut self, now: Instant) -> Option<T> {
        self.poll_expired(now)
    }
}
