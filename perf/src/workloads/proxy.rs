//! proxy: corewheel-proxy, a real reverse proxy on tokio and hyper, under load on loopback,
//! once with every timer on corewheel and once on tokio's timer.
//!
//! The backend (answers at once) and the clients run in this process; the proxy runs in a
//! child process of its own (`proxy_process`), so that its CPU time is the proxy's alone.
//! Each phase takes the subjects in turn, each in a fresh proxy process:
//!
//! - heavy: 2,000 keep-alive connections, each sending its next request as soon as the
//!   last is answered: per request the proxy arms and cancels a deadline and resets its
//!   idle timeout on each read and write, so tens of thousands of timer operations a second;
//! - light: 200 connections, each one request every 200 ms (1,000 a second): the idle cost
//!   of the timer (corewheel's engine workers tick every millisecond) shows here;
//! - profile: the heavy and the light load again, with `perf record` attached to the proxy,
//!   for the share of its (user-space) CPU in timer code; a separate pass, so that the
//!   profiler's cost is not in the other figures;
//! - accuracy: 1,000 idle connections, 100 talking ones and 200 requests slower than the
//!   deadline, all at once, against a proxy with a 500 ms idle timeout and a 250 ms request
//!   deadline: how late each timer fired, and whether any fired early.
//!
//! The two cores are shared by the proxy and this process's clients and backend, so the
//! requests per second are those of the whole loopback setup, not of the proxy alone.

use std::net::SocketAddr;
use std::time::Duration;

use corewheel_proxy::{Config, LatenessSummary, TimerKind};

use crate::peers::Subject;
use crate::profile::TimerShare;
use crate::progress;
use crate::proxy_process::{ProcessCpu, ProxyLateness, ProxyProcess};
use crate::repeat::{self, median, spread};
use crate::report::{Csv, Table, thousands};
use crate::workloads::proxy_load::{self, AccuracyResult, AccuracySpec, LoadResult, LoadSpec};

pub const NAME: &str = "proxy";

/// One load the proxy is measured under.
#[derive(Clone, Copy)]
struct Load {
    name: &'static str,
    spec: LoadSpec,
}

const SATURATED: Load = Load {
    name: "max",
    spec: LoadSpec {
        connections: 2_000,
        pace: None,
        warmup: Duration::from_secs(1),
        window: Duration::from_secs(3),
    },
};

const HEAVY: Load = Load {
    name: "heavy",
    spec: LoadSpec {
        connections: 2_000,
        pace: Some(Duration::from_millis(500)),
        warmup: Duration::from_secs(1),
        window: Duration::from_secs(3),
    },
};

const LIGHT: Load = Load {
    name: "light",
    spec: LoadSpec {
        connections: 200,
        pace: Some(Duration::from_millis(200)),
        warmup: Duration::from_secs(1),
        window: Duration::from_secs(3),
    },
};

/// The loads, in the order they run.
const LOADS: [Load; 3] = [SATURATED, HEAVY, LIGHT];

/// The profile pass's window.
const PROFILE_WINDOW: Duration = Duration::from_secs(3);

const ACCURACY: AccuracySpec = AccuracySpec {
    idle: Duration::from_millis(500),
    deadline: Duration::from_millis(250),
    idle_connections: 1_000,
    talkers: 100,
    slow_requests: 200,
};

/// The timer back-end a subject stands for here.
fn timer_of(subject: Subject) -> Option<TimerKind> {
    match subject {
        Subject::CorewheelAsync => Some(TimerKind::Corewheel),
        Subject::Tokio => Some(TimerKind::Tokio),
        _ => None,
    }
}

/// The run's steps, for the progress bar: each subject under each load, measured
/// [`repeat::RUNS`] times and profiled once, and its accuracy check.
pub fn steps(subjects: usize) -> u64 {
    subjects as u64 * ((repeat::RUNS as u64 + 1) * LOADS.len() as u64 + 1)
}

/// One run's figures under one load; NaN where a figure could not be had.
#[derive(Clone, Copy)]
struct Figures {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    cpu_us_per_request: f64,
    cores: f64,
    /// Percent of the proxy's CPU on corewheel's engine worker threads.
    workers_share: f64,
    errors: u64,
}

