//! The proxy's settings and its command line.

use std::net::SocketAddr;
use std::time::Duration;

/// Which timer back-end every timer of the proxy runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimerKind {
    /// corewheel's default engine, and `corewheel::HyperTimer` for hyper.
    Corewheel,
    /// A process-wide *driven* corewheel engine (no worker threads of its own), whose
    /// drivers run on the proxy's tokio runtime; `corewheel::HyperTimer` on it for hyper.
    CorewheelDriven,
    /// `tokio::time`, and hyper-util's `TokioTimer` for hyper.
    Tokio,
}

impl TimerKind {
    /// The name the `--timer` flag takes.
    pub fn name(self) -> &'static str {
        match self {
            TimerKind::Corewheel => "corewheel",
            TimerKind::CorewheelDriven => "corewheel-driven",
            TimerKind::Tokio => "tokio",
        }
    }

    /// The kind `name` names, if any.
    pub fn parse(name: &str) -> Option<Self> {
        [
            TimerKind::Corewheel,
            TimerKind::CorewheelDriven,
            TimerKind::Tokio,
        ]
        .into_iter()
        .find(|kind| kind.name() == name)
    }
}

/// Everything the proxy needs to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Where the proxy listens.
    pub listen: SocketAddr,
    /// The one backend every request goes to.
    pub upstream: SocketAddr,
    /// The timer back-end of every timer.
    pub timer: TimerKind,
    /// hyper's HTTP/1 header read timeout: from when hyper starts waiting for a request
    /// head (after accept, and between keep-alive requests) to the head's last byte.
    pub header_read_timeout: Duration,
    /// A client connection with no byte read or written for this long is closed.
    pub idle_timeout: Duration,
    /// The deadline on one upstream call (connect, send, response head); past it the
    /// client gets a 504.
    pub request_timeout: Duration,
    /// The deadline on opening a connection to the upstream; past it the client gets a 504.
    pub connect_timeout: Duration,
    /// tokio worker threads; `None` for one per CPU.
    pub threads: Option<usize>,
}

/// The command line's help.
pub const USAGE: &str = "\
corewheel-proxy: an HTTP/1.1 reverse proxy whose every timer is corewheel's (or tokio's)

USAGE:
    cargo run --release -p corewheel-proxy -- --upstream ADDR [OPTIONS]

OPTIONS:
    --upstream ADDR          the backend every request goes to, e.g. 127.0.0.1:3000 (required)
    --listen ADDR            where to listen (default 127.0.0.1:8080)
    --timer NAME             corewheel (default), corewheel-driven or tokio: the back-end
                             of every timer (corewheel-driven: a corewheel engine with no
                             threads of its own, driven on the proxy's tokio runtime)
    --header-timeout MS      hyper's header read timeout, also the longest keep-alive wait
                             between requests (default 10000)
    --idle-timeout MS        close a client connection with no read or write for this long
                             (default 60000)
    --request-timeout MS     deadline on each upstream call, answered 504 (default 30000)
    --connect-timeout MS     deadline on connecting to the upstream, answered 504 (default 5000)
    --threads N              tokio worker threads (default: one per CPU)
    -h, --help               this text
";

/// Most milliseconds any timeout may be set to: a day.
const MAX_TIMEOUT_MS: u64 = 86_400_000;

/// Most tokio worker threads.
const MAX_THREADS: usize = 1024;

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// Run the proxy.
    Run(Config),
    /// Print [`USAGE`].
    Help,
}

