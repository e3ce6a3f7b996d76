//! The engine's memory, counted at the allocator: arming and cancelling allocate nothing,
//! the pool's node memory follows the peak number of timers, and a dropped engine gives
//! everything back even when a long-lived thread used it.

use crate::support;

use std::time::Duration;

use crate::support::allocs::{allocations_in, live_bytes};
use corewheel::{ManualClock, TimerEngine};

fn manual_engine() -> (TimerEngine, ManualClock) {
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(1)
        .capacity(1 << 20)
        .manual_clock(clock.clone())
        .build()
        .expect("a manual engine");
    (engine, clock)
}

#[test]
fn arming_cancelling_and_resetting_allocate_nothing() {
    let _serial = support::serial();
    let (engine, clock) = manual_engine();
    // Warm up: the thread's context, lane and first chunks of the pool.
    let warm: Vec<_> = (0..10_000)
        .map(|k| {
            engine
                .schedule(Duration::from_millis(1 + k % 500), || {})
                .unwrap()
        })
        .collect();
    for handle in warm {
        engine.cancel(handle);
    }
    clock.advance(Duration::from_millis(5));
    engine.turn();
    let mut live = Vec::with_capacity(10_000);
    // Counted on this thread: a hand-driven engine has no threads of its own, and the test
    // harness's threads allocate at any moment (6 where 1 was expected, counted for the
    // whole process, once beside two busy loops).
    let allocations = allocations_in(|| {
        for k in 0..10_000_u64 {
            let handle = engine
                .schedule(Duration::from_millis(1 + k % 500), || {})
                .unwrap();
            assert!(engine.reset(handle, Duration::from_millis(600)));
            if k % 2 == 0 {
                assert!(engine.cancel(handle));
            } else {
                live.push(handle);
            }
        }
    });
    assert_eq!(allocations, 0, "arming, resetting or cancelling allocated");
    drop(live);
}

#[test]
fn a_dropped_engine_gives_its_memory_back_to_a_long_lived_thread() {
    let _serial = support::serial();
    let baseline = live_bytes();
    for _ in 0..5 {
        let (engine, clock) = manual_engine();
        for k in 0..100_000_u64 {
            let handle = engine
                .schedule(Duration::from_millis(1 + k % 100), || {})
                .unwrap();
            if k % 3 == 0 {
                engine.cancel(handle);
            }
        }
        clock.advance(Duration::from_millis(200));
        engine.turn();
        drop(engine);
        // This thread's context for the dead engine holds a few bytes until the next
        // lookup prunes it.
        let kept = live_bytes() - baseline;
        assert!(
            kept < 16 * 1024,
            "{kept} bytes kept after the engine was dropped"
        );
    }
}
