//! engine-reset: idle timeouts from T application threads, the `TimerEngine` against tokio's `Sleep::reset` and a
//! shared `Mutex<BinaryHeap>`: 100,000 connections split over the threads, each read or write pushing its 30 s idle
//! timer back. Nothing comes due, so the engine has nothing to settle and is dropped untimed.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::time::Sleep;

use crate::peers::tokio_sleep::{StartLine, register, with_context};
use crate::peers::{SharedTimers, Subject};
use crate::report::thousands;
use crate::runner::{Cell, Plan};
use crate::workloads::parallel::{self, Gate, Run, Share, share_of, threads_sheet};
use crate::workloads::parallel::{on_engine, on_mutex_heap, on_tokio};
use crate::workloads::{Out, rng};

const CONNECTIONS: u64 = 100_000;
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A run's application threads and resets.
type Config = (usize, u64);

fn thread_share<S: SharedTimers>(
    subject: &S,
    (index, gate): (usize, &Gate),
    config: Config,
) -> Result<Share, String> {
    let connections = share_of(CONNECTIONS, config.0, index);
    let (mut rng, mut share) = (rng(index as u64 + 7), Share::new());
    let timers: Result<Vec<S::Handle>, String> = (0..connections)
        .map(|c| subject.arm(IDLE_TIMEOUT, c))
        .collect();
    gate.wait();
    let mut timers = timers?;
    share.scheduled = connections;
    for _ in 0..share_of(config.1, config.0, index) {
        let connection = rng.u64(..connections) as usize;
        match subject.reset(timers[connection], IDLE_TIMEOUT) {
            Some(moved) => timers[connection] = moved,
            None => share.too_late += 1,
        }
    }
    share.done = Instant::now();
    // Every connection's timer must still be pending, or a reset lost it.
    match timers.iter().filter(|&&h| !subject.is_pending(h)).count() {
        0 => Ok(share),
        lost => Err(format!("{lost} connections lost their idle timer")),
    }
}

/// One task's share on tokio: its connections' sleeps, pushed back with `Sleep::reset`.
async fn tokio_share(at: (usize, Arc<StartLine>), config: Config) -> Result<Share, String> {
    let (index, line) = at;
    let connections = share_of(CONNECTIONS, config.0, index);
    let idle = || Box::pin(tokio::time::sleep(IDLE_TIMEOUT));
    let mut timers: Vec<Pin<Box<Sleep>>> = (0..connections).map(|_| idle()).collect();
    with_context(|cx| {
        let (mut rng, mut share) = (rng(index as u64 + 7), Share::new());
        for timer in &mut timers {
            share.too_late += u64::from(register(timer.as_mut(), cx));
        }
        share.scheduled = connections;
        line.arrive_and_wait()?;
        for _ in 0..share_of(config.1, config.0, index) {
            let deadline = tokio::time::Instant::now() + IDLE_TIMEOUT;
            timers[rng.u64(..connections) as usize]
                .as_mut()
                .reset(deadline);
        }
        share.done = Instant::now();
        match timers.iter().filter(|timer| timer.is_elapsed()).count() {
            0 => Ok(share),
            lost => Err(format!("{lost} connections' idle timers fired")),
        }
    })
    .await
}

fn measure(subject: Subject, config: Config) -> Result<Run, String> {
    let threads = config.0;
    match subject {
        Subject::Engine => on_engine(threads, false, |e, at| thread_share(e, at, config)),
        Subject::MutexHeap => on_mutex_heap(threads, |h, at| thread_share(h, at, config)),
        Subject::TokioSleep => on_tokio(threads, |at| tokio_share(at, config)),
        _ => Err(format!("{} is not an engine subject", subject.name())),
    }
}

pub fn run(plan: &Plan, resets: u64, out: &mut Out) {
    let measure = |cell: &Cell| measure(cell.subject, (cell.threads, resets));
    let results = parallel::measure(plan, |_| resets, measure);
    let cells: Vec<_> = plan.cells.iter().zip(&results).collect();
    let (connections, resets_text) = (thousands(CONNECTIONS), thousands(resets));
    let title = format!(
        "engine-reset ({connections} connections over the threads, {resets_text} resets per run, idle timeout 30 s)"
    );
    let too_late = "found already fired by a reset";
    let mut sheet = threads_sheet(("engine-reset", title), ("reset", resets), too_late, &cells);
    sheet.note("reset = move a random connection's idle timer (the thread's own) to now + 30 s on the real clock: engine.reset(handle, 30 s) / Sleep::reset(Instant::now() + 30 s) / a tombstone and a new entry in the locked heap; each new deadline is later, so neither wheel moves the timer yet");
    sheet.note("ns/reset = wall time / resets, all threads together, from the moment every thread has its connections' timers armed (untimed); nothing is due during a run, so the engine's workers have nothing to settle");
    sheet.finish(&mut out.csv);
}
