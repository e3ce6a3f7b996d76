//! A keep-alive HTTP/1.1 client connection, for the tests and the load generator that
//! drive the proxy. Not part of the proxy; it uses no timer.

use std::io;
use std::net::SocketAddr;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Why a client request failed.
#[derive(Debug)]
pub enum ClientError {
    /// No connection could be made.
    Connect(io::Error),
    /// The connection failed or closed before the whole response came.
    Http(hyper::Error),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Connect(e) => write!(f, "connect failed: {e}"),
            ClientError::Http(e) => write!(f, "request failed: {e}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// One keep-alive connection; its I/O runs in a task of its own, which ends with it.
pub struct Client {
    sender: SendRequest<Empty<Bytes>>,
}

impl Client {
    /// Connects to `addr`; must run in a tokio runtime with I/O enabled.
    pub async fn connect(addr: SocketAddr) -> Result<Self, ClientError> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(ClientError::Connect)?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(ClientError::Http)?;
        tokio::spawn(connection);
        Ok(Self { sender })
    }

    /// Waits until the connection can take a request: after it is made, and after the
    /// previous response. Fails if it has closed.
    pub async fn ready(&mut self) -> Result<(), ClientError> {
        self.sender.ready().await.map_err(ClientError::Http)
    }

    /// GETs `path` (a literal such as `/?delay_ms=100`; one that is not a valid path is
    /// the caller's bug and panics): the status and the whole body.
    pub async fn get(&mut self, path: &'static str) -> Result<(StatusCode, Bytes), ClientError> {
        self.ready().await?;
        let mut request = Request::new(Empty::new());
        *request.uri_mut() = hyper::Uri::from_static(path);
        request.headers_mut().insert(
            hyper::header::HOST,
            hyper::header::HeaderValue::from_static("proxy"),
        );
        let response = self
            .sender
            .send_request(request)
            .await
            .map_err(ClientError::Http)?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(ClientError::Http)?
            .to_bytes();
        Ok((status, body))
    }
}
