//! engine-arm-cancel: request timeouts from T application threads, corewheel's `TimerEngine`
//! against tokio's `sleep`, tokio's `timeout()`, pingora-timeout's `timeout()` and a
//! `Mutex<BinaryHeap>` shared by the threads.
//!
//! Each thread keeps a window of K requests in flight: it arms a timer for a new request
//! (delay uniform in 1 ms..30 s) and cancels the one armed K operations earlier, whose
//! response has arrived; window 0 arms a timer and cancels it at once. At the end each
//! thread cancels what it still has in flight. The engine's threads are plain threads
//! calling `schedule` and `cancel`; tokio's are the T workers of a runtime, each running one
//! task that registers a `Sleep` (or polls a `timeout()` around a pending read) per request
//! and drops it to cancel.
//!
//! A run is timed from the moment every thread has its window armed until the work is done:
//! for the engine, until its counts show every timer cancelled or fired and every pool
//! node is free again, so the workers' share of the work is inside the time.

use std::future::Future;
use std::pin::{Pin, pin};
use std::time::{Duration, Instant};

use crate::peers::engine;
use crate::peers::timeouts;
use crate::peers::tokio_sleep::{self, register};
use crate::peers::{SharedTimers, Subject};
use crate::report::thousands;
use crate::runner::{Cell, Plan};
use crate::workloads::parallel::{self, Gate, Run, Share, ThreadsTable, share_of};
use crate::workloads::{Out, request_timeout, rng};

#[derive(Debug, Clone, Copy)]
struct Config {
    threads: usize,
    window: usize,
    timers: u64,
}

fn thread_share<S: SharedTimers>(
    subject: &S,
    index: usize,
    gate: &Gate,
    config: Config,
) -> Result<Share, String> {
    let ops = share_of(config.timers, config.threads, index);
    let mut rng = rng(index as u64 + 1);
    let mut share = Share::new(std::thread::current().id());
    let mut window = Vec::with_capacity(config.window);
    let mut failure = None;
    for i in 0..config.window as u64 {
        match subject.arm(request_timeout(&mut rng), i) {
            Ok(handle) => window.push(handle),
            Err(error) => {
                failure = Some(error);
                break;
            }
        }
    }
    gate.wait();
    if let Some(failure) = failure {
        return Err(failure);
    }
    share.scheduled = window.len() as u64;
    let mut oldest = 0;
    for op in 0..ops {
        let fresh = subject.arm(request_timeout(&mut rng), op)?;
        let old = if window.is_empty() {
            fresh
        } else {
            let old = std::mem::replace(&mut window[oldest], fresh);
            oldest += 1;
            if oldest == window.len() {
                oldest = 0;
            }
            old
        };
        if subject.cancel(old) {
            share.cancelled += 1;
        } else {
            share.too_late += 1;
        }
    }
    for handle in window {
        if subject.cancel(handle) {
            share.cancelled += 1;
        } else {
            share.too_late += 1;
        }
    }
    share.scheduled += ops;
    share.done = Instant::now();
    Ok(share)
}

fn run_mutex_heap(config: Config) -> Result<Run, String> {
    let (run, _) = parallel::on_mutex_heap(config.threads, |heap, index, gate| {
        thread_share(heap, index, gate, config)
    })?;
    Ok(run)
}

fn run_engine(config: Config) -> Result<Run, String> {
    let (run, settled, shares) =
        parallel::on_engine(config.threads, true, |engine, index, gate| {
            thread_share(engine, index, gate, config)
        })?;
    let scheduled = shares.iter().map(|share| share.scheduled).sum();
    let cancelled = shares.iter().map(|share| share.cancelled).sum();
    if let Some(settled) = settled {
        engine::check_counts(&settled.stats, scheduled, cancelled, run.too_late)?;
    }
    Ok(run)
}