impl Figures {
    fn of(load: &LoadResult, window: Duration, cpu: Option<ProcessCpu>) -> Self {
        let ms = |q| load.quantile_us(q).map_or(f64::NAN, |us| us as f64 / 1e3);
        let (cpu_us_per_request, cores, workers_share) = match cpu {
            Some(cpu) if load.requests > 0 => {
                let total = cpu.total.as_secs_f64();
                (
                    total * 1e6 / load.requests as f64,
                    total / window.as_secs_f64(),
                    100.0 * cpu.engine_workers.as_secs_f64() / total.max(1e-9),
                )
            }
            _ => (f64::NAN, f64::NAN, f64::NAN),
        };
        Self {
            rps: load.requests as f64 / window.as_secs_f64(),
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
            max_ms: ms(1.0),
            cpu_us_per_request,
            cores,
            workers_share,
            errors: load.not_ok + load.closed + load.unconnected,
        }
    }
}

pub fn run(subjects: &[Subject], csv: &mut Csv) {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(crate::peers::engine::cpus())
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            progress::print(&format!("{NAME}: ERROR: no tokio runtime: {error}\n"));
            return;
        }
    };
    let backend = match runtime.block_on(start_backend()) {
        Ok(addr) => addr,
        Err(error) => {
            progress::print(&format!("{NAME}: ERROR: no backend: {error}\n"));
            return;
        }
    };
    let subjects: Vec<Subject> = subjects
        .iter()
        .copied()
        .filter(|&subject| timer_of(subject).is_some())
        .collect();

    let mut table = Table::new(
        format!("{NAME}: corewheel-proxy on loopback, every timer on corewheel or on tokio"),
        &[
            "load",
            "timers on",
            "req/s",
            "p50 ms",
            "p99 ms",
            "max ms",
            "proxy CPU µs/req",
            "proxy CPU, cores",
            "engine workers' share",
            "timer share (perf)",
            "errors",
        ],
    );
    let mut spreads = Vec::new();
    let mut kernel_shares = Vec::new();
    for load in LOADS {
        let runs = repeat::in_turns(&subjects, |subject, run| {
            progress::step(format!(
                "{NAME} {} {} run {}",
                load.name,
                subject.name(),
                run + 1
            ));
            let timer = timer_of(subject).ok_or("not a proxy subject")?;
            runtime.block_on(measure(backend, timer, load.spec))
        });
        for (&subject, runs) in subjects.iter().zip(runs) {
            progress::step(format!("{NAME} {} {} profile", load.name, subject.name()));
            let Some(timer) = timer_of(subject) else {
                continue;
            };
            let mut spec = load.spec;
            spec.window = PROFILE_WINDOW;
            let share = runtime.block_on(profile(backend, timer, spec));
            if let Ok(share) = &share {
                kernel_shares.push(format!(
                    "{} {} {:.0}%",
                    load.name,
                    timer.name(),
                    share.kernel_percent()
                ));
            }
            if let Ok(runs) = &runs {
                spreads.push(format!(
                    "{} {} {} req/s, {} µs/req",
                    load.name,
                    timer.name(),
                    spread(runs.iter().map(|run| run.rps)),
                    spread(runs.iter().map(|run| run.cpu_us_per_request))
                ));
            }
            add_row(&mut table, csv, load, subject, timer, runs, share);
        }
    }
    table.note(format!(
        "max: {} keep-alive connections, each sending its next GET as soon as the last is answered (what the two CPUs can do, the clients and backend included); heavy: {} connections, each one GET every {} ms; light: {} connections, each one GET every {} ms; the backend answers at once; {} s warm-up, then {} s measured",
        thousands(SATURATED.spec.connections as u64),
        thousands(HEAVY.spec.connections as u64),
        HEAVY.spec.pace.map_or(0, |p| p.as_millis()),
        thousands(LIGHT.spec.connections as u64),
        LIGHT.spec.pace.map_or(0, |p| p.as_millis()),
        HEAVY.spec.warmup.as_secs(),
        HEAVY.spec.window.as_secs()
    ));
    table.note(format!(
        "each figure the median of {} runs per subject, taken in turns, each in a fresh proxy process; errors summed over them; range: {}",
        repeat::RUNS,
        spreads.join("; ")
    ));
    table.note("latency: from the client's send to the whole answer, measured in the harness process, which shares the CPUs with the proxy; errors: answers other than 200, and connections closed or never made");
    table.note("proxy CPU: the proxy process's threads (/proc/<pid>/task/*/schedstat) over the window; engine workers' share: the part of it on corewheel's engine worker threads (corewheel-N), which only the corewheel rows have");
    table.note("timer share: share of the proxy's perf samples (perf record -e cpu-clock -F 1999 -p <proxy>, one more run of the same load) whose symbol is in corewheel::, tokio::runtime::time::, tokio::time:: or hyper-util's TokioTimer/TokioSleep; timer code inlined into its callers counts as theirs, so it is a lower bound");
    if !kernel_shares.is_empty() {
        table.note(format!(
            "kernel samples among them (0% where only user space may be sampled): {}",
            kernel_shares.join(", ")
        ));
    }
    table.print();

    let mut accuracy = Vec::new();
    for &subject in &subjects {
        progress::step(format!("{NAME} accuracy {}", subject.name()));
        accuracy.push(match timer_of(subject) {
            Some(timer) => check_accuracy(&runtime, backend, timer),
            None => Err("not a proxy subject".to_string()),
        });
    }
    accuracy_table(&subjects, accuracy, csv).print();
    runtime.shutdown_timeout(Duration::from_secs(1));
}

