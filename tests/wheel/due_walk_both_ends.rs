//! The due walk from both ends of a slot's lists: `WheelCore::take_interleaved`, which
//! `poll_batch` (the engine's claim of due timers) uses, takes a lone due finest slot too,
//! and takes from the head and the tail of each due slot's list in turn; `take_due` files a
//! timer pushed back since it was filed again where it now belongs, from either end. The
//! engine's finest slots keep eight lists each (a timer's index chooses its list), all
//! walked so.
//!
//! From the public API: slots of exactly 1, 2 or 3 timers with every combination of resets
//! (later, earlier, earlier then later, later then back) at either end or between; slots on
//! the last tick of a block and before a level-2 boundary; bursts one slot due at a time
//! across block, level-2 and level-3 boundaries with timers pushed back just before their
//! slot comes due; callbacks that reset, cancel and schedule their slot mates (the tail end
//! first) while the walk is split across looks by a full run queue; repeating timers
//! sharing crowded ticks; cancels and resets racing the claim from other threads; many
//! threads scheduling bursts due at one instant; shutdown in both modes during a big burst,
//! from outside and from inside a callback; and `Wheel::poll_expired` (which keeps `poll`)
//! mixed with resets.
//!
//! Hand-driven tests check exact firing ticks where the outcome is deterministic. Tests
//! on real clocks (and hand-driven ones with racing threads) assert only never early,
//! exactly once, and nothing lost. All randomness is seeded. A tail timer lost, or filed
//! a tick late, fails most tests here; `take_due`'s own deadline check at the tail is seen
//! only by the wheel's unit tests (the engine's claim checks each timer's deadline again).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::support::run_log::{Log, assert_ran_exactly, expected_runs, jump_to, record};
use crate::support::{
    Live, Rng, assert_all_given_back, eventually, manual, ms, run_for, since, unpinned, within,
};
use corewheel::{Clock, PendingTimers, TimerEngine, TimerHandle, Wheel};

/// What [`one_slot_case`] does to one timer of the slot, while the slot is the finest
/// level's, ten ticks before it is due. `d` is a push-back in ticks.
fn apply_op(
    engine: &TimerEngine,
    start: Instant,
    handle: TimerHandle,
    base: u64,
    op: usize,
    d: u64,
) -> Option<u64> {
    let at = |t: u64| start + Duration::from_millis(t);
    let reset = |t: u64| assert!(engine.reset_at(handle, at(t)), "op {op}: reset to {t}");
    match op {
        // Left alone.
        0 => Some(base),
        // Pushed back: stays in the slot, and must be moved on by the walk.
        1 => {
            reset(base + d);
            Some(base + d)
        }
        // Earlier: a message that unlinks it from the slot.
        2 => {
            reset(base - 5);
            Some(base - 5)
        }
        // Earlier (a message in transit), then later than the slot.
        3 => {
            reset(base - 7);
            reset(base + d);
            Some(base + d)
        }
        // Pushed back, then pulled earlier than the slot.
        4 => {
            reset(base + d);
            reset(base - 1);
            Some(base - 1)
        }
        // Pushed back, then back to the slot's own tick (a message: earlier than the
        // stored deadline): filed again at the slot's tail.
        5 => {
            reset(base + d);
            reset(base);
            Some(base)
        }
        // Cancelled.
        _ => {
            assert!(engine.cancel(handle), "op {op}: cancel");
            None
        }
    }
}

/// Ops [`apply_op`] knows.
const OPS: usize = 7;

/// Push-backs: the next tick, a few ticks, into the next block, and past a level-2
/// boundary when the slot is near one.
const DELTAS: [u64; 4] = [1, 2, 5, 37];

/// A hand-driven engine with `ops.len()` timers due at `base` ms (a slot of exactly that
/// many), each given its op ten ticks before `base`, when the slot is the finest level's;
/// then turned a millisecond at a time: each runs exactly at its last deadline.
fn one_slot_case(base: u64, ops: &[usize], salt: usize) {
    let (engine, clock) = manual(1);
    let start = clock.now();
    let log: Log = Arc::default();
    // Scheduled 100 ms ahead of the slot, so that the slot is filed by the time of the ops.
    jump_to(&engine, &clock, start, base - 100);
    let handles: Vec<_> = (0..ops.len())
        .map(|id| {
            engine
                .schedule_at(start + ms(base), record(&log, &clock, start, id))
                .unwrap()
        })
        .collect();
    run_for(&engine, &clock, 90);
    assert!(
        log.lock().unwrap().is_empty(),
        "{base} {ops:?}: nothing before the ops"
    );
    let expected: Vec<_> = ops
        .iter()
        .enumerate()
        .map(|(id, &op)| {
            let d = DELTAS[(id + salt) % DELTAS.len()];
            apply_op(&engine, start, handles[id], base, op, d)
        })
        .collect();
    run_for(&engine, &clock, 10 + 40);
    assert_ran_exactly(&log, &expected, &format!("slot at {base} ms, ops {ops:?}"));
    assert_eq!(engine.nodes_in_use(), 0, "{base} {ops:?}: every node back");
    let stats = engine.stats().total;
    let cancelled = ops.iter().filter(|&&op| op == OPS - 1).count() as u64;
    assert_eq!(
        (stats.fired, stats.cancelled, stats.pending),
        (ops.len() as u64 - cancelled, cancelled, 0),
        "{base} {ops:?}: {stats:?}"
    );
}

