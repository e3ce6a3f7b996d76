//! proxy: corewheel-proxy on loopback under wrk, each timer back-end in turns.
//!
//! The load generator is wrk (`wrk -t1 -c256 --latency`), not a client of ours, so the figures do not depend on code
//! this project wrote. The proxy runs in a child process of the harness (the proxy crate's own entry point, as the
//! `corewheel-proxy` binary runs it), so that its CPU time, read from `/proc/<pid>/task/*/schedstat`, is its own; the
//! backend it forwards to answers at once, on a tokio runtime in the harness's process. Each run is a fresh proxy: a
//! second of wrk to warm it up, then the measured run. Without wrk on the PATH the workload says so loudly and runs
//! nothing.

use std::io::{BufRead, BufReader, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command as Process, ExitCode, Stdio};
use std::time::Duration;

use corewheel_proxy::{Command, Config, run_blocking, serve_backend};

use crate::peers::Subject;
use crate::report::{Col, Row, Sheet, thousands};
use crate::runner::{self, Plan, median};
use crate::sys::threads_cpu_time;
use crate::workloads::Out;

/// Set in the proxy child's environment to its command line, arguments separated by spaces (none of them holds one).
pub const ENV: &str = "COREWHEEL_PERF_PROXY";

/// wrk's connections, all on its one thread: enough to keep a 2-core proxy saturated.
const CONNECTIONS: u32 = 256;

/// Whether wrk is missing from the PATH.
pub fn wrk_missing() -> bool {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    !std::env::split_paths(&paths).any(|dir| dir.join("wrk").is_file())
}

/// The proxy's `--timer` for a subject.
fn timer(subject: Subject) -> &'static str {
    match subject {
        Subject::Tokio => "tokio",
        Subject::EngineDriven => "corewheel-driven",
        _ => "corewheel",
    }
}

/// The proxy child's side: serves with the command line `args` until it is killed, after printing the address it
/// listens on.
pub fn serve(args: &str) -> ExitCode {
    let config = match Config::parse_args(args.split_whitespace()) {
        Ok(Command::Run(config)) => config,
        _ => {
            eprintln!("corewheel-perf: {ENV}={args:?} is not a proxy command line");
            return ExitCode::from(2);
        }
    };
    let served = run_blocking(config, |addr, _| {
        println!("{addr}");
        let _ = std::io::stdout().flush();
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("corewheel-proxy: {error}");
            ExitCode::FAILURE
        }
    }
}

/// What one measured wrk run found.
struct WrkRun {
    requests_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    requests: f64,
    /// wrk's socket errors and non-2xx answers, as it words them.
    errors: Vec<String>,
    proxy_cpu: Duration,
    wall: Duration,
}

/// A latency as wrk prints it (`812.00us`, `8.12ms`, `1.02s`), in milliseconds.
fn millis(text: &str) -> Option<f64> {
    let (number, scale) = [("us", 1e-3), ("ms", 1.0), ("s", 1e3)]
        .into_iter()
        .find_map(|(unit, scale)| Some((text.strip_suffix(unit)?, scale)))?;
    Some(number.parse::<f64>().ok()? * scale)
}

/// Reads wrk's report: its rate, its latency distribution's median and 99th percentile, its request count and any
/// errors.
fn parse_wrk(report: &str) -> Result<(f64, f64, f64, f64, Vec<String>), String> {
    let field = |prefix: &str| {
        report
            .lines()
            .find_map(|line| line.trim().strip_prefix(prefix).map(str::trim))
    };
    let missing = || format!("wrk's report lacks a figure: {report:?}");
    let rate = field("Requests/sec:")
        .and_then(|v| v.parse().ok())
        .ok_or_else(missing)?;
    let p50 = field("50%").and_then(millis).ok_or_else(missing)?;
    let p99 = field("99%").and_then(millis).ok_or_else(missing)?;
    let requests = report
        .lines()
        .find_map(|line| line.trim().split_once(" requests in ")?.0.parse().ok())
        .ok_or_else(missing)?;
    let errors = ["Socket errors:", "Non-2xx or 3xx responses:"]
        .into_iter()
        .filter_map(|prefix| field(prefix).map(|v| format!("{prefix} {v}")))
        .collect();
    Ok((rate, p50, p99, requests, errors))
}

