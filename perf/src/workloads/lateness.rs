//! Records when each timer fired against its deadline, in an HDR histogram, and sums that up as percentiles.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// The largest lateness the histogram tells apart: anything later is recorded as this.
const MAX_LATE_NS: u64 = 120_000_000_000;

/// Lateness of every fired timer, and the early ones counted apart.
pub struct Lateness {
    histogram: Histogram<u64>,
    /// The worst lateness exactly, as the histogram keeps it only to three digits.
    max_ns: u64,
    early: u64,
    last_fire: Option<Instant>,
}

/// What a subject's lateness came to.
#[derive(Debug, Clone)]
pub struct LatenessSummary {
    pub fired: u64,
    /// Timers handed out before their deadline: a correctness failure.
    pub early: u64,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub last_fire: Option<Instant>,
    /// The lateness distribution, as (lateness in microseconds, share of timers at or below it), at every half
    /// percent and at 99.9%: what the lateness plot draws.
    pub cdf: Vec<(f64, f64)>,
}

impl Default for Lateness {
    /// An empty record, its histogram allocated in full now: a record made before a run never allocates while timers
    /// fire, where a page fault would show up as lateness.
    fn default() -> Self {
        let histogram =
            Histogram::new_with_bounds(1, MAX_LATE_NS, 3).expect("valid histogram bounds");
        Self {
            histogram,
            max_ns: 0,
            early: 0,
            last_fire: None,
        }
    }
}

impl Lateness {
    /// `decided_at` is the clock reading the structure was asked to fire up to (the `now` given to a poll),
    /// `fired_at` the moment the value reached the caller. Either one before the deadline is an early fire.
    #[inline]
    pub fn record(&mut self, deadline: Instant, decided_at: Instant, fired_at: Instant) {
        if decided_at < deadline || fired_at < deadline {
            self.early += 1;
        }
        let late = u64::try_from(fired_at.saturating_duration_since(deadline).as_nanos())
            .unwrap_or(u64::MAX);
        self.histogram.saturating_record(late);
        self.max_ns = self.max_ns.max(late);
        self.last_fire = Some(self.last_fire.map_or(fired_at, |last| last.max(fired_at)));
    }

    pub fn absorb(&mut self, other: &Lateness) {
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = self.histogram.add(&other.histogram);
        self.early += other.early;
        self.max_ns = self.max_ns.max(other.max_ns);
        self.last_fire = self.last_fire.max(other.last_fire);
    }

    pub fn summarize(self) -> LatenessSummary {
        let at = |q: f64| Duration::from_nanos(self.histogram.value_at_quantile(q));
        let shares = (0..=200).map(|i| f64::from(i) / 200.0);
        let mut shares: Vec<f64> = shares.chain([0.999]).collect();
        shares.sort_by(f64::total_cmp);
        let cdf = shares.into_iter().map(|q| (at(q).as_secs_f64() * 1e6, q));
        let cdf = cdf.filter(|_| !self.histogram.is_empty()).collect();
        LatenessSummary {
            cdf,
            fired: self.histogram.len(),
            early: self.early,
            p50: at(0.50),
            p99: at(0.99),
            max: Duration::from_nanos(self.max_ns),
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
        let (t0, us, mut lateness) = (Instant::now(), Duration::from_micros, Lateness::default());
        (1..=100).for_each(|i| lateness.record(t0, t0 + us(i), t0 + us(i)));
        lateness.record(t0 + us(5), t0, t0 + us(6));
        let summary = lateness.summarize();
        assert_eq!(
            (summary.fired, summary.early, summary.max),
            (101, 1, us(100))
        );
        // HDR histograms keep three significant digits.
        assert!(summary.p50.abs_diff(us(50)) <= us(1), "{:?}", summary.p50);
        assert_eq!(
            summary.cdf.last().map(|last| last.1),
            Some(1.0),
            "the CDF ends at every timer"
        );
        let rising = |w: &[(f64, f64)]| w[0].0 <= w[1].0 && w[0].1 <= w[1].1;
        assert!(summary.cdf.windows(2).all(rising));
    }
}

/// Lateness recorded by an engine's callbacks in their worker's own buffer, so that recording adds no cross-core
/// traffic. One engine run at a time: the records are process-wide.
pub mod worker_records {
    use std::cell::RefCell;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use super::Lateness;
    use crate::runner::lock;

    type Record = Arc<Mutex<Lateness>>;

    /// Every worker thread's record, registered on its first fire.
    static RECORDS: Mutex<Vec<Record>> = Mutex::new(Vec::new());

    /// Records made before the run, sized for every timer, for workers to take on their first fire: growing one
    /// inside a callback would show up as lateness.
    static SPARE: Mutex<Vec<Record>> = Mutex::new(Vec::new());

    thread_local! {
        static RECORD: RefCell<Option<Record>> = const { RefCell::new(None) };
    }

    pub fn prepare(workers: usize) {
        lock(&RECORDS).clear();
        *lock(&SPARE) = (0..workers).map(|_| Record::default()).collect();
    }

    /// Records one fire on the calling worker thread: the callback's whole work.
    pub fn record(deadline: Instant) {
        let fired_at = Instant::now();
        RECORD.with(|record| {
            let mut record = record.borrow_mut();
            let record = record.get_or_insert_with(|| {
                let fresh = lock(&SPARE).pop().unwrap_or_default();
                lock(&RECORDS).push(Arc::clone(&fresh));
                fresh
            });
            lock(record).record(deadline, fired_at, fired_at);
        });
    }

    /// After a run whose engine has been dropped: every fire in one record, and how many each worker thread ran, most
    /// first.
    pub fn take() -> (Lateness, Vec<u64>) {
        lock(&SPARE).clear();
        let (mut all, mut per_worker) = (Lateness::default(), Vec::new());
        for record in std::mem::take(&mut *lock(&RECORDS)) {
            let record = std::mem::take(&mut *lock(&record));
            per_worker.push(record.histogram.len());
            all.absorb(&record);
        }
        per_worker.sort_unstable_by(|a, b| b.cmp(a));
        (all, per_worker)
    }
}
