//! A hostile review: clients and upstreams that misbehave on purpose, on both timers, over
//! loopback with the real clock. Asserts only what holds on a loaded machine: never early,
//! exact status codes, no panic, other connections still served; upper bounds are seconds.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use corewheel_proxy::{Config, TimerKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

const IDLE: Duration = Duration::from_millis(400);
/// "Never" for these tests: well past every timeout they set.
const LONG: Duration = Duration::from_secs(6);

fn cfg(upstream: SocketAddr, timer: TimerKind, adjust: impl FnOnce(&mut Config)) -> Config {
    let mut c = config(upstream, timer);
    adjust(&mut c);
    c
}

/// A proxy on a healthy backend, for "the process still serves" checks.
async fn healthy(timer: TimerKind) -> SocketAddr {
    proxy(config(backend(Duration::ZERO).await, timer)).await
}

/// What a raw upstream does on each connection after reading a request head.
#[derive(Clone, Copy)]
enum After {
    Hold,
    Close,
    /// Wait for the next request on the connection, then close without answering it: the
    /// close a proxy cannot see coming, as a backend's idle timeout closing a kept
    /// connection just as the next request goes out.
    CloseOnNextRequest,
    /// Wait for the next request on the connection, then reset it (a close with a zero
    /// linger) without answering: the proxy reads a reset rather than the end of the
    /// stream, as it does when a backend's close crosses the next request on the wire.
    ResetOnNextRequest,
}

/// A raw-TCP upstream: reads a request head, writes `reply`, then holds or closes.
async fn raw_upstream(reply: &'static [u8], after: After) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut b).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&b[..n]),
                    }
                }
                let _ = s.write_all(reply).await;
                match after {
                    After::Close => drop(s),
                    After::CloseOnNextRequest => {
                        let _ = s.read(&mut b).await;
                        drop(s);
                    }
                    After::ResetOnNextRequest => {
                        let _ = s.read(&mut b).await;
                        // A zero linger never blocks the close: it sends a reset at once.
                        #[allow(deprecated)]
                        let _ = s.set_linger(Some(Duration::ZERO));
                        drop(s);
                    }
                    After::Hold => {
                        // Keep reading (and discarding) so the socket stays open.
                        loop {
                            match s.read(&mut b).await {
                                Ok(0) | Err(_) => {
                                    tokio::time::sleep(Duration::from_secs(60)).await;
                                    return;
                                }
                                Ok(_) => {}
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

/// Writes `bytes`, then reads until close/reset or `limit`: (received, Some(closed after)).
async fn write_then_read(
    stream: &mut TcpStream,
    bytes: &[u8],
    since: Instant,
    limit: Duration,
) -> (String, Option<Duration>) {
    let _ = stream.write_all(bytes).await;
    let mut got = Vec::new();
    let read = async {
        let mut b = [0u8; 65536];
        loop {
            match stream.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&b[..n]),
            }
        }
    };
    let closed = tokio::time::timeout(limit, read)
        .await
        .is_ok()
        .then(|| since.elapsed());
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

fn statuses(reply: &str) -> Vec<&str> {
    reply
        .match_indices("HTTP/1.")
        .filter_map(|(i, _)| reply.get(i + 9..i + 12))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Upstream stalls after the response head.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_stalling_mid_body_closes_client_at_idle_timeout() {
    watch_for_panics();
    let up = raw_upstream(
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc",
        After::Hold,
    )
    .await;
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |c| c.idle_timeout = IDLE)).await;
        let mut s = TcpStream::connect(proxy).await.unwrap();
        let t = Instant::now();
        let (got, closed) =
            write_then_read(&mut s, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", t, LONG).await;
        let closed = closed.unwrap_or_else(|| panic!("{timer:?}: never closed"));
        assert!(got.starts_with("HTTP/1.1 200 "), "{timer:?}: {got:?}");
        assert!(closed >= IDLE, "{timer:?}: closed after {closed:?}, early");
        eprintln!("{timer:?}: stalled upstream body: client closed after {closed:?}");
        assert_still_serves(healthy(timer).await).await;
    }
    assert_no_panic();
}

/// Found by this review: with a pipelined request buffered, hyper stops polling the
/// client socket while the upstream stalls mid-body, so an idle timer polled from the
/// stream never ran. The idle watch now runs beside the connection future.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_request_behind_upstream_stalling_mid_body_is_closed_at_idle_timeout() {
    watch_for_panics();
    let up = raw_upstream(
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc",
        After::Hold,
    )
    .await;
    let mut faults = Vec::new();
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |c| c.idle_timeout = IDLE)).await;
        let mut s = TcpStream::connect(proxy).await.unwrap();
        let t = Instant::now();
        let two = b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n";
        let (got, closed) = write_then_read(&mut s, two, t, LONG).await;
        assert!(got.starts_with("HTTP/1.1 200 "), "{timer:?}: {got:?}");
        match closed {
            None => faults.push(format!(
                "{timer:?}: still open after {LONG:?}, idle timeout {IDLE:?}"
            )),
            Some(c) if c < IDLE => faults.push(format!("{timer:?}: closed early, {c:?}")),
            Some(c) => eprintln!("{timer:?}: closed after {c:?}"),
        }
    }
    assert_no_panic();
    assert!(faults.is_empty(), "{faults:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_keepalive_request_behind_upstream_stalling_mid_body_is_closed_at_idle_timeout() {
    watch_for_panics();
    let up = raw_upstream(
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc",
        After::Hold,
    )
    .await;
    let mut faults = Vec::new();
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |c| c.idle_timeout = IDLE)).await;
        for req in [
            &b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"[..],
            b"GET / HTTP/1.0\r\n\r\n",
        ] {
            let what = String::from_utf8_lossy(&req[..14]).into_owned();
            let mut s = TcpStream::connect(proxy).await.unwrap();
            let t = Instant::now();
            let (got, closed) = write_then_read(&mut s, req, t, LONG).await;
            assert!(got.contains(" 200 OK"), "{timer:?}: {got:?}");
            match closed {
                None => faults.push(format!(
                    "{timer:?} {what:?}: still open after {LONG:?}, idle timeout {IDLE:?}"
                )),
                Some(c) if c < IDLE => {
                    faults.push(format!("{timer:?} {what:?}: closed early, {c:?}"))
                }
                Some(c) => eprintln!("{timer:?} {what:?}: closed after {c:?}"),
            }
        }
    }
    assert_no_panic();
    assert!(faults.is_empty(), "{faults:?}");
}

