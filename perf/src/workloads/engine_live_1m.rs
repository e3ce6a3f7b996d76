//! engine-live-1m: a million live timers on corewheel's `TimerEngine`, with tokio's `sleep`
//! as the peer. One application thread arms them (delays uniform in 1 ms..30 s), the
//! process's resident memory is read with all of them live, then they are cancelled in a
//! random order and the memory read again.
//!
//! The engine: `engine.schedule(delay, closure)` from one thread of a process whose engine
//! has one pinned worker per CPU; the handles are kept in a vector. tokio: one task of a
//! multi-thread runtime with one worker per CPU holds a `Vec<Pin<Box<Sleep>>>`, each Sleep
//! polled once with the task's waker (registered), and drops them to cancel. A Sleep lives
//! inside its task's future in real code, which is on the heap too; here the box stands in
//! for that allocation.
//!
//! Each run is a fresh child process (see `child.rs`), so RSS deltas are the subject's own.

use std::hint::black_box;
use std::pin::Pin;
use std::time::{Duration, Instant};

use corewheel::TimerHandle;
use tokio::time::Sleep;

use crate::allocator;
use crate::cpu_time::{cpu_between, process_cpu_time};
use crate::peers::Subject;
use crate::peers::engine::{self, on_timeout};
use crate::peers::tokio_sleep::{self, register};
use crate::repeat::{self, spread};
use crate::report::{Csv, RATIO_LEGEND, Table, mib, thousands};
use crate::rng::XorShift64;
use crate::rss;
use crate::workloads::live_runs::{self, Readings};
use crate::workloads::{ns_per, request_timeout};

pub const NAME: &str = "engine-live-1m";

/// How often, and for how long at most, to look whether the engine's workers have finished
/// filing what the application thread sent them.
const IDLE_INTERVAL: Duration = Duration::from_millis(5);
const IDLE_LIMIT: Duration = Duration::from_secs(5);

/// What one run measured. Times are ns per timer; bytes are absolute; `None` where the
/// platform or the subject has no such reading.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineLiveResult {
    /// The application thread's wall time per schedule / registration.
    pub ns_per_insert: f64,
    /// The application thread's wall time per cancel / drop.
    pub ns_per_cancel: f64,
    /// Process CPU per timer from the first insert until the workers had filed them all.
    pub cpu_insert: Option<f64>,
    /// Process CPU per timer from the first cancel until the engine had settled.
    pub cpu_cancel: Option<f64>,
    /// The engine's workers' CPU per timer over the same two spans.
    pub worker_insert: Option<f64>,
    pub worker_cancel: Option<f64>,
    /// After the last cancel, until the engine was seen settled, in ns (not per timer).
    pub settle_ns: Option<f64>,
    /// Timers that fired before their cancel.
    pub fired: f64,
    pub rss_before: Option<f64>,
    pub rss_live: Option<f64>,
    pub rss_cancelled: Option<f64>,
    /// After the engine or the runtime was dropped.
    pub rss_dropped: Option<f64>,
    pub huge_live: Option<f64>,
    /// The engine's own count of its pool's bytes with every timer live, and after the
    /// cancels.
    pub own_live: Option<f64>,
    pub own_cancelled: Option<f64>,
}

impl Readings for EngineLiveResult {
    const FIELDS: &'static [&'static str] = &[
        "ns_per_insert",
        "ns_per_cancel",
        "cpu_insert",
        "cpu_cancel",
        "worker_insert",
        "worker_cancel",
        "settle_ns",
        "fired",
        "rss_before",
        "rss_live",
        "rss_cancelled",
        "rss_dropped",
        "huge_live",
        "own_live",
        "own_cancelled",
    ];

    fn values(&self) -> Vec<Option<f64>> {
        vec![
            Some(self.ns_per_insert),
            Some(self.ns_per_cancel),
            self.cpu_insert,
            self.cpu_cancel,
            self.worker_insert,
            self.worker_cancel,
            self.settle_ns,
            Some(self.fired),
            self.rss_before,
            self.rss_live,
            self.rss_cancelled,
            self.rss_dropped,
            self.huge_live,
            self.own_live,
            self.own_cancelled,
        ]
    }

    fn from_values(v: &[Option<f64>]) -> Result<Self, String> {
        let at = |i: usize| v.get(i).copied().flatten();
        Ok(Self {
            ns_per_insert: live_runs::required::<Self>(v, 0)?,
            ns_per_cancel: live_runs::required::<Self>(v, 1)?,
            cpu_insert: at(2),
            cpu_cancel: at(3),
            worker_insert: at(4),
            worker_cancel: at(5),
            settle_ns: at(6),
            fired: live_runs::required::<Self>(v, 7)?,
            rss_before: at(8),
            rss_live: at(9),
            rss_cancelled: at(10),
            rss_dropped: at(11),
            huge_live: at(12),
            own_live: at(13),
            own_cancelled: at(14),
        })
    }
}

