//! The proxy's timers keep their word, on each back-end: idle connections close at the idle
//! timeout and never before it, connections that keep talking are never closed, and a
//! request slower than the deadline gets its 504 at the deadline and never before it.
//!
//! "Never early" is exact: each start instant is taken on the client before the proxy
//! could start the timer (before the client begins to connect; before it sends the
//! request). Lateness is printed, not asserted.

mod common;

use std::time::{Duration, Instant};

use common::*;
use hyper::StatusCode;
use tokio::net::TcpStream;

const IDLE: Duration = Duration::from_millis(300);
const IDLE_CONNECTIONS: usize = 200;
const DEADLINE: Duration = Duration::from_millis(300);
const SLOW_REQUESTS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_close_at_the_idle_timeout_never_before() {
    let upstream = backend(Duration::ZERO).await;
    on_each_timer(
        upstream,
        |config| config.idle_timeout = IDLE,
        |proxy, timer| async move {
            let waiting: Vec<_> = (0..IDLE_CONNECTIONS)
                .map(|_| {
                    tokio::spawn(async move {
                        // Before the connect: the client's task may see the connection made
                        // well after the proxy accepted it and started the idle timeout.
                        let connecting = Instant::now();
                        let mut stream = TcpStream::connect(proxy).await.unwrap();
                        send_and_read_to_close(&mut stream, b"", connecting).await
                    })
                })
                .collect();
            let mut open_for = Vec::new();
            for connection in waiting {
                let (sent, closed) = connection.await.unwrap().unwrap();
                assert_eq!(sent, "", "{timer:?}: an idle connection was sent something");
                assert!(
                    closed >= IDLE,
                    "{timer:?}: closed {closed:?} after the connect began, before the {IDLE:?} idle timeout"
                );
                open_for.push(closed - IDLE);
            }
            eprintln!(
                "{timer:?}: {IDLE_CONNECTIONS} idle connections, idle timeout {IDLE:?}: closed late by {}",
                summary(&mut open_for)
            );
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talking_connections_are_never_closed() {
    let upstream = backend(Duration::ZERO).await;
    on_each_timer(
        upstream,
        |config| config.idle_timeout = IDLE,
        |proxy, timer| async move {
            // A request every quarter of the idle timeout, for three idle timeouts: each one
            // moves the deadline before it comes.
            let talkers: Vec<_> = (0..20)
                .map(|_| {
                    tokio::spawn(async move {
                        let mut sender = client(proxy).await;
                        let started = Instant::now();
                        let mut requests = 0;
                        while started.elapsed() < 3 * IDLE {
                            let (status, _) = get(&mut sender, "/").await?;
                            if status != StatusCode::OK {
                                return Err(format!("status {status}"));
                            }
                            requests += 1;
                            tokio::time::sleep(IDLE / 4).await;
                        }
                        Ok::<_, String>(requests)
                    })
                })
                .collect();
            let mut total = 0;
            for talker in talkers {
                total += talker
                    .await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{timer:?}: a talking connection failed: {e}"));
            }
            eprintln!("{timer:?}: 20 talking connections, {total} requests, none closed");
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_requests_get_504_at_the_deadline_never_before() {
    let upstream = backend(Duration::ZERO).await;
    on_each_timer(
        upstream,
        |config| config.request_timeout = DEADLINE,
        |proxy, timer| async move {
            let slow: Vec<_> = (0..SLOW_REQUESTS)
                .map(|_| {
                    tokio::spawn(async move {
                        let mut sender = client(proxy).await;
                        sender.ready().await.unwrap();
                        let sent = Instant::now();
                        let answer = get(&mut sender, "/?delay_ms=10000").await;
                        let took = sent.elapsed();
                        // The connection outlives its 504: a fast request on it still works.
                        let after = get(&mut sender, "/").await;
                        (answer, took, after)
                    })
                })
                .collect();
            let mut late = Vec::new();
            for request in slow {
                let (answer, took, after) = request.await.unwrap();
                let (status, _) = answer.unwrap();
                assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{timer:?}");
                assert!(
                    took >= DEADLINE,
                    "{timer:?}: 504 after {took:?}, before the {DEADLINE:?} deadline"
                );
                assert!(took < BOUND, "{timer:?}: 504 only after {took:?}");
                assert_eq!(after.unwrap().0, StatusCode::OK, "{timer:?}");
                late.push(took - DEADLINE);
            }
            eprintln!(
                "{timer:?}: {SLOW_REQUESTS} requests slower than the {DEADLINE:?} deadline: 504 late by {}",
                summary(&mut late)
            );
        },
    )
    .await;
}
