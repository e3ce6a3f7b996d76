//! live-1m: a million live timers. Inserts them (delays uniform in 1 ms..30 s), measures
//! what they cost in resident memory, then cancels them all in a random order and measures
//! what memory comes back.
//!
//! Each subject runs in a fresh child process (see `child.rs`): in one process, a subject
//! measured after another would reuse the pages the first one freed, and the allocator's
//! retention would decide the comparison.

use std::hint::black_box;
use std::time::Instant;

use crate::allocator;
use crate::peers::{Measure, Subject, TimerQueue, measure_fresh};
use crate::repeat::{self, spread};
use crate::report::{Csv, RATIO_LEGEND, Table, mib, ratio_cells, thousands};
use crate::rng::XorShift64;
use crate::rss;
use crate::workloads::live_runs::{self, Readings};
use crate::workloads::{ns_per, ratio_columns, request_timeout};

pub const NAME: &str = "live-1m";

/// What one subject's run measured. RSS readings are `None` where the OS has no `/proc`.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveResult {
    pub ns_per_insert: f64,
    pub ns_per_cancel: f64,
    pub rss_before: Option<u64>,
    pub rss_live: Option<u64>,
    pub rss_cancelled: Option<u64>,
    /// After the structure's own call to give memory back, where it has one.
    pub rss_shrunk: Option<u64>,
    /// The structure's own count of its heap bytes with every timer live.
    pub accounted_live: Option<u64>,
    /// How much of the process's anonymous memory sat on transparent huge pages with every
    /// timer live: the kernel's choice, and one that moves cache-missing costs a lot.
    pub huge_live: Option<u64>,
    /// The structure's own count after every timer was cancelled, before any shrink.
    pub accounted_cancelled: Option<u64>,
}

struct Live1m {
    timers: u64,
}

impl Measure<u64> for Live1m {
    type Output = LiveResult;

    fn measure<Q: TimerQueue<u64>>(self, queue: &mut Q) -> Result<LiveResult, String> {
        let n = usize::try_from(self.timers).map_err(|_| "too many timers for this machine")?;
        let mut rng = XorShift64::new(XorShift64::SEED);
        let mut keys: Vec<Q::Key> = live_runs::touched_vec(n);

        let rss_before = rss::resident_bytes();
        let base = Instant::now();
        let started = Instant::now();
        for i in 0..self.timers {
            keys.push(queue.arm(base + request_timeout(&mut rng), i));
            if i == 0 {
                queue.settle()?;
            }
        }
        let inserted = started.elapsed();
        let rss_live = rss::resident_bytes();
        let accounted_live = queue.accounted_bytes().map(|bytes| bytes as u64);
        let huge_live = rss::huge_page_bytes();

        rng.shuffle(&mut keys);
        let mut missing = 0u64;
        let started = Instant::now();
        for &key in &keys {
            if black_box(queue.cancel(key)).is_none() {
                missing += 1;
            }
        }
        let cancelled = started.elapsed();
        let rss_cancelled = rss::resident_bytes();
        let accounted_cancelled = queue.accounted_bytes().map(|bytes| bytes as u64);
        let rss_shrunk = if queue.release_spare_memory() {
            rss::resident_bytes()
        } else {
            None
        };
        if missing > 0 {
            return Err(format!("{missing} cancels found no timer"));
        }
        Ok(LiveResult {
            ns_per_insert: ns_per(inserted, self.timers),
            ns_per_cancel: ns_per(cancelled, self.timers),
            rss_before,
            rss_live,
            rss_cancelled,
            rss_shrunk,
            accounted_live,
            huge_live,
            accounted_cancelled,
        })
    }
}

/// Measures one subject in this process. The child process calls this.
pub fn measure_here(subject: Subject, timers: u64) -> Result<LiveResult, String> {
    measure_fresh(subject, Live1m { timers })
}

/// Bytes as a reading (exact below 2^53), and back.
fn reading(bytes: Option<u64>) -> Option<f64> {
    bytes.map(|bytes| bytes as f64)
}

fn bytes(reading: Option<f64>) -> Option<u64> {
    reading.map(|reading| reading as u64)
}

impl Readings for LiveResult {
    const FIELDS: &'static [&'static str] = &[
        "ns_per_insert",
        "ns_per_cancel",
        "rss_before",
        "rss_live",
        "rss_cancelled",
        "rss_shrunk",
        "accounted_live",
        "huge_live",
        "accounted_cancelled",
    ];

    fn values(&self) -> Vec<Option<f64>> {
        vec![
            Some(self.ns_per_insert),
            Some(self.ns_per_cancel),
            reading(self.rss_before),
            reading(self.rss_live),
            reading(self.rss_cancelled),
            reading(self.rss_shrunk),
            reading(self.accounted_live),
            reading(self.huge_live),
            reading(self.accounted_cancelled),
        ]
    }

    fn from_values(v: &[Option<f64>]) -> Result<Self, String> {
        let at = |i: usize| bytes(v.get(i).copied().flatten());
        Ok(Self {
            ns_per_insert: live_runs::required::<Self>(v, 0)?,
            ns_per_cancel: live_runs::required::<Self>(v, 1)?,
            rss_before: at(2),
            rss_live: at(3),
            rss_cancelled: at(4),
            rss_shrunk: at(5),
            accounted_live: at(6),
            huge_live: at(7),
            accounted_cancelled: at(8),
        })
    }
}

