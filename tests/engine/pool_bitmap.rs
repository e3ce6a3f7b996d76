//! A shard's pool of timer nodes, handed out from a shared bitmap (one word per 64 nodes),
//! a word at a time, from a cursor that walks the region as a ring; whoever frees nodes
//! ORs their bits back.
//!
//! From the public API: many threads arming, cancelling and firing on a pool of 1024 nodes
//! (refills racing give-backs at the size limit); a pool at its limit that must find one
//! node freed anywhere (behind the cursor, beyond a refill's look, at either end of the
//! region); stale handles whose node is reused, now in address order; threads that exit
//! holding magazines; shutdown racing refills and frees; dropping the engine while threads
//! hold nodes; steady churn at a fixed number of live timers with random deadlines,
//! cancels and resets (timers fire in an order unrelated to their arming), on the manual
//! clock (exact ticks) and on the real clock (never early, exactly once, nothing lost); and
//! the pool's memory under churn.
//!
//! A handle names its node's index and generation only in its `Debug` output; the tests
//! that need them read them from there ([`slot`]).
//!
//! Checked: every schedule succeeds or is a capacity error; no two schedules return the
//! same handle; every timer runs exactly once unless cancelled; stale handles of reused
//! nodes touch nothing; exiting threads, shutdown and drop give every node and capture
//! back; a full pool finds a single node freed anywhere. Under steady churn at 20,000 live
//! the pool stays near the live count, and timers armed after a scrambled return get
//! neighbouring nodes.
//!
//! The pool must be bounded by the timers in flight: a run of 64 or more words whose nodes
//! all stay pending (4,096 long timers armed together, such as idle timeouts set up at
//! start) fills a refill's whole look; if the refill then grows the pool and `grow` moves
//! the cursor to the new chunk, the cursor wraps onto the run again once the chunk is used
//! up, and the pool grows by a chunk per lap, never reusing nodes freed beyond the run.
//! The three `*_grow_every_lap` tests check that a refill that finds nothing near the
//! cursor looks through the whole region while the pool's count of free nodes is at least
//! two chunks, and grows only below that.
//!
//! Mutants of `src/engine/pool.rs` that these tests catch: the take as a load and a store
//! (`refills_spinning_on_a_full_pool_*`: nodes given back between the load and the store
//! are lost, or two threads arm one node), the give as a plain store, a refill that never
//! falls back to a thin word (the manual-clock churn), `grow` keeping none of its chunk and
//! losing the first word, a magazine's word or a chain's last run not given back, no look
//! at every word at the size limit (the exhaustion test).
//!
//! `racing_first_schedules_never_find_an_empty_pool_full`: a schedule racing the carving
//! of a pool's last chunk must not report the pool full with every node free; a refill at
//! the size limit waits for a chunk still being carved.

use crate::support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use crate::support::pool_attack::{
    ArmShape, CHUNK, LIMIT, Outcomes, arm_until_full, manual_engine, pool_nodes, race_arms,
    real_engine, slot,
};
use crate::support::{Live, Rng, eventually, ms, within};
use corewheel::{Clock, ManualClock, PendingTimers, ScheduleError, TimerEngine, TimerHandle};

// ---------------------------------------------------------------------------------------
// Refills racing give-backs at the size limit.
// ---------------------------------------------------------------------------------------

/// Six threads racing [`race_arms`] on one engine, with the id counter and stop flag they
/// share.
struct Racers {
    next: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<(Vec<TimerHandle>, usize)>>,
}

