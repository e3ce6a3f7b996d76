//! Memory measured at the allocator, not assumed from type sizes: a counting global
//! allocator sees every byte the wheel takes and gives back.
//!
//! One test only, because the counter is process-wide and parallel tests would share it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use corewheel::Wheel;

struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to `System`, which upholds `GlobalAlloc`'s
// contract; the counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's layout obligations pass straight through to `System`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout, i.e. from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

#[test]
fn a_million_timers_cost_at_most_64_bytes_each_allocate_nothing_when_armed_and_give_memory_back() {
    const N: usize = 1_000_000;
    let origin = Instant::now();
    let keys = Vec::with_capacity(N);
    let before = live_bytes();
    let mut wheel = Wheel::new(Duration::from_millis(1), origin);
    let mut keys = keys;
    for i in 0..N as u64 {
        // Delays spread over 30 s, the request-timeout shape.
        let delay = Duration::from_micros((i * 7919) % 30_000_000 + 1000);
        keys.push(wheel.insert(origin + delay, i));
    }
    let full = live_bytes() - before;
    let per_timer = full as f64 / N as f64;
    let overhead = per_timer - size_of::<u64>() as f64;
    assert!(
        overhead <= 64.0,
        "{overhead:.1} bytes of overhead per timer"
    );
    assert_eq!(
        wheel.allocated_bytes(),
        full,
        "the wheel's own count agrees"
    );

    // The hot paths allocate nothing once the slab has room: arm, reset and cancel a
    // hundred thousand request timeouts at a million live.
    let allocations = ALLOCATIONS.load(Ordering::Relaxed);
    for i in 0..100_000_u64 {
        let key = wheel.insert(origin + Duration::from_millis(i % 30_000 + 1), i);
        assert!(wheel.reset(key, origin + Duration::from_millis(i % 7_000 + 1)));
        assert_eq!(wheel.cancel(key), Some(i));
    }
    assert_eq!(
        ALLOCATIONS.load(Ordering::Relaxed),
        allocations,
        "insert, reset or cancel allocated"
    );

    // Cancel in an order unrelated to insertion, as a proxy's responses would arrive.
    for step in 0..N {
        let key = keys[(step * 7_777_777) % N];
        assert!(wheel.cancel(key).is_some());
    }
    let after_cancel = live_bytes() - before;
    assert!(
        after_cancel * 100 < full,
        "cancelled timers still hold {after_cancel} of {full} bytes"
    );
    wheel.shrink_to_fit();
    let after_shrink = live_bytes() - before;
    assert!(after_shrink < after_cancel);
    drop(wheel);
    assert!(live_bytes().abs_diff(before) <= 4096, "the wheel leaked");
    // Printed last: the harness captures output in a buffer that grows on the heap.
    println!("{per_timer:.1} bytes per live timer, {overhead:.1} beyond the value");
    println!("{after_cancel} bytes held after cancelling all {N}");
}
