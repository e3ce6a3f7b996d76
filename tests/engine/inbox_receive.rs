//! The wheel side receiving what it takes off lanes and the inbox `RECEIVE_AHEAD` (16)
//! nodes behind taking them (`WheelSide::receive_all`), with each taken node's wheel
//! neighbours prefetched (`WheelCore::prefetch_neighbours`). Taking a node before receiving
//! the ones ahead of it must change nothing, because a node in transit is pushed nowhere
//! else until it is received.
//!
//! From the public API: batches whose sizes sit on and around multiples of 16 in one look,
//! mixed cancels and resets (earlier and later) of filed timers beside new ones, nodes
//! freed and reused while the same look may still be walking the inbox, capture
//! destructors that re-enter the engine (cancel, reset, schedule, turn, shutdown) while up
//! to 15 nodes are taken but not yet received, threads exiting with full lanes, shutdown in
//! both modes racing floods of cancel messages, and the sweep after shutdown.
//!
//! Hand-driven tests check exact firing ticks where the outcome is deterministic. Tests on
//! real clocks (and hand-driven ones with racing threads) assert only never early, exactly
//! once, and nothing lost (`nodes_in_use() == 0`, every capture dropped, `stats()` counts
//! agreeing). All randomness is seeded. `shutdown_races_cancel_floods` also checks that a
//! schedule refused with `Err(Shutdown)` because it raced the shutdown flag is not counted
//! by `stats()` as scheduled and cancelled.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{
    Live, Rng, Witness, assert_all_given_back, eventually, manual, ms, run_for, since, unpinned,
    within,
};
use corewheel::{Clock, ManualClock, PendingTimers, TimerEngine, TimerHandle};

/// Batch sizes on and around multiples of the look-ahead (16) and of a lane claim (64).
const AROUND_THE_RING: [usize; 20] = [
    1, 2, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 127, 128, 129, 255, 1000, 1001,
];

/// Per-timer records for the racing tests: runs, when it last ran (ms or µs since the
/// start), the lowest deadline any successful schedule or reset could have given it, and
/// whether a cancel returned `true`.
struct Book {
    runs: Vec<AtomicUsize>,
    ran_at: Vec<AtomicU64>,
    floor: Vec<AtomicU64>,
    cancelled: Vec<AtomicBool>,
    handles: Vec<Mutex<Option<TimerHandle>>>,
}

impl Book {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Self {
            runs: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            ran_at: (0..n).map(|_| AtomicU64::new(0)).collect(),
            floor: (0..n).map(|_| AtomicU64::new(u64::MAX)).collect(),
            cancelled: (0..n).map(|_| AtomicBool::new(false)).collect(),
            handles: (0..n).map(|_| Mutex::new(None)).collect(),
        })
    }

    fn handle(&self, id: usize) -> Option<TimerHandle> {
        *self.handles[id].lock().unwrap()
    }

    /// Checks exactly once and never early for every timer `ok` says was scheduled;
    /// returns (ran, cancelled).
    fn check(&self, ok: &[bool]) -> (usize, usize) {
        let (mut ran, mut cancelled) = (0, 0);
        for (id, &ok) in ok.iter().enumerate() {
            let runs = self.runs[id].load(Ordering::SeqCst);
            let was_cancelled = self.cancelled[id].load(Ordering::SeqCst);
            if !ok {
                assert_eq!(runs, 0, "timer {id} was refused but ran");
                continue;
            }
            if was_cancelled {
                assert_eq!(runs, 0, "timer {id}: cancel returned true, yet it ran");
                cancelled += 1;
            } else {
                assert_eq!(runs, 1, "timer {id} ran {runs} times, not exactly once");
                let at = self.ran_at[id].load(Ordering::SeqCst);
                let floor = self.floor[id].load(Ordering::SeqCst);
                assert!(at >= floor, "timer {id} ran at {at}, before {floor}");
                ran += 1;
            }
        }
        (ran, cancelled)
    }
}