impl EngineLiveResult {
    fn above_baseline(&self, reading: Option<f64>) -> Option<f64> {
        Some(reading? - self.rss_before?)
    }
}

fn cpu_per(span: Option<Duration>, timers: u64) -> Option<f64> {
    span.map(|span| ns_per(span, timers))
}

fn bytes(reading: Option<u64>) -> Option<f64> {
    reading.map(|bytes| bytes as f64)
}

/// Measures one subject in this process. The child process calls this.
pub fn measure_here(subject: Subject, timers: u64) -> Result<EngineLiveResult, String> {
    match subject {
        Subject::Engine => measure_engine(timers),
        Subject::TokioSleep => measure_tokio(timers),
        _ => Err(format!("{} is not an engine subject", subject.name())),
    }
}

fn measure_engine(timers: u64) -> Result<EngineLiveResult, String> {
    let n = usize::try_from(timers).map_err(|_| "too many timers for this machine")?;
    let engine = engine::build()?;
    let mut rng = XorShift64::new(XorShift64::SEED);
    let mut handles: Vec<TimerHandle> = live_runs::touched_vec(n);

    let rss_before = rss::resident_bytes();
    let cpu_start = process_cpu_time();
    let workers_start = engine::workers_cpu_time();
    let started = Instant::now();
    for i in 0..timers {
        let handle = engine
            .schedule(request_timeout(&mut rng), on_timeout(i))
            .map_err(|error| format!("schedule failed: {error}"))?;
        handles.push(handle);
    }
    let inserted = started.elapsed();
    // The workers file what the lanes forwarded on their own time; wait until they are done
    // before reading the memory, and count their CPU in the insert.
    let workers_filed = engine::wait_for_idle_workers(IDLE_INTERVAL, IDLE_LIMIT);
    let cpu_filed = process_cpu_time();
    let rss_live = rss::resident_bytes();
    let huge_live = rss::huge_page_bytes();
    let own_live = engine.stats().pool_bytes;

    rng.shuffle(&mut handles);
    let mut fired = 0u64;
    let cpu_cancel_start = process_cpu_time();
    let workers_cancel_start = engine::workers_cpu_time();
    let started = Instant::now();
    for &handle in &handles {
        if !black_box(engine.cancel(handle)) {
            fired += 1;
        }
    }
    let cancelled = started.elapsed();
    let settled = engine::settle(&engine)?;
    let (cpu_settled, workers_settled) = (settled.process_cpu, settled.workers_cpu);
    let stats = &settled.stats;
    engine::check_counts(stats, timers, timers - fired, fired)?;
    let rss_cancelled = rss::resident_bytes();
    let own_cancelled = engine.stats().pool_bytes;
    drop(engine);
    let rss_dropped = rss::resident_bytes();
    Ok(EngineLiveResult {
        ns_per_insert: ns_per(inserted, timers),
        ns_per_cancel: ns_per(cancelled, timers),
        cpu_insert: cpu_per(cpu_between(cpu_start, cpu_filed), timers),
        cpu_cancel: cpu_per(cpu_between(cpu_cancel_start, cpu_settled), timers),
        worker_insert: cpu_per(cpu_between(workers_start, workers_filed), timers),
        worker_cancel: cpu_per(cpu_between(workers_cancel_start, workers_settled), timers),
        settle_ns: Some(settled.waited.as_nanos() as f64),
        fired: fired as f64,
        rss_before: bytes(rss_before),
        rss_live: bytes(rss_live),
        rss_cancelled: bytes(rss_cancelled),
        rss_dropped: bytes(rss_dropped),
        huge_live: bytes(huge_live),
        own_live: Some(own_live as f64),
        own_cancelled: Some(own_cancelled as f64),
    })
}

