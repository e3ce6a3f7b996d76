//! The eight lists of a finest wheel slot in the engine (`SPLIT` in `src/wheel/core.rs`):
//! a timer's list chosen by its pool index mod 8, and a due slot walked from both ends of
//! each list by `take_interleaved`, `poll_batch`, `take_due` and `unlink_end` (the
//! engine's claim of due timers, in `src/engine/wheel_side.rs`).
//!
//! From the public API only (a timer's pool index, and so its list, is read from its
//! handle with `support::pool_attack::slot`): every one of the 255 non-empty sets of lists
//! in a due slot, one slot per tick, turned a millisecond at a time across a level-2
//! boundary, and again in jumps of up to 40 ticks (more due slots at once than the walk
//! takes in turn); slots of two timers on every pair of lists (the same list: head and
//! tail) and of one timer, one of them cancelled, pushed back, pulled earlier, or pushed
//! back and brought back, a tick or five before the slot is due (the occupied bit when the
//! last timer of list 7 leaves, or when lists 0..6 empty and list 7 still holds one); slots
//! on lists 4..7 only, larger than the run queue, whose callbacks push back, pull earlier
//! and cancel the ends of those lists (and the next slot's) while the walk is split across
//! looks; a burst on lists 3..7 moved ahead of time (pre-cascade and lookahead fill)
//! across a level-2 and a block boundary while timers a few ticks from due are pushed
//! back, pulled earlier and cancelled, turned by the millisecond and in jumps; threads
//! scheduling at one instant so their indices interleave, hand-driven (exact ticks) and on
//! real clocks (never early, exactly once); and shutdown from a callback in the middle of
//! a walk of lists 5..7, in both modes.
//!
//! Hand-driven tests check exact firing ticks (the first turn at or after a timer's last
//! deadline). Real-clock tests assert only never early, exactly once, nothing lost. All
//! randomness is seeded. They can fail: with `is_slot_empty` blind to list 7, six of the
//! eight do (a slot left with one timer on list 7 is dropped from the occupied bits); with
//! the walk skipping list 7, or walking only lists 0..3, all eight hang; with `take_due`
//! dropping a pushed-back timer taken from a list's tail, three fail.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::support::pool_attack::slot;
use crate::support::run_log::{Log, assert_ran_exactly, expected_runs, jump_to, record};
use crate::support::{
    Live, Rng, assert_all_given_back, eventually, manual, ms, run_for, since, unpinned, within,
};
use corewheel::{Clock, ManualClock, PendingTimers, TimerEngine, TimerHandle};

/// How long any one test may take before it counts as hung (a walk that never empties a
/// slot spins for ever).
const LIMIT: Duration = Duration::from_secs(30);

/// Lists per finest slot in the engine's wheel.
const LISTS: usize = 8;

/// Where timers wait until a test gives them a deadline: far past every test's end.
const PARKED: u64 = 600_000;

/// The list of its finest slot that a timer goes on: its pool index mod [`LISTS`].
fn list_of(handle: TimerHandle) -> usize {
    slot(handle).1 as usize % LISTS
}

/// When a timer whose last deadline is `deadline` runs on an engine turned only at
/// `stops` (sorted): at the first stop at or after it.
fn first_stop(stops: &[u64], deadline: u64) -> u64 {
    stops[stops.partition_point(|&stop| stop < deadline)]
}

/// Timers parked at [`PARKED`], grouped by list, scheduled until list `r` has `need[r]`:
/// their handles, and per list the ids (positions in the handles) of its timers.
fn park_until(
    engine: &TimerEngine,
    clock: &ManualClock,
    start: Instant,
    log: &Log,
    need: &[usize; LISTS],
) -> (Vec<TimerHandle>, Vec<Vec<usize>>) {
    let mut handles = Vec::new();
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); LISTS];
    while (0..LISTS).any(|r| groups[r].len() < need[r]) {
        let id = handles.len();
        let handle = engine
            .schedule_at(start + ms(PARKED), record(log, clock, start, id))
            .unwrap();
        groups[list_of(handle)].push(id);
        handles.push(handle);
    }
    (handles, groups)
}

