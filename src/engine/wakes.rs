//! Why a worker's sleep ended, counted per shard for [`Stats`](crate::Stats): at a light
//! load, wake-ups are most of the engine's cost.

#![cfg_attr(
    loom,
    allow(
        dead_code,
        reason = "loom models drive engines by hand, without worker threads"
    )
)]

use crate::engine::stats::WorkerWakes;
use crate::sync::atomic::{AtomicU64, Ordering};

/// What a worker slept until, and so what its wake-up was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Planned {
    /// Its wheel: a timer's tick, or timers to move down ahead of time.
    Wheel,
    /// A thread's lane: timers or messages waiting there have to be taken by then.
    Lane,
    /// A look at other shards for an owner stuck in a callback.
    Watch,
}

/// The counts, written by the shard's owner alone.
#[derive(Default)]
pub(crate) struct WakeCounters {
    due: AtomicU64,
    wheel: AtomicU64,
    lane: AtomicU64,
    watch: AtomicU64,
    woken: AtomicU64,
}

/// A wake-up counted once the look after it has shown what it found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Woke {
    pub(crate) planned: Planned,
    /// Before the planned tick: another thread woke the worker.
    pub(crate) early: bool,
}

impl WakeCounters {
    /// The owner's sleep ended as `woke` says, and the look after it claimed `claimed`.
    pub(crate) fn count(&self, woke: Woke, claimed: usize) {
        let counter = match woke.planned {
            _ if woke.early => &self.woken,
            Planned::Watch => &self.watch,
            _ if claimed > 0 => &self.due,
            Planned::Wheel => &self.wheel,
            Planned::Lane => &self.lane,
        };
        // One writer: a plain store, no read-modify-write.
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

fn read(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}
