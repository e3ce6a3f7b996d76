//! The name of one scheduled timer.

/// Names a timer scheduled on a [`TimerEngine`](crate::TimerEngine): 16 bytes, `Copy`, and
/// safe to send to and use from any thread.
///
/// A handle carries its engine, shard, node and the node's generation. Once its timer is
/// over (fired once, cancelled, or ended by shutdown) the generation moves on and the handle
/// is stale: `cancel`, `reset` and `is_pending` return `false` and never touch the node's
/// next timer. A handle is stale on any other engine too.
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
    /// The engine's id in the high half, the shard in the low half. Nonzero, so that
    /// `Result<TimerHandle, ScheduleError>` is 16 bytes too.
    place: std::num::NonZeroU64,
    /// The node's generation in the high half, its index in the low half: whole words, not
    /// `u32`s, as half-words written apart and read back whole stall store forwarding.
    slot: u64,
}

impl TimerHandle {
    #[inline]
    pub(crate) fn new(
        engine: std::num::NonZeroU32,
        shard: u32,
        index: u32,
        generation: u32,
    ) -> Self {
        let place = (u64::from(engine.get()) << 32) | u64::from(shard);
        Self {
            place: std::num::NonZeroU64::new(place).unwrap_or(std::num::NonZeroU64::MIN),
            slot: (u64::from(generation) << 32) | u64::from(index),
        }
    }

    #[inline]
    pub(crate) fn engine(self) -> u32 {
        (self.place.get() >> 32) as u32
    }

    #[inline]
    pub(crate) fn shard(self) -> u32 {
        self.place.get() as u32
    }

    #[inline]
    pub(crate) fn index(self) -> u32 {
        self.slot as u32
    }

    #[inline]
    pub(crate) fn generation(self) -> u32 {
        (self.slot >> 32) as u32
    }
}