fn measure_tokio(timers: u64) -> Result<EngineLiveResult, String> {
    let n = usize::try_from(timers).map_err(|_| "too many timers for this machine")?;
    let runtime = tokio_sleep::runtime(engine::cpus())?;
    let task = runtime.spawn(async move {
        let mut sleeps: Vec<Pin<Box<Sleep>>> = live_runs::touched_vec(n);
        let mut rng = XorShift64::new(XorShift64::SEED);
        let rss_before = rss::resident_bytes();
        let cpu_start = process_cpu_time();
        let (inserted, due_at_once) = tokio_sleep::with_context(|cx| {
            let mut due_at_once = 0u64;
            let started = Instant::now();
            for _ in 0..timers {
                let mut sleep = Box::pin(tokio::time::sleep(request_timeout(&mut rng)));
                due_at_once += u64::from(register(sleep.as_mut(), cx));
                sleeps.push(sleep);
            }
            (started.elapsed(), due_at_once)
        })
        .await;
        let cpu_inserted = process_cpu_time();
        let rss_live = rss::resident_bytes();
        let huge_live = rss::huge_page_bytes();

        rng.shuffle(&mut sleeps);
        let fired = due_at_once + sleeps.iter().filter(|sleep| sleep.is_elapsed()).count() as u64;
        let cpu_cancel_start = process_cpu_time();
        let started = Instant::now();
        for sleep in sleeps.drain(..) {
            drop(black_box(sleep));
        }
        let cancelled = started.elapsed();
        let cpu_cancelled = process_cpu_time();
        let rss_cancelled = rss::resident_bytes();
        EngineLiveResult {
            ns_per_insert: ns_per(inserted, timers),
            ns_per_cancel: ns_per(cancelled, timers),
            cpu_insert: cpu_per(cpu_between(cpu_start, cpu_inserted), timers),
            cpu_cancel: cpu_per(cpu_between(cpu_cancel_start, cpu_cancelled), timers),
            worker_insert: None,
            worker_cancel: None,
            settle_ns: None,
            fired: fired as f64,
            rss_before: bytes(rss_before),
            rss_live: bytes(rss_live),
            rss_cancelled: bytes(rss_cancelled),
            rss_dropped: None,
            huge_live: bytes(huge_live),
            own_live: None,
            own_cancelled: None,
        }
    });
    let mut result = runtime
        .block_on(task)
        .map_err(|error| format!("the task failed: {error}"))?;
    drop(runtime);
    result.rss_dropped = bytes(rss::resident_bytes());
    Ok(result)
}

pub fn run(subjects: &[Subject], timers: u64, csv: &mut Csv) {
    // RSS from a process another subject ran in first says little here: child or nothing.
    let (runs, _) = live_runs::in_children(NAME, subjects, timers, live_runs::decode, None);
    let results: Vec<Result<EngineLiveResult, String>> = runs
        .iter()
        .map(|runs| match runs {
            Ok(runs) => live_runs::median_of(runs),
            Err(error) => Err(error.clone()),
        })
        .collect();
    speed_table(subjects, &runs, &results, timers, csv).print();
    memory_table(subjects, &results, timers, csv).print();
}

fn ratio(peer: Option<f64>, this: f64) -> String {
    match peer {
        Some(peer) if this > 0.0 => format!("{:.2}x", peer / this),
        _ => "n/a".to_string(),
    }
}

