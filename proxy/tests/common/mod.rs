//! What the proxy's integration tests share: a backend, a proxy on it, and clients, all on
//! 127.0.0.1 in the test's own runtime, on the real clock.
//!
//! The tests assert only what holds on a loaded two-core CI machine in a debug build:
//! never early, nothing lost, exactly once. Upper bounds are seconds ([`BOUND`]); the
//! lateness they measure is printed, and the perf workload reports it from a release build.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use corewheel_proxy::{Client, Config, Proxy, Stats, TimerKind, serve_backend};
use hyper::StatusCode;
use hyper::body::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Every timer back-end: every test runs on each.
pub const TIMERS: [TimerKind; 3] = [
    TimerKind::Corewheel,
    TimerKind::CorewheelDriven,
    TimerKind::Tokio,
];

/// Longer than anything may take on a loaded machine; past it, a test fails as "never".
pub const BOUND: Duration = Duration::from_secs(20);

static PANICKED: AtomicBool = AtomicBool::new(false);

/// Records any panic in any task (tokio catches a spawned task's panic and would hide it),
/// so that [`assert_no_panic`] can fail the test.
pub fn watch_for_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICKED.store(true, Ordering::SeqCst);
        previous(info);
    }));
}

pub fn assert_no_panic() {
    assert!(
        !PANICKED.load(Ordering::SeqCst),
        "something panicked (see above)"
    );
}

/// A backend answering after `delay` (or its `?delay_ms=`), on a free port.
pub async fn backend(delay: Duration) -> SocketAddr {
    let listener = corewheel_proxy::listen(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve_backend(listener, delay));
    addr
}

/// A configuration for tests: a free port, the given upstream and timer, and timeouts far
/// beyond any test unless the test sets its own.
pub fn config(upstream: SocketAddr, timer: TimerKind) -> Config {
    let mut config = Config::new(upstream);
    config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.timer = timer;
    config.header_read_timeout = Duration::from_secs(60);
    config.idle_timeout = Duration::from_secs(60);
    config.request_timeout = Duration::from_secs(60);
    config.connect_timeout = Duration::from_secs(60);
    config
}

/// Starts the proxy in this runtime and returns its address.
pub async fn proxy(config: Config) -> SocketAddr {
    proxy_with_stats(config).await.0
}

/// Starts the proxy in this runtime: its address, and how late its timeouts fire.
pub async fn proxy_with_stats(config: Config) -> (SocketAddr, Arc<Stats>) {
    let proxy = Proxy::bind(config).await.unwrap();
    let addr = proxy.local_addr().unwrap();
    let stats = proxy.stats();
    tokio::spawn(proxy.run());
    (addr, stats)
}

/// A keep-alive HTTP/1.1 client connection.
pub async fn client(addr: SocketAddr) -> Client {
    Client::connect(addr).await.unwrap()
}

/// GETs `path` on `client`'s connection: the status and body, or why there are none.
pub async fn get(client: &mut Client, path: &'static str) -> Result<(StatusCode, Bytes), String> {
    client.get(path).await.map_err(|e| e.to_string())
}

/// A fresh connection's GET of `/`: 200 `ok` shows the proxy still serves.
pub async fn assert_still_serves(proxy: SocketAddr) {
    let mut sender = client(proxy).await;
    let (status, body) = get(&mut sender, "/").await.unwrap();
    assert_eq!((status, &body[..]), (StatusCode::OK, corewheel_proxy::BODY));
}

/// Writes `bytes` on `stream`, then reads until the proxy closes it (or resets it): what it
/// sent, and how long after `since` it closed. Fails after [`BOUND`].
pub async fn send_and_read_to_close(
    stream: &mut TcpStream,
    bytes: &[u8],
    since: Instant,
) -> Result<(String, Duration), String> {
    stream
        .write_all(bytes)
        .await
        .map_err(|e| format!("write failed: {e}"))?;
    let mut received = Vec::new();
    let read = async {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) => return Ok(()),
                Ok(n) => received.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(()),
                Err(e) => return Err(format!("read failed: {e}")),
            }
        }
    };
    tokio::time::timeout(BOUND, read)
        .await
        .map_err(|_| format!("still open after {BOUND:?}"))??;
    Ok((
        String::from_utf8_lossy(&received).into_owned(),
        since.elapsed(),
    ))
}

/// One proxy per back-end in front of `upstream`, each with `adjust` applied; runs `check`
/// against each, then checks that none of that proxy's timeouts fired early by its own
/// clock, that the proxy still serves a healthy upstream's requests (through a second
/// proxy sharing nothing but the process), and that nothing panicked.
pub async fn on_each_timer<C, F>(upstream: SocketAddr, adjust: fn(&mut Config), check: C)
where
    C: Fn(SocketAddr, TimerKind) -> F,
    F: std::future::Future<Output = ()>,
{
    watch_for_panics();
    let healthy = backend(Duration::ZERO).await;
    for timer in TIMERS {
        let mut bad = config(upstream, timer);
        adjust(&mut bad);
        let (bad, stats) = proxy_with_stats(bad).await;
        let good = proxy(config(healthy, timer)).await;
        // A keep-alive connection opened before the bad input, used after it.
        let mut bystander = client(good).await;
        assert_eq!(get(&mut bystander, "/").await.unwrap().0, StatusCode::OK);
        check(bad, timer).await;
        for (what, lateness) in [
            ("idle timeouts", &stats.idle_timeouts),
            ("deadlines", &stats.deadlines),
        ] {
            let seen = lateness.summary();
            assert_eq!(seen.early, 0, "{timer:?}: {what} fired early: {seen:?}");
            if seen.count > 0 {
                eprintln!("{timer:?}: {what} as the proxy saw them: {seen:?}");
            }
        }
        assert_eq!(get(&mut bystander, "/").await.unwrap().0, StatusCode::OK);
        assert_still_serves(good).await;
    }
    assert_no_panic();
}

/// Min, median and max of `values`, for the printed figures.
pub fn summary(values: &mut [Duration]) -> String {
    values.sort();
    match (values.first(), values.last()) {
        (Some(min), Some(max)) => format!(
            "min {min:?}, median {:?}, max {max:?}",
            values[values.len() / 2]
        ),
        _ => "none".to_string(),
    }
}
