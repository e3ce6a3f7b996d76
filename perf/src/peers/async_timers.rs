//! The async timers of the async-* workloads, one set of futures per subject, each made the way its users make it:
//!
//! - corewheel-async: `corewheel::sleep`, `corewheel::timeout`, `Sleep::reset`, on the process-wide default engine
//!   (one unpinned worker per CPU, 1 ms tick);
//! - tokio: `tokio::time::sleep`, `tokio::time::timeout`, `Sleep::reset`;
//! - async-io (smol's timer): `Timer::after`, `Timer::set_at`, and for a timeout the way smol's documentation writes
//!   one, `future.or(async { Timer::after(d).await; ... })`;
//! - pingora-timeout: `pingora_timeout::sleep` and `pingora_timeout::timeout` (the crate's `fast_sleep` and
//!   `fast_timeout`: deadlines rounded up to a 10 ms tick, one timer per tick shared by every sleep due in it). A
//!   pingora sleep has no reset: an idle timeout is pushed back by replacing the sleep with a new one.
//!
//! The read that a `timeout()` wraps is [`PendingRead`]: pending on every poll and never woken, so the timeout's own
//! cost is all that is measured, the same for every subject.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

/// A read whose response has not arrived: pending on every poll, and never woken. Polling a `timeout()` around it
/// once polls the read, which arms the timer (pingora arms it only then, lazily); dropping the timeout cancels it, as
/// a proxy's request timeouts go.
#[derive(Debug, Default, Clone, Copy)]
pub struct PendingRead;

impl Future for PendingRead {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        std::task::Poll::Pending
    }
}

/// How an idle timer is pushed back to a new deadline.
pub enum Reset<F> {
    /// In place, with the timer's own reset; it stays registered with its waker.
    InPlace(fn(Pin<&mut F>, Instant)),
    /// By replacing the timer with a new one, which the task then polls to register: for a timer that has no reset.
    Recreate,
}

/// corewheel's `sleep`, on the process-wide default engine.
pub fn corewheel_sleep(delay: Duration) -> corewheel::Sleep<'static> {
    corewheel::sleep(delay)
}

/// corewheel's `timeout()` around a pending read.
pub fn corewheel_timeout_read(delay: Duration) -> corewheel::Timeout<'static, PendingRead> {
    corewheel::timeout(delay, PendingRead)
}

/// corewheel's `Sleep::reset` (a `Sleep` is `Unpin`).
pub fn corewheel_reset(sleep: Pin<&mut corewheel::Sleep<'static>>, deadline: Instant) {
    sleep.get_mut().reset(deadline);
}

/// Waits until the default engine has nothing left of the timers a run gave it: every one cancelled or fired, every
/// node back in its pool.
pub fn settle_corewheel() -> Result<(), String> {
    super::engine::settle(corewheel::default_engine()).map(|_| ())
}

/// tokio's `sleep`.
pub fn tokio_sleep(delay: Duration) -> tokio::time::Sleep {
    tokio::time::sleep(delay)
}

/// tokio's `timeout()` around a pending read.
pub fn tokio_timeout_read(delay: Duration) -> tokio::time::Timeout<PendingRead> {
    tokio::time::timeout(delay, PendingRead)
}

/// `Sleep::reset`.
pub fn tokio_reset(sleep: Pin<&mut tokio::time::Sleep>, deadline: Instant) {
    sleep.reset(deadline.into());
}

/// async-io's `Timer`, as smol re-exports it.
pub fn async_io_sleep(delay: Duration) -> async_io::Timer {
    async_io::Timer::after(delay)
}

/// A timeout as smol's documentation writes one: the read raced (`or`, the read polled first) against a timer.
pub fn async_io_timeout_read(delay: Duration) -> impl Future<Output = ()> + Send {
    futures_lite::future::or(PendingRead, async move {
        async_io::Timer::after(delay).await;
    })
}

/// `Timer::set_at`.
pub fn async_io_reset(timer: Pin<&mut async_io::Timer>, deadline: Instant) {
    timer.get_mut().set_at(deadline);
}

/// pingora-timeout's `sleep` (`fast_sleep`).
pub fn pingora_sleep(delay: Duration) -> impl Future<Output = ()> + Send {
    pingora_timeout::sleep(delay)
}

/// pingora-timeout's `timeout` (`fast_timeout`) around a pending read.
pub fn pingora_timeout_read(
    delay: Duration,
) -> pingora_timeout::Timeout<PendingRead, pingora_timeout::fast_timeout::FastOrTokioTimeout> {
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
                Box::pin(corewheel_sleep(delay)),
                Box::pin(corewheel_timeout_read(delay)),
            );
            let (mut tokio, mut tokio_t) = (
                Box::pin(tokio_sleep(delay)),
                Box::pin(tokio_timeout_read(delay)),
            );
            let (mut smol, mut smol_t) = (
                Box::pin(async_io_sleep(delay)),
                Box::pin(async_io_timeout_read(delay)),
            );
            let (mut pg, mut pg_t) = (
                Box::pin(pingora_sleep(delay)),
                Box::pin(pingora_timeout_read(delay)),
            );
            let done = with_context(|cx| {
                [
                    register(cw.as_mut(), cx) || register(cw_t.as_mut(), cx),
                    register(tokio.as_mut(), cx) || register(tokio_t.as_mut(), cx),
                    register(smol.as_mut(), cx) || register(smol_t.as_mut(), cx),
                    register(pg.as_mut(), cx) || register(pg_t.as_mut(), cx),
                ]
            })
            .await;
            assert_eq!(done, [false; 4], "none was done at once");
            let long = Duration::from_secs(30);
            let (mut cw_r, mut tokio_r, mut smol_r) = (
                Box::pin(corewheel_sleep(long)),
                Box::pin(tokio_sleep(long)),
                Box::pin(async_io_sleep(long)),
            );
            with_context(|cx| {
                register(cw_r.as_mut(), cx)
                    || register(tokio_r.as_mut(), cx)
                    || register(smol_r.as_mut(), cx)
            })
            .await;
            let soon = Instant::now() + Duration::from_millis(5);
            corewheel_reset(cw_r.as_mut(), soon);
            tokio_reset(tokio_r.as_mut(), soon);
            async_io_reset(smol_r.as_mut(), soon);
            let all = async {
                cw.await;
                tokio.await;
                smol.await;
                pg.await;
                assert!(cw_t.await.is_err() && tokio_t.await.is_err() && pg_t.await.is_err());
                smol_t.await;
                (cw_r.await, tokio_r.await, smol_r.await)
            };
            assert!(
                tokio::time::timeout(Duration::from_secs(10), all)
                    .await
                    .is_ok(),
                "all fired"
            );
        });
    }
}
