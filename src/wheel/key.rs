//! The generation-checked name of one timer in a [`Wheel`](crate::Wheel).

/// Identifies one timer in a [`Wheel`](crate::Wheel).
///
/// A key is a slab index plus the generation that slot had when the timer was inserted. Once
/// the timer fires or is cancelled, the slot's generation moves on, so the old key no longer
/// matches: [`Wheel::cancel`](crate::Wheel::cancel) returns `None` and
/// [`Wheel::reset`](crate::Wheel::reset) returns `false`, even after the slot holds a
/// different timer. A slot is retired for good rather than letting its generation wrap, so
/// no stale key can ever alias a later timer.
///
/// Keys are 8 bytes and `Copy`. [`TimerKey::into_raw`] and [`TimerKey::from_raw`] pack one
/// into a `u64` for callers that store keys in compact tables. Keys are names, not secrets:
/// a made-up raw value names whichever timer has that index and generation, if one does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerKey {
    index: u32,
    generation: u32,
}

impl TimerKey {
    #[inline]
    pub(crate) const fn new(index: u32, generation: u32) -> Self {
        Self { index, generation }
    }

    #[inline]
    pub(crate) const fn index(self) -> u32 {
        self.index
    }

    #[inline]
    pub(crate) const fn generation(self) -> u32 {
        self.generation
    }

    /// Packs the key into a `u64`.
    ///
    /// ```
    /// use corewheel::{TimerKey, Wheel};
    /// use std::time::{Duration, Instant};
    ///
    /// let t0 = Instant::now();
    /// let mut wheel = Wheel::new(Duration::from_millis(1), t0);
    /// let key = wheel.insert(t0 + Duration::from_millis(5), "hello");
    /// assert_eq!(TimerKey::from_raw(key.into_raw()), key);
    /// ```
    pub const fn into_raw(self) -> u64 {
        ((self.generation as u64) << 32) | self.index as u64
    }

    /// Unpacks a key packed by [`TimerKey::into_raw`].
    pub const fn from_raw(raw: u64) -> Self {
        Self {
            index: raw as u32,
            generation: (raw >> 32) as u32,
        }
    }
}