impl Config {
    /// The defaults, for a proxy in front of `upstream`.
    pub fn new(upstream: SocketAddr) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            upstream,
            timer: TimerKind::Corewheel,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            threads: None,
        }
    }

    /// Parses the command line (without the program name). Every error is a message.
    pub fn parse_args<I, S>(args: I) -> Result<Command, String>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut listen = None;
        let mut upstream = None;
        let mut timer = None;
        let mut timeouts: [Option<Duration>; 4] = [None; 4];
        let mut threads = None;
        let mut args = args.into_iter().map(Into::into);
        while let Some(arg) = args.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => {
                    (flag.to_string(), Some(value.to_string()))
                }
                _ => (arg, None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| args.next())
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            match flag.as_str() {
                "-h" | "--help" => return Ok(Command::Help),
                "--listen" => listen = Some(parse_addr(&flag, &value()?)?),
                "--upstream" => upstream = Some(parse_addr(&flag, &value()?)?),
                "--timer" => {
                    let name = value()?;
                    timer = Some(TimerKind::parse(&name).ok_or_else(|| {
                        format!("--timer takes corewheel, corewheel-driven or tokio, not {name:?}")
                    })?)
                }
                "--header-timeout" => timeouts[0] = Some(parse_ms(&flag, &value()?)?),
                "--idle-timeout" => timeouts[1] = Some(parse_ms(&flag, &value()?)?),
                "--request-timeout" => timeouts[2] = Some(parse_ms(&flag, &value()?)?),
                "--connect-timeout" => timeouts[3] = Some(parse_ms(&flag, &value()?)?),
                "--threads" => {
                    let text = value()?;
                    threads = Some(
                        text.parse::<usize>()
                            .ok()
                            .filter(|n| (1..=MAX_THREADS).contains(n))
                            .ok_or_else(|| {
                                format!("--threads takes 1 to {MAX_THREADS}, not {text:?}")
                            })?,
                    )
                }
                _ => return Err(format!("unknown argument {flag:?}")),
            }
        }
        let upstream = upstream.ok_or("--upstream is required")?;
        let mut config = Config::new(upstream);
        config.listen = listen.unwrap_or(config.listen);
        config.timer = timer.unwrap_or(config.timer);
        let [header, idle, request, connect] = timeouts;
        config.header_read_timeout = header.unwrap_or(config.header_read_timeout);
        config.idle_timeout = idle.unwrap_or(config.idle_timeout);
        config.request_timeout = request.unwrap_or(config.request_timeout);
        config.connect_timeout = connect.unwrap_or(config.connect_timeout);
        config.threads = threads;
        Ok(Command::Run(config))
    }

    /// The flags that make this configuration: what [`Config::parse_args`] reads back.
    pub fn to_args(&self) -> Vec<String> {
        let ms = |d: Duration| d.as_millis().to_string();
        let mut args = vec![
            "--listen".to_string(),
            self.listen.to_string(),
            "--upstream".to_string(),
            self.upstream.to_string(),
            "--timer".to_string(),
            self.timer.name().to_string(),
            "--header-timeout".to_string(),
            ms(self.header_read_timeout),
            "--idle-timeout".to_string(),
            ms(self.idle_timeout),
            "--request-timeout".to_string(),
            ms(self.request_timeout),
            "--connect-timeout".to_string(),
            ms(self.connect_timeout),
        ];
        if let Some(threads) = self.threads {
            args.extend(["--threads".to_string(), threads.to_string()]);
        }
        args
    }
}

fn parse_addr(flag: &str, text: &str) -> Result<SocketAddr, String> {
    text.parse().map_err(|_| {
        format!("{flag} needs an IP address and port, such as 127.0.0.1:3000, not {text:?}")
    })
}

fn parse_ms(flag: &str, text: &str) -> Result<Duration, String> {
    text.parse::<u64>()
        .ok()
        .filter(|ms| (1..=MAX_TIMEOUT_MS).contains(ms))
        .map(Duration::from_millis)
        .ok_or_else(|| {
            format!("{flag} takes milliseconds from 1 to {MAX_TIMEOUT_MS}, not {text:?}")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_flags() {
        let upstream: SocketAddr = "127.0.0.1:3000".parse().unwrap();
        assert_eq!(
            Config::parse_args(["--upstream", "127.0.0.1:3000"]),
            Ok(Command::Run(Config::new(upstream)))
        );
        let mut config = Config::new(upstream);
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.timer = TimerKind::Tokio;
        config.header_read_timeout = Duration::from_millis(1);
        config.idle_timeout = Duration::from_millis(2);
        config.request_timeout = Duration::from_millis(3);
        config.connect_timeout = Duration::from_millis(4);
        config.threads = Some(2);
        assert_eq!(
            Config::parse_args(config.to_args()),
            Ok(Command::Run(config.clone()))
        );
        config.timer = TimerKind::CorewheelDriven;
        assert_eq!(
            Config::parse_args(config.to_args()),
            Ok(Command::Run(config))
        );
        assert_eq!(
            Config::parse_args(["--timer=tokio", "--help"]),
            Ok(Command::Help)
        );
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        for args in [
            &[][..],
            &["--listen", "127.0.0.1:1"],
            &["--upstream"],
            &["--upstream", "localhost"],
            &["--upstream=127.0.0.1:1", "--timer", "std"],
            &["--upstream=127.0.0.1:1", "--idle-timeout", "0"],
            &["--upstream=127.0.0.1:1", "--idle-timeout", "-5"],
            &[
                "--upstream=127.0.0.1:1",
                "--request-timeout",
                "99999999999999999999",
            ],
            &["--upstream=127.0.0.1:1", "--threads", "0"],
            &["--upstream=127.0.0.1:1", "extra"],
        ] {
            assert!(
                Config::parse_args(args.iter().copied()).is_err(),
                "{args:?}"
            );
        }
    }
}
