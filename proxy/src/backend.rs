//! A small backend for the tests and the load test: answers every request with `ok` after
//! a delay. It is not part of the proxy, and its delay runs on tokio's timer whichever
//! timer the proxy uses.

use std::convert::Infallible;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// The body of every answer that asks for no other size.
pub const BODY: &[u8] = b"ok\n";

/// The largest body `body_bytes=N` may ask for.
const MAX_BODY: usize = 64 << 20;

/// Serves HTTP/1.1 on `listener` until the task is dropped: each request is answered after
/// `delay`, or after the milliseconds its query's `delay_ms=N` asks for, with [`BODY`], or
/// with the `body_bytes=N` bytes (at most 64 MiB) its query asks for.
pub async fn serve_backend(listener: TcpListener, delay: Duration) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of file descriptors, most likely: wait for some to close.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = service_fn(move |request| answer(request, delay));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(
    request: Request<Incoming>,
    delay: Duration,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let query = request.uri().query();
    let delay = query_number(query, "delay_ms")
        .map(Duration::from_millis)
        .unwrap_or(delay);
    let body = match query_number(query, "body_bytes") {
        Some(bytes) => Bytes::from(vec![b'x'; (bytes as usize).min(MAX_BODY)]),
        None => Bytes::from_static(BODY),
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    Ok(Response::new(Full::new(body)))
}

/// The number `name=N` gives in a query string.
fn query_number(query: Option<&str>, name: &str) -> Option<u64> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::query_number;

    #[test]
    fn numbers_from_the_query() {
        assert_eq!(query_number(None, "delay_ms"), None);
        assert_eq!(query_number(Some("a=1"), "delay_ms"), None);
        assert_eq!(
            query_number(Some("a=1&delay_ms=250"), "delay_ms"),
            Some(250)
        );
        assert_eq!(query_number(Some("delay_mss=250"), "delay_ms"), None);
        assert_eq!(query_number(Some("delay_ms=soon"), "delay_ms"), None);
    }
}