/// A lone due slot of exactly 1, 2 or 3 timers (so that the head and the tail are the same
/// timer, neighbours, or have one between), with every combination of ops on them
/// (pushed back, pulled earlier, earlier then later, later then back, cancelled), on an
/// ordinary tick, on the last tick of a block, and on the tick before a level-2 boundary
/// (pushes then cross it); then slots of 4 to 33 timers with seeded ops. Each timer runs
/// exactly once at its last deadline: the walk from the tail never hands out a pushed-back
/// timer, nor loses or doubles one.
#[test]
#[cfg_attr(miri, ignore)]
fn every_op_combination_on_slots_of_one_two_and_three_timers() {
    within(Duration::from_secs(120), "one-slot cases", || {
        for base in [100_u64, 127, 4095] {
            for n in 1..=3_u32 {
                for code in 0..OPS.pow(n) {
                    let ops: Vec<_> = (0..n).map(|i| code / OPS.pow(i) % OPS).collect();
                    one_slot_case(base, &ops, code);
                }
            }
        }
        let mut rng = Rng(0x7A11);
        for base in [100_u64, 127, 4095] {
            for n in [4_usize, 5, 6, 7, 8, 15, 16, 17, 33] {
                for case in 0..12 {
                    let ops: Vec<_> = (0..n).map(|_| rng.below(OPS as u64) as usize).collect();
                    one_slot_case(base, &ops, case);
                }
            }
        }
    });
}

/// Lone slots of every size around the claim batch (64) and the run queue (1024), all
/// timers due at one tick, nothing reset: each runs exactly once, at that tick, none a
/// tick before.
#[test]
#[cfg_attr(miri, ignore)]
fn lone_slots_of_every_size_run_each_timer_once_at_its_tick() {
    for n in [
        1_usize, 2, 3, 4, 5, 31, 32, 33, 63, 64, 65, 127, 128, 129, 1023, 1024, 1025, 2049,
    ] {
        let (engine, clock) = manual(1);
        let start = clock.now();
        let log: Log = Arc::default();
        for id in 0..n {
            engine
                .schedule_at(start + ms(100), record(&log, &clock, start, id))
                .unwrap();
        }
        run_for(&engine, &clock, 99);
        assert!(log.lock().unwrap().is_empty(), "{n}: nothing early");
        run_for(&engine, &clock, 20);
        assert_ran_exactly(&log, &vec![Some(100); n], &format!("{n} at one tick"));
        assert_eq!(engine.nodes_in_use(), 0, "{n}: every node back");
    }
}

/// A slot far bigger than the run queue (1024), a third of it pushed back by 1 to 3 ticks
/// and a few pulled earlier, interleaved along the list: the walk from both ends is split
/// across many looks, with the room left by timers filed again making batches of odd
/// sizes (down to 1, 2, 3). Each runs exactly at its last deadline, and the pushed-back
/// ones at the next ticks are walked the same way.
#[test]
#[cfg_attr(miri, ignore)]
fn a_slot_larger_than_the_run_queue_with_pushed_back_timers_throughout() {
    for (n, seed) in [(3_001_usize, 1_u64), (4_096, 2), (5_003, 3)] {
        let (engine, clock) = manual(1);
        let start = clock.now();
        let log: Log = Arc::default();
        let handles: Vec<_> = (0..n)
            .map(|id| {
                engine
                    .schedule_at(start + ms(100), record(&log, &clock, start, id))
                    .unwrap()
            })
            .collect();
        run_for(&engine, &clock, 95);
        let mut rng = Rng(0xB16 ^ seed);
        let expected: Vec<_> = handles
            .iter()
            .map(|&handle| {
                let at = match rng.below(12) {
                    0..=3 => 100 + rng.range(1, 4),
                    4 => 97 + rng.below(3),
                    _ => 100,
                };
                if at != 100 {
                    assert!(engine.reset_at(handle, start + ms(at)));
                }
                Some(at)
            })
            .collect();
        run_for(&engine, &clock, 20);
        assert_ran_exactly(&log, &expected, &format!("{n} in one slot"));
        assert_eq!(engine.nodes_in_use(), 0, "{n}: every node back");
    }
}

