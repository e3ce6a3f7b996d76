//! hyper's own timeouts, driven by a `hyper::rt::Timer`, over real sockets on 127.0.0.1.
//!
//! Each scenario is a `check_*` function that returns what it observed or why the timer
//! failed it. The tests run every check on the timer under test, and run the same checks on
//! deliberately broken timers to show that each check can fail: a check that passes on a
//! timer whose sleeps never end, or end early, or whose `reset` does nothing, proves nothing.
//!
//! Time assertions are one-sided on purpose. "Never early" is exact: every start instant
//! is taken before hyper reads the timer, and the deadline hyper computes from the timer's
//! clock can only be later. "Eventually" is bounded by many seconds, since CI is a loaded
//! two-core machine; lateness is reported, never asserted tightly.
#![cfg(feature = "hyper")]

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use corewheel::HyperTimer;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::rt::{Sleep, Timer};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// How long any scenario may take before the timer counts as never firing. Far beyond any
/// deadline used here, so that a slow machine is never mistaken for a broken timer.
const BOUND: Duration = Duration::from_secs(20);

/// The timer under test: corewheel's, on the process-wide default engine. The tokio runtime
/// still has its own timer, but only for the checks' bounds and the clients' pauses.
fn timer() -> HyperTimer {
    HyperTimer::default()
}

// ---------------------------------------------------------------------------------------
// HTTP/1: header_read_timeout
// ---------------------------------------------------------------------------------------

async fn hello(_: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"hello"))))
}

/// What the server saw of one connection.
struct Served {
    /// Taken after `accept` returned and before hyper saw the connection, so before hyper
    /// first read the timer's clock.
    accepted: Instant,
    /// When the service was last called: before hyper starts the next request's header
    /// timeout.
    last_request: Option<Instant>,
    ended: Instant,
    result: hyper::Result<()>,
}

/// Serves one HTTP/1 connection with `header_read_timeout` on `timer`.
async fn serve_http1<T>(listener: TcpListener, timer: T, header_timeout: Duration) -> Served
where
    T: Timer + Send + Sync + 'static,
{
    let (stream, _) = listener.accept().await.unwrap();
    let accepted = Instant::now();
    let last_request = Arc::new(Mutex::new(None));
    let seen = Arc::clone(&last_request);
    let service = service_fn(move |req| {
        *seen.lock().unwrap() = Some(Instant::now());
        hello(req)
    });
    let result = hyper::server::conn::http1::Builder::new()
        .timer(timer)
        .header_read_timeout(header_timeout)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    let ended = Instant::now();
    let last_request = *last_request.lock().unwrap();
    Served {
        accepted,
        last_request,
        ended,
        result,
    }
}

/// What the server task returned, once it finishes the connection within `bound`.
async fn finished<T>(server: tokio::task::JoinHandle<T>, bound: Duration) -> Result<T, String> {
    Ok(tokio::time::timeout(bound, server)
        .await
        .map_err(|_| "the server never finished the connection".to_string())?
        .unwrap())
}

/// The connection ended `open_for` after `from` because of its header timeout, and no
/// sooner than that timeout. Returns `open_for`.
fn closed_by_header_timeout(
    result: hyper::Result<()>,
    open_for: Duration,
    from: &str,
    header_timeout: Duration,
) -> Result<Duration, String> {
    if open_for < header_timeout {
        return Err(format!(
            "closed {open_for:?} after {from}, before the {header_timeout:?} header timeout"
        ));
    }
    match result {
        Err(e) if e.is_timeout() => Ok(open_for),
        other => Err(format!(
            "the connection ended with {other:?}, not a header timeout"
        )),
    }
}

/// An HTTP/1 server on `timer` with `header_timeout`, and a client connected to it that has
/// sent the first part of a request head.
async fn h1_with_part_of_a_head<T>(
    timer: T,
    header_timeout: Duration,
) -> (tokio::task::JoinHandle<Served>, TcpStream)
where
    T: Timer + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(serve_http1(listener, timer, header_timeout));
    let mut client = TcpStream::connect(addr).await.unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n")
        .await
        .unwrap();
    (server, client)
}

