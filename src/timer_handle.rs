//! The name of one scheduled timer.

/// Names a timer scheduled on a [`TimerEngine`](crate::TimerEngine): 16 bytes, `Copy`, and
/// safe to send to and use from any thread.
///
/// A handle carries its engine, shard, node and the node's generation. Once its timer has
/// fired (a one-shot timer), been cancelled or been dropped by shutdown, the node's
/// generation moves on, and the handle goes stale: `cancel`, `reset` and `is_pending` then
/// return `false` and never touch the timer that reuses the node. A handle given to another
/// engine is stale there too.
///
/// ```
/// use corewheel::{ManualClock, TimerEngine};
/// use std::time::Duration;
///
/// let engine = TimerEngine::builder().manual_clock(ManualClock::new()).build().unwrap();
/// let handle = engine.schedule(Duration::from_secs(1), || {}).unwrap();
/// assert_eq!(std::mem::size_of_val(&handle), 16);
/// assert!(engine.cancel(handle));
/// assert!(!engine.cancel(handle), "a second cancel finds the handle stale");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerHandle {
    /// Nonzero, so that `Result<TimerHandle, ScheduleError>` is 16 bytes and comes back in
    /// registers rather than through memory.
    pub(crate) engine: std::num::NonZeroU32,
    pub(crate) shard: u32,
    pub(crate) index: u32,
    pub(crate) generation: u32,
}
