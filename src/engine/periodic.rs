//! When a repeating timer fires next, and what it does about ticks it missed.

/// What a repeating timer does when it ran late enough to miss whole periods.
///
/// `Burst` and `Skip` keep the phase of the first deadline; `Delay` starts a new phase
/// from the late run. A timer due at 10, 20, 30, ... whose run due at 20 ran at 35 runs next:
///
/// - with `Burst`, at 30, which is already due, so at once;
/// - with `Skip`, at 40, the next aligned tick;
/// - with `Delay`, at 45, a full period after the late run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissedTicks {
    /// Run once for every missed tick, back to back, until caught up (tokio's default).
    Burst,
    /// Run the next tick a full period after the late run: the phase shifts.
    Delay,
    /// Drop the missed ticks and run at the next tick still in the future (Go's
    /// `when += period * (1 + (now - when) / period)`). The default.
    #[default]
    Skip,
}

impl MissedTicks {
    /// The next deadline of a timer that was due at `due` and ran at `now` (`now >= due`),
    /// in units of `period` (nonzero). Saturates at `u64::MAX`.
    pub(crate) fn next_after(self, due: u64, period: u64, now: u64) -> u64 {
        let period = period.max(1);
        match self {
            Self::Burst => due.saturating_add(period),
            Self::Delay => now.max(due).saturating_add(period),
            Self::Skip => {
                let missed = now.saturating_sub(due) / period;
                due.saturating_add(period.saturating_mul(missed.saturating_add(1)))
            }
        }
    }
}

/// The longest period a repeating timer keeps between runs (2^62 - 2 ticks); one with a
/// longer period never runs again by itself after its first run.
pub(crate) const MAX_PERIOD_TICKS: u64 = (u64::MAX >> 2) - 1;

/// The packed period of a timer whose period is longer than [`MAX_PERIOD_TICKS`].
const BEYOND_RANGE: u64 = u64::MAX >> 2;

/// A timer's period in ticks (0 for a one-shot timer) and its missed-tick policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Period {
    pub(crate) ticks: u64,
    pub(crate) missed: MissedTicks,
}

impl Period {
    pub(crate) const ONE_SHOT: Self = Self {
        ticks: 0,
        missed: MissedTicks::Skip,
    };

    pub(crate) const fn is_repeating(self) -> bool {
        self.ticks != 0
    }

    /// Packs into one word, the period above the policy. A period over [`MAX_PERIOD_TICKS`]
    /// unpacks as `u64::MAX` ticks (never again): shortening it would run it early.
    pub(crate) const fn to_word(self) -> u64 {
        let ticks = if self.ticks > MAX_PERIOD_TICKS {
            BEYOND_RANGE
        } else {
            self.ticks
        };
        let missed = match self.missed {
            MissedTicks::Burst => 0,
            MissedTicks::Delay => 1,
            MissedTicks::Skip => 2,
        };
        (ticks << 2) | missed
    }

    pub(crate) const fn from_word(word: u64) -> Self {
        let missed = match word & 3 {
            0 => MissedTicks::Burst,
            1 => MissedTicks::Delay,
            _ => MissedTicks::Skip,
        };
        let ticks = match word >> 2 {
            BEYOND_RANGE => u64::MAX,
            ticks => ticks,
        };
        Self { ticks, missed }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{MAX_PERIOD_TICKS, MissedTicks, Period};

    #[test]
    fn periods_beyond_the_packed_range_never_come_round_again() {
        for missed in [MissedTicks::Burst, MissedTicks::Delay, MissedTicks::Skip] {
            let kept = Period {
                ticks: MAX_PERIOD_TICKS,
                missed,
            };
            assert_eq!(Period::from_word(kept.to_word()), kept);
            for ticks in [MAX_PERIOD_TICKS + 1, u64::MAX >> 1, u64::MAX] {
                let unpacked = Period::from_word(Period { ticks, missed }.to_word());
                assert_eq!(unpacked.missed, missed);
                assert_eq!(unpacked.ticks, u64::MAX);
                assert_eq!(missed.next_after(1000, unpacked.ticks, 5000), u64::MAX);
            }
        }
    }

    #[test]
    fn on_time_runs_step_by_one_period_under_every_policy() {
        for policy in [MissedTicks::Burst, MissedTicks::Delay, MissedTicks::Skip] {
            assert_eq!(policy.next_after(100, 7, 100), 107);
        }
    }

    #[test]
    fn skip_lands_on_the_first_aligned_tick_after_now() {
        // The type's documented example: due at 20, run at 35, period 10.
        assert_eq!(MissedTicks::Burst.next_after(20, 10, 35), 30);
        assert_eq!(MissedTicks::Skip.next_after(20, 10, 35), 40);
        assert_eq!(MissedTicks::Delay.next_after(20, 10, 35), 45);
        assert_eq!(MissedTicks::Skip.next_after(100, 7, 106), 107);
        assert_eq!(MissedTicks::Skip.next_after(100, 7, 107), 114);
        assert_eq!(MissedTicks::Skip.next_after(100, 7, 150), 156);
    }

    #[test]
    fn huge_values_saturate() {
        let max = u64::MAX;
        assert_eq!(MissedTicks::Burst.next_after(max - 1, 10, max), max);
        assert_eq!(MissedTicks::Skip.next_after(max - 1, 10, max), max);
        assert_eq!(MissedTicks::Delay.next_after(0, max, max), max);
        assert_eq!(
            MissedTicks::Skip.next_after(5, 0, 9),
            10,
            "a zero period acts as one"
        );
    }
}
