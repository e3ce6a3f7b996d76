//! Counts a shard's worker keeps: one writer each, so plain loads and stores, never a
//! read-modify-write that other cores would contend on.

use crate::sync::atomic::{AtomicU64, Ordering};

/// The worker's counts for one shard.
#[derive(Default)]
pub(crate) struct ShardCounters {
    /// Callback runs, every run of a repeating timer included.
    pub(crate) fired: AtomicU64,
    /// One-shot timers that ran, and so are over.
    pub(crate) completed: AtomicU64,
    pub(crate) panicked: AtomicU64,
    /// Runs more than one tick after the deadline.
    pub(crate) late: AtomicU64,
    pub(crate) ran_at_shutdown: AtomicU64,
    pub(crate) dropped_at_shutdown: AtomicU64,
    /// The producer counts of lanes the worker has forgotten (their threads exited).
    pub(crate) retired_scheduled: AtomicU64,
    pub(crate) retired_cancelled: AtomicU64,
    pub(crate) retired_reset: AtomicU64,
}

/// Adds `n` to a single-writer count.
#[inline]
pub(crate) fn bump(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

/// Reads a count.
#[inline]
pub(crate) fn read(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}
