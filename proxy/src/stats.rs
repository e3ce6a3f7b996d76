//! How late the proxy's own timeouts fired, as the proxy saw them: from the deadline to
//! the moment the task that waited on it ran. The tests and the load test read it to tell
//! the timer's lateness from the client's, and to count any timeout that fired early.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Width of one histogram bucket.
const BUCKET: Duration = Duration::from_micros(100);
/// Buckets: 0.1 ms wide up to 100 ms; later ones count in the last.
const BUCKETS: usize = 1_000;

/// The lateness of one kind of timeout, as a histogram of 0.1 ms buckets.
pub struct Lateness {
    buckets: Box<[AtomicU64]>,
    early: AtomicU64,
    max_us: AtomicU64,
}

/// A [`Lateness`] read at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatenessSummary {
    /// Timeouts that fired.
    pub count: u64,
    /// Of them, those that fired before their deadline: a timer bug if not 0.
    pub early: u64,
    /// Median lateness, to the 0.1 ms bucket's upper edge.
    pub p50_us: u64,
    /// 99th percentile lateness, to the 0.1 ms bucket's upper edge (100 ms at most).
    pub p99_us: u64,
    /// The largest lateness, exact.
    pub max_us: u64,
}

impl Default for Lateness {
    fn default() -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            early: AtomicU64::new(0),
            max_us: AtomicU64::new(0),
        }
    }
}

impl Lateness {
    /// A timeout due at `deadline` fired, seen at `now`.
    pub fn record(&self, deadline: Instant, now: Instant) {
        let Some(late) = now.checked_duration_since(deadline) else {
            self.early.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let index = ((late.as_micros() / BUCKET.as_micros()) as usize).min(BUCKETS - 1);
        self.buckets[index].fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    /// The figures so far.
    pub fn summary(&self) -> LatenessSummary {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|bucket| bucket.load(Ordering::Relaxed))
            .collect();
        let on_time: u64 = counts.iter().sum();
        let quantile = |q: f64| {
            let rank = ((on_time as f64) * q).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (index, count) in counts.iter().enumerate() {
                seen += count;
                if seen >= rank {
                    return (index as u64 + 1) * BUCKET.as_micros() as u64;
                }
            }
            0
        };
        let early = self.early.load(Ordering::Relaxed);
        let max_us = self.max_us.load(Ordering::Relaxed);
        // A bucket's upper edge can pass the largest value in it; the max is exact.
        let quantile = |q| {
            if on_time == 0 {
                0
            } else {
                quantile(q).min(max_us)
            }
        };
        LatenessSummary {
            count: on_time + early,
            early,
            p50_us: quantile(0.5),
            p99_us: quantile(0.99),
            max_us,
        }
    }
}

impl LatenessSummary {
    /// One line: `count early p50_us p99_us max_us`.
    pub fn to_line(self) -> String {
        format!(
            "{} {} {} {} {}",
            self.count, self.early, self.p50_us, self.p99_us, self.max_us
        )
    }

    /// Reads back [`LatenessSummary::to_line`].
    pub fn from_line(line: &str) -> Option<Self> {
        let mut numbers = line.split_whitespace().map(|n| n.parse::<u64>().ok());
        let mut next = || numbers.next().flatten();
        Some(Self {
            count: next()?,
            early: next()?,
            p50_us: next()?,
            p99_us: next()?,
            max_us: next()?,
        })
    }
}

/// The proxy's timeouts that fired, by kind.
#[derive(Default)]
pub struct Stats {
    /// Client connections closed by the idle timeout.
    pub idle_timeouts: Lateness,
    /// Upstream calls answered 504 at the request deadline.
    pub deadlines: Lateness,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_and_line() {
        let lateness = Lateness::default();
        let deadline = Instant::now();
        for us in [50, 150, 150, 250, 1_000_000] {
            lateness.record(deadline, deadline + Duration::from_micros(us));
        }
        lateness.record(deadline, deadline - Duration::from_micros(1));
        let summary = lateness.summary();
        assert_eq!(
            summary,
            LatenessSummary {
                count: 6,
                early: 1,
                p50_us: 200,
                p99_us: 100_000,
                max_us: 1_000_000
            }
        );
        assert_eq!(
            LatenessSummary::from_line(&summary.to_line()),
            Some(summary)
        );
        assert_eq!(LatenessSummary::from_line("1 2"), None);
    }
}