/// A client sends part of its request head and stalls. The server must close the connection
/// because of the header timeout, no earlier than the timeout after it accepted it.
/// Returns how long after acceptance the server closed it.
async fn check_h1_stalled_head<T>(
    timer: T,
    header_timeout: Duration,
    bound: Duration,
) -> Result<Duration, String>
where
    T: Timer + Send + Sync + 'static,
{
    let (server, mut client) = h1_with_part_of_a_head(timer, header_timeout).await;
    // The server may answer 408 before it closes; what matters is that it closes.
    let mut reply = Vec::new();
    match tokio::time::timeout(bound, client.read_to_end(&mut reply)).await {
        Err(_) => return Err(format!("the connection was still open after {bound:?}")),
        Ok(Err(e)) if e.kind() != std::io::ErrorKind::ConnectionReset => {
            return Err(format!("client read failed: {e}"));
        }
        Ok(_) => {}
    }
    let served = finished(server, bound).await?;
    let open_for = served.ended - served.accepted;
    closed_by_header_timeout(served.result, open_for, "accept", header_timeout)
}

/// A client whose request head arrives in two parts, both within the header timeout, is
/// served; then, idle, the connection is closed by the timeout on the next request's head,
/// no earlier than the timeout after the first request was handled. Returns how long after
/// that the server closed it.
async fn check_h1_served<T>(
    timer: T,
    header_timeout: Duration,
    bound: Duration,
) -> Result<Duration, String>
where
    T: Timer + Send + Sync + 'static,
{
    let (server, mut client) = h1_with_part_of_a_head(timer, header_timeout).await;
    tokio::time::sleep(header_timeout / 20).await;
    client.write_all(b"\r\n").await.unwrap();
    let mut reply = Vec::new();
    match tokio::time::timeout(bound, client.read_to_end(&mut reply)).await {
        Err(_) => return Err(format!("the connection was still open after {bound:?}")),
        Ok(Err(e)) if e.kind() != std::io::ErrorKind::ConnectionReset => {
            return Err(format!("client read failed: {e}"));
        }
        Ok(_) => {}
    }
    let reply = String::from_utf8_lossy(&reply);
    if !reply.starts_with("HTTP/1.1 200 OK\r\n") || !reply.contains("\r\n\r\nhello") {
        return Err(format!(
            "the request was not served; the server sent {reply:?}"
        ));
    }
    let served = finished(server, bound).await?;
    let handled = served.last_request.ok_or("the service was never called")?;
    let idle_for = served.ended - handled;
    closed_by_header_timeout(served.result, idle_for, "the request", header_timeout)
}

// ---------------------------------------------------------------------------------------
// HTTP/2: keep-alive pings
// ---------------------------------------------------------------------------------------

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame: length 0, type 4, no flags, stream 0.
const H2_EMPTY_SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];
const FRAME_PING: u8 = 6;
const FLAG_ACK: u8 = 1;

/// Counts the PING frames (not ACKs) in the bytes a server sent, from `*offset` on; moves
/// `*offset` past the whole frames read.
fn count_pings(bytes: &[u8], offset: &mut usize) -> usize {
    let mut pings = 0;
    while let Some(header) = bytes.get(*offset..*offset + 9) {
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        if bytes.len() < *offset + 9 + len {
            break;
        }
        if header[3] == FRAME_PING && header[4] & FLAG_ACK == 0 {
            pings += 1;
        }
        *offset += 9 + len;
    }
    pings
}

/// A client-side stream that keeps a copy of everything the server sends, to count its
/// pings: a hyper client answers them without telling anyone.
struct Recording {
    stream: TcpStream,
    received: Arc<Mutex<Vec<u8>>>,
}

impl AsyncRead for Recording {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        self.received
            .lock()
            .unwrap()
            .extend_from_slice(&buf.filled()[before..]);
        polled
    }
}

impl tokio::io::AsyncWrite for Recording {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Serves one HTTP/2 connection with keep-alive pings on `timer`. The receiver gets the
/// instant the connection was accepted; the handle ends with the instant it closed and why.
fn serve_http2<T>(
    listener: TcpListener,
    timer: T,
    interval: Duration,
    timeout: Duration,
) -> (
    oneshot::Receiver<Instant>,
    tokio::task::JoinHandle<(Instant, hyper::Result<()>)>,
)
where
    T: Timer + Send + Sync + 'static,
{
    let (accepted_tx, accepted_rx) = oneshot::channel();
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let _ = accepted_tx.send(Instant::now());
        let result = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(timer)
            .keep_alive_interval(interval)
            .keep_alive_timeout(timeout)
            .serve_connection(TokioIo::new(stream), service_fn(hello))
            .await;
        (Instant::now(), result)
    });
    (accepted_rx, server)
}