/// Every non-empty set of the eight lists gets a slot of its own: mask `m`'s timers (1 to
/// 3 on each list it names, filed list by list in a seeded order) are due at `base + m`.
/// The engine is turned at `stops`; each timer runs exactly once, at the first stop at or
/// after its tick, and the unused parked timers, cancelled, never.
fn every_set_of_lists(base: u64, stops: &[u64], seed: u64) {
    let (engine, clock) = manual(1);
    let start = clock.now();
    let log: Log = Arc::default();
    let mut rng = Rng(seed);
    let counts: Vec<[usize; LISTS]> = (1..256_u32)
        .map(|mask| {
            std::array::from_fn(|r| {
                if mask >> r & 1 == 1 {
                    rng.range(1, 4) as usize
                } else {
                    0
                }
            })
        })
        .collect();
    let need: [usize; LISTS] = std::array::from_fn(|r| counts.iter().map(|c| c[r]).sum());
    let (handles, groups) = park_until(&engine, &clock, start, &log, &need);
    let mut expected = vec![None; handles.len()];
    let mut taken = [0_usize; LISTS];
    for (m, count) in counts.iter().enumerate() {
        let due = base + 1 + m as u64;
        let mut order: Vec<usize> = (0..LISTS).collect();
        for i in (1..LISTS).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for r in order {
            for _ in 0..count[r] {
                let id = groups[r][taken[r]];
                taken[r] += 1;
                assert!(engine.reset_at(handles[id], start + ms(due)), "reset {id}");
                expected[id] = Some(first_stop(stops, due));
            }
        }
    }
    for r in 0..LISTS {
        for &id in &groups[r][taken[r]..] {
            assert!(engine.cancel(handles[id]), "cancel {id}");
        }
    }
    for &at in stops {
        jump_to(&engine, &clock, start, at);
    }
    assert_ran_exactly(&log, &expected, &format!("sets of lists from {base}"));
    let fired = expected.iter().flatten().count() as u64;
    let stats = engine.stats().total;
    assert_eq!((stats.fired, stats.pending), (fired, 0), "{stats:?}");
    assert_eq!(engine.nodes_in_use(), 0, "every node back");
}

/// Each of the 255 non-empty sets of the eight lists (lists 4..7 alone, 5..7 alone, 7
/// alone, every mix with the old four) in a slot of its own, 1 to 3 timers a list, one
/// slot per tick from 3971 to 4225 ms: across a block boundary (4032), the level-2
/// boundary (4096) and the block after (4160). Turned every millisecond, so each slot is
/// walked alone: each timer runs exactly at its tick. A list the walk skipped, or a slot
/// whose occupied bit was cleared while a list still held a timer, leaves timers unrun.
#[test]
#[cfg_attr(miri, ignore)]
fn every_set_of_the_eight_lists_runs_at_its_tick() {
    let stops: Vec<u64> = (1..=4_300).collect();
    within(LIMIT, "sets of lists, every tick", move || {
        every_set_of_lists(3_970, &stops, 0x005E_70F8);
    });
}

/// The same 255 sets of lists, one slot per tick from 251 ms on (over four block
/// boundaries), but the engine turned in seeded jumps of 1 to 40 ticks: a look then finds
/// up to 40 due slots, more than the 16 the walk takes in turn, each of a different set of
/// lists. Each timer runs exactly once, at the first turn at or after its tick.
#[test]
#[cfg_attr(miri, ignore)]
fn every_set_of_the_eight_lists_in_jumps_over_many_due_slots() {
    let mut rng = Rng(0x1D2);
    let mut stops = vec![200_u64];
    while *stops.last().unwrap() < 600 {
        let next = stops.last().unwrap() + rng.range(1, 41);
        stops.push(next);
    }
    within(LIMIT, "sets of lists, in jumps", move || {
        every_set_of_lists(250, &stops, 0x1D3);
    });
}

