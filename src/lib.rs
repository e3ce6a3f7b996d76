//! corewheel: a lock-free, multi-core timer engine built on hierarchical timing wheels.
//!
//! This release provides the foundation: [`Wheel`], a hierarchical timing wheel that one
//! thread owns, for event loops that embed a wheel directly, and the [`Clock`]s that drive
//! it, including [`ManualClock`] for deterministic tests.
//!
//! ```
//! use corewheel::{Clock, ManualClock, Wheel};
//! use std::time::Duration;
//!
//! let clock = ManualClock::new();
//! let mut wheel = Wheel::new(Duration::from_millis(1), clock.now());
//! wheel.insert(clock.now() + Duration::from_secs(2), "heartbeat");
//!
//! clock.advance(Duration::from_secs(1));
//! assert_eq!(wheel.poll_expired(clock.now()), None);
//! clock.advance(Duration::from_secs(1));
//! assert_eq!(wheel.poll_expired(clock.now()), Some("heartbeat"));
//! ```
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod clock;
mod error;
mod geometry;
mod list;
#[cfg_attr(
    not(loom),
    allow(
        dead_code,
        reason = "the multi-core engine's shards are its users; loom and Miri check it now"
    )
)]
mod mpsc;
mod node;
mod slab;
mod sync;
mod ticks;
mod timer_key;
#[cfg_attr(
    not(loom),
    allow(
        dead_code,
        reason = "the multi-core engine's pooled nodes are its users; loom checks it now"
    )
)]
mod timer_state;
mod wheel;
mod wheel_builder;

pub use clock::{Clock, ManualClock, MonotonicClock};

/// The lock-free internals, exposed only to the loom models in `loom-tests/` (built with
/// `--cfg loom`). Not part of the API.
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_exports {
    pub use crate::mpsc::testing::{Message, consume, message};
    pub use crate::mpsc::{Link, Linked, Pop, Queue, link_after};
    pub use crate::timer_state::{Observed, Phase, TimerState};
}
pub use error::{CapacityError, GeometryError};
pub use timer_key::TimerKey;
pub use wheel::Wheel;
pub use wheel_builder::WheelBuilder;

/// Compiles and runs the README's examples as doc tests, so the README cannot drift from
/// the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