/// Cancels of filed timers, as many as each size in one go, all received in one look:
/// every node comes back, nothing runs, the counts agree.
#[test]
fn cancel_floods_of_every_size_around_the_ring_free_every_node() {
    for &count in &AROUND_THE_RING {
        let (engine, clock) = manual(1);
        let live = Live::default();
        let fired = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..count)
            .map(|_| {
                let (fired, witness) = (Arc::clone(&fired), live.witness());
                engine
                    .schedule(ms(100), move || {
                        let _keep = &witness;
                        fired.fetch_add(1, Ordering::SeqCst);
                    })
                    .unwrap()
            })
            .collect();
        run_for(&engine, &clock, 40);
        assert_eq!(engine.nodes_in_use(), count, "{count}: all filed");
        for &handle in &handles {
            assert!(engine.cancel(handle), "{count}: cancel of a filed timer");
        }
        run_for(&engine, &clock, 40);
        assert_eq!(engine.nodes_in_use(), 0, "{count}: every node back");
        assert_eq!(live.count(), 0, "{count}: every capture dropped");
        for &handle in &handles {
            assert!(!engine.cancel(handle), "{count}: a stale handle");
            assert!(!engine.reset(handle, ms(1)), "{count}: a stale handle");
        }
        run_for(&engine, &clock, 100);
        assert_eq!(fired.load(Ordering::SeqCst), 0, "{count}: nothing ran");
        let stats = engine.stats().total;
        assert_eq!(
            (stats.scheduled, stats.cancelled, stats.fired, stats.pending),
            (count as u64, count as u64, 0, 0),
            "{count}: {stats:?}"
        );
    }
}

/// In one look, cancels, resets later, resets earlier, resets then cancels, double resets
/// and new timers, in counts around the ring size: each timer fires exactly at the tick it
/// would have alone.
#[test]
fn mixed_message_batches_around_the_ring_fire_each_timer_at_its_own_tick() {
    for &count in &AROUND_THE_RING {
        let (engine, clock) = manual(1);
        let start = clock.now();
        let fired: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
        let schedule = |id: usize, delay: Duration| {
            let (fired, clock) = (Arc::clone(&fired), clock.clone());
            engine
                .schedule(delay, move || {
                    fired.lock().unwrap().push((id, since(&clock, start)));
                })
                .unwrap()
        };
        let handles: Vec<_> = (0..count)
            .map(|id| schedule(id, ms(100 + (id % 11) as u64)))
            .collect();
        run_for(&engine, &clock, 40);
        let mut expected = Vec::new();
        for (id, &handle) in handles.iter().enumerate() {
            let own = 100 + (id % 11) as u64;
            match id % 7 {
                0 => assert!(engine.cancel(handle)),
                1 => {
                    assert!(engine.reset(handle, ms(150)));
                    expected.push((id, 190));
                }
                2 => {
                    assert!(engine.reset(handle, ms(5)));
                    expected.push((id, 45));
                }
                3 => {
                    assert!(engine.reset(handle, ms(5)));
                    assert!(engine.cancel(handle));
                }
                4 => {
                    // Earlier (a message), then later again while it is in transit.
                    assert!(engine.reset(handle, ms(3)));
                    assert!(engine.reset(handle, ms(90)));
                    expected.push((id, 130));
                }
                5 => {
                    // Later, then earlier than its own deadline but later than now.
                    assert!(engine.reset(handle, ms(300)));
                    assert!(engine.reset(handle, ms(20)));
                    expected.push((id, 60));
                }
                _ => expected.push((id, own)),
            }
            if id % 3 == 0 {
                // New timers in the same stream, some due at once.
                let new_id = 10_000 + id;
                let delay = (id % 4) as u64;
                schedule(new_id, ms(delay));
                expected.push((new_id, 40 + delay.max(1)));
            }
        }
        run_for(&engine, &clock, 400);
        let mut fired = fired.lock().unwrap().clone();
        fired.sort_unstable();
        expected.sort_unstable();
        assert_eq!(fired, expected, "{count}: each fired once, at its own tick");
        assert_eq!(engine.nodes_in_use(), 0, "{count}: every node back");
    }
}

