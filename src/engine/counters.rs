//! Counts kept for one shard by the workers that run its timers, added a whole run at a
//! time: one shared read-modify-write per run, never per timer.

use crate::engine::wakes::WakeCounters;
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
    /// Timers claimed from handed-out lists by a worker other than the shard's owner.
    pub(crate) claimed_elsewhere: AtomicU64,
    pub(crate) ran_at_shutdown: AtomicU64,
    pub(crate) dropped_at_shutdown: AtomicU64,
    /// The producer counts of retired lanes, and of threads with no lane any more.
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
