//! `Sleep` against the engine firing its timer: a new waker registered, a reset, a drop,
//! and a shutdown, each racing the worker's turn at the deadline. The task side runs on the
//! main thread (whose lane stays open, see `engine.rs`), the worker's turn on a spawned
//! one. Checked: no wake-up is lost (a `Sleep` left pending is woken through the waker it
//! was last polled with), none comes early, a dropped `Sleep` is woken at most once and only
//! if its timer fired, and every node and waker clone is given back.
#![cfg(loom)]

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use corewheel::{PendingTimers, Sleep, TimerEngine};
use corewheel_loom_tests::{Wakes, counting, engine, model, settle, ticks};
use loom::sync::Arc;
use loom::thread;

fn count(wakes: &Wakes) -> usize {
    wakes.count()
}

fn poll(sleep: &mut Sleep<'_>, waker: &Waker) -> Poll<()> {
    Pin::new(sleep).poll(&mut Context::from_waker(waker))
}

/// A `Sleep` due in 3 ticks, polled with `waker`, and filed in the worker's wheel: a plain
/// timer due in one tick, on the same lane, makes the turn at that tick take the lane, and
/// with it the sleep's timer. On return the clock stands one tick after the arming.
fn filed_sleep<'e>(
    engine: &'e TimerEngine,
    clock: &corewheel::ManualClock,
    waker: &Waker,
) -> Sleep<'e> {
    let mut sleep = engine.sleep(ticks(3));
    assert!(poll(&mut sleep, waker).is_pending());
    engine
        .schedule(ticks(1), || {})
        .expect("the engine is running");
    clock.advance(ticks(1));
    assert_eq!(engine.turn(), 1, "only the plain timer is due now");
    sleep
}

/// Turning at the deadline from another thread while the task polls with a new waker: the
/// wake goes to the waker the node held when it fired, and a poll that returned `Pending`
/// means that was the new one. (A worker that finds the waker being written fires the
/// timer a tick later, as it does for a reset.)
#[test]
fn a_new_waker_racing_the_fire_is_never_lost() {
    model(None, || {
        let (engine, clock) = engine();
        let (first, first_waker) = counting();
        let (second, second_waker) = counting();
        let mut sleep = filed_sleep(&engine, &clock, &first_waker);
        clock.advance(ticks(2));
        let worker = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || engine.turn())
        };
        let polled = poll(&mut sleep, &second_waker);
        let mut fired = worker.join().unwrap();
        if fired == 0 {
            // The new waker was being written as the worker looked: a locked timer is
            // looked at again a tick later.
            assert!(polled.is_pending());
            assert_eq!(count(&second), 0, "never early");
            clock.advance(ticks(1));
            fired = engine.turn();
        }
        assert_eq!(fired, 1, "due: it fires");
        match polled {
            Poll::Pending => assert_eq!((count(&first), count(&second)), (0, 1)),
            Poll::Ready(()) => assert_eq!((count(&first), count(&second)), (1, 0)),
        }
        assert_eq!(poll(&mut sleep, &second_waker), Poll::Ready(()));
        drop(sleep);
        assert_eq!(settle(&engine, &clock), 0);
        assert_eq!(engine.nodes_in_use(), 0);
        assert_eq!(
            std::sync::Arc::strong_count(&first),
            2,
            "only the test's waker"
        );
        assert_eq!(
            std::sync::Arc::strong_count(&second),
            2,
            "only the test's waker"
        );
    });
}

/// Turning at the old deadline while the task pushes the deadline back. A later deadline
/// leaves the timer where it is, so the old timer fires and wakes the task, whose poll
/// arms the new deadline: pending until then, and completed there, woken.
#[test]
fn a_reset_racing_the_fire_is_never_early_and_never_lost() {
    model(None, || {
        let (engine, clock) = engine();
        let (wakes, waker) = counting();
        let mut sleep = filed_sleep(&engine, &clock, &waker);
        clock.advance(ticks(2));
        let later = engine.now() + ticks(2);
        let worker = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || engine.turn())
        };
        sleep.reset(later);
        assert_eq!(worker.join().unwrap(), 1, "the old timer fires");
        assert_eq!(count(&wakes), 1, "and wakes the task, to poll");
        assert!(
            !sleep.is_elapsed(),
            "reset to later: not elapsed at the old deadline"
        );
        assert!(poll(&mut sleep, &waker).is_pending(), "never early");
        clock.advance(ticks(1));
        engine.turn();
        assert!(poll(&mut sleep, &waker).is_pending(), "never early");
        clock.advance(ticks(1));
        assert_eq!(engine.turn(), 1, "fires at the new deadline");
        assert_eq!(count(&wakes), 2, "and wakes the task");
        assert_eq!(poll(&mut sleep, &waker), Poll::Ready(()));
        drop(sleep);
        assert_eq!(settle(&engine, &clock), 0);
        assert_eq!(engine.nodes_in_use(), 0);
    });
}

