//! `KeyedTimers`' slot table: timers find their state through a process-wide slot table
//! (`src/keyed/anchor.rs`) read inside crossbeam-epoch sections (`src/sync/grace.rs`),
//! not through an `Arc` each. The cases: slot reuse by owners of the same `K, V` types
//! while stale timers fire into the new owner's map; handlers that outlive, or drop, their
//! own `KeyedTimers`; panics in handler captures, key drops and values around the table;
//! thread exit and engine shutdown racing owner churn; memory under 100k owners; when the
//! handler's captures are really dropped; and `Send`/`Sync`.
//!
//! The slot table's free list and crossbeam-epoch's collector are process-wide, so every
//! test here holds [`serial`]: another test's open section or fresh owner would change
//! which slot an owner gets and when a deferred free runs. Three tests, marked "Fixed:",
//! check faults since fixed (a handler's captures dropped late, or in other owners' fires
//! and drops).

use crate::support;

use std::cell::RefCell;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::support::{Live, Witness, leaked_unpinned, manual, run_for, within};
use corewheel::{KeyedTimers, ManualClock, PendingTimers, TimerEngine};

const MS: Duration = Duration::from_millis(1);
const HOUR: Duration = Duration::from_secs(3600);

/// Holds a crossbeam-epoch section open on a thread of its own until the returned closure
/// is called, as a handler running on some worker would: frees retired meanwhile are
/// deferred.
fn hold_a_section_open() -> impl FnOnce() {
    let (pinned_tx, pinned_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let guard = crossbeam_epoch::pin();
        pinned_tx.send(()).unwrap();
        let _ = release_rx.recv();
        drop(guard);
    });
    pinned_rx.recv().unwrap();
    move || {
        release_tx.send(()).unwrap();
        holder.join().unwrap();
    }
}

/// A value that says which owner it was set on, when it may first be handed out, and is
/// counted while alive.
struct Tagged {
    owner: usize,
    id: usize,
    not_before: Instant,
    _live: Witness,
}

impl std::fmt::Debug for Tagged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tagged({}, {})", self.owner, self.id)
    }
}

// ---------------------------------------------------------------------------------------
// Slot reuse: stale fires landing in a new owner's map
// ---------------------------------------------------------------------------------------

static KEY_DROP_BOMB: AtomicBool = AtomicBool::new(false);
static KEY_EQ_CALLS: AtomicUsize = AtomicUsize::new(0);

/// A key whose `Drop` panics once when armed, and whose `Eq` is counted: a fire that looks
/// its key up in a map holding it compares once.
#[derive(Clone, Debug)]
struct CountedKey(u32);
impl PartialEq for CountedKey {
    fn eq(&self, other: &Self) -> bool {
        KEY_EQ_CALLS.fetch_add(1, Ordering::SeqCst);
        self.0 == other.0
    }
}
impl Eq for CountedKey {}
impl Hash for CountedKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}
impl Drop for CountedKey {
    fn drop(&mut self) {
        if KEY_DROP_BOMB.swap(false, Ordering::SeqCst) {
            panic!("key drop failure (expected by the test)");
        }
    }
}