/// Bursts one slot due at a time across a level-2 boundary (4096 ms) and a level-3 one
/// (262144 ms): each tick around the boundary holds 0 to 130 timers, some scheduled long
/// before (filed on coarse levels), some just before; every tick, timers one, two or five
/// ticks from due are pushed back (up to three times each, some across the boundary) or
/// cancelled. Turned a millisecond at a time: each runs exactly at its last deadline.
#[test]
#[cfg_attr(miri, ignore)]
fn one_slot_at_a_time_across_level2_and_level3_boundaries_with_late_pushes() {
    within(Duration::from_secs(60), "boundary bursts", || {
        let (engine, clock) = manual(1);
        let start = clock.now();
        let log: Log = Arc::default();
        let mut rng = Rng(0xB0DA);
        let mut handles = Vec::new();
        let mut expected: Vec<Option<u64>> = Vec::new();
        let mut pushes: Vec<u32> = Vec::new();
        let mut by_tick: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        let sizes = [0_u64, 1, 1, 2, 3, 3, 5, 64, 65, 130];
        let schedule = |tick: u64,
                        handles: &mut Vec<TimerHandle>,
                        expected: &mut Vec<Option<u64>>,
                        pushes: &mut Vec<u32>,
                        by_tick: &mut BTreeMap<u64, Vec<usize>>| {
            let id = handles.len();
            handles.push(
                engine
                    .schedule_at(start + ms(tick), record(&log, &clock, start, id))
                    .unwrap(),
            );
            expected.push(Some(tick));
            pushes.push(0);
            by_tick.entry(tick).or_default().push(id);
        };
        let boundaries = [4_096_u64, 262_144];
        // Half of each burst scheduled from the start, on the coarse levels.
        for &b in &boundaries {
            for tick in b - 100..b + 100 {
                for _ in 0..sizes[rng.below(sizes.len() as u64) as usize] / 2 {
                    schedule(tick, &mut handles, &mut expected, &mut pushes, &mut by_tick);
                }
            }
        }
        for &b in &boundaries {
            jump_to(&engine, &clock, start, b - 150);
            for tick in b - 100..b + 100 {
                for _ in 0..sizes[rng.below(sizes.len() as u64) as usize].div_ceil(2) {
                    schedule(tick, &mut handles, &mut expected, &mut pushes, &mut by_tick);
                }
            }
            for now in b - 149..b + 500 {
                for ahead in [1_u64, 2, 5] {
                    let Some(ids) = by_tick.remove(&(now + ahead)) else {
                        continue;
                    };
                    let mut stay = Vec::new();
                    for id in ids {
                        let roll = rng.below(100);
                        if roll < 25 && pushes[id] < 3 {
                            let to = now + ahead + rng.range(1, 120);
                            assert!(engine.reset_at(handles[id], start + ms(to)));
                            pushes[id] += 1;
                            expected[id] = Some(to);
                            by_tick.entry(to).or_default().push(id);
                        } else if roll < 28 {
                            assert!(engine.cancel(handles[id]));
                            expected[id] = None;
                        } else {
                            stay.push(id);
                        }
                    }
                    by_tick.insert(now + ahead, stay);
                }
                clock.advance_to(start + ms(now));
                while engine.turn() > 0 {}
            }
        }
        assert_ran_exactly(&log, &expected, "boundary bursts");
        assert_eq!(engine.nodes_in_use(), 0, "every node back");
        assert!(handles.len() > 10_000, "{} timers", handles.len());
    });
}

/// Shared state for [`callbacks_reset_cancel_and_schedule_their_slot_mates_mid_walk`].
struct Mates {
    engine: OnceLock<&'static TimerEngine>,
    handles: OnceLock<Vec<TimerHandle>>,
    log: Log,
    /// Per timer: the deadline (ms) of its last successful reset, else its first.
    deadline: Vec<AtomicU64>,
    cancelled: Vec<AtomicBool>,
    /// New timers scheduled from callbacks: (floor ms, runs).
    spawned: Mutex<Vec<(u64, Arc<AtomicUsize>)>>,
    /// What a callback saw go wrong (a panic in a callback is contained by the engine, so
    /// callbacks report here and the test checks afterwards).
    faults: Mutex<Vec<String>>,
}

