//! Keyed timers: a timer per key, with one handler for every key that expires, on the
//! engine's own timers and a concurrent map.
//!
//! The map is dashmap's: its entry API runs a key's whole change (look at the slot, reset
//! or arm the engine timer, store) under the key's shard lock, exactly once, which is what
//! makes every value go to exactly one place. A lock-free map whose updates may run their
//! closure more than once (papaya's `compute`) cannot hold a side effect such as arming a
//! timer. The measurements behind the choice are in the perf harness's `keyed` workloads.

pub(crate) mod anchor;
pub(crate) mod key_map;
pub(crate) mod keyed_timers;
pub(crate) mod token;

pub use keyed_timers::KeyedTimers;
