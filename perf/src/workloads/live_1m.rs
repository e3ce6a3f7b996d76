//! live-1m: a million live timers. Inserts them (delays uniform in 1 ms..30 s), measures
//! what they cost in resident memory, then cancels them all in a random order and measures
//! what memory comes back. Each run is a fresh child process (see `live_runs`).

use std::hint::black_box;
use std::time::Instant;

use crate::peers::{Measure, Subject, TimerQueue, measure_fresh};
use crate::report::{Col, Sheet, thousands};
use crate::runner::Plan;
use crate::sys;
use crate::workloads::live_runs::{self, Readings};
use crate::workloads::{Out, ns_per, request_timeout, rng};

struct Live1m {
    timers: u64,
}

impl Measure<u64> for Live1m {
    type Output = Readings;

    fn measure<Q: TimerQueue<u64>>(self, queue: &mut Q) -> Result<Readings, String> {
        let n = usize::try_from(self.timers).map_err(|_| "too many timers for this machine")?;
        let mut rng = rng(0);
        let mut keys: Vec<Q::Key> = live_runs::touched_vec(n);
        let mut r = Readings::default();
        let bytes = |b: Option<u64>| b.map(|b| b as f64);
        let own = |queue: &Q| queue.accounted_bytes().map(|b| b as f64);

        r.set("rss_before", bytes(sys::resident_bytes()));
        let base = Instant::now();
        let started = Instant::now();
        for i in 0..self.timers {
            keys.push(queue.arm(base + request_timeout(&mut rng), i));
            if i == 0 {
                queue.settle()?;
            }
        }
        r.set("ns_per_insert", Some(ns_per(started.elapsed(), self.timers)));
        r.set("rss_live", bytes(sys::resident_bytes()));
        r.set("own_live", own(queue));
        r.set("huge_live", bytes(sys::huge_page_bytes()));

        rng.shuffle(&mut keys);
        let started = Instant::now();
        let missing = keys.iter().filter(|&&key| black_box(queue.cancel(key)).is_none()).count();
        r.set("ns_per_cancel", Some(ns_per(started.elapsed(), self.timers)));
        r.set("rss_cancelled", bytes(sys::resident_bytes()));
        r.set("own_cancelled", own(queue));
        if queue.release_spare_memory() {
            r.set("rss_shrunk", bytes(sys::resident_bytes()));
        }
        if missing > 0 {
            return Err(format!("{missing} cancels found no timer"));
        }
        Ok(r)
    }
}

/// Measures one subject in this process: what the child process runs.
pub fn measure_here(subject: Subject, timers: u64) -> Result<Readings, String> {
    measure_fresh(subject, Live1m { timers })
}

/// MiB from bytes.
pub fn mib(bytes: Option<f64>) -> Option<f64> {
    bytes.map(|b| b / (1024.0 * 1024.0))
}

/// The memory columns both live-1m workloads show, and each row's figures for them.
pub fn memory_cols(last: (&'static str, &'static str)) -> Vec<Col> {
    vec![
        Col::new("B/timer RSS", "bytes_per_timer_rss", "B", 1).ratios(),
        Col::new("B/timer own count", "bytes_per_timer_own_count", "B", 1),
        Col::new("live MiB", "rss_live_above_baseline", "MiB", 1),
        Col::new("on huge pages %", "huge_page_share_live", "%", 0),
        Col::new("cancelled MiB", "rss_cancelled_above_baseline", "MiB", 1),
        Col::new("own count cancelled MiB", "own_count_cancelled", "MiB", 1),
        Col::new(format!("{} MiB", last.0), last.1, "MiB", 1),
    ]
}

/// A row of [`memory_cols`]: `last` names the final RSS reading.
pub fn memory_row(r: &Readings, timers: u64, last: &str) -> Vec<Option<f64>> {
    let per_timer = |b: Option<f64>| b.map(|b| b / timers.max(1) as f64);
    vec![
        per_timer(r.above("rss_live", "rss_before")),
        per_timer(r.get("own_live")),
        mib(r.above("rss_live", "rss_before")),
        r.get("huge_live").zip(r.get("rss_live")).map(|(h, l)| h / l.max(1.0) * 100.0),
        mib(r.above("rss_cancelled", "rss_before")),
        mib(r.get("own_cancelled")),
        mib(r.above(last, "rss_before")),
    ]
}

/// Runs `plan`'s subjects, each run in a fresh process, and prints the speed and memory
/// tables.
pub fn run(plan: &Plan, timers: u64, out: &mut Out) {
    let name = plan.workload.name();
    let results = live_runs::in_children(plan, timers, ["ns_per_insert", "ns_per_cancel"]);
    let cols = vec![
        Col::new("ns/insert", "ns_per_insert", "ns", 1).ratios(),
        Col::new("Minserts/s", "minserts_per_s", "M/s", 2).rate(),
        Col::new("ns/cancel", "ns_per_cancel", "ns", 1).ratios(),
        Col::new("Mcancels/s", "mcancels_per_s", "M/s", 2).rate(),
    ];
    let mut speed =
        Sheet::new(name, format!("{name} (1 thread, {} timers)", thousands(timers)), timers, cols);
    let mut memory = Sheet::new(
        name,
        format!(
            "{name} memory (process RSS with mimalloc; MiB above the RSS just before the first insert)"
        ),
        timers,
        memory_cols(("shrunk", "rss_shrunk_above_baseline")),
    );
    let mut spreads = Vec::new();
    for (cell, result) in plan.cells.iter().zip(&results) {
        let speeds = result.as_ref().map(|(r, range)| {
            spreads.push(format!("{} {range}", cell.subject.name()));
            let (insert, cancel) = (r.get("ns_per_insert"), r.get("ns_per_cancel"));
            vec![insert, insert.map(|ns| 1e3 / ns), cancel, cancel.map(|ns| 1e3 / ns)]
        });
        speed.add(cell.subject, 1, false, speeds.map_err(Clone::clone));
        let memories = result.as_ref().map(|(r, _)| memory_row(r, timers, "rss_shrunk"));
        memory.add(cell.subject, 1, false, memories.map_err(Clone::clone));
    }
    speed.note(format!(
        "median of {} runs per subject, taken in turns, each in a fresh process; ns/insert / ns/cancel range: {}",
        plan.runs,
        spreads.join(", ")
    ));
    speed.note("insert: delay uniform in 1 ms..30 s, no capacity hint, into a fresh process (first-touch page faults included); cancel: every timer, in a random permutation; nothing fires");
    speed.finish(&mut out.csv);
    memory.note("each run was a fresh child process, so no subject reuses pages another freed; RSS includes allocator slack, growth copies and retention");
    memory.note("own count: the structure's own tally of its buffers (corewheel allocated_bytes(), the heap's vector capacities; DelayQueue has none); shrunk: after corewheel / DelayQueue shrink_to_fit()");
    memory.note("on huge pages: share of the process's RSS on transparent huge pages with every timer live; the kernel decides it, and it moves cache-missing costs");
    memory.note("binary-heap: cancel is a tombstone write and the memory is not returned; mimalloc keeps freed pages for reuse, so where 'cancelled MiB' stays high while the own count drops, the allocator holds the memory, not the structure");
    memory.finish(&mut out.csv);
}