impl LiveResult {
    /// RSS above the reading taken just before the first insert.
    fn above_baseline(&self, reading: Option<u64>) -> Option<i64> {
        Some(reading? as i64 - self.rss_before? as i64)
    }

    fn rss_per_timer(&self, timers: u64) -> Option<f64> {
        Some(self.above_baseline(self.rss_live)? as f64 / timers.max(1) as f64)
    }

    /// The share of RSS on transparent huge pages with every timer live, 0 to 1.
    fn huge_share(&self) -> Option<f64> {
        Some(self.huge_live? as f64 / self.rss_live?.max(1) as f64)
    }
}

pub fn run(subjects: &[Subject], timers: u64, csv: &mut Csv) {
    let (runs, in_process) = live_runs::in_children(
        NAME,
        subjects,
        timers,
        live_runs::decode,
        Some(measure_here),
    );
    let results: Vec<Result<LiveResult, String>> = runs
        .iter()
        .map(|runs| match runs {
            Ok(runs) => live_runs::median_of(runs),
            Err(error) => Err(error.clone()),
        })
        .collect();

    for (subject, result) in subjects.iter().zip(&results) {
        if let Ok(live) = result {
            record_csv(subject.name(), live, timers, csv);
        }
    }
    speed_table(subjects, &runs, &results, timers).print();
    let mut memory = memory_table(subjects, &results, timers);
    for subject in in_process {
        memory.note(format!(
            "WARNING: {} ran in this process (no child could be started), so its RSS may include pages another subject freed",
            subject.name()
        ));
    }
    memory.print();
}

fn speed_table(
    subjects: &[Subject],
    runs: &[Result<Vec<LiveResult>, String>],
    results: &[Result<LiveResult, String>],
    timers: u64,
) -> Table {
    let cost = |field: fn(&LiveResult) -> f64| -> Vec<Option<f64>> {
        results
            .iter()
            .map(|result| result.as_ref().ok().map(field))
            .collect()
    };
    let insert_costs = cost(|live| live.ns_per_insert);
    let cancel_costs = cost(|live| live.ns_per_cancel);
    let columns = ratio_columns(subjects);
    let mut table = Table::new(
        format!("{NAME} (1 thread, {} timers)", thousands(timers)),
        &[
            "subject",
            "ns/insert",
            "Minserts/s",
            "ns/cancel",
            "Mcancels/s",
        ],
    );
    for &column in &columns {
        table.header_cell(format!("vs {} (ins / cxl)", subjects[column].name()));
    }
    let mut spreads = Vec::new();
    for (row, (subject, result)) in subjects.iter().zip(results).enumerate() {
        let name = subject.name();
        let live = match result {
            Ok(live) => live,
            Err(error) => {
                table.row(vec![name.to_string(), "error".to_string()]);
                table.note(format!("ERROR: {name}: {error}"));
                continue;
            }
        };
        let mut cells = vec![
            name.to_string(),
            format!("{:.1}", live.ns_per_insert),
            format!("{:.2}", 1e3 / live.ns_per_insert),
            format!("{:.1}", live.ns_per_cancel),
            format!("{:.2}", 1e3 / live.ns_per_cancel),
        ];
        let inserts = ratio_cells(&insert_costs, row, &columns);
        let cancels = ratio_cells(&cancel_costs, row, &columns);
        cells.extend(inserts.iter().zip(&cancels).map(|(insert, cancel)| {
            if insert == "-" {
                "-".to_string()
            } else {
                format!("{insert} / {cancel}")
            }
        }));
        table.row(cells);
        if let Ok(runs) = &runs[row] {
            spreads.push(format!(
                "{name} {} / {}",
                spread(runs.iter().map(|run| run.ns_per_insert)),
                spread(runs.iter().map(|run| run.ns_per_cancel))
            ));
        }
    }
    table.note(format!(
        "median of {} runs per subject, taken in turns, each in a fresh process; ns/insert / ns/cancel range: {}",
        repeat::RUNS,
        spreads.join(", ")
    ));
    table.note("insert: delay uniform in 1 ms..30 s, no capacity hint, into a fresh process (first-touch page faults included); cancel: every timer, in a random permutation; nothing fires");
    if !columns.is_empty() {
        table.note(format!("{RATIO_LEGEND}; insert ratio / cancel ratio"));
    }
    table
}

