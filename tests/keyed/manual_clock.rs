//! `KeyedTimers` on a manual clock, one test per behaviour go-zero's `TimingWheel` documents
//! in its own tests (named after them), and what a Rust user adds: values never lost,
//! refusals typed, and the handler free to call back in.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{Seen, manual, recording, run_for};
use corewheel::{KeyedTimers, Refused, ScheduleError, TimerEngine};

const MS: Duration = Duration::from_millis(1);

fn seen(seen: &Seen) -> Vec<(u32, u32, u64)> {
    seen.lock().unwrap().clone()
}

#[test]
fn set_timer_fires_at_its_deadline_with_its_value() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let (timers, handled) = recording(&engine, &clock);
    assert_eq!(timers.set(1, 10, Duration::from_millis(40)), Ok(None));
    assert!(timers.contains(&1));
    assert_eq!(timers.len(), 1);
    assert_eq!(timers.peek(&1, |value| *value), Some(10));
    assert_eq!(timers.peek(&2, |value| *value), None);
    run_for(&engine, &clock, 39);
    assert!(seen(&handled).is_empty(), "never early");
    run_for(&engine, &clock, 1);
    assert_eq!(seen(&handled), [(1, 10, 40)]);
    assert!(!timers.contains(&1));
    assert_eq!(timers.peek(&1, |value| *value), None, "expired: gone");
    assert!(timers.is_empty());
    drop(timers);
    assert_eq!(engine.nodes_in_use(), 0);
}

#[test]
fn set_timer_twice_replaces_value_and_deadline() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let (timers, handled) = recording(&engine, &clock);
    timers.set(1, 10, Duration::from_millis(40)).unwrap();
    run_for(&engine, &clock, 10);
    assert_eq!(
        timers.set(1, 11, Duration::from_millis(40)),
        Ok(Some(10)),
        "the old value comes back"
    );
    run_for(&engine, &clock, 39);
    assert!(
        seen(&handled).is_empty(),
        "the old deadline (40) passed without a fire"
    );
    run_for(&engine, &clock, 1);
    assert_eq!(seen(&handled), [(1, 11, 50)], "once, with the new value");
    assert_eq!(timers.len(), 0);
}

#[test]
fn set_timer_soon_fires_on_the_next_tick() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let (timers, handled) = recording(&engine, &clock);
    timers.set(1, 1, Duration::from_micros(10)).unwrap();
    timers.set(2, 2, Duration::ZERO).unwrap();
    engine.turn();
    assert!(
        seen(&handled).iter().all(|&(key, ..)| key == 2),
        "10 us: not before its deadline's tick (a zero delay is due now)"
    );
    run_for(&engine, &clock, 1);
    let mut got = seen(&handled);
    got.sort_unstable();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0], (1, 1, 1), "10 us: on the next tick");
    assert_eq!((got[1].0, got[1].1), (2, 2));
}

#[test]
fn set_timer_with_an_absurd_delay_never_fires_and_never_panics() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let (timers, handled) = recording(&engine, &clock);
    timers.set(1, 1, Duration::MAX).unwrap();
    run_for(&engine, &clock, 5);
    clock.advance(Duration::from_secs(86_400 * 365));
    engine.turn();
    assert!(seen(&handled).is_empty());
    assert!(timers.contains(&1));
    assert!(timers.move_to(&1, MS));
    run_for(&engine, &clock, 1);
    assert_eq!(seen(&handled).len(), 1);
}

#[test]
fn set_timer_after_close_is_refused_with_the_value() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let (timers, _handled) = recording(&engine, &clock);
    timers.set(1, 10, Duration::from_secs(1)).unwrap();
    let mut stopped = Vec::new();
    assert_eq!(timers.stop(|key, value| stopped.push((key, value))), 1);
    assert_eq!(stopped, [(1, 10)]);
    assert!(timers.is_stopped());
    let refused = timers.set(2, 20, Duration::from_secs(1)).unwrap_err();
    assert_eq!((refused.value, refused.reason), (20, Refused::Stopped));
    assert_eq!(timers.len(), 0);
}

