//! The async timers of the async-* workloads, each made the way its users make it: corewheel's and tokio's `sleep`,
//! `timeout` and reset; async-io's `Timer`, its timeout as smol's documentation writes one (`read.or(timer)`); and
//! pingora-timeout's `sleep` and `timeout`, which has no reset: an idle timeout is pushed back by a new sleep.
//! A timeout wraps [`PendingRead`], never ready nor woken, so that only the timeout's own cost is measured.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// A read whose response has not arrived: a timeout around it is armed by its first poll, cancelled by its drop.
#[derive(Debug, Default, Clone, Copy)]
pub struct PendingRead;

impl Future for PendingRead {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        Poll::Pending
    }
}

/// How an idle timer is pushed back: in place with the timer's own reset, or by replacing it with a new one.
pub enum Reset<F> {
    InPlace(fn(Pin<&mut F>, Instant)),
    Recreate,
}

impl<F> Clone for Reset<F> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<F> Copy for Reset<F> {}

pub fn corewheel_timeout(delay: Duration) -> corewheel::Timeout<'static, PendingRead> {
    corewheel::timeout(delay, PendingRead)
}

pub fn corewheel_reset(sleep: Pin<&mut corewheel::Sleep<'static>>, deadline: Instant) {
    sleep.get_mut().reset(deadline);
}

/// Waits until the default engine has cancelled or fired every timer a run gave it, every node back in its pool.
pub fn settle_corewheel() -> Result<(), String> {
    super::engine::settle(corewheel::default_engine()).map(drop)
}

pub fn tokio_timeout(delay: Duration) -> tokio::time::Timeout<PendingRead> {
    tokio::time::timeout(delay, PendingRead)
}

pub fn tokio_reset(sleep: Pin<&mut tokio::time::Sleep>, deadline: Instant) {
    sleep.reset(deadline.into());
}

pub fn async_io_timeout(delay: Duration) -> impl Future<Output = ()> + Send {
    futures_lite::future::or(PendingRead, async move {
        async_io::Timer::after(delay).await;
    })
}

pub fn async_io_reset(timer: Pin<&mut async_io::Timer>, deadline: Instant) {
    timer.get_mut().set_at(deadline);
}

pub fn pingora_timeout(delay: Duration) -> impl Future + Send {
    pingora_timeout::timeout(delay, PendingRead)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::tokio_sleep::{register, runtime, with_context};

    /// Every subject's sleep and timeout is armed by its first poll (not done at once, 250 ms out) and fires once its
    /// delay has passed; every in-place reset moves a 30 s deadline to 5 ms.
    #[test]
    fn each_timer_arms_on_its_first_poll_fires_and_resets() {
        let rt = runtime(1).expect("a runtime");
        rt.block_on(async {
            let delay = Duration::from_millis(250);
            let (mut cw, mut cw_t) = (
                Box::pin(corewheel::sleep(delay)),
                Box::pin(corewheel_timeout(delay)),
            );
            let (mut tokio, mut tokio_t) = (
                Box::pin(tokio::time::sleep(delay)),
                Box::pin(tokio_timeout(delay)),
            );
            let (mut smol, mut smol_t) = (
                Box::pin(async_io::Timer::after(delay)),
                Box::pin(async_io_timeout(delay)),
            );
            let (mut pg, mut pg_t) = (
                Box::pin(pingora_timeout::sleep(delay)),
                Box::pin(pingora_timeout(delay)),
            );
            let done = with_context(|cx| {
                [
                    register(cw.as_mut(), cx) || register(cw_t.as_mut(), cx),
                    register(tokio.as_mut(), cx) || register(tokio_t.as_mut(), cx),
                    register(smol.as_mut(), cx) || register(smol_t.as_mut(), cx),
                    register(pg.as_mut(), cx) || register(pg_t.as_mut(), cx),
                ]
            });
            assert_eq!(done.await, [false; 4], "none was done at once");
            let long = Duration::from_secs(30);
            let mut cw_r = Box::pin(corewheel::sleep(long));
            let (mut tokio_r, mut smol_r) = (
                Box::pin(tokio::time::sleep(long)),
                Box::pin(async_io::Timer::after(long)),
            );
            with_context(|cx| {
                let _ = [register(cw_r.as_mut(), cx), register(tokio_r.as_mut(), cx)];
                register(smol_r.as_mut(), cx)
            })
            .await;
            let soon = Instant::now() + Duration::from_millis(5);
            corewheel_reset(cw_r.as_mut(), soon);
            tokio_reset(tokio_r.as_mut(), soon);
            async_io_reset(smol_r.as_mut(), soon);
            let all = async {
                let _ = (cw.await, tokio.await, smol.await, pg.await, smol_t.await);
                assert!(cw_t.await.is_err() && tokio_t.await.is_err());
                (cw_r.await, tokio_r.await, smol_r.await, pg_t.await)
            };
            let all = tokio::time::timeout(Duration::from_secs(10), all).await;
            assert!(all.is_ok(), "all fired");
        });
    }
}
