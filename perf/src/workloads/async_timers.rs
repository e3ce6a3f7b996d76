//! The async workloads: timer futures from 1..N threads, corewheel's async layer against tokio's timer, async-io
//! (smol) and pingora-timeout, in the same setup: a tokio runtime of T workers, one task per worker, each held at a
//! start line until all run on workers of their own (corewheel's and async-io's futures are runtime-agnostic, so the
//! timer is the only difference), each doing the same number of operations.
//!
//! - async-sleep: a request timeout answered in time: a sleep (delay uniform in 1 ms..30 s) polled once, which arms
//!   it with the task's waker, and dropped, which cancels it.
//! - async-timeout: the same with `timeout()` around a read that is pending.
//! - async-reset: idle timeouts: 10,000 connections per task, each with a 30 s sleep armed untimed; each read (a
//!   random connection) pushes its sleep to now + 30 s with the timer's own reset (pingora-timeout has none: its
//!   sleep is replaced by a new one).
//!
//! The cost is the process's CPU time per operation, every thread's (the timers' own threads included), until the
//! work's deferred part is done too (the engine seen settled, then the process seen idle); the wall time to the last
//! task's end gives throughput and scaling.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Arc, Barrier};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use crate::peers::Subject;
use crate::peers::async_timers::{self as timers, Reset as Move};
use crate::peers::tokio_sleep::{StartLine, check_spread, register, runtime, with_context};
use crate::report::{Col, Sheet, thousands};
use crate::runner::{Cell, Plan, RUNS};
use crate::sys::{cpu_between, process_cpu_time};
use crate::workloads::parallel::{self, Run, Share};
use crate::workloads::{Out, Workload, request_timeout, rng};

/// Connections per thread in async-reset, each with one idle timer.
const CONNECTIONS: u64 = 10_000;
/// How long a connection may stay idle.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a run waits for the process to go idle after its work before it gives up waiting (and measures anyway).
const QUIET_LIMIT: Duration = Duration::from_secs(2);

/// Which of the three workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sleep,
    Timeout,
    Reset,
}

/// The lines the tasks of a run pass: set up, where they block (each holding its worker thread) while the main thread
/// lets that set-up's deferred work finish (the engine's workers filing timers, a reactor draining its queue) so that
/// none of it falls inside the timed run; then the start.
struct Lines {
    set_up: Barrier,
    released: Barrier,
    start: StartLine,
}

impl Lines {
    /// A task's way from its set-up to the start: `false` if the run was called off.
    fn set_up_then_start(&self) -> bool {
        self.set_up.wait();
        self.released.wait();
        self.start.arrive_and_wait()
    }
}

/// One task's share: `ops` timers made by `arm`, each polled once and dropped; or, with `reset`, `ops` resets of its
/// connections' idle timers, which it hands back still armed, so that their drop is not in the run.
async fn share<F: Future + Send + 'static>(
    index: usize,
    lines: Arc<Lines>,
    ops: u64,
    arm: fn(Duration) -> F,
    reset: Option<Move<F>>,
) -> Result<(Share, Vec<Pin<Box<F>>>), String> {
    let connections = if reset.is_some() { CONNECTIONS } else { 0 };
    let mut idle: Vec<Pin<Box<F>>> = (0..connections)
        .map(|_| Box::pin(arm(IDLE_TIMEOUT)))
        .collect();
    with_context(move |cx| {
        let mut rng = rng(index as u64 + 13);
        let mut share = Share::new();
        // One timer before the run, as a server has had many before any one: whatever the subject starts on its first
        // use (a process-wide engine or reactor, a thread's state) is started untimed.
        let _ = register(pin!(arm(IDLE_TIMEOUT)), cx);
        for timer in &mut idle {
            share.due_at_once += u64::from(register(timer.as_mut(), cx));
        }
        if !lines.set_up_then_start() {
            return Err("the run was called off".to_string());
        }
        for _ in 0..ops {
            match &reset {
                None => {
                    share.due_at_once +=
                        u64::from(register(pin!(arm(request_timeout(&mut rng))), cx))
                }
                Some(Move::InPlace(reset)) => reset(
                    idle[rng.u64(..CONNECTIONS) as usize].as_mut(),
                    Instant::now() + IDLE_TIMEOUT,
                ),
                Some(Move::Recreate) => {
                    let mut timer = idle[rng.u64(..CONNECTIONS) as usize].as_mut();
                    timer.set(arm(IDLE_TIMEOUT));
                    share.due_at_once += u64::from(register(timer, cx));
                }
            }
        }
        share.done = Instant::now();
        Ok((share, idle))
    })
    .await
}