/// A raw upstream that answers a head and `abc` of 100 bytes, then stalls; counts the
/// upstream connections the proxy still holds open.
async fn counting_stalled_upstream() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>)
{
    use std::sync::atomic::{AtomicUsize, Ordering};
    let open = std::sync::Arc::new(AtomicUsize::new(0));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counter = open.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let open = counter.clone();
            open.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut b = [0u8; 4096];
                let mut head = Vec::new();
                let mut answered = false;
                loop {
                    match s.read(&mut b).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&b[..n]),
                    }
                    if !answered && head.windows(4).any(|w| w == b"\r\n\r\n") {
                        answered = true;
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")
                            .await;
                    }
                }
                open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (addr, open)
}

/// Clients that send a request (plus `extra` bytes), read the head, then vanish: how many
/// upstream connections the proxy still holds 5 idle timeouts later.
async fn upstream_connections_left_behind(timer: TimerKind, extra: &[u8]) -> usize {
    let (up, open) = counting_stalled_upstream().await;
    let proxy = proxy(cfg(up, timer, |c| c.idle_timeout = IDLE)).await;
    for _ in 0..20 {
        let mut s = TcpStream::connect(proxy).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        s.write_all(extra).await.unwrap();
        let mut b = [0u8; 1024];
        let _ = tokio::time::timeout(LONG, s.read(&mut b))
            .await
            .expect("no head");
        drop(s); // the client is gone
    }
    tokio::time::sleep(5 * IDLE).await;
    open.load(std::sync::atomic::Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vanished_clients_release_their_stalled_upstreams() {
    watch_for_panics();
    for timer in TIMERS {
        let left = upstream_connections_left_behind(timer, b"").await;
        assert_eq!(left, 0, "{timer:?}: upstream connections still held");
    }
    assert_no_panic();
}

/// Found by this review: clients that sent one extra byte (a pipelined request, a stray
/// CRLF) and vanished held their connections and upstream sockets for as long as the
/// upstream stalled. Fixed by the idle watch beside the connection future.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vanished_pipelining_clients_release_their_stalled_upstreams() {
    watch_for_panics();
    let mut faults = Vec::new();
    for timer in TIMERS {
        // A pipelined request's first byte; a stray CRLF after the request (RFC 9112 2.2
        // tells servers to tolerate one, and old clients send it after a POST body).
        for extra in [&b"G"[..], b"\r\n"] {
            let left = upstream_connections_left_behind(timer, extra).await;
            if left != 0 {
                faults.push(format!("{timer:?} extra {extra:?}: {left} of 20 upstream connections still held after 5 idle timeouts, clients gone"));
            }
        }
    }
    assert_no_panic();
    assert!(faults.is_empty(), "{faults:?}");
}

// ---------------------------------------------------------------------------------------
// Idle and header timeouts: never early, and talking resets the idle timeout.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connection_closed_at_idle_timeout_never_before() {
    watch_for_panics();
    let up = backend(Duration::ZERO).await;
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |c| c.idle_timeout = IDLE)).await;
        let t = Instant::now();
        let mut s = TcpStream::connect(proxy).await.unwrap();
        let (got, closed) = write_then_read(&mut s, b"", t, LONG).await;
        let closed = closed.unwrap_or_else(|| panic!("{timer:?}: never closed"));
        assert!(closed >= IDLE, "{timer:?}: closed after {closed:?}");
        assert!(got.is_empty() || got.starts_with("HTTP/1.1 408"), "{got:?}");
        eprintln!("{timer:?}: silent connection closed after {closed:?}");
    }
    assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_head_outlives_idle_but_not_header_timeout() {
    // A byte of head every IDLE/3: the idle timeout keeps moving, so only the header
    // timeout (1.5 s) may end it, and never before.
    watch_for_panics();
    let header = Duration::from_millis(1500);
    let up = backend(Duration::ZERO).await;
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |c| {
            c.idle_timeout = IDLE;
            c.header_read_timeout = Duration::from_millis(1500);
        }))
        .await;
        let t = Instant::now();
        let mut s = TcpStream::connect(proxy).await.unwrap();
        let (mut rd, mut wr) = s.split();
        let reader = async {
            let mut b = [0u8; 1024];
            let mut got = Vec::new();
            loop {
                match rd.read(&mut b).await {
                    Ok(0) | Err(_) => return (got, t.elapsed()),
                    Ok(n) => got.extend_from_slice(&b[..n]),
                }
            }
        };
        let writer = async {
            for byte in b"GET / HTTP/1.1\r\nHost: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                .iter()
                .cycle()
            {
                if wr.write_all(&[*byte]).await.is_err() {
                    break;
                }
                tokio::time::sleep(IDLE / 3).await;
            }
        };
        let (got, closed) = tokio::select! {
            r = reader => r,
            _ = writer => panic!("writer ended first"),
            _ = tokio::time::sleep(LONG) => panic!("{timer:?}: slowloris never closed"),
        };
        assert!(
            closed >= header,
            "{timer:?}: closed after {closed:?}, before header timeout"
        );
        let got = String::from_utf8_lossy(&got);
        assert!(got.is_empty() || got.starts_with("HTTP/1.1 408"), "{got:?}");
        eprintln!("{timer:?}: slowloris closed after {closed:?} (header timeout {header:?})");
    }
    assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talking_just_under_idle_timeout_is_never_closed() {
    watch_for_panics();
    let up = backend(Duration::ZERO).await;
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |c| c.idle_timeout = IDLE)).await;
        let mut c = client(proxy).await;
        let t = Instant::now();
        while t.elapsed() < 5 * IDLE {
            let (status, _) = get(&mut c, "/").await.unwrap_or_else(|e| {
                panic!(
                    "{timer:?}: closed after {:?} while talking: {e}",
                    t.elapsed()
                )
            });
            assert_eq!(status, 200);
            // A quarter, not a half: a close is right once this task has been kept off
            // its core for the other three.
            tokio::time::sleep(IDLE / 4).await;
        }
    }
    assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_request_body_under_idle_timeout_is_not_closed_early() {
    // A request body dribbled a byte every IDLE/5 (eight of them outlast IDLE) to an
    // upstream that reads it all before answering: reads keep resetting the idle timeout,
    // so it must get its 200. A gap of a fifth leaves the rest for a loaded machine.
    watch_for_panics();
    let up = raw_upstream_reading_body().await;
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |c| c.idle_timeout = IDLE)).await;
        let mut s = TcpStream::connect(proxy).await.unwrap();
        s.write_all(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 8\r\n\r\n")
            .await
            .unwrap();
        let t = Instant::now();
        for _ in 0..8 {
            tokio::time::sleep(IDLE / 5).await;
            s.write_all(b"x")
                .await
                .unwrap_or_else(|e| panic!("{timer:?}: after {:?}: {e}", t.elapsed()));
        }
        let (got, _) = write_then_read(&mut s, b"", t, LONG).await;
        assert!(
            got.starts_with("HTTP/1.1 200 "),
            "{timer:?}: after {:?}: {got:?}",
            t.elapsed()
        );
    }
    assert_no_panic();
}

