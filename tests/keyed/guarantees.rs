//! `KeyedTimers`' documented guarantees under misuse. The tests marked "Fixed:" check a
//! fault since fixed (or, where the behaviour stayed and the docs changed, the documented
//! behaviour).

use crate::support;

use std::hash::{Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::support::{Live, Witness, leaked_unpinned, manual, recording, run_for, within};
use corewheel::{Clock, KeyedTimers, ManualClock, PendingTimers, Refused, TimerEngine};

const MS: Duration = Duration::from_millis(1);

// ---------------------------------------------------------------------------------------
// Findings
// ---------------------------------------------------------------------------------------

/// Fixed, as a contradiction with the docs, which said entries pending at
/// shutdown stay and their timers never fire: with `PendingTimers::Run` the engine runs
/// every pending callback at shutdown, so the handler gets every key then, early. The docs
/// now say so; this checks it, and that `Drop` mode leaves the entry in the map.
#[test]
fn shutdown_run_hands_pending_keys_to_the_handler_as_documented() {
    let _serial = support::serial();
    for (mode, handed) in [(PendingTimers::Run, true), (PendingTimers::Drop, false)] {
        let (engine, clock) = manual(1);
        let (timers, seen) = recording(&engine, &clock);
        timers.set(1, 10, Duration::from_secs(3600)).unwrap();
        run_for(&engine, &clock, 5);
        engine.shutdown(mode);
        let got: Vec<u32> = seen.lock().unwrap().iter().map(|seen| seen.1).collect();
        assert_eq!(got, if handed { vec![10] } else { vec![] }, "{mode:?}");
        assert_eq!(timers.contains(&1), !handed, "{mode:?}");
    }
}

// Fixed: `peek`'s closure runs under a shared lock on the key's shard of
// the map, so a `set` or `remove` of another key in that shard from inside it waits for
// ever. The docs said only "not for the same key"; they now forbid any change from inside
// `peek` (reads are fine: `peek_closure_reading_other_keys_is_fine`). The test that hung a
// thread to show it is gone: it can only hang.

/// A key type whose `Eq` is not reflexive (a float key holding NaN, a common mistake).
#[derive(Clone, Copy, Debug)]
struct FloatKey(f64);
impl PartialEq for FloatKey {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for FloatKey {}
impl Hash for FloatKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

/// A key whose `Eq` misbehaves must not hang `stop` (fixed: it spun for
/// ever, as `drain` found nothing by key; `drain` now empties the map in place).
#[test]
fn stop_with_a_non_reflexive_key_ends() {
    let _serial = support::serial();
    let engine: &'static TimerEngine = leaked_unpinned(1);
    let timers: &'static KeyedTimers<'static, FloatKey, u32> =
        Box::leak(Box::new(KeyedTimers::with_engine(engine, |_, _| {})));
    timers
        .set(FloatKey(f64::NAN), 1, Duration::from_secs(60))
        .unwrap();
    assert_eq!(timers.len(), 1);
    // The spinning thread is left behind: it is the finding.
    let handed = within(Duration::from_secs(20), "stop with a NaN key", move || {
        timers.stop(|_, _| {})
    });
    assert_eq!(handed, 1);
}

/// Values whose `Drop` panics once, globally.
static BOMB_ARMED: AtomicBool = AtomicBool::new(false);
#[allow(dead_code)]
struct Bomb(Witness);
impl Drop for Bomb {
    fn drop(&mut self) {
        if BOMB_ARMED.swap(false, Ordering::SeqCst) {
            panic!("value drop failure (expected by the test)");
        }
    }
}

/// `Drop` documents "cancelling every pending timer and dropping its value, so that
/// nothing reaches the handler afterwards". Fixed: one value whose `Drop`
/// panicked unwound out of the map's `retain`, leaving every entry after it armed, to fire
/// into the handler after the drop. Now every timer is cancelled first, and each value is
/// dropped on its own with its panic caught.
#[test]
fn a_panicking_value_drop_in_drop_leaves_nothing_armed() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let live = Live::default();
    let handled = Arc::new(AtomicUsize::new(0));
    let sink = Arc::clone(&handled);
    let timers = KeyedTimers::with_engine(&engine, move |_: u32, _: Bomb| {
        sink.fetch_add(1, Ordering::SeqCst);
    });
    for key in 0..64 {
        assert!(
            timers
                .set(key, Bomb(live.witness()), Duration::from_millis(5))
                .is_ok()
        );
    }
    BOMB_ARMED.store(true, Ordering::SeqCst);
    let dropped = catch_unwind(AssertUnwindSafe(|| drop(timers)));
    assert!(
        dropped.is_ok(),
        "the bomb's panic is caught inside KeyedTimers::drop"
    );
    assert!(!BOMB_ARMED.load(Ordering::SeqCst), "the bomb went off");
    let live_after_drop = live.count();
    run_for(&engine, &clock, 10);
    assert_eq!(
        (live_after_drop, handled.load(Ordering::SeqCst)),
        (0, 0),
        "(values still alive after the drop, keys handed to the handler after the drop)"
    );
}

/// A key whose `Drop` panics once (only when armed).
static KEY_BOMB_ARMED: AtomicBool = AtomicBool::new(false);
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct BombKey(u32);
impl Drop for BombKey {
    fn drop(&mut self) {
        if KEY_BOMB_ARMED.swap(false, Ordering::SeqCst) {
            panic!("key drop failure (expected by the test)");
        }
    }
}

/// `set` over a pending key drops a key (the one it was given, or its clone) after the
/// old value was swapped out. Fixed: a panicking key `Drop` there unwound
/// past a return value holding the replaced value, which leaked. Now the keys are dropped
/// while the value is still a local, so the unwinding drops it.
#[test]
fn a_panicking_key_drop_in_set_drops_the_replaced_value() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let live = Live::default();
    let handled = Arc::new(AtomicUsize::new(0));
    let sink = Arc::clone(&handled);
    let timers = KeyedTimers::with_engine(&engine, move |_: BombKey, _: Witness| {
        sink.fetch_add(1, Ordering::SeqCst);
    });
    assert!(
        timers
            .set(BombKey(1), live.witness(), Duration::from_secs(10))
            .is_ok()
    );
    let second = live.witness();
    KEY_BOMB_ARMED.store(true, Ordering::SeqCst);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        timers.set(BombKey(1), second, Duration::from_secs(10))
    }));
    KEY_BOMB_ARMED.store(false, Ordering::SeqCst);
    assert!(outcome.is_err(), "set panicked with the key's Drop");
    assert_eq!(timers.len(), 1, "the map still holds the key");
    let kept = timers.remove(&BombKey(1));
    assert!(kept.is_some());
    drop(kept);
    drop(timers);
    run_for(&engine, &clock, 20);
    assert_eq!(handled.load(Ordering::SeqCst), 0);
    // Two values were made; one came back from `remove` and was dropped, and the replaced
    // one was dropped by the unwinding.
    assert_eq!(
        live.count(),
        0,
        "the replaced value leaked, handed to nobody"
    );
}

