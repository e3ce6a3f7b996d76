//! Chooses a wheel's tick, geometry and capacity before building it.

use std::time::{Duration, Instant};

use crate::error::GeometryError;
use crate::time::ticks::Ticks;
use crate::wheel::Wheel;
use crate::wheel::geometry::Geometry;

/// Builds a [`Wheel`] with a chosen tick, geometry and capacity hint.
///
/// Defaults: a 1 ms tick, 64 slots per level, 6 levels (a span of 2^36 ticks before the
/// overflow list takes over), no preallocated capacity.
#[derive(Debug, Clone, Copy)]
pub struct WheelBuilder {
    tick: Duration,
    slots_per_level: usize,
    levels: usize,
    capacity: usize,
}

impl Default for WheelBuilder {
    fn default() -> Self {
        Self {
            tick: Duration::from_millis(1),
            slots_per_level: 64,
            levels: 6,
            capacity: 0,
        }
    }
}

impl WheelBuilder {
    /// The length of one tick, the wheel's resolution. Must be longer than zero.
    pub fn tick(mut self, tick: Duration) -> Self {
        self.tick = tick;
        self
    }

    /// Slots per level: a power of two from 2 to 64.
    pub fn slots_per_level(mut self, slots: usize) -> Self {
        self.slots_per_level = slots;
        self
    }

    /// Levels of the hierarchy, at least 1. Levels times log2(slots per level) may not
    /// exceed 64. Deadlines beyond the levels' span wait on the overflow list.
    pub fn levels(mut self, levels: usize) -> Self {
        self.levels = levels;
        self
    }

    /// Timers to allocate room for now. The wheel also keeps this much memory when timers
    /// go away, rather than giving it back to the allocator.
    pub fn capacity(mut self, timers: usize) -> Self {
        self.capacity = timers;
        self
    }

    /// Builds the wheel, with tick 0 beginning at `origin`.
    pub fn build<T>(self, origin: Instant) -> Result<Wheel<T>, GeometryError> {
        if self.tick.is_zero() {
            return Err(GeometryError::ZeroTick);
        }
        let geometry = Geometry::new(self.slots_per_level, self.levels)?;
        Ok(Wheel::with_parts(
            Ticks::new(self.tick, origin),
            geometry,
            self.capacity,
        ))
    }
}

impl Wheel<()> {
    /// A builder for a wheel with a chosen tick, geometry and capacity hint.
    ///
    /// It lives on `Wheel<()>` only so that `Wheel::builder()` needs no type annotation;
    /// [`WheelBuilder::build`] makes a wheel of any value type.
    ///
    /// ```
    /// use corewheel::Wheel;
    /// use std::time::{Duration, Instant};
    ///
    /// let wheel: Wheel<u32> = Wheel::builder()
    ///     .tick(Duration::from_micros(100))
    ///     .slots_per_level(32)
    ///     .levels(8)
    ///     .capacity(10_000)
    ///     .build(Instant::now())
    ///     .expect("a valid geometry");
    /// assert!(wheel.is_empty());
    /// ```
    pub fn builder() -> WheelBuilder {
        WheelBuilder::default()
    }
}