/// Timers cancelled and their nodes reused by new schedules, round after round, with the
/// old handles poked after reuse: a stale handle never reaches the new timer, and each new
/// one fires once, at its tick.
#[test]
fn reused_nodes_are_new_timers_whatever_stale_handles_do() {
    let (engine, clock) = manual(1);
    let start = clock.now();
    let fired: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let mut expected = Vec::new();
    let mut stale: Vec<TimerHandle> = Vec::new();
    let mut next_id = 0;
    for round in 0..12_u64 {
        let count = AROUND_THE_RING[(round as usize * 7) % AROUND_THE_RING.len()];
        let base = since(&clock, start);
        let handles: Vec<_> = (0..count)
            .map(|k| {
                let id = next_id;
                next_id += 1;
                let (fired, clock) = (Arc::clone(&fired), clock.clone());
                let delay = 50 + (k % 5) as u64;
                let handle = engine
                    .schedule(ms(delay), move || {
                        fired.lock().unwrap().push((id, since(&clock, start)));
                    })
                    .unwrap();
                (id, handle, base + delay)
            })
            .collect();
        // Stale handles from earlier rounds, whose nodes these may be.
        for &old in &stale {
            assert!(!engine.cancel(old), "round {round}: a stale cancel");
            assert!(!engine.reset(old, ms(1)), "round {round}: a stale reset");
            assert!(!engine.is_pending(old), "round {round}: a stale handle");
        }
        run_for(&engine, &clock, 3);
        for (k, &(id, handle, due)) in handles.iter().enumerate() {
            if k % 2 == 0 {
                assert!(engine.cancel(handle));
                stale.push(handle);
            } else {
                expected.push((id, due));
            }
        }
        run_for(&engine, &clock, 1 + round % 3);
    }
    run_for(&engine, &clock, 200);
    for &old in &stale {
        assert!(!engine.cancel(old));
    }
    let mut fired = fired.lock().unwrap().clone();
    fired.sort_unstable();
    expected.sort_unstable();
    assert_eq!(fired, expected);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Threads schedule, cancel (their own and each other's timers, the same handle from
/// several threads), reset earlier and later, while the main thread turns a manual clock:
/// nodes freed in one look go back to the pool and are re-armed and pushed while later
/// looks walk the inbox. Never early, exactly once, nothing lost.
#[test]
#[cfg_attr(miri, ignore)]
fn threads_churn_shared_handles_while_the_owner_turns() {
    const THREADS: usize = 3;
    const PER_THREAD: usize = 3_000;
    let (engine, clock) = manual(2);
    let engine = Arc::new(engine);
    let start = clock.now();
    let book = Book::new(THREADS * PER_THREAD);
    let ok: Vec<AtomicBool> = (0..THREADS * PER_THREAD)
        .map(|_| AtomicBool::new(false))
        .collect();
    let ok = Arc::new(ok);
    let done = Arc::new(AtomicUsize::new(0));
    let cancel_true = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (engine, clock, book, ok, done, cancel_true) = (
                Arc::clone(&engine),
                clock.clone(),
                Arc::clone(&book),
                Arc::clone(&ok),
                Arc::clone(&done),
                Arc::clone(&cancel_true),
            );
            scope.spawn(move || {
                let mut rng = Rng(0x5EED + t as u64);
                for k in 0..PER_THREAD {
                    let id = t * PER_THREAD + k;
                    let delay = 1 + rng.below(12);
                    let floor = since(&clock, start) + delay;
                    let (b, c) = (Arc::clone(&book), clock.clone());
                    let handle = engine
                        .schedule(ms(delay), move || {
                            b.ran_at[id].store(since(&c, start), Ordering::SeqCst);
                            b.runs[id].fetch_add(1, Ordering::SeqCst);
                        })
                        .unwrap();
                    book.floor[id].fetch_min(floor, Ordering::SeqCst);
                    *book.handles[id].lock().unwrap() = Some(handle);
                    ok[id].store(true, Ordering::SeqCst);
                    // A few operations on random timers of any thread.
                    for _ in 0..3 {
                        let target = rng.below((THREADS * PER_THREAD) as u64) as usize;
                        let Some(handle) = book.handle(target) else {
                            continue;
                        };
                        match rng.below(4) {
                            0 => {
                                if engine.cancel(handle) {
                                    assert!(!book.cancelled[target].swap(true, Ordering::SeqCst));
                                    cancel_true.fetch_add(1, Ordering::SeqCst);
                                }
                            }
                            _ => {
                                let delay = 1 + rng.below(15);
                                let floor = since(&clock, start) + delay;
                                if engine.reset(handle, ms(delay)) {
                                    book.floor[target].fetch_min(floor, Ordering::SeqCst);
                                }
                            }
                        }
                    }
                    if k % 97 == 0 {
                        std::thread::yield_now();
                    }
                }
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
        while done.load(Ordering::SeqCst) < THREADS {
            clock.advance(ms(1));
            engine.turn();
        }
    });
    run_for(&engine, &clock, 100);
    let ok: Vec<bool> = ok.iter().map(|b| b.load(Ordering::SeqCst)).collect();
    let (ran, cancelled) = book.check(&ok);
    assert_eq!(ran + cancelled, THREADS * PER_THREAD);
    assert_eq!(cancelled, cancel_true.load(Ordering::SeqCst));
    assert_eq!(engine.nodes_in_use(), 0, "every node back");
    let stats = engine.stats().total;
    assert_eq!(stats.scheduled, (THREADS * PER_THREAD) as u64, "{stats:?}");
    assert_eq!(stats.cancelled, cancelled as u64, "{stats:?}");
    assert_eq!(stats.fired, ran as u64, "{stats:?}");
    assert_eq!(stats.pending, 0, "{stats:?}");
}

/// Short-lived threads each arm a batch around the ring size (and around a lane claim),
/// cancel and reset some, and exit with their lanes full, so the lane's close forwards the
/// chain into the inbox while the owner turns.
#[test]
#[cfg_attr(miri, ignore)]
fn threads_exiting_with_full_lanes_lose_nothing() {
    let (engine, clock) = manual(2);
    let engine = Arc::new(engine);
    let start = clock.now();
    let sizes = AROUND_THE_RING;
    let total: usize = sizes.iter().sum::<usize>() * 2;
    let book = Book::new(total);
    let live = Live::default();
    let stop = Arc::new(AtomicBool::new(false));
    std::thread::scope(|scope| {
        let turner = {
            let (engine, clock, stop) = (Arc::clone(&engine), clock.clone(), Arc::clone(&stop));
            scope.spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    clock.advance(ms(1));
                    engine.turn();
                    std::thread::yield_now();
                }
            })
        };
        let mut first = 0;
        for round in 0..2 {
            let mut threads = Vec::new();
            for (s, &size) in sizes.iter().enumerate() {
                let (engine, clock, book, live) = (
                    Arc::clone(&engine),
                    clock.clone(),
                    Arc::clone(&book),
                    live.clone(),
                );
                let base = first;
                first += size;
                threads.push(std::thread::spawn(move || {
                    let mut rng = Rng((round * 100 + s) as u64);
                    let mut mine = Vec::new();
                    for k in 0..size {
                        let id = base + k;
                        let delay = 1 + rng.below(40);
                        let floor = since(&clock, start) + delay;
                        let (b, c, w) = (Arc::clone(&book), clock.clone(), live.witness());
                        let handle = engine
                            .schedule(ms(delay), move || {
                                let _keep = &w;
                                b.ran_at[id].store(since(&c, start), Ordering::SeqCst);
                                b.runs[id].fetch_add(1, Ordering::SeqCst);
                            })
                            .unwrap();
                        book.floor[id].fetch_min(floor, Ordering::SeqCst);
                        mine.push((id, handle));
                    }
                    for &(id, handle) in &mine {
                        match id % 5 {
                            0 if engine.cancel(handle) => {
                                book.cancelled[id].store(true, Ordering::SeqCst);
                            }
                            1 | 2 => {
                                let delay = 1 + rng.below(30);
                                let floor = since(&clock, start) + delay;
                                if engine.reset(handle, ms(delay)) {
                                    book.floor[id].fetch_min(floor, Ordering::SeqCst);
                                }
                            }
                            _ => {}
                        }
                    }
                }));
            }
            for thread in threads {
                thread.join().unwrap();
            }
        }
        stop.store(true, Ordering::SeqCst);
        turner.join().unwrap();
    });
    run_for(&engine, &clock, 100);
    let (ran, cancelled) = book.check(&vec![true; total]);
    assert_eq!(ran + cancelled, total);
    assert_eq!(engine.nodes_in_use(), 0, "every node back");
    assert_eq!(live.count(), 0, "every capture dropped");
    let stats = engine.stats().total;
    assert_eq!(
        (stats.scheduled, stats.fired, stats.pending),
        (total as u64, ran as u64, 0),
        "{stats:?}"
    );
}

