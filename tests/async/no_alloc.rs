//! Sleeping allocates nothing once the pool is warm: a counting allocator watches the
//! test's thread while it makes, polls, resets, re-wakers and drops sleeps and timeouts,
//! on a hand-driven engine and on one with worker threads. Keyed timers with a word-sized
//! key allocate nothing per set, move and remove either.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use crate::support::allocs::allocations_in;
use corewheel::{ManualClock, TimerEngine};

struct Nop;

impl Wake for Nop {
    fn wake(self: Arc<Self>) {}
}

/// One round of what a proxy does with timers: a request timeout answered in time, an
/// idle timeout pushed back and its waker changed, a timeout around a pending read.
fn round(engine: &TimerEngine, first: &Waker, second: &Waker) {
    let mut cx = Context::from_waker(first);
    let mut request = engine.sleep(Duration::from_secs(5));
    assert!(Pin::new(&mut request).poll(&mut cx).is_pending());
    drop(request);

    let mut idle = engine.sleep(Duration::from_secs(30));
    assert!(Pin::new(&mut idle).poll(&mut cx).is_pending());
    idle.reset(engine.now() + Duration::from_secs(60));
    idle.reset(engine.now() + Duration::from_secs(10));
    let mut other = Context::from_waker(second);
    assert!(Pin::new(&mut idle).poll(&mut other).is_pending());
    drop(idle);

    let mut read = engine.timeout(Duration::from_secs(1), std::future::pending::<()>());
    assert!(Pin::new(&mut read).poll(&mut cx).is_pending());
    drop(read);
}

fn check(engine: &TimerEngine, turn: impl Fn()) {
    let first = Waker::from(Arc::new(Nop));
    let second = Waker::from(Arc::new(Nop));
    // Warm: the thread's lane and magazine, and the pool's first nodes.
    for _ in 0..2_000 {
        round(engine, &first, &second);
        turn();
    }
    let made = allocations_in(|| {
        for _ in 0..20_000 {
            round(engine, &first, &second);
        }
    });
    assert_eq!(made, 0, "allocations in 20 000 rounds");
}

#[test]
fn sleeping_on_a_hand_driven_engine_allocates_nothing() {
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .manual_clock(clock.clone())
        .workers(1)
        .build()
        .expect("a manual engine");
    check(&engine, || {
        engine.turn();
    });
}

#[test]
fn sleeping_on_an_engine_with_workers_allocates_nothing_on_the_task_thread() {
    let engine = TimerEngine::builder()
        .workers(2)
        .pin_workers(false)
        .build()
        .expect("an engine");
    check(&engine, || {});
}

/// The counter counts: a test that could not fail would prove nothing.
#[test]
fn the_counter_sees_an_allocation() {
    assert_eq!(
        allocations_in(|| drop(std::hint::black_box(Box::new(1)))),
        1
    );
}

/// Keyed timers with a `u64` key: sets (new and over a pending key), moves and removes
/// allocate nothing once the pool and the map are warm, as the timer's callback (a
/// reference, the key and its token) fits in the node.
#[test]
fn keyed_timers_with_a_word_key_allocate_nothing_once_warm() {
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .manual_clock(clock.clone())
        .build()
        .unwrap();
    let timers = corewheel::KeyedTimers::with_engine(&engine, |_: u64, _: u64| {});
    let cycle = || {
        for key in 0..256 {
            assert_eq!(timers.set(key, key, Duration::from_secs(1)), Ok(None));
            assert_eq!(
                timers.set(key, key + 1, Duration::from_secs(1)),
                Ok(Some(key))
            );
            assert!(timers.move_to(&key, Duration::from_secs(2)));
            assert_eq!(timers.remove(&key), Some(key + 1));
        }
        clock.advance(Duration::from_millis(40));
        engine.turn();
    };
    cycle();
    cycle();
    assert_eq!(allocations_in(cycle), 0);
    assert_eq!(engine.nodes_in_use(), 0);
}