/// A slot of 3000 timers (three run queues' worth, so that the walk is split across looks
/// and callbacks run between them), each of whose callbacks acts on slot mates while the
/// slot is being walked from both ends: it pushes back its mirror image (the tail end
/// while the head end runs) and its partner half the slot away by 0 to 3 ticks (0: the
/// same tick, or now when run late), cancels another, and
/// schedules a new timer due at once. Every reset or cancel that returned `true` holds: a
/// timer runs exactly once, at its last deadline, or never if cancelled; the new ones run
/// once, never early.
#[test]
#[cfg_attr(miri, ignore)]
fn callbacks_reset_cancel_and_schedule_their_slot_mates_mid_walk() {
    within(Duration::from_secs(60), "slot mates", || {
        let (engine, clock) = manual(1);
        let engine: &'static TimerEngine = Box::leak(Box::new(engine));
        let start = clock.now();
        let n = 3_000_usize;
        let mates = Arc::new(Mates {
            engine: OnceLock::new(),
            handles: OnceLock::new(),
            log: Arc::default(),
            deadline: (0..n).map(|_| AtomicU64::new(100)).collect(),
            cancelled: (0..n).map(|_| AtomicBool::new(false)).collect(),
            spawned: Mutex::default(),
            faults: Mutex::default(),
        });
        let _ = mates.engine.set(engine);
        let handles: Vec<_> = (0..n)
            .map(|id| {
                let (mates, clock) = (Arc::clone(&mates), clock.clone());
                engine
                    .schedule_at(start + ms(100), move || {
                        let now = since(&clock, start);
                        mates.log.lock().unwrap().push((id, now));
                        let engine = mates.engine.get().unwrap();
                        let handles = mates.handles.get().unwrap();
                        // Its mirror image, claimed in the same round of the walk from
                        // both ends (so mostly refused), and its partner half the slot
                        // away, still unwalked while the slot's ends run.
                        for mate in [n - 1 - id, (id + n / 2) % n] {
                            let to = now + ((id + mate) % 4) as u64;
                            if engine.reset_at(handles[mate], start + ms(to)) {
                                mates.deadline[mate].store(to, Ordering::SeqCst);
                            }
                        }
                        let other = (id * 7919 + 13) % n;
                        if id % 3 == 0
                            && engine.cancel(handles[other])
                            && mates.cancelled[other].swap(true, Ordering::SeqCst)
                        {
                            mates
                                .faults
                                .lock()
                                .unwrap()
                                .push(format!("{other}: cancelled twice"));
                        }
                        if id % 5 == 0 {
                            let runs = Arc::new(AtomicUsize::new(0));
                            let (r, c, m) = (Arc::clone(&runs), clock.clone(), Arc::clone(&mates));
                            let floor = now;
                            engine
                                .schedule(Duration::ZERO, move || {
                                    let at = since(&c, start);
                                    if at < floor {
                                        m.faults
                                            .lock()
                                            .unwrap()
                                            .push(format!("new at {at} < {floor}"));
                                    }
                                    r.fetch_add(1, Ordering::SeqCst);
                                })
                                .unwrap();
                            mates.spawned.lock().unwrap().push((floor, runs));
                        }
                    })
                    .unwrap()
            })
            .collect();
        let _ = mates.handles.set(handles);
        run_for(engine, &clock, 99);
        assert!(mates.log.lock().unwrap().is_empty(), "nothing early");
        run_for(engine, &clock, 10);
        let expected = expected_runs(&mates.deadline, &mates.cancelled);
        assert_eq!(
            *mates.faults.lock().unwrap(),
            Vec::<String>::new(),
            "callback faults"
        );
        assert_ran_exactly(&mates.log, &expected, "slot mates");
        let moved = expected
            .iter()
            .filter(|d| d.is_some_and(|d| d > 100))
            .count();
        assert!(moved > 100, "the walk met pushed-back timers: {moved}");
        for (floor, runs) in mates.spawned.lock().unwrap().iter() {
            assert_eq!(
                runs.load(Ordering::SeqCst),
                1,
                "a new timer from {floor} ms"
            );
        }
        assert_eq!(engine.nodes_in_use(), 0, "every node back");
        engine.shutdown(PendingTimers::Drop);
    });
}

