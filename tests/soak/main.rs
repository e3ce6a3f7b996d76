//! Real-clock soaks: long stress loops on the real clock (a million timers, bursts claimed
//! in batches with racing cancels and resets, threads racing on the same keys). They
//! assert only what holds on a loaded 2-core machine, and run in a stage of their own.

#[path = "../support/mod.rs"]
mod support;

mod engine_stress;