/// What [`pairs_and_singles_on_every_list_with_one_changed`] does to a timer due at `due`:
/// change `kind`, the deadline it then runs at, or `None` if cancelled.
fn change(
    engine: &TimerEngine,
    start: Instant,
    handle: TimerHandle,
    due: u64,
    kind: usize,
) -> Option<u64> {
    let reset = |t: u64| assert!(engine.reset_at(handle, start + ms(t)), "reset to {t}");
    match kind {
        0 => {
            assert!(engine.cancel(handle), "cancel");
            None
        }
        // Pushed back: stays on its list, and the walk must move it on.
        1 => {
            reset(due + 1);
            Some(due + 1)
        }
        // Pushed back into the next block.
        2 => {
            reset(due + 70);
            Some(due + 70)
        }
        // Pulled a tick earlier: a message unlinks it from its list.
        3 => {
            reset(due - 1);
            Some(due - 1)
        }
        // Pushed back, then back to its own tick: filed again at its list's tail.
        4 => {
            reset(due + 2);
            reset(due);
            Some(due)
        }
        // Pulled earlier, then pushed back past the slot.
        _ => {
            reset(due - 1);
            reset(due + 3);
            Some(due + 3)
        }
    }
}

/// Kinds of change [`change`] knows.
const CHANGES: usize = 6;

/// Slots of exactly two timers on every ordered pair of the eight lists (on the same
/// list: its head and its tail), and slots of one timer on each list; one timer of each
/// slot (the first filed, or the second) is cancelled, pushed back a tick or into the next
/// block, pulled a tick earlier, pushed back and brought back, or pulled earlier and pushed
/// back, one or five ticks before the slot is due. Slots two ticks apart, over 1500 ms;
/// turned every millisecond. Each timer runs exactly at its last deadline: a slot whose
/// last timer (on list 7, say) left is empty and harms nothing, and a slot whose only
/// timer left is on list 7 keeps its occupied bit.
#[test]
#[cfg_attr(miri, ignore)]
fn pairs_and_singles_on_every_list_with_one_changed() {
    within(
        LIMIT,
        "pairs_and_singles_on_every_list_with_one_changed",
        || {
            let (engine, clock) = manual(1);
            let start = clock.now();
            let log: Log = Arc::default();
            // (lists of its timers, which one is changed, the change)
            let mut cases: Vec<(Vec<usize>, usize, usize)> = Vec::new();
            for r in 0..LISTS {
                for s in 0..LISTS {
                    for which in 0..2 {
                        for kind in 0..CHANGES {
                            cases.push((vec![r, s], which, kind));
                        }
                    }
                }
                for kind in 0..CHANGES {
                    cases.push((vec![r], 0, kind));
                }
            }
            let mut need = [0_usize; LISTS];
            for (lists, _, _) in &cases {
                for &r in lists {
                    need[r] += 1;
                }
            }
            let (handles, groups) = park_until(&engine, &clock, start, &log, &need);
            let mut expected = vec![None; handles.len()];
            let mut taken = [0_usize; LISTS];
            // Per tick at which changes are made: (timer id, its tick, the change).
            let mut changes: BTreeMap<u64, Vec<(usize, u64, usize)>> = BTreeMap::new();
            for (case, (lists, which, kind)) in cases.iter().enumerate() {
                let due = 100 + 2 * case as u64;
                let mut ids = Vec::new();
                for &r in lists {
                    let id = groups[r][taken[r]];
                    taken[r] += 1;
                    assert!(engine.reset_at(handles[id], start + ms(due)));
                    expected[id] = Some(due);
                    ids.push(id);
                }
                let lead = if case % 2 == 0 { 1 } else { 5 };
                changes
                    .entry(due - lead)
                    .or_default()
                    .push((ids[*which], due, *kind));
            }
            for r in 0..LISTS {
                for &id in &groups[r][taken[r]..] {
                    assert!(engine.cancel(handles[id]));
                }
            }
            let end = 100 + 2 * cases.len() as u64 + 100;
            for now in 1..=end {
                clock.advance(ms(1));
                for (id, due, kind) in changes.remove(&now).unwrap_or_default() {
                    expected[id] = change(&engine, start, handles[id], due, kind);
                }
                while engine.turn() > 0 {}
            }
            assert_ran_exactly(&log, &expected, "pairs and singles");
            assert_eq!(engine.nodes_in_use(), 0, "every node back");
        },
    );
}

