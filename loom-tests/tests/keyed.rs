//! `KeyedTimers` against the worker firing a key's timer: a `set` over the key, a
//! `move_to`, a `remove` and dropping the `KeyedTimers`, each racing the turn at the key's
//! deadline. Under loom the map
//! is a `Mutex<HashMap>` with dashmap's surface, so these models check the key-state logic
//! (who takes the slot, and when a fire leaves it) over the engine's real code. Checked:
//! the value is handed out exactly once (to the handler, or back from the racing call),
//! the key never fires before its deadline, and every node goes back to the pool.
#![cfg(loom)]

use std::sync::Mutex;

use corewheel::{KeyedTimers, ManualClock, TimerEngine};
use corewheel_loom_tests::{engine, model, settle, ticks};
use loom::sync::Arc;
use loom::thread;

/// The values the handler was given. A std mutex, invisible to loom: read after the
/// worker's thread is joined or on the thread that turned.
type Handled = std::sync::Arc<Mutex<Vec<u32>>>;

fn keyed(engine: &TimerEngine) -> (KeyedTimers<'_, u32, u32>, Handled) {
    let handled = Handled::default();
    let sink = std::sync::Arc::clone(&handled);
    let timers = KeyedTimers::with_engine(engine, move |_, value| {
        sink.lock().unwrap().push(value);
    });
    (timers, handled)
}

fn handled(handled: &Handled) -> Vec<u32> {
    handled.lock().unwrap().clone()
}

/// Key 1 set to 10, due in a tick, and the clock moved to that tick; the worker's turn,
/// which fires it, runs on a spawned thread.
fn due_now<'e>(
    engine: &'e Arc<TimerEngine>,
    clock: &ManualClock,
) -> (
    KeyedTimers<'e, u32, u32>,
    Handled,
    thread::JoinHandle<usize>,
) {
    let (timers, seen) = keyed(engine);
    assert_eq!(timers.set(1, 10, ticks(1)), Ok(None));
    clock.advance(ticks(1));
    let worker = {
        let engine = Arc::clone(engine);
        thread::spawn(move || engine.turn())
    };
    (timers, seen, worker)
}

/// Turns `n` ticks, one at a time.
fn turn_ticks(engine: &TimerEngine, clock: &ManualClock, n: u32) {
    for _ in 0..n {
        clock.advance(ticks(1));
        engine.turn();
    }
}

#[test]
fn a_set_racing_the_fire_hands_each_value_out_once() {
    model(None, || {
        let (engine, clock) = engine();
        let (timers, seen, worker) = due_now(&engine, &clock);
        let replaced = timers.set(1, 20, ticks(2)).expect("the engine runs");
        worker.join().unwrap();
        // 10 went to the handler (the fire took the slot first) or came back from the
        // set (which took the lock first, whether or not the timer had begun to fire).
        match replaced {
            Some(old) => {
                assert_eq!(old, 10);
                assert!(
                    handled(&seen).is_empty(),
                    "10 handed out twice, or 20 early"
                );
            }
            None => assert_eq!(handled(&seen), [10]),
        }
        let before = handled(&seen).len();
        turn_ticks(&engine, &clock, 1);
        assert_eq!(
            handled(&seen).len(),
            before,
            "20 is due two ticks after its set"
        );
        turn_ticks(&engine, &clock, 1);
        assert_eq!(
            handled(&seen)[before..],
            [20],
            "20 fires once, at its deadline"
        );
        assert!(timers.is_empty());
        drop(timers);
        settle(&engine, &clock);
        assert_eq!(engine.nodes_in_use(), 0);
    });
}

#[test]
fn a_remove_racing_the_fire_hands_the_value_out_once() {
    model(None, || {
        let (engine, clock) = engine();
        let (timers, seen, worker) = due_now(&engine, &clock);
        let removed = timers.remove(&1);
        worker.join().unwrap();
        match removed {
            Some(value) => {
                assert_eq!(value, 10);
                assert!(handled(&seen).is_empty(), "removed, yet handled");
            }
            None => assert_eq!(handled(&seen), [10]),
        }
        turn_ticks(&engine, &clock, 2);
        assert!(handled(&seen).len() <= 1);
        assert!(timers.is_empty());
        settle(&engine, &clock);
        assert_eq!(engine.nodes_in_use(), 0);
    });
}

#[test]
fn a_move_racing_the_fire_is_never_early_and_never_lost() {
    model(None, || {
        let (engine, clock) = engine();
        let (timers, seen, worker) = due_now(&engine, &clock);
        let moved = timers.move_to(&1, ticks(2));
        worker.join().unwrap();
        if moved {
            // A worker that found the timer locked by the move fires it no earlier than
            // the moved deadline.
            assert!(
                handled(&seen).is_empty(),
                "moved, yet fired at the old deadline"
            );
            turn_ticks(&engine, &clock, 1);
            assert!(handled(&seen).is_empty(), "fired before the moved deadline");
            turn_ticks(&engine, &clock, 1);
        }
        assert_eq!(handled(&seen), [10], "fired exactly once");
        assert!(timers.is_empty());
        settle(&engine, &clock);
        assert_eq!(engine.nodes_in_use(), 0);
    });
}

/// Set when the handler is dropped. A static, so that the handler can look at it without reading its own
/// captures, which a premature free would have taken away; a std atomic, invisible to
/// loom: it only records. Only the model below uses it.
static FREED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set by the handler if it saw [`FREED`] while it ran.
static FREED_UNDER_HANDLER: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

fn freed() -> bool {
    FREED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Moved into the handler: sets [`FREED`] when the handler is dropped.
struct MarksFreed;

impl Drop for MarksFreed {
    fn drop(&mut self) {
        FREED.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Dropping the `KeyedTimers` while its worker fires the key: the handler is never dropped
/// while it runs and is gone by the fire's end, and the shared state the fire found through
/// the anchor is never freed while the fire's read section holds it (the model of
/// `grace` records each retire, and every section checks what it read against them; a
/// `retire` that does not wait for readers fails here).
#[test]
fn dropping_the_timers_racing_the_fire_never_drops_the_handler_under_itself() {
    model(None, || {
        FREED.store(false, std::sync::atomic::Ordering::SeqCst);
        FREED_UNDER_HANDLER.store(false, std::sync::atomic::Ordering::SeqCst);
        let (engine, clock) = engine();
        let handled = Handled::default();
        let timers = {
            let (marks, sink) = (MarksFreed, handled.clone());
            KeyedTimers::with_engine(&engine, move |_: u32, value: u32| {
                // A panic here would be caught and counted by the engine, so what the
                // handler sees is recorded and checked by the model's own thread.
                let before = freed();
                // The drop may run here; the state must outlive this call all the same.
                thread::yield_now();
                if before || freed() {
                    FREED_UNDER_HANDLER.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                let _ = &marks;
                sink.lock().unwrap().push(value);
            })
        };
        assert_eq!(timers.set(1, 10, ticks(1)), Ok(None));
        clock.advance(ticks(1));
        let worker = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || engine.turn())
        };
        drop(timers);
        // The handler goes with its `KeyedTimers`, or with the fire running it as that
        // fire returns: by the worker's end either way.
        worker.join().unwrap();
        assert!(
            freed(),
            "the handler outlived its KeyedTimers and its fires"
        );
        assert!(
            !FREED_UNDER_HANDLER.load(std::sync::atomic::Ordering::SeqCst),
            "the state was freed under the running handler"
        );
        assert!(handled.lock().unwrap().len() <= 1, "10 handled twice");
        settle(&engine, &clock);
        assert_eq!(engine.nodes_in_use(), 0);
    });
}
