//! Configuration for [`TimerEngine`](crate::TimerEngine).

use std::time::Duration;

use crate::engine::pool::DEFAULT_CAPACITY;
use crate::time::clock::ManualClock;

/// The most workers (shards) an engine may have; more is a
/// [`BuildError::TooManyWorkers`](crate::BuildError::TooManyWorkers).
pub const MAX_WORKERS: usize = 1024;

/// Builds a [`TimerEngine`](crate::TimerEngine). Made by [`TimerEngine::builder`](crate::TimerEngine::builder).
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
    pub(crate) capacity: usize,
    pub(crate) stealing: bool,
    pub(crate) rescue_after: Option<u32>,
    pub(crate) driven: bool,
}

/// The default for [`EngineBuilder::rescue_after`], in ticks.
pub const DEFAULT_RESCUE_AFTER: u32 = 8;

impl Default for EngineBuilder {
    fn default() -> Self {
        Self {
            workers: None,
            tick: Duration::from_millis(1),
            pin_workers: true,
            manual_clock: None,
            capacity: DEFAULT_CAPACITY,
            stealing: true,
            rescue_after: Some(DEFAULT_RESCUE_AFTER),
            driven: false,
        }
    }
}

impl EngineBuilder {
    /// How many shards, each with its own worker thread. Default: one per CPU the process
    /// may use, at most [`MAX_WORKERS`]. Zero is a
    /// [`BuildError::NoWorkers`](crate::BuildError::NoWorkers).
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = Some(workers);
        self
    }

    /// The timing granularity (default 1 ms). Deadlines round up to a tick, so a timer
    /// never fires early. Zero is a [`BuildError::ZeroTick`](crate::BuildError::ZeroTick).
    pub fn tick(mut self, tick: Duration) -> Self {
        self.tick = tick;
        self
    }

    /// Whether to pin worker `i` to CPU `i` modulo the CPU count (default `true`). A refused
    /// pin leaves the worker unpinned, as [`Stats::pinned_workers`](crate::Stats::pinned_workers)
    /// shows.
    pub fn pin_workers(mut self, pin: bool) -> Self {
        self.pin_workers = pin;
        self
    }

    /// The most timer nodes one shard's pool holds (default 4 × 2^20, rounded up to a multiple of
    /// 1024, at most 2^26 - 1024); beyond, scheduling there is a
    /// [`ScheduleError::Capacity`](crate::ScheduleError::Capacity). Nodes in use include a few
    /// hundred free ones per thread and shard. Address space is reserved at build; memory is used
    /// as timers are scheduled, up to about 8/7 of the most nodes in use at once.
    pub fn capacity(mut self, timers_per_shard: usize) -> Self {
        self.capacity = timers_per_shard;
        self
    }

    /// Whether idle workers take part of another shard's burst of due timers (default `true`). Off,
    /// a shard's timers run on its own worker only (but for [`rescue_after`](Self::rescue_after)).
    pub fn stealing(mut self, stealing: bool) -> Self {
        self.stealing = stealing;
        self
    }

    /// How many ticks a shard's owner may spend in a slow callback or `Drop` before another worker
    /// stands in until it is back (default [`DEFAULT_RESCUE_AFTER`]; `Some(0)` is `Some(1)`; `None`
    /// turns this off). While any owner runs timers (and a while after), one idle worker wakes
    /// every this many ticks to look. Timers claimed in the slow callback's run (at most 32) still
    /// wait for it.
    pub fn rescue_after(mut self, ticks: Option<u32>) -> Self {
        self.rescue_after = ticks;
        self
    }

    /// Drives the engine by hand, for deterministic tests: no worker threads, time from
    /// `clock`, and [`TimerEngine::turn`](crate::TimerEngine::turn) runs the due work.
    pub fn manual_clock(mut self, clock: ManualClock) -> Self {
        self.manual_clock = Some(clock);
        self
    }

    /// Starts no worker threads: the application's runtime spawns the shards' futures,
    /// [`TimerEngine::drivers`](crate::TimerEngine::drivers); [`workers`](Self::workers) still sets
    /// the number of shards. Timers fire when the runtime polls their driver, so a busy runtime or
    /// a blocking callback delays them ([`rescue_after`](Self::rescue_after) and
    /// [`stealing`](Self::stealing) apply to worker threads only, though a
    /// [`turn`](crate::TimerEngine::turn) stands in). Nothing fires until the drivers are spawned.
    pub fn driven(mut self) -> Self {
        self.driven = true;
        self
    }
}