/// A key's `Drop` panicking inside `KeyedTimers::drop` unwinds out of the map's `retain`
/// and leaves the other keys' timers armed. The anchor is still dropped, so the slot goes
/// to the next owner of the same types, and those 63 stale timers fire into *its* map,
/// where the same keys are pending with other tokens. Why: this is the slot-reuse path of
/// the slot table made deterministic (the `Eq` count proves the stale fires reached the new
/// map); they must take nothing, run no handler, and the new owner's values must reach its
/// own handler once each, on time.
#[test]
fn stale_timers_left_by_a_panicking_key_drop_take_nothing_from_the_slots_next_owner() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let live = Live::default();
    let first_handled = Arc::new(AtomicUsize::new(0));
    let sink = Arc::clone(&first_handled);
    let first = KeyedTimers::with_engine(&engine, move |_: CountedKey, _: Tagged| {
        sink.fetch_add(1, Ordering::SeqCst);
    });
    let now = Instant::now();
    for key in 0..64 {
        let value = Tagged {
            owner: 1,
            id: key as usize,
            not_before: now,
            _live: live.witness(),
        };
        first.set(CountedKey(key), value, 5 * MS).unwrap();
    }
    KEY_DROP_BOMB.store(true, Ordering::SeqCst);
    let dropped = catch_unwind(AssertUnwindSafe(|| drop(first)));
    assert!(
        dropped.is_err(),
        "the key's panic escapes the drop (not the finding)"
    );
    assert!(!KEY_DROP_BOMB.load(Ordering::SeqCst));
    assert!(
        support::eventually(Duration::from_secs(5), || live.count() == 0),
        "the first owner's values are all dropped"
    );

    // The next owner of the same types takes the freed slot (the free list is LIFO).
    let seen: Arc<Mutex<Vec<(u32, usize, usize)>>> = Arc::default();
    let sink = Arc::clone(&seen);
    let second = KeyedTimers::with_engine(&engine, move |key: CountedKey, value: Tagged| {
        sink.lock().unwrap().push((key.0, value.owner, value.id));
    });
    for key in 0..64 {
        let value = Tagged {
            owner: 2,
            id: 100 + key as usize,
            not_before: now,
            _live: live.witness(),
        };
        second.set(CountedKey(key), value, 20 * MS).unwrap();
    }
    let fired_before = engine.stats().total.fired;
    KEY_EQ_CALLS.store(0, Ordering::SeqCst);
    run_for(&engine, &clock, 10);
    let stale_fired = engine.stats().total.fired - fired_before;
    let stale_lookups = KEY_EQ_CALLS.load(Ordering::SeqCst);
    eprintln!("stale timers fired: {stale_fired}, lookups into the new map: {stale_lookups}");
    assert_eq!(
        stale_fired, 63,
        "the first owner's uncancelled timers fired"
    );
    assert!(
        stale_lookups >= 63,
        "they found the second owner's map through the reused slot"
    );
    assert!(seen.lock().unwrap().is_empty(), "nothing taken early");
    assert_eq!(second.len(), 64);
    assert_eq!(first_handled.load(Ordering::SeqCst), 0);
    run_for(&engine, &clock, 15);
    let mut got = seen.lock().unwrap().clone();
    got.sort_unstable();
    let want: Vec<_> = (0..64).map(|key| (key, 2, 100 + key as usize)).collect();
    assert_eq!(
        got, want,
        "each of the second owner's values once, to its handler"
    );
    assert!(second.is_empty());
    drop(second);
    assert!(support::eventually(Duration::from_secs(5), || live.count() == 0));
    assert_eq!(engine.nodes_in_use(), 0);
}

/// A fire already claimed when its owner is dropped cannot be cancelled; it then looks the
/// slot up after the next owner of the same types has taken it. Here the owner's first
/// handler call blocks the turn that claimed all 64 keys while the test drops the owner and
/// makes the next one, which sets the same keys an hour out. Why: the stale callbacks must
/// find the new map, take nothing, and run no handler (neither the old one nor the new).
#[test]
fn claimed_fires_of_a_dropped_owner_take_nothing_from_the_next_owner() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let live = Live::default();
    let entered = Arc::new(Barrier::new(2));
    let release = Arc::new(Barrier::new(2));
    let first_calls = Arc::new(AtomicUsize::new(0));
    let (gate_in, gate_out, calls) = (
        Arc::clone(&entered),
        Arc::clone(&release),
        Arc::clone(&first_calls),
    );
    let first = KeyedTimers::with_engine(&engine, move |_: u32, _: Tagged| {
        if calls.fetch_add(1, Ordering::SeqCst) == 0 {
            gate_in.wait();
            gate_out.wait();
        }
    });
    for key in 0..64 {
        let value = Tagged {
            owner: 1,
            id: key as usize,
            not_before: Instant::now(),
            _live: live.witness(),
        };
        first.set(key, value, MS).unwrap();
    }
    let second_seen = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|scope| {
        let turner = scope.spawn(|| {
            clock.advance(MS);
            engine.turn()
        });
        entered.wait();
        drop(first);
        let sink = Arc::clone(&second_seen);
        let second = KeyedTimers::with_engine(&engine, move |_: u32, _: Tagged| {
            sink.fetch_add(1, Ordering::SeqCst);
        });
        for key in 0..64 {
            let value = Tagged {
                owner: 2,
                id: 100 + key as usize,
                not_before: Instant::now() + HOUR,
                _live: live.witness(),
            };
            second.set(key, value, HOUR).unwrap();
        }
        release.wait();
        let fired = turner.join().unwrap();
        eprintln!("the blocked turn ran {fired} callbacks");
        run_for(&engine, &clock, 20);
        assert_eq!(
            first_calls.load(Ordering::SeqCst),
            1,
            "only the blocked call"
        );
        assert_eq!(second_seen.load(Ordering::SeqCst), 0, "nothing taken early");
        assert_eq!(second.len(), 64);
        assert_eq!(live.count(), 64, "the first owner's values are all gone");
        drop(second);
    });
    assert!(support::eventually(Duration::from_secs(5), || live.count() == 0));
}

