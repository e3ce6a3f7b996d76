//! Configuration for [`TimerEngine`].

use std::time::Duration;

use crate::engine::TimerEngine;
use crate::engine::pool::DEFAULT_CAPACITY;
use crate::error::BuildError;
use crate::time::clock::ManualClock;

/// The most workers (shards) an engine may have; more is a
/// [`BuildError::TooManyWorkers`].
///
/// Each worker is a thread, reserves address space for its shard's node pool, and is one
/// more shard for idle workers to look over when they balance, so an engine with far more
/// workers than CPUs only costs more. 1024 covers the largest machines in use.
pub const MAX_WORKERS: usize = 1024;

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
    /// may use ([`std::thread::available_parallelism`]), at most [`MAX_WORKERS`]. Zero is a
    /// [`BuildError::NoWorkers`], and more than [`MAX_WORKERS`] a
    /// [`BuildError::TooManyWorkers`].
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
    /// the operating system refuses leaves that worker unpinned, which
    /// [`Stats::pinned_workers`](crate::Stats::pinned_workers) shows from the moment
    /// `build` returns; the library prints nothing.
    pub fn pin_workers(mut self, pin: bool) -> Self {
        self.pin_workers = pin;
        self
    }

    /// The most timer nodes one shard's pool holds; when they are all in use, scheduling on
    /// that shard is a [`ScheduleError::Capacity`](crate::ScheduleError::Capacity).
    /// Default: about four million (4 × 2^20). Rounded up to a multiple of 1024, and at
    /// most 2^26 - 1024. Besides live timers, nodes in use include free ones each thread
    /// keeps at hand for its next timers (up to about 320 per thread and shard) and
    /// cancelled ones on their way back to the pool (a few ticks under load, up to about
    /// 40 when the worker has nothing else to wake for).
    ///
    /// Each shard reserves address space for this many 64-byte timer nodes when the engine
    /// is built (256 MiB by default); memory is used only as timers are scheduled, and the
    /// high-water mark stays in use, for reuse, until the engine is dropped. The pool
    /// reuses its nodes as a ring, in address order, and keeps up to an eighth of them free
    /// so that the next timers find whole free pages ahead of them: its high-water mark is
    /// up to about 8/7 of the most nodes in use at once (the counts above), plus a chunk
    /// of 1,024 nodes.
    pub fn capacity(mut self, timers_per_shard: usize) -> Self {
        self.capacity = timers_per_shard;
        self
    }

    /// Whether idle workers take part of another shard's burst of due timers. Default
    /// `true`.
    ///
    /// Timers stay on the shard that armed them until they are due. The owner then claims
    /// its due timers onto the shard's run queue, and when more than a few dozen wait there,
    /// a sleeping worker is woken to take runs of them. So a million timers armed from one
    /// thread and due together fire on every worker. Off, each shard's timers run on its own
    /// worker only (standing in for a stuck owner, [`rescue_after`](Self::rescue_after),
    /// still runs them elsewhere).
    pub fn stealing(mut self, stealing: bool) -> Self {
        self.stealing = stealing;
        self
    }

    /// How many ticks a shard's owner may go without looking at its wheel, while awake
    /// (stuck in a slow callback, or in the `Drop` of a cancelled timer's captures), before
    /// another worker stands in: it takes the wheel for a moment, claims the timers that
    /// have come due and runs them, until the owner is back. `None` turns this off, and a
    /// slow callback then delays its shard's other timers until it returns. Default:
    /// `Some(8)` ([`DEFAULT_RESCUE_AFTER`]).
    ///
    /// With it on, while any owner is running timers (and for 64 times this long after
    /// the last time one did), one otherwise idle worker wakes every this many ticks (at
    /// least every tick: `Some(0)` watches as `Some(1)` does, and stands in after a tick)
    /// to look. An owner dropping cancelled timers' captures that have a `Drop` of their
    /// own (or a dropped `Sleep`'s waker) is watched while it does, which may wake a worker
    /// once, with no watching after. Timers due at the same tick as the slow callback,
    /// claimed with it in one run (at most 32), wait for it.
    pub fn rescue_after(mut self, ticks: Option<u32>) -> Self {
        self.rescue_after = ticks;
        self
    }

    /// Drives the engine by hand, for deterministic tests: no worker threads are started,
    /// time comes from `clock`, and each [`TimerEngine::turn`] runs every shard's due work
    /// on the calling thread.
    pub fn manual_clock(mut self, clock: ManualClock) -> Self {
        self.manual_clock = Some(clock);
        self
    }

    /// Starts no worker threads: the application's async runtime turns the shards
    /// instead, through the futures of [`TimerEngine::drivers`], one per shard, which it
    /// spawns. Each driver sleeps on the runtime's own timer until its shard's next
    /// deadline, and a thread that arms a timer due sooner wakes it, as it would wake a
    /// worker. So the engine's work rides the wake-ups the runtime makes anyway: a lightly
    /// loaded engine makes no thread wake-ups of its own. [`workers`](Self::workers) still
    /// sets the number of shards.
    ///
    /// What it gives up, against worker threads:
    /// - Callbacks run on the runtime's threads, inside a driver's poll. One that blocks
    ///   holds up that runtime thread and its shard's other timers; no worker stands in
    ///   for it ([`rescue_after`](Self::rescue_after) and [`stealing`](Self::stealing)
    ///   apply to worker threads only), though a [`TimerEngine::turn`] from another
    ///   thread does, after `rescue_after`.
    /// - Timers fire when the runtime polls their driver: a runtime whose threads are all
    ///   busy delays them, as it delays its own timers. Never early, still.
    /// - Nothing fires until the drivers are spawned, and a shard whose driver is dropped
    ///   before the engine shuts down is turned only by [`TimerEngine::turn`] calls.
    ///
    /// Timers still go to the shard of the thread that arms them, and a driver turns the
    /// whole shard in one poll: a burst due at once on one shard runs on one runtime
    /// thread at a time.
    pub fn driven(mut self) -> Self {
        self.driven = true;
        self
    }

    /// Starts the engine.
    pub fn build(self) -> Result<TimerEngine, BuildError> {
        let workers = match self.workers {
            Some(0) => return Err(BuildError::NoWorkers),
            Some(n) if n > MAX_WORKERS => return Err(BuildError::TooManyWorkers(n)),
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_WORKERS)),
        };
        if self.tick.is_zero() {
            return Err(BuildError::ZeroTick);
        }
        TimerEngine::start(self, workers)
    }
}
