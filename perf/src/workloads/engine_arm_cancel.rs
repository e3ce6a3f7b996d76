//! engine-arm-cancel: request timeouts from T application threads, the `TimerEngine` against tokio's `sleep` and
//! `timeout()`, pingora-timeout and a shared `Mutex<BinaryHeap>`. Each thread arms a timer per request and cancels
//! the one armed K operations earlier (window 0: at once); for the engine a run lasts until it has settled, so that
//! its workers' share is inside the time.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::peers::async_timers::{pingora_timeout, tokio_timeout};
use crate::peers::tokio_sleep::{StartLine, register, with_context};
use crate::peers::{SharedTimers, Subject, engine};
use crate::report::thousands;
use crate::runner::{self, Cell, Plan};
use crate::workloads::parallel::{self, Gate, Run, Share, share_of, threads_sheet};
use crate::workloads::parallel::{on_engine, on_mutex_heap, on_tokio};
use crate::workloads::{Out, request_timeout, rng};

/// A run's application threads, requests in flight per thread, and timers over the threads.
type Config = (usize, usize, u64);

fn thread_share<S: SharedTimers>(
    subject: &S,
    (index, gate): (usize, &Gate),
    config: Config,
) -> Result<Share, String> {
    let (mut rng, mut share) = (rng(index as u64 + 1), Share::new());
    let window: Result<Vec<S::Handle>, String> = (0..config.1 as u64)
        .map(|i| subject.arm(request_timeout(&mut rng), i))
        .collect();
    gate.wait();
    let mut window = window?;
    let ops = share_of(config.2, config.0, index);
    share.scheduled = window.len() as u64 + ops;
    let mut count = |cancelled: bool| match cancelled {
        true => share.cancelled += 1,
        false => share.too_late += 1,
    };
    for op in 0..ops {
        let fresh = subject.arm(request_timeout(&mut rng), op)?;
        let old = match window.len() {
            0 => fresh,
            len => std::mem::replace(&mut window[op as usize % len], fresh),
        };
        count(subject.cancel(old));
    }
    for handle in window {
        count(subject.cancel(handle));
    }
    share.done = Instant::now();
    Ok(share)
}

/// One task's share on tokio: `arm(delay)` makes a request's timer future (a `Sleep`, or a `timeout()` around a
/// pending read), which the task polls once to arm and drops to cancel. One pinned slot per request in flight,
/// reused: each new timer is written over the oldest, which drops (cancels) it, so no allocation happens per timer.
async fn tokio_share<F: Future + Send + 'static>(
    (index, line): (usize, Arc<StartLine>),
    config: Config,
    arm: fn(Duration) -> F,
) -> Result<Share, String> {
    let ops = share_of(config.2, config.0, index);
    let mut window: Vec<Pin<Box<Option<F>>>> =
        (0..config.1.max(1)).map(|_| Box::pin(None)).collect();
    with_context(|cx| {
        let (mut rng, mut share) = (rng(index as u64 + 1), Share::new());
        let mut put = |slot: &mut Pin<Box<Option<F>>>, share: &mut Share| {
            slot.as_mut().set(Some(arm(request_timeout(&mut rng))));
            if let Some(timer) = slot.as_mut().as_pin_mut() {
                share.too_late += u64::from(register(timer, cx));
            }
        };
        for slot in window.iter_mut().take(config.1) {
            put(slot, &mut share);
        }
        line.arrive_and_wait()?;
        let len = window.len();
        for op in 0..ops as usize {
            put(&mut window[op % len], &mut share);
            if config.1 == 0 {
                window[0].as_mut().set(None);
            }
        }
        for slot in &mut window {
            slot.as_mut().set(None);
        }
        share.scheduled = config.1 as u64 + ops;
        share.cancelled = share.scheduled;
        share.done = Instant::now();
        Ok(share)
    })
    .await
}

fn measure(subject: Subject, config: Config) -> Result<Run, String> {
    let threads = config.0;
    match subject {
        Subject::Engine => on_engine(threads, true, |e, at| thread_share(e, at, config)),
        Subject::MutexHeap => on_mutex_heap(threads, |h, at| thread_share(h, at, config)),
        Subject::TokioSleep => on_tokio(threads, |at| tokio_share(at, config, tokio::time::sleep)),
        Subject::TokioTimeout => on_tokio(threads, |at| tokio_share(at, config, tokio_timeout)),
        Subject::PingoraTimeout => on_tokio(threads, |at| tokio_share(at, config, pingora_timeout)),
        _ => Err(format!("{} is not an engine subject", subject.name())),
    }
}

pub fn run(plan: &Plan, timers: u64, out: &mut Out) {
    let config = |cell: &Cell| (cell.threads, cell.param as usize, timers);
    let results = parallel::measure(plan, |_| timers, |cell| measure(cell.subject, config(cell)));
    for cells in runner::by_param(plan, &results) {
        let window = cells[0].0.param;
        let (window_text, timers_text) = (thousands(window), thousands(timers));
        let title = format!(
            "engine-arm-cancel (window {window_text} per thread, {timers_text} timers per run, delays uniform in 1 ms..30 s)"
        );
        let too_late = "fired before their cancel (the cancel then returns false)";
        let name = format!("engine-arm-cancel-w{window}");
        let mut sheet = threads_sheet((&name, title), ("timer", timers), too_late, &cells);
        sheet.note(match window {
            0 => "timer = arm one (delay uniform in 1 ms..30 s) and cancel it at once".to_string(),
            _ => format!("timer = arm one and cancel the one this thread armed {window_text} timers earlier; each thread starts with its window armed (untimed) and cancels it at the end (timed)"),
        });
        sheet.note("ns/timer = wall time / timers, all threads together, from the moment every thread has its window armed to the end; for the engine the end is when stats() shows every timer cancelled or fired and every pool node is free, so its workers' share is inside");
        sheet.note(format!("engine: {} pinned workers, the T application threads are plain threads; tokio-sleep: a runtime of T workers, one task each, its Sleeps polled once with the task's waker and dropped; tokio-timeout, pingora-timeout: the same, each request a timeout() around a read that is pending; mutex-heap: T plain threads sharing one locked heap", engine::cpus()));
        sheet.finish(&mut out.csv);
    }
}
