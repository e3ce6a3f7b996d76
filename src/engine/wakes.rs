//! Why a worker's sleep ended, counted per shard
//! ([`WakeCounters`](crate::engine::counters::WakeCounters)) for [`Stats`](crate::Stats).

#![cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]

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

/// A wake-up counted once the look after it has shown what it found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Woke {
    pub(crate) planned: Planned,
    /// Before the planned tick: another thread woke the worker.
    pub(crate) early: bool,
}