/// Shared state for [`ends_of_lists_four_to_seven_changed_while_the_walk_is_split`].
struct Ends {
    engine: OnceLock<&'static TimerEngine>,
    handles: OnceLock<Vec<TimerHandle>>,
    /// Per list, the ids of the slot's timers on it in filing order (head first).
    lists: OnceLock<Vec<Vec<usize>>>,
    /// Per list, the ids of the next slot's timers on it.
    next_lists: OnceLock<Vec<Vec<usize>>>,
    log: Log,
    /// Per timer: the deadline (ms) of its last successful reset, else its first.
    deadline: Vec<AtomicU64>,
    cancelled: Vec<AtomicBool>,
}

impl Ends {
    /// Resets `mate` to `to` ms; records it if the reset took.
    fn reset(&self, start: Instant, mate: usize, to: u64) {
        let engine = self.engine.get().unwrap();
        let handle = self.handles.get().unwrap()[mate];
        if engine.reset_at(handle, start + ms(to)) {
            self.deadline[mate].store(to, Ordering::SeqCst);
        }
    }

    /// Cancels `mate`; records it if the cancel took.
    fn cancel(&self, mate: usize) {
        let engine = self.engine.get().unwrap();
        if engine.cancel(self.handles.get().unwrap()[mate]) {
            assert!(!self.cancelled[mate].swap(true, Ordering::SeqCst));
        }
    }
}