async fn start_backend() -> std::io::Result<SocketAddr> {
    let listener = corewheel_proxy::listen(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let addr = listener.local_addr()?;
    tokio::spawn(corewheel_proxy::serve_backend(listener, Duration::ZERO));
    Ok(addr)
}

/// The proxy's configuration here: its defaults (10 s header timeout, 60 s idle timeout,
/// 30 s deadline, 5 s connect timeout), on a free port, in front of `backend`.
fn config(backend: SocketAddr, timer: TimerKind) -> Config {
    let mut config = Config::new(backend);
    config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.timer = timer;
    config
}

async fn measure(backend: SocketAddr, timer: TimerKind, spec: LoadSpec) -> Result<Figures, String> {
    let proxy = ProxyProcess::start(&config(backend, timer))?;
    let mut readings = Vec::new();
    let load = proxy_load::run(proxy.addr(), spec, || readings.push(proxy.cpu_time())).await;
    let cpu = match readings[..] {
        [Some(start), Some(end)] => Some(end.since(start)),
        _ => None,
    };
    Ok(Figures::of(&load, spec.window, cpu))
}

/// The timer's share of the proxy's samples under `spec`, sampled over its window.
async fn profile(
    backend: SocketAddr,
    timer: TimerKind,
    spec: LoadSpec,
) -> Result<TimerShare, String> {
    let proxy = ProxyProcess::start(&config(backend, timer))?;
    let pid = proxy.pid();
    let mut profiler = None;
    proxy_load::run(proxy.addr(), spec, || {
        // Started as the window opens, on a thread of its own: perf record blocks for the
        // whole window.
        if profiler.is_none() {
            profiler = Some(std::thread::spawn(move || {
                crate::profile::timer_share(pid, spec.window)
            }));
        }
    })
    .await;
    profiler
        .ok_or("the load never opened its window")?
        .join()
        .map_err(|_| "the profiler thread panicked".to_string())?
}

/// A figure for the table: `n/a` where there is none.
fn cell(value: f64, decimals: usize, suffix: &str) -> String {
    if value.is_nan() {
        "n/a".to_string()
    } else {
        format!("{value:.decimals$}{suffix}")
    }
}

fn add_row(
    table: &mut Table,
    csv: &mut Csv,
    load: Load,
    subject: Subject,
    timer: TimerKind,
    runs: Result<Vec<Figures>, String>,
    share: Result<TimerShare, String>,
) {
    let runs = match runs {
        Ok(runs) => runs,
        Err(error) => {
            table.row(vec![
                load.name.to_string(),
                timer.name().to_string(),
                "error".to_string(),
            ]);
            table.note(format!("ERROR: {} {}: {error}", load.name, subject.name()));
            return;
        }
    };
    let mid = |figure: fn(&Figures) -> f64| median(runs.iter().map(figure));
    let errors: u64 = runs.iter().map(|run| run.errors).sum();
    let rps = mid(|run| run.rps);
    let mut metrics = vec![
        ("requests_per_s", rps, "1/s"),
        ("p50_ms", mid(|run| run.p50_ms), "ms"),
        ("p99_ms", mid(|run| run.p99_ms), "ms"),
        ("max_ms", mid(|run| run.max_ms), "ms"),
        (
            "proxy_cpu_us_per_request",
            mid(|run| run.cpu_us_per_request),
            "us",
        ),
        ("proxy_cpu_cores", mid(|run| run.cores), "cores"),
        ("errors", errors as f64, "count"),
    ];
    let workers = if timer == TimerKind::Corewheel {
        let share = mid(|run| run.workers_share);
        metrics.push(("engine_workers_cpu_share", share, "%"));
        cell(share, 1, "%")
    } else {
        "-".to_string()
    };
    let timer_share = match &share {
        Ok(share) => {
            metrics.push(("timer_share_of_samples", share.percent(), "%"));
            metrics.push(("kernel_share_of_samples", share.kernel_percent(), "%"));
            cell(share.percent(), 1, "%")
        }
        Err(error) => {
            table.note(format!(
                "timer share n/a for {} {}: {error}",
                load.name,
                subject.name()
            ));
            "n/a".to_string()
        }
    };
    let row = vec![
        load.name.to_string(),
        timer.name().to_string(),
        if rps.is_nan() {
            "n/a".to_string()
        } else {
            thousands(rps.round() as u64)
        },
        cell(metrics[1].1, 2, ""),
        cell(metrics[2].1, 2, ""),
        cell(metrics[3].1, 2, ""),
        cell(metrics[4].1, 1, ""),
        cell(metrics[5].1, 2, ""),
        workers,
        timer_share,
        thousands(errors),
    ];
    csv.push_metrics(
        &format!("{NAME}-{}", load.name),
        subject.name(),
        load.spec.connections as u64,
        &metrics,
    );
    table.row(row);
}

/// The accuracy check against a fresh proxy with the check's timeouts: what the clients
/// saw, and what the proxy saw of its own timeouts.
fn check_accuracy(
    runtime: &tokio::runtime::Runtime,
    backend: SocketAddr,
    timer: TimerKind,
) -> Result<(AccuracyResult, ProxyLateness), String> {
    let mut config = config(backend, timer);
    config.idle_timeout = ACCURACY.idle;
    config.request_timeout = ACCURACY.deadline;
    let proxy = ProxyProcess::start(&config)?;
    let seen = runtime.block_on(proxy_load::accuracy(proxy.addr(), ACCURACY));
    Ok((seen, proxy.finish()?))
}

/// The quantile `q` of sorted durations, in ms; NaN when there are none.
fn millis(sorted: &[Duration], q: f64) -> f64 {
    let last = sorted.len().saturating_sub(1);
    sorted
        .get(((last as f64) * q).round() as usize)
        .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
}

/// One kind of timeout's row of the accuracy table.
struct TimeoutRow<'a> {
    timeout: String,
    expected: usize,
    /// Lateness the clients measured, sorted.
    client_late: &'a [Duration],
    client_early: u64,
    /// Never fired, or answered otherwise.
    missing: u64,
    proxy: LatenessSummary,
}

