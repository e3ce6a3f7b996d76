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

mod engine;
mod error;
mod future;
#[cfg(feature = "keyed")]
mod keyed;
mod sync;
mod time;
mod tuning;
mod wheel;

#[cfg(loom)]
#[doc(hidden)]
pub mod loom_exports;

pub use engine::TimerEngine;
pub use engine::builder::{DEFAULT_RESCUE_AFTER, EngineBuilder, MAX_WORKERS};
pub use engine::callback::{
    INLINE_BYTES as INLINE_CALLBACK_BYTES,
    INLINE_REPEATING_BYTES as INLINE_REPEATING_CALLBACK_BYTES,
};
pub use engine::driver::Driver;
pub use engine::handle::TimerHandle;
pub use engine::periodic::MissedTicks;
pub use engine::shutdown::{PendingTimers, ShutdownReport};
pub use engine::stats::{ShardStats, Stats, WorkerWakes};
pub use error::{BuildError, CapacityError, Elapsed, GeometryError, ScheduleError};
#[cfg(feature = "keyed")]
pub use error::{KeyedError, Refused};
pub use future::default_engine::{
    default_engine, interval, interval_at, sleep, sleep_until, timeout, timeout_at,
};
#[cfg(feature = "hyper")]
pub use future::hyper_timer::HyperTimer;
pub use future::interval::Interval;
pub use future::sleep::Sleep;
pub use future::timeout::Timeout;
#[cfg(feature = "keyed")]
pub use keyed::KeyedTimers;
pub use time::clock::{Clock, ManualClock, MonotonicClock};
pub use wheel::Wheel;
pub use wheel::builder::WheelBuilder;
pub use wheel::key::TimerKey;

/// Compiles and runs the README's examples as doc tests, so the README cannot drift from
/// the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