/// Waits until this process has used less than 5% of one CPU over a millisecond: the timers' own threads have done
/// what the run left them. Returns its CPU time then.
fn wait_until_quiet() -> Option<Duration> {
    crate::sys::wait_until_quiet(process_cpu_time, Duration::from_millis(1), QUIET_LIMIT)
}

/// Runs a [`share`] per task on a fresh runtime of `config.threads` workers. Once every task is set up (and blocked),
/// waits for the process to go idle; then lets them to the start line. Timed from the start to the last task's end
/// (wall), and to the end of the deferred work (CPU): `settle`'s wait for it where the subject shows it, then the
/// process idle. The connections' timers must all still be pending afterwards, or a reset lost one.
fn on_runtime<F: Future + Send + 'static>(
    config: Config,
    settle: Option<fn() -> Result<(), String>>,
    arm: fn(Duration) -> F,
    reset: Option<fn() -> Move<F>>,
) -> Result<Run, String> {
    let tasks = config.threads;
    let runtime = runtime(tasks)?;
    let lines = Arc::new(Lines {
        set_up: Barrier::new(tasks + 1),
        released: Barrier::new(tasks + 1),
        start: StartLine::default(),
    });
    let handles: Vec<_> = (0..tasks)
        .map(|index| {
            runtime.spawn(share(
                index,
                Arc::clone(&lines),
                config.ops,
                arm,
                reset.map(|reset| reset()),
            ))
        })
        .collect();
    lines.set_up.wait();
    wait_until_quiet();
    lines.released.wait();
    lines.start.gather(tasks)?;
    let cpu = process_cpu_time();
    let start = lines.start.go();
    let results = runtime.block_on(parallel::join_all(handles));
    let settled = settle.map_or(Ok(()), |settle| settle());
    let cpu = cpu_between(cpu, wait_until_quiet());
    settled?;
    let (shares, mut idle): (Vec<Share>, Vec<_>) = results
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .unzip();
    check_spread(&shares.iter().map(|share| share.thread).collect::<Vec<_>>())?;
    let mut cx = Context::from_waker(Waker::noop());
    let fired = runtime.block_on(async {
        idle.iter_mut()
            .flatten()
            .map(|timer| usize::from(timer.as_mut().poll(&mut cx).is_ready()))
            .sum::<usize>()
    });
    {
        let _guard = runtime.enter();
        drop(idle);
    }
    if fired > 0 {
        return Err(format!("{fired} connections' idle timers fired"));
    }
    Ok(Run {
        cpu,
        ..Run::of(start, &shares)
    })
}

/// One measurement's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Config {
    threads: usize,
    /// Operations per thread.
    ops: u64,
}

/// One run of `kind` for `subject`. corewheel's runs wait for the default engine to settle (every timer's cancel done
/// by its workers) before the CPU reading; the idle sleeps of async-reset stay pending, so there the wait for the
/// process to go idle stands for it.
fn measure(kind: Kind, subject: Subject, config: Config) -> Result<Run, String> {
    use Kind::*;
    use Subject::*;
    let settle = Some(timers::settle_corewheel as fn() -> Result<(), String>);
    match (subject, kind) {
        (Tokio, Sleep) => on_runtime(config, None, timers::tokio_sleep, None),
        (Tokio, Timeout) => on_runtime(config, None, timers::tokio_timeout_read, None),
        (Tokio, Reset) => on_runtime(
            config,
            None,
            timers::tokio_sleep,
            Some(|| Move::InPlace(timers::tokio_reset)),
        ),
        (AsyncIo, Sleep) => on_runtime(config, None, timers::async_io_sleep, None),
        (AsyncIo, Timeout) => on_runtime(config, None, timers::async_io_timeout_read, None),
        (AsyncIo, Reset) => on_runtime(
            config,
            None,
            timers::async_io_sleep,
            Some(|| Move::InPlace(timers::async_io_reset)),
        ),
        (PingoraTimeout, Sleep) => on_runtime(config, None, timers::pingora_sleep, None),
        (PingoraTimeout, Timeout) => on_runtime(config, None, timers::pingora_timeout_read, None),
        (PingoraTimeout, Reset) => {
            on_runtime(config, None, timers::pingora_sleep, Some(|| Move::Recreate))
        }
        (CorewheelAsync, Sleep) => on_runtime(config, settle, timers::corewheel_sleep, None),
        (CorewheelAsync, Timeout) => {
            on_runtime(config, settle, timers::corewheel_timeout_read, None)
        }
        (CorewheelAsync, Reset) => on_runtime(
            config,
            None,
            timers::corewheel_sleep,
            Some(|| Move::InPlace(timers::corewheel_reset)),
        ),
        _ => Err(format!("{} is not an async subject", subject.name())),
    }
}