thread_local! {
    static TRAP_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}
static TRAP_ARMED: AtomicBool = AtomicBool::new(false);
static TRAP: Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>> = Mutex::new(None);

/// A key whose `Hash`, once armed and on a trapping thread, signals and waits: it holds an
/// expiring timer's callback at the start of `expire`, before `remove_if` takes the lock.
#[derive(Clone, PartialEq, Eq, Debug)]
struct TrapKey(u32);
impl Hash for TrapKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        if TRAP_HERE.with(|here| here.get()) && TRAP_ARMED.swap(false, Ordering::SeqCst) {
            let (reached, release) = TRAP.lock().unwrap().take().unwrap();
            reached.send(()).unwrap();
            release.recv().unwrap();
        }
        self.0.hash(state);
    }
}

/// Fixed: `expire` took the slot whenever the slot's timer was not pending,
/// without checking that it was its own. A `set` that lands while the old timer is firing
/// arms a new timer (T2) on the setter's home shard; if the engine then shuts down with
/// `PendingTimers::Drop`, T2 is dropped (not pending), and the old callback took the *new*
/// value and handed it to the handler at once, long before its 10 s deadline. Now each
/// timer carries its `set`'s token, and a fire takes only the slot with its own.
#[test]
fn a_stale_fire_never_takes_a_newer_value() {
    let _serial = support::serial();
    let (engine, clock) = manual(2);
    let engine: &'static TimerEngine = Box::leak(Box::new(engine));
    let seen: Arc<Mutex<Vec<(u32, u32, u64)>>> = Arc::default();
    let sink = Arc::clone(&seen);
    let start = clock.now();
    let handler_clock = clock.clone();
    let timers: &'static KeyedTimers<'static, TrapKey, u32> = Box::leak(Box::new(
        KeyedTimers::with_engine(engine, move |key: TrapKey, value| {
            let ms = (handler_clock.now() - start).as_millis() as u64;
            sink.lock().unwrap().push((key.0, value, ms));
        }),
    ));
    // Find a thread whose home shard is `want`, and run `f` there.
    fn on_shard<R: Send + 'static>(
        engine: &'static TimerEngine,
        want: usize,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> R {
        let f = Arc::new(Mutex::new(Some(f)));
        loop {
            let f = Arc::clone(&f);
            let got = std::thread::spawn(move || {
                let before = engine.stats().shards[want].scheduled;
                let probe = engine.schedule(Duration::from_secs(999), || {}).unwrap();
                let home = engine.stats().shards[want].scheduled > before;
                engine.cancel(probe);
                if home {
                    Some((f.lock().unwrap().take().unwrap())())
                } else {
                    None
                }
            })
            .join()
            .unwrap();
            if let Some(got) = got {
                return got;
            }
        }
    }
    // T1, on shard 1 (the turner takes shard 0 first, and the shutdown's last turns go
    // in shard order, so shard 0's must not wait for the trapped turner).
    on_shard(engine, 1, move || timers.set(TrapKey(1), 10, MS).unwrap());
    let (reached_tx, reached_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    *TRAP.lock().unwrap() = Some((reached_tx, release_rx));
    clock.advance(MS);
    TRAP_ARMED.store(true, Ordering::SeqCst);
    let turner = std::thread::spawn(move || {
        TRAP_HERE.with(|here| here.set(true));
        engine.turn();
    });
    reached_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("T1's callback reached expire");
    // T1 is firing. A set from a thread homed on shard 0: reset fails, T2 is armed there.
    let replaced = on_shard(engine, 0, move || {
        timers.set(TrapKey(1), 20, Duration::from_secs(10))
    });
    assert_eq!(
        replaced,
        Ok(Some(10)),
        "the firing value came back from set"
    );
    // Shut down (Drop) on another thread: shard 0's last turn drops T2; shard 1's waits for
    // the turner.
    let shutter = std::thread::spawn(move || engine.shutdown(PendingTimers::Drop));
    let waited = Instant::now();
    while engine.stats().total.dropped_at_shutdown == 0 && waited.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(MS);
    }
    release_tx.send(()).unwrap();
    turner.join().unwrap();
    shutter.join().unwrap();
    let got = seen.lock().unwrap().clone();
    assert!(
        got.iter()
            .all(|&(_, value, ms)| value != 20 || ms >= 10_001),
        "value 20 (deadline 10 s) reached the handler at {got:?} (key, value, ms)"
    );
}