fn memory_table(
    subjects: &[Subject],
    results: &[Result<LiveResult, String>],
    timers: u64,
) -> Table {
    let mut table = Table::new(
        format!(
            "{NAME} memory (process RSS with allocator {}; MiB above the RSS just before the first insert)",
            allocator::short_name()
        ),
        &[
            "subject",
            "B/timer RSS",
            "B/timer own count",
            "live MiB",
            "on huge pages",
            "cancelled MiB",
            "own count cancelled MiB",
            "shrunk MiB",
        ],
    );
    let show = |value: Option<String>| value.unwrap_or_else(|| "n/a".to_string());
    for (subject, result) in subjects.iter().zip(results) {
        let Ok(live) = result else {
            table.row(vec![subject.name().to_string(), "error".to_string()]);
            continue;
        };
        table.row(vec![
            subject.name().to_string(),
            show(
                live.rss_per_timer(timers)
                    .map(|bytes| format!("{bytes:.1}")),
            ),
            show(
                live.accounted_live
                    .map(|bytes| format!("{:.1}", bytes as f64 / timers.max(1) as f64)),
            ),
            show(live.above_baseline(live.rss_live).map(mib)),
            show(
                live.huge_share()
                    .map(|share| format!("{:.0}%", share * 100.0)),
            ),
            show(live.above_baseline(live.rss_cancelled).map(mib)),
            show(live.accounted_cancelled.map(|bytes| mib(bytes as i64))),
            show(live.above_baseline(live.rss_shrunk).map(mib)),
        ]);
    }
    table.note("each run was a fresh child process, so no subject reuses pages another freed; RSS includes allocator slack, growth copies and retention");
    table.note("own count: the structure's own tally of its buffers (corewheel allocated_bytes(), the heap's vector capacities; DelayQueue has none)");
    table.note("on huge pages: share of the process's RSS on transparent huge pages with every timer live; the kernel decides it, and it moves cache-missing costs");
    table.note("shrunk: after corewheel shrink_to_fit() / DelayQueue shrink_to_fit()");
    if subjects.contains(&Subject::BinaryHeap) {
        table.note("binary-heap: cancel is a tombstone write and the memory is not returned (rebuilds keep the vectors' capacity); it has no shrink call here");
    }
    if allocator::is_mimalloc() {
        table.note("mimalloc keeps freed pages for reuse and returns them lazily: where 'cancelled MiB' stays high while the own count drops, the allocator holds the memory, not the structure");
    }
    table
}

fn record_csv(name: &str, live: &LiveResult, timers: u64, csv: &mut Csv) {
    let mut metrics = vec![
        ("ns_per_insert", live.ns_per_insert, "ns"),
        ("ns_per_cancel", live.ns_per_cancel, "ns"),
    ];
    let as_f64 = |bytes: Option<i64>| bytes.map(|bytes| bytes as f64);
    let optional = [
        ("bytes_per_timer_rss", live.rss_per_timer(timers), "B"),
        (
            "rss_live_above_baseline",
            as_f64(live.above_baseline(live.rss_live)),
            "B",
        ),
        (
            "rss_cancelled_above_baseline",
            as_f64(live.above_baseline(live.rss_cancelled)),
            "B",
        ),
        (
            "rss_shrunk_above_baseline",
            as_f64(live.above_baseline(live.rss_shrunk)),
            "B",
        ),
        (
            "bytes_per_timer_own_count",
            live.accounted_live
                .map(|bytes| bytes as f64 / timers.max(1) as f64),
            "B",
        ),
        (
            "own_count_cancelled",
            live.accounted_cancelled.map(|bytes| bytes as f64),
            "B",
        ),
        (
            "huge_page_share_live",
            live.huge_share().map(|share| share * 100.0),
            "%",
        ),
    ];
    metrics.extend(
        optional
            .into_iter()
            .filter_map(|(metric, value, unit)| Some((metric, value?, unit))),
    );
    csv.push_metrics(NAME, name, timers, &metrics);
}

#[cfg(test)]
mod tests {
    use super::{LiveResult, live_runs};

    #[test]
    fn encode_then_decode_is_identity() {
        let result = LiveResult {
            ns_per_insert: 12.5,
            ns_per_cancel: 7.25,
            rss_before: Some(1 << 20),
            rss_live: Some(50 << 20),
            rss_cancelled: Some(3 << 20),
            rss_shrunk: None,
            accounted_live: Some(40_000_000),
            huge_live: Some(20 << 20),
            accounted_cancelled: None,
        };
        assert_eq!(live_runs::decode(&live_runs::encode(&result)), Ok(result));
        assert!(live_runs::decode::<LiveResult>("ns_per_insert x\n").is_err());
    }
}