/// Repeating timers of periods 1, 2, 3, 7, 64 and 65 ms sharing crowded ticks with
/// one-shots (so the slots they come due in are walked from both ends, and a repeating
/// timer filed again lands at a slot's tail), over 300 ms and four block boundaries; some
/// cancelled halfway, some pushed back once. Each runs at exactly the multiples of its
/// period (from its reset, for those reset), and never after a cancel that returned true.
#[test]
#[cfg_attr(miri, ignore)]
fn repeating_timers_in_crowded_slots_run_at_every_period_exactly() {
    let (engine, clock) = manual(1);
    let start = clock.now();
    let periods = [1_u64, 2, 3, 7, 64, 65];
    let reps = 240_usize;
    let runs: Arc<Vec<Mutex<Vec<u64>>>> = Arc::new((0..reps).map(|_| Mutex::default()).collect());
    let handles: Vec<_> = (0..reps)
        .map(|id| {
            let (runs, c) = (Arc::clone(&runs), clock.clone());
            engine
                .schedule_repeating(ms(periods[id % periods.len()]), move || {
                    runs[id].lock().unwrap().push(since(&c, start));
                })
                .unwrap()
        })
        .collect();
    let log: Log = Arc::default();
    let mut rng = Rng(0x5EED);
    let mut one_shots = Vec::new();
    for id in 0..6_000 {
        // Crowded: most on a few ticks the repeating timers also come due at.
        let at = if rng.percent(70) {
            [64, 65, 128, 130, 192, 195][id % 6]
        } else {
            1 + rng.below(299)
        };
        one_shots.push(Some(at));
        engine
            .schedule_at(start + ms(at), record(&log, &clock, start, id))
            .unwrap();
    }
    run_for(&engine, &clock, 150);
    let mut pushed = HashMap::new();
    for (id, &handle) in handles.iter().enumerate() {
        match id % 12 {
            0 => assert!(engine.cancel(handle), "cancel of a repeating timer"),
            1 => {
                assert!(engine.reset(handle, ms(5)));
                pushed.insert(id, 155_u64);
            }
            _ => {}
        }
    }
    run_for(&engine, &clock, 150);
    for id in 0..reps {
        let period = periods[id % periods.len()];
        let want: Vec<u64> = match (id % 12, pushed.get(&id)) {
            (0, _) => (1..)
                .map(|k| k * period)
                .take_while(|&t| t <= 150)
                .collect(),
            (_, Some(&from)) => {
                let before = (1..).map(|k| k * period).take_while(|&t| t <= 150);
                let after = (0..).map(|k| from + k * period).take_while(|&t| t <= 300);
                before.chain(after).collect()
            }
            _ => (1..)
                .map(|k| k * period)
                .take_while(|&t| t <= 300)
                .collect(),
        };
        assert_eq!(
            *runs[id].lock().unwrap(),
            want,
            "repeating timer {id}, period {period}"
        );
    }
    assert_ran_exactly(&log, &one_shots, "one-shots beside repeating timers");
    engine.shutdown(PendingTimers::Drop);
    assert_eq!(engine.nodes_in_use(), 0, "every node back");
}

/// Per-timer records for the racing tests: runs, when it last ran, the deadline its last
/// successful schedule or reset gave it, and whether a cancel returned `true`.
struct Book {
    runs: Vec<AtomicUsize>,
    ran_at: Vec<AtomicU64>,
    floor: Vec<AtomicU64>,
    cancelled: Vec<AtomicBool>,
}

impl Book {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Self {
            runs: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            ran_at: (0..n).map(|_| AtomicU64::new(0)).collect(),
            floor: (0..n).map(|_| AtomicU64::new(0)).collect(),
            cancelled: (0..n).map(|_| AtomicBool::new(false)).collect(),
        })
    }

    /// Exactly once and never early, or never after a winning cancel; (ran, cancelled).
    fn check(&self) -> (u64, u64) {
        let (mut ran, mut cancelled) = (0, 0);
        for id in 0..self.runs.len() {
            let runs = self.runs[id].load(Ordering::SeqCst);
            if self.cancelled[id].load(Ordering::SeqCst) {
                assert_eq!(runs, 0, "timer {id}: cancel returned true, yet it ran");
                cancelled += 1;
            } else {
                assert_eq!(runs, 1, "timer {id} ran {runs} times, not exactly once");
                let (at, floor) = (
                    self.ran_at[id].load(Ordering::SeqCst),
                    self.floor[id].load(Ordering::SeqCst),
                );
                assert!(
                    at >= floor,
                    "timer {id} ran at {at}, before its deadline {floor}"
                );
                ran += 1;
            }
        }
        (ran, cancelled)
    }
}

