//! The global allocator: mimalloc, unless the `system-alloc` feature asks for the platform's.
//!
//! Allocation is part of every timer's cost (DelayQueue boxes a new `Sleep` whenever it
//! fires a timer, corewheel allocates slab chunks, the heap doubles its vector), so the
//! results name the allocator they were measured with.

#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The allocator in use, as the output names it.
pub const NAME: &str = if cfg!(feature = "system-alloc") {
    "system (the platform's malloc; feature system-alloc)"
} else {
    "mimalloc (crate mimalloc 0.1; --features system-alloc for the system allocator)"
};

/// A short name for tables and CSV.
pub const SHORT_NAME: &str = if cfg!(feature = "system-alloc") {
    "system"
} else {
    "mimalloc"
};
