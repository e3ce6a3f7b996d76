//! The async workloads: timer futures from 1..N threads, corewheel's async layer against
//! tokio's timer, async-io (smol) and pingora-timeout.
//!
//! - async-sleep: a request timeout answered in time. Each task makes a sleep (delay uniform
//!   in 1 ms..30 s), polls it once, which arms it with the task's waker, and drops it, which
//!   cancels it.
//! - async-timeout: the same with `timeout()` around a read that is pending
//!   ([`PendingRead`](crate::peers::async_timers::PendingRead)): polled once (the read is
//!   polled, then the timer armed) and dropped.
//! - async-reset: idle timeouts. Each task holds 10,000 connections, each with one
//!   long-lived sleep of 30 s, armed (untimed) before the run; every read on a connection
//!   (one at random per operation) pushes its sleep to now + 30 s with the timer's own reset
//!   (pingora-timeout has none: its sleep is replaced by a new one, polled once).
//!
//! Every subject runs in the same setup: a tokio multi-thread runtime of T workers, one task
//! per worker, all tasks held at a start line until every one runs on a worker of its own.
//! corewheel's futures are runtime-agnostic, and async-io's too, so they run in the very
//! same runtime as tokio's, and the timer is the only difference. Every thread does the same number of operations,
//! so T threads do T times the work.
//!
//! The cost is the process's CPU time per operation, every thread's: the tasks', and the
//! timers' own threads (corewheel's engine workers, async-io's reactor thread, pingora's
//! timer thread), measured from the start until the
//! work's deferred part is done too (the engine seen settled, then the process seen idle).
//! The wall time from the start to the last task's end gives the throughput and the
//! scaling over threads.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::peers::Subject;
use crate::peers::async_timers::{self as timers, Reset};
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

/// How long a run waits for the process to go idle after its work before it gives up
/// waiting (and measures anyway).
const QUIET_LIMIT: Duration = Duration::from_secs(2);

/// How long the tasks of a run may take to finish their set-up.
const SET_UP_LIMIT: Duration = Duration::from_secs(60);

/// Where the tasks of a run wait, blocked (each holding its worker thread), once their
/// untimed set-up is done, while the main thread lets that set-up's deferred work finish
/// (the engine's workers filing timers, a reactor draining its queue), so that none of it
/// falls inside the timed run.
#[derive(Default)]
struct SetUpLine {
    /// Arrived tasks; released; called off.
    state: Mutex<(usize, bool, bool)>,
    changed: Condvar,
}

impl SetUpLine {
    /// Called by each task when set up: blocks until released; `false` if called off.
    fn arrive_and_block(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.0 += 1;
        self.changed.notify_all();
        while !state.1 && !state.2 {
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        !state.2
    }

    /// Waits until `tasks` tasks are set up; calls the run off if they take too long.
    fn gather(&self, tasks: usize) -> Result<(), String> {
        let started = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while state.0 < tasks {
            if started.elapsed() > SET_UP_LIMIT {
                state.2 = true;
                self.changed.notify_all();
                return Err(format!(
                    "only {} of {tasks} tasks were set up after {SET_UP_LIMIT:?}",
                    state.0
                ));
            }
            state = self
                .changed
                .wait_timeout(state, Duration::from_millis(10))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }

    fn release(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.1 = true;
        self.changed.notify_all();
    }
}

/// The two lines the tasks of a run pass: set up, then the start.
#[derive(Default)]
struct Lines {
    set_up: SetUpLine,
    start: StartLine,
}

impl Lines {
    /// A task's way from its set-up to the start: `false` if the run was called off.
    fn set_up_then_start(&self) -> bool {
        self.set_up.arrive_and_block() && self.start.arrive_and_wait()
    }
}

/// Which of the three workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sleep,
    Timeout,
    Reset,
}

/// One measurement's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Config {
    threads: usize,
    /// Operations per thread.
    ops: u64,
}

/// One task's share of async-sleep or async-timeout: `arm(delay)` makes the future, which
/// the task polls once and drops.
async fn once_share<F: Future + Send + 'static>(
    index: usize,
    lines: Arc<Lines>,
    ops: u64,
    arm: fn(Duration) -> F,
) -> Result<(Share, ()), String> {
    with_context(|cx| {
        let mut rng = rng(index as u64 + 13);
        let mut share = Share::new(std::thread::current().id());
        // One timer before the run, as a server has had many before any one: whatever the
        // subject starts on its first use (a process-wide engine or reactor, a thread's
        // state) is started untimed.
        let _ = register(pin!(arm(IDLE_TIMEOUT)), cx);
        if !lines.set_up_then_start() {
            return Err("the run was called off".to_string());
        }
        for _ in 0..ops {
            let timer = pin!(arm(request_timeout(&mut rng)));
            share.due_at_once += u64::from(register(timer, cx));
        }
        share.scheduled = ops;
        share.cancelled = ops;
        share.done = Instant::now();
        Ok((share, ()))
    })
    .await
}