/// Runs `plan`'s cells of async `workload` and prints its table.
pub fn run(workload: Workload, plan: &Plan, ops: u64, out: &mut Out) {
    let kind = match workload {
        Workload::AsyncTimeout => Kind::Timeout,
        Workload::AsyncReset => Kind::Reset,
        _ => Kind::Sleep,
    };
    let results = parallel::measure(
        plan,
        |cell| ops * cell.threads as u64,
        |cell: &Cell| {
            measure(
                kind,
                cell.subject,
                Config {
                    threads: cell.threads,
                    ops,
                },
            )
        },
    );
    let (unit, name, ops_text) = (
        if kind == Kind::Reset {
            "reset"
        } else {
            "timer"
        },
        workload.name(),
        thousands(ops),
    );
    let title = match kind {
        Kind::Sleep => format!(
            "{name} (poll a sleep once and drop it; {ops_text} per thread per run, delays uniform in 1 ms..30 s)"
        ),
        Kind::Timeout => format!(
            "{name} (timeout() around a pending read, polled once and dropped; {ops_text} per thread per run, delays uniform in 1 ms..30 s)"
        ),
        Kind::Reset => format!(
            "{name} (10,000 connections per thread, each with a 30 s idle sleep; {ops_text} resets per thread per run)"
        ),
    };
    let cols = vec![
        Col::new(
            format!("CPU ns/{unit}"),
            format!("cpu_ns_per_{unit}"),
            "ns",
            1,
        )
        .ratios(),
        Col::new(format!("ns/{unit}"), format!("ns_per_{unit}"), "ns", 1),
        Col::new(format!("M{unit}s/s"), format!("m{unit}s_per_s"), "M/s", 2).rate(),
    ];
    let mut sheet = Sheet::new(name, title, ops, cols);
    sheet.scaling = Some(1);
    let mut spreads = Vec::new();
    let mut notes = Vec::new();
    for (cell, result) in plan.cells.iter().zip(&results) {
        let values = result.as_ref().map(|m| {
            let label = format!("{}, {}", cell.subject.name(), cell.threads);
            spreads.push(format!(
                "{label}: {:.1}-{:.1}",
                m.per.wall_min, m.per.wall_max
            ));
            if m.too_late > 0 {
                notes.push(format!(
                    "{label}: {} timers were due at once when polled, over {RUNS} runs",
                    thousands(m.too_late)
                ));
            }
            vec![m.per.cpu, Some(m.per.wall), Some(1e3 / m.per.wall)]
        });
        sheet.add(cell.subject, cell.threads, values.map_err(Clone::clone));
    }
    sheet.note(match kind {
        Kind::Sleep => "timer = make a sleep, poll it once (which arms it with the task's waker), drop it (which cancels it)",
        Kind::Timeout => "timer = make a timeout() around a read that is pending and never woken, poll it once (the read, then the timer armed), drop it",
        Kind::Reset => "reset = push a random connection's idle sleep (the task's own) to now + 30 s: Sleep::reset / Timer::set_at; pingora-timeout has no reset, so its sleep is replaced by a new one and polled once; nothing is due during a run, so the work both wheels defer to the old deadline is not in it",
    });
    sheet.note(format!("CPU ns/{unit} = process CPU time (every thread: the tasks', the timers' own threads) from the start line until the deferred work is done (corewheel: the engine settled; then, for every subject, the process idle) / {unit}s; ns/{unit} = wall time from the start line to the last task's end / {unit}s, all threads together" ));
    sheet.note("setup: a tokio rt-multi-thread runtime of T workers, one task per worker (held at a start line until all run at once), the same for every subject; corewheel-async and async-io run their runtime-agnostic futures in it");
    sheet.note(format!(
        "median of {RUNS} runs per subject, taken in turns; ns/{unit} range: {}",
        spreads.join(", ")
    ));
    for note in notes {
        sheet.note(note);
    }
    sheet.finish(&mut out.csv);
}