/// An upstream that reads a Content-Length body fully, then answers 200 and keeps alive.
async fn raw_upstream_reading_body() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut b = [0u8; 4096];
                loop {
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap_or(0));
                        if buf.len() >= end + 4 + len {
                            buf.drain(..end + 4 + len);
                            if s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
                                .await
                                .is_err()
                            {
                                return;
                            }
                            continue;
                        }
                    }
                    match s.read(&mut b).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&b[..n]),
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_slower_than_idle_but_within_deadline() {
    // idle 400 ms < upstream's 1200 ms < deadline 5 s. The client waits for a response
    // that the deadline allows; what does it get? (Observed, asserted below.)
    watch_for_panics();
    let up = backend(Duration::ZERO).await;
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |c| {
            c.idle_timeout = IDLE;
            c.request_timeout = Duration::from_secs(5);
        }))
        .await;
        let mut s = TcpStream::connect(proxy).await.unwrap();
        let t = Instant::now();
        let (got, closed) = write_then_read(
            &mut s,
            b"GET /?delay_ms=1200 HTTP/1.1\r\nHost: a\r\n\r\n",
            t,
            LONG,
        )
        .await;
        eprintln!("{timer:?}: slow upstream, idle {IDLE:?}: got {got:?}, closed {closed:?}");
        // Documented: "no byte read or written for this long is closed", upstream wait included.
        let closed = closed.expect("never closed");
        assert!(closed >= IDLE, "{timer:?}: early {closed:?}");
        assert!(got.is_empty(), "{timer:?}: {got:?}");
    }
    assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talking_at_the_edge_of_the_idle_timeout_is_never_closed_early() {
    // 40 connections each send a request, read its answer, and wait 80..100% of the idle
    // timeout before the next: the idle sleep is reset right around its expiry. A close is
    // allowed (scheduling may stretch a gap past the timeout) but never one that comes
    // sooner than IDLE after this client's last byte sent, which the proxy read later.
    const EDGE: Duration = Duration::from_millis(200);
    watch_for_panics();
    let up = backend(Duration::ZERO).await;
    for timer in TIMERS {
        let (proxy, stats) = proxy_with_stats(cfg(up, timer, |c| c.idle_timeout = EDGE)).await;
        let mut tasks = Vec::new();
        for n in 0..40u64 {
            tasks.push(tokio::spawn(async move {
                // The proxy's last byte moved is never before `anchor`: the connect, then
                // the send of the last request it answered (it read that request later).
                let mut anchor = Instant::now();
                let mut s = TcpStream::connect(proxy).await.unwrap();
                let start = Instant::now();
                let mut rounds = 0u64;
                let mut buf = Vec::new();
                let early = |anchor: Instant| {
                    let gap = anchor.elapsed();
                    if gap < EDGE {
                        Err(format!("closed {gap:?} after the proxy's last read"))
                    } else {
                        Ok(())
                    }
                };
                while start.elapsed() < Duration::from_secs(3) {
                    let sent = Instant::now();
                    if s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                        .await
                        .is_err()
                    {
                        early(anchor)?;
                        return Ok((rounds, true));
                    }
                    buf.clear();
                    let mut b = [0u8; 1024];
                    while !(buf.ends_with(b"ok\n") && buf.windows(4).any(|w| w == b"\r\n\r\n")) {
                        match s.read(&mut b).await {
                            Ok(0) | Err(_) => {
                                early(anchor)?;
                                return Ok((rounds, true));
                            }
                            Ok(k) => buf.extend_from_slice(&b[..k]),
                        }
                    }
                    anchor = sent;
                    rounds += 1;
                    let pause = EDGE * (80 + ((n * 7 + rounds * 13) % 20) as u32) / 100;
                    tokio::time::sleep(pause).await;
                }
                Ok::<_, String>((rounds, false))
            }));
        }
        let (mut rounds, mut closed) = (0, 0);
        for t in tasks {
            let (r, c) = t
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("{timer:?}: {e}"));
            rounds += r;
            closed += c as u32;
        }
        let seen = stats.idle_timeouts.summary();
        assert_eq!(
            seen.early, 0,
            "{timer:?}: idle timeouts early by the proxy's clock: {seen:?}"
        );
        eprintln!("{timer:?}: {rounds} requests at the edge; {closed} of 40 closed (late gaps)");
    }
    assert_no_panic();
}