/// What a capture does when it is dropped: re-enters the engine mid-look, while the
/// wheel side holds up to 15 taken nodes it has not received yet.
struct Reenter {
    id: usize,
    engine: &'static TimerEngine,
    handles: Arc<Mutex<Vec<TimerHandle>>>,
    cancelled: Arc<Vec<AtomicBool>>,
    spawned: Arc<AtomicUsize>,
    spawned_ran: Arc<AtomicUsize>,
    shutdown_at: Option<usize>,
    drops: Arc<AtomicUsize>,
    _witness: Witness,
    live: Live,
}

impl Drop for Reenter {
    fn drop(&mut self) {
        let nth = self.drops.fetch_add(1, Ordering::SeqCst);
        assert_eq!(self.engine.turn(), 0, "a nested turn does nothing");
        let handles = self.handles.lock().unwrap().clone();
        let n = handles.len();
        // Cancel a neighbour: filed, in transit in the same look, or gone.
        let next = (self.id + 1) % n;
        if self.engine.cancel(handles[next]) {
            assert!(!self.cancelled[next].swap(true, Ordering::SeqCst));
        }
        // Pull another in, or push it out: perhaps a node in the look's ring.
        let other = (self.id + 5) % n;
        let _ = self
            .engine
            .reset(handles[other], ms(1 + (self.id % 3) as u64 * 40));
        // Arm new timers from inside the look (they land on this thread's lane).
        for _ in 0..3 {
            let (ran, w) = (Arc::clone(&self.spawned_ran), self.live.witness());
            if self
                .engine
                .schedule(ms(2), move || {
                    let _keep = &w;
                    ran.fetch_add(1, Ordering::SeqCst);
                })
                .is_ok()
            {
                self.spawned.fetch_add(1, Ordering::SeqCst);
            }
        }
        if self.shutdown_at == Some(nth) {
            self.engine.shutdown(PendingTimers::Run);
        }
    }
}

