//! Bad input gets what a proxy should give, on each timer back-end, and the proxy keeps
//! serving its other connections: a malformed request is a 400, a dead upstream a 502, an
//! upstream that accepts but never answers a 504 at the request deadline, an upstream that
//! never accepts a 504 at the connect timeout, and a client that stalls mid-request is
//! closed at the header timeout, never before it.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use corewheel_proxy::TimerKind;
use hyper::StatusCode;
use tokio::net::{TcpListener, TcpSocket, TcpStream};

const TIMEOUT: Duration = Duration::from_millis(300);

/// A port on which nothing listens: bound, then closed.
async fn dead_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// A request through `proxy` is answered 504, no sooner than [`TIMEOUT`] after it was sent.
async fn assert_504_at_timeout(proxy: SocketAddr, timer: TimerKind, what: &'static str) {
    let mut sender = client(proxy).await;
    sender.ready().await.unwrap();
    let sent = Instant::now();
    let (status, _) = get(&mut sender, "/").await.unwrap();
    let took = sent.elapsed();
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{timer:?}: {what}");
    assert!(
        took >= TIMEOUT,
        "{timer:?}: {what}: 504 after {took:?}, before {TIMEOUT:?}"
    );
    eprintln!("{timer:?}: {what} {TIMEOUT:?}: 504 after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_request_is_a_400() {
    let upstream = backend(Duration::ZERO).await;
    on_each_timer(
        upstream,
        |_| {},
        |proxy, timer| async move {
            for garbage in [
                &b"\x00\x01\x02 garbage\r\n\r\n"[..],
                b"GET / HTTP/1.1\r\nHost: a\r\nbad header line\r\n\r\n",
                b"GET / HTTP/1.1\r\nContent-Length: lots\r\n\r\n",
            ] {
                let mut stream = TcpStream::connect(proxy).await.unwrap();
                let (reply, _) = send_and_read_to_close(&mut stream, garbage, Instant::now())
                    .await
                    .unwrap();
                assert!(
                    reply.starts_with("HTTP/1.1 400 "),
                    "{timer:?}: {garbage:?} got {reply:?}"
                );
            }
            // The same proxy still serves well-formed requests.
            assert_still_serves(proxy).await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_upstream_is_a_502() {
    let upstream = dead_port().await;
    on_each_timer(
        upstream,
        |_| {},
        |proxy, timer| async move {
            let mut sender = client(proxy).await;
            for _ in 0..3 {
                let (status, _) = get(&mut sender, "/").await.unwrap();
                assert_eq!(status, StatusCode::BAD_GATEWAY, "{timer:?}");
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_never_answers_is_a_504_at_the_deadline() {
    // Accepts, reads nothing, answers nothing; keeps every connection open.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    on_each_timer(
        upstream,
        |config| config.request_timeout = TIMEOUT,
        |proxy, timer| assert_504_at_timeout(proxy, timer, "silent upstream, deadline"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_never_accepts_is_a_504_at_the_connect_timeout() {
    // A listener with a backlog of one that never accepts: once its queue is full, the
    // kernel drops further SYNs and a connect to it hangs, as to an unreachable host.
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let full = socket.listen(1).unwrap();
    let upstream = full.local_addr().unwrap();
    let mut fillers = Vec::new();
    while fillers.len() < 8 {
        match tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(upstream)).await {
            Ok(Ok(stream)) => fillers.push(stream),
            _ => break,
        }
    }
    on_each_timer(
        upstream,
        |config| config.connect_timeout = TIMEOUT,
        |proxy, timer| {
            assert_504_at_timeout(proxy, timer, "upstream never accepts, connect timeout")
        },
    )
    .await;
    drop((full, fillers));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stalled_mid_request_is_closed_at_the_header_timeout() {
    let upstream = backend(Duration::ZERO).await;
    on_each_timer(
        upstream,
        |config| config.header_read_timeout = TIMEOUT,
        |proxy, timer| async move {
            // Before the connect, which the proxy may accept before this task sees it made.
            let connecting = Instant::now();
            let mut stream = TcpStream::connect(proxy).await.unwrap();
            let (reply, closed) =
                send_and_read_to_close(&mut stream, b"GET / HTTP/1.1\r\nHost: a\r\n", connecting)
                    .await
                    .unwrap();
            assert!(
                closed >= TIMEOUT,
                "{timer:?}: closed after {closed:?}, before {TIMEOUT:?}"
            );
            // hyper may answer 408 before it closes; it must not answer anything else.
            assert!(
                reply.is_empty() || reply.starts_with("HTTP/1.1 408 "),
                "{timer:?}: {reply:?}"
            );
            eprintln!(
                "{timer:?}: stalled head, header timeout {TIMEOUT:?}: closed after {closed:?}"
            );
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_closed_at_the_idle_timeout() {
    // A client asks for a body far larger than the socket buffers and reads none of it:
    // the proxy's writes stall, and the idle timeout must end the connection. Read after
    // a pause much longer than the timeout, the body then ends early (the proxy closed
    // mid-body); had the proxy kept the connection, the whole body would come.
    const BODY_BYTES: usize = 32 << 20;
    let upstream = backend(Duration::ZERO).await;
    on_each_timer(
        upstream,
        |config| config.idle_timeout = TIMEOUT,
        |proxy, timer| async move {
            use tokio::io::AsyncWriteExt;
            // A small receive buffer, so that little of the body fits in it.
            let socket = TcpSocket::new_v4().unwrap();
            socket.set_recv_buffer_size(4096).unwrap();
            let mut stream = socket.connect(proxy).await.unwrap();
            stream
                .write_all(format!("GET /?body_bytes={BODY_BYTES} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
                .await
                .unwrap();
            tokio::time::sleep(10 * TIMEOUT).await;
            let (received, _) = send_and_read_to_close(&mut stream, b"", Instant::now())
                .await
                .unwrap();
            assert!(
                received.starts_with("HTTP/1.1 200 ") && received.len() < BODY_BYTES,
                "{timer:?}: {} bytes received: the proxy did not close the stalled client",
                received.len()
            );
            eprintln!(
                "{timer:?}: client stopped reading, idle timeout {TIMEOUT:?}: closed after {} of {BODY_BYTES} body bytes",
                received.len()
            );
        },
    )
    .await;
}