// ---------------------------------------------------------------------------------------
// Upstream misbehaviour.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_or_truncated_upstream_responses() {
    watch_for_panics();
    let garbage = raw_upstream(b"SMTP ready\r\n\r\n", After::Close).await;
    let head_cut = raw_upstream(b"HTTP/1.1 200 OK\r\nContent-Len", After::Close).await;
    let body_cut = raw_upstream(
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc",
        After::Close,
    )
    .await;
    let bad_chunk = raw_upstream(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        After::Close,
    )
    .await;
    let switching = raw_upstream(
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
        After::Hold,
    )
    .await;
    for timer in TIMERS {
        for (up, what) in [(garbage, "garbage"), (head_cut, "head cut")] {
            let proxy = proxy(cfg(up, timer, |_| {})).await;
            let mut s = TcpStream::connect(proxy).await.unwrap();
            let (got, closed) = write_then_read(
                &mut s,
                b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
                Instant::now(),
                LONG,
            )
            .await;
            assert!(
                got.starts_with("HTTP/1.1 502 "),
                "{timer:?} {what}: {got:?}"
            );
            assert!(closed.is_some(), "{timer:?} {what}: never closed");
        }
        for (up, what) in [(body_cut, "body cut"), (bad_chunk, "bad chunk")] {
            let proxy = proxy(cfg(up, timer, |_| {})).await;
            let mut s = TcpStream::connect(proxy).await.unwrap();
            let (got, closed) = write_then_read(
                &mut s,
                b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
                Instant::now(),
                LONG,
            )
            .await;
            // Head already sent: the only honest signal is closing the connection.
            assert!(closed.is_some(), "{timer:?} {what}: never closed: {got:?}");
            eprintln!("{timer:?} {what}: {got:?}");
            assert_still_serves(healthy(timer).await).await;
        }
        let proxy = proxy(cfg(switching, timer, |_| {})).await;
        let mut s = TcpStream::connect(proxy).await.unwrap();
        let (got, closed) = write_then_read(
            &mut s,
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
            Instant::now(),
            Duration::from_secs(3),
        )
        .await;
        eprintln!("{timer:?} upstream 101: got {got:?}, closed {closed:?}");
    }
    assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_answering_just_after_deadline_is_504_never_early() {
    watch_for_panics();
    let up = backend(Duration::ZERO).await;
    let deadline = Duration::from_millis(300);
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |c| c.request_timeout = deadline)).await;
        let mut c = client(proxy).await;
        for path in ["/?delay_ms=300", "/?delay_ms=100"] {
            let t = Instant::now();
            let (status, _) = get(&mut c, path).await.unwrap();
            let took = t.elapsed();
            if status == 504 {
                assert!(took >= deadline, "{timer:?} {path}: 504 after {took:?}");
            } else {
                assert_eq!(status, 200, "{timer:?} {path}");
            }
            eprintln!("{timer:?} {path}: {status} after {took:?}");
        }
    }
    assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_closing_after_each_response_is_never_a_502() {
    // The upstream answers without `Connection: close`, then closes: the proxy's kept
    // connection is dead by the next request. `ready()` is meant to catch that.
    watch_for_panics();
    let up = raw_upstream(
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n",
        After::Close,
    )
    .await;
    let mut faults = Vec::new();
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |_| {})).await;
        let mut c = client(proxy).await;
        let mut bad = 0;
        for i in 0..200 {
            if i % 2 == 1 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            match get(&mut c, "/").await {
                Ok((s, _)) if s == 200 => {}
                other => {
                    bad += 1;
                    if bad == 1 {
                        eprintln!("{timer:?}: request {i}: {other:?}");
                    }
                    if other.is_err() {
                        c = client(proxy).await;
                    }
                }
            }
        }
        if bad > 0 {
            faults.push(format!("{timer:?}: {bad} of 200 not 200"));
        }
    }
    assert_no_panic();
    assert!(faults.is_empty(), "{faults:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_connection_closed_under_the_next_request_is_retried_for_a_get_only() {
    // Every kept connection dies under the request after its first: a GET (no body,
    // idempotent) is sent again on a new connection and answered; a POST is not, and is a
    // 502, since the backend may have acted on it.
    watch_for_panics();
    let up = raw_upstream(
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n",
        After::CloseOnNextRequest,
    )
    .await;
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |_| {})).await;
        twenty_gets_are_answered(proxy, timer).await;
        let mut s = TcpStream::connect(proxy).await.unwrap();
        let two_posts = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n\
            POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        let (got, _) = write_then_read(&mut s, two_posts, Instant::now(), LONG).await;
        assert_eq!(statuses(&got), ["200", "502"], "{timer:?}: {got:?}");
    }
    assert_no_panic();
}

