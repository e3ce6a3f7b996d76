//! Conversion between instants and whole ticks since a wheel's origin.

use std::time::{Duration, Instant};

use strength_reduce::StrengthReducedU64;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// The tick that time never reaches. Deadlines past 2^64 - 1 ticks (584 million years at
/// 1 ms) saturate to it rather than to a tick that would fire them early.
pub(crate) const NEVER: u64 = u64::MAX;

/// A wheel's time line: an origin and a tick length.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticks {
    origin: Instant,
    tick_ns: u64,
    /// Division by the tick as a multiply and shift: a hardware divide would be most of the
    /// cost of an insert.
    tick_divisor: StrengthReducedU64,
}

impl Ticks {
    /// Clamps the tick into `1 ns ..= u64::MAX ns`, the documented range of
    /// [`Wheel::new`](crate::Wheel::new).
    pub(crate) fn new(tick: Duration, origin: Instant) -> Self {
        let tick_ns = u64::try_from(tick.as_nanos()).unwrap_or(u64::MAX).max(1);
        Self {
            origin,
            tick_ns,
            tick_divisor: StrengthReducedU64::new(tick_ns),
        }
    }

    pub(crate) fn tick(&self) -> Duration {
        Duration::from_nanos(self.tick_ns)
    }

    /// Whole ticks in `span`, rounded up, and at least one: a repeating timer's period.
    pub(crate) fn span(&self, span: Duration) -> u64 {
        let tick = u128::from(self.tick_ns.max(1));
        let ticks = span.as_nanos().div_ceil(tick);
        u64::try_from(ticks).unwrap_or(u64::MAX).max(1)
    }

    pub(crate) fn origin(&self) -> Instant {
        self.origin
    }

    /// The tick `now` falls in. Tick 1 begins at the origin; every instant before the
    /// origin is tick 0, which no deadline rounds to, so nothing fires before the origin.
    /// Time stops just short of [`NEVER`].
    #[inline]
    pub(crate) fn floor(&self, now: Instant) -> u64 {
        if now < self.origin {
            return 0;
        }
        let ticks = match self.nanos_since_origin(now) {
            Some(ns) => ns / self.tick_divisor,
            None => self.far_ticks(now).0,
        };
        ticks.saturating_add(1).min(NEVER - 1)
    }

    /// [`floor`](Self::floor) of the instant `ns` nanoseconds after the origin.
    #[inline]
    pub(crate) fn floor_nanos(&self, ns: u64) -> u64 {
        (ns / self.tick_divisor).saturating_add(1).min(NEVER - 1)
    }

    /// The first tick that begins at or after `deadline`: rounding up is what keeps timers
    /// from firing early. A deadline at or before the origin is tick 1, and one beyond the
    /// tick range becomes [`NEVER`].
    #[inline]
    pub(crate) fn ceil(&self, deadline: Instant) -> u64 {
        let ticks = match self.nanos_since_origin(deadline) {
            Some(ns) => return self.ceil_nanos(ns),
            None => {
                let (ticks, part) = self.far_ticks(deadline);
                ticks.saturating_add(u64::from(part != 0))
            }
        };
        ticks.saturating_add(1)
    }

    /// [`ceil`](Self::ceil) of the deadline `ns` nanoseconds after the origin.
    #[inline]
    fn ceil_nanos(&self, ns: u64) -> u64 {
        let (ticks, part) = StrengthReducedU64::div_rem(ns, self.tick_divisor);
        // No overflow: with a 1 ns tick `part` is 0, and with a longer one `ticks` is at
        // most half the range.
        (ticks + u64::from(part != 0)).saturating_add(1)
    }

    /// [`ceil`](Self::ceil) of a deadline given as [`signed_nanos`](Self::signed_nanos).
    #[inline]
    pub(crate) fn ceil_signed(&self, nanos: i64) -> u64 {
        // Every deadline at or before the origin is tick 1.
        self.ceil_nanos(u64::try_from(nanos).unwrap_or(0))
    }

