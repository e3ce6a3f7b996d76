//! Runs of the multi-thread workloads: the same application work on T threads, for the engine on T plain threads
//! calling it, for tokio on T tasks of a T-worker runtime; timed from the moment all of them are ready to the moment
//! the work is done, the engine's deferred work included.

use std::future::Future;
use std::sync::{Arc, Barrier};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use corewheel::TimerEngine;

use crate::peers::engine;
use crate::peers::mutex_heap::SharedHeap;
use crate::peers::tokio_sleep::{self, StartLine};
use crate::report::{Col, Sheet, thousands};
use crate::runner::{self, Cell, Plan, median};
use crate::sys::{cpu_between, process_cpu_time};

/// What one application thread or task did: when its timed work ended, timers armed (prefill included), cancels that
/// stopped a timer, and timers too late: cancels or resets that found them fired, or already due when registered.
#[derive(Debug, Clone, Copy)]
pub struct Share {
    pub done: Instant,
    pub thread: ThreadId,
    pub scheduled: u64,
    pub cancelled: u64,
    pub too_late: u64,
}

impl Share {
    /// An empty share of the calling thread.
    pub fn new() -> Self {
        let (done, thread) = (Instant::now(), std::thread::current().id());
        let (scheduled, cancelled, too_late) = (0, 0, 0);
        Self {
            done,
            thread,
            scheduled,
            cancelled,
            too_late,
        }
    }
}

/// One timed run: `wall` to the end of the engine's settling, `app` to the last application thread's end; process
/// CPU and the subject's own threads' (engine workers, the heap's timer); the settle wait; the engine's pool at the end.
#[derive(Debug, Clone, Copy, Default)]
pub struct Run {
    pub wall: Duration,
    pub app: Duration,
    pub cpu: Option<Duration>,
    pub worker_cpu: Option<Duration>,
    pub settle: Option<Duration>,
    pub too_late: u64,
    pub pool_bytes: Option<u64>,
}

impl Run {
    /// A run from `start` to the last share's end, with its shares' counts.
    pub fn of(start: Instant, shares: &[Share]) -> Self {
        let end = shares.iter().map(|share| share.done).max().unwrap_or(start);
        let too_late = shares.iter().map(|share| share.too_late).sum();
        let (wall, app) = (end - start, end - start);
        Self {
            wall,
            app,
            too_late,
            ..Self::default()
        }
    }
}

/// Runs' medians in ns per unit (settle wait in µs), the wall figure's `min-max`, the largest pool, the too-late count.
#[derive(Debug, Clone)]
pub struct PerUnit {
    pub wall: f64,
    pub app: f64,
    pub cpu: Option<f64>,
    pub worker_cpu: Option<f64>,
    pub settle_us: Option<f64>,
    pub wall_range: String,
    pub pool_max: Option<u64>,
    pub too_late: u64,
}

impl PerUnit {
    /// The medians of `runs`, each made of `units` units of work.
    pub fn of(runs: &[Run], units: u64) -> Self {
        let per = |d: Duration| d.as_nanos() as f64 / units.max(1) as f64;
        let optional = |field: &dyn Fn(&Run) -> Option<f64>| {
            let values: Option<Vec<f64>> = runs.iter().map(field).collect();
            values.filter(|v| !v.is_empty()).map(median)
        };
        let walls: Vec<f64> = runs.iter().map(|run| per(run.wall)).collect();
        Self {
            wall: median(walls.iter().copied()),
            app: median(runs.iter().map(|run| per(run.app))),
            cpu: optional(&|run| run.cpu.map(per)),
            worker_cpu: optional(&|run| run.worker_cpu.map(per)),
            settle_us: optional(&|run| run.settle.map(|d| d.as_secs_f64() * 1e6)),
            wall_range: runner::spread(walls.iter().copied()),
            pool_max: runs.iter().filter_map(|run| run.pool_bytes).max(),
            too_late: runs.iter().map(|run| run.too_late).sum(),
        }
    }
}

/// The point between an application thread's untimed set-up and its timed work.
pub struct Gate<'a>(&'a Barrier);

impl Gate<'_> {
    /// Waits until every thread is set up and the main thread has taken its readings.
    pub fn wait(&self) {
        self.0.wait();
        self.0.wait();
    }
}