/// Found by a full test run: `upstream_closing_after_each_response_is_never_a_502` saw a
/// 502 about once in a thousand requests on a loaded machine (with either timer), when
/// the backend's close of the kept connection reached the proxy as a reset rather than as
/// the end of the stream. Here every kept connection is reset under the request after its
/// first: a GET is sent again on a new connection and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_connection_reset_under_the_next_request_is_retried_for_a_get() {
    watch_for_panics();
    let up = raw_upstream(
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n",
        After::ResetOnNextRequest,
    )
    .await;
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |_| {})).await;
        twenty_gets_are_answered(proxy, timer).await;
    }
    assert_no_panic();
}

/// Twenty GETs on one client connection to `proxy`, each answered with a 200.
async fn twenty_gets_are_answered(proxy: SocketAddr, timer: TimerKind) {
    let mut c = client(proxy).await;
    for i in 0..20 {
        let got = get(&mut c, "/").await;
        assert!(
            matches!(got, Ok((status, _)) if status == 200),
            "{timer:?}: GET {i}: {got:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_body_slower_than_idle_timeout_is_closed_never_early() {
    watch_for_panics();
    let up = raw_upstream_reading_body().await;
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |c| c.idle_timeout = IDLE)).await;
        let mut s = TcpStream::connect(proxy).await.unwrap();
        s.write_all(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 8\r\n\r\nx")
            .await
            .unwrap();
        let t = Instant::now();
        let (got, closed) = write_then_read(&mut s, b"", t, LONG).await;
        let closed = closed.unwrap_or_else(|| panic!("{timer:?}: never closed"));
        assert!(closed >= IDLE, "{timer:?}: closed after {closed:?}");
        eprintln!("{timer:?}: stalled body: got {got:?} after {closed:?}");
    }
    assert_no_panic();
}

