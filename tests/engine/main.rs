//! The multi-core engine through its public API: schedule and cancel, reset, shutdown (and
//! re-entry into it), callbacks that fault, stale clock readings, stealing and hand-outs of
//! due bursts, worker wake-ups and their counts, the lanes that carry cancels and resets to
//! a shard's owner (forward ring, held-back and parked timers, the inbox), the node pool,
//! and the README's examples. Real-clock tests assert only what holds on a loaded 2-core
//! machine: never early, exactly once, nothing lost, within generous limits.

#[path = "../support/mod.rs"]
mod support;

mod callback_faults;
mod drops_mid_operation;
mod hand_out;
mod hand_out_races;
mod inbox_receive;
mod lane_forward_ring;
mod lane_parked_timers;
mod lanes_holding_back;
mod manual_clock;
mod pool_bitmap;
mod pool_growth;
mod readme_examples;
mod shutdown_reentry;
mod smoke;
mod stale_readings;
mod stealing;
mod wake_counts_and_urgency;
mod wakes;
