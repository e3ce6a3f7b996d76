//! Memory counted at the allocator: the wheel's bytes per timer, the engine's pool, and
//! nothing left behind. The live-byte count is process-wide, so each test holds
//! `support::serial`.

#[global_allocator]
static ALLOCATOR: support::allocs::Counting = support::allocs::Counting;

#[path = "../support/mod.rs"]
mod support;

mod engine;
mod wheel;
