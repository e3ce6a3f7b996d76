//! The async workloads: timer futures from 1..N threads, corewheel's async layer against
//! tokio's default timer, tokio's alternative timer, async-io (smol) and pingora-timeout.
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
//! same runtime as tokio's, and the timer is the only difference; tokio-alt's runtime has
//! the alternative timer enabled instead. Every thread does the same number of operations,
//! so T threads do T times the work.
//!
//! The cost is the process's CPU time per operation, every thread's: the tasks', and the
//! timers' own threads (corewheel's engine workers, async-io's reactor thread, pingora's
//! timer thread, tokio-alt's deferred cancellations), measured from the start until the
//! work's deferred part is done too (the engine seen settled, then the process seen idle).
//! The wall time from the start to the last task's end gives the throughput and the
//! scaling over threads.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::child;
use crate::cpu_time::{cpu_between, process_cpu_time};
use crate::peers::Subject;
use crate::peers::async_timers::{self as timers, Reset, TokioTimer};
use crate::peers::tokio_sleep::{StartLine, check_spread, register, with_context};
use crate::repeat;
use crate::report::{Csv, CsvRow, Table, thousands};
use crate::rng::XorShift64;
use crate::workloads::parallel::{Measured, PerUnit, Run, Share};
use crate::workloads::request_timeout;

pub const SLEEP: &str = "async-sleep";
pub const TIMEOUT: &str = "async-timeout";
pub const RESET: &str = "async-reset";

/// Connections per thread in async-reset, each with one idle timer.
pub const CONNECTIONS: u64 = 10_000;
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Operations per thread and run, by default and at `--full`.
pub const DEFAULT_OPS: u64 = 1_000_000;
pub const FULL_OPS: u64 = 10_000_000;

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
pub enum Kind {
    Sleep,
    Timeout,
    Reset,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Sleep, Kind::Timeout, Kind::Reset];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Sleep => SLEEP,
            Kind::Timeout => TIMEOUT,
            Kind::Reset => RESET,
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// What one operation is, as the headers name it.
    fn unit(self) -> &'static str {
        match self {
            Kind::Sleep | Kind::Timeout => "timer",
            Kind::Reset => "reset",
        }
    }
}

/// One measurement's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    pub threads: usize,
    /// Operations per thread.
    pub ops: u64,
}

impl Config {
    fn units(self) -> u64 {
        self.ops * self.threads as u64
    }
}

/// The name a child process is given for a measurement: `async-sleep@2` (the workload and
/// the thread count; the operations per thread go in the child's size field).
pub fn child_workload(kind: Kind, threads: usize) -> String {
    format!("{}@{threads}", kind.name())
}

/// Reads [`child_workload`]'s name back.
pub fn parse_child_workload(name: &str) -> Option<(Kind, usize)> {
    let (kind, threads) = name.split_once('@')?;
    let threads = threads.parse().ok().filter(|&t| t > 0)?;
    Some((Kind::parse(kind)?, threads))
}

/// A run as a child prints it: wall, application and CPU nanoseconds (`-` when there is no
/// CPU clock), then the counts of timers found fired and of timers due at once.
pub fn encode_run(run: &Run) -> String {
    format!(
        "{} {} {} {} {}\n",
        run.wall.as_nanos(),
        run.app.as_nanos(),
        run.cpu
            .map_or_else(|| "-".to_string(), |cpu| cpu.as_nanos().to_string()),
        run.too_late,
        run.due_at_once
    )
}

/// Reads [`encode_run`]'s line back.
pub fn decode_run(text: &str) -> Result<Run, String> {
    let bad = || format!("a child printed {text:?}, not a run");
    let words: Vec<&str> = text.split_whitespace().collect();
    let [wall, app, cpu, too_late, due_at_once] = words[..] else {
        return Err(bad());
    };
    let nanos = |word: &str| {
        word.parse::<u64>()
            .map(Duration::from_nanos)
            .map_err(|_| bad())
    };
    Ok(Run {
        wall: nanos(wall)?,
        app: nanos(app)?,
        cpu: match cpu {
            "-" => None,
            cpu => Some(nanos(cpu)?),
        },
        worker_cpu: None,
        settle: None,
        too_late: too_late.parse().map_err(|_| bad())?,
        due_at_once: due_at_once.parse().map_err(|_| bad())?,
        pool_bytes: None,
    })
}