/// Found by this review: an unasked-for 101 was forwarded without its `Upgrade` header.
/// It is now a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_101_is_a_502_not_forwarded() {
    watch_for_panics();
    let up = raw_upstream(
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
        After::Hold,
    )
    .await;
    let mut faults = Vec::new();
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |_| {})).await;
        let mut s = TcpStream::connect(proxy).await.unwrap();
        let req =
            b"GET /chat HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n";
        let (got, _) = write_then_read(&mut s, req, Instant::now(), Duration::from_secs(3)).await;
        if !got.starts_with("HTTP/1.1 502 ") {
            faults.push(format!("{timer:?}: {got:?}"));
        }
    }
    assert_no_panic();
    assert!(faults.is_empty(), "{faults:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_early_hints_then_200() {
    watch_for_panics();
    let up = raw_upstream(
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n",
        After::Hold,
    )
    .await;
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |_| {})).await;
        let mut c = client(proxy).await;
        let (status, body) = get(&mut c, "/").await.unwrap();
        assert_eq!(
            (status.as_u16(), &body[..]),
            (200, &b"ok\n"[..]),
            "{timer:?}"
        );
    }
    assert_no_panic();
}

// ---------------------------------------------------------------------------------------
// Bad and odd client input.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_requests_get_exact_statuses() {
    watch_for_panics();
    let up = backend(Duration::ZERO).await;
    let huge = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let huge: &'static str = Box::leak(huge.into_boxed_str());
    let many = format!(
        "GET / HTTP/1.1\r\nHost: a\r\n{}\r\n",
        "X-A: b\r\n".repeat(150)
    );
    let many: &'static str = Box::leak(many.into_boxed_str());
    let cases: [(&[u8], &[&str]); 13] = [
        (many.as_bytes(), &["431", "400"]),
        (b"GET / HTTP/1.1\r\nHost: a\r\nConnection: host, content-length, close\r\n\r\n", &["200"]),
        (b"G@T / HTTP/1.1\r\nHost: a\r\n\r\n", &["400"]),
        (b"GET /\x7f HTTP/1.1\r\nHost: a\r\n\r\n", &["400"]),
        (b"GET http://evil.example/x?y HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", &["200"]),
        (b"GET / HTTP/1.0\r\n\r\n", &["200"]),
        (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", &["505", "400"]),
        (huge.as_bytes(), &["431", "400"]),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", &["200", "400", "502"]),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nffffffffffffffffff\r\nabc\r\n", &["200", "400", "502"]),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc", &["400"]),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n", &["200", "400"]),
        (b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close, upgrade\r\nUpgrade: websocket\r\n\r\n", &["200"]),
    ];
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |_| {})).await;
        for (req, want) in cases {
            let mut s = TcpStream::connect(proxy).await.unwrap();
            let (got, closed) = write_then_read(&mut s, req, Instant::now(), LONG).await;
            let first = statuses(&got).first().copied().unwrap_or("none");
            eprintln!(
                "{timer:?}: {:?} -> {first}",
                String::from_utf8_lossy(&req[..req.len().min(60)])
            );
            assert!(
                want.contains(&first),
                "{timer:?}: {:?}: got {first} ({:?}), closed {closed:?}",
                String::from_utf8_lossy(&req[..req.len().min(80)]),
                &got[..got.len().min(200)]
            );
            assert!(
                closed.is_some(),
                "{timer:?}: left open: {:?}",
                String::from_utf8_lossy(&req[..req.len().min(80)])
            );
        }
        assert_still_serves(proxy).await;
    }
    assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_expect_and_connection_close() {
    watch_for_panics();
    let up = backend(Duration::ZERO).await;
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |_| {})).await;
        // Three pipelined requests, the last with Connection: close: three 200s, then close.
        let mut s = TcpStream::connect(proxy).await.unwrap();
        let three = b"GET /?delay_ms=50 HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
        let (got, closed) = write_then_read(&mut s, three, Instant::now(), LONG).await;
        assert_eq!(statuses(&got), ["200", "200", "200"], "{timer:?}: {got:?}");
        assert!(closed.is_some());
        // Expect: 100-continue, body sent only after the 100.
        let mut s = TcpStream::connect(proxy).await.unwrap();
        s.write_all(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut b = [0u8; 1024];
        let n = tokio::time::timeout(LONG, s.read(&mut b))
            .await
            .expect("no interim or final response")
            .unwrap();
        let first = String::from_utf8_lossy(&b[..n]).into_owned();
        eprintln!("{timer:?}: expect-continue first bytes: {first:?}");
        let (rest, _) = write_then_read(&mut s, b"abcd", Instant::now(), LONG).await;
        let all = first + &rest;
        assert!(all.contains("HTTP/1.1 200 "), "{timer:?}: {all:?}");
    }
    assert_no_panic();
}

