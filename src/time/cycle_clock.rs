//! An upper bound on the current time from the CPU's cycle counter, so that arming a timer
//! for a delay does not pay for a system clock read each time.
//!
//! Turning a delay into a deadline needs the current time, and a system clock read costs
//! more than the rest of a schedule and cancel together; reading the x86-64 time-stamp
//! counter costs a fraction of that. Each thread keeps an *anchor*,
//! a counter value read just before a real clock read, and extrapolates from it for at most
//! about a millisecond, with the counter's rate rounded up. What it extrapolates is never
//! earlier than the real time, which is what keeps timers from firing early:
//!
//! - the anchor's counter value is read (and fenced) before its clock read, so the clock
//!   value belongs to a moment at or after the anchor;
//! - nanoseconds per cycle are measured against the monotonic clock and rounded up by
//!   [`RATE_MARGIN_PER_MILLE`], which is four times the most that NTP may slew the monotonic clock;
//! - [`SLACK_NS`] covers the counter read being reordered with the instructions around it
//!   and any skew between cores' counters that the kernel tolerates.
//!
//! So a deadline may come out up to a few microseconds later than a clock read would have
//! made it; with millisecond ticks that rounds up one tick more in well under one case in a
//! hundred. The counter is used only where it is trustworthy: x86-64, an invariant counter
//! (CPUID), and on Linux, the kernel itself using it as its clock source, which it does only
//! when the counters of all CPUs are in step. Everywhere else, and under loom and Miri, the
//! engine reads its clock as before.

use std::cell::Cell;

use crate::sync::unmodelled::OnceLock;
use crate::tuning::ANCHOR_LIFE_NS;

/// How much the measured nanoseconds per cycle are rounded up: 0.2%.
const RATE_MARGIN_PER_MILLE: u64 = 2;

/// Nanoseconds added to every extrapolation, for counter reads that the CPU reorders by a
/// few instructions and for the cross-core skew that the kernel allows.
pub(crate) const SLACK_NS: u64 = 1_000;

/// How the counter converts to time, measured once per process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CycleScale {
    /// Nanoseconds per cycle as a 32.32 fixed-point number, rounded up.
    ns_per_cycle_q32: u64,
    /// Cycles in [`ANCHOR_LIFE_NS`]: an anchor older than this is refreshed.
    anchor_life: u64,
}

impl CycleScale {
    /// The process's scale, or `None` where the counter cannot be trusted. The first call
    /// measures it, which takes about 5 ms.
    pub(crate) fn get() -> Option<&'static CycleScale> {
        static SCALE: OnceLock<Option<CycleScale>> = OnceLock::new();
        SCALE.get_or_init(calibrate).as_ref()
    }

    /// Nanoseconds in `cycles`, rounded up.
    #[inline]
    fn nanos(&self, cycles: u64) -> u64 {
        // `cycles` is below `anchor_life`, about a millisecond of cycles, so the product
        // stays far below 2^64.
        (cycles * self.ns_per_cycle_q32) >> 32
    }
}

/// One thread's anchor: a counter value and the time, in nanoseconds on the caller's time
/// line, of a clock read made just after it.
#[derive(Debug, Default)]
pub(crate) struct Anchor {
    cycles: Cell<u64>,
    ns: Cell<u64>,
    set: Cell<bool>,
}

impl Anchor {
    /// An upper bound on the current time in nanoseconds on the time line `read_clock`
    /// reads: extrapolated from the anchor while it is fresh, otherwise a real read (by
    /// `read_clock`), which becomes the new anchor. `None` when `read_clock` has no answer.
    #[inline]
    pub(crate) fn now_at_most(
        &self,
        scale: &CycleScale,
        read_clock: impl FnOnce() -> Option<u64>,
    ) -> Option<u64> {
        let since = counter().wrapping_sub(self.cycles.get());
        // A counter behind the anchor (another core's, slightly) wraps to a huge `since`
        // and takes the refresh path too.
        if self.set.get() && since < scale.anchor_life {
            return Some(
                self.ns
                    .get()
                    .saturating_add(scale.nanos(since))
                    .saturating_add(SLACK_NS),
            );
        }
        self.refresh(read_clock)
    }

    #[cold]
    fn refresh(&self, read_clock: impl FnOnce() -> Option<u64>) -> Option<u64> {
        let cycles = fenced_counter();
        let ns = read_clock()?;
        self.cycles.set(cycles);
        self.ns.set(ns);
        self.set.set(true);
        Some(ns)
    }
}

/// The counter, unordered: a few instructions of reordering are covered by [`SLACK_NS`].
#[inline]
fn counter() -> u64 {
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    {
        // SAFETY: RDTSC exists on every x86-64 CPU and has no preconditions; whether its
        // value is trustworthy is what `calibrate` decides before any scale exists.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri), not(loom))))]
    {
        0
    }
}

/// The counter, read after every earlier instruction and before any later one starts: an
/// anchor's value must not be taken after the clock read it stands for.
fn fenced_counter() -> u64 {
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    {
        use core::arch::x86_64::{_mm_lfence, _rdtsc};
        // SAFETY: LFENCE and RDTSC exist on every x86-64 CPU (SSE2 is part of the base
        // architecture) and have no preconditions.
        unsafe {
            _mm_lfence();
            let cycles = _rdtsc();
            _mm_lfence();
            cycles
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri), not(loom))))]
    {
        0
    }
}

