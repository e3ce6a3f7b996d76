//! Time: where it comes from and how it becomes ticks.
//!
//! - [`clock`]: the [`Clock`](crate::Clock) trait, the real monotonic clock, and the
//!   [`ManualClock`](crate::ManualClock) that tests drive by hand;
//! - [`cycle_clock`]: an upper bound on the current time from the CPU's cycle counter, so
//!   that arming a timer for a delay does not pay for a system clock read each time;
//! - [`ticks`]: the conversion between instants and whole ticks since an origin, rounding
//!   deadlines up so that nothing fires early.
//!
//! This layer uses only the [`sync`](crate::sync) shim. Both the single-owner wheel and
//! the engine build on it.

pub(crate) mod clock;
pub(crate) mod cycle_clock;
pub(crate) mod ticks;
