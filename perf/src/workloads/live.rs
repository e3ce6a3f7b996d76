//! live-1m and engine-live-1m: one thread inserts a million timers (delays uniform in 1 ms..30 s), RSS is read with
//! all of them live, then they are cancelled in a random order and RSS read again. live-1m drives the single-owner
//! structures; engine-live-1m the `TimerEngine` against tokio's `sleep` (boxed, as a Sleep in a task's future is).
//! Each run is a fresh child process, so that its RSS delta is its own; the child prints `name value` lines.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use tokio::time::Sleep;

use crate::peers::engine::{self, on_timeout};
use crate::peers::tokio_sleep::{self, register};
use crate::peers::{Measure, Subject, TimerQueue, measure_fresh};
use crate::report::{Col, Sheet, thousands};
use crate::runner::{self, Plan, median, spread};
use crate::sys::{self, cpu_between, process_cpu_time};
use crate::workloads::{Out, Workload, ns_per, request_timeout, rng};

/// Bytes in a MiB.
const MIB: f64 = 1024.0 * 1024.0;

/// Set in a child's environment to the measurement it is to make: `workload subject timers`.
pub const ENV: &str = "COREWHEEL_PERF_CHILD";

/// A run's readings by name; a reading the platform or the subject lacks is absent.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Readings(BTreeMap<String, f64>);

impl Readings {
    fn set(&mut self, name: &str, value: Option<f64>) {
        if let Some(value) = value {
            self.0.insert(name.to_string(), value);
        }
    }

    fn bytes(&mut self, name: &str, bytes: Option<u64>) {
        self.set(name, bytes.map(|b| b as f64));
    }

    /// Reading `name` as nanoseconds per timer, from a span over `timers`.
    fn per(&mut self, name: &str, span: Option<Duration>, timers: u64) {
        self.set(name, span.map(|span| ns_per(span, timers)));
    }

    fn get(&self, name: &str) -> Option<f64> {
        self.0.get(name).copied()
    }

    /// Reading `name` above the RSS before the first insert, in MiB.
    fn mib_above(&self, name: &str) -> Option<f64> {
        Some((self.get(name)? - self.get("rss_before")?) / MIB)
    }

    fn encode(&self) -> String {
        self.0.iter().map(|(n, v)| format!("{n} {v}\n")).collect()
    }

    fn decode(text: &str) -> Result<Self, String> {
        let mut readings = Self::default();
        for line in text.lines() {
            let value = line
                .split_once(' ')
                .and_then(|(name, v)| Some((name, v.parse().ok()?)));
            let (name, value) = value.ok_or_else(|| format!("the child printed {line:?}"))?;
            readings.0.insert(name.to_string(), value);
        }
        Ok(readings)
    }

    /// Each reading's median over runs (absent if any run lacks it).
    fn median_of(runs: &[Readings]) -> Self {
        let mut out = Self::default();
        for name in runs.first().into_iter().flat_map(|first| first.0.keys()) {
            let values: Option<Vec<f64>> = runs.iter().map(|run| run.get(name)).collect();
            out.set(name, values.map(median));
        }
        out
    }
}

/// A vector for `n` of the harness's own values, its pages touched so that later RSS deltas are the structure's.
fn touched_vec<T>(n: u64) -> Result<Vec<T>, String> {
    let n = usize::try_from(n).map_err(|_| "too many timers for this machine")?;
    let mut values: Vec<T> = Vec::with_capacity(n);
    values.spare_capacity_mut().fill_with(MaybeUninit::zeroed);
    black_box(values.as_mut_ptr());
    Ok(values)
}

/// live-1m's measurement, on any single-owner structure.
struct Live1m(u64);

impl Measure<u64> for Live1m {
    type Output = Readings;

    fn measure<Q: TimerQueue<u64>>(self, queue: &mut Q) -> Result<Readings, String> {
        let (timers, mut rng, mut r) = (self.0, rng(0), Readings::default());
        let mut keys: Vec<Q::Key> = touched_vec(timers)?;
        r.bytes("rss_before", sys::resident_bytes());
        let (base, started) = (Instant::now(), Instant::now());
        for i in 0..timers {
            keys.push(queue.arm(base + request_timeout(&mut rng), i));
            if i == 0 {
                queue.settle()?;
            }
        }
        r.per("ns_per_insert", Some(started.elapsed()), timers);
        r.bytes("rss_live", sys::resident_bytes());
        r.bytes("own_live", queue.accounted_bytes().map(|b| b as u64));
        r.bytes("huge_live", sys::huge_page_bytes());
        rng.shuffle(&mut keys);
        let started = Instant::now();
        let missing = keys
            .iter()
            .filter(|&&key| black_box(queue.cancel(key)).is_none());
        let missing = missing.count();
        r.per("ns_per_cancel", Some(started.elapsed()), timers);
        r.bytes("rss_cancelled", sys::resident_bytes());
        r.bytes("own_cancelled", queue.accounted_bytes().map(|b| b as u64));
        if queue.release_spare_memory() {
            r.bytes("rss_after", sys::resident_bytes());
        }
        match missing {
            0 => Ok(r),
            _ => Err(format!("{missing} cancels found no timer")),
        }
    }
}

