//! engine-live-1m: a million live timers on corewheel's `TimerEngine`, with tokio's `sleep`
//! as the peer. One application thread arms them (delays uniform in 1 ms..30 s), the
//! process's resident memory is read with all of them live, then they are cancelled in a
//! random order and the memory read again.
//!
//! The engine: `engine.schedule(delay, closure)` from one thread of a process whose engine
//! has one pinned worker per CPU; the handles are kept in a vector. tokio: one task of a
//! multi-thread runtime with one worker per CPU holds a `Vec<Pin<Box<Sleep>>>`, each Sleep
//! polled once with the task's waker (registered), and drops them to cancel: a Sleep lives
//! inside its task's future in real code, which is on the heap too. Each run is a fresh
//! child process (see `live_runs`), so RSS deltas are the subject's own.

use std::hint::black_box;
use std::pin::Pin;
use std::time::{Duration, Instant};

use corewheel::TimerHandle;
use tokio::time::Sleep;

use crate::peers::Subject;
use crate::peers::engine::{self, on_timeout};
use crate::peers::tokio_sleep::{self, register};
use crate::report::{Col, Sheet, thousands};
use crate::runner::Plan;
use crate::sys::{self, cpu_between, process_cpu_time};
use crate::workloads::live_1m::{memory_cols, memory_row};
use crate::workloads::live_runs::{self, Readings};
use crate::workloads::{Out, ns_per, request_timeout, rng};

/// How often, and for how long at most, to look whether the engine's workers have finished
/// filing what the application thread sent them.
const IDLE_INTERVAL: Duration = Duration::from_millis(5);
const IDLE_LIMIT: Duration = Duration::from_secs(5);

fn cpu_per(span: Option<Duration>, timers: u64) -> Option<f64> {
    span.map(|span| ns_per(span, timers))
}

fn bytes(reading: Option<u64>) -> Option<f64> {
    reading.map(|bytes| bytes as f64)
}

/// Measures one subject in this process: what the child process runs.
pub fn measure_here(subject: Subject, timers: u64) -> Result<Readings, String> {
    match subject {
        Subject::Engine => measure_engine(timers),
        Subject::TokioSleep => measure_tokio(timers),
        _ => Err(format!("{} is not an engine-live-1m subject", subject.name())),
    }
}

fn measure_engine(timers: u64) -> Result<Readings, String> {
    let n = usize::try_from(timers).map_err(|_| "too many timers for this machine")?;
    let engine = engine::build()?;
    let mut rng = rng(0);
    let mut handles: Vec<TimerHandle> = live_runs::touched_vec(n);

    let rss_before = sys::resident_bytes();
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
    let rss_live = sys::resident_bytes();
    let huge_live = sys::huge_page_bytes();
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
    let rss_cancelled = sys::resident_bytes();
    let own_cancelled = engine.stats().pool_bytes;
    drop(engine);
    let rss_dropped = sys::resident_bytes();
    let mut r = Readings::default();
    r.set("ns_per_insert", Some(ns_per(inserted, timers)));
    r.set("ns_per_cancel", Some(ns_per(cancelled, timers)));
    r.set("cpu_insert", cpu_per(cpu_between(cpu_start, cpu_filed), timers));
    r.set("cpu_cancel", cpu_per(cpu_between(cpu_cancel_start, cpu_settled), timers));
    r.set("worker_insert", cpu_per(cpu_between(workers_start, workers_filed), timers));
    r.set("worker_cancel", cpu_per(cpu_between(workers_cancel_start, workers_settled), timers));
    r.set("settle_us", Some(settled.waited.as_secs_f64() * 1e6));
    r.set("fired", Some(fired as f64));
    for (name, value) in [
        ("rss_before", rss_before),
        ("rss_live", rss_live),
        ("rss_cancelled", rss_cancelled),
        ("rss_dropped", rss_dropped),
        ("huge_live", huge_live),
        ("own_live", Some(own_live as u64)),
        ("own_cancelled", Some(own_cancelled as u64)),
    ] {
        r.set(name, bytes(value));
    }
    Ok(r)
}