/// Runs `body(index, gate)` on `threads` fresh threads: each sets up, calls `gate.wait()` (also when its set-up
/// failed), does the timed work and reports its share. Times the run from the gate to the last share's end, or to the
/// end of `settle`'s wait for the subject's deferred work; `workers_cpu` reads the subject's own threads' CPU time.
pub fn on_threads(
    threads: usize,
    workers_cpu: fn() -> Option<Duration>,
    body: impl Fn(usize, &Gate) -> Result<Share, String> + Sync,
    settle: impl FnOnce(&[Share]) -> Result<Option<Duration>, String>,
) -> Result<Run, String> {
    let barrier = Barrier::new(threads + 1);
    let (start, shares, cpu, workers) = std::thread::scope(|scope| {
        let (body, barrier) = (&body, &barrier);
        let spawn = |index| scope.spawn(move || body(index, &Gate(barrier)));
        let handles: Vec<_> = (0..threads).map(spawn).collect();
        barrier.wait();
        let (cpu, workers) = (process_cpu_time(), workers_cpu());
        barrier.wait();
        let start = Instant::now();
        let shares: Vec<_> = handles.into_iter().map(|handle| handle.join()).collect();
        (start, shares, cpu, workers)
    });
    let panicked = || Err("an application thread panicked".to_string());
    let shares = shares.into_iter().map(|s| s.unwrap_or_else(|_| panicked()));
    let shares = shares.collect::<Result<Vec<_>, _>>()?;
    let mut run = Run::of(start, &shares);
    if let Some(waited) = settle(&shares)? {
        (run.settle, run.wall) = (Some(waited), run.app + waited);
    }
    run.cpu = cpu_between(cpu, process_cpu_time());
    run.worker_cpu = cpu_between(workers, workers_cpu());
    Ok(run)
}

/// [`on_threads`] against a fresh engine. With `settle`, the run lasts until the engine has settled, and its counts
/// must match the shares'; without it the engine is dropped with whatever timers are left, untimed.
pub fn on_engine(
    threads: usize,
    settle: bool,
    body: impl Fn(&TimerEngine, (usize, &Gate)) -> Result<Share, String> + Sync,
) -> Result<Run, String> {
    let engine = engine::build(false)?;
    let settled = |shares: &[Share]| {
        if !settle {
            return Ok(None);
        }
        let settled = engine::settle(&engine)?;
        let sum = |count: fn(&Share) -> u64| shares.iter().map(count).sum();
        let (scheduled, cancelled) = (sum(|s| s.scheduled), sum(|s| s.cancelled));
        engine::check_counts(&settled.stats, scheduled, cancelled, sum(|s| s.too_late))?;
        Ok(Some(settled.waited))
    };
    let body = |i, gate: &Gate| body(&engine, (i, gate));
    let mut run = on_threads(threads, engine::workers_cpu_time, body, settled)?;
    run.pool_bytes = Some(engine.stats().pool_bytes as u64);
    Ok(run)
}

/// [`on_threads`] on a fresh `Mutex<BinaryHeap>` the threads share, dropped with whatever timers are left, untimed.
pub fn on_mutex_heap(
    threads: usize,
    body: impl Fn(&SharedHeap, (usize, &Gate)) -> Result<Share, String> + Sync,
) -> Result<Run, String> {
    let heap = SharedHeap::start()?;
    let body = |i, gate: &Gate| body(&heap, (i, gate));
    on_threads(threads, SharedHeap::timer_thread_cpu_time, body, |_| {
        Ok(None)
    })
}

/// Runs `body((index, line))` as `tasks` tasks of a runtime of as many workers, each on a worker of its own.
pub fn on_tokio<F, Fut>(tasks: usize, body: F) -> Result<Run, String>
where
    F: Fn((usize, Arc<StartLine>)) -> Fut,
    Fut: Future<Output = Result<Share, String>> + Send + 'static,
{
    let runtime = tokio_sleep::runtime(tasks)?;
    let line = Arc::new(StartLine::default());
    let spawn = |index| runtime.spawn(body((index, Arc::clone(&line))));
    let handles: Vec<_> = (0..tasks).map(spawn).collect();
    line.gather(tasks)?;
    let (cpu, start) = (process_cpu_time(), line.go());
    let shares = runtime.block_on(join_all(handles)).into_iter();
    let shares = shares.collect::<Result<Vec<Share>, String>>()?;
    let cpu = cpu_between(cpu, process_cpu_time());
    tokio_sleep::check_spread(&shares.iter().map(|share| share.thread).collect::<Vec<_>>())?;
    Ok(Run {
        cpu,
        ..Run::of(start, &shares)
    })
}

/// Awaits every task, in order; a task that panicked is an error.
pub async fn join_all<T>(
    handles: Vec<tokio::task::JoinHandle<Result<T, String>>>,
) -> Vec<Result<T, String>> {
    let mut results = Vec::with_capacity(handles.len());
    for handle in handles {
        let failed = |error| Err(format!("a task failed: {error}"));
        results.push(handle.await.unwrap_or_else(failed));
    }
    results
}