/// Turning at a tick before the deadline while the task brings the deadline forward to
/// that tick: whichever wins, the timer fires at most a tick after the new deadline (a
/// worker that finds it being moved looks again a tick later), once, and wakes the task.
#[test]
fn a_reset_earlier_racing_the_turn_is_never_lost() {
    model(None, || {
        let (engine, clock) = engine();
        let (wakes, waker) = counting();
        let mut sleep = filed_sleep(&engine, &clock, &waker);
        clock.advance(ticks(1));
        let sooner = engine.now();
        let worker = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || engine.turn())
        };
        sleep.reset(sooner);
        let mut fired = worker.join().unwrap();
        for _ in 0..1 {
            if fired == 1 {
                break;
            }
            assert_eq!(count(&wakes), 0);
            clock.advance(ticks(1));
            fired = engine.turn();
        }
        assert_eq!(fired, 1, "fired within a tick of the new deadline");
        assert_eq!(count(&wakes), 1, "and woke the task once");
        assert_eq!(poll(&mut sleep, &waker), Poll::Ready(()));
        drop(sleep);
        assert_eq!(settle(&engine, &clock), 0);
        assert_eq!(engine.nodes_in_use(), 0);
    });
}

/// Turning at the deadline while the task drops its `Sleep`: the waker is woken exactly
/// when the worker ran the wake (the drop defused it, or came too late to), at most once,
/// and the node and the waker's clone are given back.
#[test]
fn a_sleep_dropped_as_it_fires_is_woken_at_most_once_and_released() {
    model(None, || {
        let (engine, clock) = engine();
        let (wakes, waker) = counting();
        let sleep = filed_sleep(&engine, &clock, &waker);
        clock.advance(ticks(2));
        let worker = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || engine.turn())
        };
        drop(sleep);
        let fired = worker.join().unwrap();
        assert!(fired <= 1);
        assert_eq!(count(&wakes), fired, "woken if and only if the wake ran");
        assert_eq!(settle(&engine, &clock), 0);
        assert_eq!(engine.nodes_in_use(), 0);
        assert_eq!(
            std::sync::Arc::strong_count(&wakes),
            2,
            "only the test's waker"
        );
    });
}

/// A shutdown that drops pending timers, racing the task dropping its `Sleep`: the dropped
/// one is woken at most once, and a `Sleep` still alive at the shutdown is woken (its task
/// must not wait for a timer that will never fire).
#[test]
fn a_shutdown_racing_a_drop_wakes_only_live_sleeps() {
    model(None, || {
        let (engine, clock) = engine();
        let (kept_wakes, kept_waker) = counting();
        let (dropped_wakes, dropped_waker) = counting();
        let mut kept = filed_sleep(&engine, &clock, &kept_waker);
        let dropped = filed_sleep(&engine, &clock, &dropped_waker);
        let stopper = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || engine.shutdown(PendingTimers::Drop))
        };
        drop(dropped);
        stopper.join().unwrap();
        assert!(count(&dropped_wakes) <= 1);
        assert_eq!(count(&kept_wakes), 1, "the live sleep's task was woken");
        assert_eq!(poll(&mut kept, &kept_waker), Poll::Ready(()));
        drop(kept);
        assert_eq!(engine.nodes_in_use(), 0);
        assert_eq!(std::sync::Arc::strong_count(&dropped_wakes), 2);
        assert_eq!(std::sync::Arc::strong_count(&kept_wakes), 2);
    });
}
