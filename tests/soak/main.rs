//! Real-clock soaks: long stress loops on the real clock (a million timers, bursts claimed
//! in batches with racing cancels and resets, a minute of stand-ins on CPUs taken by
//! spinning threads). They assert only what holds on a loaded 2-core machine, and run in
//! a stage of their own (`./scripts/test-all.sh soak`).

#[path = "../support/mod.rs"]
mod support;

mod engine_stress;
mod oversubscribed_stand_ins;