/// One task's share on tokio: `arm(delay)` makes a request's timer future (a `Sleep`, or a
/// `timeout()` around a pending read), which the task polls once to arm and drops to cancel.
async fn tokio_share<F: Future + Send + 'static>(
    index: usize,
    line: std::sync::Arc<tokio_sleep::StartLine>,
    config: Config,
    arm: fn(Duration) -> F,
) -> Result<Share, String> {
    let ops = share_of(config.timers, config.threads, index);
    // One pinned slot per request in flight, reused: each new timer is written over the
    // oldest, which drops (cancels) it, so no allocation happens per timer.
    let mut window: Vec<Pin<Box<Option<F>>>> = (0..config.window).map(|_| Box::pin(None)).collect();
    tokio_sleep::with_context(|cx| {
        let mut rng = rng(index as u64 + 1);
        let mut share = Share::new(std::thread::current().id());
        for slot in &mut window {
            slot.as_mut().set(Some(arm(request_timeout(&mut rng))));
            if let Some(timer) = slot.as_mut().as_pin_mut() {
                share.due_at_once += u64::from(register(timer, cx));
            }
        }
        share.scheduled = window.len() as u64;
        if !line.arrive_and_wait() {
            return Err("the run was called off".to_string());
        }
        if window.is_empty() {
            for _ in 0..ops {
                let timer = pin!(arm(request_timeout(&mut rng)));
                share.due_at_once += u64::from(register(timer, cx));
            }
        } else {
            let mut oldest = 0;
            for _ in 0..ops {
                let slot = &mut window[oldest];
                slot.as_mut().set(Some(arm(request_timeout(&mut rng))));
                if let Some(timer) = slot.as_mut().as_pin_mut() {
                    share.due_at_once += u64::from(register(timer, cx));
                }
                oldest += 1;
                if oldest == window.len() {
                    oldest = 0;
                }
            }
            for slot in &mut window {
                slot.as_mut().set(None);
            }
        }
        share.scheduled += ops;
        share.cancelled = share.scheduled;
        share.done = Instant::now();
        Ok(share)
    })
    .await
}

fn run_tokio<F: Future + Send + 'static>(
    config: Config,
    arm: fn(Duration) -> F,
) -> Result<Run, String> {
    let (run, _) = parallel::on_tokio(config.threads, |index, line| {
        tokio_share(index, line, config, arm)
    })?;
    Ok(run)
}

fn measure(subject: Subject, config: Config) -> Result<Run, String> {
    match subject {
        Subject::Engine => run_engine(config),
        Subject::TokioSleep => run_tokio(config, tokio::time::sleep),
        Subject::TokioTimeout => run_tokio(config, timeouts::tokio_timeout),
        Subject::PingoraTimeout => run_tokio(config, timeouts::pingora_timeout),
        Subject::MutexHeap => run_mutex_heap(config),
        _ => Err(format!("{} is not an engine subject", subject.name())),
    }
}

/// Runs `plan`'s cells and prints a table per window.
pub fn run(plan: &Plan, timers: u64, out: &mut Out) {
    let results = parallel::measure(
        plan,
        |_| timers,
        |cell: &Cell| {
            let config = Config {
                threads: cell.threads,
                window: cell.param as usize,
                timers,
            };
            measure(cell.subject, config)
        },
    );
    let mut windows: Vec<u64> = plan.cells.iter().map(|cell| cell.param).collect();
    windows.dedup();
    let most_threads = plan
        .cells
        .iter()
        .map(|cell| cell.threads)
        .max()
        .unwrap_or(1) as u64;
    for window in windows {
        let cells: Vec<_> = plan
            .cells
            .iter()
            .zip(&results)
            .filter(|(cell, _)| cell.param == window)
            .collect();
        let mut sheet = ThreadsTable {
            workload: format!("engine-arm-cancel-w{window}"),
            title: format!(
                "engine-arm-cancel (window {} per thread, {} timers per run, delays uniform in 1 ms..30 s)",
                thousands(window),
                thousands(timers)
            ),
            unit: "timer",
            units: timers,
            live_nodes: engine::node_bytes().map(|bytes| (most_threads * window.max(1), bytes)),
            too_late: "fired before their cancel (the cancel then returns false)",
        }
        .sheet(&cells);
        sheet.note(match window {
            0 => "timer = arm one (delay uniform in 1 ms..30 s) and cancel it at once".to_string(),
            _ => format!(
                "timer = arm one and cancel the one this thread armed {} timers earlier; each thread starts with its window armed (untimed) and cancels it at the end (timed)",
                thousands(window)
            ),
        });
        sheet.note("ns/timer = wall time / timers, all threads together, from the moment every thread has its window armed to the end; for the engine the end is when stats() shows every timer cancelled or fired and every pool node is free, so its workers' share is inside");
        sheet.note(format!(
            "engine: {} pinned workers, the T application threads are plain threads; tokio-sleep: a runtime of T workers, one task each, its Sleeps polled once with the task's waker and dropped; tokio-timeout, pingora-timeout: the same, each request a timeout() around a read that is pending; mutex-heap: T plain threads sharing one locked heap",
            engine::cpus()
        ));
        sheet.finish(&mut out.csv);
    }
}