    /// An instant as signed nanoseconds from the origin: 8 bytes where an `Instant` takes
    /// 16, and a tick away by one divide. `None` more than `i64::MAX` ns (292 years) after
    /// the origin; an instant that far before it (which no monotonic clock reaches)
    /// saturates.
    pub(crate) fn signed_nanos(&self, at: Instant) -> Option<i64> {
        match at.checked_duration_since(self.origin) {
            Some(after) => i64::try_from(after.as_nanos()).ok(),
            None => {
                let before = self.origin.duration_since(at).as_nanos();
                Some(i64::try_from(before).map_or(i64::MIN, |before| -before))
            }
        }
    }

    /// The instant that [`signed_nanos`](Self::signed_nanos) gave `nanos` for.
    pub(crate) fn instant_at_signed(&self, nanos: i64) -> Instant {
        let span = Duration::from_nanos(nanos.unsigned_abs());
        if nanos >= 0 {
            saturating_add(self.origin, span)
        } else {
            self.origin.checked_sub(span).unwrap_or(self.origin)
        }
    }

    /// `ceil(now + delay)` without building the `Instant`: one subtraction and a divide by
    /// the tick, the whole cost of turning a delay into a deadline on the hot path.
    #[inline]
    pub(crate) fn ceil_after(&self, now: Instant, delay: Duration) -> u64 {
        self.nanos_since_origin(now)
            .and_then(|since| self.ceil_after_nanos(since, delay))
            .unwrap_or_else(|| self.ceil(saturating_add(now, delay)))
    }

    /// `ceil(now + delay)` for a `now` given as nanoseconds since the origin; `None` when
    /// the sum leaves the `u64` range, which only a delay of centuries reaches.
    #[inline]
    pub(crate) fn ceil_after_nanos(&self, since: u64, delay: Duration) -> Option<u64> {
        Some(self.ceil_nanos(since.checked_add(nanos_of(delay)?)?))
    }

    /// Nanoseconds from the origin to `at` (0 before it), when they fit in a `u64`: for
    /// 584 years after the origin, so every real deadline takes this path.
    #[inline]
    pub(crate) fn nanos_since_origin(&self, at: Instant) -> Option<u64> {
        nanos_of(at.saturating_duration_since(self.origin))
    }

    /// Whole ticks from the origin to `at`, saturating, and whether a part tick remains:
    /// the wide path for instants more than 584 years away.
    fn far_ticks(&self, at: Instant) -> (u64, u128) {
        let ns = at.saturating_duration_since(self.origin).as_nanos();
        let tick = u128::from(self.tick_ns);
        (saturate(ns / tick), ns % tick)
    }

    /// The instant at which tick `tick` begins (tick 0, before the origin, is reported as
    /// the origin). A tick too far out for the platform's `Instant` gives the latest instant
    /// it can represent.
    pub(crate) fn instant_at(&self, tick: u64) -> Instant {
        let ns = u128::from(tick.saturating_sub(1)) * u128::from(self.tick_ns);
        let since_origin = match u64::try_from(ns / NANOS_PER_SEC) {
            Ok(secs) => Duration::new(secs, (ns % NANOS_PER_SEC) as u32),
            Err(_) => Duration::MAX,
        };
        saturating_add(self.origin, since_origin)
    }
}

/// `span` in nanoseconds, when that fits in a `u64` (584 years). Whole seconds and the
/// part apart, two multiply-adds, where `as_nanos` works in 128 bits.
#[inline]
pub(crate) fn nanos_of(span: Duration) -> Option<u64> {
    span.as_secs()
        .checked_mul(1_000_000_000)?
        .checked_add(u64::from(span.subsec_nanos()))
}

/// `from + by`, or the latest instant the platform can represent within that.
pub(crate) fn saturating_add(from: Instant, by: Duration) -> Instant {
    from.checked_add(by)
        .unwrap_or_else(|| latest_instant_within(from, by))
}

fn saturate(ticks: u128) -> u64 {
    u64::try_from(ticks).unwrap_or(u64::MAX)
}