fn reentering_destructors(count: usize, shutdown_at: Option<usize>) {
    let clock = ManualClock::new();
    let engine: &'static TimerEngine = Box::leak(Box::new(
        TimerEngine::builder()
            .workers(1)
            .manual_clock(clock.clone())
            .build()
            .unwrap(),
    ));
    let live = Live::default();
    let handles: Arc<Mutex<Vec<TimerHandle>>> = Arc::default();
    let cancelled: Arc<Vec<AtomicBool>> =
        Arc::new((0..count).map(|_| AtomicBool::new(false)).collect());
    let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..count).map(|_| AtomicUsize::new(0)).collect());
    let (spawned, spawned_ran, drops) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    for id in 0..count {
        let capture = Reenter {
            id,
            engine,
            handles: Arc::clone(&handles),
            cancelled: Arc::clone(&cancelled),
            spawned: Arc::clone(&spawned),
            spawned_ran: Arc::clone(&spawned_ran),
            shutdown_at,
            drops: Arc::clone(&drops),
            _witness: live.witness(),
            live: live.clone(),
        };
        let runs = Arc::clone(&runs);
        let handle = engine
            .schedule(ms(100 + (id % 9) as u64), move || {
                let _keep = &capture;
                runs[id].fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        handles.lock().unwrap().push(handle);
    }
    run_for(engine, &clock, 40);
    let all = handles.lock().unwrap().clone();
    // Every third cancelled from outside: a flood of messages whose frees run the
    // destructors above in the middle of the look that receives them.
    for (id, &handle) in all.iter().enumerate() {
        if id % 3 == 0 && engine.cancel(handle) {
            assert!(!cancelled[id].swap(true, Ordering::SeqCst));
        }
    }
    run_for(engine, &clock, 300);
    let report = engine.shutdown(PendingTimers::Run);
    for id in 0..count {
        let ran = runs[id].load(Ordering::SeqCst);
        if cancelled[id].load(Ordering::SeqCst) {
            assert_eq!(ran, 0, "timer {id}: cancelled, yet it ran");
        } else {
            assert_eq!(ran, 1, "timer {id} ran {ran} times");
        }
    }
    assert_eq!(
        spawned_ran.load(Ordering::SeqCst),
        spawned.load(Ordering::SeqCst),
        "every timer armed from a destructor ran (Run mode)"
    );
    assert!(
        eventually(Duration::from_secs(5), || live.count() == 0),
        "every capture dropped: {} left",
        live.count()
    );
    assert_eq!(engine.nodes_in_use(), 0, "every node back");
    let stats = engine.stats().total;
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(
        stats.ran_at_shutdown + stats.dropped_at_shutdown,
        report.ran + report.dropped
    );
}

/// Destructors that cancel, reset and schedule on this engine, and try a nested turn, run
/// while a look has taken nodes ahead of receiving them.
#[test]
fn capture_destructors_reenter_the_engine_mid_look() {
    for count in [16, 17, 48, 200] {
        within(
            Duration::from_secs(30),
            "re-entering destructors",
            move || {
                reentering_destructors(count, None);
            },
        );
    }
}

/// As above, and one destructor shuts the engine down (running what is pending) in the
/// middle of the look.
#[test]
fn a_destructor_shutting_down_mid_look_settles_everything() {
    for (count, at) in [(17, 3), (48, 15), (200, 16), (200, 40)] {
        within(Duration::from_secs(30), "shutdown mid look", move || {
            reentering_destructors(count, Some(at));
        });
    }
}

/// Threads flood a real-clock engine with cancels of filed timers (and new schedules)
/// while another thread shuts it down: everything scheduled is cancelled, run or dropped
/// exactly once, every capture is dropped and every node comes back.
fn shutdown_races_cancel_floods(pending: PendingTimers) {
    const THREADS: usize = 2;
    const FILED: usize = 4_000;
    const LATE: usize = 2_000;
    let per = FILED + LATE;
    let engine = unpinned(2);
    let live = Live::default();
    let book = Book::new(THREADS * per);
    let ok: Arc<Vec<AtomicBool>> =
        Arc::new((0..THREADS * per).map(|_| AtomicBool::new(false)).collect());
    let arm = |engine: &TimerEngine, book: &Arc<Book>, live: &Live, id: usize| {
        let (b, w) = (Arc::clone(book), live.witness());
        engine
            .schedule(Duration::from_secs(60), move || {
                let _keep = &w;
                b.runs[id].fetch_add(1, Ordering::SeqCst);
            })
            .ok()
    };
    // Filed first, from the racing threads so that their lanes and home shards differ.
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (engine, book, live, ok) = (&engine, &book, &live, &ok);
            scope.spawn(move || {
                for k in 0..FILED {
                    let id = t * per + k;
                    let handle = arm(engine, book, live, id).unwrap();
                    *book.handles[id].lock().unwrap() = Some(handle);
                    ok[id].store(true, Ordering::SeqCst);
                }
            });
        }
    });
    assert!(eventually(Duration::from_secs(5), || {
        engine.stats().total.scheduled == (THREADS * FILED) as u64
    }));
    std::thread::sleep(ms(50));
    let go = Arc::new(AtomicBool::new(false));
    let report = std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (engine, book, live, ok, go) = (&engine, &book, &live, &ok, &go);
            scope.spawn(move || {
                while !go.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
                for k in 0..per {
                    if k < FILED {
                        let id = t * per + k;
                        if engine.cancel(book.handle(id).unwrap()) {
                            book.cancelled[id].store(true, Ordering::SeqCst);
                        }
                    }
                    if k % 3 == 0 {
                        let id = t * per + FILED + k / 3;
                        if id < (t + 1) * per {
                            if let Some(handle) = arm(engine, book, live, id) {
                                *book.handles[id].lock().unwrap() = Some(handle);
                                ok[id].store(true, Ordering::SeqCst);
                            }
                        }
                    }
                }
            });
        }
        go.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_micros(300));
        engine.shutdown(pending)
    });
    // A later call, with nothing racing it, reports the final figures.
    let report = {
        let again = engine.shutdown(pending);
        assert!(again.ran >= report.ran && again.dropped >= report.dropped);
        again
    };
    let ok: Vec<bool> = ok.iter().map(|b| b.load(Ordering::SeqCst)).collect();
    let scheduled = ok.iter().filter(|&&b| b).count();
    let mut runs = 0;
    let mut cancelled = 0;
    for (id, &ok) in ok.iter().enumerate() {
        let r = book.runs[id].load(Ordering::SeqCst);
        assert!(r <= 1, "timer {id} ran {r} times");
        if book.cancelled[id].load(Ordering::SeqCst) {
            assert_eq!(r, 0, "timer {id}: cancelled, yet it ran");
            cancelled += 1;
        }
        if !ok {
            assert_eq!(r, 0, "timer {id}: refused, yet it ran");
        }
        runs += r;
    }
    match pending {
        PendingTimers::Run => {
            assert_eq!(report.dropped, 0);
            assert_eq!(runs as u64, report.ran, "every run was a shutdown's");
        }
        PendingTimers::Drop => {
            assert_eq!(report.ran, 0);
            assert_eq!(runs, 0, "nothing was due, so nothing ran");
        }
    }
    assert_eq!(
        cancelled as u64 + report.ran + report.dropped,
        scheduled as u64,
        "each scheduled timer cancelled, run or dropped, exactly once"
    );
    assert_all_given_back(&engine, &live);
    // A schedule refused because it raced the shutdown's flag (armed, pushed, then taken
    // back by its own cancel) counts neither as scheduled nor as cancelled: the caller saw
    // `Err(Shutdown)`, so `stats()` agrees with what the callers were told, exactly.
    let stats = engine.stats().total;
    assert_eq!(stats.scheduled, scheduled as u64, "{stats:?}");
    assert_eq!(stats.cancelled, cancelled as u64, "{stats:?}");
    assert_eq!(stats.pending, 0, "{stats:?}");
}

