//! Records when each timer fired against its deadline, and sums that up as percentiles.

use std::time::{Duration, Instant};

/// Lateness of every fired timer, in nanoseconds, and the early ones counted apart.
pub struct Lateness {
    samples: Vec<u64>,
    early: u64,
    last_fire: Option<Instant>,
}

/// What a fire-storm subject's lateness came to.
#[derive(Debug, Clone)]
pub struct LatenessSummary {
    pub fired: u64,
    /// Timers handed out before their deadline: a correctness failure.
    pub early: u64,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub last_fire: Option<Instant>,
    /// The lateness distribution, as (lateness in microseconds, share of timers at or
    /// below it), at every half percent and at 99.9%: what the lateness plot draws.
    pub cdf: Vec<(f64, f64)>,
}

impl Lateness {
    pub fn with_capacity(timers: usize) -> Self {
        // Fault the sample buffer in now: a page fault while draining (a 2 MiB huge page
        // takes milliseconds to clear on a fresh VM) would show up as the subject's lateness.
        // It takes writes: memory fresh from the OS is zero already, so `vec![0; n]` asks
        // for it zeroed and touches none of it.
        let mut samples = Vec::with_capacity(timers);
        samples.resize(timers, u64::MAX);
        std::hint::black_box(samples.as_mut_ptr());
        samples.clear();
        Self {
            samples,
            early: 0,
            last_fire: None,
        }
    }

    /// `decided_at` is the clock reading the structure was asked to fire up to (the `now`
    /// given to a poll), `fired_at` the moment the value reached the caller. Either one
    /// before the deadline is an early fire.
    #[inline]
    pub fn record(&mut self, deadline: Instant, decided_at: Instant, fired_at: Instant) {
        if decided_at < deadline || fired_at < deadline {
            self.early += 1;
        }
        let late = fired_at.saturating_duration_since(deadline);
        self.samples
            .push(u64::try_from(late.as_nanos()).unwrap_or(u64::MAX));
        self.last_fire = Some(self.last_fire.map_or(fired_at, |last| last.max(fired_at)));
    }

    /// Timers recorded.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Adds another record's timers to this one.
    pub fn absorb(&mut self, other: Lateness) {
        self.samples.extend_from_slice(&other.samples);
        self.early += other.early;
        self.last_fire = match (self.last_fire, other.last_fire) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }

    pub fn summarize(mut self) -> LatenessSummary {
        self.samples.sort_unstable();
        let percentile = |p: f64| -> Duration {
            if self.samples.is_empty() {
                return Duration::ZERO;
            }
            // Nearest rank: the smallest sample with at least p of the samples at or below.
            let rank = (p * self.samples.len() as f64).ceil() as usize;
            Duration::from_nanos(self.samples[rank.clamp(1, self.samples.len()) - 1])
        };
        let mut shares: Vec<f64> = (0..=200).map(|i| f64::from(i) / 200.0).collect();
        shares.push(0.999);
        shares.sort_by(f64::total_cmp);
        let cdf = if self.samples.is_empty() {
            Vec::new()
        } else {
            shares
                .into_iter()
                .map(|share| (percentile(share).as_secs_f64() * 1e6, share))
                .collect()
        };
        LatenessSummary {
            cdf,
            fired: self.samples.len() as u64,
            early: self.early,
            p50: percentile(0.50),
            p99: percentile(0.99),
            max: percentile(1.0),
            last_fire: self.last_fire,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Lateness;
    use std::time::{Duration, Instant};

    #[test]
    fn percentiles_and_early_fires() {
        let t0 = Instant::now();
        let us = Duration::from_micros;
        let mut lateness = Lateness::with_capacity(100);
        for i in 1..=100 {
            lateness.record(t0, t0 + us(i), t0 + us(i));
        }
        lateness.record(t0 + us(5), t0, t0 + us(6));
        let summary = lateness.summarize();
        assert_eq!(summary.fired, 101);
        assert_eq!(summary.early, 1);
        assert_eq!(summary.p50, us(50));
        assert_eq!(summary.max, us(100));
        let last = summary.cdf.last().copied();
        assert_eq!(
            last,
            Some((100.0, 1.0)),
            "the CDF ends at the largest lateness"
        );
        assert!(
            summary
                .cdf
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1)
        );
    }
}

/// Lateness recorded by a timer engine's callbacks, each on the worker thread that runs it,
/// in that thread's own buffer (an uncontended lock), so that recording adds no cross-core
/// traffic of its own. One engine run at a time: the records are process-wide.
pub mod worker_records {
    use std::cell::RefCell;
    use std::sync::{Arc, Mutex, PoisonError};
    use std::time::Instant;

    use super::Lateness;

    /// One worker thread's record of the timers it ran.
    type Record = Arc<Mutex<Lateness>>;

    /// Every worker thread's record, registered on its first fire.
    static RECORDS: Mutex<Vec<Record>> = Mutex::new(Vec::new());

    /// Records made before the run, sized for every timer, for workers to take on their
    /// first fire: growing one inside a callback would show up as lateness.
    static SPARE: Mutex<Vec<Record>> = Mutex::new(Vec::new());

    thread_local! {
        static RECORD: RefCell<Option<Record>> = const { RefCell::new(None) };
    }

    /// Before a run: clears the records and makes one per worker, each with room for
    /// `timers`.
    pub fn prepare(workers: usize, timers: usize) {
        RECORDS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        *SPARE.lock().unwrap_or_else(PoisonError::into_inner) = (0..workers)
            .map(|_| Arc::new(Mutex::new(Lateness::with_capacity(timers))))
            .collect();
    }

    /// Records one fire on the calling worker thread: the callback's whole work.
    pub fn record(deadline: Instant) {
        let fired_at = Instant::now();
        RECORD.with(|record| {
            let mut record = record.borrow_mut();
            let record = record.get_or_insert_with(|| {
                let spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner).pop();
                let fresh =
                    spare.unwrap_or_else(|| Arc::new(Mutex::new(Lateness::with_capacity(0))));
                RECORDS
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Arc::clone(&fresh));
                fresh
            });
            record
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .record(deadline, fired_at, fired_at);
        });
    }

    /// After a run whose engine has been dropped: every fire in one record, and how many
    /// each worker thread ran, most first.
    pub fn take(timers: usize) -> (Lateness, Vec<u64>) {
        SPARE.lock().unwrap_or_else(PoisonError::into_inner).clear();
        let records = std::mem::take(&mut *RECORDS.lock().unwrap_or_else(PoisonError::into_inner));
        let mut all = Lateness::with_capacity(timers);
        let mut per_worker = Vec::new();
        for record in records {
            let record = std::mem::replace(
                &mut *record.lock().unwrap_or_else(PoisonError::into_inner),
                Lateness::with_capacity(0),
            );
            per_worker.push(record.len() as u64);
            all.absorb(record);
        }
        per_worker.sort_unstable_by(|a, b| b.cmp(a));
        (all, per_worker)
    }
}