/// Runs wrk against `addr` for `seconds`, and returns its report.
fn wrk(addr: SocketAddr, seconds: u64) -> Result<String, String> {
    let output = Process::new("wrk")
        .args([
            "-t1",
            &format!("-c{CONNECTIONS}"),
            &format!("-d{seconds}s"),
            "--latency",
        ])
        .arg(format!("http://{addr}/"))
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("could not run wrk: {error}"))?;
    if !output.status.success() {
        return Err(format!(
            "wrk failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// One run: a fresh proxy on `subject`'s timers in front of `backend`, warmed up, then measured under wrk.
fn one_run(subject: Subject, backend: SocketAddr, seconds: u64) -> Result<WrkRun, String> {
    let exe = std::env::current_exe().map_err(|error| format!("no harness executable: {error}"))?;
    let args = format!(
        "--listen 127.0.0.1:0 --upstream {backend} --timer {}",
        timer(subject)
    );
    let mut child = Process::new(exe)
        .env(ENV, args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|error| format!("could not start the proxy: {error}"))?;
    let measured = (|| {
        let mut line = String::new();
        let stdout = child.stdout.take().ok_or("the proxy has no stdout")?;
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|error| error.to_string())?;
        let addr: SocketAddr = line
            .trim()
            .parse()
            .map_err(|_| format!("the proxy said {line:?}, not where it listens"))?;
        wrk(addr, 1)?;
        let pid = child.id().to_string();
        let before = threads_cpu_time(&pid, |_| true);
        let began = std::time::Instant::now();
        let report = wrk(addr, seconds)?;
        let wall = began.elapsed();
        let after = threads_cpu_time(&pid, |_| true);
        let proxy_cpu = after
            .zip(before)
            .map(|(a, b)| a.saturating_sub(b))
            .ok_or("no CPU time for the proxy")?;
        let (requests_per_s, p50_ms, p99_ms, requests, errors) = parse_wrk(&report)?;
        Ok(WrkRun {
            requests_per_s,
            p50_ms,
            p99_ms,
            requests,
            errors,
            proxy_cpu,
            wall,
        })
    })();
    let _ = child.kill();
    let _ = child.wait();
    measured
}

/// Runs `plan`'s proxies under wrk, `seconds` each, in turns, and prints the table.
pub fn run(plan: &Plan, seconds: u64, out: &mut Out) {
    if wrk_missing() {
        runner::print(
            "########################################################################\n\
             ## proxy: SKIPPED: it needs wrk, which is not on the PATH.\n\
             ## Install it with: apt-get install wrk  (Debian's package)\n\
             ########################################################################\n",
        );
        return;
    }
    let backend = match start_backend() {
        Ok(backend) => backend,
        Err(error) => {
            return runner::print(&format!(
                "proxy: ERROR: could not start the backend: {error}\n"
            ));
        }
    };
    let results = runner::in_turns(plan, |cell| one_run(cell.subject, backend, seconds));
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
    for (cell, result) in plan.cells.iter().zip(&results) {
        let name = timer(cell.subject).to_string();
        let values = result.as_ref().map_err(Clone::clone).map(|runs| {
            for error in runs.iter().flat_map(|run| &run.errors) {
                sheet.note(format!("{name}: wrk: {error}"));
            }
            let mid = |f: fn(&WrkRun) -> f64| Some(median(runs.iter().map(f)));
            vec![
                mid(|r| r.requests_per_s),
                mid(|r| r.p50_ms),
                mid(|r| r.p99_ms),
                mid(|r| r.proxy_cpu.as_secs_f64() * 1e6 / r.requests.max(1.0)),
                mid(|r| r.proxy_cpu.as_secs_f64() / r.wall.as_secs_f64()),
            ]
        });
        sheet.rows.push(Row {
            name,
            subject: cell.subject,
            threads: 1,
            values,
        });
    }
    sheet.note(format!("each run: a fresh proxy (its default threads: one per CPU) in a child process, 1 s of wrk to warm it up, then {seconds} s measured; req/s and latency as wrk reports them (p50/p99 of its latency distribution), {} connections kept alive", thousands(u64::from(CONNECTIONS)) ));
    sheet.note("proxy CPU: the proxy process's threads' CPU time (schedstat) over the measured run, per request wrk completed, and over wall time; wrk and the backend share the machine's cores with it");
    sheet.note("corewheel: the default engine and HyperTimer; corewheel-driven: a driven engine whose drivers run on the proxy's runtime; tokio: tokio::time and hyper-util's TokioTimer");
    sheet.finish(&mut out.csv);
}

/// Starts the backend the proxies forward to: an HTTP/1.1 server that answers at once, on a thread and a runtime of
/// its own, serving until the harness exits.
fn start_backend() -> Result<SocketAddr, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|error| error.to_string())?;
    listener
        .set_nonblocking(true)
        .map_err(|error| error.to_string())?;
    let addr = listener.local_addr().map_err(|error| error.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
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
