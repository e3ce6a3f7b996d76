//! The async layer: futures on engine timers, for any executor.
//!
//! [`Sleep`](sleep::Sleep), [`Timeout`](timeout::Timeout) and
//! [`Interval`](interval::Interval) are built on the engine's waker timers
//! ([`waker_timer`](crate::engine::waker_timer)): the waker lives in the pooled node and a
//! future holds only its handle. This layer uses the engine's public surface and those
//! waker-timer calls, and nothing below them. [`default_engine`] gives the process-wide
//! engine the free functions use; `hyper_timer` (feature `hyper`) plugs it into hyper.

pub(crate) mod default_engine;
#[cfg(feature = "hyper")]
pub(crate) mod hyper_timer;
pub(crate) mod interval;
pub(crate) mod sleep;
pub(crate) mod timeout;
