//! The async workloads: timer futures from 1..N threads, corewheel's async layer against tokio, async-io (smol) and
//! pingora-timeout, all on a tokio runtime of T workers, one task per worker, so the timer is the only difference.
//! The cost is the process's CPU time per operation until the deferred work is done too (the engine settled, then
//! the process idle); the wall time to the last task's end gives throughput.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Arc, Barrier};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use crate::peers::Subject;
use crate::peers::async_timers::{self as timers, Reset, Reset::InPlace, Reset::Recreate};
use crate::peers::tokio_sleep::{StartLine, check_spread, register, runtime, with_context};
use crate::report::{Col, Sheet, thousands};
use crate::runner::{Cell, Plan};
use crate::sys::{cpu_between, process_cpu_time};
use crate::workloads::parallel::{self, Run, Share};
use crate::workloads::{Out, Workload, request_timeout, rng};

/// Connections per thread in async-reset, each with an idle timer of `IDLE_TIMEOUT`.
const CONNECTIONS: u64 = 10_000;
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The lines the tasks pass: set up, released (between them the set-up's deferred work finishes), then the start.
struct Lines(Barrier, Barrier, StartLine);

/// Idle timers handed back still armed, so that their drop is not in the run.
type Idle<F> = Vec<Pin<Box<F>>>;

/// One task's share: `ops` timers made by `arm`, polled once and dropped; with `reset`, `ops` idle-timer resets.
async fn share<F: Future + Send + 'static>(
    (index, lines, ops): (usize, Arc<Lines>, u64),
    arm: fn(Duration) -> F,
    reset: Option<Reset<F>>,
) -> Result<(Share, Idle<F>), String> {
    let connections = if reset.is_some() { CONNECTIONS } else { 0 };
    let idle_timer = || Box::pin(arm(IDLE_TIMEOUT));
    let mut idle: Idle<F> = (0..connections).map(|_| idle_timer()).collect();
    let Lines(set_up, released, start) = &*lines;
    with_context(move |cx| {
        let (mut rng, mut share) = (rng(index as u64 + 13), Share::new());
        // One timer before the run: whatever the subject starts on its first use is started untimed.
        let _ = register(pin!(arm(IDLE_TIMEOUT)), cx);
        for timer in &mut idle {
            share.too_late += u64::from(register(timer.as_mut(), cx));
        }
        set_up.wait();
        released.wait();
        start.arrive_and_wait()?;
        for _ in 0..ops {
            let due_at_once = match reset {
                None => register(pin!(arm(request_timeout(&mut rng))), cx),
                Some(Reset::InPlace(reset)) => {
                    let connection = rng.u64(..CONNECTIONS) as usize;
                    reset(idle[connection].as_mut(), Instant::now() + IDLE_TIMEOUT);
                    false
                }
                Some(Reset::Recreate) => {
                    let mut timer = idle[rng.u64(..CONNECTIONS) as usize].as_mut();
                    timer.set(arm(IDLE_TIMEOUT));
                    register(timer, cx)
                }
            };
            share.too_late += u64::from(due_at_once);
        }
        share.done = Instant::now();
        Ok((share, idle))
    })
    .await
}

/// Waits until this process has used less than 5% of one CPU over a millisecond, and returns its CPU time then.
fn wait_until_quiet() -> Option<Duration> {
    let (every, limit) = (Duration::from_millis(1), Duration::from_secs(2));
    crate::sys::wait_until_quiet(process_cpu_time, every, limit)
}

/// Runs a [`share`] per task on a fresh runtime of `threads` workers; once every task is set up, waits for the
/// process to go idle, then starts them. CPU is read until `settle` (where the subject shows its deferred work) and
/// the process idle. The connections' timers must all still be pending afterwards, or a reset lost one.
fn on_runtime<F: Future + Send + 'static>(
    (threads, ops): (usize, u64),
    settle: bool,
    arm: fn(Duration) -> F,
    reset: Option<Reset<F>>,
) -> Result<Run, String> {
    let runtime = runtime(threads)?;
    let barrier = || Barrier::new(threads + 1);
    let lines = Arc::new(Lines(barrier(), barrier(), StartLine::default()));
    let spawn = |index| runtime.spawn(share((index, Arc::clone(&lines), ops), arm, reset));
    let handles: Vec<_> = (0..threads).map(spawn).collect();
    let Lines(set_up, released, start_line) = &*lines;
    set_up.wait();
    wait_until_quiet();
    released.wait();
    start_line.gather(threads)?;
    let cpu = process_cpu_time();
    let start = start_line.go();
    let results = runtime.block_on(parallel::join_all(handles));
    let settled = settle.then(timers::settle_corewheel).unwrap_or(Ok(()));
    let cpu = cpu_between(cpu, wait_until_quiet());
    settled?;
    let results: Vec<(Share, Idle<F>)> = results.into_iter().collect::<Result<_, _>>()?;
    let (shares, mut idle): (Vec<Share>, Vec<_>) = results.into_iter().unzip();
    check_spread(&shares.iter().map(|share| share.thread).collect::<Vec<_>>())?;
    let mut cx = Context::from_waker(Waker::noop());
    let fired = runtime.block_on(async {
        let ready = |t: &mut Pin<Box<F>>| t.as_mut().poll(&mut cx).is_ready();
        idle.iter_mut().flatten().map(ready).filter(|&r| r).count()
    });
    let guard = runtime.enter();
    drop(idle);
    drop(guard);
    match fired {
        0 => Ok(Run {
            cpu,
            ..Run::of(start, &shares)
        }),
        _ => Err(format!("{fired} connections' idle timers fired")),
    }
}

