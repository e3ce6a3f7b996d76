//! The proxy workload's clients: keep-alive connections sending requests (as fast as the
//! answers come, or at a fixed pace), and the accuracy check's idle, talking and slow
//! clients. They run in the harness's process, beside the backend; the proxy is in its own.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corewheel_proxy::Client;
use hyper::StatusCode;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// Connects in flight at once. Thousands at once overflow the proxy's accept queue, and
/// the kernel then drops SYNs that are retried a second later: a connect that takes a
/// second, which the accuracy check would count against the timer.
const CONNECTS_AT_ONCE: usize = 64;

/// Runs `connect` once a connect slot of `gate` is free, holding the slot until it ends.
async fn gated<F: Future>(gate: Arc<Semaphore>, connect: F) -> Option<F::Output> {
    let _slot = gate.acquire_owned().await.ok()?;
    Some(connect.await)
}

/// How a load runs.
#[derive(Debug, Clone, Copy)]
pub struct LoadSpec {
    pub connections: usize,
    /// `None`: each connection sends its next request as soon as the last is answered.
    /// `Some(p)`: each sends one every `p`, the connections spread over the period.
    pub pace: Option<Duration>,
    /// Requests before the measured window, untimed, so that every connection (and the
    /// proxy's upstream connections) is open and warm.
    pub warmup: Duration,
    pub window: Duration,
}

/// What a load measured in its window.
#[derive(Debug, Default)]
pub struct LoadResult {
    /// Requests answered within the window.
    pub requests: u64,
    /// Their latencies in microseconds, sorted.
    pub latencies_us: Vec<u32>,
    /// Answers other than 200 (in the window or not).
    pub not_ok: u64,
    /// Connections that failed or were closed before the load ended: "closed early".
    pub closed: u64,
    /// Connections that could not be made.
    pub unconnected: u64,
}

impl LoadResult {
    /// The latency at quantile `q` (0..=1), in microseconds.
    pub fn quantile_us(&self, q: f64) -> Option<u32> {
        let last = self.latencies_us.len().checked_sub(1)?;
        Some(self.latencies_us[((last as f64) * q).round() as usize])
    }
}

/// One connection's share of the result.
#[derive(Default)]
struct Tally {
    latencies_us: Vec<u32>,
    not_ok: u64,
    closed: bool,
}

/// Runs `spec` against `proxy`. `at_window` is called once as the window opens and once
/// as it closes (from a task of the runtime: it must be quick), for the caller's readings.
pub async fn run(proxy: SocketAddr, spec: LoadSpec, mut at_window: impl FnMut()) -> LoadResult {
    let gate = Arc::new(Semaphore::new(CONNECTS_AT_ONCE));
    let connecting: Vec<_> = (0..spec.connections)
        .map(|_| tokio::spawn(gated(Arc::clone(&gate), Client::connect(proxy))))
        .collect();
    let mut clients = Vec::new();
    let mut result = LoadResult::default();
    for connection in connecting {
        match connection.await {
            Ok(Some(Ok(client))) => clients.push(client),
            _ => result.unconnected += 1,
        }
    }
    let began = Instant::now();
    let opens = began + spec.warmup;
    let closes = opens + spec.window;
    let count = clients.len().max(1) as u32;
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(index, client)| {
            // Spread over the period, so that paced connections do not all send at once.
            let first = began
                + spec
                    .pace
                    .map_or(Duration::ZERO, |p| p * index as u32 / count);
            tokio::spawn(keep_sending(client, spec.pace, first, opens, closes))
        })
        .collect();
    tokio::time::sleep_until(opens.into()).await;
    at_window();
    tokio::time::sleep_until(closes.into()).await;
    at_window();
    for task in tasks {
        let Ok(tally) = task.await else {
            result.closed += 1;
            continue;
        };
        result.requests += tally.latencies_us.len() as u64;
        result.latencies_us.extend(tally.latencies_us);
        result.not_ok += tally.not_ok;
        result.closed += u64::from(tally.closed);
    }
    result.latencies_us.sort_unstable();
    result
}

async fn keep_sending(
    mut client: Client,
    pace: Option<Duration>,
    mut next: Instant,
    opens: Instant,
    closes: Instant,
) -> Tally {
    let mut tally = Tally::default();
    while next < closes {
        if pace.is_some() {
            tokio::time::sleep_until(next.into()).await;
        }
        let sent = Instant::now();
        match client.get("/").await {
            Ok((status, _)) => {
                let answered = Instant::now();
                if status != StatusCode::OK {
                    tally.not_ok += 1;
                }
                if (opens..closes).contains(&answered) {
                    let us = (answered - sent).as_micros();
                    tally
                        .latencies_us
                        .push(u32::try_from(us).unwrap_or(u32::MAX));
                }
                next = match pace {
                    Some(pace) => next + pace,
                    None => answered,
                };
            }
            Err(_) => {
                tally.closed = true;
                break;
            }
        }
    }
    tally
}

