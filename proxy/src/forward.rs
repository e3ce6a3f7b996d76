//! One proxied request: rewritten for the backend, sent under the request deadline, and
//! answered with the backend's response or with the status that says why there is none.

use std::convert::Infallible;
use std::time::Duration;

use http_body_util::{Either, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderName};
use hyper::{Request, Response, StatusCode, Uri};

use crate::stats::Stats;
use crate::timer::ProxyTimer;
use crate::upstream::{Upstream, UpstreamError};

/// A response body: the backend's, streamed through, or the proxy's own short one.
pub type ProxyBody = Either<Incoming, Full<Bytes>>;

/// Headers that describe one hop's connection, not the message: never forwarded (RFC 9110
/// section 7.6.1), in either direction.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

/// Forwards `request` through `upstream`; the whole upstream call (connect, send, response
/// head) has `deadline`, and a deadline that passes is recorded in `stats.deadlines`.
/// Never fails: every failure is a response.
pub async fn forward<T: ProxyTimer>(
    upstream: &Upstream<T>,
    timer: &T,
    deadline: Duration,
    stats: &Stats,
    mut request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let origin_form = request
        .uri()
        .path_and_query()
        .map_or_else(|| Uri::from_static("/"), |path| Uri::from(path.clone()));
    *request.uri_mut() = origin_form;
    strip_hop_by_hop(request.headers_mut());
    // Read before the timeout reads its own clock, so that `due` is at or before the
    // timeout's deadline: a lateness recorded against it can only be too large, and an
    // early one is a real early fire.
    let due = timer.now() + deadline;
    let response = match timer.timeout(deadline, upstream.send(request)).await {
        // A switch of protocols the proxy never asked for (it strips `Upgrade` from
        // requests) and cannot carry: forwarding the 101 without its `Upgrade` header
        // would break the client's framing.
        Ok(Ok(response)) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
            answer(StatusCode::BAD_GATEWAY, "upstream switched protocols\n")
        }
        Ok(Ok(mut response)) => {
            strip_hop_by_hop(response.headers_mut());
            response.map(Either::Left)
        }
        Err(_) => {
            stats.deadlines.record(due, timer.now());
            answer(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n")
        }
        Ok(Err(UpstreamError::ConnectTimedOut)) => {
            answer(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n")
        }
        // A user error in the upstream call is the request body failing as it was sent:
        // the client's body was malformed (a bad chunk size), not the upstream.
        Ok(Err(UpstreamError::Http(error))) if error.is_user() => {
            answer(StatusCode::BAD_REQUEST, "malformed request body\n")
        }
        Ok(Err(UpstreamError::Connect(_) | UpstreamError::Http(_))) => {
            answer(StatusCode::BAD_GATEWAY, "upstream failed\n")
        }
    };
    Ok(response)
}

/// The proxy's own response.
fn answer(status: StatusCode, text: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::from_static(
        text.as_bytes(),
    ))));
    *response.status_mut() = status;
    response
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // The headers a `Connection` header names are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(&named) {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}
