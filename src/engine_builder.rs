//! Configuration for [`TimerEngine`].

use std::time::Duration;

use crate::clock::ManualClock;
use crate::engine::TimerEngine;
use crate::error::BuildError;

/// Most workers an engine can have: a handle names its shard in 16 bits.
pub(crate) const MAX_WORKERS: usize = 1 << 16;

/// Builds a [`TimerEngine`]. Made by [`TimerEngine::builder`].
///
/// ```
/// use corewheel::TimerEngine;
/// use std::time::Duration;
///
/// let engine = TimerEngine::builder()
///     .workers(2)
///     .tick(Duration::from_millis(1))
///     .pin_workers(false)
///     .build()
///     .expect("two worker threads");
/// assert_eq!(engine.workers(), 2);
/// ```
#[derive(Debug, Clone)]
pub struct EngineBuilder {
    pub(crate) workers: Option<usize>,
    pub(crate) tick: Duration,
    pub(crate) pin_workers: bool,
    pub(crate) manual_clock: Option<ManualClock>,
}

impl Default for EngineBuilder {
    fn default() -> Self {
        Self {
            workers: None,
            tick: Duration::from_millis(1),
            pin_workers: true,
            manual_clock: None,
        }
    }
}

impl EngineBuilder {
    /// How many shards, each with its own worker thread. Default: one per CPU the process
    /// may use ([`std::thread::available_parallelism`]). Zero is a [`BuildError::NoWorkers`].
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = Some(workers);
        self
    }

    /// The timing granularity. Default 1 ms. Deadlines round up to a tick boundary, so a
    /// timer never fires early and fires at most about a tick late when the engine keeps
    /// up. Zero is a [`BuildError::ZeroTick`].
    pub fn tick(mut self, tick: Duration) -> Self {
        self.tick = tick;
        self
    }

    /// Whether to pin worker `i` to CPU `i` (modulo the CPU count). Default `true`. A pin
    /// the operating system refuses is reported on standard error and counted in
    /// [`TimerEngine::pinned_workers`], and the worker runs unpinned.
    pub fn pin_workers(mut self, pin: bool) -> Self {
        self.pin_workers = pin;
        self
    }

    /// Drives the engine by hand, for deterministic tests: no worker threads are started,
    /// time comes from `clock`, and each [`TimerEngine::turn`] runs every shard's due work
    /// on the calling thread.
    pub fn manual_clock(mut self, clock: ManualClock) -> Self {
        self.manual_clock = Some(clock);
        self
    }

    /// Starts the engine.
    pub fn build(self) -> Result<TimerEngine, BuildError> {
        let workers = match self.workers {
            Some(0) => return Err(BuildError::NoWorkers),
            Some(n) if n > MAX_WORKERS => return Err(BuildError::TooManyWorkers(n)),
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        if self.tick.is_zero() {
            return Err(BuildError::ZeroTick);
        }
        TimerEngine::start(workers, self.tick, self.pin_workers, self.manual_clock)
    }
}