/// Owners of the same `K, V` types made and dropped over and over on three threads, each
/// with short timers firing on two real workers while it lives: slots are reused all the
/// time and stale fires land in new owners' maps. Why: a stale fire must never take a new
/// owner's value (it would be early, or reach the wrong handler), and every value must be
/// handed out at most once and dropped once.
#[test]
fn churning_owners_of_one_type_keep_exactly_once_never_early_never_crossed() {
    let _serial = support::serial();
    within(Duration::from_secs(120), "owner churn", || {
        let engine = leaked_unpinned(2);
        let live = Live::default();
        let faults = Arc::new(Mutex::new(Vec::<String>::new()));
        let handed = Arc::new(Mutex::new(HashSet::<(usize, usize)>::new()));
        let next_owner = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..3_u64)
            .map(|thread| {
                let (live, faults, handed, next_owner) = (
                    live.clone(),
                    Arc::clone(&faults),
                    Arc::clone(&handed),
                    Arc::clone(&next_owner),
                );
                std::thread::spawn(move || {
                    let mut seed = thread.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    let mut random = move |below: u64| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        seed % below
                    };
                    for _ in 0..150 {
                        let owner = next_owner.fetch_add(1, Ordering::SeqCst);
                        let (faults_in, handed_in) = (Arc::clone(&faults), Arc::clone(&handed));
                        let timers =
                            KeyedTimers::with_engine(engine, move |key: u32, v: Tagged| {
                                let now = Instant::now();
                                let mut fault = None;
                                if v.owner != owner {
                                    fault =
                                        Some(format!("owner {owner}'s handler got {}'s", v.owner));
                                } else if now < v.not_before {
                                    fault = Some(format!("key {key} early"));
                                } else if !handed_in.lock().unwrap().insert((v.owner, v.id)) {
                                    fault = Some(format!("value {} twice", v.id));
                                }
                                if let Some(fault) = fault {
                                    faults_in.lock().unwrap().push(fault);
                                }
                            });
                        for round in 0..3_usize {
                            for key in 0..16_u32 {
                                let delay = if key < 8 {
                                    Duration::from_micros(random(2000))
                                } else {
                                    Duration::from_millis(40)
                                };
                                let value = Tagged {
                                    owner,
                                    id: round * 16 + key as usize,
                                    not_before: Instant::now() + delay,
                                    _live: live.witness(),
                                };
                                let _ = timers.set(key, value, delay);
                            }
                            std::thread::sleep(Duration::from_micros(random(1500)));
                            if random(3) == 0 {
                                let _ = timers.remove(&(random(16) as u32));
                            }
                        }
                        drop(timers);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let faults = faults.lock().unwrap().clone();
        assert!(faults.is_empty(), "{faults:?}");
        assert!(
            support::eventually(Duration::from_secs(10), || live.count() == 0),
            "every value dropped exactly once ({} alive)",
            live.count()
        );
        assert_eq!(engine.stats().total.panicked, 0);
        eprintln!("{} values reached a handler", handed.lock().unwrap().len());
    });
}

// ---------------------------------------------------------------------------------------
// Handlers that outlive or drop their own KeyedTimers
// ---------------------------------------------------------------------------------------

/// A handler that sleeps on a real worker while another thread drops its `KeyedTimers`,
/// then reads its captures. Why: the state (handler and captures) must not be freed under
/// the running handler; a premature free would drop the captured `Witness` (count 0) or
/// crash.
#[test]
fn a_handler_outliving_its_keyed_timers_keeps_its_captures() {
    let _serial = support::serial();
    within(Duration::from_secs(30), "long handler", || {
        let engine = leaked_unpinned(1);
        let live = Live::default();
        let (witness, count) = (live.witness(), live.clone());
        let data: Vec<u64> = (0..1000).collect();
        let (entered_tx, entered_rx) = mpsc::channel();
        let entered_tx = Mutex::new(entered_tx);
        let intact = Arc::new(AtomicUsize::new(0));
        let report = Arc::clone(&intact);
        let timers = KeyedTimers::with_engine(engine, move |_: u32, _: u32| {
            let _ = entered_tx.lock().unwrap().send(());
            std::thread::sleep(Duration::from_millis(200));
            let _keep = &witness;
            if count.count() == 1 && data.iter().sum::<u64>() == 499_500 {
                report.store(1, Ordering::SeqCst);
            } else {
                report.store(2, Ordering::SeqCst);
            }
        });
        timers.set(1, 1, MS).unwrap();
        entered_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        drop(timers);
        assert!(support::eventually(Duration::from_secs(10), || {
            intact.load(Ordering::SeqCst) != 0
        }));
        assert_eq!(intact.load(Ordering::SeqCst), 1, "captures intact");
        assert_eq!(engine.stats().total.panicked, 0);
    });
}

/// The handler takes its own `KeyedTimers` out of a `Mutex<Option<_>>` and drops it, on the
/// thread turning a manual engine, with other keys of it claimed in the same turn, then
/// goes on using its captures. Why: `retire` runs inside the handler's own epoch section;
/// it must neither wait for that section (deadlock) nor free what the handler still uses.
#[test]
fn a_handler_dropping_its_own_keyed_timers_mid_turn_keeps_its_captures() {
    let _serial = support::serial();
    within(Duration::from_secs(30), "self-drop in the handler", || {
        let (engine, clock) = manual(1);
        let engine: &'static TimerEngine = Box::leak(Box::new(engine));
        let live = Live::default();
        let owner: Arc<Mutex<Option<KeyedTimers<'static, u32, Witness>>>> = Arc::default();
        let in_handler = Arc::clone(&owner);
        let captured = String::from("still here");
        let after: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = Arc::clone(&after);
        let timers = KeyedTimers::with_engine(engine, move |_: u32, _: Witness| {
            let taken = in_handler.lock().unwrap().take();
            let was_owner = taken.is_some();
            drop(taken);
            if was_owner {
                sink.lock().unwrap().push(captured.clone());
            }
        });
        for key in 0..32 {
            assert!(timers.set(key, live.witness(), MS).is_ok());
        }
        *owner.lock().unwrap() = Some(timers);
        run_for(engine, &clock, 3);
        assert!(owner.lock().unwrap().is_none());
        assert_eq!(*after.lock().unwrap(), ["still here"]);
        assert_eq!(
            live.count(),
            0,
            "every value dropped (one handed, 31 by the drop)"
        );
        assert_eq!(engine.stats().total.panicked, 0);
    });
}

// ---------------------------------------------------------------------------------------
// When the handler's captures are dropped
// ---------------------------------------------------------------------------------------

/// With no epoch section open anywhere, dropping a `KeyedTimers` on one thread drops the
/// handler's captures before the drop returns, as another thread sees them: an `Arc`
/// captured by the handler is back to one strong count once that thread is joined. Done
/// with and without pending timers, on owners made on one thread and dropped on another.
#[test]
fn with_no_section_open_the_handlers_captures_go_with_the_drop() {
    let _serial = support::serial();
    let (engine, _clock) = manual(1);
    for pending in [0_u32, 16] {
        let shared = Arc::new(());
        let captured = Arc::clone(&shared);
        let timers = KeyedTimers::with_engine(&engine, move |_: u32, _: u32| {
            let _ = &captured;
        });
        for key in 0..pending {
            timers.set(key, key, HOUR).unwrap();
        }
        std::thread::scope(|scope| {
            scope.spawn(move || drop(timers)).join().unwrap();
        });
        assert_eq!(Arc::strong_count(&shared), 1, "{pending} pending");
    }
}

/// Fixed: the owner is dropped while its handler runs, and
/// nothing in the process enters an epoch section afterwards. The handler lived in the
/// epoch-deferred state, which crossbeam frees only when some thread later collects, so
/// its captures (here a `Witness`; in real code a channel's `Sender` someone waits to see
/// closed, a file, a socket) were never dropped. Fixed: the running fire holds the
/// handler strongly, and the captures go as it returns.
#[test]
fn the_handler_is_dropped_once_the_fire_running_it_returns() {
    let _serial = support::serial();
    within(
        Duration::from_secs(30),
        "captures after the section",
        || {
            let (engine, clock) = manual(1);
            let engine: &'static TimerEngine = Box::leak(Box::new(engine));
            let live = Live::default();
            let witness = live.witness();
            let entered = Arc::new(Barrier::new(2));
            let release = Arc::new(Barrier::new(2));
            let (gate_in, gate_out) = (Arc::clone(&entered), Arc::clone(&release));
            let timers = KeyedTimers::with_engine(engine, move |_: u32, _: u32| {
                let _keep = &witness;
                gate_in.wait();
                gate_out.wait();
            });
            timers.set(1, 1, MS).unwrap();
            let turner = std::thread::spawn(move || {
                clock.advance(MS);
                engine.turn();
            });
            entered.wait();
            drop(timers);
            assert_eq!(live.count(), 1, "held while the handler runs");
            release.wait();
            turner.join().unwrap();
            assert!(
                support::eventually(Duration::from_secs(3), || live.count() == 0),
                "the handler's captures are still alive after its section ended"
            );
        },
    );
}

// ---------------------------------------------------------------------------------------
// Panics in a deferred free
// ---------------------------------------------------------------------------------------

static HANDLER_DROP_BOMB: AtomicBool = AtomicBool::new(false);

/// A handler capture whose `Drop` panics once when armed.
struct HandlerBomb;
impl Drop for HandlerBomb {
    fn drop(&mut self) {
        if HANDLER_DROP_BOMB.swap(false, Ordering::SeqCst) {
            panic!("handler capture drop failure (expected by the test)");
        }
    }
}

/// Drops a `KeyedTimers` whose handler captures an armed [`HandlerBomb`] while another
/// thread holds a section open. The handler is the owner's, not the deferred free's: it
/// goes off in this drop, on this thread, and the panic comes out of this drop.
fn drop_a_handler_bomb_beside_an_open_section(engine: &TimerEngine) {
    let bomb = HandlerBomb;
    let doomed = KeyedTimers::with_engine(engine, move |_: u32, _: u32| {
        let _keep = &bomb;
    });
    doomed.set(1, 1, HOUR).unwrap();
    let release = hold_a_section_open();
    HANDLER_DROP_BOMB.store(true, Ordering::SeqCst);
    let dropped = catch_unwind(AssertUnwindSafe(|| drop(doomed)));
    assert!(
        dropped.is_err() && !HANDLER_DROP_BOMB.load(Ordering::SeqCst),
        "the handler's capture was dropped, and panicked, in its owner's drop"
    );
    release();
}

/// Fixed: the handler lived in the epoch-deferred state, so a
/// capture whose `Drop` panics went off inside a *later, unrelated* fire's section (crossbeam
/// collects every 128th pin); the engine caught and counted it against the unrelated
/// timer, whose key then stayed in the map with no timer. Fixed: the handler is held
/// strongly by its `KeyedTimers` only and dropped with it; the deferred free holds
/// nothing of the user's.
#[test]
fn a_handler_drop_panic_never_costs_an_unrelated_key_its_expiry() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let handled = Arc::new(AtomicUsize::new(0));
    let sink = Arc::clone(&handled);
    let innocent = KeyedTimers::with_engine(&engine, move |_: u32, _: u32| {
        sink.fetch_add(1, Ordering::SeqCst);
    });
    for key in 0..300 {
        innocent.set(key, key, MS).unwrap();
    }
    drop_a_handler_bomb_beside_an_open_section(&engine);
    let panicked_before = engine.stats().total.panicked;
    run_for(&engine, &clock, 2);
    HANDLER_DROP_BOMB.store(false, Ordering::SeqCst);
    let panicked = engine.stats().total.panicked - panicked_before;
    let (got, left) = (handled.load(Ordering::SeqCst), innocent.len());
    assert_eq!(
        (got, left, panicked),
        (300, 0, 0),
        "every innocent key reaches its handler"
    );
}

/// Fixed: as above, the deferred handler went off in `retire`'s
/// flushes inside the drop of an unrelated `KeyedTimers`, which then panicked with the other
/// owner's payload. Fixed as above: the innocent drop has nothing of anyone's to run.
#[test]
fn a_handler_drop_panic_never_escapes_an_unrelated_drop() {
    let _serial = support::serial();
    let (engine, _clock) = manual(1);
    let innocent = KeyedTimers::with_engine(&engine, |_: u32, _: u32| {});
    innocent.set(1, 1, HOUR).unwrap();
    drop_a_handler_bomb_beside_an_open_section(&engine);
    let dropped = catch_unwind(AssertUnwindSafe(|| drop(innocent)));
    HANDLER_DROP_BOMB.store(false, Ordering::SeqCst);
    assert!(
        dropped.is_ok(),
        "dropping an innocent KeyedTimers panicked with another owner's payload"
    );
}

/// A handler that panics on every key, on owners made and dropped in a loop with keys
/// firing: the table is not disturbed (each next owner works, values end once) and the
/// panics are counted.
#[test]
fn panicking_handlers_on_churning_owners_leave_the_table_sound() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let live = Live::default();
    for round in 0..50_u32 {
        let timers = KeyedTimers::with_engine(&engine, move |key: u32, _: Witness| {
            if key % 2 == 0 {
                panic!("handler failure (expected by the test)");
            }
        });
        for key in 0..8 {
            assert!(timers.set(key, live.witness(), MS * (key % 3)).is_ok());
        }
        run_for(&engine, &clock, u64::from(1 + round % 2));
        drop(timers);
        assert_eq!(live.count(), 0, "round {round}");
    }
    run_for(&engine, &clock, 5);
    assert_eq!(engine.nodes_in_use(), 0);
    let stats = engine.stats().total;
    assert_eq!(stats.scheduled, stats.fired + stats.cancelled, "{stats:?}");
}

// ---------------------------------------------------------------------------------------
// Thread exit and engine shutdown
// ---------------------------------------------------------------------------------------

thread_local! {
    static HELD: RefCell<Option<KeyedTimers<'static, u32, Witness>>> = const { RefCell::new(None) };
}

/// A `KeyedTimers` held in a thread-local, dropped by the thread's exit after
/// crossbeam-epoch's own thread-local handle (registered later, destroyed first). Why:
/// `retire` then pins from a thread whose epoch handle is gone; the drop must still empty
/// the map, free the state and drop the handler.
#[test]
fn a_keyed_timers_dropped_at_thread_exit_after_the_epoch_handle_is_freed() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let engine: &'static TimerEngine = Box::leak(Box::new(engine));
    let live = Live::default();
    let handler_alive = Arc::new(());
    let (for_thread, captured) = (live.clone(), Arc::clone(&handler_alive));
    std::thread::spawn(move || {
        let timers = KeyedTimers::with_engine(engine, move |_: u32, _: Witness| {
            let _ = &captured;
        });
        for key in 0..8 {
            assert!(timers.set(key, for_thread.witness(), HOUR).is_ok());
        }
        HELD.with(|held| *held.borrow_mut() = Some(timers));
        // crossbeam-epoch's handle, registered after `HELD`, is destroyed before it.
        drop(crossbeam_epoch::pin());
    })
    .join()
    .unwrap();
    assert_eq!(live.count(), 0, "the values were dropped at thread exit");
    assert!(support::eventually(Duration::from_secs(5), || {
        Arc::strong_count(&handler_alive) == 1
    }));
    run_for(engine, &clock, 2);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Owners of one type made and dropped on two threads while the engine shuts down, with
/// `Run` (every pending callback runs at once, stale ones included) and with `Drop`. Why:
/// shutdown's callbacks race the drops and slot reuse; every value must still end exactly
/// once (handed, refused and handed back, or dropped), and no handler sees another
/// owner's value.
#[test]
fn owner_churn_racing_engine_shutdown_loses_nothing() {
    let _serial = support::serial();
    for mode in [PendingTimers::Run, PendingTimers::Drop] {
        within(
            Duration::from_secs(60),
            "churn against shutdown",
            move || {
                let engine = support::unpinned(2);
                let live = Live::default();
                let crossed = Arc::new(AtomicUsize::new(0));
                let stop = AtomicBool::new(false);
                std::thread::scope(|scope| {
                    for thread in 0..2_usize {
                        let (engine, live, crossed, stop) = (&*engine, &live, &crossed, &stop);
                        scope.spawn(move || {
                            let mut owner = thread * 1_000_000;
                            while !stop.load(Ordering::SeqCst) {
                                owner += 1;
                                let crossed = Arc::clone(crossed);
                                let timers =
                                    KeyedTimers::with_engine(engine, move |_: u32, v: Tagged| {
                                        if v.owner != owner {
                                            crossed.fetch_add(1, Ordering::SeqCst);
                                        }
                                    });
                                for key in 0..16_u32 {
                                    let delay = MS * (key % 4);
                                    let value = Tagged {
                                        owner,
                                        id: key as usize,
                                        not_before: Instant::now(),
                                        _live: live.witness(),
                                    };
                                    let _ = timers.set(key, value, delay);
                                }
                                std::thread::sleep(Duration::from_micros(300));
                                drop(timers);
                            }
                        });
                    }
                    std::thread::sleep(Duration::from_millis(30));
                    engine.shutdown(mode);
                    std::thread::sleep(Duration::from_millis(10));
                    stop.store(true, Ordering::SeqCst);
                });
                assert_eq!(crossed.load(Ordering::SeqCst), 0, "{mode:?}");
                assert_eq!(live.count(), 0, "{mode:?}: every value dropped once");
                assert_eq!(engine.nodes_in_use(), 0, "{mode:?}");
            },
        );
    }
}

// ---------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------

/// Resident memory of this process, in bytes.
fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|pages| pages.parse::<usize>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// 100k owners made and dropped in a loop, with and without pending timers: slots are
/// reused (the table holds as many as were ever alive at once, here one or two), each
/// retired state is freed, and resident memory stays flat. Why: a slot or a deferred free
/// leaked per owner would grow without bound.
#[test]
#[cfg(target_os = "linux")]
fn a_hundred_thousand_owners_do_not_grow_memory() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let live = Live::default();
    for pending in [0_u32, 4] {
        let churn = |owners: usize| {
            for _ in 0..owners {
                let witness = live.witness();
                let timers = KeyedTimers::with_engine(&engine, move |_: u32, _: Witness| {
                    let _ = &witness;
                });
                for key in 0..pending {
                    assert!(timers.set(key, live.witness(), HOUR).is_ok());
                }
                drop(timers);
            }
        };
        churn(10_000);
        let before = resident_bytes();
        churn(100_000);
        let after = resident_bytes();
        eprintln!("{pending} pending: resident {before} -> {after} bytes");
        assert!(
            after < before + (16 << 20),
            "{pending} pending: grew {} bytes",
            after.saturating_sub(before)
        );
        assert_eq!(
            live.count(),
            0,
            "{pending} pending: values and handlers freed"
        );
    }
    // Cancelled timers' nodes go back to the pool within the engine's reclaim period (about
    // 32 ms of turns here, as in `guarantees::nodes_come_back_and_stats_add_up`).
    run_for(&engine, &clock, 40);
    assert_eq!(engine.nodes_in_use(), 0);
}

// ---------------------------------------------------------------------------------------
// Send and Sync
// ---------------------------------------------------------------------------------------

/// `KeyedTimers` is still `Send + Sync` for the types its constructors accept, whatever
/// the engine borrow's lifetime, and can be shared by reference across scoped threads.
#[test]
fn keyed_timers_stay_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn for_any_engine<'e>(_: &'e TimerEngine) {
        send_sync::<KeyedTimers<'e, u64, String>>();
        send_sync::<KeyedTimers<'e, String, Arc<Mutex<Vec<u8>>>>>();
    }
    let _serial = support::serial();
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .manual_clock(clock.clone())
        .build()
        .unwrap();
    for_any_engine(&engine);
    let timers = KeyedTimers::with_engine(&engine, |_: u64, _: String| {});
    std::thread::scope(|scope| {
        scope.spawn(|| timers.set(1, "a".into(), MS).unwrap());
    });
    let moved = std::thread::scope(|scope| scope.spawn(move || timers).join().unwrap());
    assert_eq!(moved.len(), 1);
}
