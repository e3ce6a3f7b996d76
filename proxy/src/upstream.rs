//! The upstream side of one client connection: a keep-alive HTTP/1.1 connection to the
//! backend, opened on the first request (within the connect timeout) and reused by the
//! requests after it.
//!
//! A client's HTTP/1.1 connection carries one request at a time, so one upstream
//! connection per client connection is all it ever needs, with no pool and no pool timer
//! (hyper-util's pool would run its own expiry timer, outside the timer under test). The
//! price is one upstream socket per client connection.
//!
//! A backend may close a kept connection just as the next request goes out on it, before
//! the proxy has seen the close: the request then fails with no response (the end of the
//! stream, or a reset when the request reached the closed socket first). A request with
//! no body and an idempotent method is sent again once, on a new connection, as HTTP
//! allows; anything else gets the failure.

use std::io;
use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use http_body_util::{Either, Empty};
use hyper::body::{Body, Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::timer::ProxyTimer;

/// Why an upstream call failed.
#[derive(Debug)]
pub enum UpstreamError {
    /// The connect timeout passed before the backend accepted.
    ConnectTimedOut,
    /// The backend refused the connection, or the network failed.
    Connect(io::Error),
    /// The connection was made but HTTP failed on it: a broken handshake, a reset, a
    /// response that is not HTTP.
    Http(hyper::Error),
}

/// The task that drives an upstream connection's I/O; aborting it closes the connection.
struct Driver(JoinHandle<()>);

impl Drop for Driver {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A request's body upstream: the client's, or none for a request sent again.
type UpstreamBody = Either<Incoming, Empty<Bytes>>;

struct Connection {
    sender: SendRequest<UpstreamBody>,
    _driver: Driver,
}

/// The upstream connection of one client connection.
pub struct Upstream<T> {
    addr: SocketAddr,
    timer: T,
    connect_timeout: Duration,
    /// The idle connection between requests; taken out while a request uses it, so that a
    /// request abandoned at its deadline takes its connection (and whatever the backend
    /// may still send on it) down with it.
    idle: Mutex<Option<Connection>>,
}

impl<T: ProxyTimer> Upstream<T> {
    /// No connection is opened until the first request.
    pub fn new(addr: SocketAddr, timer: T, connect_timeout: Duration) -> Self {
        Self {
            addr,
            timer,
            connect_timeout,
            idle: Mutex::new(None),
        }
    }

    /// Sends `request` upstream and waits for the response head.
    pub async fn send(
        &self,
        request: Request<Incoming>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let kept = match self.take_idle() {
            // `ready` fails when the backend has closed the kept-alive connection; nothing
            // was sent on it, so a new one is safe.
            Some(mut kept) => kept.sender.ready().await.is_ok().then_some(kept),
            None => None,
        };
        let Some(kept) = kept else {
            let connection = self.connect().await?;
            return self.send_on(connection, request.map(Either::Left)).await;
        };
        let again = replayable(&request);
        match self.send_on(kept, request.map(Either::Left)).await {
            Err(UpstreamError::Http(error)) if closed_unanswered(&error) => match again {
                Some(request) => {
                    let connection = self.connect().await?;
                    self.send_on(connection, request).await
                }
                None => Err(UpstreamError::Http(error)),
            },
            sent => sent,
        }
    }

    /// Sends `request` on `connection`, which is kept for the next request if it answers.
    async fn send_on(
        &self,
        mut connection: Connection,
        request: Request<UpstreamBody>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let response = connection
            .sender
            .send_request(request)
            .await
            .map_err(UpstreamError::Http)?;
        *self.idle.lock().unwrap_or_else(PoisonError::into_inner) = Some(connection);
        Ok(response)
    }

    fn take_idle(&self) -> Option<Connection> {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    async fn connect(&self) -> Result<Connection, UpstreamError> {
        let stream = self
            .timer
            .timeout(self.connect_timeout, TcpStream::connect(self.addr))
            .await
            .map_err(|_| UpstreamError::ConnectTimedOut)?
            .map_err(UpstreamError::Connect)?;
        // Small requests and responses: waiting to coalesce them only adds latency.
        let _ = stream.set_nodelay(true);
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(UpstreamError::Http)?;
        let driver = Driver(tokio::spawn(async move {
            // Its errors reach the request that was using the connection, through `sender`.
            let _ = connection.await;
        }));
        Ok(Connection {
            sender,
            _driver: driver,
        })
    }
}

/// A copy of `request` to send again if its kept connection closes before answering: only
/// for an idempotent method with no body, which a backend may receive twice.
fn replayable(request: &Request<Incoming>) -> Option<Request<UpstreamBody>> {
    let idempotent = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    );
    if !idempotent || !request.body().is_end_stream() {
        return None;
    }
    let mut again = Request::new(Either::Right(Empty::new()));
    *again.method_mut() = request.method().clone();
    *again.uri_mut() = request.uri().clone();
    *again.version_mut() = request.version();
    *again.headers_mut() = request.headers().clone();
    Some(again)
}

/// Whether a request failed because its connection closed before any response came back:
/// the end of the stream, or a reset, which is how the backend's close arrives when the
/// request crossed it on the wire (its kernel answers data for a closed socket with one).
/// `send_request` waits for a response's head only, so no response reached the client;
/// the backend may have seen the request, which is why only idempotent ones go again.
fn closed_unanswered(error: &hyper::Error) -> bool {
    error.is_incomplete_message() || error.is_canceled() || error.is_closed() || reset(error)
}

/// Whether `error` comes from the connection being reset or broken under it.
fn reset(error: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<io::Error>() {
            return matches!(
                io.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionAborted
            );
        }
        source = cause.source();
    }
    false
}
