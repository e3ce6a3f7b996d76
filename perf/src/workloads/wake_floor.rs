//! The machine's floor under every timer: a thread that only sleeps until each tick boundary, as an engine's worker
//! does. How late it wakes bounds any sleeping thread's timers here and now, and a wake-up's cost bounds a timer
//! thread's at light load. Measured in the same run as the subjects, as these VMs change speed.

use std::time::{Duration, Instant};

use crate::sys::{cpu_between, process_cpu_time};
use crate::workloads::lateness::{Lateness, LatenessSummary};
use crate::workloads::rng;

pub struct Sleeper {
    /// How far past each boundary it woke, in order.
    pub oversleeps: Vec<Duration>,
    /// The process's CPU time per wake-up, where the platform reads it: with nothing else running, their own cost.
    pub cpu_per_wake: Option<Duration>,
}

/// Sleeps (with `park_timeout`, as the engine's workers do) until each boundary `tick` apart over `span` from now,
/// recording how late each wake-up came; one over a tick late makes the next late too, as a worker's would be.
pub fn sleep_through(tick: Duration, span: Duration) -> Sleeper {
    let boundaries = u32::try_from(span.as_nanos() / tick.as_nanos().max(1)).unwrap_or(u32::MAX);
    sleep_from(Instant::now(), tick, boundaries)
}

/// [`sleep_through`] over `boundaries` boundaries `tick` apart after `from`, which may be ahead (a storm's witness).
pub fn sleep_from(from: Instant, tick: Duration, boundaries: u32) -> Sleeper {
    let (mut oversleeps, mut cpu) = (Vec::with_capacity(boundaries as usize), None);
    for boundary in 0..=boundaries {
        let at = from + tick * boundary;
        while let Some(left) = at
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())
        {
            std::thread::park_timeout(left);
        }
        match boundary {
            // From the first boundary on: the wait for it may be long, or none.
            0 => cpu = process_cpu_time(),
            _ => oversleeps.push(Instant::now() - at),
        }
    }
    let cpu_per_wake = cpu_between(cpu, process_cpu_time())
        .filter(|_| boundaries > 0)
        .map(|cpu| cpu / boundaries);
    Sleeper {
        oversleeps,
        cpu_per_wake,
    }
}

impl Sleeper {
    /// The lateness of a storm of `timers` deadlines spread uniformly over the sleep, each rounded up to its tick
    /// boundary and fired the moment the sleeper woke there, at no cost: the best a structure that rounds to `tick`
    /// could have done over this sleep.
    pub fn storm_floor(&self, tick: Duration, timers: u64) -> LatenessSummary {
        let (mut lateness, mut rng, origin) = (Lateness::default(), rng(0), Instant::now());
        let tick_ns = u64::try_from(tick.as_nanos()).unwrap_or(u64::MAX).max(1);
        let span_ns = tick_ns.saturating_mul(self.oversleeps.len() as u64);
        for _ in 0..timers {
            // Strictly inside the span, so that every deadline has a boundary at or after it.
            let offset = rng.u64(..span_ns.max(1));
            let boundary = offset.div_ceil(tick_ns).max(1);
            let Some(&over) = self.oversleeps.get((boundary - 1) as usize) else {
                continue;
            };
            let deadline = origin + Duration::from_nanos(offset);
            let fired = origin + Duration::from_nanos(boundary * tick_ns) + over;
            lateness.record(deadline, fired, fired);
        }
        lateness.summarize()
    }

    /// The oversleeps as a lateness summary: the floor of a structure that fires at the exact instant.
    pub fn oversleep_summary(&self) -> LatenessSummary {
        let (mut lateness, origin) = (Lateness::default(), Instant::now());
        for &over in &self.oversleeps {
            lateness.record(origin, origin + over, origin + over);
        }
        lateness.summarize()
    }
}

#[cfg(test)]
mod tests {
    use super::Sleeper;
    use std::time::Duration;

    const TICK: Duration = Duration::from_millis(1);

    /// A sleeper that always woke on time leaves only the rounding: uniform in a tick, so the median near half a tick
    /// and the worst just under one; one late wake-up makes its tick's timers late by it. A real sleep wakes once per
    /// boundary.
    #[test]
    fn the_floor_is_the_rounding_and_the_late_wake_ups() {
        let (oversleeps, ms) = (vec![Duration::ZERO; 1000], Duration::from_millis);
        let mut sleeper = Sleeper {
            oversleeps,
            cpu_per_wake: None,
        };
        let floor = sleeper.storm_floor(TICK, 100_000);
        assert_eq!((floor.fired, floor.early), (100_000, 0));
        assert!(floor.max < TICK && floor.p99 > TICK * 98 / 100, "{floor:?}");
        assert!(
            floor.p50 > TICK * 45 / 100 && floor.p50 < TICK * 55 / 100,
            "{floor:?}"
        );
        sleeper.oversleeps[500] = ms(3);
        let floor = sleeper.storm_floor(TICK, 100_000);
        assert!(floor.max >= ms(3) && floor.max < ms(4), "{floor:?}");
        assert_eq!(sleeper.oversleep_summary().max, ms(3));
        assert_eq!(super::sleep_through(TICK, ms(20)).oversleeps.len(), 20);
    }
}
