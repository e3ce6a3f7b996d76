//! The proxy's timers, behind one trait so that the same proxy code runs on corewheel's
//! timer or on tokio's: the comparison is between timers, not between two proxies.
//!
//! Everything in the proxy that waits for time goes through [`ProxyTimer`]: hyper's own
//! timeouts (through [`ProxyTimer::hyper_timer`]), the idle timeout, the request deadline,
//! the upstream connect timeout and the pause after a failed `accept`.
//!
//! Three back-ends: [`CorewheelTimer`] (corewheel's default engine, with its own worker
//! threads), [`CorewheelDrivenTimer`] (a corewheel engine with none, driven on the proxy's
//! tokio runtime) and [`TokioTimer`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use corewheel::TimerEngine;

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

/// How often a driven proxy looks for shards of [`driven_engine`] that have lost their
/// driver (the runtime that ran it has ended) and spawns new drivers for them on its own
/// runtime. A process with one runtime (the proxy binary) never finds any.
const RECLAIM_EVERY: Duration = Duration::from_millis(250);

static DRIVEN: OnceLock<TimerEngine> = OnceLock::new();

/// The process-wide driven engine of [`CorewheelTimer::drive_here`]: no worker threads, 1 ms tick,
/// one shard per worker thread of the tokio runtime that first asks for it (one per CPU
/// outside a runtime). Its timers run only while its drivers are polled; see
/// [`CorewheelTimer::drive_here`].
///
/// # Panics
/// If corewheel refuses the engine (more than its most shards).
pub fn driven_engine() -> &'static TimerEngine {
    DRIVEN.get_or_init(|| {
        let shards = tokio::runtime::Handle::try_current().map_or_else(
            |_| std::thread::available_parallelism().map_or(1, |n| n.get()),
            |runtime| runtime.metrics().num_workers(),
        );
        TimerEngine::builder()
            .workers(shards.max(1))
            .driven()
            .build()
            .unwrap_or_else(|error| panic!("corewheel refused the driven engine: {error}"))
    })
}

/// corewheel's timer: every sleep and timeout on one engine, and hyper's timeouts through
/// [`corewheel::HyperTimer`] on the same engine. By default the process-wide
/// [`corewheel::default_engine`], with worker threads of its own; [`drive_here`](Self::drive_here)
/// puts them on [`driven_engine`], whose shards are turned by driver futures on the proxy's
/// tokio runtime instead.
#[derive(Clone, Copy, Debug)]
pub struct CorewheelTimer {
    engine: &'static TimerEngine,
}

impl Default for CorewheelTimer {
    fn default() -> Self {
        Self {
            engine: corewheel::default_engine(),
        }
    }
}

impl CorewheelTimer {
    /// The timer, with [`driven_engine`]'s drivers spawned on the current tokio runtime
    /// (which must have time enabled), plus a task that spawns new ones every 250 ms
    /// (`RECLAIM_EVERY`) for shards whose driver went away with another runtime (tests run
    /// many runtimes in one process).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn drive_here() -> Self {
        let engine = driven_engine();
        let spawn_drivers = move || {
            for driver in engine.drivers(|at| tokio::time::sleep_until(at.into())) {
                tokio::spawn(driver);
            }
        };
        spawn_drivers();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RECLAIM_EVERY).await;
                spawn_drivers();
            }
        });
        Self { engine }
    }
}

impl ProxyTimer for CorewheelTimer {
    type Sleep = corewheel::Sleep<'static>;
    type Hyper = corewheel::HyperTimer;

    fn now(&self) -> Instant {
        self.engine.now()
    }

    fn sleep_until(&self, deadline: Instant) -> Self::Sleep {
        self.engine.sleep_until(deadline)
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
        let guarded = self.engine.timeout(limit, future);
        async move { guarded.await.map_err(|_| TimedOut) }
    }

    fn hyper_timer(&self) -> Self::Hyper {
        corewheel::HyperTimer::new(self.engine)
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