/// Found by this review: a malformed chunked request body was blamed on the upstream (a
/// 502). A user error in the upstream call is the request body failing: a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_chunked_request_body_is_a_400() {
    watch_for_panics();
    // An upstream that reads the whole body before answering, so the bad chunk is met
    // while the request is being forwarded.
    let up = raw_upstream_reading_chunked().await;
    let mut faults = Vec::new();
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |_| {})).await;
        for body in [
            &b"zz\r\nabc\r\n0\r\n\r\n"[..],
            b"ffffffffffffffffff\r\nabc\r\n",
        ] {
            let mut s = TcpStream::connect(proxy).await.unwrap();
            let mut req =
                b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            req.extend_from_slice(body);
            let (got, closed) = write_then_read(&mut s, &req, Instant::now(), LONG).await;
            assert!(closed.is_some(), "{timer:?}: left open");
            let first = statuses(&got).first().copied().unwrap_or("none");
            if first != "400" {
                faults.push(format!(
                    "{timer:?} {:?}: {first}",
                    String::from_utf8_lossy(&body[..6])
                ));
            }
        }
    }
    assert_no_panic();
    assert!(faults.is_empty(), "{faults:?}");
}

/// An upstream that reads until a chunked body's last chunk (or EOF), then answers 200.
async fn raw_upstream_reading_chunked() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut b = [0u8; 4096];
                while !buf.windows(5).any(|w| w == b"0\r\n\r\n") {
                    match s.read(&mut b).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&b[..n]),
                    }
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
                    .await;
            });
        }
    });
    addr
}