fn speed_table(
    subjects: &[Subject],
    runs: &[Result<Vec<EngineLiveResult>, String>],
    results: &[Result<EngineLiveResult, String>],
    timers: u64,
    csv: &mut Csv,
) -> Table {
    let tokio = subjects
        .iter()
        .position(|&s| s == Subject::TokioSleep)
        .and_then(|t| results[t].as_ref().ok());
    let mut table = Table::new(
        format!(
            "{NAME} (1 application thread, {} timers, delays uniform in 1 ms..30 s)",
            thousands(timers)
        ),
        &[
            "subject",
            "ns/insert",
            "Minserts/s",
            "ns/cancel",
            "Mcancels/s",
            "CPU ns/insert",
            "CPU ns/cancel",
            "worker CPU ins / cxl",
            "settle ms",
            "vs tokio-sleep (ins / cxl)",
            "CPU vs tokio-sleep (ins / cxl)",
        ],
    );
    let show = |value: Option<f64>| value.map_or_else(|| "n/a".to_string(), |v| format!("{v:.1}"));
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
        let is_tokio = *subject == Subject::TokioSleep;
        let both = |a: String, b: String| {
            if is_tokio {
                "-".to_string()
            } else {
                format!("{a} / {b}")
            }
        };
        table.row(vec![
            name.to_string(),
            format!("{:.1}", live.ns_per_insert),
            format!("{:.2}", 1e3 / live.ns_per_insert),
            format!("{:.1}", live.ns_per_cancel),
            format!("{:.2}", 1e3 / live.ns_per_cancel),
            show(live.cpu_insert),
            show(live.cpu_cancel),
            match (live.worker_insert, live.worker_cancel) {
                (Some(i), Some(c)) => format!("{i:.1} / {c:.1}"),
                _ => "n/a".to_string(),
            },
            live.settle_ns
                .map_or_else(|| "n/a".to_string(), |ns| format!("{:.2}", ns / 1e6)),
            both(
                ratio(tokio.map(|t| t.ns_per_insert), live.ns_per_insert),
                ratio(tokio.map(|t| t.ns_per_cancel), live.ns_per_cancel),
            ),
            both(
                ratio(
                    tokio.and_then(|t| t.cpu_insert),
                    live.cpu_insert.unwrap_or(0.0),
                ),
                ratio(
                    tokio.and_then(|t| t.cpu_cancel),
                    live.cpu_cancel.unwrap_or(0.0),
                ),
            ),
        ]);
        if let Ok(runs) = &runs[row] {
            spreads.push(format!(
                "{name} {} / {}",
                spread(runs.iter().map(|run| run.ns_per_insert)),
                spread(runs.iter().map(|run| run.ns_per_cancel))
            ));
        }
        if live.fired > 0.0 {
            table.note(format!(
                "{name}: {} timers (median run) came due and fired before their cancel",
                thousands(live.fired as u64)
            ));
        }
        let mut metrics = vec![
            ("ns_per_insert", live.ns_per_insert, "ns"),
            ("ns_per_cancel", live.ns_per_cancel, "ns"),
            ("fired_before_cancel", live.fired, "count"),
        ];
        let optional = [
            ("cpu_ns_per_insert", live.cpu_insert, "ns"),
            ("cpu_ns_per_cancel", live.cpu_cancel, "ns"),
            ("worker_cpu_ns_per_insert", live.worker_insert, "ns"),
            ("worker_cpu_ns_per_cancel", live.worker_cancel, "ns"),
            ("settle_wait", live.settle_ns.map(|ns| ns / 1e3), "us"),
        ];
        metrics.extend(
            optional
                .into_iter()
                .filter_map(|(metric, value, unit)| Some((metric, value?, unit))),
        );
        if let (Some(t), false) = (tokio, is_tokio) {
            metrics.push((
                "vs_tokio_sleep_insert",
                t.ns_per_insert / live.ns_per_insert,
                "x",
            ));
            metrics.push((
                "vs_tokio_sleep_cancel",
                t.ns_per_cancel / live.ns_per_cancel,
                "x",
            ));
        }
        csv.push_metrics(NAME, name, timers, &metrics);
    }
    table.note(format!(
        "median of {} runs per subject, taken in turns, each in a fresh process; ns/insert / ns/cancel range: {}",
        repeat::RUNS,
        spreads.join(", ")
    ));
    table.note("ns/insert, ns/cancel: the application thread's wall time per engine.schedule / per registration of a boxed Sleep; per engine.cancel (random order) / per drop of a Sleep");
    table.note("CPU: process CPU time (every thread) per timer, from the first insert until the engine's workers went idle (they file what the lanes forward), and from the first cancel until the engine settled (every node free); worker CPU: the engine's workers alone");
    table.note(format!(
        "engine: {} pinned workers; tokio-sleep: a runtime of as many workers, the timers registered by one task",
        engine::cpus()
    ));
    table.note(format!("{RATIO_LEGEND}; insert ratio / cancel ratio"));
    table
}