#[test]
fn set_timer_on_a_shut_down_engine_is_refused_with_the_value() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let (timers, handled) = recording(&engine, &clock);
    engine.shutdown(corewheel::PendingTimers::Drop);
    let refused = timers.set(1, 10, MS).unwrap_err();
    assert_eq!(refused.value, 10);
    assert_eq!(refused.reason, Refused::Engine(ScheduleError::Shutdown));
    assert!(seen(&handled).is_empty());
}

#[test]
fn move_timer_later() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let (timers, handled) = recording(&engine, &clock);
    timers.set(1, 10, Duration::from_millis(20)).unwrap();
    run_for(&engine, &clock, 10);
    assert!(timers.move_to(&1, Duration::from_millis(30)));
    run_for(&engine, &clock, 29);
    assert!(seen(&handled).is_empty(), "not at 20, not at 39");
    run_for(&engine, &clock, 1);
    assert_eq!(seen(&handled), [(1, 10, 40)]);
}

#[test]
fn move_timer_earlier() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let (timers, handled) = recording(&engine, &clock);
    timers.set(1, 10, Duration::from_millis(50)).unwrap();
    run_for(&engine, &clock, 10);
    assert!(timers.move_to(&1, Duration::from_millis(5)));
    run_for(&engine, &clock, 4);
    assert!(seen(&handled).is_empty());
    run_for(&engine, &clock, 1);
    assert_eq!(seen(&handled), [(1, 10, 15)]);
    run_for(&engine, &clock, 60);
    assert_eq!(
        seen(&handled).len(),
        1,
        "the old deadline does not fire it again"
    );
}

#[test]
fn move_timer_soon_fires_on_the_next_tick() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let (timers, handled) = recording(&engine, &clock);
    timers.set(1, 10, Duration::from_secs(60)).unwrap();
    assert!(timers.move_to(&1, Duration::ZERO));
    run_for(&engine, &clock, 1);
    assert_eq!(seen(&handled), [(1, 10, 1)]);
}

#[test]
fn move_of_a_missing_key_is_a_no_op() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let (timers, handled) = recording(&engine, &clock);
    assert!(!timers.move_to(&7, MS));
    timers.set(1, 10, MS).unwrap();
    run_for(&engine, &clock, 1);
    assert!(!timers.move_to(&1, MS), "fired: gone");
    assert!(!timers.contains(&1));
    run_for(&engine, &clock, 5);
    assert_eq!(seen(&handled), [(1, 10, 1)]);
}

#[test]
fn set_and_move_twice() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let (timers, handled) = recording(&engine, &clock);
    timers.set(1, 10, Duration::from_millis(10)).unwrap();
    assert!(timers.move_to(&1, Duration::from_millis(30)));
    assert!(timers.move_to(&1, Duration::from_millis(20)));
    run_for(&engine, &clock, 19);
    assert!(seen(&handled).is_empty());
    run_for(&engine, &clock, 20);
    assert_eq!(seen(&handled), [(1, 10, 20)], "once, at the last move");
}

#[test]
fn remove_timer_hands_the_value_back_and_never_fires() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let (timers, handled) = recording(&engine, &clock);
    timers.set(1, 10, Duration::from_millis(10)).unwrap();
    assert_eq!(timers.remove(&1), Some(10));
    assert_eq!(timers.remove(&1), None, "a second remove finds nothing");
    run_for(&engine, &clock, 20);
    assert!(seen(&handled).is_empty());
    assert_eq!(
        engine.nodes_in_use(),
        0,
        "the cancelled timer's node is back"
    );
}

#[test]
fn remove_then_set_starts_afresh() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let (timers, handled) = recording(&engine, &clock);
    timers.set(1, 10, Duration::from_millis(10)).unwrap();
    run_for(&engine, &clock, 5);
    assert_eq!(timers.remove(&1), Some(10));
    assert_eq!(timers.set(1, 11, Duration::from_millis(10)), Ok(None));
    run_for(&engine, &clock, 9);
    assert!(
        seen(&handled).is_empty(),
        "not at the removed timer's deadline (10)"
    );
    run_for(&engine, &clock, 1);
    assert_eq!(seen(&handled), [(1, 11, 15)]);
}