/// Two slots on lists 4..7 only (the upper four lists; lists 0..3 emptied by
/// cancels): 3000 timers due at 100 ms, three run queues' worth, so the walk from both
/// ends of each list is split across looks with callbacks run between them, and 800 due
/// at 101 ms. Each callback of the first slot pushes back (by 0 to 3 ticks) the timers at
/// the same distance from the other end of its own list and of the next of lists 4..7, and
/// the one half its list away (each mate by its own 0 to 3 ticks); every third cancels a timer near either end of another of
/// those lists; every fourth pulls a timer of the next slot (at either end of its list)
/// to now. Every reset or cancel that returned `true` holds: each timer runs exactly once,
/// at its last deadline, or never.
#[test]
#[cfg_attr(miri, ignore)]
fn ends_of_lists_four_to_seven_changed_while_the_walk_is_split() {
    within(
        LIMIT,
        "ends_of_lists_four_to_seven_changed_while_the_walk_is_split",
        || {
            let (engine, clock) = manual(1);
            let engine: &'static TimerEngine = Box::leak(Box::new(engine));
            let start = clock.now();
            let (first, second) = (6_000_usize, 1_600_usize);
            let n = first + second;
            let ends = Arc::new(Ends {
                engine: OnceLock::new(),
                handles: OnceLock::new(),
                lists: OnceLock::new(),
                next_lists: OnceLock::new(),
                log: Arc::default(),
                deadline: (0..n)
                    .map(|id| AtomicU64::new(if id < first { 100 } else { 101 }))
                    .collect(),
                cancelled: (0..n).map(|_| AtomicBool::new(false)).collect(),
            });
            let _ = ends.engine.set(engine);
            let mut handles = Vec::new();
            for id in 0..n {
                let (e, c) = (Arc::clone(&ends), clock.clone());
                let due = if id < first { 100 } else { 101 };
                let handle = engine
                    .schedule_at(start + ms(due), move || {
                        let now = since(&c, start);
                        e.log.lock().unwrap().push((id, now));
                        if id >= first {
                            return;
                        }
                        let lists = e.lists.get().unwrap();
                        let list = list_of(e.handles.get().unwrap()[id]);
                        let at = lists[list].iter().position(|&x| x == id).unwrap();
                        let k = lists[list].len();
                        let other = &lists[4 + (list - 3) % 4];
                        let mates = [
                            lists[list][k - 1 - at],
                            lists[list][(at + k / 2) % k],
                            other[other.len() - 1 - at.min(other.len() - 1)],
                        ];
                        for mate in mates {
                            // By the mate alone, so that later resets of it mostly agree.
                            e.reset(start, mate, now + (mate / LISTS % 4) as u64);
                        }
                        if id % 3 == 0 {
                            let victims = &lists[4 + (list - 2) % 4];
                            let near = (id / 3) % 4;
                            let victim = if id % 2 == 0 {
                                victims[near.min(victims.len() - 1)]
                            } else {
                                victims[victims.len() - 1 - near.min(victims.len() - 1)]
                            };
                            e.cancel(victim);
                        }
                        if id % 4 == 0 {
                            let next = &e.next_lists.get().unwrap()[list];
                            let pick = (id / 4) % next.len();
                            let mate = if id % 8 == 0 {
                                next[pick / 2]
                            } else {
                                next[next.len() - 1 - pick / 2]
                            };
                            e.reset(start, mate, now);
                        }
                    })
                    .unwrap();
                handles.push(handle);
            }
            let mut lists: Vec<Vec<usize>> = vec![Vec::new(); LISTS];
            let mut next_lists: Vec<Vec<usize>> = vec![Vec::new(); LISTS];
            for (id, &handle) in handles.iter().enumerate() {
                let r = list_of(handle);
                if r < 4 {
                    assert!(engine.cancel(handle));
                    ends.cancelled[id].store(true, Ordering::SeqCst);
                } else if id < first {
                    lists[r].push(id);
                } else {
                    next_lists[r].push(id);
                }
            }
            assert!(lists[4..].iter().all(|list| list.len() > 600), "lists 4..7");
            let _ = ends.handles.set(handles);
            let _ = ends.lists.set(lists);
            let _ = ends.next_lists.set(next_lists);
            run_for(engine, &clock, 99);
            assert!(ends.log.lock().unwrap().is_empty(), "nothing early");
            run_for(engine, &clock, 10);
            let expected = expected_runs(&ends.deadline, &ends.cancelled);
            assert_ran_exactly(&ends.log, &expected, "ends of lists 4..7");
            let pushed = expected.iter().flatten().filter(|&&d| d > 101).count();
            let pulled = (first..n).filter(|&id| expected[id] == Some(100)).count();
            assert!(pushed > 100, "the walk met pushed-back timers: {pushed}");
            assert!(
                pulled > 50,
                "timers of the next slot pulled earlier: {pulled}"
            );
            run_for(engine, &clock, 50);
            assert_eq!(engine.nodes_in_use(), 0, "every node back");
            engine.shutdown(PendingTimers::Drop);
        },
    );
}

