//! The lifetime of `KeyedTimers`' handler: `KeyedTimers` holds the handler's only lasting
//! `Arc`, the shared `Inner` a `Weak`; a fire upgrades the `Weak` inside its
//! crossbeam-epoch read section, then `remove_if`s its key's slot by token, then runs the
//! handler outside the section. The cases: a fire that upgraded the handler but whose value
//! the drop took first (paused deterministically between the upgrade and the map lookup by
//! a key whose `Hash` blocks on the worker); a key whose `Drop` panics after the fire took
//! the value; and real-clock drops racing fires, checked for exactly-once delivery and for
//! the handler's captures never leaking.
//!
//! crossbeam-epoch's collector and the slot table are process-wide, so every test holds
//! [`serial`]. Two tests check faults since fixed (a key-drop panic leaking a value and the
//! handler; the handler's last `Arc` dropped inside a read section).

use crate::support;

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use crate::support::{Live, Witness, manual, run_for, unpinned, within};
use corewheel::{KeyedTimers, TimerEngine};

const MS: Duration = Duration::from_millis(1);

// ---------------------------------------------------------------------------------------
// A fire paused between its upgrade and its map lookup
// ---------------------------------------------------------------------------------------

/// Armed: the next `Hash` of a [`GateKey`] blocks until [`GATE_RELEASE`].
static GATE_ARMED: AtomicBool = AtomicBool::new(false);
/// Set by the blocked `Hash` once it has begun waiting.
static GATE_ENTERED: AtomicBool = AtomicBool::new(false);
static GATE_RELEASE: AtomicBool = AtomicBool::new(false);

/// A key whose `Hash`, once armed, blocks: in a fire that is after `Inner::expire` upgraded
/// the handler and before `remove_if` takes the key's lock.
#[derive(Clone, PartialEq, Eq, Debug)]
struct GateKey(u32);
impl Hash for GateKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        if GATE_ARMED.swap(false, Ordering::SeqCst) {
            GATE_ENTERED.store(true, Ordering::SeqCst);
            while !GATE_RELEASE.load(Ordering::SeqCst) {
                std::thread::sleep(MS);
            }
        }
        self.0.hash(state);
    }
}

/// Where and how a handler capture was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DropSite {
    thread: ThreadId,
    in_epoch_section: bool,
}

/// A handler capture that records its [`DropSite`].
struct Probe(Arc<Mutex<Option<DropSite>>>);
impl Drop for Probe {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = Some(DropSite {
            thread: std::thread::current().id(),
            in_epoch_section: crossbeam_epoch::is_pinned(),
        });
    }
}

/// What the gated race saw.
struct GatedRace {
    dropping_thread: ThreadId,
    /// The capture's drop site, as seen right after `drop(timers)` returned.
    captures_at_drop_return: Option<DropSite>,
    /// ... and once the fire has finished.
    captures_at_end: Option<DropSite>,
    handled: usize,
    values_live_after_drop: usize,
    values_live_at_end: usize,
    panicked: u64,
}

/// The race the fix claims to handle: a fire upgrades the handler, then the owner's drop
/// takes the value (and drops its own `Arc`), then the fire looks its key up and finds
/// nothing. Run deterministically: the fire is paused in the key's `Hash`.
fn gated_race() -> GatedRace {
    let (engine, clock) = manual(1);
    let engine: &'static TimerEngine = Box::leak(Box::new(engine));
    let site = Arc::new(Mutex::new(None));
    let probe = Probe(Arc::clone(&site));
    let handled = Arc::new(AtomicUsize::new(0));
    let sink = Arc::clone(&handled);
    let values = Live::default();
    let timers = KeyedTimers::with_engine(engine, move |_: GateKey, _: Witness| {
        let _keep = &probe;
        sink.fetch_add(1, Ordering::SeqCst);
    });
    assert!(timers.set(GateKey(1), values.witness(), MS).is_ok());
    GATE_ENTERED.store(false, Ordering::SeqCst);
    GATE_RELEASE.store(false, Ordering::SeqCst);
    GATE_ARMED.store(true, Ordering::SeqCst);
    let turner = std::thread::spawn(move || {
        clock.advance(MS);
        engine.turn();
    });
    assert!(
        support::eventually(Duration::from_secs(10), || GATE_ENTERED
            .load(Ordering::SeqCst)),
        "the fire reached the key's lookup"
    );
    let dropping_thread = std::thread::current().id();
    drop(timers);
    let captures_at_drop_return = *site.lock().unwrap();
    let values_live_after_drop = values.count();
    GATE_RELEASE.store(true, Ordering::SeqCst);
    turner.join().unwrap();
    let captures_at_end = *site.lock().unwrap();
    GatedRace {
        dropping_thread,
        captures_at_drop_return,
        captures_at_end,
        handled: handled.load(Ordering::SeqCst),
        values_live_after_drop,
        values_live_at_end: values.count(),
        panicked: engine.stats().total.panicked,
    }
}

