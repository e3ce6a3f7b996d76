//! The proxy's timers, behind one trait so that the same proxy code runs on corewheel's
//! timer or on tokio's: the comparison is between timers, not between two proxies.
//!
//! Everything in the proxy that waits for time goes through [`ProxyTimer`]: hyper's own
//! timeouts (through [`ProxyTimer::hyper_timer`]), the idle timeout, the request deadline,
//! the upstream connect timeout and the pause after a failed `accept`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

/// A deadline passed before the future it guarded finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOut;

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline passed")
    }
}

impl std::error::Error for TimedOut {}

/// One timer back-end: sleeps that can be moved, timeouts around futures, and the timer
/// hyper uses for its own timeouts.
///
/// The proxy is generic over this trait rather than holding a `dyn` timer, so that neither
/// back-end pays for a virtual call or a box the other does not.
pub trait ProxyTimer: Clone + Send + Sync + Unpin + 'static {
    /// A sleep that ends at a deadline and can be moved to another one.
    type Sleep: Future<Output = ()> + Send + Unpin + 'static;
    /// What hyper's connection builders get as their timer.
    type Hyper: hyper::rt::Timer + Send + Sync + 'static;

    /// The clock the deadlines are measured on.
    fn now(&self) -> Instant;

    /// A sleep that ends at `deadline`.
    fn sleep_until(&self, deadline: Instant) -> Self::Sleep;

    /// Moves `sleep` to `deadline`. The sleep must be polled again afterwards for the new
    /// deadline to wake its task (as with tokio's `Sleep::reset`).
    fn reset(&self, sleep: &mut Self::Sleep, deadline: Instant);

    /// `future`, or [`TimedOut`] once `limit` has passed.
    fn timeout<F>(
        &self,
        limit: Duration,
        future: F,
    ) -> impl Future<Output = Result<F::Output, TimedOut>> + Send
    where
        F: Future + Send;

    /// The timer for hyper's own timeouts (HTTP/1 header read).
    fn hyper_timer(&self) -> Self::Hyper;
}

/// corewheel's timer: every sleep and timeout on the process-wide
/// [`corewheel::default_engine`], and hyper's timeouts through [`corewheel::HyperTimer`].
#[derive(Clone, Copy, Debug, Default)]
pub struct CorewheelTimer;

impl ProxyTimer for CorewheelTimer {
    type Sleep = corewheel::Sleep<'static>;
    type Hyper = corewheel::HyperTimer;

    fn now(&self) -> Instant {
        corewheel::default_engine().now()
    }

    fn sleep_until(&self, deadline: Instant) -> Self::Sleep {
        corewheel::sleep_until(deadline)
    }

    fn reset(&self, sleep: &mut Self::Sleep, deadline: Instant) {
        sleep.reset(deadline);
    }

    fn timeout<F>(
        &self,
        limit: Duration,
        future: F,
    ) -> impl Future<Output = Result<F::Output, TimedOut>> + Send
    where
        F: Future + Send,
    {
        let guarded = corewheel::timeout(limit, future);
        async move { guarded.await.map_err(|_| TimedOut) }
    }

    fn hyper_timer(&self) -> Self::Hyper {
        corewheel::HyperTimer::default()
    }
}

/// tokio's timer: `tokio::time` sleeps and timeouts on the runtime's time driver, and
/// hyper-util's `TokioTimer` for hyper's timeouts.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioTimer;

impl ProxyTimer for TokioTimer {
    // Boxed because tokio's `Sleep` is not `Unpin`; a connection boxes it once and resets
    // it in place from then on, as tokio's users do.
    type Sleep = Pin<Box<tokio::time::Sleep>>;
    type Hyper = hyper_util::rt::TokioTimer;

    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn sleep_until(&self, deadline: Instant) -> Self::Sleep {
        Box::pin(tokio::time::sleep_until(deadline.into()))
    }

    fn reset(&self, sleep: &mut Self::Sleep, deadline: Instant) {
        sleep.as_mut().reset(deadline.into());
    }

    fn timeout<F>(
        &self,
        limit: Duration,
        future: F,
    ) -> impl Future<Output = Result<F::Output, TimedOut>> + Send
    where
        F: Future + Send,
    {
        let guarded = tokio::time::timeout(limit, future);
        async move { guarded.await.map_err(|_| TimedOut) }
    }

    fn hyper_timer(&self) -> Self::Hyper {
        hyper_util::rt::TokioTimer::new()
    }
}