/// One task's share of async-reset. Hands its connections' timers back, still armed, so
/// that their drop is not in the run.
async fn reset_share<F: Future + Send + 'static>(
    index: usize,
    lines: Arc<Lines>,
    ops: u64,
    arm: fn(Duration) -> F,
    reset: Reset<F>,
) -> Result<(Share, Vec<Pin<Box<F>>>), String> {
    let mut idle: Vec<Pin<Box<F>>> = (0..CONNECTIONS)
        .map(|_| Box::pin(arm(IDLE_TIMEOUT)))
        .collect();
    with_context(move |cx| {
        let mut rng = rng(index as u64 + 13);
        let mut share = Share::new(std::thread::current().id());
        for timer in &mut idle {
            share.due_at_once += u64::from(register(timer.as_mut(), cx));
        }
        share.scheduled = CONNECTIONS;
        if !lines.set_up_then_start() {
            return Err("the run was called off".to_string());
        }
        match reset {
            Reset::InPlace(reset) => {
                for _ in 0..ops {
                    let timer = idle[rng.u64(..CONNECTIONS) as usize].as_mut();
                    reset(timer, Instant::now() + IDLE_TIMEOUT);
                }
            }
            Reset::Recreate => {
                for _ in 0..ops {
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

/// Waits until this process has used less than 5% of one CPU over a millisecond (at most
/// [`QUIET_LIMIT`]): the timers' own threads have done what the run left them. Returns the
/// process CPU time then.
fn wait_until_quiet() -> Option<Duration> {
    let window = Duration::from_millis(1);
    let started = Instant::now();
    let mut last = process_cpu_time()?;
    loop {
        std::thread::sleep(window);
        let now = process_cpu_time()?;
        if now.saturating_sub(last) < window / 20 || started.elapsed() > QUIET_LIMIT {
            return Some(now);
        }
        last = now;
    }
}

/// What the runner does once the tasks are done, before the CPU reading: waits for the
/// subject's deferred work where it can see it (corewheel: the default engine settled).
type Settle = Option<fn() -> Result<(), String>>;

/// Runs `body` as `tasks` tasks of a fresh runtime with as many workers and the chosen
/// timer. Once every task is set up (and blocked), waits for the process to go idle; then
/// lets them to the start line. Timed from the start to the last task's end (wall), and to
/// the end of the deferred work (CPU). Each task's leftovers are checked by `check` and
/// dropped after the readings, inside the runtime.
fn on_runtime<B, Fut, L>(
    tasks: usize,
    settle: Settle,
    check: fn(&mut [L]) -> Result<(), String>,
    body: B,
) -> Result<Run, String>
where
    B: Fn(usize, Arc<Lines>) -> Fut,
    Fut: Future<Output = Result<(Share, L), String>> + Send + 'static,
    L: Send + 'static,
{
    let runtime = runtime(tasks)?;
    let lines = Arc::new(Lines::default());
    let handles: Vec<_> = (0..tasks)
        .map(|index| runtime.spawn(body(index, Arc::clone(&lines))))
        .collect();
    lines.set_up.gather(tasks)?;
    wait_until_quiet();
    lines.set_up.release();
    lines.start.gather(tasks)?;
    let cpu_before = process_cpu_time();
    let start = lines.start.go();
    let results: Vec<Result<(Share, L), String>> = runtime.block_on(async {
        let mut results = Vec::with_capacity(handles.len());
        for handle in handles {
            results.push(
                handle
                    .await
                    .unwrap_or_else(|error| Err(format!("a task failed: {error}"))),
            );
        }
        results
    });
    let settled = settle.map_or(Ok(()), |settle| settle());
    let cpu_after = wait_until_quiet();
    settled?;
    let (shares, mut leftovers): (Vec<Share>, Vec<L>) = results
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .unzip();
    check_spread(&shares.iter().map(|share| share.thread).collect::<Vec<_>>())?;
    let checked = runtime.block_on(async { check(&mut leftovers) });
    {
        let _guard = runtime.enter();
        drop(leftovers);
    }
    drop(runtime);
    checked?;
    let end = shares.iter().map(|share| share.done).max().unwrap_or(start);
    Ok(Run {
        wall: end - start,
        app: end - start,
        cpu: cpu_between(cpu_before, cpu_after),
        worker_cpu: None,
        settle: None,
        too_late: shares.iter().map(|share| share.too_late).sum(),
        due_at_once: shares.iter().map(|share| share.due_at_once).sum(),
        pool_bytes: None,
    })
}

fn nothing_to_check(_: &mut [()]) -> Result<(), String> {
    Ok(())
}

/// After async-reset: every connection's timer must still be waiting (polled once more,
/// with a waker that does nothing), or a reset lost it.
fn all_pending<F: Future>(idle: &mut [Vec<Pin<Box<F>>>]) -> Result<(), String> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let fired = idle
        .iter_mut()
        .flatten()
        .map(|timer| usize::from(timer.as_mut().poll(&mut cx).is_ready()))
        .sum::<usize>();
    if fired > 0 {
        return Err(format!("{fired} connections' idle timers fired"));
    }
    Ok(())
}

fn once<F: Future + Send + 'static>(
    config: Config,
    settle: Settle,
    arm: fn(Duration) -> F,
) -> Result<Run, String> {
    on_runtime(config.threads, settle, nothing_to_check, |index, lines| {
        once_share(index, lines, config.ops, arm)
    })
}

fn resets<F: Future + Send + 'static>(
    config: Config,
    settle: Settle,
    arm: fn(Duration) -> F,
    reset: fn() -> Reset<F>,
) -> Result<Run, String> {
    on_runtime(config.threads, settle, all_pending, |index, lines| {
        reset_share(index, lines, config.ops, arm, reset())
    })
}

/// One run of `kind` for `subject`.
fn measure(kind: Kind, subject: Subject, config: Config) -> Result<Run, String> {
    match (subject, kind) {
        (Subject::Tokio, Kind::Sleep) => once(config, None, timers::tokio_sleep),
        (Subject::Tokio, Kind::Timeout) => once(config, None, timers::tokio_timeout_read),
        (Subject::Tokio, Kind::Reset) => resets(config, None, timers::tokio_sleep, || {
            Reset::InPlace(timers::tokio_reset)
        }),
        (Subject::AsyncIo, Kind::Sleep) => once(config, None, timers::async_io_sleep),
        (Subject::AsyncIo, Kind::Timeout) => once(config, None, timers::async_io_timeout_read),
        (Subject::AsyncIo, Kind::Reset) => resets(config, None, timers::async_io_sleep, || {
            Reset::InPlace(timers::async_io_reset)
        }),
        (Subject::PingoraTimeout, Kind::Sleep) => once(config, None, timers::pingora_sleep),
        (Subject::PingoraTimeout, Kind::Timeout) => {
            once(config, None, timers::pingora_timeout_read)
        }
        (Subject::PingoraTimeout, Kind::Reset) => {
            resets(config, None, timers::pingora_sleep, || Reset::Recreate)
        }
        // corewheel's async layer, in the same runtime as tokio's timer. After the sleeps
        // and timeouts, the run waits for the default engine to settle (every timer's
        // cancel done by its workers) before its CPU reading; the idle sleeps of
        // async-reset stay pending, so there the wait for the process to go idle stands for
        // it.
        (Subject::CorewheelAsync, Kind::Sleep) => once(
            config,
            Some(timers::settle_corewheel),
            timers::corewheel_sleep,
        ),
        (Subject::CorewheelAsync, Kind::Timeout) => once(
            config,
            Some(timers::settle_corewheel),
            timers::corewheel_timeout_read,
        ),
        (Subject::CorewheelAsync, Kind::Reset) => {
            resets(config, None, timers::corewheel_sleep, || {
                Reset::InPlace(timers::corewheel_reset)
            })
        }
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
    let unit = if kind == Kind::Reset {
        "reset"
    } else {
        "timer"
    };
    let name = workload.name();
    let title = match kind {
        Kind::Sleep => format!(
            "{name} (poll a sleep once and drop it; {} per thread per run, delays uniform in 1 ms..30 s)",
            thousands(ops)
        ),
        Kind::Timeout => format!(
            "{name} (timeout() around a pending read, polled once and dropped; {} per thread per run, delays uniform in 1 ms..30 s)",
            thousands(ops)
        ),
        Kind::Reset => format!(
            "{name} ({} connections per thread, each with a 30 s idle sleep; {} resets per thread per run)",
            thousands(CONNECTIONS),
            thousands(ops)
        ),
    };
    let cols = vec![
        Col::new(
            format!("CPU ns/{unit}"),
            if unit == "reset" {
                "cpu_ns_per_reset"
            } else {
                "cpu_ns_per_timer"
            },
            "ns",
            1,
        )
        .ratios(),
        Col::new(
            format!("ns/{unit}"),
            if unit == "reset" {
                "ns_per_reset"
            } else {
                "ns_per_timer"
            },
            "ns",
            1,
        ),
        Col::new(
            format!("M{unit}s/s"),
            if unit == "reset" {
                "mresets_per_s"
            } else {
                "mtimers_per_s"
            },
            "M/s",
            2,
        )
        .rate(),
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
        sheet.add(
            cell.subject,
            cell.threads,
            true,
            values.map_err(Clone::clone),
        );
    }
    sheet.note(match kind {
        Kind::Sleep => "timer = make a sleep, poll it once (which arms it with the task's waker), drop it (which cancels it)",
        Kind::Timeout => "timer = make a timeout() around a read that is pending and never woken, poll it once (the read, then the timer armed), drop it",
        Kind::Reset => "reset = push a random connection's idle sleep (the task's own) to now + 30 s: Sleep::reset / Timer::set_at; pingora-timeout has no reset, so its sleep is replaced by a new one and polled once; nothing is due during a run, so the work both wheels defer to the old deadline is not in it",
    });
    sheet.note(format!(
        "CPU ns/{unit} = process CPU time (every thread: the tasks', the timers' own threads) from the start line until the deferred work is done (corewheel: the engine settled; then, for every subject, the process idle) / {unit}s; ns/{unit} = wall time from the start line to the last task's end / {unit}s, all threads together"
    ));
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
