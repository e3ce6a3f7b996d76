//! Memory measured at the allocator, not assumed from type sizes: a counting global
//! allocator sees every byte the wheel takes and gives back.
//!
//! Bytes are counted on the test's own thread, where the wheel lives.

use std::time::{Duration, Instant};

use corewheel::Wheel;

use crate::support;
use crate::support::allocs::allocations_in;

/// Bytes this thread holds (the binary's counting allocator): the wheel lives on the
/// test's thread alone, so the harness's own allocations on other threads stay out.
fn live_bytes() -> isize {
    support::allocs::thread_live_bytes()
}

#[test]
fn a_million_timers_cost_at_most_64_bytes_each_allocate_nothing_when_armed_and_give_memory_back() {
    let _serial = support::serial();
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
        full as usize,
        "the wheel's own count agrees"
    );

    // The hot paths allocate nothing once the slab has room: arm, reset and cancel a
    // hundred thousand request timeouts at a million live.
    let allocations = allocations_in(|| {
        for i in 0..100_000_u64 {
            let key = wheel.insert(origin + Duration::from_millis(i % 30_000 + 1), i);
            assert!(wheel.reset(key, origin + Duration::from_millis(i % 7_000 + 1)));
            assert_eq!(wheel.cancel(key), Some(i));
        }
    });
    assert_eq!(allocations, 0, "insert, reset or cancel allocated");

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
