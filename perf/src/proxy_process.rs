//! The proxy workload's proxy, in a child process of this harness: started with
//! `COREWHEEL_PERF_PROXY` holding its command line, it prints the address it listens on
//! and serves until its stdin closes; then it prints how late its timeouts fired, by its
//! own clock, and exits. Its own process, so that its CPU time is its own.

use std::io::{BufRead, BufReader, Read, Write as _};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use corewheel_proxy::{Config, LatenessSummary, Stats};

/// Set in the child's environment to the proxy's command line, arguments separated by
/// spaces (none of them holds one).
pub const ENV: &str = "COREWHEEL_PERF_PROXY";

/// A proxy running in a child process; it ends when this is dropped.
pub struct ProxyProcess {
    child: Child,
    /// Closed on drop: the child's signal to exit.
    stdin: Option<ChildStdin>,
    stdout: Option<BufReader<ChildStdout>>,
    addr: SocketAddr,
}

/// How late the proxy's timeouts fired, by its own clock, as it said on exit.
#[derive(Debug, Clone, Copy)]
pub struct ProxyLateness {
    pub idle_timeouts: LatenessSummary,
    pub deadlines: LatenessSummary,
}

impl ProxyProcess {
    /// Starts the proxy `config` describes (its `listen` should have port 0) and waits
    /// until it listens.
    pub fn start(config: &Config) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("no harness executable: {e}"))?;
        let mut child = Command::new(exe)
            .env(ENV, config.to_args().join(" "))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("could not start the proxy process: {e}"))?;
        let stdin = child.stdin.take();
        let mut stdout = child.stdout.take().map(BufReader::new);
        let mut line = String::new();
        let read = match &mut stdout {
            Some(stdout) => stdout.read_line(&mut line),
            None => Ok(0),
        };
        let addr = match (read, line.trim().parse()) {
            (Ok(_), Ok(addr)) => addr,
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "the proxy process did not say where it listens (it printed {line:?})"
                ));
            }
        };
        Ok(Self {
            child,
            stdin,
            stdout,
            addr,
        })
    }

    /// Ends the proxy and returns how late its timeouts fired, as it says on its way out.
    pub fn finish(mut self) -> Result<ProxyLateness, String> {
        drop(self.stdin.take());
        let mut said = String::new();
        if let Some(stdout) = &mut self.stdout {
            stdout
                .read_to_string(&mut said)
                .map_err(|e| format!("could not read the proxy's last words: {e}"))?;
        }
        let field = |name: &str| {
            said.lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(LatenessSummary::from_line)
                .ok_or_else(|| format!("the proxy did not report its {name}(it said {said:?})"))
        };
        Ok(ProxyLateness {
            idle_timeouts: field("idle ")?,
            deadlines: field("deadline ")?,
        })
    }

    /// Where the proxy listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The child's process id, for a profiler to attach to.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU time of the child's live threads so far: all of them, and those of corewheel's
    /// engine workers (`corewheel-N`). `None` where /proc cannot tell.
    pub fn cpu_time(&self) -> Option<ProcessCpu> {
        threads_cpu_time(self.child.id())
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        drop(self.stdin.take());
        // It exits on its own once it sees its stdin closed; killed if it has not after a
        // while, so that a stuck proxy cannot hang the harness.
        for _ in 0..200 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process's CPU time, split by who spent it.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessCpu {
    pub total: Duration,
    /// corewheel's engine workers (threads named `corewheel-N`).
    pub engine_workers: Duration,
}

impl ProcessCpu {
    /// `self - earlier`.
    pub fn since(self, earlier: ProcessCpu) -> ProcessCpu {
        ProcessCpu {
            total: self.total.saturating_sub(earlier.total),
            engine_workers: self.engine_workers.saturating_sub(earlier.engine_workers),
        }
    }
}

/// Sums `/proc/<pid>/task/*/schedstat` (nanoseconds on the CPU, per thread): finer than
/// `/proc/<pid>/stat`'s clock ticks, which a light load's few milliseconds would round
/// away. The proxy's threads live as long as it does, so none is missed by exiting.
#[cfg(target_os = "linux")]
fn threads_cpu_time(pid: u32) -> Option<ProcessCpu> {
    let mut cpu = ProcessCpu::default();
    let mut found = false;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let path = task.path();
        let Some(ns) = std::fs::read_to_string(path.join("schedstat"))
            .ok()
            .and_then(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        else {
            continue;
        };
        let spent = Duration::from_nanos(ns);
        cpu.total += spent;
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if crate::cpu_time::is_numbered(name.trim_end(), "corewheel-") {
            cpu.engine_workers += spent;
        }
        found = true;
    }
    found.then_some(cpu)
}

#[cfg(not(target_os = "linux"))]
fn threads_cpu_time(_pid: u32) -> Option<ProcessCpu> {
    None
}

/// The child's side: runs the proxy `spec` describes, prints its address, and exits when
/// its stdin closes.
pub fn main(spec: &str) -> ExitCode {
    let config = match Config::parse_args(spec.split_whitespace()) {
        Ok(corewheel_proxy::Command::Run(config)) => config,
        _ => {
            eprintln!("corewheel-perf: {ENV}={spec:?} is not a proxy command line");
            return ExitCode::from(2);
        }
    };
    let stats: Arc<OnceLock<Arc<Stats>>> = Arc::default();
    let reported = Arc::clone(&stats);
    std::thread::spawn(move || {
        // EOF or an error: the harness is done with this proxy (or gone).
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        if let Some(stats) = reported.get() {
            let mut stdout = std::io::stdout();
            let _ = writeln!(stdout, "idle {}", stats.idle_timeouts.summary().to_line());
            let _ = writeln!(stdout, "deadline {}", stats.deadlines.summary().to_line());
            let _ = stdout.flush();
        }
        std::process::exit(0);
    });
    let served = corewheel_proxy::run_blocking(config, |addr, proxy_stats| {
        let _ = stats.set(proxy_stats);
        let mut stdout = std::io::stdout();
        let _ = writeln!(stdout, "{addr}");
        let _ = stdout.flush();
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("corewheel-perf: the proxy failed: {error}");
            ExitCode::FAILURE
        }
    }
}
