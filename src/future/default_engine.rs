//! The process-wide engine that the free functions ([`sleep`], [`timeout`], [`interval`]
//! and the rest) use, started on first use.

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use crate::engine::TimerEngine;
use crate::future::interval::Interval;
use crate::future::sleep::Sleep;
use crate::future::timeout::Timeout;
use crate::sync::unmodelled::OnceLock;

static DEFAULT: OnceLock<TimerEngine> = OnceLock::new();

/// The process-wide engine, started on first use: one worker per available CPU, not pinned
/// (a library should not pin threads in a process it does not own), 1 ms tick. It is
/// never shut down.
///
/// Build your own [`TimerEngine`] to choose workers, tick, pinning or a manual clock, and
/// use its methods ([`TimerEngine::sleep`] and so on) instead of the free functions.
///
/// # Panics
/// If the process cannot start even one thread for the engine's worker.
pub fn default_engine() -> &'static TimerEngine {
    DEFAULT.get_or_init(|| {
        TimerEngine::builder()
            .pin_workers(false)
            .build()
            .or_else(|_| TimerEngine::builder().pin_workers(false).workers(1).build())
            .unwrap_or_else(|error| panic!("corewheel could not start its default engine: {error}"))
    })
}

/// A [`Sleep`] on the [`default_engine`] that completes `delay` from now: corewheel's
/// `tokio::time::sleep`, for any executor.
///
/// ```
/// # futures::executor::block_on(async {
/// corewheel::sleep(std::time::Duration::from_millis(1)).await;
/// # });
/// ```
pub fn sleep(delay: Duration) -> Sleep<'static> {
    default_engine().sleep(delay)
}

/// A [`Sleep`] on the [`default_engine`] that completes at `deadline`.
pub fn sleep_until(deadline: Instant) -> Sleep<'static> {
    default_engine().sleep_until(deadline)
}

/// A [`Timeout`] on the [`default_engine`]: `future`, given until `delay` from now.
///
/// ```
/// use std::time::Duration;
/// # futures::executor::block_on(async {
/// let stalled = corewheel::timeout(Duration::from_millis(1), std::future::pending::<()>());
/// assert_eq!(stalled.await, Err(corewheel::Elapsed));
/// # });
/// ```
pub fn timeout<F: IntoFuture>(delay: Duration, future: F) -> Timeout<'static, F::IntoFuture> {
    default_engine().timeout(delay, future)
}

/// A [`Timeout`] on the [`default_engine`]: `future`, given until `deadline`.
pub fn timeout_at<F: IntoFuture>(deadline: Instant, future: F) -> Timeout<'static, F::IntoFuture> {
    default_engine().timeout_at(deadline, future)
}

/// An [`Interval`] on the [`default_engine`] whose first tick is now, then every `period`.
pub fn interval(period: Duration) -> Interval<'static> {
    default_engine().interval(period)
}

/// An [`Interval`] on the [`default_engine`] whose first tick is at `start`, then every
/// `period`.
pub fn interval_at(start: Instant, period: Duration) -> Interval<'static> {
    default_engine().interval_at(start, period)
}
