//! The async layer: `Sleep`, `Timeout`, `Interval` and the free functions on a manual clock
//! and under real executors (tokio, `futures::executor`, smol), resets and drops, wakers,
//! hyper's `rt::Timer`, driven engines (no worker threads), and sleeping without allocating.
//!
//! The binary's allocator counts each thread's allocations while it watches
//! (`support::allocs`), for the tests of what allocates.

#[global_allocator]
static ALLOCATOR: support::allocs::Counting = support::allocs::Counting;

#[path = "../support/mod.rs"]
mod support;

mod driven;
mod driven_runtimes;
mod executors;
mod hyper_timer;
mod lazy_reset;
mod manual_clock;
mod no_alloc;
mod resets_and_drops;
mod sleep_timeout_interval;
mod wakers_and_threads;