/// Why: the fire upgraded the handler, but the drop's `take_all` got the value first. The
/// value must be the drop's (dropped by it, at once) and never reach the handler; the
/// handler's captures must not leak. Passes.
#[test]
fn a_fire_that_upgraded_but_lost_the_value_to_the_drop_hands_nothing_out() {
    let _serial = support::serial();
    let race = within(Duration::from_secs(30), "gated race", gated_race);
    assert_eq!(race.handled, 0, "the handler never saw the dropped value");
    assert_eq!(race.values_live_after_drop, 0, "the drop dropped the value");
    assert_eq!(race.values_live_at_end, 0);
    assert_eq!(race.panicked, 0);
    assert!(
        race.captures_at_end.is_some(),
        "the handler's captures are dropped once the fire ends"
    );
}

/// Why (a fault since fixed): a fire that had upgraded the `Weak` held the last
/// `Arc` when `remove_if` came back empty, and `Inner::expire`'s `?` dropped it on the
/// worker *inside* the crossbeam-epoch read section (`anchor::with`): the captures' `Drop`,
/// user code, ran inside a section, where one that blocks (joins a thread, flushes a file)
/// holds up every deferred free in the process. Now everything the fire took comes out of
/// the section first, and the captures are dropped outside it, as the fire returns: the
/// fire held the handler, which the docs now say ("unless a fire holds it").
#[test]
fn the_handlers_captures_go_with_the_drop_when_no_fire_runs_the_handler() {
    let _serial = support::serial();
    let race = within(Duration::from_secs(30), "gated race", gated_race);
    assert_eq!(race.handled, 0);
    let at_end = race.captures_at_end.expect("captures dropped");
    assert!(
        !at_end.in_epoch_section,
        "the handler's captures were dropped inside an epoch read section: {at_end:?}"
    );
    if let Some(at_drop) = race.captures_at_drop_return {
        assert_eq!(at_drop.thread, race.dropping_thread);
        assert!(!at_drop.in_epoch_section);
    }
}

// ---------------------------------------------------------------------------------------
// A key whose drop panics after the fire took the value
// ---------------------------------------------------------------------------------------

static KEY_DROP_BOMB: AtomicBool = AtomicBool::new(false);

/// A key whose `Drop` panics once when armed.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct BombKey(u32);
impl Drop for BombKey {
    fn drop(&mut self) {
        if KEY_DROP_BOMB.swap(false, Ordering::SeqCst) {
            panic!("key drop failure (expected by the test)");
        }
    }
}

/// What a fire whose key's `Drop` panicked left behind.
struct BombFire {
    panicked: u64,
    key_left_in_map: bool,
    /// Values alive after key 7's fire (key 8's is still pending: 1 means 7's was dropped).
    values_after_fire: usize,
    /// Key 8, due later, reached the handler.
    later_key_handled: usize,
    /// The handler's captures alive once the owner is dropped.
    captures_after_drop: usize,
    nodes_in_use: usize,
}

