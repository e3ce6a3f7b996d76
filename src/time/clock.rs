//! Where time comes from: the real monotonic clock, or a manual one that tests drive.

use std::time::{Duration, Instant};

use crate::sync::Arc;
use crate::sync::atomic::{AtomicU64, Ordering, update};
use crate::time::ticks::saturating_add;

/// A source of monotonic time.
///
/// corewheel never reads the system clock behind the caller's back: whatever drives a wheel
/// or engine asks a `Clock`, so a test can substitute [`ManualClock`] and make every timing
/// decision deterministic.
///
/// The trait is sealed: the clocks are [`MonotonicClock`] and [`ManualClock`], which is what
/// an engine's builder accepts. A wheel takes its instants from the caller and needs no
/// clock at all.
pub trait Clock: sealed::Sealed + Send + Sync {
    /// The current instant. Successive calls never go backwards.
    fn now(&self) -> Instant;
}

/// Keeps [`Clock`] to this crate's clocks.
mod sealed {
    pub trait Sealed {}
    impl Sealed for super::MonotonicClock {}
    impl Sealed for super::ManualClock {}
}

/// The process's monotonic clock, [`Instant::now`].
#[derive(Debug, Clone, Copy, Default)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to.
///
/// Clones share one time line, so a test can keep one clone and hand another to the code
/// under test. Time starts at the instant given to [`ManualClock::starting_at`] (or at the
/// moment of [`ManualClock::new`]) and never goes backwards.
///
/// ```
/// use corewheel::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let t0 = clock.now();
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(clock.now() - t0, Duration::from_millis(5));
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    origin: Instant,
    elapsed_ns: Arc<AtomicU64>,
}

impl ManualClock {
    /// A manual clock whose time starts at the real current instant and then stands still.
    pub fn new() -> Self {
        Self::starting_at(Instant::now())
    }

    /// A manual clock whose time starts at `origin`.
    pub fn starting_at(origin: Instant) -> Self {
        Self {
            origin,
            elapsed_ns: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Moves time forward by `by`.
    ///
    /// Saturates rather than overflowing: after about 584 years of manual time the clock
    /// stops advancing.
    pub fn advance(&self, by: Duration) {
        let by_ns = saturating_nanos(by);
        // An update rather than fetch_add so that concurrent advances saturate instead of
        // wrapping around to the past.
        update(
            &self.elapsed_ns,
            Ordering::AcqRel,
            Ordering::Acquire,
            |ns| ns.saturating_add(by_ns),
        );
    }

    /// Moves time forward to `to`. An instant at or before the current time changes nothing,
    /// since the clock never goes backwards.
    pub fn advance_to(&self, to: Instant) {
        let to_ns = saturating_nanos(to.saturating_duration_since(self.origin));
        self.elapsed_ns.fetch_max(to_ns, Ordering::AcqRel);
    }

    /// How far this clock has moved since its origin.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.elapsed_ns.load(Ordering::Acquire))
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        // Past the latest instant the platform can represent, time stands still there
        // rather than going backwards.
        saturating_add(self.origin, self.elapsed())
    }
}

fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn clones_share_one_time_line() {
        let a = ManualClock::new();
        let b = a.clone();
        let t0 = a.now();
        b.advance(Duration::from_secs(3));
        assert_eq!(a.now() - t0, Duration::from_secs(3));
    }

    #[test]
    fn advance_to_the_past_changes_nothing() {
        let clock = ManualClock::new();
        let t0 = clock.now();
        clock.advance(Duration::from_millis(10));
        clock.advance_to(t0);
        assert_eq!(clock.now() - t0, Duration::from_millis(10));
        clock.advance_to(t0 + Duration::from_millis(25));
        assert_eq!(clock.now() - t0, Duration::from_millis(25));
    }

    #[test]
    fn time_stands_still_at_the_latest_representable_instant() {
        let start = ManualClock::new().now();
        let (mut fits, mut overflows) = (Duration::ZERO, Duration::MAX);
        while overflows - fits > Duration::from_nanos(1) {
            let mid = fits + (overflows - fits) / 2;
            if start.checked_add(mid).is_some() {
                fits = mid;
            } else {
                overflows = mid;
            }
        }
        let clock = ManualClock::starting_at(start + fits - Duration::from_nanos(10));
        clock.advance(Duration::from_nanos(5));
        let before = clock.now();
        clock.advance(Duration::from_nanos(10));
        assert!(clock.now() >= before, "time went backwards");
    }

    #[test]
    fn huge_advance_saturates_without_panicking() {
        let clock = ManualClock::new();
        clock.advance(Duration::MAX);
        clock.advance(Duration::MAX);
        assert_eq!(clock.elapsed(), Duration::from_nanos(u64::MAX));
    }
}
