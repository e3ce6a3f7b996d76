//! `KeyedTimers`: one timer per key with one handler, on a manual clock and the real one.
//! Its timers find their map through a process-wide slot table read in crossbeam-epoch
//! sections, so every test here holds `support::serial`: another test's owner would change
//! which slot an owner gets and when a deferred free runs.

#[path = "../support/mod.rs"]
mod support;

mod guarantees;
mod handler_lifetime;
mod manual_clock;
mod racing_keys;
mod slot_table;