#[test]
#[cfg_attr(miri, ignore)]
fn shutdown_running_pending_races_cancel_floods() {
    for _ in 0..3 {
        shutdown_races_cancel_floods(PendingTimers::Run);
    }
}

#[test]
#[cfg_attr(miri, ignore)]
fn shutdown_dropping_pending_races_cancel_floods() {
    for _ in 0..3 {
        shutdown_races_cancel_floods(PendingTimers::Drop);
    }
}

/// On a hand-driven engine: threads cancel filed timers while the main thread shuts it
/// down, so many cancel messages arrive after the last turn and are taken by sweeps, in
/// batches of any size; then the threads keep poking their (now stale) handles, schedule
/// (refused) and exit with whatever their lanes hold.
#[test]
#[cfg_attr(miri, ignore)]
fn sweeps_after_shutdown_take_cancel_floods() {
    for seed in 0..4_u64 {
        let (engine, clock) = manual(2);
        let engine = Arc::new(engine);
        let live = Live::default();
        const THREADS: usize = 2;
        const PER: usize = 1_500;
        let book = Book::new(THREADS * PER);
        // Filed from two threads (so both shards hold some), which exit with their lanes.
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let (engine, book, live) = (&engine, &book, &live);
                scope.spawn(move || {
                    for k in 0..PER {
                        let id = t * PER + k;
                        let (b, w) = (Arc::clone(book), live.witness());
                        let handle = engine
                            .schedule(ms(500), move || {
                                let _keep = &w;
                                b.runs[id].fetch_add(1, Ordering::SeqCst);
                            })
                            .unwrap();
                        *book.handles[id].lock().unwrap() = Some(handle);
                    }
                });
            }
        });
        run_for(&engine, &clock, 40);
        assert_eq!(engine.nodes_in_use(), THREADS * PER);
        let go = Arc::new(AtomicBool::new(false));
        let report = std::thread::scope(|scope| {
            for t in 0..THREADS {
                let (engine, book, go) = (&engine, &book, &go);
                scope.spawn(move || {
                    while !go.load(Ordering::SeqCst) {
                        std::hint::spin_loop();
                    }
                    // Each thread cancels the other's timers too, from the far end.
                    for k in 0..PER {
                        for id in [t * PER + k, (1 - t) * PER + (PER - 1 - k)] {
                            if engine.cancel(book.handle(id).unwrap()) {
                                assert!(!book.cancelled[id].swap(true, Ordering::SeqCst));
                            }
                        }
                    }
                    for k in 0..PER {
                        let handle = book.handle(t * PER + k).unwrap();
                        assert!(!engine.cancel(handle));
                        assert!(!engine.reset(handle, ms(1)));
                    }
                });
            }
            go.store(true, Ordering::SeqCst);
            for _ in 0..seed * 50 {
                std::hint::spin_loop();
            }
            engine.shutdown(PendingTimers::Drop)
        });
        let report = {
            let again = engine.shutdown(PendingTimers::Drop);
            assert!(again.dropped >= report.dropped);
            again
        };
        let mut cancelled = 0;
        for id in 0..THREADS * PER {
            assert_eq!(book.runs[id].load(Ordering::SeqCst), 0, "timer {id} ran");
            cancelled += usize::from(book.cancelled[id].load(Ordering::SeqCst));
        }
        assert_eq!(report.ran, 0);
        assert_eq!(
            cancelled as u64 + report.dropped,
            (THREADS * PER) as u64,
            "seed {seed}: each timer cancelled or dropped"
        );
        assert_eq!(live.count(), 0, "seed {seed}: every capture dropped");
        assert_eq!(engine.nodes_in_use(), 0, "seed {seed}: every node back");
        assert_eq!(engine.turn(), 0);
        let refused = {
            let engine = Arc::clone(&engine);
            std::thread::spawn(move || engine.schedule(ms(1), || {}).is_err())
                .join()
                .unwrap()
        };
        assert!(refused, "a schedule after shutdown is refused");
        let stats = engine.stats().total;
        assert_eq!(stats.cancelled, cancelled as u64, "{stats:?}");
        assert_eq!(stats.pending, 0, "{stats:?}");
    }
}

