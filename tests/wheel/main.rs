//! The hierarchical wheel (`Wheel`, and the engine's wheel behind one shard on a manual
//! clock): edge cases, a model check of random operation sequences, and the layout's moving
//! parts (boundary leftovers, the due walk from both ends of a slot's lists, the pre-cascade
//! window, per-tick pacing, lookahead and batched claims, the eight lists of a finest slot).
//! Everything is deterministic: virtual or manual clocks, seeded randomness.

#[path = "../support/mod.rs"]
mod support;

mod boundary_leftovers;
mod boundary_leftovers_moved_down;
mod due_walk_both_ends;
mod edges;
mod eight_lists_per_slot;
mod lookahead_and_batched_claim;
mod model;
mod pacing_per_tick;
mod pre_cascade_window;