/// Measures the counter against the monotonic clock, or says it cannot be trusted.
fn calibrate() -> Option<CycleScale> {
    if !trustworthy() {
        return None;
    }
    let first = Sample::take()?;
    std::thread::sleep(std::time::Duration::from_millis(5));
    let second = Sample::take()?;
    let elapsed_ns = u64::try_from(
        second
            .instant
            .saturating_duration_since(first.instant)
            .as_nanos(),
    )
    .ok()?;
    // The fewest cycles that can lie between the two clock reads, so that the rate comes
    // out as high as it can be: an upper bound on nanoseconds per cycle.
    let cycles = second.before.checked_sub(first.after)?;
    if cycles == 0 || elapsed_ns < 4_000_000 {
        return None;
    }
    let ns_per_cycle_q32 = u64::try_from(
        (u128::from(elapsed_ns + 1) << 32) * u128::from(1000 + RATE_MARGIN_PER_MILLE)
            / (u128::from(cycles) * 1000),
    )
    .ok()?
        + 1;
    // Refuse rates no CPU counter has (below 100 MHz or above 20 GHz): the measurement went
    // wrong.
    let q32 = 1u64 << 32;
    if ns_per_cycle_q32 > 10 * q32 || ns_per_cycle_q32 < q32 / 20 {
        return None;
    }
    let anchor_life =
        u64::try_from((u128::from(ANCHOR_LIFE_NS) << 32) / u128::from(ns_per_cycle_q32)).ok()?;
    Some(CycleScale {
        ns_per_cycle_q32,
        anchor_life,
    })
}

/// A clock read bracketed by counter reads.
struct Sample {
    before: u64,
    instant: std::time::Instant,
    after: u64,
}

impl Sample {
    /// A sample whose bracket is under about 20 µs wide (not interrupted), in a few tries.
    fn take() -> Option<Self> {
        (0..16).find_map(|_| {
            let before = fenced_counter();
            let instant = std::time::Instant::now();
            let after = fenced_counter();
            let width = after.checked_sub(before)?;
            (width < 100_000).then_some(Self {
                before,
                instant,
                after,
            })
        })
    }
}

/// Whether the counter runs at a constant rate and in step across CPUs.
fn trustworthy() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri), not(loom)))]
    {
        // Newer Rust declares `__cpuid` safe; the block keeps older compilers building.
        #[allow(unused_unsafe)]
        // SAFETY: CPUID exists on every x86-64 CPU; leaf 0x8000_0000 reports the highest
        // extended leaf, which is checked before leaf 0x8000_0007 is read.
        let invariant = unsafe {
            use core::arch::x86_64::__cpuid;
            __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
        };
        let kernel_uses_it = std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .is_ok_and(|source| source.trim() == "tsc");
        invariant && kernel_uses_it
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux", not(miri), not(loom))))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Never below the real time: an extrapolation made after a clock read is at or past
    /// it, for as long as the anchor lives and through its refresh. The loop runs for 20 ms
    /// (many anchors' lives) and at least 10,000 reads, so that a thread descheduled for
    /// most of the 20 ms still makes many.
    #[test]
    fn extrapolation_never_falls_behind_the_clock() {
        let Some(scale) = CycleScale::get() else {
            eprintln!("cycle counter not trusted here; nothing to check");
            return;
        };
        let origin = Instant::now();
        let since_origin = || u64::try_from(origin.elapsed().as_nanos()).ok();
        let anchor = Anchor::default();
        let until = Instant::now() + Duration::from_millis(20);
        let mut reads = 0u64;
        while Instant::now() < until || reads < 10_000 {
            let clock = since_origin().unwrap_or(u64::MAX);
            let bound = anchor.now_at_most(scale, since_origin).unwrap_or(0);
            assert!(
                bound >= clock,
                "bound {bound} ns behind the clock {clock} ns"
            );
            reads += 1;
        }
    }

    /// Close to the real time: within the slack plus the rate margin over an anchor's life.
    /// An anchor whose counter and clock reads were split by an interrupt runs ahead by
    /// the interruption for its whole life, so the closest reading is taken over several
    /// anchors' lives (5 ms and at least 10,000 reads), not over the first anchor alone.
    #[test]
    fn extrapolation_stays_close_to_the_clock() {
        let Some(scale) = CycleScale::get() else {
            return;
        };
        let origin = Instant::now();
        let since_origin = || u64::try_from(origin.elapsed().as_nanos()).ok();
        let anchor = Anchor::default();
        let mut closest = u64::MAX;
        let until = Instant::now() + Duration::from_millis(5);
        let mut reads = 0u64;
        while Instant::now() < until || reads < 10_000 {
            reads += 1;
            let bound = anchor.now_at_most(scale, since_origin).unwrap_or(u64::MAX);
            let clock = since_origin().unwrap_or(0);
            closest = closest.min(bound.saturating_sub(clock));
        }
        assert!(
            closest <= SLACK_NS + ANCHOR_LIFE_NS / 100,
            "the bound ran {closest} ns ahead of the clock at best"
        );
    }

    #[test]
    fn a_missing_clock_leaves_no_anchor() {
        let anchor = Anchor::default();
        let scale = CycleScale {
            ns_per_cycle_q32: 1 << 32,
            anchor_life: 1000,
        };
        assert_eq!(anchor.now_at_most(&scale, || None), None);
        assert_eq!(anchor.now_at_most(&scale, || Some(7)), Some(7));
    }
}