/// Two shards, hand-driven a millisecond at a time over two block boundaries, with lone
/// due slots of 1, 2, 3 or a few hundred timers; two threads meanwhile cancel timers and
/// push them back (each owns one parity, so its confirmed resets are the last word),
/// racing the claim of the slot being walked. Never early, exactly once or cancelled,
/// stats agree, every node back.
#[test]
#[cfg_attr(miri, ignore)]
fn cancels_and_push_backs_racing_the_claim_of_lone_slots() {
    within(Duration::from_secs(60), "racing claims", || {
        let (engine, clock) = manual(2);
        let engine = Arc::new(engine);
        let start = clock.now();
        let sizes = [1_u64, 2, 3, 1, 2, 3, 400];
        let mut deadlines = Vec::new();
        for tick in 20..200 {
            for _ in 0..sizes[tick as usize % sizes.len()] {
                deadlines.push(tick);
            }
        }
        let n = deadlines.len();
        let book = Book::new(n);
        let handles: Arc<Vec<TimerHandle>> = Arc::new(
            deadlines
                .iter()
                .enumerate()
                .map(|(id, &tick)| {
                    book.floor[id].store(tick, Ordering::SeqCst);
                    let (b, c) = (Arc::clone(&book), clock.clone());
                    engine
                        .schedule_at(start + ms(tick), move || {
                            b.ran_at[id].store(since(&c, start), Ordering::SeqCst);
                            b.runs[id].fetch_add(1, Ordering::SeqCst);
                        })
                        .unwrap()
                })
                .collect(),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let racers: Vec<_> = (0..2_usize)
            .map(|r| {
                let (engine, handles, book, stop, clock) = (
                    Arc::clone(&engine),
                    Arc::clone(&handles),
                    Arc::clone(&book),
                    Arc::clone(&stop),
                    clock.clone(),
                );
                std::thread::spawn(move || {
                    let mut rng = Rng(0xACE0 + r as u64);
                    let mut moves = 0_usize;
                    while !stop.load(Ordering::SeqCst) {
                        // Mostly timers due now or in the next few ticks.
                        let now = since(&clock, start);
                        let id = if rng.percent(80) {
                            let near = deadlines_near(&book, now, &mut rng, r);
                            match near {
                                Some(id) => id,
                                None => continue,
                            }
                        } else {
                            (rng.below(n as u64 / 2) * 2) as usize + r
                        };
                        if id >= n {
                            continue;
                        }
                        if rng.percent(30) {
                            if engine.cancel(handles[id]) {
                                assert!(!book.cancelled[id].swap(true, Ordering::SeqCst));
                                moves += 1;
                            }
                        } else {
                            let to = book.floor[id].load(Ordering::SeqCst) + rng.range(1, 4);
                            if engine.reset_at(handles[id], start + ms(to)) {
                                book.floor[id].store(to, Ordering::SeqCst);
                                moves += 1;
                            }
                        }
                        if rng.percent(20) {
                            std::thread::yield_now();
                        }
                    }
                    moves
                })
            })
            .collect();
        for _ in 0..260 {
            clock.advance(ms(1));
            while engine.turn() > 0 {}
            // Time for the racers to aim at the next slots.
            std::thread::sleep(Duration::from_micros(500));
        }
        stop.store(true, Ordering::SeqCst);
        let mut moves = 0;
        for racer in racers {
            moves += racer.join().unwrap();
        }
        assert!(moves > 100, "the racers reset or cancelled {moves} timers");
        run_for(&engine, &clock, 2_000);
        let (ran, cancelled) = book.check();
        let stats = engine.stats().total;
        assert_eq!(
            (stats.fired, stats.cancelled, stats.scheduled, stats.pending),
            (ran, cancelled, n as u64, 0),
            "{stats:?}"
        );
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0, "every node back");
    });
}

/// A timer of parity `r` whose deadline is within a few ticks of `now`, if a few tries find
/// one (the racers aim at the slot being walked).
fn deadlines_near(book: &Book, now: u64, rng: &mut Rng, r: usize) -> Option<usize> {
    let n = book.floor.len();
    for _ in 0..8 {
        let id = (rng.below(n as u64 / 2) * 2) as usize + r;
        if id < n && book.floor[id].load(Ordering::SeqCst).abs_diff(now) <= 2 {
            return Some(id);
        }
    }
    None
}