/// Real clocks: threads schedule, cancel and reset timers of a shared table (the same
/// handle from several threads), in bursts that put big, odd-sized batches of messages in
/// the inbox while the workers drain it. Never early (against the earliest deadline any
/// successful call could have set), exactly once, nothing lost.
#[test]
#[cfg_attr(miri, ignore)]
fn real_clock_storm_on_shared_handles() {
    const THREADS: usize = 3;
    const PER_THREAD: usize = 4_000;
    let engine = unpinned(2);
    let origin = Instant::now();
    let micros = move || origin.elapsed().as_micros() as u64;
    let book = Book::new(THREADS * PER_THREAD);
    let cancel_true = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (engine, book, cancel_true) = (&engine, &book, &cancel_true);
            scope.spawn(move || {
                let mut rng = Rng(0xC0FFEE ^ t as u64);
                for k in 0..PER_THREAD {
                    let id = t * PER_THREAD + k;
                    let delay = rng.below(20);
                    let floor = micros() + delay * 1_000;
                    let b = Arc::clone(book);
                    let handle = engine
                        .schedule(ms(delay), move || {
                            b.ran_at[id].store(micros(), Ordering::SeqCst);
                            b.runs[id].fetch_add(1, Ordering::SeqCst);
                        })
                        .unwrap();
                    book.floor[id].fetch_min(floor, Ordering::SeqCst);
                    *book.handles[id].lock().unwrap() = Some(handle);
                    // Bursts: every 61st schedule, a run of operations on random timers.
                    let ops = if k % 61 == 0 { 40 } else { 2 };
                    for _ in 0..ops {
                        let target = rng.below((THREADS * PER_THREAD) as u64) as usize;
                        let Some(handle) = book.handle(target) else {
                            continue;
                        };
                        if rng.below(3) == 0 {
                            if engine.cancel(handle) {
                                assert!(!book.cancelled[target].swap(true, Ordering::SeqCst));
                                cancel_true.fetch_add(1, Ordering::SeqCst);
                            }
                        } else {
                            let delay = rng.below(25);
                            let floor = micros() + delay * 1_000;
                            if engine.reset(handle, ms(delay)) {
                                book.floor[target].fetch_min(floor, Ordering::SeqCst);
                            }
                        }
                    }
                }
            });
        }
    });
    let total = THREADS * PER_THREAD;
    assert!(
        eventually(Duration::from_secs(20), || {
            let stats = engine.stats().total;
            stats.pending == 0 && engine.nodes_in_use() == 0
        }),
        "the engine settles: {:?}, {} nodes in use",
        engine.stats().total,
        engine.nodes_in_use()
    );
    let (ran, cancelled) = book.check(&vec![true; total]);
    assert_eq!(ran + cancelled, total);
    assert_eq!(cancelled, cancel_true.load(Ordering::SeqCst));
    let stats = engine.stats().total;
    assert_eq!(stats.scheduled, total as u64, "{stats:?}");
    assert_eq!(stats.cancelled, cancelled as u64, "{stats:?}");
    assert_eq!(stats.fired, ran as u64, "{stats:?}");
    let report = engine.shutdown(PendingTimers::Run);
    assert_eq!((report.ran, report.dropped), (0, 0));
}
