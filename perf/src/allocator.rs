//! The global allocator: mimalloc, or the platform's allocator when the harness runs with
//! `--allocator system`.
//!
//! Allocation is part of every timer's cost (DelayQueue boxes a new `Sleep` whenever it
//! fires a timer, corewheel allocates pool chunks, the heap doubles its vector), so the
//! results name the allocator they were measured with, and one flag shows the difference.
//!
//! The choice is made once, at the process's first allocation, from the environment
//! variable [`ENV`], and never changes after, so every block is freed by the allocator that
//! made it. The command-line flag sets that variable and runs the harness again in a child
//! process (see `main`), as the parent has allocated long before it reads its arguments.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

use mimalloc::MiMalloc;

/// Set to `system` for the platform's allocator; anything else, or unset, is mimalloc.
pub const ENV: &str = "COREWHEEL_PERF_ALLOCATOR";

const UNDECIDED: u8 = 0;
const MIMALLOC: u8 = 1;
const SYSTEM: u8 = 2;

static CHOICE: AtomicU8 = AtomicU8::new(UNDECIDED);

/// mimalloc or the system allocator, as [`ENV`] said at the first allocation.
pub struct Switchable;

#[global_allocator]
static GLOBAL: Switchable = Switchable;

#[inline]
fn choice() -> u8 {
    match CHOICE.load(Ordering::Relaxed) {
        UNDECIDED => decide(),
        chosen => chosen,
    }
}

#[cold]
fn decide() -> u8 {
    let wanted = if system_requested() { SYSTEM } else { MIMALLOC };
    // The first allocation happens on the main thread before any other thread exists, but
    // if two ever raced, both would still use whichever choice was stored first.
    match CHOICE.compare_exchange(UNDECIDED, wanted, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => wanted,
        Err(chosen) => chosen,
    }
}

/// Reads [`ENV`] without allocating, as this runs inside the allocator.
#[cfg(unix)]
fn system_requested() -> bool {
    // SAFETY: the name is a NUL-terminated literal; getenv returns a pointer into the
    // environment, or null, and this process never calls setenv, so the string it points to
    // stays valid and unchanged while CStr reads it.
    unsafe {
        let value = libc::getenv(c"COREWHEEL_PERF_ALLOCATOR".as_ptr());
        !value.is_null() && std::ffi::CStr::from_ptr(value).to_bytes() == b"system"
    }
}

/// Without a way to read the environment that does not allocate, the harness stays on
/// mimalloc; `main` refuses the flag there.
#[cfg(not(unix))]
fn system_requested() -> bool {
    false
}

/// Whether `--allocator system` can work on this platform.
pub const CAN_SWITCH: bool = cfg!(unix);

// SAFETY: every method forwards to one of two allocators that uphold GlobalAlloc's contract,
// chosen by `choice()`, which is fixed from the first call on: a block is always resized and
// freed by the allocator that made it.
unsafe impl GlobalAlloc for Switchable {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout obligations pass through unchanged.
        unsafe {
            if choice() == SYSTEM {
                System.alloc(layout)
            } else {
                MiMalloc.alloc(layout)
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for alloc.
        unsafe {
            if choice() == SYSTEM {
                System.alloc_zeroed(layout)
            } else {
                MiMalloc.alloc_zeroed(layout)
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with `layout`, and so from the one
        // `choice()` names, which never changes.
        unsafe {
            if choice() == SYSTEM {
                System.dealloc(ptr, layout)
            } else {
                MiMalloc.dealloc(ptr, layout)
            }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for dealloc.
        unsafe {
            if choice() == SYSTEM {
                System.realloc(ptr, layout, new_size)
            } else {
                MiMalloc.realloc(ptr, layout, new_size)
            }
        }
    }
}

/// The allocator in use, as the output names it.
pub fn name() -> &'static str {
    if short_name() == "system" {
        "system (the platform's malloc; --allocator system)"
    } else {
        "mimalloc (crate mimalloc 0.1; --allocator system for the platform's)"
    }
}

/// A short name for tables and CSV.
pub fn short_name() -> &'static str {
    if choice() == SYSTEM {
        "system"
    } else {
        "mimalloc"
    }
}

/// Whether mimalloc is in use: it keeps freed pages for reuse, which RSS shows.
pub fn is_mimalloc() -> bool {
    choice() == MIMALLOC
}