fn accuracy_table(
    subjects: &[Subject],
    results: Vec<Result<(AccuracyResult, ProxyLateness), String>>,
    csv: &mut Csv,
) -> Table {
    let mut table = Table::new(
        format!("{NAME} accuracy: every connection's idle timeout and every request's deadline"),
        &[
            "timers on",
            "timeout",
            "fired",
            "early (client / proxy)",
            "missing",
            "late ms, client: min / p50 / p99 / max",
            "late ms, proxy: p50 / p99 / max",
        ],
    );
    let mut talkers = Vec::new();
    for (&subject, result) in subjects.iter().zip(results) {
        let timer = timer_of(subject).map_or(subject.name(), TimerKind::name);
        let (seen, proxy) = match result {
            Ok(result) => result,
            Err(error) => {
                table.row(vec![timer.to_string(), "error".to_string()]);
                table.note(format!("ERROR: {}: {error}", subject.name()));
                continue;
            }
        };
        talkers.push(format!(
            "{timer}: {} of {} closed ({} requests)",
            seen.talkers_closed, ACCURACY.talkers, seen.talker_requests
        ));
        let rows = [
            TimeoutRow {
                timeout: format!("idle {} ms", ACCURACY.idle.as_millis()),
                expected: ACCURACY.idle_connections,
                client_late: &seen.idle_late,
                client_early: seen.early_closes,
                missing: seen.never_closed,
                proxy: proxy.idle_timeouts,
            },
            TimeoutRow {
                timeout: format!("deadline {} ms (504)", ACCURACY.deadline.as_millis()),
                expected: ACCURACY.slow_requests,
                client_late: &seen.deadline_late,
                client_early: seen.early_504s,
                missing: seen.not_504,
                proxy: proxy.deadlines,
            },
        ];
        for (kind, row) in ["idle", "deadline"].into_iter().zip(rows) {
            add_timeout_row(&mut table, csv, subject, timer, kind, row);
        }
        csv.push_metrics(
            &format!("{NAME}-accuracy-talkers"),
            subject.name(),
            ACCURACY.talkers as u64,
            &[("closed", seen.talkers_closed as f64, "count")],
        );
    }
    table.note(format!(
        "all at once against one proxy per subject (idle timeout {} ms, deadline {} ms): {} connections that send nothing; {} that send a GET every {} ms for {} ms, which must never be closed ({}); {} GETs the backend answers only after 10 s, which must get a 504",
        ACCURACY.idle.as_millis(),
        ACCURACY.deadline.as_millis(),
        ACCURACY.idle_connections,
        ACCURACY.talkers,
        (ACCURACY.idle / 4).as_millis(),
        (ACCURACY.idle * 3).as_millis(),
        talkers.join("; "),
        ACCURACY.slow_requests
    ));
    table.note("late, client: from before the client's connect (idle) or send (504) to the close or the answer, as the client saw it: loopback and the harness's own scheduling on the shared CPUs included, so an upper bound; late, proxy: from the deadline to when the task that waited on it ran, by the proxy's timer clock (p50/p99 to 0.1 ms buckets); early: before the timeout, the timer's fault; missing: not closed 10 s past the timeout, or answered other than 504");
    table
}