/// Real clocks: four threads each schedule bursts of timers all due at the same few
/// instants (each thread's on its own lanes, so several shards' slots come due at once),
/// some cancelled and pushed back by their thread. Never early against the instant, exactly
/// once or cancelled, every node and capture back.
#[test]
#[cfg_attr(miri, ignore)]
fn many_threads_schedule_bursts_due_at_the_same_instant() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 12_000;
    let engine = unpinned(2);
    let live = Live::default();
    let origin = Instant::now();
    let due = [origin + ms(40), origin + ms(41), origin + ms(60)];
    let book = Book::new(THREADS * PER_THREAD);
    let micros = move |at: Instant| at.duration_since(origin).as_micros() as u64;
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (engine, book, live) = (&engine, &book, &live);
            scope.spawn(move || {
                let mut rng = Rng(0xD0E ^ t as u64);
                let mut mine = Vec::new();
                for k in 0..PER_THREAD {
                    let id = t * PER_THREAD + k;
                    let deadline = due[rng.below(3) as usize];
                    book.floor[id].store(micros(deadline), Ordering::SeqCst);
                    let (b, witness) = (Arc::clone(book), live.witness());
                    let handle = engine
                        .schedule_at(deadline, move || {
                            let _keep = &witness;
                            b.ran_at[id].store(micros(Instant::now()), Ordering::SeqCst);
                            b.runs[id].fetch_add(1, Ordering::SeqCst);
                        })
                        .unwrap();
                    mine.push((id, handle));
                }
                for &(id, handle) in &mine {
                    match rng.below(10) {
                        0 if engine.cancel(handle) => {
                            book.cancelled[id].store(true, Ordering::SeqCst);
                        }
                        0 => {}
                        1 => {
                            let to = due[2] + ms(rng.below(3));
                            if engine.reset_at(handle, to) {
                                book.floor[id].store(micros(to), Ordering::SeqCst);
                            }
                        }
                        _ => {}
                    }
                }
            });
        }
    });
    assert!(
        eventually(Duration::from_secs(20), || {
            engine.stats().total.pending == 0 && engine.nodes_in_use() == 0
        }),
        "the engine settles: {:?}",
        engine.stats().total
    );
    let (ran, cancelled) = book.check();
    assert_eq!(ran + cancelled, (THREADS * PER_THREAD) as u64);
    assert_eq!(engine.stats().total.fired, ran);
    assert_all_given_back(&engine, &live);
    let report = engine.shutdown(PendingTimers::Run);
    assert_eq!((report.ran, report.dropped), (0, 0));
}

/// Real clocks: a burst of 60,000 timers due at one instant, and shutdown as soon as the
/// first of them has run, in both modes. With `Run` every timer runs exactly once; with
/// `Drop` each runs at most once and those that did not are the ones reported dropped.
/// Every capture dropped, every node back.
#[test]
#[cfg_attr(miri, ignore)]
fn shutdown_during_a_big_burst_settles_every_timer_once() {
    for pending in [PendingTimers::Run, PendingTimers::Drop] {
        let n = 60_000_usize;
        let engine = unpinned(2);
        let live = Live::default();
        let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect());
        let started = Arc::new(AtomicUsize::new(0));
        let early = Arc::new(AtomicUsize::new(0));
        let deadline = Instant::now() + ms(30);
        for id in 0..n {
            let (runs, started, early, witness) = (
                Arc::clone(&runs),
                Arc::clone(&started),
                Arc::clone(&early),
                live.witness(),
            );
            engine
                .schedule_at(deadline, move || {
                    let _keep = &witness;
                    if Instant::now() < deadline {
                        early.fetch_add(1, Ordering::SeqCst);
                    }
                    started.fetch_add(1, Ordering::SeqCst);
                    runs[id].fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
        }
        assert!(
            eventually(Duration::from_secs(10), || started.load(Ordering::SeqCst)
                > 0),
            "the burst starts"
        );
        let report = engine.shutdown(pending);
        assert_eq!(
            early.load(Ordering::SeqCst),
            0,
            "{pending:?}: ran before the deadline"
        );
        let ran = ran_at_most_once(&runs, pending);
        match pending {
            PendingTimers::Run => {
                assert_eq!(ran, n as u64, "every timer ran: {report:?}");
                assert_eq!(report.dropped, 0);
            }
            PendingTimers::Drop => {
                assert_eq!(ran + report.dropped, n as u64, "ran or dropped: {report:?}");
            }
        }
        assert_all_given_back(&engine, &live);
    }
}

/// Hand-driven: a lone slot of 3000 timers, and a callback halfway through the walk shuts
/// the engine down, in both modes (the turn finishes the engine when it ends). With `Run`
/// every timer runs exactly once; with `Drop` each at most once, and the rest are the ones
/// reported dropped. Every capture dropped, every node back.
#[test]
#[cfg_attr(miri, ignore)]
fn shutdown_from_a_callback_mid_walk_settles_every_timer_once() {
    for pending in [PendingTimers::Run, PendingTimers::Drop] {
        let (engine, clock) = manual(1);
        let engine: &'static TimerEngine = Box::leak(Box::new(engine));
        let live = Live::default();
        let n = 3_000_usize;
        let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect());
        let count = Arc::new(AtomicUsize::new(0));
        let start = clock.now();
        for id in 0..n {
            let (runs, count, witness) = (Arc::clone(&runs), Arc::clone(&count), live.witness());
            engine
                .schedule_at(start + ms(50), move || {
                    let _keep = &witness;
                    runs[id].fetch_add(1, Ordering::SeqCst);
                    if count.fetch_add(1, Ordering::SeqCst) == 1_500 {
                        engine.shutdown(pending);
                    }
                })
                .unwrap();
        }
        run_for(engine, &clock, 60);
        let report = engine.shutdown(pending);
        let ran = ran_at_most_once(&runs, pending);
        match pending {
            PendingTimers::Run => assert_eq!(ran, n as u64, "every timer ran: {report:?}"),
            PendingTimers::Drop => {
                assert_eq!(ran + report.dropped, n as u64, "ran or dropped: {report:?}");
            }
        }
        assert_all_given_back(engine, &live);
    }
}

