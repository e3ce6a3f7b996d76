//! proxy: corewheel-proxy on loopback under wrk, each timer back-end in turns, and an accuracy check of its request
//! deadlines. wrk is the load generator so that the figures do not depend on a client of ours; without wrk the wrk
//! runs are skipped loudly. The proxy runs in a child process (the proxy crate's own entry point) so that its CPU time
//! is its own; the backend answers on a thread of the harness, at once unless a request's `delay_ms` asks otherwise.

use std::io::{BufRead, BufReader, Read, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command as Process, ExitCode, Stdio};
use std::time::{Duration, Instant};

use corewheel_proxy::{Client, Command, Config, LatenessSummary, run_blocking, serve_backend};
use tokio::runtime::Builder;

use crate::peers::Subject;
use crate::report::{Col, Sheet, thousands};
use crate::runner::{self, Plan, median};
use crate::sys::{cpu_between, threads_cpu_time};
use crate::workloads::{Out, lateness::Lateness};

/// Set in the proxy child's environment to its command line, arguments separated by spaces.
pub const ENV: &str = "COREWHEEL_PERF_PROXY";
/// wrk's connections, all on its one thread: enough to keep a 2-core proxy saturated.
const CONNECTIONS: u32 = 256;
/// The accuracy check's request deadline, its clients, requests per client, and the backend's delay for one in
/// `SLOW_ONE_IN` of them: far past the deadline, so that each of those must time out.
const DEADLINE: Duration = Duration::from_millis(250);
const CLIENTS: usize = 50;
const PER_CLIENT: usize = 8;
const SLOW_ONE_IN: usize = 4;
const SLOW_PATH: &str = "/?delay_ms=5000";

/// Whether wrk is missing from the PATH.
pub fn wrk_missing() -> bool {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    !std::env::split_paths(&paths).any(|dir| dir.join("wrk").is_file())
}

fn timer(subject: Subject) -> &'static str {
    match subject {
        Subject::Tokio => "tokio",
        Subject::EngineDriven => "corewheel-driven",
        _ => "corewheel",
    }
}