/// A subject's sleep, and its timeout around a pending read.
type Make<S, T> = (fn(Duration) -> S, fn(Duration) -> T);

/// The subject's futures for `workload`: its sleep, its timeout around a pending read, or its sleep and reset.
/// corewheel's sleeps and timeouts wait for the default engine to settle; its idle sleeps stay pending, so there the
/// wait for the process to go idle stands for it.
fn by_workload<S: Future + Send + 'static, T: Future + Send + 'static>(
    (workload, config): (Workload, (usize, u64)),
    corewheel: bool,
    (sleep, timeout): Make<S, T>,
    reset: Reset<S>,
) -> Result<Run, String> {
    match workload {
        Workload::AsyncTimeout => on_runtime(config, corewheel, timeout, None),
        Workload::AsyncReset => on_runtime(config, false, sleep, Some(reset)),
        _ => on_runtime(config, corewheel, sleep, None),
    }
}

fn measure(workload: Workload, subject: Subject, config: (usize, u64)) -> Result<Run, String> {
    use timers::*;
    let at = (workload, config);
    match subject {
        Subject::Tokio => {
            let make: Make<_, _> = (tokio::time::sleep, tokio_timeout);
            by_workload(at, false, make, InPlace(tokio_reset))
        }
        Subject::AsyncIo => {
            let make: Make<_, _> = (async_io::Timer::after, async_io_timeout);
            by_workload(at, false, make, InPlace(async_io_reset))
        }
        Subject::PingoraTimeout => {
            let make: Make<_, _> = (pingora_timeout::sleep, pingora_timeout);
            by_workload(at, false, make, Recreate)
        }
        Subject::CorewheelAsync => {
            let make: Make<_, _> = (corewheel::sleep, corewheel_timeout);
            by_workload(at, true, make, InPlace(corewheel_reset))
        }
        _ => Err(format!("{} is not an async subject", subject.name())),
    }
}

/// Runs `plan`'s cells of async `workload` and prints its table.
pub fn run(workload: Workload, plan: &Plan, ops: u64, out: &mut Out) {
    let measure = |cell: &Cell| measure(workload, cell.subject, (cell.threads, ops));
    let results = parallel::measure(plan, |cell| ops * cell.threads as u64, measure);
    let (name, ops_text) = (workload.name(), thousands(ops));
    let (unit, what, per, op) = match workload {
        Workload::AsyncSleep => (
            "timer",
            "poll a sleep once and drop it",
            "per thread per run, delays uniform in 1 ms..30 s",
            "timer = make a sleep, poll it once (which arms it with the task's waker), drop it (which cancels it)",
        ),
        Workload::AsyncTimeout => (
            "timer",
            "timeout() around a pending read, polled once and dropped",
            "per thread per run, delays uniform in 1 ms..30 s",
            "timer = make a timeout() around a read that is pending and never woken, poll it once (the read, then the timer armed), drop it",
        ),
        _ => (
            "reset",
            "10,000 connections per thread, each with a 30 s idle sleep",
            "resets per thread per run",
            "reset = push a random connection's idle sleep (the task's own) to now + 30 s: Sleep::reset / Timer::set_at; pingora-timeout has no reset, so its sleep is replaced by a new one and polled once; nothing is due during a run, so the work both wheels defer to the old deadline is not in it",
        ),
    };
    let ns = |h: &str, m: &str| Col::new(format!("{h}/{unit}"), format!("{m}_per_{unit}"), "ns", 1);
    let cols = vec![
        ns("CPU ns", "cpu_ns").ratios(),
        ns("ns", "ns"),
        Col::new(format!("M{unit}s/s"), format!("m{unit}s_per_s"), "M/s", 2).rate(),
    ];
    let title = format!("{name} ({what}; {ops_text} {per})");
    let mut sheet = Sheet::new(name, title, ops, cols);
    sheet.scaling = Some(1);
    sheet.note(op);
    sheet.note(format!("CPU ns/{unit} = process CPU time (every thread: the tasks', the timers' own threads) from the start line until the deferred work is done (corewheel: the engine settled; then, for every subject, the process idle) / {unit}s; ns/{unit} = wall time from the start line to the last task's end / {unit}s, all threads together" ));
    sheet.note("setup: a tokio rt-multi-thread runtime of T workers, one task per worker (held at a start line until all run at once), the same for every subject; corewheel-async and async-io run their runtime-agnostic futures in it");
    let cells = plan.cells.iter().zip(&results);
    let too_late = "timers were due at once when polled";
    parallel::add_rows(&mut sheet, cells, (unit, too_late), |per| {
        vec![per.cpu, Some(per.wall), Some(1e3 / per.wall)]
    });
    sheet.finish(&mut out.csv);
}