/// `Wheel::poll_expired` (the single-owner wheel, which keeps `poll`) polled every tick
/// while timers are inserted, pushed back, pulled earlier and cancelled at random, many
/// sharing a tick and many of those changed a few ticks before they are due, over block
/// and level-2 boundaries: each value comes out exactly once, at the first poll at or after
/// its last deadline, never before; and timers due together and never reset come out in
/// the order they were inserted (what "keeps its filing order" promises).
#[test]
#[cfg_attr(miri, ignore)]
fn wheel_poll_expired_with_resets_matches_a_model() {
    let origin = Instant::now();
    let at = |t: u64| origin + Duration::from_millis(t);
    let mut wheel: Wheel<u64> = Wheel::new(Duration::from_millis(1), origin);
    let mut rng = Rng(0x3EE1);
    // value -> (key, deadline tick, ever reset); and (deadline tick, value) for each.
    let mut live: BTreeMap<u64, (corewheel::TimerKey, u64, bool)> = BTreeMap::new();
    let mut due: std::collections::BTreeSet<(u64, u64)> = Default::default();
    let mut next_value = 0_u64;
    let mut plain_order: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut most_at_once = 0;
    for now in 0..9_000_u64 {
        // A few inserts, some in bursts on one tick.
        let inserts = if rng.percent(5) {
            rng.range(50, 300)
        } else {
            rng.below(4)
        };
        let burst_tick = now + 1 + rng.below(200);
        for _ in 0..inserts {
            let tick = if rng.percent(70) {
                burst_tick
            } else {
                now + 1 + rng.below(5_000)
            };
            let value = next_value;
            next_value += 1;
            let key = wheel.insert(at(tick), value);
            live.insert(value, (key, tick, false));
            due.insert((tick, value));
        }
        // Resets and cancels: of timers due within a few ticks, and of any.
        for _ in 0..rng.below(12) {
            let pick = if rng.percent(60) {
                due.range((now + 1 + rng.below(4), 0)..)
                    .next()
                    .map(|&(_, v)| v)
            } else {
                live.range(rng.below(next_value.max(1))..)
                    .next()
                    .map(|(&v, _)| v)
            };
            let Some(value) = pick else { continue };
            let (key, tick, _) = live[&value];
            let to = match rng.below(10) {
                0..=5 => {
                    let most = if rng.percent(50) { 4 } else { 300 };
                    tick + rng.range(1, most)
                }
                6..=8 => now + 1 + rng.below(tick.saturating_sub(now).max(1)),
                _ => {
                    assert_eq!(wheel.cancel(key), Some(value));
                    live.remove(&value);
                    due.remove(&(tick, value));
                    continue;
                }
            };
            assert!(wheel.reset(key, at(to)));
            live.insert(value, (key, to, true));
            due.remove(&(tick, value));
            due.insert((to, value));
        }
        let poll_at = at(now + 1);
        let mut this_tick = 0;
        while let Some(value) = wheel.poll_expired(poll_at) {
            let (_, tick, reset) = live.remove(&value).expect("a live value, once");
            due.remove(&(tick, value));
            assert_eq!(
                tick,
                now + 1,
                "value {value} due at {tick} came out at {}",
                now + 1
            );
            this_tick += 1;
            if !reset {
                plain_order.entry(tick).or_default().push(value);
            }
        }
        most_at_once = most_at_once.max(this_tick);
        if let Some(&(tick, value)) = due.first() {
            assert!(
                tick > now + 1,
                "value {value} due at {tick} still in at {}",
                now + 1
            );
        }
        assert_eq!(wheel.len(), live.len(), "the wheel's count");
    }
    for (tick, values) in &plain_order {
        assert!(
            values.is_sorted(),
            "tick {tick}: never-reset timers out of insertion order: {values:?}"
        );
    }
    assert!(most_at_once > 100, "crowded ticks: {most_at_once}");
}

/// How many of the timers counted in `runs` ran, each checked to have run at most once.
fn ran_at_most_once(runs: &[AtomicUsize], pending: PendingTimers) -> u64 {
    for (id, r) in runs.iter().enumerate() {
        assert!(
            r.load(Ordering::SeqCst) <= 1,
            "{pending:?}: timer {id} ran twice"
        );
    }
    runs.iter()
        .filter(|r| r.load(Ordering::SeqCst) == 1)
        .count() as u64
}