/// A hyper client, which answers pings, stays connected while the server pings it several
/// times, and its requests are served before and after. Returns the pings it answered.
async fn check_h2_answered<T>(
    timer: T,
    interval: Duration,
    timeout: Duration,
    bound: Duration,
) -> Result<usize, String>
where
    T: Timer + Send + Sync + 'static,
{
    const PINGS: usize = 4;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_, server) = serve_http2(listener, timer, interval, timeout);

    let received = Arc::new(Mutex::new(Vec::new()));
    let stream = Recording {
        stream: TcpStream::connect(addr).await.unwrap(),
        received: Arc::clone(&received),
    };
    let (mut sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake failed: {e}"))?;
    let client = tokio::spawn(connection);

    let uri = format!("http://{addr}/");
    let mut get = async || -> Result<(), String> {
        let request = Request::get(&uri).body(Empty::new()).unwrap();
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("request failed: {e}"))?;
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body failed: {e}"))?;
        match body.to_bytes() {
            b if b == "hello" => Ok(()),
            b => Err(format!("unexpected body {b:?}")),
        }
    };
    get().await?;

    // Waits for the pings rather than for a fixed time, so that a slow machine only makes
    // the test slower.
    let started = Instant::now();
    let mut pings = 0;
    let mut offset = 0;
    while pings < PINGS {
        if server.is_finished() {
            let (_, result) = server.await.unwrap();
            return Err(format!(
                "the server closed the connection after {pings} pings: {result:?}"
            ));
        }
        if started.elapsed() > bound {
            return Err(format!("only {pings} pings in {bound:?}"));
        }
        tokio::time::sleep(interval / 4).await;
        pings += count_pings(&received.lock().unwrap(), &mut offset);
    }
    get().await?;
    if server.is_finished() || client.is_finished() {
        return Err("the connection closed after the pings".into());
    }
    Ok(pings)
}

/// What the server's pings to a silent peer led to.
#[derive(Debug)]
struct Unanswered {
    /// From the peer's connect to the first ping it received.
    first_ping: Duration,
    /// From the server's accept to the close.
    closed: Duration,
}

/// A peer that sends the HTTP/2 preface and its SETTINGS, then never writes again (so never
/// acknowledges a ping), is pinged no earlier than the interval and closed no earlier than
/// the interval plus the timeout, and within `bound`.
async fn check_h2_unanswered<T>(
    timer: T,
    interval: Duration,
    timeout: Duration,
    bound: Duration,
) -> Result<Unanswered, String>
where
    T: Timer + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (accepted, server) = serve_http2(listener, timer, interval, timeout);

    let connecting = Instant::now();
    let mut peer = TcpStream::connect(addr).await.unwrap();
    peer.write_all(H2_PREFACE).await.unwrap();
    peer.write_all(H2_EMPTY_SETTINGS).await.unwrap();

    // Reads, so that nothing the server sends can stall it, until the server closes.
    let mut received = Vec::new();
    let mut offset = 0;
    let mut first_ping = None;
    let read_all = async {
        let mut chunk = [0u8; 4096];
        loop {
            match peer.read(&mut chunk).await {
                Ok(0) => return Ok(()),
                Ok(n) => received.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(()),
                Err(e) => return Err(format!("peer read failed: {e}")),
            }
            if first_ping.is_none() && count_pings(&received, &mut offset) > 0 {
                first_ping = Some(connecting.elapsed());
            }
        }
    };
    tokio::time::timeout(bound, read_all)
        .await
        .map_err(|_| format!("the connection was still open after {bound:?}"))??;
    let accepted = accepted.await.unwrap();
    let (ended, result) = finished(server, bound).await?;
    let first_ping = first_ping.ok_or("closed without a ping")?;
    if first_ping < interval {
        return Err(format!(
            "pinged {first_ping:?} after connect, before the {interval:?} interval"
        ));
    }
    let closed = ended - accepted;
    if closed < interval + timeout {
        return Err(format!(
            "closed {closed:?} after accept, before interval + timeout = {:?}",
            interval + timeout
        ));
    }
    match result {
        Err(e) if e.is_timeout() => Ok(Unanswered { first_ping, closed }),
        other => Err(format!(
            "the connection ended with {other:?}, not a keep-alive timeout"
        )),
    }
}

// ---------------------------------------------------------------------------------------
// The timer under test
// ---------------------------------------------------------------------------------------