/// The proxy child's side: prints where it listens and serves; once its stdin closes it prints how late its request
/// deadlines fired by its own clock (`deadline` and a [`LatenessSummary`] line) and exits.
pub fn serve(args: &str) -> ExitCode {
    let Ok(Command::Run(config)) = Config::parse_args(args.split_whitespace()) else {
        eprintln!("corewheel-perf: {ENV}={args:?} is not a proxy command line");
        return ExitCode::from(2);
    };
    let served = run_blocking(config, |addr, stats| {
        println!("{addr}");
        let _ = std::io::stdout().flush();
        std::thread::spawn(move || {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            println!("deadline {}", stats.deadlines.summary().to_line());
            let _ = std::io::stdout().flush();
            std::process::exit(0);
        });
    });
    if let Err(error) = served {
        eprintln!("corewheel-proxy: {error}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// A proxy child on `subject`'s timers in front of `backend`, with `extra` flags; killed on drop.
struct ProxyChild(Child, SocketAddr, BufReader<std::process::ChildStdout>);

impl ProxyChild {
    fn start(subject: Subject, backend: SocketAddr, extra: &str) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("no harness executable: {e}"))?;
        let timer = timer(subject);
        let args = format!("--listen 127.0.0.1:0 --upstream {backend} --timer {timer} {extra}");
        let (piped, mut child) = (Stdio::piped, Process::new(exe));
        child.env(ENV, args).stdin(piped()).stdout(piped());
        let spawned = child.spawn();
        let mut child = spawned.map_err(|e| format!("could not start the proxy: {e}"))?;
        let mut stdout = BufReader::new(child.stdout.take().ok_or("the proxy has no stdout")?);
        let mut line = String::new();
        let _ = stdout.read_line(&mut line);
        let addr = line.trim().parse().ok();
        let proxy = Self(child, addr.unwrap_or(SocketAddr::from(([0; 4], 0))), stdout);
        addr.map(|_| proxy)
            .ok_or(format!("the proxy said {line:?}, not where it listens"))
    }

    /// Closes its stdin and reads what it says of its deadlines on the way out.
    fn deadlines(mut self) -> Result<LatenessSummary, String> {
        drop(self.0.stdin.take());
        let mut said = String::new();
        let _ = self.2.read_to_string(&mut said);
        let line = said.lines().find_map(|line| line.strip_prefix("deadline "));
        line.and_then(LatenessSummary::from_line)
            .ok_or(format!("the proxy said {said:?}, not its deadlines"))
    }
}

impl Drop for ProxyChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One wrk run's figures in the table's column order, and wrk's socket errors and non-2xx answers.
type WrkRun = ([f64; 5], Vec<String>);

/// A latency as wrk prints it (`812.00us`, `8.12ms`, `1.02s`), in milliseconds.
fn millis(text: &str) -> Option<f64> {
    let (number, scale) = [("us", 1e-3), ("ms", 1.0), ("s", 1e3)]
        .into_iter()
        .find_map(|(unit, scale)| Some((text.strip_suffix(unit)?, scale)))?;
    Some(number.parse::<f64>().ok()? * scale)
}

/// Reads wrk's report: its rate, latency median and 99th percentile, request count and any errors.
fn parse_wrk(report: &str) -> Result<(f64, f64, f64, f64, Vec<String>), String> {
    let lines = || report.lines().map(str::trim);
    let field = |prefix: &str| lines().find_map(|l| l.strip_prefix(prefix).map(str::trim));
    let missing = || format!("wrk's report lacks a figure: {report:?}");
    let rate = field("Requests/sec:")
        .and_then(|v| v.parse().ok())
        .ok_or_else(missing)?;
    let p50 = field("50%").and_then(millis).ok_or_else(missing)?;
    let p99 = field("99%").and_then(millis).ok_or_else(missing)?;
    let requests = lines().find_map(|l| l.split_once(" requests in ")?.0.parse().ok());
    let errors = ["Socket errors:", "Non-2xx or 3xx responses:"]
        .into_iter()
        .filter_map(|prefix| field(prefix).map(|v| format!("{prefix} {v}")))
        .collect();
    Ok((rate, p50, p99, requests.ok_or_else(missing)?, errors))
}

/// Runs wrk against `addr` for `seconds`, and returns its report.
fn wrk(addr: SocketAddr, seconds: u64) -> Result<String, String> {
    let (connections, duration) = (format!("-c{CONNECTIONS}"), format!("-d{seconds}s"));
    let url = format!("http://{addr}/");
    let output = Process::new("wrk")
        .args(["-t1", &connections, &duration, "--latency", &url])
        .output()
        .map_err(|error| format!("could not run wrk: {error}"))?;
    let (status, stderr) = (output.status, String::from_utf8_lossy(&output.stderr));
    match status.success() {
        true => Ok(String::from_utf8_lossy(&output.stdout).into_owned()),
        false => Err(format!("wrk failed ({status}): {stderr}")),
    }
}

/// One wrk run: a fresh proxy, a second of wrk to warm it up, then the measured run.
fn wrk_run(subject: Subject, backend: SocketAddr, seconds: u64) -> Result<WrkRun, String> {
    let proxy = ProxyChild::start(subject, backend, "")?;
    wrk(proxy.1, 1)?;
    let pid = proxy.0.id().to_string();
    let (before, began) = (threads_cpu_time(&pid, |_| true), Instant::now());
    let report = wrk(proxy.1, seconds)?;
    let (wall, after) = (began.elapsed(), threads_cpu_time(&pid, |_| true));
    let proxy_cpu = cpu_between(before, after).ok_or("no CPU time for the proxy")?;
    let (rate, p50, p99, requests, errors) = parse_wrk(&report)?;
    let cpu = proxy_cpu.as_secs_f64();
    let (per_request, cores) = (cpu * 1e6 / requests.max(1.0), cpu / wall.as_secs_f64());
    Ok(([rate, p50, p99, per_request, cores], errors))
}

/// What one accuracy run saw: each request's kind (slow or not), its status (0: failed) and time from before its send
/// to its answer; and the proxy's own count and lateness of its deadlines.
type Accuracy = (Vec<(bool, u16, Duration)>, LatenessSummary);

/// One accuracy run: a fresh proxy, [`CLIENTS`] keep-alive clients, one request in [`SLOW_ONE_IN`] answered late.
fn accuracy_run(subject: Subject, backend: SocketAddr) -> Result<Accuracy, String> {
    let deadline = format!("--request-timeout {}", DEADLINE.as_millis());
    let proxy = ProxyChild::start(subject, backend, &deadline)?;
    let runtime = Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    let (runtime, addr) = (runtime.map_err(|e| e.to_string())?, proxy.1);
    let client = |c: usize| async move {
        let mut client = Client::connect(addr).await.map_err(|e| e.to_string())?;
        let mut seen = Vec::new();
        for slow in (0..PER_CLIENT).map(|i| (c * PER_CLIENT + i).is_multiple_of(SLOW_ONE_IN)) {
            let sent = Instant::now();
            let status = client.get(if slow { SLOW_PATH } else { "/" }).await;
            seen.push((slow, status.map_or(0, |(s, _)| s.as_u16()), sent.elapsed()));
        }
        Ok(seen)
    };
    let clients = (0..CLIENTS).map(|c| runtime.spawn(client(c))).collect();
    let seen = runtime.block_on(super::parallel::join_all(clients));
    let seen = seen.into_iter().collect::<Result<Vec<_>, String>>()?;
    Ok((seen.concat(), proxy.deadlines()?))
}

/// A cell's run: a wrk run or an accuracy run, by the cell's setting.
type Measured = (Option<WrkRun>, Option<Accuracy>);

/// Runs `plan`'s cells (wrk runs at setting 0, accuracy runs at 1) in turns and prints a table for each.
pub fn run(plan: &Plan, seconds: u64, out: &mut Out) {
    if wrk_missing() {
        runner::print(
            "########################################################################\n\
             ## proxy: wrk runs SKIPPED: they need wrk, which is not on the PATH.\n\
             ## Install it with: apt-get install wrk  (Debian's package)\n\
             ########################################################################\n",
        );
    }
    let backend = match start_backend() {
        Ok(backend) => backend,
        Err(error) => {
            return runner::print(&format!(
                "proxy: ERROR: could not start the backend: {error}\n"
            ));
        }
    };
    let results = runner::in_turns(plan, |cell| match cell.param {
        0 => wrk_run(cell.subject, backend, seconds).map(|run| (Some(run), None)),
        _ => accuracy_run(cell.subject, backend).map(|run| (None, Some(run))),
    });
    let all = plan.cells.iter().zip(&results);
    let cells = |param| all.clone().filter(move |(cell, _)| cell.param == param);
    let cols = vec![
        Col::new("req/s", "requests_per_s", "1/s", 0)
            .rate()
            .ratios(),
        Col::new("p50 ms", "latency_p50", "ms", 2),
        Col::new("p99 ms", "latency_p99", "ms", 2).ratios(),
        Col::new("proxy CPU us/req", "proxy_cpu_us_per_request", "us", 2).ratios(),
        Col::new("proxy CPU cores", "proxy_cpu_cores", "cores", 2),
    ];
    let title = format!(
        "proxy (corewheel-proxy under wrk -t1 -c{CONNECTIONS} -d{seconds}s --latency on loopback, a backend that answers at once; median of {} runs per timer, in turns)",
        plan.runs
    );
    let mut sheet = Sheet::new("proxy", title, u64::from(CONNECTIONS), cols);
    for (cell, result) in cells(0) {
        let name = timer(cell.subject).to_string();
        let values = result.as_ref().map_err(Clone::clone).map(|runs| {
            let runs: Vec<&WrkRun> = runs.iter().filter_map(|run| run.0.as_ref()).collect();
            for error in runs.iter().flat_map(|run| &run.1) {
                sheet.note(format!("{name}: wrk: {error}"));
            }
            (0..5)
                .map(|i| Some(median(runs.iter().map(|run| run.0[i]))))
                .collect()
        });
        sheet.push(&name, cell.subject, values);
    }
    if !sheet.rows.is_empty() {
        sheet.note(format!("each run: a fresh proxy (its default threads: one per CPU) in a child process, 1 s of wrk to warm it up, then {seconds} s measured; req/s and latency as wrk reports them (p50/p99 of its latency distribution), {} connections kept alive", thousands(u64::from(CONNECTIONS))));
        sheet.note("proxy CPU: the proxy process's threads' CPU time (schedstat) over the measured run, per request wrk completed, and over wall time; wrk and the backend share the machine's cores with it");
        sheet.note("corewheel: the default engine and HyperTimer; corewheel-driven: a driven engine whose drivers run on the proxy's runtime; tokio: tokio::time and hyper-util's TokioTimer");
        sheet.finish(&mut out.csv);
    }
    accuracy_table(plan, cells(1), out);
}

fn accuracy_table<'a>(
    plan: &Plan,
    cells: impl Iterator<Item = (&'a runner::Cell, &'a Result<Vec<Measured>, String>)>,
    out: &mut Out,
) {
    let count = |header: &str, metric: &str| Col::new(header, metric, "count", 0);
    let ms = |header: &str, metric: &str| Col::new(header, metric, "ms", 2);
    let cols = vec![
        count("slow", "slow_requests"),
        count("504 at deadline", "answered_504"),
        count("proxy counted", "proxy_deadlines_fired"),
        count("early client", "early_client"),
        count("early proxy", "early_proxy"),
        count("fast 200", "fast_answered_200"),
        count("lost", "lost"),
        ms("client late p50 ms", "client_late_p50"),
        ms("p99", "client_late_p99"),
        ms("max", "client_late_max"),
        ms("proxy late p50 ms", "proxy_late_p50"),
        ms("p99", "proxy_late_p99"),
        ms("max", "proxy_late_max"),
    ];
    let title = format!(
        "proxy accuracy (request deadline {} ms; {CLIENTS} keep-alive clients, {PER_CLIENT} requests each, 1 in {SLOW_ONE_IN} delayed by the backend far past the deadline; {} runs per timer, summed)",
        DEADLINE.as_millis(),
        plan.runs
    );
    let mut sheet = Sheet::new("proxy-accuracy", title, DEADLINE.as_millis() as u64, cols);
    let mut errors = Vec::new();
    for (cell, result) in cells {
        let name = timer(cell.subject);
        let values = result.as_ref().map_err(Clone::clone).map(|runs| {
            let (mut client, mut proxy, mut n) = (Lateness::default(), LatenessSummary::default(), [0; 4]);
            for (answers, by_proxy) in runs.iter().filter_map(|run| run.1.as_ref()) {
                for &(slow, status, took) in answers {
                    let index = usize::from(!slow) * 2;
                    n[index] += 1;
                    n[index + 1] += u64::from(status == if slow { 504 } else { 200 });
                    if slow && status == 504 {
                        let sent = Instant::now();
                        client.record(sent + DEADLINE, sent + took, sent + took);
                    }
                }
                (proxy.count, proxy.early) = (proxy.count + by_proxy.count, proxy.early + by_proxy.early);
                let [p50, p99, max] = [by_proxy.p50_us, by_proxy.p99_us, by_proxy.max_us];
                (proxy.p50_us, proxy.p99_us) = (proxy.p50_us.max(p50), proxy.p99_us.max(p99));
                proxy.max_us = proxy.max_us.max(max);
            }
            let (client, [slow, timed_out, fast, answered]) = (client.summarize(), n);
            let lost = (slow - timed_out) + (fast - answered);
            if client.early + proxy.early + lost > 0 || proxy.count != timed_out {
                errors.push(format!("ERROR: proxy accuracy: {name}: {} early by the client's clock, {} by the proxy's, {lost} lost, the proxy counted {} deadlines for {timed_out} 504s", client.early, proxy.early, proxy.count));
            }
            let counts = [slow, timed_out, proxy.count, client.early, proxy.early, answered, lost];
            let mut row: Vec<Option<f64>> = counts.iter().map(|&n| Some(n as f64)).collect();
            let late = [client.p50, client.p99, client.max].map(|d| Some(d.as_secs_f64() * 1e3));
            row.extend(late.into_iter().chain([proxy.p50_us, proxy.p99_us, proxy.max_us].map(|us| Some(us as f64 / 1e3))));
            row
        });
        sheet.push(name, cell.subject, values);
    }
    sheet.note("every slow request must be answered 504, none before its deadline by the client's clock (taken before the send) nor by the proxy's, and counted once by the proxy; every fast one answered 200; lost: any request answered otherwise or not at all");
    sheet.note("client late: the 504's arrival - (send + deadline), loopback and the harness's own scheduling included; proxy late: from the deadline to when the waiting task ran, by the proxy's timer clock (0.1 ms buckets; p50/p99 the worst run's)");
    sheet.notes.extend(errors);
    sheet.finish(&mut out.csv);
}