/// A burst on lists 3..7 (lists 0..2 emptied by cancels) of 9000 timers due from 4060 to
/// 4170 ms, scheduled at the start: it sits on level 2 and level 1 and is moved down ahead
/// of time (pre-cascade into level 1, the lookahead's paced fill into the next block's
/// split slots) across the level-2 boundary (4096) and a block boundary (4160). From 4000
/// ms on, every turn pushes back (by 1 to 70 ticks), pulls earlier (to the next tick) or
/// cancels timers on lists 4..7 due in the next six ticks. Turned every millisecond, then
/// (a second engine) in seeded jumps of 1 to 24 ticks. Each timer runs exactly once, at the
/// first turn at or after its last deadline.
#[test]
#[cfg_attr(miri, ignore)]
fn a_burst_on_the_new_lists_moved_ahead_of_time_over_boundaries() {
    within(
        LIMIT,
        "a_burst_on_the_new_lists_moved_ahead_of_time_over_boundaries",
        || {
            for jumps in [false, true] {
                let (engine, clock) = manual(1);
                let start = clock.now();
                let log: Log = Arc::default();
                let mut rng = Rng(0xB0B ^ u64::from(jumps));
                let mut handles = Vec::new();
                let mut deadline = Vec::new();
                let mut by_tick: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
                let dues: Vec<u64> = (0..15_000).map(|_| rng.range(4_060, 4_171)).collect();
                let scheduled: Vec<_> = (0..dues.len())
                    .map(|id| {
                        engine
                            .schedule_at(start + ms(dues[id]), record(&log, &clock, start, id))
                            .unwrap()
                    })
                    .collect();
                // Cancelled once all are scheduled: a cancelled timer's node (and index) is the
                // next one handed out.
                for (id, handle) in scheduled.into_iter().enumerate() {
                    let due = dues[id];
                    if list_of(handle) < 3 {
                        assert!(engine.cancel(handle));
                        deadline.push(None);
                    } else {
                        deadline.push(Some(due));
                        if list_of(handle) >= 4 {
                            by_tick.entry(due).or_default().push(id);
                        }
                    }
                    handles.push(handle);
                }
                let mut pushes = vec![0_u8; handles.len()];
                let mut stops = Vec::new();
                let mut now = 0_u64;
                let mut changed = 0;
                while now < 4_400 {
                    now += match (now < 3_990, jumps) {
                        (true, _) => 10,
                        (false, false) => 1,
                        (false, true) => rng.range(1, 25),
                    };
                    clock.advance_to(start + ms(now));
                    if now >= 4_000 {
                        for tick in now + 1..=now + 6 {
                            let Some(ids) = by_tick.remove(&tick) else {
                                continue;
                            };
                            let mut stay = Vec::new();
                            for id in ids {
                                match rng.below(100) {
                                    // Never past the last turn: 4170 + 3 * 70 < 4400.
                                    0..=14 if pushes[id] < 3 => {
                                        pushes[id] += 1;
                                        let to = tick + rng.range(1, 71);
                                        assert!(engine.reset_at(handles[id], start + ms(to)));
                                        deadline[id] = Some(to);
                                        by_tick.entry(to).or_default().push(id);
                                        changed += 1;
                                    }
                                    15..=19 if tick > now + 1 => {
                                        assert!(engine.reset_at(handles[id], start + ms(now + 1)));
                                        deadline[id] = Some(now + 1);
                                        changed += 1;
                                    }
                                    20..=22 => {
                                        assert!(engine.cancel(handles[id]));
                                        deadline[id] = None;
                                        changed += 1;
                                    }
                                    _ => stay.push(id),
                                }
                            }
                            by_tick.insert(tick, stay);
                        }
                    }
                    while engine.turn() > 0 {}
                    stops.push(now);
                }
                let expected: Vec<_> = deadline
                    .iter()
                    .map(|d| d.map(|d| first_stop(&stops, d)))
                    .collect();
                assert_ran_exactly(&log, &expected, &format!("burst, jumps {jumps}"));
                assert!(changed > 500, "changes: {changed}");
                assert_eq!(engine.nodes_in_use(), 0, "every node back");
            }
        },
    );
}