const HEADER_TIMEOUT: Duration = Duration::from_millis(500);
const PING_INTERVAL: Duration = Duration::from_millis(200);
const PING_TIMEOUT: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_header_timeout_closes_a_stalled_client() {
    let closed = check_h1_stalled_head(timer(), HEADER_TIMEOUT, BOUND)
        .await
        .unwrap();
    eprintln!("header timeout {HEADER_TIMEOUT:?}: closed {closed:?} after accept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_header_timeout_serves_a_timely_client() {
    // Long enough that the client's own pause cannot run past it on a loaded machine.
    let header_timeout = Duration::from_secs(1);
    let closed = check_h1_served(timer(), header_timeout, BOUND)
        .await
        .unwrap();
    eprintln!(
        "header timeout {header_timeout:?}: served, then idle, closed {closed:?} after the request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_keep_alive_keeps_a_peer_that_answers() {
    // The timeout only has to cover a ping's round trip, and is long so that a loaded
    // machine cannot make an answering peer look silent.
    let pings = check_h2_answered(
        timer(),
        Duration::from_millis(100),
        Duration::from_secs(5),
        BOUND,
    )
    .await
    .unwrap();
    eprintln!("answered {pings} pings and stayed connected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_keep_alive_closes_a_silent_peer() {
    let seen = check_h2_unanswered(timer(), PING_INTERVAL, PING_TIMEOUT, BOUND)
        .await
        .unwrap();
    eprintln!(
        "ping interval {PING_INTERVAL:?}, timeout {PING_TIMEOUT:?}: first ping {:?} after connect, closed {:?} after accept",
        seen.first_ping, seen.closed
    );
}

// ---------------------------------------------------------------------------------------
// The checks fail on broken timers
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Sleeps never complete.
    Never,
    /// Sleeps complete after a quarter of their time.
    Early,
    /// `reset` leaves the sleep as it was.
    NoReset,
}

/// The timer under test with one fault, built on it so that only the fault differs.
#[derive(Clone)]
struct Broken<T> {
    inner: T,
    fault: Fault,
}

struct NeverSleep;

impl Future for NeverSleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        Poll::Pending
    }
}

impl Sleep for NeverSleep {}

impl<T: Timer> Timer for Broken<T> {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        match self.fault {
            Fault::Never => Box::pin(NeverSleep),
            Fault::Early => self.inner.sleep(duration / 4),
            Fault::NoReset => self.inner.sleep(duration),
        }
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        let now = self.inner.now();
        match self.fault {
            Fault::Never => Box::pin(NeverSleep),
            Fault::Early => self
                .inner
                .sleep_until(now + deadline.saturating_duration_since(now) / 4),
            Fault::NoReset => self.inner.sleep_until(deadline),
        }
    }

    fn now(&self) -> Instant {
        self.inner.now()
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn Sleep>>, deadline: Instant) {
        match self.fault {
            Fault::Never | Fault::Early => *sleep = self.sleep_until(deadline),
            Fault::NoReset => {}
        }
    }
}

fn broken(fault: Fault) -> Broken<impl Timer + Clone + Send + Sync + 'static> {
    Broken {
        inner: timer(),
        fault,
    }
}

/// A timer that never fires must be caught; waiting for it is what makes these tests slow,
/// so they wait a shorter bound, still far beyond the deadlines.
const BROKEN_BOUND: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_stalled_check_fails_on_broken_timers() {
    for fault in [Fault::Never, Fault::Early] {
        let failed = check_h1_stalled_head(broken(fault), HEADER_TIMEOUT, BROKEN_BOUND).await;
        eprintln!("{fault:?}: {failed:?}");
        assert!(failed.is_err(), "{fault:?} passed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_served_check_fails_on_broken_timers() {
    for fault in [Fault::Never, Fault::Early] {
        let failed = check_h1_served(broken(fault), Duration::from_secs(1), BROKEN_BOUND).await;
        eprintln!("{fault:?}: {failed:?}");
        assert!(failed.is_err(), "{fault:?} passed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_answered_check_fails_on_broken_timers() {
    for fault in [Fault::Never, Fault::NoReset] {
        let failed = check_h2_answered(
            broken(fault),
            Duration::from_millis(100),
            Duration::from_secs(5),
            BROKEN_BOUND,
        )
        .await;
        eprintln!("{fault:?}: {failed:?}");
        assert!(failed.is_err(), "{fault:?} passed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_silent_check_fails_on_broken_timers() {
    for fault in [Fault::Never, Fault::Early] {
        let failed =
            check_h2_unanswered(broken(fault), PING_INTERVAL, PING_TIMEOUT, BROKEN_BOUND).await;
        eprintln!("{fault:?}: {failed:?}");
        assert!(failed.is_err(), "{fault:?} passed");
    }
}
