//! [`Timeout`]: a future with a deadline.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::engine::TimerEngine;
use crate::error::Elapsed;
use crate::future::sleep::Sleep;

/// A future that gives up at a deadline: yields `Ok` with the inner future's output if it
/// finishes first, and `Err(Elapsed)` once the deadline passes (never before it), or once
/// its engine has shut down (as its [`Sleep`] completes then).
///
/// Made by [`timeout`](crate::timeout) and [`timeout_at`](crate::timeout_at), or
/// [`TimerEngine::timeout`] and [`TimerEngine::timeout_at`]. The inner future is polled
/// first, and the timer is armed only when it returns `Pending`, so a future that is ready
/// at once costs no timer. Dropping a `Timeout` cancels its timer. `Unpin` when the inner
/// future is.
///
/// ```
/// use corewheel::{Elapsed, ManualClock, TimerEngine};
/// use std::task::{Context, Poll, Waker};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let engine = TimerEngine::builder().manual_clock(clock.clone()).build().unwrap();
/// let mut cx = Context::from_waker(Waker::noop());
///
/// let mut answered = engine.timeout(Duration::from_secs(1), std::future::ready(42));
/// assert_eq!(std::pin::pin!(&mut answered).poll(&mut cx), Poll::Ready(Ok(42)));
///
/// let mut stalled = engine.timeout(Duration::from_secs(1), std::future::pending::<()>());
/// assert!(std::pin::pin!(&mut stalled).poll(&mut cx).is_pending());
/// clock.advance(Duration::from_secs(1));
/// engine.turn();
/// assert_eq!(std::pin::pin!(&mut stalled).poll(&mut cx), Poll::Ready(Err(Elapsed)));
/// ```
#[must_use = "a Timeout does nothing unless polled"]
#[derive(Debug)]
pub struct Timeout<'e, F> {
    future: F,
    sleep: Sleep<'e>,
}

impl<'e, F> Timeout<'e, F> {
    pub(crate) fn new(future: F, sleep: Sleep<'e>) -> Self {
        Self { future, sleep }
    }

    /// The inner future.
    pub fn get_ref(&self) -> &F {
        &self.future
    }

    /// The inner future, mutably.
    pub fn get_mut(&mut self) -> &mut F {
        &mut self.future
    }

    /// The inner future, giving up the deadline.
    pub fn into_inner(self) -> F {
        self.future
    }

    /// The deadline.
    pub fn deadline(&self) -> Instant {
        self.sleep.deadline()
    }
}

impl<F: Future> Future for Timeout<'_, F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // `future` is structurally pinned: it is never moved out of a pinned `Timeout`
        // (only `into_inner`, which takes the `Timeout` by value, moves it, and `Timeout`
        // has no `Drop` that could), and `sleep` is `Unpin`, so handing out `&mut` to it
        // moves nothing pinned.
        // SAFETY: nothing pinned is moved through `this` (as above).
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: as above: `future` stays where it is for as long as `self` is pinned.
        let future = unsafe { Pin::new_unchecked(&mut this.future) };
        if let Poll::Ready(output) = future.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        Pin::new(&mut this.sleep).poll(cx).map(|()| Err(Elapsed))
    }
}

impl TimerEngine {
    /// A [`Timeout`] that gives `future` until `delay` from now on this engine's clock.
    pub fn timeout<F: IntoFuture>(&self, delay: Duration, future: F) -> Timeout<'_, F::IntoFuture> {
        Timeout::new(future.into_future(), self.sleep(delay))
    }

    /// A [`Timeout`] that gives `future` until `deadline`.
    pub fn timeout_at<F: IntoFuture>(
        &self,
        deadline: Instant,
        future: F,
    ) -> Timeout<'_, F::IntoFuture> {
        Timeout::new(future.into_future(), self.sleep_until(deadline))
    }
}