// ---------------------------------------------------------------------------------------
// Connection storms.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_half_closes_and_a_connect_storm() {
    watch_for_panics();
    let up = backend(Duration::from_millis(20)).await;
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |c| c.idle_timeout = Duration::from_secs(2))).await;
        // 300 connections reset (linger 0) at every stage of a request.
        let mut tasks = Vec::new();
        for i in 0..300usize {
            tasks.push(tokio::spawn(async move {
                let socket = TcpSocket::new_v4().unwrap();
                let mut s = socket.connect(proxy).await.unwrap();
                let req: &[u8] = match i % 3 {
                    0 => b"",
                    1 => b"GET / HTTP/1.1\r\nHo",
                    _ => b"GET /?body_bytes=1000000 HTTP/1.1\r\nHost: a\r\n\r\n",
                };
                let _ = s.write_all(req).await;
                tokio::time::sleep(Duration::from_millis((i % 7) as u64 * 10)).await;
                #[allow(deprecated)]
                let _ = s.set_linger(Some(Duration::ZERO));
                drop(s);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // A half-closed client (FIN after a whole request): observe what it gets.
        let mut s = TcpStream::connect(proxy).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        s.shutdown().await.unwrap();
        let (got, closed) = write_then_read(&mut s, b"", Instant::now(), LONG).await;
        eprintln!(
            "{timer:?}: half-closed client got {:?}, closed {closed:?}",
            &got[..got.len().min(40)]
        );
        assert!(closed.is_some());
        // 1000 connects at once, each one GET: all 200.
        let mut tasks = Vec::new();
        for _ in 0..1000 {
            tasks.push(tokio::spawn(async move {
                let mut s = TcpStream::connect(proxy).await.map_err(|e| e.to_string())?;
                let (got, _) = write_then_read(
                    &mut s,
                    b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
                    Instant::now(),
                    Duration::from_secs(15),
                )
                .await;
                Ok::<_, String>(got.starts_with("HTTP/1.1 200 "))
            }));
        }
        let mut ok = 0;
        let mut errors = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(true) => ok += 1,
                Ok(false) => errors.push("not 200".to_string()),
                Err(e) => errors.push(e),
            }
        }
        assert_eq!(ok, 1000, "{timer:?}: {:?}", &errors[..errors.len().min(5)]);
        assert_still_serves(proxy).await;
    }
    assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_partial_second_head_is_closed_at_header_timeout() {
    // A whole request, then half of a second head, then nothing: the first is answered,
    // the second's head is timed by the header timeout (0.5 s), never closed before it.
    watch_for_panics();
    let header = Duration::from_millis(500);
    let up = backend(Duration::ZERO).await;
    for timer in TIMERS {
        let proxy = proxy(cfg(up, timer, |c| c.header_read_timeout = header)).await;
        let mut s = TcpStream::connect(proxy).await.unwrap();
        let t = Instant::now();
        let (got, closed) = write_then_read(
            &mut s,
            b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHo",
            t,
            LONG,
        )
        .await;
        assert_eq!(
            statuses(&got).first().copied(),
            Some("200"),
            "{timer:?}: {got:?}"
        );
        let closed = closed.unwrap_or_else(|| panic!("{timer:?}: never closed"));
        assert!(closed >= header, "{timer:?}: closed after {closed:?}");
        eprintln!(
            "{timer:?}: partial second head closed after {closed:?}: {:?}",
            statuses(&got)
        );
    }
    assert_no_panic();
}