fn add_timeout_row(
    table: &mut Table,
    csv: &mut Csv,
    subject: Subject,
    timer: &str,
    kind: &'static str,
    row: TimeoutRow<'_>,
) {
    let client = |q| millis(row.client_late, q);
    let proxy_ms = |us: u64| us as f64 / 1e3;
    let metrics = [
        ("fired", row.client_late.len() as f64, "count"),
        ("client_early", row.client_early as f64, "count"),
        ("proxy_early", row.proxy.early as f64, "count"),
        ("missing", row.missing as f64, "count"),
        ("client_late_p50_ms", client(0.5), "ms"),
        ("client_late_p99_ms", client(0.99), "ms"),
        ("client_late_max_ms", client(1.0), "ms"),
        ("proxy_late_p50_ms", proxy_ms(row.proxy.p50_us), "ms"),
        ("proxy_late_p99_ms", proxy_ms(row.proxy.p99_us), "ms"),
        ("proxy_late_max_ms", proxy_ms(row.proxy.max_us), "ms"),
    ];
    csv.push_metrics(
        &format!("{NAME}-accuracy-{kind}"),
        subject.name(),
        row.expected as u64,
        &metrics,
    );
    let at = |q| cell(client(q), 1, "");
    table.row(vec![
        timer.to_string(),
        row.timeout,
        format!("{} of {}", row.client_late.len(), row.expected),
        format!("{} / {}", row.client_early, row.proxy.early),
        row.missing.to_string(),
        format!("{} / {} / {} / {}", at(0.0), at(0.5), at(0.99), at(1.0)),
        format!(
            "{:.1} / {:.1} / {:.1}",
            proxy_ms(row.proxy.p50_us),
            proxy_ms(row.proxy.p99_us),
            proxy_ms(row.proxy.max_us)
        ),
    ]);
}