/// Sets keys 7 (due first) and 8 (later), arms the key bomb, lets 7 fire, then 8, then
/// drops the owner. The first key drop after the bomb is armed is the fire's own copy of
/// key 7, which `Inner::expire` drops at its closing brace, after building its return
/// value `(handler, key, value)`.
fn bomb_fire() -> BombFire {
    let (engine, clock) = manual(1);
    let values = Live::default();
    let captures = Live::default();
    let capture = captures.witness();
    let handled = Arc::new(AtomicUsize::new(0));
    let sink = Arc::clone(&handled);
    let timers = KeyedTimers::with_engine(&engine, move |_: BombKey, _: Witness| {
        let _keep = &capture;
        sink.fetch_add(1, Ordering::SeqCst);
    });
    assert!(timers.set(BombKey(7), values.witness(), MS).is_ok());
    assert!(timers.set(BombKey(8), values.witness(), 5 * MS).is_ok());
    KEY_DROP_BOMB.store(true, Ordering::SeqCst);
    run_for(&engine, &clock, 2);
    assert!(!KEY_DROP_BOMB.load(Ordering::SeqCst), "the bomb went off");
    let values_after_fire = values.count();
    let key_left_in_map = timers.contains(&BombKey(7));
    run_for(&engine, &clock, 5);
    drop(timers);
    BombFire {
        panicked: engine.stats().total.panicked,
        key_left_in_map,
        values_after_fire,
        later_key_handled: handled.load(Ordering::SeqCst),
        captures_after_drop: captures.count(),
        nodes_in_use: engine.nodes_in_use(),
    }
}

/// Why: the part of the key-drop-panic case that holds: the panic is contained and
/// counted, the key leaves the map, other keys still fire, every node comes back. Passes.
#[test]
fn a_key_drop_panic_in_a_fire_is_contained() {
    let _serial = support::serial();
    let fire = bomb_fire();
    assert_eq!(fire.panicked, 1, "the panic was contained and counted");
    assert!(!fire.key_left_in_map, "no zombie key");
    assert_eq!(fire.later_key_handled, 1, "key 8 still reached the handler");
    assert_eq!(fire.nodes_in_use, 0);
}

/// Why: `Inner::expire` ends `slot.value.map(|value| (handler, key, value))` and only then
/// drops its parameter `key` (the fire's copy) at the closing brace. A panic in that drop
/// unwinds past an already-built return value, which rustc does not drop
/// (rust-lang/rust#47949, open): the value is leaked (not handed to the handler, not
/// dropped), and so is the handler's `Arc`, whose strong count never falls to zero: the
/// handler's captures are never dropped, even after the `KeyedTimers` is. `set` guards the
/// same hazard (its `drop(unused_key)` before returning). Fixed: the
/// fire now drops its copy of the key first, on its own, outside the read section.
#[test]
fn a_key_drop_panic_in_a_fire_leaks_neither_the_value_nor_the_handler() {
    let _serial = support::serial();
    let fire = bomb_fire();
    eprintln!(
        "values alive after the fire: {} (1 expected); captures alive after the drop: {}",
        fire.values_after_fire, fire.captures_after_drop
    );
    assert_eq!(
        fire.values_after_fire, 1,
        "key 7's value was dropped with the panic, not leaked"
    );
    assert_eq!(
        fire.captures_after_drop, 0,
        "the handler's captures are dropped with its owner"
    );
}

// ---------------------------------------------------------------------------------------
// Real clock: drops racing fires
// ---------------------------------------------------------------------------------------

/// A value that records, by id, every way it leaves: handed to the handler, or dropped.
struct Tracked {
    id: usize,
    drops: Arc<Mutex<HashMap<usize, usize>>>,
}
impl Drop for Tracked {
    fn drop(&mut self) {
        *self.drops.lock().unwrap().entry(self.id).or_default() += 1;
    }
}