/// The process's and the engine workers' CPU time, and the time, at the start of a timed part.
fn marks() -> (Option<Duration>, Option<Duration>, Instant) {
    (
        process_cpu_time(),
        engine::workers_cpu_time(),
        Instant::now(),
    )
}

/// engine-live-1m on the engine. Its workers file what the lanes forward on their own time, so the insert lasts until
/// they are quiet, and the cancel until the engine has settled.
fn measure_engine(timers: u64) -> Result<Readings, String> {
    let (engine, mut rng, mut r) = (engine::build(false)?, rng(0), Readings::default());
    let mut handles = touched_vec(timers)?;
    r.bytes("rss_before", sys::resident_bytes());
    let (cpu, workers, started) = marks();
    for i in 0..timers {
        let handle = engine.schedule(request_timeout(&mut rng), on_timeout(i));
        handles.push(handle.map_err(|error| format!("schedule failed: {error}"))?);
    }
    r.per("ns_per_insert", Some(started.elapsed()), timers);
    let (every, limit) = (Duration::from_millis(5), Duration::from_secs(5));
    let filed = sys::wait_until_quiet(engine::workers_cpu_time, every, limit);
    r.per("cpu_insert", cpu_between(cpu, process_cpu_time()), timers);
    r.per("worker_insert", cpu_between(workers, filed), timers);
    r.bytes("rss_live", sys::resident_bytes());
    r.bytes("huge_live", sys::huge_page_bytes());
    r.bytes("own_live", Some(engine.stats().pool_bytes as u64));
    rng.shuffle(&mut handles);
    let (cpu, workers, started) = marks();
    let fired = handles.iter().filter(|&&h| !black_box(engine.cancel(h)));
    let fired = fired.count() as u64;
    r.per("ns_per_cancel", Some(started.elapsed()), timers);
    let settled = engine::settle(&engine)?;
    engine::check_counts(&settled.stats, timers, timers - fired, fired)?;
    r.per("cpu_cancel", cpu_between(cpu, settled.process_cpu), timers);
    let workers_cpu = cpu_between(workers, settled.workers_cpu);
    r.per("worker_cancel", workers_cpu, timers);
    r.set("settle_ms", Some(settled.waited.as_secs_f64() * 1e3));
    r.set("fired", Some(fired as f64));
    r.bytes("rss_cancelled", sys::resident_bytes());
    r.bytes("own_cancelled", Some(engine.stats().pool_bytes as u64));
    drop(engine);
    r.bytes("rss_after", sys::resident_bytes());
    Ok(r)
}

/// engine-live-1m on tokio's `sleep`, from one task of a runtime of one worker per CPU.
fn measure_tokio(timers: u64) -> Result<Readings, String> {
    let runtime = tokio_sleep::runtime(engine::cpus())?;
    let task = runtime.spawn(async move {
        let (mut rng, mut r) = (rng(0), Readings::default());
        let mut sleeps: Vec<Pin<Box<Sleep>>> = touched_vec(timers)?;
        r.bytes("rss_before", sys::resident_bytes());
        let cpu = process_cpu_time();
        let due_at_once = tokio_sleep::with_context(|cx| {
            let (mut due_at_once, started) = (0u64, Instant::now());
            for _ in 0..timers {
                let mut sleep = Box::pin(tokio::time::sleep(request_timeout(&mut rng)));
                due_at_once += u64::from(register(sleep.as_mut(), cx));
                sleeps.push(sleep);
            }
            r.per("ns_per_insert", Some(started.elapsed()), timers);
            due_at_once
        })
        .await;
        r.per("cpu_insert", cpu_between(cpu, process_cpu_time()), timers);
        r.bytes("rss_live", sys::resident_bytes());
        r.bytes("huge_live", sys::huge_page_bytes());
        rng.shuffle(&mut sleeps);
        let fired = due_at_once + sleeps.iter().filter(|sleep| sleep.is_elapsed()).count() as u64;
        let (cpu, started) = (process_cpu_time(), Instant::now());
        sleeps.drain(..).for_each(|sleep| drop(black_box(sleep)));
        r.per("ns_per_cancel", Some(started.elapsed()), timers);
        r.per("cpu_cancel", cpu_between(cpu, process_cpu_time()), timers);
        r.set("fired", Some(fired as f64));
        r.bytes("rss_cancelled", sys::resident_bytes());
        Ok::<_, String>(r)
    });
    let task = runtime
        .block_on(task)
        .map_err(|error| format!("the task failed: {error}"));
    let mut r = task??;
    drop(runtime);
    r.bytes("rss_after", sys::resident_bytes());
    Ok(r)
}