impl Racers {
    /// Starts the six, seeded from `seed` up.
    fn start(
        engine: &Arc<TimerEngine>,
        outcomes: &Arc<Outcomes>,
        seed: u64,
        shutdown_ok: bool,
        live: &Live,
    ) -> Self {
        let (next, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let threads = (0..6)
            .map(|t| {
                let (engine, outcomes, next, stop, live) = (
                    Arc::clone(engine),
                    Arc::clone(outcomes),
                    Arc::clone(&next),
                    Arc::clone(&stop),
                    live.clone(),
                );
                let shape = ArmShape {
                    seed: seed + t,
                    most_delay: ms(4),
                    shutdown_ok,
                };
                std::thread::spawn(move || {
                    race_arms(&engine, &outcomes, (&next, &stop), shape, &live)
                })
            })
            .collect();
        Self {
            next,
            stop,
            threads,
        }
    }
}

/// Attacks the bitmap's take and give where they race hardest: six threads arm timers of
/// 0-4 ms and cancel a random recent one 40% of the time, on one shard whose pool holds
/// 1,024 nodes (16 words), so that refills, the worker's give-backs and the threads' trims
/// race on the same few words and the pool is at its limit most of the time. Every
/// schedule must succeed or be a capacity error; no two schedules may return the same
/// handle (two timers on one node at one generation); each timer runs exactly once, never
/// early, unless its cancel won; and afterwards every node is back: none in use, every
/// capture dropped, and a fresh thread arms exactly 1,024 timers.
#[test]
fn a_tiny_pool_raced_by_many_threads_hands_each_node_to_one_timer_at_a_time() {
    within(LIMIT, "the tiny-pool race", || {
        let engine = real_engine(1, CHUNK);
        let outcomes = Outcomes::new(120_000);
        let live = Live::default();
        let Racers {
            next,
            stop,
            threads,
        } = Racers::start(&engine, &outcomes, 11, false, &live);
        std::thread::sleep(Duration::from_millis(1500));
        stop.store(true, Ordering::Relaxed);
        let mut handles = HashSet::new();
        let mut full = 0;
        let mut armed = 0;
        for thread in threads {
            let (mine, f) = thread.join().expect("an arming thread");
            full += f;
            armed += mine.len();
            for handle in mine {
                assert!(
                    handles.insert(handle),
                    "two timers were handed the same node at the same generation: {handle:?}"
                );
            }
        }
        let ids = next.load(Ordering::SeqCst).min(outcomes.ran.len());
        println!("tiny pool race: {armed} armed, {full} capacity errors, {ids} ids");
        assert!(armed > 1000, "the race armed too little to mean anything");
        assert!(
            eventually(Duration::from_secs(10), || (0..ids)
                .all(|id| outcomes.settled(id))),
            "timers lost: {} never ran nor were cancelled",
            (0..ids).filter(|&id| !outcomes.settled(id)).count()
        );
        outcomes.check(ids);
        support::assert_all_given_back(&engine, &live);
        assert_eq!(
            arm_until_full(&engine, Duration::from_secs(3600)),
            CHUNK,
            "every node came back to the bitmap"
        );
        assert_eq!(pool_nodes(&engine), CHUNK);
    });
}

/// Attacks the take of a word where two refills meet on it: three threads arm timers due
/// at the next tick as fast as they can on one shard whose pool holds 1,024 nodes, so the
/// pool is full nearly all the time and every thread spins on capacity errors, each
/// failing refill looking at every word; as the worker frees each tick's timers a run of
/// nodes at a time, the spinning refills all see the same word turn non-empty and race to
/// take it. No two schedules may return the same handle, each timer runs exactly once,
/// and afterwards every node is back (a fresh thread arms exactly 1,024 timers).
#[test]
fn refills_spinning_on_a_full_pool_never_take_the_same_nodes_twice() {
    within(LIMIT, "the spinning refills", || {
        let engine = real_engine(1, CHUNK);
        let outcomes = Outcomes::new(4_000_000);
        let (next, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (engine, outcomes, next, stop) = (
                    Arc::clone(&engine),
                    Arc::clone(&outcomes),
                    Arc::clone(&next),
                    Arc::clone(&stop),
                );
                std::thread::spawn(move || {
                    let (mut handles, mut full) = (Vec::new(), 0_u64);
                    while !stop.load(Ordering::Relaxed) {
                        let id = next.fetch_add(1, Ordering::Relaxed);
                        if id >= outcomes.ran.len() {
                            break;
                        }
                        let o = Arc::clone(&outcomes);
                        match engine.schedule(Duration::ZERO, move || {
                            o.ran[id].fetch_add(1, Ordering::SeqCst);
                        }) {
                            Ok(handle) => handles.push(handle),
                            Err(ScheduleError::Capacity) => {
                                outcomes.cancelled[id].store(1, Ordering::SeqCst);
                                full += 1;
                            }
                            Err(other) => panic!("{other:?}"),
                        }
                    }
                    (handles, full)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1200));
        stop.store(true, Ordering::Relaxed);
        let mut handles = HashSet::new();
        let mut full = 0;
        for thread in threads {
            let (mine, f) = thread.join().expect("a spinning thread");
            full += f;
            for handle in mine {
                assert!(
                    handles.insert(handle),
                    "two timers were handed the same node at the same generation: {handle:?}"
                );
            }
        }
        let ids = next.load(Ordering::SeqCst).min(outcomes.ran.len());
        println!(
            "spinning refills: {} armed, {full} capacity errors",
            handles.len()
        );
        assert!(
            eventually(Duration::from_secs(10), || (0..ids)
                .all(|id| outcomes.settled(id))),
            "timers lost: {} never ran",
            (0..ids).filter(|&id| !outcomes.settled(id)).count()
        );
        outcomes.check(ids);
        assert!(
            eventually(Duration::from_secs(5), || engine.nodes_in_use() == 0),
            "nodes in use: {}",
            engine.nodes_in_use()
        );
        assert_eq!(arm_until_full(&engine, Duration::from_secs(3600)), CHUNK);
    });
}

// ---------------------------------------------------------------------------------------
// Exhaustion and recovery.
// ---------------------------------------------------------------------------------------

/// Attacks a full pool's search: a pool of 8,192 nodes (128 words, twice a refill's look)
/// is filled by one thread until a schedule fails, and then, one at a time, a single timer
/// whose node lies at each awkward place (the first and the last node, the words just
/// before and just after the last one handed out, and words 30, 70 and 100 words ahead of
/// it, beyond the look) is brought forward and fires. The next schedule must succeed and
/// reuse exactly that node, and the one after it must be a capacity error again.
#[test]
fn a_pool_at_its_limit_finds_a_single_node_freed_anywhere() {
    const CAPACITY: usize = 8 * CHUNK;
    let (engine, clock) = manual_engine(CAPACITY);
    let fired = Arc::new(AtomicUsize::new(0));
    let arm = |delay: Duration| {
        let fired = Arc::clone(&fired);
        engine.schedule(delay, move || {
            fired.fetch_add(1, Ordering::SeqCst);
        })
    };
    // 3,000 timers armed and fired first, so that the fill below starts mid-region and
    // wraps round to the start.
    for _ in 0..3000 {
        arm(ms(1)).unwrap();
    }
    clock.advance(ms(1));
    engine.turn();
    assert_eq!(fired.swap(0, Ordering::SeqCst), 3000);
    let mut by_index = vec![None; CAPACITY];
    let mut last = 0;
    loop {
        match arm(Duration::from_secs(3600)) {
            Ok(handle) => {
                let (_, index) = slot(handle);
                assert!(by_index[index as usize].is_none(), "node {index} twice");
                by_index[index as usize] = Some(handle);
                last = index as usize;
            }
            Err(ScheduleError::Capacity) => break,
            Err(other) => panic!("{other:?}"),
        }
    }
    assert!(
        by_index.iter().all(Option::is_some),
        "the whole capacity armed"
    );
    engine.turn();
    println!("the last node handed out while filling: {last}");
    let places = [
        0,
        CAPACITY - 1,
        (last + CAPACITY - 64) % CAPACITY,
        (last + 1) % CAPACITY,
        (last + 30 * 64 + 5) % CAPACITY,
        (last + 70 * 64 + 17) % CAPACITY,
        (last + 100 * 64 + 63) % CAPACITY,
        last,
    ];
    for (round, &index) in places.iter().enumerate() {
        let handle = by_index[index].take().expect("a timer on every node");
        assert!(engine.reset(handle, ms(1)));
        clock.advance(ms(1));
        engine.turn();
        assert_eq!(fired.load(Ordering::SeqCst), round + 1);
        let reused = arm(Duration::from_secs(3600))
            .unwrap_or_else(|e| panic!("node {index} freed, yet the full pool says {e:?}"));
        assert_eq!(slot(reused).1 as usize, index, "the one free node reused");
        assert!(slot(reused).0 > slot(handle).0, "at a later generation");
        by_index[index] = Some(reused);
        assert_eq!(arm(ms(5)).err(), Some(ScheduleError::Capacity));
    }
    assert_eq!(pool_nodes(&engine), CAPACITY);
    engine.shutdown(PendingTimers::Drop);
    assert_eq!(engine.nodes_in_use(), 0);
}

// ---------------------------------------------------------------------------------------
// Stale handles.
// ---------------------------------------------------------------------------------------

/// Attacks the generation check under address-order reuse, which hands the lowest freed
/// node out again within a refill: rounds of 256 timers, of which some fire, some are
/// cancelled on the arming thread (recycled through its magazine's chain), some are
/// cancelled after the worker filed them (given back to the bitmap by the worker); the
/// next round reuses their nodes (checked by index). Every handle of an earlier round
/// whose node now holds a newer timer must be stale: `cancel`, `reset` and `is_pending`
/// fail, and the newer timer still runs exactly once at its own tick.
#[test]
fn stale_handles_of_nodes_reused_in_address_order_touch_nothing() {
    let (engine, clock) = manual_engine(4 * CHUNK);
    let start = clock.now();
    let runs: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let mut rng = Rng(7);
    let mut stale: Vec<TimerHandle> = Vec::new();
    let mut reused = 0;
    let mut next_id = 0;
    for _round in 0..40 {
        // (id, handle, the ms it must run at)
        let mut round = Vec::new();
        let now_ms = clock.now().duration_since(start).as_millis() as u64;
        for _ in 0..256 {
            let id = next_id;
            next_id += 1;
            let delay = 2 + rng.below(6);
            let (runs, clock) = (Arc::clone(&runs), clock.clone());
            let handle = engine
                .schedule(ms(delay), move || {
                    let at = clock.now().duration_since(start).as_millis() as u64;
                    runs.lock().unwrap().push((id, at));
                })
                .unwrap();
            round.push((id, handle, Some(now_ms + delay)));
        }
        // Every stale handle of earlier rounds: none may touch the timers just armed.
        let live: HashSet<u32> = round.iter().map(|&(_, h, _)| slot(h).1).collect();
        for &old in &stale {
            reused += usize::from(live.contains(&slot(old).1));
            assert!(!engine.is_pending(old), "stale {old:?} pending");
            assert!(!engine.reset(old, ms(1)), "stale {old:?} reset");
            assert!(!engine.cancel(old), "stale {old:?} cancelled");
        }
        // A third cancelled at once, on the arming thread's lane.
        for entry in round.iter_mut().filter(|_| rng.percent(33)) {
            assert!(engine.cancel(entry.1));
            entry.2 = None;
        }
        clock.advance(ms(1));
        engine.turn();
        // A third of the rest cancelled once filed.
        for entry in round.iter_mut().filter(|e| e.2.is_some()) {
            if rng.percent(33) {
                assert!(engine.cancel(entry.1));
                entry.2 = None;
            }
        }
        for _ in 0..8 {
            clock.advance(ms(1));
            engine.turn();
        }
        let ran = std::mem::take(&mut *runs.lock().unwrap());
        let mut expected: Vec<(usize, u64)> = round
            .iter()
            .filter_map(|&(id, _, due)| Some((id, due?)))
            .collect();
        let mut got = ran.clone();
        expected.sort_unstable();
        got.sort_unstable();
        assert_eq!(
            got, expected,
            "each timer ran once, at its tick, unless cancelled"
        );
        stale.extend(round.iter().map(|&(_, h, _)| h));
        for &(_, h, _) in &round {
            assert!(!engine.is_pending(h));
        }
    }
    println!("stale handles: {reused} stale handle checks named a reused node");
    assert!(
        reused > 5_000,
        "the rounds reused nodes (address order): {reused}"
    );
    assert_eq!(pool_nodes(&engine), CHUNK, "256 at a time fit one chunk");
    engine.shutdown(PendingTimers::Drop);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Attacks refills racing on the manual clock with exact ticks: four threads arm timers
/// of random deadlines (0-50 ms) on a pool of 2,048 nodes and cancel or reset a random
/// one of their own now and then, while the main thread turns the engine a millisecond at
/// a time. Each timer must run exactly once at its tick (or, where a reset raced the turn,
/// at one of the ticks it was given) unless cancelled, and never before; capacity errors
/// are allowed and counted.
#[test]
fn random_deadlines_from_racing_threads_run_once_never_early() {
    within(LIMIT, "the manual-clock race", || {
        let clock = ManualClock::new();
        let engine = Arc::new(
            TimerEngine::builder()
                .workers(1)
                .capacity(2 * CHUNK)
                .manual_clock(clock.clone())
                .build()
                .unwrap(),
        );
        let start = clock.now();
        let outcomes = Outcomes::new(400_000);
        // The earliest ms each timer may run at (its first deadline or any reset's).
        let earliest: Arc<Vec<AtomicU64>> =
            Arc::new((0..400_000).map(|_| AtomicU64::new(0)).collect());
        let (next, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let full = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4_u64)
            .map(|t| {
                let (engine, outcomes, earliest, next, stop, full, clock) = (
                    Arc::clone(&engine),
                    Arc::clone(&outcomes),
                    Arc::clone(&earliest),
                    Arc::clone(&next),
                    Arc::clone(&stop),
                    Arc::clone(&full),
                    clock.clone(),
                );
                std::thread::spawn(move || {
                    let mut rng = Rng(500 + t);
                    let mut mine: Vec<(usize, TimerHandle)> = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let id = next.fetch_add(1, Ordering::Relaxed);
                        if id >= outcomes.ran.len() {
                            break;
                        }
                        // Read before arming: the deadline is at least this plus the delay.
                        let now = clock.now().duration_since(start).as_millis() as u64;
                        let delay = rng.below(50);
                        earliest[id].store(now + delay, Ordering::SeqCst);
                        let (o, e, c) =
                            (Arc::clone(&outcomes), Arc::clone(&earliest), clock.clone());
                        match engine.schedule(ms(delay), move || {
                            let at = c.now().duration_since(start).as_millis() as u64;
                            if at < e[id].load(Ordering::SeqCst) {
                                o.early.fetch_add(1, Ordering::SeqCst);
                            }
                            o.ran[id].fetch_add(1, Ordering::SeqCst);
                        }) {
                            Ok(handle) => mine.push((id, handle)),
                            Err(ScheduleError::Capacity) => {
                                full.fetch_add(1, Ordering::Relaxed);
                                outcomes.cancelled[id].store(1, Ordering::SeqCst);
                            }
                            Err(other) => panic!("{other:?}"),
                        }
                        mine.retain(|&(id, _)| !outcomes.settled(id));
                        if !mine.is_empty() && rng.percent(30) {
                            let (id, handle) = mine[rng.below(mine.len() as u64) as usize];
                            if rng.percent(50) {
                                if engine.cancel(handle) {
                                    outcomes.cancelled[id].fetch_add(1, Ordering::SeqCst);
                                }
                            } else {
                                let now = clock.now().duration_since(start).as_millis() as u64;
                                let delay = rng.below(50);
                                // Earlier first (the turn may fire the timer at its old
                                // deadline meanwhile, or at the new one), later only once the
                                // reset took (a timer that lost the race runs at its old one).
                                earliest[id].fetch_min(now + delay, Ordering::SeqCst);
                                if engine.reset(handle, ms(delay)) {
                                    earliest[id].store(now + delay, Ordering::SeqCst);
                                }
                            }
                        }
                        if rng.percent(5) {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let until = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < until {
            clock.advance(ms(1));
            engine.turn();
        }
        stop.store(true, Ordering::Relaxed);
        for thread in threads {
            thread.join().expect("an arming thread");
        }
        let ids = next.load(Ordering::SeqCst).min(outcomes.ran.len());
        for _ in 0..200 {
            clock.advance(ms(1));
            engine.turn();
        }
        println!(
            "manual race: {ids} timers, {} capacity errors",
            full.load(Ordering::Relaxed)
        );
        assert!(ids > 1000, "the race armed too little: {ids}");
        outcomes.check(ids);
        assert_eq!(engine.nodes_in_use(), 0);
        assert!(pool_nodes(&engine) <= 2 * CHUNK);
    });
}

/// Checks the bitmap's own claim against a scrambled return: 4,096 timers with random
/// deadlines of 1-100 ms fire in an order unrelated to their arming (and a quarter are
/// cancelled after being filed), so their nodes come back scrambled; the next 4,096 timers
/// armed on the thread must get nodes in address order, each the one after the timer
/// armed before it at least 95% of the time (a free stack, which
/// hands nodes out in the order they came back, does far less).
#[test]
fn timers_armed_after_a_scrambled_return_get_neighbouring_nodes() {
    let (engine, clock) = manual_engine(1 << 20);
    let mut rng = Rng(9);
    let first: Vec<TimerHandle> = (0..4096)
        .map(|_| engine.schedule(ms(1 + rng.below(100)), || {}).unwrap())
        .collect();
    clock.advance(ms(1));
    engine.turn();
    for &handle in &first {
        if rng.percent(25) {
            engine.cancel(handle);
        }
    }
    for _ in 0..110 {
        clock.advance(ms(1));
        engine.turn();
    }
    assert_eq!(engine.nodes_in_use(), 0);
    let next: Vec<u32> = (0..4096)
        .map(|_| slot(engine.schedule(Duration::from_secs(60), || {}).unwrap()).1)
        .collect();
    let neighbours = next.windows(2).filter(|w| w[1] == w[0] + 1).count();
    println!("after a scrambled return: {neighbours} of 4,095 timers on the node after the last");
    assert!(
        neighbours * 100 >= 95 * 4095,
        "only {neighbours} of 4,095 timers got the node after the previous timer's"
    );
    assert_eq!(pool_nodes(&engine), 4 * CHUNK, "reused, not grown");
}

// ---------------------------------------------------------------------------------------
// Threads that exit, shutdown and drop.
// ---------------------------------------------------------------------------------------

/// Attacks the magazines' way home: on a pool of 1,024 nodes (16 words), 200 threads,
/// four at a time, each arm 1-20 timers (taking a whole word into their magazine, plus
/// the nodes their own cancels recycle into its chain) and exit. If an exiting thread's
/// magazine did not go back, the pool would run dry after 16 of them. (Four at a time
/// need at most 4 x (64 + 20 + 20) nodes; eight threads of 40 timers can find the pool
/// full on the old code too, the free nodes all in the others' magazines.) Every schedule
/// must succeed; afterwards no node is in use, and a fresh thread arms exactly 1,024
/// timers.
#[test]
fn threads_that_exit_holding_magazines_give_every_node_back() {
    let clock = ManualClock::new();
    let engine = Arc::new(
        TimerEngine::builder()
            .workers(1)
            .capacity(CHUNK)
            .manual_clock(clock.clone())
            .build()
            .unwrap(),
    );
    // The one chunk carved first, by a thread that exits: threads that race the first
    // carving can find the pool full (see `racing_first_schedules_never_find_an_empty_pool_full`).
    let warm = Arc::clone(&engine);
    std::thread::spawn(move || warm.cancel(warm.schedule(ms(1), || {}).unwrap()))
        .join()
        .unwrap();
    assert_eq!(pool_nodes(&engine), CHUNK);
    let ran = Arc::new(AtomicUsize::new(0));
    let mut expected = 0;
    for wave in 0..50_u64 {
        let barrier = Arc::new(Barrier::new(4));
        let threads: Vec<_> = (0..4_u64)
            .map(|t| {
                let (engine, ran, barrier) =
                    (Arc::clone(&engine), Arc::clone(&ran), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    let mut rng = Rng(wave * 4 + t);
                    barrier.wait();
                    let mut kept = 0;
                    for _ in 0..1 + rng.below(20) {
                        let ran = Arc::clone(&ran);
                        let handle = engine
                            .schedule(ms(1 + rng.below(3)), move || {
                                ran.fetch_add(1, Ordering::SeqCst);
                            })
                            .unwrap_or_else(|e| {
                                panic!(
                                    "wave {wave} thread {t}: {e:?}; in use {}",
                                    engine.nodes_in_use()
                                )
                            });
                        if rng.percent(50) {
                            assert!(engine.cancel(handle));
                        } else {
                            kept += 1;
                        }
                    }
                    kept
                })
            })
            .collect();
        expected += threads
            .into_iter()
            .map(|t| t.join().expect("a thread that exits"))
            .sum::<usize>();
        clock.advance(ms(4));
        engine.turn();
        assert_eq!(ran.load(Ordering::SeqCst), expected, "wave {wave}");
    }
    // Cancels on lanes of exited threads went to the inbox: one more turn takes them.
    clock.advance(ms(1));
    engine.turn();
    assert_eq!(engine.nodes_in_use(), 0);
    assert_eq!(pool_nodes(&engine), CHUNK);
    assert_eq!(arm_until_full(&engine, Duration::from_secs(3600)), CHUNK);
}

/// Attacks the carving of a pool's last chunk: four threads released together each arm
/// one timer on a fresh engine whose pool holds one chunk (1,024 nodes), 200 times. A
/// schedule that finds nothing free while another thread is still carving the chunk tries
/// to grow, finds the region used up, and must wait for the carve rather than report the
/// pool full with every node free (as it did, on the old free stack and on the bitmap,
/// before the refill waited for a chunk being carved).
#[test]
fn racing_first_schedules_never_find_an_empty_pool_full() {
    let mut full = 0;
    for _ in 0..200 {
        let engine = real_engine(1, CHUNK);
        let barrier = Arc::new(Barrier::new(4));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (engine, barrier) = (Arc::clone(&engine), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    engine.schedule(ms(1), || {}).err()
                })
            })
            .collect();
        for thread in threads {
            if let Some(error) = thread.join().expect("a racing thread") {
                assert_eq!(error, ScheduleError::Capacity);
                full += 1;
            }
        }
    }
    assert_eq!(full, 0, "schedules that found an empty pool full");
}

/// Attacks shutdown racing refills and frees: six threads race arms and cancels on a pool
/// of 2,048 nodes over two shards (as in the tiny-pool race) while the main thread shuts
/// the engine down in the middle. Every schedule must succeed or fail with a capacity or
/// shutdown error; each timer that a schedule accepted runs exactly once, never early, or
/// was cancelled (or dropped by the shutdown, which leaves it neither); after the threads
/// are done, every capture is dropped and no node is in use.
#[test]
fn shutdown_racing_refills_and_frees_loses_nothing() {
    within(LIMIT, "the shutdown race", || {
        for (round, pending) in [PendingTimers::Drop, PendingTimers::Run]
            .into_iter()
            .enumerate()
        {
            let engine = real_engine(2, CHUNK);
            let outcomes = Outcomes::new(1_000_000);
            let live = Live::default();
            let Racers {
                next,
                stop,
                threads,
            } = Racers::start(&engine, &outcomes, 100, true, &live);
            std::thread::sleep(Duration::from_millis(300 + 100 * round as u64));
            let report = engine.shutdown(pending);
            std::thread::sleep(Duration::from_millis(50));
            stop.store(true, Ordering::Relaxed);
            let mut handles = HashSet::new();
            for thread in threads {
                for handle in thread.join().expect("an arming thread").0 {
                    assert!(handles.insert(handle), "one node, two timers: {handle:?}");
                }
            }
            let ids = next.load(Ordering::SeqCst).min(outcomes.ran.len());
            println!("shutdown race ({pending:?}): {ids} ids, {report:?}");
            outcomes.check_after_shutdown(ids, pending);
            support::assert_all_given_back(&engine, &live);
        }
    });
}

/// Attacks dropping the engine while other threads hold its nodes in their magazines and
/// lanes: four threads arm (0-4 ms) and cancel on a pool of 1,024 nodes through a `Weak`
/// reference, upgraded for each operation; the main thread tells them to stop and drops
/// the only strong reference, so the engine shuts down and drops (on the main thread, or
/// on one of them finishing its last operation) while they are mid-refill, mid-cancel, and
/// then for 50 ms more hold their magazines and lanes before they exit. Nothing may panic
/// or hang, and every capture must be dropped by the end.
#[test]
fn dropping_the_engine_while_threads_hold_nodes_drops_every_capture() {
    for round in 0..3_u64 {
        let live = Live::default();
        within(LIMIT, "dropping the engine with nodes held", {
            let live = live.clone();
            move || {
                let engine = real_engine(1, CHUNK);
                let weak = Arc::downgrade(&engine);
                let stopping = Arc::new(AtomicBool::new(false));
                let threads: Vec<_> = (0..4)
                    .map(|t| {
                        let (weak, live, stopping) =
                            (weak.clone(), live.clone(), Arc::clone(&stopping));
                        std::thread::spawn(move || {
                            let mut rng = Rng(200 + 4 * round + t);
                            let mut recent = Vec::new();
                            let mut armed = 0;
                            while !stopping.load(Ordering::Relaxed) {
                                let Some(engine) = weak.upgrade() else { break };
                                let witness = live.witness();
                                let delay = Duration::from_micros(rng.below(4_000));
                                match engine.schedule(delay, move || drop(witness)) {
                                    Ok(handle) => {
                                        armed += 1;
                                        recent.push(handle);
                                    }
                                    Err(ScheduleError::Capacity | ScheduleError::Shutdown) => {}
                                    Err(other) => panic!("{other:?}"),
                                }
                                if rng.percent(40) && !recent.is_empty() {
                                    let at = rng.below(recent.len() as u64) as usize;
                                    engine.cancel(recent.swap_remove(at));
                                }
                                if recent.len() > 64 {
                                    recent.remove(0);
                                }
                            }
                            // This thread's magazine and lane outlive the engine a while.
                            std::thread::sleep(Duration::from_millis(50));
                            armed
                        })
                    })
                    .collect();
                std::thread::sleep(Duration::from_millis(150 + 50 * round));
                stopping.store(true, Ordering::Relaxed);
                drop(engine);
                assert!(
                    eventually(Duration::from_secs(10), || weak.strong_count() == 0),
                    "the engine was never dropped"
                );
                let armed: usize = threads
                    .into_iter()
                    .map(|t| t.join().expect("an arming thread"))
                    .sum();
                assert!(armed > 100, "armed too little to mean anything: {armed}");
            }
        });
        assert!(
            eventually(Duration::from_secs(5), || live.count() == 0),
            "captures left after the engine was dropped: {}",
            live.count()
        );
    }
}

// ---------------------------------------------------------------------------------------
// Churn: order of firing, and the pool's memory.
// ---------------------------------------------------------------------------------------

/// A timer of the manual-clock churn: its handle and the ms it must run at.
struct Churned {
    handle: TimerHandle,
    due: u64,
}

/// The live timers of the manual-clock churn, by id, with O(1) pick and removal.
#[derive(Default)]
struct LiveSet {
    timers: Vec<Option<Churned>>,
    ids: Vec<usize>,
    /// Where each id is in `ids`.
    at: Vec<usize>,
}

impl LiveSet {
    fn add(&mut self, timer: Churned) -> usize {
        let id = self.timers.len();
        self.timers.push(Some(timer));
        self.at.push(self.ids.len());
        self.ids.push(id);
        id
    }

    fn remove(&mut self, id: usize) -> Churned {
        let timer = self.timers[id]
            .take()
            .unwrap_or_else(|| panic!("timer {id} ran twice or after its cancel"));
        let at = self.at[id];
        self.ids.swap_remove(at);
        if let Some(&moved) = self.ids.get(at) {
            self.at[moved] = at;
        }
        timer
    }

    fn pick(&self, rng: &mut Rng) -> usize {
        self.ids[rng.below(self.ids.len() as u64) as usize]
    }
}

/// Attacks reuse under a steady load whose timers end in random order: 20,000 live timers
/// with deadlines of 1-2,000 ms, on the manual clock turned a millisecond at a time for
/// 3,000 ms; each millisecond 1% of the live timers are cancelled and 1% reset to a new
/// random deadline, and every timer that fired or was cancelled is replaced by a new one,
/// so that nodes come back in an order unrelated to the order they were handed out. Each
/// timer must run exactly once at its exact tick unless cancelled, and the pool must stay
/// within 1.25 times the live count plus four chunks (the growth is printed: 21,504 nodes,
/// 1.08x; 31,744 when a refill never falls back to a word
/// less than half free).
#[test]
fn steady_churn_with_random_deadlines_runs_each_timer_at_its_tick_in_a_bounded_pool() {
    const LIVE: usize = 20_000;
    let (engine, clock) = manual_engine(1 << 20);
    let start = clock.now();
    let now_ms = |clock: &ManualClock| clock.now().duration_since(start).as_millis() as u64;
    // (id, ms) of each run.
    let runs: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let mut rng = Rng(42);
    let mut set = LiveSet::default();
    let arm = |set: &mut LiveSet, rng: &mut Rng| {
        let id = set.timers.len();
        let delay = 1 + rng.below(2000);
        let (runs, c) = (Arc::clone(&runs), clock.clone());
        let handle = engine
            .schedule(ms(delay), move || {
                let at = c.now().duration_since(start).as_millis() as u64;
                runs.lock().unwrap().push((id, at));
            })
            .expect("room for 20,000 timers");
        let due = now_ms(&clock) + delay;
        assert_eq!(set.add(Churned { handle, due }), id);
    };
    for _ in 0..LIVE {
        arm(&mut set, &mut rng);
    }
    let mut peak_pool = pool_nodes(&engine);
    let (mut cancelled, mut reset, mut fired) = (0, 0, 0);
    for _ms in 0..3000 {
        for _ in 0..LIVE / 100 {
            let id = set.pick(&mut rng);
            let timer = set.remove(id);
            assert!(engine.cancel(timer.handle), "timer {id} was live");
            cancelled += 1;
        }
        for _ in 0..LIVE / 100 {
            let id = set.pick(&mut rng);
            let delay = 1 + rng.below(2000);
            let due = now_ms(&clock) + delay;
            let timer = set.timers[id].as_mut().expect("live");
            assert!(engine.reset(timer.handle, ms(delay)), "timer {id} was live");
            timer.due = due;
            reset += 1;
        }
        while set.ids.len() < LIVE {
            arm(&mut set, &mut rng);
        }
        clock.advance(ms(1));
        engine.turn();
        let now = now_ms(&clock);
        for (id, at) in std::mem::take(&mut *runs.lock().unwrap()) {
            let timer = set.remove(id);
            assert_eq!(at, timer.due, "timer {id} ran at {at}, due {}", timer.due);
            fired += 1;
        }
        // Nothing overdue is left.
        if now % 100 == 0 {
            for &id in &set.ids {
                let due = set.timers[id].as_ref().expect("live").due;
                assert!(due > now, "timer {id} due at {due} not run by {now}");
            }
        }
        peak_pool = peak_pool.max(pool_nodes(&engine));
    }
    println!(
        "churn: {} timers armed, {fired} fired, {cancelled} cancelled, {reset} reset; \
         pool {peak_pool} nodes at most for {LIVE} live ({:.2}x)",
        set.timers.len(),
        peak_pool as f64 / LIVE as f64
    );
    assert!(fired > 20_000, "timers fired: {fired}");
    assert!(
        peak_pool <= LIVE + LIVE / 4 + 4 * CHUNK,
        "the pool grew to {peak_pool} nodes for {LIVE} live timers"
    );
    engine.shutdown(PendingTimers::Drop);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Attacks the pool's memory on the real clock: two threads each keep 10,000 timers of
/// 1-200 ms live for 2 s, cancelling a third of them before they fire and replacing every
/// one that ended, on two shards. The pool must stay within 1.25 times the live count plus
/// four chunks a shard (the growth is printed: 20,480 nodes, 1.02x;
/// 30,720 when a refill never falls back to a word less than half free); every
/// timer runs exactly once, never early, unless cancelled; nothing is lost.
#[test]
fn steady_churn_on_the_real_clock_keeps_the_pool_bounded() {
    within(LIMIT, "the real-clock churn", || {
        const PER_THREAD: usize = 10_000;
        let engine = real_engine(2, 1 << 20);
        let outcomes = Outcomes::new(2_000_000);
        let next = Arc::new(AtomicUsize::new(0));
        let live = Live::default();
        let peak_live = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..2_u64)
            .map(|t| {
                let (engine, outcomes, next, live, peak_live) = (
                    Arc::clone(&engine),
                    Arc::clone(&outcomes),
                    Arc::clone(&next),
                    live.clone(),
                    Arc::clone(&peak_live),
                );
                std::thread::spawn(move || {
                    let mut rng = Rng(300 + t);
                    let mut mine: Vec<(usize, TimerHandle)> = Vec::new();
                    let until = Instant::now() + Duration::from_secs(2);
                    while Instant::now() < until {
                        mine.retain(|&(id, _)| !outcomes.settled(id));
                        while mine.len() < PER_THREAD {
                            let id = next.fetch_add(1, Ordering::Relaxed);
                            if id >= outcomes.ran.len() {
                                return;
                            }
                            let delay = Duration::from_millis(1 + rng.below(200));
                            let armed_at = Instant::now();
                            let (o, witness) = (Arc::clone(&outcomes), live.witness());
                            let handle = engine
                                .schedule(delay, move || {
                                    let _witness = &witness;
                                    if Instant::now() < armed_at + delay {
                                        o.early.fetch_add(1, Ordering::SeqCst);
                                    }
                                    o.ran[id].fetch_add(1, Ordering::SeqCst);
                                })
                                .expect("room for the churn");
                            if rng.percent(33) {
                                if engine.cancel(handle) {
                                    outcomes.cancelled[id].fetch_add(1, Ordering::SeqCst);
                                }
                            } else {
                                mine.push((id, handle));
                            }
                        }
                        peak_live.fetch_max(live.count() as u64, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_millis(1));
                    }
                })
            })
            .collect();
        let mut peak_pool = 0;
        for thread in threads {
            while !thread.is_finished() {
                peak_pool = peak_pool.max(pool_nodes(&engine));
                std::thread::sleep(Duration::from_millis(20));
            }
            thread.join().expect("a churning thread");
        }
        peak_pool = peak_pool.max(pool_nodes(&engine));
        let ids = next.load(Ordering::SeqCst).min(outcomes.ran.len());
        let peak_live = peak_live.load(Ordering::Relaxed) as usize;
        println!(
            "real-clock churn: {ids} timers, pool {peak_pool} nodes at most for {} live \
         (captures alive at most {peak_live}; {:.2}x the live count)",
            2 * PER_THREAD,
            peak_pool as f64 / (2 * PER_THREAD) as f64
        );
        assert!(
            eventually(Duration::from_secs(10), || (0..ids)
                .all(|id| outcomes.settled(id))),
            "timers lost"
        );
        outcomes.check(ids);
        support::assert_all_given_back(&engine, &live);
        assert!(
            peak_pool <= 2 * PER_THREAD + 2 * PER_THREAD / 4 + 2 * 4 * CHUNK,
            "the pool grew to {peak_pool} nodes for {} live timers",
            2 * PER_THREAD
        );
    });
}

/// Arms `long` timers of an hour after `before` timers of 5 ms, fires those, then arms
/// `rounds` rounds of 1,000 timers of 1-10 ms, firing each round before the next. Returns
/// the pool's nodes after the long timers were armed, and at the end.
fn churn_past_long_timers(before: usize, long: usize, rounds: usize) -> (usize, usize) {
    let (engine, clock) = manual_engine(4 << 20);
    let fired = Arc::new(AtomicUsize::new(0));
    for _ in 0..before {
        engine.schedule(ms(5), || {}).unwrap();
    }
    let long: Vec<_> = (0..long)
        .map(|_| engine.schedule(Duration::from_secs(3600), || {}).unwrap())
        .collect();
    clock.advance(ms(10));
    engine.turn();
    let after_long = pool_nodes(&engine);
    for round in 0..rounds {
        for k in 0..1000 {
            let fired = Arc::clone(&fired);
            engine
                .schedule(ms(1 + k % 10), move || {
                    fired.fetch_add(1, Ordering::Relaxed);
                })
                .unwrap();
        }
        clock.advance(ms(20));
        engine.turn();
        assert_eq!(fired.load(Ordering::Relaxed), 1000 * (round + 1));
    }
    let end = pool_nodes(&engine);
    for handle in long {
        assert!(engine.is_pending(handle));
    }
    (after_long, end)
}

/// Attacks the ring's cursor with a block of pending nodes at the start of the region:
/// 8,192 timers of an hour armed first (idle timeouts set up at start), then 100 rounds of
/// 1,000 short timers, each round fired before the next. At most 9,192 timers are ever in
/// flight, so the pool needs 9 or 10 chunks; it must not grow with the timers armed. (With
/// a refill that grows as soon as its look finds nothing, every lap of the cursor ends on
/// the block, whose 128 full words stop each refill's look, and the pool grows by a chunk
/// for every 1,000 timers: 108,544 nodes after 100 rounds, 12x what is in flight.)
#[test]
fn long_timers_armed_first_do_not_make_the_pool_grow_every_lap() {
    let (after_long, end) = churn_past_long_timers(0, 8192, 100);
    println!("8,192 long timers first: pool {after_long} -> {end} nodes after 100,000 arms");
    assert!(
        end <= 2 * 9192 + 4 * CHUNK,
        "the pool grew from {after_long} to {end} nodes with at most 9,192 timers in flight"
    );
}

/// Attacks the ring's cursor with a block of pending nodes in the middle of the region:
/// 2,048 short timers (32 whole words), then 6,000 timers of an hour, then 150 rounds of
/// 1,000 short timers. At most 8,048 are in flight; the pool must stay within twice that
/// plus four chunks. (With a refill that grows as soon as its look finds nothing, each lap
/// of the cursor stops at the block, whose first 64 words are full, and grows the pool by a
/// chunk, so the pool grows like the square root of the timers armed. A block that begins
/// with a word partly free is passed: the look takes that thin word and moves the cursor
/// past the 64 words it looked at.)
#[test]
fn long_timers_in_the_middle_do_not_make_the_pool_grow_every_lap() {
    let (after_long, end) = churn_past_long_timers(2048, 6000, 150);
    println!("6,000 long timers after 2,048: pool {after_long} -> {end} nodes after 150,000 arms");
    assert!(
        end <= 2 * 8048 + 4 * CHUNK,
        "the pool grew from {after_long} to {end} nodes with at most 8,048 timers in flight"
    );
}

/// Attacks the ring's cursor on the real clock, as an application would: two threads each
/// arm 4,096 timers of an hour (idle timeouts set up at start, 8,192 together, filling the
/// start of one shard's region), then for 600 ms each arm timers of 1-50 ms, cancelling
/// each once 1,000 newer ones are armed. About 10,200 timers are pending at a time.
///
/// Every [`PROBE_EVERY`] arms a thread arms a timer due at once and waits for it to run:
/// the worker has then taken everything the thread sent before it, and freed what was
/// cancelled. So the nodes in flight are bounded by the test (8,192 + 2 x 1,000 pending, 2
/// x 2,048 at most not yet taken back), not by how far the threads outrun the worker: a
/// cancelled node reaches the worker within a few ticks, and without the probes the pool
/// held what the threads armed in those ticks, 28,672-52,224 nodes by the machine (the last
/// in CI, where the threads armed 1.7 million timers in the 600 ms). The pool must stay
/// within twice the bound plus four chunks. (With a refill that grows as soon as its look
/// finds nothing, it grows by a chunk for about every 2,500-3,000 timers armed:
/// 367,616-399,360 nodes, 23-25 MiB, after 0.9-1.1 million arms in 600 ms of a debug build,
/// and on, up to the pool's capacity.)
#[test]
fn long_timers_armed_first_on_the_real_clock_do_not_make_the_pool_grow_every_lap() {
    within(LIMIT, "the real-clock lap", || {
        let engine = real_engine(1, 4 << 20);
        let barrier = Arc::new(Barrier::new(2));
        let threads: Vec<_> = (0..2_u64)
            .map(|t| {
                let (engine, barrier) = (Arc::clone(&engine), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    let long: Vec<_> = (0..4096)
                        .map(|_| engine.schedule(Duration::from_secs(3600), || {}).unwrap())
                        .collect();
                    barrier.wait();
                    let mut recent = std::collections::VecDeque::new();
                    let until = Instant::now() + Duration::from_millis(600);
                    let mut k = t;
                    while Instant::now() < until {
                        k += 1;
                        recent.push_back(engine.schedule(ms(1 + k % 50), || {}).unwrap());
                        if recent.len() > 1000 {
                            engine.cancel(recent.pop_front().expect("a recent timer"));
                        }
                        if k % PROBE_EVERY == 0 {
                            await_probe(&engine);
                        }
                    }
                    for handle in long {
                        assert!(engine.cancel(handle));
                    }
                    k
                })
            })
            .collect();
        let armed: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let nodes = pool_nodes(&engine);
        println!("8,192 long timers first, real clock: pool {nodes} nodes after {armed} arms");
        let in_flight = 8192 + 2 * 1000 + 2 * PROBE_EVERY as usize;
        assert!(
            nodes <= 2 * in_flight + 4 * CHUNK,
            "the pool grew to {nodes} nodes with at most {in_flight} in flight"
        );
    });
}

/// Arms between two probes of the real-clock lap test.
const PROBE_EVERY: u64 = 2048;

/// Arms a timer due at once from this thread and waits until it has run: by then the
/// worker has taken everything this thread sent before it.
fn await_probe(engine: &TimerEngine) {
    let ran = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&ran);
    engine
        .schedule(Duration::ZERO, move || flag.store(true, Ordering::Release))
        .unwrap();
    while !ran.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
}