fn memory_table(
    subjects: &[Subject],
    results: &[Result<EngineLiveResult, String>],
    timers: u64,
    csv: &mut Csv,
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
            "dropped MiB",
            "vs tokio-sleep",
        ],
    );
    let tokio_bytes = subjects
        .iter()
        .position(|&s| s == Subject::TokioSleep)
        .and_then(|t| results[t].as_ref().ok())
        .and_then(|live| live.above_baseline(live.rss_live));
    let show = |value: Option<String>| value.unwrap_or_else(|| "n/a".to_string());
    for (subject, result) in subjects.iter().zip(results) {
        let Ok(live) = result else {
            table.row(vec![subject.name().to_string(), "error".to_string()]);
            continue;
        };
        let per_timer = live
            .above_baseline(live.rss_live)
            .map(|bytes| bytes / timers.max(1) as f64);
        let own_per_timer = live.own_live.map(|bytes| bytes / timers.max(1) as f64);
        table.row(vec![
            subject.name().to_string(),
            show(per_timer.map(|b| format!("{b:.1}"))),
            show(own_per_timer.map(|b| format!("{b:.1}"))),
            show(live.above_baseline(live.rss_live).map(|b| mib(b as i64))),
            show(
                live.huge_live
                    .zip(live.rss_live)
                    .map(|(huge, rss)| format!("{:.0}%", huge / rss.max(1.0) * 100.0)),
            ),
            show(
                live.above_baseline(live.rss_cancelled)
                    .map(|b| mib(b as i64)),
            ),
            show(live.own_cancelled.map(|b| mib(b as i64))),
            show(live.above_baseline(live.rss_dropped).map(|b| mib(b as i64))),
            if *subject == Subject::TokioSleep {
                "-".to_string()
            } else {
                match (tokio_bytes, live.above_baseline(live.rss_live)) {
                    (Some(peer), Some(this)) if this > 0.0 => format!("{:.2}x", peer / this),
                    _ => "n/a".to_string(),
                }
            },
        ]);
        let metrics = [
            ("bytes_per_timer_rss", per_timer, "B"),
            ("bytes_per_timer_own_count", own_per_timer, "B"),
            (
                "rss_live_above_baseline",
                live.above_baseline(live.rss_live),
                "B",
            ),
            (
                "rss_cancelled_above_baseline",
                live.above_baseline(live.rss_cancelled),
                "B",
            ),
            (
                "rss_dropped_above_baseline",
                live.above_baseline(live.rss_dropped),
                "B",
            ),
            ("own_count_cancelled", live.own_cancelled, "B"),
        ];
        let metrics: Vec<(&'static str, f64, &'static str)> = metrics
            .into_iter()
            .filter_map(|(metric, value, unit)| Some((metric, value?, unit)))
            .collect();
        csv.push_metrics(NAME, subject.name(), timers, &metrics);
    }
    table.note("each run was a fresh child process; RSS includes allocator slack, growth copies and retention; the vector of handles / boxes is the harness's and is touched before the first reading");
    table.note(format!(
        "tokio-sleep: each Sleep is boxed ({} bytes of Sleep in a {}-byte-aligned box), as it would sit inside a heap-allocated task",
        std::mem::size_of::<Sleep>(),
        std::mem::align_of::<Sleep>()
    ));
    table.note("engine own count: stats().pool_bytes, the nodes' memory (the workers' wheels are not in it); pools keep their nodes while the engine lives, so it does not drop after the cancels");
    table.note("dropped: after the engine (or the runtime) was dropped; vs tokio-sleep: tokio's live MiB / this row's");
    if allocator::is_mimalloc() {
        table.note("mimalloc keeps freed pages for reuse and returns them lazily, so RSS after cancelling or dropping says more about the allocator than the structure");
    }
    table
}

#[cfg(test)]
mod tests {
    use super::{EngineLiveResult, live_runs};

    #[test]
    fn encode_then_decode_is_identity() {
        let result = EngineLiveResult {
            ns_per_insert: 12.5,
            ns_per_cancel: 7.25,
            cpu_insert: Some(20.0),
            cpu_cancel: None,
            worker_insert: Some(3.5),
            worker_cancel: None,
            settle_ns: Some(1e6),
            fired: 42.0,
            rss_before: Some(1e6),
            rss_live: Some(5e7),
            rss_cancelled: None,
            rss_dropped: Some(2e6),
            huge_live: None,
            own_live: Some(4e7),
            own_cancelled: Some(4e7),
        };
        assert_eq!(live_runs::decode(&live_runs::encode(&result)), Ok(result));
        assert!(live_runs::decode::<EngineLiveResult>("ns_per_insert x\n").is_err());
    }
}