#[test]
fn move_and_remove() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let (timers, handled) = recording(&engine, &clock);
    timers.set(1, 10, Duration::from_millis(10)).unwrap();
    assert!(timers.move_to(&1, Duration::from_millis(3)));
    assert_eq!(timers.remove(&1), Some(10));
    run_for(&engine, &clock, 20);
    assert!(seen(&handled).is_empty());
}

#[test]
fn elapsed_and_set_fires_again() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let (timers, handled) = recording(&engine, &clock);
    timers.set(1, 10, Duration::from_millis(5)).unwrap();
    run_for(&engine, &clock, 5);
    assert_eq!(
        timers.set(1, 11, Duration::from_millis(5)),
        Ok(None),
        "a new key"
    );
    assert!(timers.move_to(&1, Duration::from_millis(10)));
    run_for(&engine, &clock, 10);
    assert_eq!(seen(&handled), [(1, 10, 5), (1, 11, 15)]);
}

#[test]
fn drain_hands_every_pending_entry_over_and_leaves_nothing() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let (timers, handled) = recording(&engine, &clock);
    timers.set(1, 10, Duration::from_millis(4)).unwrap();
    timers.set(2, 20, Duration::from_millis(7)).unwrap();
    timers.set(3, 30, Duration::from_millis(7)).unwrap();
    run_for(&engine, &clock, 4);
    let mut drained = Vec::new();
    assert_eq!(timers.drain(|key, value| drained.push((key, value))), 2);
    drained.sort_unstable();
    assert_eq!(drained, [(2, 20), (3, 30)]);
    assert!(timers.is_empty());
    run_for(&engine, &clock, 10);
    assert_eq!(seen(&handled), [(1, 10, 4)], "drained keys never fire");
    assert_eq!(timers.set(4, 40, MS), Ok(None), "a drain does not stop");
}

#[test]
fn drop_cancels_every_timer_and_drops_the_values() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let dropped = Arc::new(());
    let handled = Arc::new(Mutex::new(0));
    let sink = Arc::clone(&handled);
    let timers = KeyedTimers::with_engine(&engine, move |_: u32, _: Arc<()>| {
        *sink.lock().unwrap() += 1;
    });
    for key in 0..100 {
        timers
            .set(key, Arc::clone(&dropped), Duration::from_millis(5))
            .unwrap();
    }
    drop(timers);
    run_for(&engine, &clock, 10);
    assert_eq!(*handled.lock().unwrap(), 0);
    assert_eq!(Arc::strong_count(&dropped), 1, "every value dropped");
    assert_eq!(engine.nodes_in_use(), 0);
}

/// A repeating TTL: the handler sets its key again.
#[test]
fn the_handler_may_set_its_key_again() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let fires = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&fires);
    let slot: Arc<Mutex<Option<&'static KeyedTimers<'static, u32, u32>>>> = Arc::default();
    let again = Arc::clone(&slot);
    let engine: &'static TimerEngine = Box::leak(Box::new(engine));
    let start = engine.now();
    let timers: &'static KeyedTimers<'static, u32, u32> = Box::leak(Box::new(
        KeyedTimers::with_engine(engine, move |key, round| {
            sink.lock()
                .unwrap()
                .push((round, (engine.now() - start).as_millis()));
            if round < 3 {
                let timers = again.lock().unwrap().expect("set before the first fire");
                timers
                    .set(key, round + 1, Duration::from_millis(10))
                    .unwrap();
            }
        }),
    ));
    *slot.lock().unwrap() = Some(timers);
    timers.set(9, 1, Duration::from_millis(10)).unwrap();
    run_for(engine, &clock, 50);
    assert_eq!(*fires.lock().unwrap(), [(1, 10), (2, 20), (3, 30)]);
    assert!(timers.is_empty());
}

#[test]
fn a_panicking_handler_is_contained_and_counted() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let timers = KeyedTimers::with_engine(&engine, |key: u32, _: u32| {
        if key == 1 {
            panic!("handler failure (expected by the test)");
        }
    });
    timers.set(1, 1, MS).unwrap();
    timers.set(2, 2, MS).unwrap();
    run_for(&engine, &clock, 1);
    assert!(timers.is_empty(), "both fired");
    assert_eq!(engine.stats().total.panicked, 1);
    assert_eq!(timers.set(1, 1, MS), Ok(None), "still usable");
}