// ---------------------------------------------------------------------------------------
// Evidence: attacks that hold
// ---------------------------------------------------------------------------------------

/// The handler calls every method on the same `KeyedTimers`, for its own key and others,
/// including `drain` and finally `stop`: no deadlock, every value ends once.
#[test]
fn a_reentrant_handler_calling_everything_never_deadlocks_or_duplicates() {
    let _serial = support::serial();
    within(Duration::from_secs(20), "reentrant handler", || {
        let (engine, clock) = manual(2);
        let engine: &'static TimerEngine = Box::leak(Box::new(engine));
        let ends = Arc::new(Mutex::new(Vec::<u32>::new()));
        let made = Arc::new(AtomicUsize::new(0));
        let slot: Arc<std::sync::OnceLock<&'static KeyedTimers<'static, u32, u32>>> =
            Arc::default();
        let (me, e2, m2) = (Arc::clone(&slot), Arc::clone(&ends), Arc::clone(&made));
        let timers: &'static KeyedTimers<'static, u32, u32> = Box::leak(Box::new(
            KeyedTimers::with_engine(engine, move |key, value| {
                let t = me.get().unwrap();
                let end = |v: u32| e2.lock().unwrap().push(v);
                end(value);
                let _ = (
                    t.len(),
                    t.contains(&key),
                    t.is_empty(),
                    t.peek(&key, |v| *v),
                );
                let _ = t.move_to(&key, MS);
                let _ = t.move_to(&(key + 1), Duration::ZERO);
                if let Some(v) = t.remove(&(key ^ 1)) {
                    end(v);
                }
                let fresh = m2.fetch_add(1, Ordering::SeqCst) as u32 + 1000;
                match t.set(key, fresh, Duration::from_millis(u64::from(key % 3))) {
                    Ok(Some(v)) => end(v),
                    Ok(None) => {}
                    Err(refused) => end(refused.value),
                }
                let fresh2 = m2.fetch_add(1, Ordering::SeqCst) as u32 + 1000;
                match t.set(key, fresh2, MS) {
                    Ok(Some(v)) => end(v),
                    Ok(None) => {}
                    Err(refused) => end(refused.value),
                }
                if value % 7 == 0 {
                    t.drain(|_, v| end(v));
                }
                if value > 1400 {
                    t.stop(|_, v| end(v));
                }
            }),
        ));
        slot.set(timers).ok().unwrap();
        for key in 0..16 {
            timers
                .set(key, key, Duration::from_millis(u64::from(key % 4)))
                .unwrap();
        }
        run_for(engine, &clock, 500);
        timers.stop(|_, v| ends.lock().unwrap().push(v));
        let mut ends = ends.lock().unwrap().clone();
        ends.sort_unstable();
        let total = 16 + made.load(Ordering::SeqCst);
        let expected: Vec<u32> = (0..16)
            .chain(1000..1000 + made.load(Ordering::SeqCst) as u32)
            .collect();
        assert_eq!(ends.len(), total, "each value ends once");
        assert_eq!(ends, expected);
        assert!(timers.is_stopped() && timers.is_empty());
    });
}

