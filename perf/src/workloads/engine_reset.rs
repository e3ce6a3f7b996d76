//! engine-reset: idle timeouts from T application threads, corewheel's `TimerEngine` against
//! tokio's `Sleep::reset` and a `Mutex<BinaryHeap>` shared by the threads.
//!
//! 100,000 connections, split evenly over the threads; every connection has an idle timer
//! of 30 s. Each read or write on a connection pushes its timer back to now + 30 s on the
//! real clock: each thread picks one of its own connections at random and resets its timer,
//! `engine.reset(handle, 30 s)` or `sleep.as_mut().reset(Instant::now() + 30 s)`. Nothing
//! comes due during a run, so both take their "later deadline" path: a few atomic
//! operations on the timer's own entry, the move deferred until the old deadline comes round.

use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio::time::Sleep;

use crate::peers::engine;
use crate::peers::tokio_sleep::{self, register};
use crate::peers::{SharedTimers, Subject};
use crate::report::thousands;
use crate::runner::{Cell, Plan};
use crate::workloads::parallel::{self, Gate, Run, Share, ThreadsTable, share_of};
use crate::workloads::{Out, rng};

/// Connections over all threads, each with one idle timer.
const CONNECTIONS: u64 = 100_000;
/// How long a connection may stay idle.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy)]
struct Config {
    threads: usize,
    resets: u64,
}

fn thread_share<S: SharedTimers>(
    subject: &S,
    index: usize,
    gate: &Gate,
    config: Config,
) -> Result<Share, String> {
    let connections = share_of(CONNECTIONS, config.threads, index);
    let resets = share_of(config.resets, config.threads, index);
    let mut rng = rng(index as u64 + 7);
    let mut share = Share::new(std::thread::current().id());
    let timers: Result<Vec<S::Handle>, String> = (0..connections)
        .map(|connection| subject.arm(IDLE_TIMEOUT, connection))
        .collect();
    gate.wait();
    let mut timers = timers?;
    share.scheduled = connections;
    for _ in 0..resets {
        let connection = rng.u64(..connections) as usize;
        match subject.reset(timers[connection], IDLE_TIMEOUT) {
            Some(moved) => timers[connection] = moved,
            None => share.too_late += 1,
        }
    }
    share.done = Instant::now();
    // Every connection's timer must still be pending, or a reset lost it.
    let lost = timers
        .iter()
        .filter(|&&handle| !subject.is_pending(handle))
        .count();
    if lost > 0 {
        return Err(format!("{lost} connections lost their idle timer"));
    }
    Ok(share)
}

fn run_mutex_heap(config: Config) -> Result<Run, String> {
    let (run, _) = parallel::on_mutex_heap(config.threads, |heap, index, gate| {
        thread_share(heap, index, gate, config)
    })?;
    Ok(run)
}

fn run_engine(config: Config) -> Result<Run, String> {
    // Nothing is due for 30 s and every reset is to a later deadline, so the workers have
    // nothing to do for this run: the engine is dropped with its timers pending, untimed.
    let (run, _, _) = parallel::on_engine(config.threads, false, |engine, index, gate| {
        thread_share(engine, index, gate, config)
    })?;
    Ok(run)
}

async fn tokio_share(
    index: usize,
    line: std::sync::Arc<tokio_sleep::StartLine>,
    config: Config,
) -> Result<Share, String> {
    let connections = share_of(CONNECTIONS, config.threads, index);
    let resets = share_of(config.resets, config.threads, index);
    let mut timers: Vec<Pin<Box<Sleep>>> = (0..connections)
        .map(|_| Box::pin(tokio::time::sleep(IDLE_TIMEOUT)))
        .collect();
    tokio_sleep::with_context(|cx| {
        let mut rng = rng(index as u64 + 7);
        let mut share = Share::new(std::thread::current().id());
        for timer in &mut timers {
            share.due_at_once += u64::from(register(timer.as_mut(), cx));
        }
        share.scheduled = connections;
        if !line.arrive_and_wait() {
            return Err("the run was called off".to_string());
        }
        for _ in 0..resets {
            let connection = rng.u64(..connections) as usize;
            timers[connection]
                .as_mut()
                .reset(tokio::time::Instant::now() + IDLE_TIMEOUT);
        }
        share.done = Instant::now();
        let lost = timers.iter().filter(|timer| timer.is_elapsed()).count();
        if lost > 0 {
            return Err(format!("{lost} connections' idle timers fired"));
        }
        Ok(share)
    })
    .await
}

fn run_tokio(config: Config) -> Result<Run, String> {
    let (run, _) = parallel::on_tokio(config.threads, |index, line| {
        tokio_share(index, line, config)
    })?;
    Ok(run)
}

fn measure(subject: Subject, config: Config) -> Result<Run, String> {
    match subject {
        Subject::Engine => run_engine(config),
        Subject::TokioSleep => run_tokio(config),
        Subject::MutexHeap => run_mutex_heap(config),
        _ => Err(format!("{} is not an engine subject", subject.name())),
    }
}

/// Runs `plan`'s cells and prints the table.
pub fn run(plan: &Plan, resets: u64, out: &mut Out) {
    let results = parallel::measure(
        plan,
        |_| resets,
        |cell: &Cell| {
            measure(
                cell.subject,
                Config {
                    threads: cell.threads,
                    resets,
                },
            )
        },
    );
    let cells: Vec<_> = plan.cells.iter().zip(&results).collect();
    let mut sheet = ThreadsTable {
        workload: "engine-reset".to_string(),
        title: format!(
            "engine-reset ({} connections over the threads, {} resets per run, idle timeout 30 s)",
            thousands(CONNECTIONS),
            thousands(resets)
        ),
        unit: "reset",
        units: resets,
        live_nodes: engine::node_bytes().map(|bytes| (CONNECTIONS, bytes)),
        too_late: "found already fired by a reset",
    }
    .sheet(&cells);
    sheet.note("reset = move a random connection's idle timer (the thread's own) to now + 30 s on the real clock: engine.reset(handle, 30 s) / Sleep::reset(Instant::now() + 30 s) / a tombstone and a new entry in the locked heap; each new deadline is later, so neither wheel moves the timer yet");
    sheet.note("ns/reset = wall time / resets, all threads together, from the moment every thread has its connections' timers armed (untimed); nothing is due during a run, so the engine's workers have nothing to settle");
    sheet.finish(&mut out.csv);
}