/// The accuracy check's clients, all at once against one proxy whose idle timeout is
/// `idle` and request deadline `deadline`.
#[derive(Debug, Clone, Copy)]
pub struct AccuracySpec {
    pub idle: Duration,
    pub deadline: Duration,
    /// Connections that connect and send nothing.
    pub idle_connections: usize,
    /// Connections that send a request every quarter of `idle`, for three `idle`s.
    pub talkers: usize,
    /// Requests that the backend answers only long after `deadline`.
    pub slow_requests: usize,
}

/// What the accuracy check saw. Lateness is measured by the client, from an instant taken
/// before the proxy could start the timer (before the connect; before the request was
/// sent), so it includes loopback and this process's scheduling: an upper bound on the
/// timer's own, and never early unless the timer is.
#[derive(Debug, Default)]
pub struct AccuracyResult {
    /// How long after the idle timeout each idle connection was closed, sorted; negative
    /// (in `early_closes`) ones are not in it.
    pub idle_late: Vec<Duration>,
    pub early_closes: u64,
    /// Idle connections still open long after the timeout, or that failed otherwise.
    pub never_closed: u64,
    /// Talking connections that were closed or failed.
    pub talkers_closed: u64,
    pub talker_requests: u64,
    /// How long after the deadline each slow request got its 504, sorted.
    pub deadline_late: Vec<Duration>,
    pub early_504s: u64,
    /// Slow requests answered with anything but a 504, or not at all.
    pub not_504: u64,
}

/// How long past a timeout the check waits before it counts a timer as never firing.
const NEVER: Duration = Duration::from_secs(10);

/// The path the backend answers only after 10 s: far past any deadline here.
const SLOW_PATH: &str = "/?delay_ms=10000";

pub async fn accuracy(proxy: SocketAddr, spec: AccuracySpec) -> AccuracyResult {
    let gate = Arc::new(Semaphore::new(CONNECTS_AT_ONCE));
    let idle: Vec<_> = (0..spec.idle_connections)
        .map(|_| tokio::spawn(idle_connection(proxy, spec.idle, Arc::clone(&gate))))
        .collect();
    let talkers: Vec<_> = (0..spec.talkers)
        .map(|_| tokio::spawn(talker(proxy, spec.idle, Arc::clone(&gate))))
        .collect();
    let slow: Vec<_> = (0..spec.slow_requests)
        .map(|_| tokio::spawn(slow_request(proxy, Arc::clone(&gate))))
        .collect();
    let mut result = AccuracyResult::default();
    for connection in idle {
        match connection.await {
            Ok(Some(open)) if open < spec.idle => result.early_closes += 1,
            Ok(Some(open)) => result.idle_late.push(open - spec.idle),
            _ => result.never_closed += 1,
        }
    }
    for talker in talkers {
        match talker.await {
            Ok(Ok(requests)) => result.talker_requests += requests,
            _ => result.talkers_closed += 1,
        }
    }
    for request in slow {
        match request.await {
            Ok(Some((StatusCode::GATEWAY_TIMEOUT, took))) if took < spec.deadline => {
                result.early_504s += 1
            }
            Ok(Some((StatusCode::GATEWAY_TIMEOUT, took))) => {
                result.deadline_late.push(took - spec.deadline)
            }
            _ => result.not_504 += 1,
        }
    }
    result.idle_late.sort_unstable();
    result.deadline_late.sort_unstable();
    result
}

/// Connects, sends nothing, and waits for the proxy to close: how long after the connect
/// began it closed; `None` if it did not within `idle` + [`NEVER`].
async fn idle_connection(
    proxy: SocketAddr,
    idle: Duration,
    gate: Arc<Semaphore>,
) -> Option<Duration> {
    let (connecting, stream) = gated(gate, async {
        let connecting = Instant::now();
        (connecting, TcpStream::connect(proxy).await)
    })
    .await?;
    let mut stream = stream.ok()?;
    let mut byte = [0u8; 1];
    match tokio::time::timeout(idle + NEVER, stream.read(&mut byte)).await {
        Ok(Ok(0)) => Some(connecting.elapsed()),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => Some(connecting.elapsed()),
        _ => None,
    }
}

/// A request every quarter of `idle` for three `idle`s: the requests answered, or why the
/// connection failed.
async fn talker(proxy: SocketAddr, idle: Duration, gate: Arc<Semaphore>) -> Result<u64, String> {
    let mut client = gated(gate, Client::connect(proxy))
        .await
        .ok_or("no connect slot")?
        .map_err(|e| e.to_string())?;
    let began = Instant::now();
    let mut requests = 0;
    while began.elapsed() < 3 * idle {
        let (status, _) = client.get("/").await.map_err(|e| e.to_string())?;
        if status != StatusCode::OK {
            return Err(format!("status {status}"));
        }
        requests += 1;
        tokio::time::sleep(idle / 4).await;
    }
    Ok(requests)
}

/// A request the backend answers far past the deadline: its status and how long after it
/// was sent the answer came.
async fn slow_request(proxy: SocketAddr, gate: Arc<Semaphore>) -> Option<(StatusCode, Duration)> {
    let mut client = gated(gate, Client::connect(proxy)).await?.ok()?;
    client.ready().await.ok()?;
    let sent = Instant::now();
    let (status, _) = tokio::time::timeout(NEVER, client.get(SLOW_PATH))
        .await
        .ok()?
        .ok()?;
    Some((status, sent.elapsed()))
}