/// Starts the backend the proxies forward to, on a thread and a runtime of its own, serving until the harness exits.
fn start_backend() -> Result<SocketAddr, String> {
    let bound = || -> std::io::Result<_> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        Ok((
            addr,
            listener,
            Builder::new_current_thread().enable_all().build()?,
        ))
    };
    let (addr, listener, runtime) = bound().map_err(|error| error.to_string())?;
    std::thread::spawn(move || {
        runtime.block_on(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => serve_backend(listener, Duration::ZERO).await,
                Err(error) => {
                    eprintln!("corewheel-perf: the proxy's backend could not listen: {error}")
                }
            }
        })
    });
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::{millis, parse_wrk};

    #[test]
    fn wrk_reports_are_read() {
        let report = "Running 8s test @ http://127.0.0.1:1/\n  1 threads and 256 connections\n  Thread Stats   Avg      Stdev     Max   +/- Stdev\n    Latency     8.12ms    1.23ms  30.00ms   90.00%\n  Latency Distribution\n     50%  812.00us\n     75%    8.50ms\n     90%    9.00ms\n     99%    1.20s\n  251234 requests in 8.00s, 20.12MB read\n  Socket errors: connect 0, read 0, write 0, timeout 12\nRequests/sec:  31400.50\nTransfer/sec:      2.51MB\n";
        let (rate, p50, p99, requests, errors) = parse_wrk(report).expect("a report");
        assert_eq!((rate, requests), (31400.5, 251_234.0));
        assert!((p50 - 0.812).abs() < 1e-9 && (p99 - 1200.0).abs() < 1e-9);
        assert_eq!(
            errors,
            ["Socket errors: connect 0, read 0, write 0, timeout 12"]
        );
        assert!(
            parse_wrk("nothing").is_err() && millis("fast").is_none() && millis("2ms") == Some(2.0)
        );
    }
}