/// Splits `total` units of work over `parts` as evenly as can be.
pub fn share_of(total: u64, parts: usize, index: usize) -> u64 {
    let parts = parts.max(1) as u64;
    total / parts + u64::from((index as u64) < total % parts)
}

/// Measures every cell of `plan` through the runner; `units` is a cell's units of work per run.
pub fn measure(
    plan: &Plan,
    units: impl Fn(&Cell) -> u64,
    measure: impl FnMut(&Cell) -> Result<Run, String>,
) -> Vec<Result<PerUnit, String>> {
    let runs = runner::in_turns(plan, measure).into_iter();
    let of = |(cell, runs): (&Cell, Result<Vec<Run>, String>)| Ok(PerUnit::of(&runs?, units(cell)));
    plan.cells.iter().zip(runs).map(of).collect()
}

/// Adds a row per cell to `sheet` with `row`'s figures, then notes the runs' ns/`unit` ranges and each cell with
/// timers `too_late` (what such a timer did).
pub fn add_rows<'a>(
    sheet: &mut Sheet,
    cells: impl IntoIterator<Item = (&'a Cell, &'a Result<PerUnit, String>)>,
    (unit, too_late): (&str, &str),
    row: impl Fn(&PerUnit) -> Vec<Option<f64>>,
) {
    let (mut spreads, mut notes) = (Vec::new(), Vec::new());
    for (cell, result) in cells {
        let values = result.as_ref().map(|per| {
            let name = format!("{}, {}", cell.subject.name(), cell.threads);
            spreads.push(format!("{name}: {}", per.wall_range));
            if per.too_late > 0 {
                let (n, runs) = (thousands(per.too_late), runner::RUNS);
                notes.push(format!("{name}: {n} timers {too_late}, over {runs} runs"));
            }
            row(per)
        });
        sheet.add(cell.subject, cell.threads, values.map_err(Clone::clone));
    }
    let (runs, spreads) = (runner::RUNS, spreads.join(", "));
    sheet.note(format!(
        "median of {runs} runs per subject, taken in turns; ns/{unit} range: {spreads}"
    ));
    sheet.notes.extend(notes);
}

/// A multi-thread workload's sheet: medians per `unit` (`units` a run), ratios to peers and to one thread.
pub fn threads_sheet(
    (workload, title): (&str, String),
    (unit, units): (&str, u64),
    too_late: &str,
    cells: &[(&Cell, &Result<PerUnit, String>)],
) -> Sheet {
    let settles = cells
        .iter()
        .any(|(_, r)| r.as_ref().is_ok_and(|per| per.settle_us.is_some()));
    let what = if unit == "reset" { "reset" } else { "timer" };
    let ns = |h: &str, m: &str| Col::new(format!("{h}/{unit}"), format!("{m}_per_{what}"), "ns", 1);
    let mut cols = vec![
        ns("ns", "ns").ratios(),
        Col::new(format!("M{unit}s/s"), format!("m{what}s_per_s"), "M/s", 2).rate(),
        ns("CPU ns", "cpu_ns"),
        ns("worker CPU ns", "worker_cpu_ns"),
        ns("app ns", "app_ns"),
    ];
    cols.extend(settles.then(|| Col::new("settle us", "settle_wait", "us", 0)));
    cols.push(Col::new("pool MiB", "engine_pool_mib_max", "MiB", 1));
    let mut sheet = Sheet::new(workload, title, units, cols);
    sheet.scaling = Some(0);
    sheet.note(format!("CPU ns/{unit}: process CPU time over the run (every thread: application, engine workers, tokio workers) / {unit}s; worker CPU: the engine's worker threads alone (mutex-heap: its timer thread); app ns/{unit}: start to the last application thread's end"));
    if settles {
        sheet.note(
            "settle us: the wait after the last application thread's end until the engine was seen settled (median)",
        );
    }
    sheet.note("pool MiB: the engine's stats().pool_bytes at the end of a run, the largest of the runs: node memory the engine keeps until it is dropped");
    add_rows(&mut sheet, cells.iter().copied(), (unit, too_late), |per| {
        let mut row = vec![
            Some(per.wall),
            Some(1e3 / per.wall),
            per.cpu,
            per.worker_cpu,
            Some(per.app),
        ];
        row.extend(settles.then_some(per.settle_us));
        row.push(per.pool_max.map(|b| b as f64 / (1024.0 * 1024.0)));
        row
    });
    sheet
}

#[cfg(test)]
mod tests {
    #[test]
    fn shares_add_up() {
        for total in [0, 1, 7, 2_000_000] {
            for parts in 1..5 {
                let shares = (0..parts).map(|i| super::share_of(total, parts, i));
                assert_eq!(shares.sum::<u64>(), total);
            }
        }
    }
}