/// Zero, tiny and absurd delays, on set and move: no panic, never early, the absurd ones
/// never fire.
#[test]
fn extreme_delays_never_panic_and_never_fire_early() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let (timers, seen) = recording(&engine, &clock);
    let delays = [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_micros(999),
        Duration::from_millis(1),
        Duration::from_secs(u64::MAX / 1000),
        Duration::from_secs(u64::MAX),
        Duration::MAX,
    ];
    for (key, &delay) in delays.iter().enumerate() {
        timers.set(key as u32, key as u32, delay).unwrap();
        assert!(timers.move_to(&(key as u32), delay));
        assert_eq!(
            timers.set(key as u32, key as u32 + 100, delay),
            Ok(Some(key as u32))
        );
    }
    engine.turn();
    run_for(&engine, &clock, 2);
    clock.advance(Duration::from_secs(86_400 * 365 * 100));
    engine.turn();
    let mut got: Vec<u32> = seen.lock().unwrap().iter().map(|s| s.1).collect();
    got.sort_unstable();
    assert_eq!(
        got,
        [100, 101, 102, 103],
        "the sub-ms and 1 ms delays fired"
    );
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .all(|&(k, _, ms)| k != 3 || ms >= 1)
    );
    assert_eq!(timers.len(), 3, "the absurd ones stay pending");
    assert_eq!(timers.stop(|_, _| {}), 3);
    assert_eq!(
        timers.set(9, 9, Duration::MAX).unwrap_err().reason,
        Refused::Stopped
    );
    drop(timers);
    // Cancels come back within the idle lane horizon (32 ticks) on an engine turned by hand.
    run_for(&engine, &clock, 33);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Nested read-only calls inside `peek` (other keys' `peek`, `contains`, `len`,
/// `move_to`) are fine: dashmap's read lock is shared and readers don't queue behind
/// parked writers.
#[test]
fn peek_closure_reading_other_keys_is_fine() {
    let _serial = support::serial();
    within(Duration::from_secs(10), "nested reads in peek", || {
        let (engine, _clock) = manual(1);
        let timers = KeyedTimers::with_engine(&engine, |_: u32, _: u32| {});
        for key in 0..64 {
            timers.set(key, key, Duration::from_secs(60)).unwrap();
        }
        for key in 0..64 {
            let sum = timers.peek(&key, |v| {
                let others: u32 = (0..64).filter_map(|o| timers.peek(&o, |w| *w)).sum();
                assert!(timers.move_to(&((key + 1) % 64), Duration::from_secs(30)));
                assert!(timers.contains(&key));
                *v + others + timers.len() as u32
            });
            assert_eq!(sum, Some(key + 2016 + 64));
        }
    });
}

/// Three threads hammer 64 keys with set/move/remove on a real 2-worker engine with 0-2
/// ms delays, while the handler re-sets and removes keys itself; then drop while timers
/// are firing. Every value ends exactly once (handed out or dropped by the drop), none
/// early; the engine's nodes all come back.
#[test]
fn hammering_few_keys_with_a_reentrant_handler_keeps_exactly_once() {
    let _serial = support::serial();
    within(Duration::from_secs(60), "hammer", || {
        let engine = leaked_unpinned(2);
        const N: usize = 200_000;
        let fates: Arc<Vec<AtomicUsize>> = Arc::new((0..N).map(|_| AtomicUsize::new(0)).collect());
        let next_id = Arc::new(AtomicUsize::new(0));
        let early = Arc::new(AtomicUsize::new(0));
        // A value records its fate when dropped: exactly one drop per id, wherever it ends.
        struct V {
            id: usize,
            not_before: Instant,
            fates: Arc<Vec<AtomicUsize>>,
        }
        impl Drop for V {
            fn drop(&mut self) {
                self.fates[self.id].fetch_add(1, Ordering::SeqCst);
            }
        }
        let slot: Arc<std::sync::OnceLock<Arc<KeyedTimers<'static, u8, V>>>> = Arc::default();
        let me = Arc::downgrade(&slot);
        let (ids, f2, e2) = (Arc::clone(&next_id), Arc::clone(&fates), Arc::clone(&early));
        let timers = Arc::new(KeyedTimers::with_engine(
            engine,
            move |key: u8, value: V| {
                if Instant::now() < value.not_before {
                    e2.fetch_add(1, Ordering::SeqCst);
                }
                let Some(slot) = me.upgrade() else { return };
                let Some(t) = slot.get() else { return };
                if value.id % 3 == 0 {
                    let id = ids.fetch_add(1, Ordering::SeqCst);
                    if id < N {
                        let v = V {
                            id,
                            not_before: Instant::now() + MS,
                            fates: Arc::clone(&f2),
                        };
                        let _ = t.set(key, v, MS);
                    }
                } else if value.id % 3 == 1 {
                    drop(t.remove(&(key ^ 1)));
                    let _ = t.len();
                }
            },
        ));
        slot.set(Arc::clone(&timers)).ok().unwrap();
        let stop_at = Instant::now() + Duration::from_millis(1500);
        let threads: Vec<_> = (0..3)
            .map(|thread: u64| {
                let (t, ids, fates) = (
                    Arc::clone(&timers),
                    Arc::clone(&next_id),
                    Arc::clone(&fates),
                );
                std::thread::spawn(move || {
                    let mut x = thread * 7919 + 1;
                    while Instant::now() < stop_at {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let key = (x % 64) as u8;
                        match x % 8 {
                            0..=3 => {
                                let id = ids.fetch_add(1, Ordering::SeqCst);
                                if id >= N {
                                    break;
                                }
                                let delay = Duration::from_micros(x % 2000);
                                let v = V {
                                    id,
                                    not_before: Instant::now() + delay,
                                    fates: Arc::clone(&fates),
                                };
                                drop(t.set(key, v, delay));
                            }
                            4 | 5 => {
                                let _ = t.move_to(&key, Duration::from_millis(2));
                            }
                            6 => drop(t.remove(&key)),
                            _ => {
                                let _ = t.peek(&key, |v| v.id);
                            }
                        }
                        if x % 16 == 0 {
                            // Let keys expire now and then, so that fires race the sets.
                            std::thread::sleep(Duration::from_micros(200));
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        drop(slot);
        // Drop while timers are still firing on the workers.
        // A handler may briefly hold the slot's clone: wait until this is the only owner.
        let mut timers = timers;
        let timers = loop {
            match Arc::try_unwrap(timers) {
                Ok(sole) => break sole,
                Err(back) => {
                    timers = back;
                    std::thread::sleep(MS);
                }
            }
        };
        drop(timers);
        std::thread::sleep(Duration::from_millis(50));
        engine.shutdown(PendingTimers::Drop);
        let made = next_id.load(Ordering::SeqCst).min(N);
        let stats = engine.stats().total;
        eprintln!("hammer: made {made}, {stats:?}");
        assert!(made > 1000, "made {made}");
        assert!(stats.fired > 1000, "timers fired: {stats:?}");
        let wrong: Vec<(usize, usize)> = (0..made)
            .map(|id| (id, fates[id].load(Ordering::SeqCst)))
            .filter(|&(_, n)| n != 1)
            .take(10)
            .collect();
        assert!(wrong.is_empty(), "values not ended exactly once: {wrong:?}");
        assert_eq!(early.load(Ordering::SeqCst), 0, "early fires");
        assert_eq!(engine.nodes_in_use(), 0, "nodes back after shutdown");
    });
}

/// Sets from several threads racing an engine shutdown (both modes), on a real engine:
/// every value ends once (refused, replaced, handled, or left in the map and stopped);
/// nothing hangs.
#[test]
fn sets_racing_engine_shutdown_lose_nothing() {
    let _serial = support::serial();
    for mode in [PendingTimers::Drop, PendingTimers::Run] {
        within(Duration::from_secs(30), "shutdown race", move || {
            let engine = Box::leak(Box::new(
                TimerEngine::builder()
                    .workers(2)
                    .pin_workers(false)
                    .build()
                    .unwrap(),
            ));
            let live = Live::default();
            let inner_alive = Live::default();
            let capture = inner_alive.witness();
            let handled = Arc::new(AtomicUsize::new(0));
            let h2 = Arc::clone(&handled);
            let timers = Arc::new(KeyedTimers::with_engine(
                &*engine,
                move |_: u32, _: Witness| {
                    let _ = &capture;
                    h2.fetch_add(1, Ordering::SeqCst);
                },
            ));
            let threads: Vec<_> = (0..2)
                .map(|thread| {
                    let (t, live) = (Arc::clone(&timers), live.clone());
                    std::thread::spawn(move || {
                        for n in 0..50_000_u32 {
                            let r = t.set(
                                n % 32,
                                live.witness(),
                                Duration::from_micros(u64::from(n % 1500) + thread),
                            );
                            if let Err(e) = r {
                                assert!(matches!(e.reason, Refused::Engine(_)));
                                break;
                            }
                        }
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(30));
            engine.shutdown(mode);
            for t in threads {
                t.join().unwrap();
            }
            let left = timers.stop(|_, _| {});
            assert!(timers.is_empty());
            let timers = Arc::into_inner(timers).unwrap();
            drop(timers);
            assert_eq!(
                live.count(),
                0,
                "every value dropped exactly once ({left} stopped)"
            );
            assert_eq!(
                inner_alive.count(),
                0,
                "no timer closure kept the shared state alive"
            );
            assert_eq!(engine.nodes_in_use(), 0, "{mode:?}: every node back");
        });
    }
}

/// After a mixed workload on a manual engine and the drop, every node returns to the pool,
/// and the engine's counts add up.
#[test]
fn nodes_come_back_and_stats_add_up() {
    let _serial = support::serial();
    let (engine, clock) = manual(2);
    {
        let (timers, seen) = recording(&engine, &clock);
        for round in 0..200_u32 {
            let key = round % 17;
            let _ = timers.set(key, round, Duration::from_millis(u64::from(round % 5)));
            if round % 3 == 0 {
                let _ = timers.move_to(&(key + 1), Duration::from_millis(2));
            }
            if round % 5 == 0 {
                let _ = timers.remove(&(key + 2));
            }
            run_for(&engine, &clock, 1);
        }
        assert!(!seen.lock().unwrap().is_empty());
        run_for(&engine, &clock, 3);
        timers.set(99, 1, Duration::from_secs(5)).unwrap();
        timers.set(98, 1, Duration::MAX).unwrap();
    }
    run_for(&engine, &clock, 33);
    assert_eq!(engine.nodes_in_use(), 0);
    let stats = engine.stats().total;
    assert_eq!(stats.pending, 0);
    assert_eq!(stats.panicked, 0);
    assert_eq!(stats.scheduled, stats.fired + stats.cancelled, "{stats:?}");
}

/// A handler that panics for some keys and blocks for a while on others: the rest still
/// fire, the map empties, panics are counted.
#[test]
fn panicking_and_slow_handlers_are_contained() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let timers = KeyedTimers::with_engine(&engine, |key: u32, _: String| {
        if key % 2 == 0 {
            panic!("handler failure (expected by the test)");
        }
        std::thread::sleep(Duration::from_millis(2));
    });
    for key in 0..20 {
        timers.set(key, format!("v{key}"), MS).unwrap();
    }
    run_for(&engine, &clock, 2);
    assert!(timers.is_empty());
    assert_eq!(engine.stats().total.panicked, 10);
    assert_eq!(timers.set(1, "again".into(), MS), Ok(None));
}

/// One key, two threads re-setting it with a 1 ms delay every 0.5-3 ms, so that
/// sets keep landing while its timer fires (the reset-fails, arm-anew path), and the
/// handler re-setting it too: every value ends exactly once, none early, at most one
/// pending timer per key once things settle.
#[test]
fn one_key_set_while_firing_keeps_exactly_once() {
    let _serial = support::serial();
    within(Duration::from_secs(30), "one-key race", || {
        let engine = leaked_unpinned(2);
        const N: usize = 100_000;
        let fates: Arc<Vec<AtomicUsize>> = Arc::new((0..N).map(|_| AtomicUsize::new(0)).collect());
        let early = Arc::new(AtomicUsize::new(0));
        let handled = Arc::new(AtomicUsize::new(0));
        struct V(usize, Instant, Arc<Vec<AtomicUsize>>);
        impl Drop for V {
            fn drop(&mut self) {
                self.2[self.0].fetch_add(1, Ordering::SeqCst);
            }
        }
        let (e2, h2) = (Arc::clone(&early), Arc::clone(&handled));
        let timers = Arc::new(KeyedTimers::with_engine(engine, move |_: u8, v: V| {
            if Instant::now() < v.1 {
                e2.fetch_add(1, Ordering::SeqCst);
            }
            h2.fetch_add(1, Ordering::SeqCst);
        }));
        let ids = Arc::new(AtomicUsize::new(0));
        let stop_at = Instant::now() + Duration::from_millis(1000);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (t, ids, fates) = (Arc::clone(&timers), Arc::clone(&ids), Arc::clone(&fates));
                std::thread::spawn(move || {
                    while Instant::now() < stop_at {
                        let id = ids.fetch_add(1, Ordering::SeqCst);
                        if id >= N {
                            break;
                        }
                        let v = V(id, Instant::now() + MS, Arc::clone(&fates));
                        drop(t.set(0, v, MS));
                        let spin =
                            Instant::now() + Duration::from_micros(500 + (id as u64 * 37 % 2500));
                        while Instant::now() < spin {
                            std::hint::spin_loop();
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        let timers = Arc::into_inner(timers).unwrap();
        assert!(timers.len() <= 1);
        drop(timers);
        engine.shutdown(PendingTimers::Drop);
        let made = ids.load(Ordering::SeqCst).min(N);
        let wrong: Vec<(usize, usize)> = (0..made)
            .map(|id| (id, fates[id].load(Ordering::SeqCst)))
            .filter(|&(_, n)| n != 1)
            .take(10)
            .collect();
        eprintln!(
            "one key: made {made}, handled {}",
            handled.load(Ordering::SeqCst)
        );
        assert!(wrong.is_empty(), "values not ended exactly once: {wrong:?}");
        assert_eq!(early.load(Ordering::SeqCst), 0, "early fires");
        assert!(
            handled.load(Ordering::SeqCst) > 10,
            "the key fired now and then"
        );
        assert_eq!(engine.nodes_in_use(), 0);
    });
}

/// Deadlines not on a tick boundary, on set, re-set and move: the handler never runs before
/// the exact deadline (the clock advanced in 100 us steps, turning at each).
#[test]
fn off_tick_deadlines_are_never_early() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let start = clock.now();
    let seen: Arc<Mutex<Vec<(u32, Duration)>>> = Arc::default();
    let sink = Arc::clone(&seen);
    let c2 = clock.clone();
    let timers = KeyedTimers::with_engine(&engine, move |key: u32, _: ()| {
        sink.lock().unwrap().push((key, c2.now() - start));
    });
    let mut deadlines = std::collections::HashMap::new();
    let step = Duration::from_micros(100);
    for i in 0..400_u32 {
        let key = i % 13;
        let delay = Duration::from_micros(u64::from(i * 7919 % 3000));
        let now = clock.now() - start;
        match i % 3 {
            0 | 1 => {
                let _ = timers.set(key, (), delay);
                deadlines.insert(key, now + delay);
            }
            _ => {
                if timers.move_to(&key, delay) {
                    deadlines.insert(key, now + delay);
                }
            }
        }
        clock.advance(step);
        engine.turn();
        for &(key, at) in seen.lock().unwrap().iter() {
            assert!(
                at >= deadlines[&key],
                "key {key} at {at:?}, deadline {:?}",
                deadlines[&key]
            );
        }
        seen.lock().unwrap().clear();
    }
}

/// The handler drops the last owner of the `KeyedTimers` on a worker thread while other
/// keys are pending and firing: no deadlock, no panic, every value dropped once.
#[test]
fn dropping_the_keyed_timers_from_its_own_handler_is_safe() {
    let _serial = support::serial();
    within(Duration::from_secs(20), "drop from the handler", || {
        let engine = leaked_unpinned(2);
        let live = Live::default();
        let owner: Arc<Mutex<Option<KeyedTimers<'static, u32, Witness>>>> = Arc::default();
        let in_handler = Arc::clone(&owner);
        let timers = KeyedTimers::with_engine(engine, move |key: u32, _: Witness| {
            if key == 0 {
                let taken = in_handler.lock().unwrap().take();
                drop(taken);
            }
        });
        for key in 1..2000 {
            assert!(
                timers
                    .set(
                        key,
                        live.witness(),
                        Duration::from_micros(u64::from(key % 3000))
                    )
                    .is_ok()
            );
        }
        assert!(
            timers
                .set(0, live.witness(), Duration::from_millis(1))
                .is_ok()
        );
        *owner.lock().unwrap() = Some(timers);
        let waited = Instant::now();
        while owner.lock().unwrap().is_some() && waited.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(MS);
        }
        assert!(
            owner.lock().unwrap().is_none(),
            "the handler ran and dropped it"
        );
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(live.count(), 0, "every value dropped");
    });
}

/// A full pool: `set` of a new key is refused with the value; `set` over a pending key
/// (a reset, no new node) still works; nothing is lost.
#[test]
fn a_full_pool_refuses_with_the_value_and_loses_nothing() {
    let _serial = support::serial();
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(1)
        .capacity(1)
        .manual_clock(clock.clone())
        .build();
    let Ok(engine) = engine else {
        return; // a capacity this small is refused at build: nothing to test
    };
    let live = Live::default();
    let timers = KeyedTimers::with_engine(&engine, |_: u32, _: Witness| {});
    let mut refused = 0;
    let mut accepted = Vec::new();
    for key in 0..5000_u32 {
        match timers.set(key, live.witness(), Duration::from_secs(60)) {
            Ok(None) => accepted.push(key),
            Ok(Some(_)) => unreachable!(),
            Err(error) => {
                assert_eq!(
                    error.reason,
                    Refused::Engine(corewheel::ScheduleError::Capacity)
                );
                refused += 1;
            }
        }
    }
    eprintln!("full pool: {} accepted, {refused} refused", accepted.len());
    assert_eq!(timers.len(), accepted.len());
    assert_eq!(
        live.count(),
        accepted.len(),
        "refused values came back and were dropped"
    );
    if let Some(&key) = accepted.first() {
        assert!(matches!(timers.set(key, live.witness(), MS), Ok(Some(_))));
    }
    run_for(&engine, &clock, 2);
    assert_eq!(live.count(), accepted.len() - 1);
    drop(timers);
    assert_eq!(live.count(), 0);
}

static HASH_BOMB_ARMED: AtomicBool = AtomicBool::new(false);
/// A key whose `Hash` panics once when armed.
#[derive(Clone, PartialEq, Eq, Debug)]
struct HashBomb(u32);
impl Hash for HashBomb {
    fn hash<H: Hasher>(&self, state: &mut H) {
        if HASH_BOMB_ARMED.swap(false, Ordering::SeqCst) {
            panic!("key hash failure (expected by the test)");
        }
        self.0.hash(state);
    }
}

/// A key's `Hash` panicking inside the timer's callback: the panic is contained and
/// counted, the map is not corrupted, and the key can be recovered. (Observation: the key
/// stays in the map with a dead timer, a "zombie": it never expires by itself, `move_to`
/// says `false` although `contains` says `true`, until a `set` or `remove` touches it.)
#[test]
fn a_key_hash_panicking_in_the_callback_leaves_a_recoverable_zombie() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let handled = Arc::new(AtomicUsize::new(0));
    let sink = Arc::clone(&handled);
    let timers = KeyedTimers::with_engine(&engine, move |_: HashBomb, _: u32| {
        sink.fetch_add(1, Ordering::SeqCst);
    });
    timers.set(HashBomb(1), 1, MS).unwrap();
    timers.set(HashBomb(2), 2, MS).unwrap();
    HASH_BOMB_ARMED.store(true, Ordering::SeqCst);
    run_for(&engine, &clock, 1);
    HASH_BOMB_ARMED.store(false, Ordering::SeqCst);
    assert_eq!(engine.stats().total.panicked, 1);
    assert_eq!(handled.load(Ordering::SeqCst), 1, "the other key fired");
    assert_eq!(timers.len(), 1, "the zombie stays");
    let zombie = if timers.contains(&HashBomb(1)) { 1 } else { 2 };
    run_for(&engine, &clock, 50);
    assert!(
        timers.contains(&HashBomb(zombie)),
        "it never expires by itself"
    );
    assert!(!timers.move_to(&HashBomb(zombie), MS));
    assert_eq!(timers.set(HashBomb(zombie), 9, MS), Ok(Some(zombie)));
    run_for(&engine, &clock, 1);
    assert_eq!(handled.load(Ordering::SeqCst), 2);
    assert!(timers.is_empty());
}