/// A child process's side: the measurement `workload` (a [`child_workload`] name) names.
pub fn measure_in_child(
    workload: &str,
    subject: Subject,
    ops: u64,
) -> Option<Result<String, String>> {
    let (kind, threads) = parse_child_workload(workload)?;
    Some(measure(kind, subject, Config { threads, ops }).map(|run| encode_run(&run)))
}

fn seed(index: usize) -> u64 {
    XorShift64::SEED ^ (index as u64 + 13).wrapping_mul(0x9E37_79B9_7F4A_7C15)
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
        let mut rng = XorShift64::new(seed(index));
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
        let mut rng = XorShift64::new(seed(index));
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
                    let timer = idle[rng.below(CONNECTIONS) as usize].as_mut();
                    reset(timer, Instant::now() + IDLE_TIMEOUT);
                }
            }
            Reset::Recreate => {
                for _ in 0..ops {
                    let mut timer = idle[rng.below(CONNECTIONS) as usize].as_mut();
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
    timer: TokioTimer,
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
    let runtime = timers::runtime(tasks, timer)?;
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
    timer: TokioTimer,
    config: Config,
    settle: Settle,
    arm: fn(Duration) -> F,
) -> Result<Run, String> {
    on_runtime(
        timer,
        config.threads,
        settle,
        nothing_to_check,
        |index, lines| once_share(index, lines, config.ops, arm),
    )
}

fn resets<F: Future + Send + 'static>(
    timer: TokioTimer,
    config: Config,
    settle: Settle,
    arm: fn(Duration) -> F,
    reset: fn() -> Reset<F>,
) -> Result<Run, String> {
    on_runtime(
        timer,
        config.threads,
        settle,
        all_pending,
        |index, lines| reset_share(index, lines, config.ops, arm, reset()),
    )
}

/// One run of `kind` for `subject`.
pub fn measure(kind: Kind, subject: Subject, config: Config) -> Result<Run, String> {
    use TokioTimer::{Alt, Default};
    match subject {
        Subject::TokioAlt if !timers::HAS_ALT_TIMER => measure_in_unstable_copy(kind, config),
        Subject::Tokio | Subject::TokioAlt => {
            let timer = if subject == Subject::Tokio {
                Default
            } else {
                Alt
            };
            match kind {
                Kind::Sleep => once(timer, config, None, timers::tokio_sleep),
                Kind::Timeout => once(timer, config, None, timers::tokio_timeout_read),
                Kind::Reset => resets(timer, config, None, timers::tokio_sleep, || {
                    Reset::InPlace(timers::tokio_reset)
                }),
            }
        }
        Subject::AsyncIo => match kind {
            Kind::Sleep => once(Default, config, None, timers::async_io_sleep),
            Kind::Timeout => once(Default, config, None, timers::async_io_timeout_read),
            Kind::Reset => resets(Default, config, None, timers::async_io_sleep, || {
                Reset::InPlace(timers::async_io_reset)
            }),
        },
        Subject::PingoraTimeout => match kind {
            Kind::Sleep => once(Default, config, None, timers::pingora_sleep),
            Kind::Timeout => once(Default, config, None, timers::pingora_timeout_read),
            Kind::Reset => resets(Default, config, None, timers::pingora_sleep, || {
                Reset::Recreate
            }),
        },
        Subject::CorewheelAsync => measure_corewheel(kind, config),
        _ => Err(format!("{} is not an async subject", subject.name())),
    }
}

/// corewheel's async layer, in the same runtime as tokio's default timer. After the
/// sleeps and timeouts, the run waits for the default engine to settle (every timer's
/// cancel done by its workers, every node back in the pool) before its CPU reading; the
/// idle sleeps of async-reset stay pending, so there the wait for the process to go idle
/// stands for it.
fn measure_corewheel(kind: Kind, config: Config) -> Result<Run, String> {
    use TokioTimer::Default;
    let settle: Settle = Some(timers::settle_corewheel);
    match kind {
        Kind::Sleep => once(Default, config, settle, timers::corewheel_sleep),
        Kind::Timeout => once(Default, config, settle, timers::corewheel_timeout_read),
        Kind::Reset => resets(Default, config, None, timers::corewheel_sleep, || {
            Reset::InPlace(timers::corewheel_reset)
        }),
    }
}