/// Why: the unpaused version of the races above, on worker threads: owners dropped just as
/// their keys come due (and some handlers slow, so fires hold the handler across the
/// drop). Every value must be dropped exactly once, none handed to the handler twice, the
/// handler's captures of every owner dropped (no leaked `Arc`), and every node returned.
/// Light on CPU (the machine is shared). Passes.
#[test]
fn owners_dropped_as_their_keys_fire_hand_each_value_out_once() {
    let _serial = support::serial();
    within(Duration::from_secs(120), "drop/fire race", || {
        let engine = unpinned(2);
        let drops: Arc<Mutex<HashMap<usize, usize>>> = Arc::default();
        let handled: Arc<Mutex<HashMap<usize, usize>>> = Arc::default();
        let captures = Live::default();
        let mut next = 0;
        for round in 0..150_usize {
            let capture = captures.witness();
            let sink = Arc::clone(&handled);
            let slow = round % 5 == 0;
            let timers = KeyedTimers::with_engine(&engine, move |_: u32, value: Tracked| {
                let _keep = &capture;
                *sink.lock().unwrap().entry(value.id).or_default() += 1;
                if slow {
                    std::thread::sleep(Duration::from_micros(300));
                }
            });
            for key in 0..16_u32 {
                let value = Tracked {
                    id: next,
                    drops: Arc::clone(&drops),
                };
                next += 1;
                let delay = Duration::from_micros(200 * u64::from(key % 8));
                assert!(timers.set(key, value, delay).is_ok());
            }
            std::thread::sleep(Duration::from_micros(100 * (round as u64 % 13)));
            drop(timers);
        }
        assert!(
            support::eventually(Duration::from_secs(20), || captures.count() == 0),
            "every handler's captures dropped: {} left",
            captures.count()
        );
        assert!(support::eventually(Duration::from_secs(20), || drops
            .lock()
            .unwrap()
            .len()
            == next));
        let drops = drops.lock().unwrap();
        assert!(drops.values().all(|&n| n == 1), "each value dropped once");
        let handled = handled.lock().unwrap();
        assert!(
            handled.values().all(|&n| n == 1),
            "no value handed to the handler twice"
        );
        eprintln!("{} of {next} values reached a handler", handled.len());
        assert_eq!(engine.stats().total.panicked, 0);
        assert!(support::eventually(Duration::from_secs(5), || engine
            .nodes_in_use()
            == 0));
    });
}

/// Why: a handler that drops its own `KeyedTimers` (the last `Arc<KeyedTimers>`, held in a
/// slot it captures) while other keys of that owner are due in the same turn, and another
/// owner's keys due too: the other keys' values go to the drop (not the handler), the
/// handler's captures go when its fire returns, and the other owner loses nothing.
/// Passes.
#[test]
fn a_handler_dropping_its_owner_mid_turn_loses_no_other_owners_values() {
    let _serial = support::serial();
    let (engine, clock) = manual(1);
    let engine: &'static TimerEngine = Box::leak(Box::new(engine));
    type Owner = KeyedTimers<'static, u32, Witness>;
    let slot: Arc<Mutex<Option<Owner>>> = Arc::default();
    let values = Live::default();
    let captures = Live::default();
    let capture = captures.witness();
    let handled = Arc::new(AtomicUsize::new(0));
    let (in_handler, sink) = (Arc::clone(&slot), Arc::clone(&handled));
    let doomed: Owner = KeyedTimers::with_engine(engine, move |_, _value| {
        let _keep = &capture;
        sink.fetch_add(1, Ordering::SeqCst);
        let owner = in_handler.lock().unwrap().take();
        drop(owner);
    });
    for key in 0..32 {
        assert!(doomed.set(key, values.witness(), MS).is_ok());
    }
    *slot.lock().unwrap() = Some(doomed);
    let other_handled = Arc::new(AtomicUsize::new(0));
    let other_sink = Arc::clone(&other_handled);
    let other = KeyedTimers::with_engine(engine, move |_: u32, _: Witness| {
        other_sink.fetch_add(1, Ordering::SeqCst);
    });
    for key in 0..32 {
        assert!(other.set(key, values.witness(), MS).is_ok());
    }
    run_for(engine, &clock, 3);
    assert_eq!(handled.load(Ordering::SeqCst), 1, "one fire, then the drop");
    assert_eq!(other_handled.load(Ordering::SeqCst), 32);
    assert_eq!(values.count(), 0, "every value dropped once");
    assert_eq!(captures.count(), 0, "captures went as the fire returned");
    assert!(slot.lock().unwrap().is_none());
    drop(other);
    assert_eq!(engine.nodes_in_use(), 0);
}
