//! corewheel: a lock-free, multi-core timer engine built on hierarchical timing wheels.
//!
//! - [`TimerEngine`]: the multi-core engine. One wheel per shard, each owned by a worker
//!   thread; any thread schedules, cancels and resets timers without locks or allocation.
//! - [`Wheel`]: the hierarchical timing wheel one thread owns, for event loops that embed a
//!   wheel directly.
//! - [`Clock`]s, including [`ManualClock`] for deterministic tests of both.
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

mod callback;
mod clock;
mod context;
mod engine;
mod engine_builder;
mod engine_shared;
mod error;
mod geometry;
mod lane;
mod list;
mod mpsc;
mod node;
mod periodic;
mod pool;
mod shard;
mod shard_counters;
mod slab;
mod stats;
mod sync;
mod ticks;
mod timer_handle;
mod timer_key;
mod timer_node;
mod timer_state;
mod wheel;
mod wheel_builder;
mod worker;

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
pub use callback::INLINE_BYTES as INLINE_CALLBACK_BYTES;
pub use engine::{ShutdownReport, TimerEngine};
pub use engine_builder::EngineBuilder;
pub use error::{BuildError, CapacityError, GeometryError, ScheduleError};
pub use periodic::MissedTicks;
pub use stats::{ShardStats, Stats};
pub use timer_handle::TimerHandle;
pub use timer_key::TimerKey;
pub use wheel::Wheel;
pub use wheel_builder::WheelBuilder;
pub use worker::PendingTimers;

/// Compiles and runs the README's examples as doc tests, so the README cannot drift from
/// the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
