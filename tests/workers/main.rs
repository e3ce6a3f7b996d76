//! The worker threads seen from outside: the rescue watch over owners stuck in callbacks
//! (and over stand-ins and helpers stuck in turn), sleeping close, captures dropped outside
//! the wheel, wake-ups undercut by new timers, far more workers than cores, and what an
//! engine costs once a burst is over.
//!
//! These tests count the whole process's CPU time and its workers' context switches, so
//! each holds `support::serial` (a few that measure nothing process-wide hold
//! `support::shared`, and run beside each other only).

#[path = "../support/mod.rs"]
mod support;

mod after_bursts;
mod blocking_capture_drop;
mod close_sleep;
mod many_workers;
mod rescue_watch;
mod stuck_helpers;
mod stuck_owners;
mod undercut_wakes;
mod unfreed_captures;
