//! `timeout()` wrapped around I/O, the way a proxy on tokio arms a request timeout: tokio's
//! `time::timeout`, and pingora-timeout's `timeout` (what Cloudflare's proxy uses). Each
//! wraps a read whose response has not arrived. Polling the wrapper once polls the read,
//! which is pending, and that arms the timer (pingora arms it only then, lazily); dropping
//! the wrapper cancels it.
//!
//! pingora-timeout rounds every deadline up to its 10 ms tick and shares one timer between
//! the timeouts due in the same tick, so it does less work per timeout than a timer that
//! keeps each deadline to the millisecond; the harness drives it as its users do anyway.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// A read whose response has not arrived: pending on every poll, and never woken.
#[derive(Debug, Default, Clone, Copy)]
pub struct PendingRead;

impl Future for PendingRead {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        Poll::Pending
    }
}

/// tokio's `timeout` around a pending read.
pub fn tokio_timeout(delay: Duration) -> tokio::time::Timeout<PendingRead> {
    tokio::time::timeout(delay, PendingRead)
}

/// pingora-timeout's `timeout` around a pending read.
pub fn pingora_timeout(
    delay: Duration,
) -> pingora_timeout::Timeout<PendingRead, pingora_timeout::fast_timeout::FastOrTokioTimeout> {
    pingora_timeout::timeout(delay, PendingRead)
}

#[cfg(test)]
mod tests {
    use super::{PendingRead, pingora_timeout, tokio_timeout};
    use crate::peers::tokio_sleep::{register, runtime, with_context};
    use std::time::Duration;

    /// A polled timeout around a pending read is armed by its first poll and elapses with
    /// an error, and the read itself never completes.
    #[test]
    fn both_timeouts_arm_on_their_first_poll_and_elapse() {
        let rt = runtime(1).expect("a runtime");
        rt.block_on(async {
            let delay = Duration::from_millis(250);
            let (mut tokio, mut pingora) = (Box::pin(tokio_timeout(delay)), Box::pin(pingora_timeout(delay)));
            let mut read = Box::pin(PendingRead);
            let done = with_context(|cx| {
                [register(tokio.as_mut(), cx), register(pingora.as_mut(), cx), register(read.as_mut(), cx)]
            })
            .await;
            assert_eq!(done, [false; 3]);
            assert!(tokio.await.is_err() && pingora.await.is_err(), "both elapsed");
        });
    }
}