/// The latest `origin + d` with `d <= limit` that the platform can represent, by bisection.
fn latest_instant_within(origin: Instant, limit: Duration) -> Instant {
    let (mut fits, mut overflows) = (Duration::ZERO, limit);
    while overflows - fits > Duration::from_nanos(1) {
        let mid = fits + (overflows - fits) / 2;
        if origin.checked_add(mid).is_some() {
            fits = mid;
        } else {
            overflows = mid;
        }
    }
    origin + fits
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn signed_nanos_round_trip_and_round_up_as_instants_do() {
        let origin = Instant::now() + Duration::from_secs(3600);
        let ticks = Ticks::new(Duration::from_millis(1), origin);
        let far = Duration::from_nanos(i64::MAX as u64);
        for at in [
            origin,
            origin + Duration::from_nanos(1),
            origin + Duration::from_micros(1_500),
            origin - Duration::from_nanos(1),
            origin - Duration::from_secs(3000),
            origin + far,
        ] {
            let nanos = ticks.signed_nanos(at).expect("within 292 years");
            assert_eq!(ticks.instant_at_signed(nanos), at, "{at:?}");
            assert_eq!(ticks.ceil_signed(nanos), ticks.ceil(at), "{at:?}");
        }
        assert_eq!(
            ticks.signed_nanos(origin - Duration::from_nanos(1)),
            Some(-1)
        );
        if let Some(past_range) = origin.checked_add(far + Duration::from_nanos(1)) {
            assert_eq!(ticks.signed_nanos(past_range), None);
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "arithmetic only: no unsafe code or atomics to check")]
    fn ceil_after_matches_ceil_of_the_sum() {
        let origin = Instant::now();
        for tick_ns in [1, 7, 1_000, 1_000_000, 999_999_937] {
            let ticks = Ticks::new(Duration::from_nanos(tick_ns), origin);
            for now_ns in [0, 1, 999, 1_000_000, 123_456_789] {
                for delay in [
                    Duration::ZERO,
                    Duration::from_nanos(1),
                    Duration::from_millis(30),
                    Duration::from_secs(86_400 * 365 * 600),
                    Duration::MAX,
                ] {
                    let now = origin + Duration::from_nanos(now_ns);
                    assert_eq!(
                        ticks.ceil_after(now, delay),
                        ticks.ceil(saturating_add(now, delay)),
                        "tick {tick_ns} now {now_ns} delay {delay:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn rounds_deadlines_up_and_now_down() {
        let t0 = Instant::now() + Duration::from_secs(1);
        let ticks = Ticks::new(Duration::from_millis(1), t0);
        let at = t0 + Duration::from_micros(1500);
        // Tick 1 begins at the origin, so 1.5 ms is in tick 2 and rounds up to tick 3.
        assert_eq!(ticks.floor(at), 2);
        assert_eq!(ticks.ceil(at), 3);
        assert_eq!(ticks.instant_at(3), t0 + Duration::from_millis(2));
        assert_eq!(ticks.ceil(t0 + Duration::from_millis(3)), 4);
        assert_eq!(ticks.instant_at(4), t0 + Duration::from_millis(3));
        assert_eq!(ticks.floor(t0), 1);
        assert_eq!(ticks.ceil(t0), 1);
        assert_eq!(
            ticks.floor(t0 - Duration::from_nanos(1)),
            0,
            "before the origin"
        );
        assert_eq!(ticks.instant_at(0), t0);
    }

    #[test]
    fn clamps_the_tick_and_the_past() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let ticks = Ticks::new(Duration::ZERO, t0);
        assert_eq!(ticks.tick(), Duration::from_nanos(1));
        assert_eq!(
            ticks.ceil(t0 - Duration::from_secs(5)),
            1,
            "rounded up to the origin"
        );
        assert_eq!(ticks.floor(t0 - Duration::from_secs(5)), 0);
        let huge = Ticks::new(Duration::MAX, t0);
        assert_eq!(huge.tick(), Duration::from_nanos(u64::MAX));
        let nanos = Ticks::new(Duration::from_nanos(1), t0);
        let far = t0 + Duration::from_secs(1 << 40);
        assert_eq!(nanos.ceil(far), NEVER);
        assert_eq!(nanos.floor(far), NEVER - 1, "time stops short of NEVER");
    }

    #[test]
    fn far_ticks_saturate_to_a_representable_instant() {
        let t0 = Instant::now();
        let ticks = Ticks::new(Duration::from_secs(1), t0);
        let far = ticks.instant_at(u64::MAX);
        assert!(far > t0 + Duration::from_secs(1 << 30));
    }
}