/// Four threads schedule at once into a hand-driven engine's one shard, their timers due
/// at 100 and 101 ms, so that pool indices (and lists) of different threads interleave in
/// each slot; each thread then cancels every seventh of its own and pushes every fifth
/// back to 102 or 103 ms. Once they are done, the engine is turned every millisecond: each
/// timer runs exactly once, at its last deadline, or never.
#[test]
#[cfg_attr(miri, ignore)]
fn threads_scheduling_at_one_instant_interleave_their_lists() {
    within(
        LIMIT,
        "threads_scheduling_at_one_instant_interleave_their_lists",
        || {
            const THREADS: usize = 4;
            const EACH: usize = 1_500;
            let (engine, clock) = manual(1);
            let start = clock.now();
            let log: Log = Arc::default();
            let expected: Vec<Option<u64>> = std::thread::scope(|scope| {
                let workers: Vec<_> = (0..THREADS)
                    .map(|t| {
                        let (engine, clock, log) = (&engine, &clock, &log);
                        scope.spawn(move || {
                            let mut mine = Vec::new();
                            for k in 0..EACH {
                                let id = t * EACH + k;
                                let due = 100 + (k % 2) as u64;
                                let handle = engine
                                    .schedule_at(start + ms(due), record(log, clock, start, id))
                                    .unwrap();
                                mine.push((handle, Some(due)));
                            }
                            for (k, (handle, due)) in mine.iter_mut().enumerate() {
                                if k % 7 == 0 {
                                    assert!(engine.cancel(*handle));
                                    *due = None;
                                } else if k % 5 == 0 {
                                    let to = 102 + (k % 2) as u64;
                                    assert!(engine.reset_at(*handle, start + ms(to)));
                                    *due = Some(to);
                                }
                            }
                            let lists: Vec<usize> = mine.iter().map(|(h, _)| list_of(*h)).collect();
                            (mine.into_iter().map(|(_, d)| d).collect::<Vec<_>>(), lists)
                        })
                    })
                    .collect();
                let mut all = Vec::new();
                let mut seen = [0_usize; LISTS];
                for worker in workers {
                    let (dues, lists) = worker.join().unwrap();
                    all.extend(dues);
                    for r in lists {
                        seen[r] += 1;
                    }
                }
                assert!(seen.iter().all(|&c| c > 0), "every list used: {seen:?}");
                all
            });
            run_for(&engine, &clock, 120);
            assert_ran_exactly(&log, &expected, "threads at one instant");
            assert_eq!(engine.nodes_in_use(), 0, "every node back");
        },
    );
}

/// Real clocks: four threads each schedule 3000 timers due at one of two instants 1 ms
/// apart, on two shards, then cancel a tenth and push a tenth back by up to 3 ms. Never
/// early, exactly once or cancelled, every capture and node back.
#[test]
#[cfg_attr(miri, ignore)]
fn real_clock_threads_burst_at_one_instant() {
    within(LIMIT, "real_clock_threads_burst_at_one_instant", || {
        const THREADS: usize = 4;
        const EACH: usize = 3_000;
        let n = THREADS * EACH;
        let engine = unpinned(2);
        let live = Live::default();
        let origin = Instant::now();
        let due = [origin + ms(60), origin + ms(61)];
        let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect());
        // Per timer: when it last ran, and its last deadline, as micros since `origin`; and
        // whether a cancel took.
        let ran_at: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
        let floor: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
        let cancelled: Vec<AtomicBool> = (0..n).map(|_| AtomicBool::new(false)).collect();
        let micros = move |at: Instant| at.duration_since(origin).as_micros() as u64;
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let (engine, live, runs, ran_at, floor, cancelled) =
                    (&engine, &live, &runs, &ran_at, &floor, &cancelled);
                scope.spawn(move || {
                    let mut rng = Rng(0xC0C0 ^ t as u64);
                    let mut mine = Vec::new();
                    for k in 0..EACH {
                        let id = t * EACH + k;
                        let at = due[rng.below(2) as usize];
                        floor[id].store(micros(at), Ordering::SeqCst);
                        let (runs, ran_at, witness) =
                            (Arc::clone(runs), Arc::clone(ran_at), live.witness());
                        let handle = engine
                            .schedule_at(at, move || {
                                let _keep = &witness;
                                ran_at[id].store(micros(Instant::now()), Ordering::SeqCst);
                                runs[id].fetch_add(1, Ordering::SeqCst);
                            })
                            .unwrap();
                        mine.push((id, handle, at));
                    }
                    for (id, handle, at) in mine {
                        match rng.below(10) {
                            0 if engine.cancel(handle) => {
                                cancelled[id].store(true, Ordering::SeqCst);
                            }
                            1 => {
                                let to = at + Duration::from_micros(rng.below(3_000));
                                if engine.reset_at(handle, to) {
                                    floor[id].store(micros(to), Ordering::SeqCst);
                                }
                            }
                            _ => {}
                        }
                    }
                });
            }
        });
        assert!(
            eventually(Duration::from_secs(5), || engine.stats().total.pending == 0),
            "the engine settles: {:?}",
            engine.stats().total
        );
        let mut ran = 0;
        for id in 0..n {
            let r = runs[id].load(Ordering::SeqCst);
            if cancelled[id].load(Ordering::SeqCst) {
                assert_eq!(r, 0, "timer {id}: cancelled, yet ran");
            } else {
                assert_eq!(r, 1, "timer {id} ran {r} times");
                let (at, floor) = (
                    ran_at[id].load(Ordering::SeqCst),
                    floor[id].load(Ordering::SeqCst),
                );
                assert!(at >= floor, "timer {id} ran at {at} us, before {floor} us");
                ran += 1;
            }
        }
        assert_eq!(engine.stats().total.fired, ran);
        assert_all_given_back(&engine, &live);
    });
}