/// The child's side: makes the measurement `spec` (`workload subject timers`) names and prints its readings.
pub fn child_main(spec: &str) -> ExitCode {
    let words: Vec<&str> = spec.split_whitespace().collect();
    let subject = |name: &str| Subject::ALL.iter().copied().find(|s| s.name() == name);
    let result = match words[..] {
        [workload, name, timers] => match (workload, subject(name), timers.parse::<u64>()) {
            ("live-1m", Some(subject), Ok(timers)) => measure_fresh(subject, Live1m(timers)),
            ("engine-live-1m", Some(Subject::Engine), Ok(timers)) => measure_engine(timers),
            ("engine-live-1m", Some(Subject::TokioSleep), Ok(timers)) => measure_tokio(timers),
            _ => Err(format!("{ENV}={spec:?} names no measurement")),
        },
        _ => Err(format!("{ENV}={spec:?} names no measurement")),
    };
    match result {
        Ok(readings) => print!("{}", readings.encode()),
        Err(error) => {
            eprintln!("corewheel-perf: {spec}: {error}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// One run of `subject` in a child process.
fn in_child(workload: Workload, subject: Subject, timers: u64) -> Result<Readings, String> {
    let exe = std::env::current_exe().map_err(|error| format!("no harness executable: {error}"))?;
    let spec = format!("{} {} {timers}", workload.name(), subject.name());
    let output = Command::new(exe)
        .env(ENV, spec)
        .stderr(Stdio::inherit())
        .output();
    let output = output.map_err(|error| format!("could not start a child process: {error}"))?;
    match output.status.success() {
        true => Readings::decode(&String::from_utf8_lossy(&output.stdout)),
        false => Err(format!("the child process failed ({})", output.status)),
    }
}

/// Runs `plan`'s subjects, each run in a fresh process, and prints the speed and memory tables.
pub fn run(plan: &Plan, timers: u64, out: &mut Out) {
    let name = plan.workload.name();
    let engine = plan.workload == Workload::EngineLive1m;
    let runs = runner::in_turns(plan, |cell| in_child(plan.workload, cell.subject, timers));
    let mut cols = vec![
        Col::new("ns/insert", "ns_per_insert", "ns", 1).ratios(),
        Col::new("Minserts/s", "minserts_per_s", "M/s", 2).rate(),
        Col::new("ns/cancel", "ns_per_cancel", "ns", 1).ratios(),
        Col::new("Mcancels/s", "mcancels_per_s", "M/s", 2).rate(),
    ];
    let extra = "cpu_insert cpu_cancel worker_insert worker_cancel settle_ms fired";
    if engine {
        cols.extend([
            Col::new("CPU ns/insert", "cpu_ns_per_insert", "ns", 1).ratios(),
            Col::new("CPU ns/cancel", "cpu_ns_per_cancel", "ns", 1).ratios(),
            Col::new("worker CPU ns/insert", "worker_cpu_ns_per_insert", "ns", 1),
            Col::new("worker CPU ns/cancel", "worker_cpu_ns_per_cancel", "ns", 1),
            Col::new("settle ms", "settle_wait", "ms", 2),
            Col::new("fired before cancel", "fired_before_cancel", "count", 0),
        ]);
    }
    let title = format!(
        "{name} (1 application thread, {} timers, delays uniform in 1 ms..30 s)",
        thousands(timers)
    );
    let mut speed = Sheet::new(name, title, timers, cols);
    let last = if engine { "dropped" } else { "shrunk" };
    let (last_header, last_metric) = (format!("{last} MiB"), format!("rss_{last}_above_baseline"));
    let memory_cols = vec![
        Col::new("B/timer RSS", "bytes_per_timer_rss", "B", 1).ratios(),
        Col::new("B/timer own count", "bytes_per_timer_own_count", "B", 1),
        Col::new("live MiB", "rss_live_above_baseline", "MiB", 1),
        Col::new("on huge pages %", "huge_page_share_live", "%", 0),
        Col::new("cancelled MiB", "rss_cancelled_above_baseline", "MiB", 1),
        Col::new("own count cancelled MiB", "own_count_cancelled", "MiB", 1),
        Col::new(last_header, last_metric, "MiB", 1),
    ];
    let title = format!(
        "{name} memory (process RSS with mimalloc; MiB above the RSS just before the first insert)"
    );
    let mut memory = Sheet::new(name, title, timers, memory_cols);
    let mut spreads = Vec::new();
    for (cell, runs) in plan.cells.iter().zip(runs) {
        let r = runs.map(|runs| {
            let range = |key: &str| spread(runs.iter().filter_map(|run| run.get(key)));
            let (insert, cancel) = (range("ns_per_insert"), range("ns_per_cancel"));
            spreads.push(format!("{} {insert} / {cancel}", cell.subject.name()));
            Readings::median_of(&runs)
        });
        let speeds = r.as_ref().map(|r| {
            let (insert, cancel) = (r.get("ns_per_insert"), r.get("ns_per_cancel"));
            let rate = |ns: Option<f64>| ns.map(|ns| 1e3 / ns);
            let mut row = vec![insert, rate(insert), cancel, rate(cancel)];
            row.extend(extra.split(' ').filter(|_| engine).map(|key| r.get(key)));
            row
        });
        speed.add(cell.subject, 1, speeds.map_err(Clone::clone));
        let memories = r.map(|r| {
            let per_timer = |bytes: Option<f64>| bytes.map(|b| b / timers.max(1) as f64);
            let (live, huge) = (r.mib_above("rss_live"), r.get("huge_live"));
            vec![
                per_timer(live.map(|m| m * MIB)),
                per_timer(r.get("own_live")),
                live,
                huge.zip(r.get("rss_live"))
                    .map(|(h, l)| h / l.max(1.0) * 100.0),
                r.mib_above("rss_cancelled"),
                r.get("own_cancelled").map(|b| b / MIB),
                r.mib_above("rss_after"),
            ]
        });
        memory.add(cell.subject, 1, memories);
    }
    let (runs, spreads) = (plan.runs, spreads.join(", "));
    speed.note(format!("median of {runs} runs per subject, taken in turns, each in a fresh process; ns/insert / ns/cancel range: {spreads}"));
    speed.note(match engine {
        false => "insert: delay uniform in 1 ms..30 s, no capacity hint, into a fresh process (first-touch page faults included); cancel: every timer, in a random permutation; nothing fires".to_string(),
        true => format!("ns/insert, ns/cancel: the application thread's wall time per engine.schedule / per registration of a boxed Sleep, per engine.cancel (random order) / per drop of a Sleep; CPU: process CPU time (every thread) per timer, from the first insert until the engine's {} pinned workers went idle (they file what the lanes forward), and from the first cancel until the engine settled; worker CPU: the engine's workers alone", engine::cpus()),
    });
    speed.finish(&mut out.csv);
    memory.note("RSS includes allocator slack, growth copies and retention; the harness's vector of keys, handles or boxes is touched before the first reading");
    memory.note("own count: the structure's own tally (corewheel allocated_bytes(), the heap's vector capacities, the engine's stats().pool_bytes, kept while it lives); on huge pages: share of RSS on transparent huge pages with every timer live, the kernel's choice");
    memory.note("shrunk: after corewheel / DelayQueue shrink_to_fit(); dropped: after the engine or the runtime was dropped; mimalloc keeps freed pages for reuse, so RSS after cancelling says more about the allocator than the structure");
    memory.finish(&mut out.csv);
}

#[cfg(test)]
mod tests {
    use super::Readings;

    #[test]
    fn readings_round_trip_and_take_medians() {
        let mut one = Readings::default();
        one.set("ns_per_insert", Some(12.5));
        one.bytes("rss_live", Some(52_428_800));
        one.set("missing", None);
        assert_eq!(Readings::decode(&one.encode()), Ok(one.clone()));
        assert!(Readings::decode("ns_per_insert x\n").is_err());
        let (mut two, mut three) = (one.clone(), one.clone());
        two.set("ns_per_insert", Some(10.5));
        three.set("ns_per_insert", Some(20.0));
        three.0.remove("rss_live");
        let median = Readings::median_of(&[one, two, three]);
        assert_eq!(
            (median.get("ns_per_insert"), median.get("rss_live")),
            (Some(12.5), None)
        );
    }
}