fn measure_tokio(timers: u64) -> Result<Readings, String> {
    let n = usize::try_from(timers).map_err(|_| "too many timers for this machine")?;
    let runtime = tokio_sleep::runtime(engine::cpus())?;
    let task = runtime.spawn(async move {
        let mut sleeps: Vec<Pin<Box<Sleep>>> = live_runs::touched_vec(n);
        let mut rng = rng(0);
        let rss_before = sys::resident_bytes();
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
        let rss_live = sys::resident_bytes();
        let huge_live = sys::huge_page_bytes();

        rng.shuffle(&mut sleeps);
        let fired = due_at_once + sleeps.iter().filter(|sleep| sleep.is_elapsed()).count() as u64;
        let cpu_cancel_start = process_cpu_time();
        let started = Instant::now();
        for sleep in sleeps.drain(..) {
            drop(black_box(sleep));
        }
        let cancelled = started.elapsed();
        let cpu_cancelled = process_cpu_time();
        let rss_cancelled = sys::resident_bytes();
        let mut r = Readings::default();
        r.set("ns_per_insert", Some(ns_per(inserted, timers)));
        r.set("ns_per_cancel", Some(ns_per(cancelled, timers)));
        r.set("cpu_insert", cpu_per(cpu_between(cpu_start, cpu_inserted), timers));
        r.set("cpu_cancel", cpu_per(cpu_between(cpu_cancel_start, cpu_cancelled), timers));
        r.set("fired", Some(fired as f64));
        for (name, value) in [
            ("rss_before", rss_before),
            ("rss_live", rss_live),
            ("rss_cancelled", rss_cancelled),
            ("huge_live", huge_live),
        ] {
            r.set(name, bytes(value));
        }
        r
    });
    let mut result = runtime.block_on(task).map_err(|error| format!("the task failed: {error}"))?;
    drop(runtime);
    result.set("rss_dropped", bytes(sys::resident_bytes()));
    Ok(result)
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
        Col::new("CPU ns/insert", "cpu_ns_per_insert", "ns", 1).ratios(),
        Col::new("CPU ns/cancel", "cpu_ns_per_cancel", "ns", 1).ratios(),
        Col::new("worker CPU ns/insert", "worker_cpu_ns_per_insert", "ns", 1),
        Col::new("worker CPU ns/cancel", "worker_cpu_ns_per_cancel", "ns", 1),
        Col::new("settle ms", "settle_wait", "ms", 2),
        Col::new("fired before cancel", "fired_before_cancel", "count", 0),
    ];
    let title = format!(
        "{name} (1 application thread, {} timers, delays uniform in 1 ms..30 s)",
        thousands(timers)
    );
    let mut speed = Sheet::new(name, title, timers, cols);
    let mut memory = Sheet::new(
        name,
        format!(
            "{name} memory (process RSS with mimalloc; MiB above the RSS just before the first insert)"
        ),
        timers,
        memory_cols(("dropped", "rss_dropped_above_baseline")),
    );
    let mut spreads = Vec::new();
    for (cell, result) in plan.cells.iter().zip(&results) {
        let speeds = result.as_ref().map(|(r, range)| {
            spreads.push(format!("{} {range}", cell.subject.name()));
            let (insert, cancel) = (r.get("ns_per_insert"), r.get("ns_per_cancel"));
            let per_s = |ns: Option<f64>| ns.map(|ns| 1e3 / ns);
            let settle = r.get("settle_us").map(|us| us / 1e3);
            let keys = ["cpu_insert", "cpu_cancel", "worker_insert", "worker_cancel"]
                .map(|key| r.get(key));
            let mut row = vec![insert, per_s(insert), cancel, per_s(cancel)];
            row.extend(keys);
            row.extend([settle, r.get("fired")]);
            row
        });
        speed.add(cell.subject, 1, false, speeds.map_err(Clone::clone));
        let memories = result.as_ref().map(|(r, _)| memory_row(r, timers, "rss_dropped"));
        memory.add(cell.subject, 1, false, memories.map_err(Clone::clone));
    }
    speed.note(format!(
        "median of {} runs per subject, taken in turns, each in a fresh process; ns/insert / ns/cancel range: {}",
        plan.runs,
        spreads.join(", ")
    ));
    speed.note("ns/insert, ns/cancel: the application thread's wall time per engine.schedule / per registration of a boxed Sleep; per engine.cancel (random order) / per drop of a Sleep");
    speed.note("CPU: process CPU time (every thread) per timer, from the first insert until the engine's workers went idle (they file what the lanes forward), and from the first cancel until the engine settled (every node free); worker CPU: the engine's workers alone");
    speed.note(format!(
        "engine: {} pinned workers; tokio-sleep: a runtime of as many workers, the timers registered by one task",
        engine::cpus()
    ));
    speed.finish(&mut out.csv);
    memory.note("each run was a fresh child process; RSS includes allocator slack, growth copies and retention; the vector of handles / boxes is the harness's and is touched before the first reading");
    memory.note(format!(
        "tokio-sleep: each Sleep is boxed ({} bytes of Sleep), as it would sit inside a heap-allocated task; engine own count: stats().pool_bytes, the nodes' memory, kept while the engine lives",
        std::mem::size_of::<Sleep>()
    ));
    memory.note("dropped: after the engine (or the runtime) was dropped; mimalloc keeps freed pages for reuse, so RSS after cancelling or dropping says more about the allocator than the structure");
    memory.finish(&mut out.csv);
}