/// Hand-driven: 4000 timers due at 50 ms, those on lists 0..4 cancelled, so the slot is
/// lists 5..7 only (about 1500 timers, more than the run queue); a callback 700 runs into
/// the walk shuts the engine down, in both modes. With `Run` every timer left runs exactly
/// once; with `Drop` each at most once, and the rest are the ones reported dropped. Every
/// capture dropped, every node back.
#[test]
#[cfg_attr(miri, ignore)]
fn shutdown_mid_walk_of_lists_five_to_seven() {
    within(LIMIT, "shutdown_mid_walk_of_lists_five_to_seven", || {
        for pending in [PendingTimers::Run, PendingTimers::Drop] {
            let (engine, clock) = manual(1);
            let engine: &'static TimerEngine = Box::leak(Box::new(engine));
            let live = Live::default();
            let n = 4_000_usize;
            let runs: Arc<Vec<AtomicUsize>> =
                Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect());
            let count = Arc::new(AtomicUsize::new(0));
            let start = clock.now();
            let handles: Vec<_> = (0..n)
                .map(|id| {
                    let (runs, count, witness) =
                        (Arc::clone(&runs), Arc::clone(&count), live.witness());
                    engine
                        .schedule_at(start + ms(50), move || {
                            let _keep = &witness;
                            runs[id].fetch_add(1, Ordering::SeqCst);
                            if count.fetch_add(1, Ordering::SeqCst) == 700 {
                                engine.shutdown(pending);
                            }
                        })
                        .unwrap()
                })
                .collect();
            // Cancelled once all are scheduled: a cancelled timer's node (and index) is the
            // next one handed out.
            let mut kept = 0_u64;
            for handle in handles {
                if list_of(handle) < 5 {
                    assert!(engine.cancel(handle));
                } else {
                    kept += 1;
                }
            }
            assert!(kept > 1_024, "more than a run queue on lists 5..7: {kept}");
            run_for(engine, &clock, 60);
            let report = engine.shutdown(pending);
            for (id, r) in runs.iter().enumerate() {
                assert!(
                    r.load(Ordering::SeqCst) <= 1,
                    "{pending:?}: timer {id} ran twice"
                );
            }
            let ran = runs
                .iter()
                .filter(|r| r.load(Ordering::SeqCst) == 1)
                .count() as u64;
            assert!(ran > 700, "{pending:?}: the walk began: {ran}");
            match pending {
                PendingTimers::Run => assert_eq!(ran, kept, "every timer ran: {report:?}"),
                PendingTimers::Drop => {
                    assert_eq!(ran + report.dropped, kept, "ran or dropped: {report:?}");
                }
            }
            assert_all_given_back(engine, &live);
        }
    });
}
