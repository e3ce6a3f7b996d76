//! Counts kept for one shard by the workers that run its timers, added a whole run at a
//! time: one shared read-modify-write per run, never per timer; and why workers woke.

use crate::engine::stats::WorkerWakes;
use crate::sync::atomic::{AtomicU64, Ordering};

/// The workers' counts for one shard.
#[derive(Default)]
pub(crate) struct ShardCounters {
    /// Callback runs, every run of a repeating timer included.
    pub(crate) fired: AtomicU64,
    /// One-shot timers that ran, and so are over.
    pub(crate) completed: AtomicU64,
    pub(crate) panicked: AtomicU64,
    /// Runs more than one tick after the deadline.
    pub(crate) late: AtomicU64,
    /// Runs by a worker other than the shard's owner.
    pub(crate) stolen: AtomicU64,
    /// Timers claimed from the wheel by a worker standing in for a stuck owner.
    pub(crate) rescued: AtomicU64,
    /// Timers claimed from handed-out lists by another worker.
    pub(crate) claimed_elsewhere: AtomicU64,
    pub(crate) ran_at_shutdown: AtomicU64,
    pub(crate) dropped_at_shutdown: AtomicU64,
    /// The producer counts of retired lanes and of threads with no lane.
    pub(crate) retired_scheduled: AtomicU64,
    pub(crate) retired_cancelled: AtomicU64,
    pub(crate) retired_reset: AtomicU64,
    /// Why the owner's sleeps ended.
    pub(crate) wakes: WakeCounters,
}

/// Adds `n` to a count that more than one thread may add to.
#[inline]
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    if n > 0 {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

#[inline]
pub(crate) fn read(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// What a worker slept until, and so what its wake-up was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
pub(crate) enum Planned {
    /// Its wheel: a timer's tick, or timers to move down ahead of time.
    Wheel,
    /// A thread's lane: what waits there has to be taken by then.
    Lane,
    /// A look at other shards for an owner stuck in a callback.
    Watch,
}

/// A wake-up, counted once the look after it has shown what it found.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
pub(crate) struct Woke {
    pub(crate) planned: Planned,
    /// Before the planned tick: another thread woke the worker.
    pub(crate) early: bool,
}

/// Why the owner's sleeps ended, written by the owner alone.
#[derive(Default)]
pub(crate) struct WakeCounters {
    due: AtomicU64,
    wheel: AtomicU64,
    lane: AtomicU64,
    watch: AtomicU64,
    woken: AtomicU64,
}

impl WakeCounters {
    /// Counts a wake-up after whose look claimed `claimed`.
    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    pub(crate) fn count(&self, woke: Woke, claimed: usize) {
        let counter = match woke.planned {
            _ if woke.early => &self.woken,
            Planned::Watch => &self.watch,
            _ if claimed > 0 => &self.due,
            Planned::Wheel => &self.wheel,
            Planned::Lane => &self.lane,
        };
        // One writer: a plain store.
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    pub(crate) fn read(wakes: &WakeCounters) -> WorkerWakes {
        WorkerWakes {
            due: read(&wakes.due),
            wheel: read(&wakes.wheel),
            lane: read(&wakes.lane),
            watch: read(&wakes.watch),
            woken: read(&wakes.woken),
        }
    }
}
