//! A counting allocator for the tests of what allocates (the `memory` and `async` binaries,
//! which each register it as their `#[global_allocator]`). A thread counts its own
//! allocations, and only while it watches: the test harness's threads (another test
//! starting, its output captured) allocate at any moment and never count. The process's
//! live bytes are counted too, and each thread's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};

/// Passes every call to the system allocator, counting as the module says.
pub struct Counting;

thread_local! {
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
    /// Bytes this thread allocated less those it freed (whoever allocated them).
    static LIVE_HERE: Cell<isize> = const { Cell::new(0) };
}

/// Bytes allocated and not yet freed, on every thread.
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

fn note(bytes: isize) {
    LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed);
    let _ = LIVE_HERE.try_with(|live| live.set(live.get() + bytes));
    // `try_with`: the allocator runs during thread-local destruction too.
    let _ = WATCHING.try_with(|watching| {
        if watching.get() {
            let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        }
    });
}

// SAFETY: every call is passed to the system allocator unchanged; counting touches only an
// atomic and const-initialised thread-local cells, which allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as isize);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        let _ = LIVE_HERE.try_with(|live| live.set(live.get() - layout.size() as isize));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as isize);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size as isize - layout.size() as isize);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations `f` made on this thread (less any part of it left out with [`watch`]).
pub fn allocations_in(f: impl FnOnce()) -> usize {
    ALLOCATIONS.with(|count| count.set(0));
    watch(true);
    f();
    watch(false);
    ALLOCATIONS.with(Cell::get)
}

/// Stops (`false`) or resumes (`true`) counting this thread's allocations, to leave a
/// part of the work inside [`allocations_in`] out of its count.
pub fn watch(on: bool) {
    WATCHING.with(|watching| watching.set(on));
}

/// Bytes this thread allocated less those it freed: what a structure used on this thread
/// alone holds, whatever the other threads (the test harness's among them) do meanwhile.
pub fn thread_live_bytes() -> isize {
    LIVE_HERE.with(Cell::get)
}

/// Bytes allocated and not yet freed, on every thread.
pub fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}