/// tokio-alt in the copy of the harness built with `--cfg tokio_unstable`, one run per
/// child process.
fn measure_in_unstable_copy(kind: Kind, config: Config) -> Result<Run, String> {
    if child::is_child() {
        return Err("this child was not built with --cfg tokio_unstable".to_string());
    }
    let exe = crate::unstable_build::exe()?;
    let printed = child::run_in(
        &exe,
        &child_workload(kind, config.threads),
        Subject::TokioAlt,
        config.ops,
    )
    .map_err(|error| match error {
        child::Error::Spawn(error) => format!("could not start {}: {error}", exe.display()),
        child::Error::Failed(error) => error,
    })?;
    decode_run(&printed)
}

/// Per workload and thread count, corewheel-async's ratios, for the summary table.
#[derive(Default)]
pub struct Summary {
    /// (workload, threads, corewheel's CPU ns/op, per peer: name and ratio, own scaling).
    rows: Vec<SummaryRow>,
}

struct SummaryRow {
    workload: &'static str,
    threads: usize,
    cpu: Option<f64>,
    ratios: Vec<(&'static str, Option<f64>)>,
    scaling: Option<f64>,
}

impl Summary {
    /// The table of every async workload's corewheel ratios side by side; `None` when no
    /// async workload ran with corewheel-async and a peer.
    pub fn table(&self) -> Option<Table> {
        let first = self.rows.first()?;
        let peers: Vec<&str> = first.ratios.iter().map(|(peer, _)| *peer).collect();
        let mut header = vec![
            "workload, threads".to_string(),
            "corewheel CPU ns/op".to_string(),
        ];
        header.extend(peers.iter().map(|peer| format!("vs {peer}")));
        header.push("vs own 1 thread".to_string());
        let header: Vec<&str> = header.iter().map(String::as_str).collect();
        let mut table = Table::new(
            "async: corewheel-async against every peer (CPU ns per operation, ratios)",
            &header,
        );
        for row in &self.rows {
            let mut cells = vec![
                format!("{}, {}", row.workload, row.threads),
                row.cpu
                    .map_or_else(|| "error".to_string(), |cpu| format!("{cpu:.1}")),
            ];
            for peer in &peers {
                let ratio = row
                    .ratios
                    .iter()
                    .find(|(name, _)| name == peer)
                    .and_then(|(_, ratio)| *ratio);
                cells.push(ratio.map_or_else(|| "n/a".to_string(), |r| format!("{r:.2}x")));
            }
            cells.push(match row.scaling {
                _ if row.threads == 1 => "-".to_string(),
                Some(scaling) => format!("{scaling:.2}x"),
                None => "n/a".to_string(),
            });
            table.row(cells);
        }
        table.note("vs X = X's CPU ns per operation / corewheel-async's, at the same thread count: above 1 means corewheel-async did the same work for less CPU");
        table.note("vs own 1 thread = corewheel-async's throughput (operations / wall time) at this thread count / at 1 thread; every thread does the same number of operations");
        Some(table)
    }
}

/// Runs `kind` at each thread count, prints its table and adds its rows to the CSV and the
/// summary.
pub fn run(
    kind: Kind,
    subjects: &[Subject],
    threads: &[usize],
    ops: u64,
    csv: &mut Csv,
    summary: &mut Summary,
) {
    // corewheel's rows first, then the peers in the order given.
    let mut subjects = subjects.to_vec();
    subjects.sort_by_key(|subject| !subject.is_corewheel());
    let subjects = &subjects[..];
    let measured: Vec<Measured> = threads
        .iter()
        .map(|&t| {
            let config = Config { threads: t, ops };
            Measured::take(subjects, t, config.units(), |subject, run| {
                crate::progress::step(format!(
                    "{}/{} ({t} threads, run {})",
                    kind.name(),
                    subject.name(),
                    run + 1
                ));
                measure(kind, subject, config)
            })
        })
        .collect();
    let table = build_table(kind, subjects, &measured, ops, csv, summary);
    table.print();
}

fn build_table(
    kind: Kind,
    subjects: &[Subject],
    measured: &[Measured],
    ops: u64,
    csv: &mut Csv,
    summary: &mut Summary,
) -> Table {
    let unit = kind.unit();
    let peers: Vec<usize> = (0..subjects.len())
        .filter(|&i| !subjects[i].is_corewheel())
        .collect();
    let mut header = vec![
        "subject, threads".to_string(),
        format!("CPU ns/{unit}"),
        format!("ns/{unit}"),
        format!("M{unit}s/s"),
    ];
    header.extend(peers.iter().map(|&p| format!("vs {}", subjects[p].name())));
    header.push("vs own 1 thread".to_string());
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let title = match kind {
        Kind::Sleep => format!(
            "{SLEEP} (poll a sleep once and drop it; {} per thread per run, delays uniform in 1 ms..30 s)",
            thousands(ops)
        ),
        Kind::Timeout => format!(
            "{TIMEOUT} (timeout() around a pending read, polled once and dropped; {} per thread per run, delays uniform in 1 ms..30 s)",
            thousands(ops)
        ),
        Kind::Reset => format!(
            "{RESET} ({} connections per thread, each with a 30 s idle sleep; {} resets per thread per run)",
            thousands(CONNECTIONS),
            thousands(ops)
        ),
    };
    let mut table = Table::new(title, &header);
    let one_thread = measured.iter().find(|m| m.threads == 1);
    let cpu_of = |result: &Result<PerUnit, String>| result.as_ref().ok().and_then(|per| per.cpu);
    let mut spreads = Vec::new();
    let (cpu_metric, wall_metric, rate_metric, summary_name) = match kind {
        Kind::Reset => ("cpu_ns_per_reset", "ns_per_reset", "mresets_per_s", RESET),
        Kind::Sleep => ("cpu_ns_per_timer", "ns_per_timer", "mtimers_per_s", SLEEP),
        Kind::Timeout => ("cpu_ns_per_timer", "ns_per_timer", "mtimers_per_s", TIMEOUT),
    };
    for m in measured {
        for (row, subject) in subjects.iter().enumerate() {
            let name = format!("{}, {}", subject.name(), m.threads);
            let Ok(per) = &m.results[row] else {
                table.row(vec![name, "error".to_string()]);
                continue;
            };
            let ratios: Vec<(Subject, Option<f64>)> = peers
                .iter()
                .map(|&p| {
                    let ratio = match (cpu_of(&m.results[p]), per.cpu) {
                        (Some(peer), Some(own)) if subject.is_corewheel() && own > 0.0 => {
                            Some(peer / own)
                        }
                        _ => None,
                    };
                    (subjects[p], ratio)
                })
                .collect();
            let scaling = match one_thread.map(|one| &one.results[row]) {
                Some(Ok(one)) if m.threads > 1 => Some(one.wall / per.wall),
                _ => None,
            };
            let mut cells = vec![
                name.clone(),
                per.cpu
                    .map_or_else(|| "n/a".to_string(), |cpu| format!("{cpu:.1}")),
                format!("{:.1}", per.wall),
                format!("{:.2}", 1e3 / per.wall),
            ];
            cells.extend(ratios.iter().map(|(_, ratio)| match ratio {
                _ if !subject.is_corewheel() => "-".to_string(),
                Some(ratio) => format!("{ratio:.2}x"),
                None => "n/a".to_string(),
            }));
            cells.push(match scaling {
                _ if m.threads == 1 => "-".to_string(),
                Some(scaling) => format!("{scaling:.2}x"),
                None => "n/a".to_string(),
            });
            table.row(cells);
            spreads.push(format!("{name}: {:.1}-{:.1}", per.wall_min, per.wall_max));
            if subject.is_corewheel() {
                summary.rows.push(SummaryRow {
                    workload: summary_name,
                    threads: m.threads,
                    cpu: per.cpu,
                    ratios: ratios
                        .iter()
                        .map(|(peer, ratio)| (peer.name(), *ratio))
                        .collect(),
                    scaling,
                });
            }
            let mut metrics = vec![
                (wall_metric, per.wall, "ns"),
                (rate_metric, 1e3 / per.wall, "M/s"),
            ];
            metrics.extend(per.cpu.map(|cpu| (cpu_metric, cpu, "ns")));
            metrics.extend(scaling.map(|s| ("scaling_vs_1_thread", s, "x")));
            metrics.extend(
                ratios
                    .iter()
                    .filter_map(|&(peer, ratio)| Some((peer.ratio_metric()?, ratio?, "x"))),
            );
            for (metric, value, unit) in metrics {
                csv.push(CsvRow {
                    workload: kind.name().to_string(),
                    subject: subject.name().to_string(),
                    threads: m.threads as u32,
                    timers: ops * m.threads as u64,
                    metric,
                    value,
                    unit,
                });
            }
        }
    }
    table.note(match kind {
        Kind::Sleep => "timer = make a sleep, poll it once (which arms it with the task's waker), drop it (which cancels it)",
        Kind::Timeout => "timer = make a timeout() around a read that is pending and never woken, poll it once (the read, then the timer armed), drop it",
        Kind::Reset => "reset = push a random connection's idle sleep (the task's own) to now + 30 s: Sleep::reset / Timer::set_at; pingora-timeout has no reset, so its sleep is replaced by a new one and polled once; nothing is due during a run, so the work both wheels defer to the old deadline (corewheel: the timer left there wakes the task, whose poll arms the new deadline; tokio: its driver re-files the entry) is not in it: once per connection per 30 s",
    });
    table.note(format!(
        "CPU ns/{unit} = process CPU time (every thread: the tasks', the timers' own threads) from the start line until the deferred work is done (corewheel: the engine settled; then, for every subject, the process idle) / {unit}s; ns/{unit} = wall time from the start line to the last task's end / {unit}s, all threads together"
    ));
    table.note("setup: a tokio rt-multi-thread runtime of T workers, one task per worker (held at a start line until all run at once), the same for every subject; tokio-alt's runtime has enable_alt_timer() instead of the default timer; corewheel-async and async-io run their runtime-agnostic futures in the default one");
    table.note(format!(
        "median of {} runs per subject, taken in turns; ns/{unit} range: {}",
        repeat::RUNS,
        spreads.join(", ")
    ));
    table.note(format!(
        "vs X = X's CPU ns/{unit} / this row's (corewheel-async's rows): above 1 means corewheel-async used less CPU for the same work; vs own 1 thread = the subject's 1-thread ns/{unit} / this row's (wall), above 1 means more threads got more done"
    ));
    for note in measured.iter().flat_map(|m| {
        m.notes(
            subjects,
            "were due at once when polled (a cancel or reset found them fired)",
        )
    }) {
        table.note(note);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_workload_names_round_trip() {
        for kind in Kind::ALL {
            for threads in [1, 2, 16] {
                let name = child_workload(kind, threads);
                assert_eq!(parse_child_workload(&name), Some((kind, threads)));
            }
        }
        for bad in [
            "async-sleep",
            "async-sleep@0",
            "async-sleep@x",
            "live-1m@2",
            "@2",
        ] {
            assert_eq!(parse_child_workload(bad), None, "{bad}");
        }
    }

    #[test]
    fn runs_round_trip_through_a_child_line() {
        let run = Run {
            wall: Duration::from_nanos(123_456_789),
            app: Duration::from_nanos(123_000_000),
            cpu: Some(Duration::from_nanos(250_000_001)),
            worker_cpu: None,
            settle: None,
            too_late: 2,
            due_at_once: 3,
            pool_bytes: None,
        };
        let back = decode_run(&encode_run(&run)).expect("decodes");
        assert_eq!(
            (
                back.wall,
                back.app,
                back.cpu,
                back.too_late,
                back.due_at_once
            ),
            (run.wall, run.app, run.cpu, run.too_late, run.due_at_once)
        );
        let no_cpu = Run { cpu: None, ..run };
        assert_eq!(decode_run(&encode_run(&no_cpu)).expect("decodes").cpu, None);
        for bad in ["", "1 2 3 4", "1 2 3 4 5 6", "a 2 3 4 5", "1 2 x 4 5"] {
            assert!(decode_run(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_summary_puts_each_peers_ratio_in_its_column() {
        let mut summary = Summary::default();
        assert!(summary.table().is_none());
        summary.rows.push(SummaryRow {
            workload: SLEEP,
            threads: 1,
            cpu: Some(10.0),
            ratios: vec![("tokio", Some(3.5)), ("async-io", None)],
            scaling: None,
        });
        summary.rows.push(SummaryRow {
            workload: SLEEP,
            threads: 2,
            cpu: Some(11.0),
            ratios: vec![("tokio", Some(12.0)), ("async-io", Some(4.0))],
            scaling: Some(1.9),
        });
        let text = summary.table().expect("a table").render();
        assert!(text.contains("async-sleep, 1"), "{text}");
        assert!(text.contains("3.50x") && text.contains("n/a"), "{text}");
        assert!(
            text.contains("12.00x") && text.contains("4.00x") && text.contains("1.90x"),
            "{text}"
        );
    }
}
