//! Lanes holding timers back, attacked from the public API: phases of long-lived timers
//! and of timers cancelled within a few schedules (a thousand schedules a tick, so that the
//! old stacks come back before the worker wants them), with resets earlier and later of
//! timers that are kept on the young stack, parked on an old one or forwarded at that
//! moment, from the arming thread and from other threads racing its reclaims; threads
//! exiting with timers held on their lanes; shutdown in both modes racing held lanes; and
//! refused schedules from many threads and from thread-local destructors (the path without
//! a lane), checked against `stats()` exactly.
//!
//! Hand-driven tests check exact firing ticks. Real-clock tests assert only never early,
//! exactly once and nothing lost. All randomness is seeded.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::support::{Live, Rng, assert_all_given_back, manual, ms, run_for, unpinned};
use corewheel::{Clock, ManualClock, PendingTimers, ScheduleError, TimerEngine, TimerHandle};

/// A model of hand-driven timers: what fired (id, ms), what each timer is expected to do.
struct Model {
    clock: ManualClock,
    start: Instant,
    fired: Arc<Mutex<Vec<(usize, u64)>>>,
    live: Live,
    /// id -> (handle, expected firing ms, or None once cancelled).
    timers: Vec<(TimerHandle, Option<u64>)>,
    scheduled: u64,
    cancelled: u64,
    reset: u64,
}

impl Model {
    fn new(clock: &ManualClock) -> Self {
        Self {
            clock: clock.clone(),
            start: clock.now(),
            fired: Arc::default(),
            live: Live::default(),
            timers: Vec::new(),
            scheduled: 0,
            cancelled: 0,
            reset: 0,
        }
    }

    fn now_ms(&self) -> u64 {
        self.clock.now().duration_since(self.start).as_millis() as u64
    }

    /// Schedules timer number `timers.len()`, `delay_ms` from now; returns its id.
    fn schedule(&mut self, engine: &TimerEngine, delay_ms: u64) -> usize {
        let id = self.timers.len();
        let (fired, clock, start, w) = (
            Arc::clone(&self.fired),
            self.clock.clone(),
            self.start,
            self.live.witness(),
        );
        let handle = engine
            .schedule(ms(delay_ms), move || {
                let _keep = &w;
                let at = clock.now().duration_since(start).as_millis() as u64;
                fired.lock().unwrap().push((id, at));
            })
            .unwrap();
        self.timers.push((handle, Some(self.now_ms() + delay_ms)));
        self.scheduled += 1;
        id
    }

    /// Whether timer `id` is still to fire, as the model has it.
    fn is_pending(&self, id: usize) -> bool {
        self.timers[id].1.is_some_and(|at| at > self.now_ms())
    }

    fn cancel(&mut self, engine: &TimerEngine, id: usize) {
        let pending = self.is_pending(id);
        assert_eq!(
            engine.cancel(self.timers[id].0),
            pending,
            "cancel of timer {id} at {} ms (expected at {:?})",
            self.now_ms(),
            self.timers[id].1
        );
        if pending {
            self.timers[id].1 = None;
            self.cancelled += 1;
        }
    }

    fn reset(&mut self, engine: &TimerEngine, id: usize, delay_ms: u64) {
        let pending = self.is_pending(id);
        assert_eq!(
            engine.reset(self.timers[id].0, ms(delay_ms)),
            pending,
            "reset of timer {id} at {} ms (expected at {:?})",
            self.now_ms(),
            self.timers[id].1
        );
        if pending {
            self.timers[id].1 = Some(self.now_ms() + delay_ms);
            self.reset += 1;
        }
    }

    /// Cancels every timer still pending, runs `extra` ms, and checks every firing tick,
    /// every node and capture back, and the counts.
    fn settle(&mut self, engine: &TimerEngine, extra: u64) {
        let until = self.now_ms() + extra;
        for id in 0..self.timers.len() {
            if self.timers[id].1.is_some_and(|at| at > until) {
                self.cancel(engine, id);
            }
        }
        run_for(engine, &self.clock, extra + 1);
        let mut fired = self.fired.lock().unwrap().clone();
        fired.sort_unstable();
        let mut expected: Vec<(usize, u64)> = self
            .timers
            .iter()
            .enumerate()
            .filter_map(|(id, &(_, at))| Some((id, at?)))
            .collect();
        expected.sort_unstable();
        if fired != expected {
            let got: HashMap<usize, Vec<u64>> =
                fired.iter().fold(HashMap::new(), |mut map, &(id, at)| {
                    map.entry(id).or_default().push(at);
                    map
                });
            let wrong: Vec<_> = expected
                .iter()
                .filter(|(id, at)| got.get(id).map(Vec::as_slice) != Some(&[*at][..]))
                .take(10)
                .map(|&(id, at)| (id, at, got.get(&id).cloned()))
                .collect();
            let extra: Vec<_> = fired
                .iter()
                .filter(|(id, _)| self.timers[*id].1.is_none())
                .take(10)
                .collect();
            panic!(
                "{} fired, {} expected; wrong (id, expected, got): {wrong:?}; cancelled yet fired: {extra:?}",
                fired.len(),
                expected.len()
            );
        }
        assert_eq!(self.live.count(), 0, "every capture dropped");
        assert_eq!(engine.nodes_in_use(), 0, "every node back in its pool");
        let stats = engine.stats().total;
        assert_eq!(stats.scheduled, self.scheduled, "{stats:?}");
        assert_eq!(stats.cancelled, self.cancelled, "{stats:?}");
        assert_eq!(stats.reset, self.reset, "{stats:?}");
        assert_eq!(stats.fired, expected.len() as u64, "{stats:?}");
        assert_eq!(stats.pending, 0, "{stats:?}");
    }
}

/// One tick of a phase: `per_tick` schedules from this thread. In a `long` phase the
/// timers outlive any hold-back (the lane forwards them); otherwise each is cancelled a few
/// schedules after it was armed (the lane catches it). Now and then a recent
/// timer (kept on the young stack, parked, or forwarded at that moment) is reset earlier
/// (due within a few ticks, or within the lane's horizons) or later.
fn phase_tick(engine: &TimerEngine, model: &mut Model, rng: &mut Rng, long: bool, per_tick: usize) {
    let mut recent: Vec<usize> = Vec::new();
    for i in 0..per_tick {
        let delay = if long {
            match rng.below(100) {
                0..=4 => 1 + rng.below(12),
                5..=19 => 100 + rng.below(400),
                _ => 5_000 + rng.below(1_000),
            }
        } else {
            200 + rng.below(3_000)
        };
        let id = model.schedule(engine, delay);
        recent.push(id);
        if !long && recent.len() > 1 + (i % 37) {
            // Cancelled a few dozen schedules later: held timers come back caught.
            let victim = recent.remove(0);
            model.cancel(engine, victim);
        }
        if i % 41 == 7 {
            let back = rng.below(200) as usize;
            let ids = model.timers.len();
            let victim = ids - 1 - back.min(ids - 1);
            let delay = match rng.below(4) {
                0 => 1 + rng.below(3),
                1 => 4 + rng.below(12),
                2 => 30 + rng.below(100),
                _ => 8_000 + rng.below(1_000),
            };
            model.reset(engine, victim, delay);
        }
    }
}

/// One thread's lane alternates phases of long and short-lived timers, with every
/// kind of reset hitting timers kept, parked or forwarded at their first claim: each timer
/// fires once, at its own tick, and every node comes back.
#[test]
#[cfg_attr(miri, ignore)]
fn a_lane_mixing_short_and_long_timers_fires_each_at_its_own_tick() {
    for seed in 0..3 {
        let (engine, clock) = manual(1);
        let mut model = Model::new(&clock);
        let mut rng = Rng(0x5EED_0001 + 16 * seed);
        for phase in 0..8 {
            let long = phase % 2 == 0;
            for _ in 0..12 {
                phase_tick(&engine, &mut model, &mut rng, long, 1_000);
                run_for(&engine, &clock, 1);
            }
        }
        model.settle(&engine, 3_500);
    }
}

/// As above with the schedules per tick around the rate at which the lane takes its old
/// stacks back itself (near the worker's need for them), so that parked timers come back
/// sometimes to the producer and sometimes to the worker across the phases.
#[test]
#[cfg_attr(miri, ignore)]
fn a_lane_taking_its_old_stacks_back_near_their_need_loses_nothing() {
    let (engine, clock) = manual(2);
    let mut model = Model::new(&clock);
    let mut rng = Rng(0x5EED_0002);
    for phase in 0..10 {
        let long = phase % 3 != 2;
        for tick in 0..10 {
            let per_tick = [64, 130, 500, 1_000, 2_000][(phase + tick) % 5];
            phase_tick(&engine, &mut model, &mut rng, long, per_tick);
            run_for(&engine, &clock, 1 + rng.below(3));
        }
    }
    model.settle(&engine, 3_500);
}

/// What a helper thread is asked to do to a timer within the current tick.
enum Op {
    Cancel(TimerHandle),
    Reset(TimerHandle, u64),
    EndOfTick,
}

/// Other threads cancel and reset (earlier and later) the timers of a thread whose lane
/// alternates phases, while that thread keeps scheduling and so reclaims its lane: all within one tick
/// of the manual clock, so each outcome is exact.
#[test]
#[cfg_attr(miri, ignore)]
fn other_threads_cancel_and_reset_while_the_lane_reclaims() {
    let (engine, clock) = manual(1);
    let engine = Arc::new(engine);
    let mut model = Model::new(&clock);
    let mut rng = Rng(0x5EED_0003);
    const HELPERS: usize = 2;
    let (done_tx, done_rx) = mpsc::channel::<u64>();
    let mut to_helpers = Vec::new();
    let mut helpers = Vec::new();
    for _ in 0..HELPERS {
        let (tx, rx) = mpsc::channel::<Op>();
        to_helpers.push(tx);
        let (engine, done) = (Arc::clone(&engine), done_tx.clone());
        helpers.push(std::thread::spawn(move || {
            let mut failures = 0;
            for op in rx {
                match op {
                    Op::Cancel(handle) => failures += u64::from(!engine.cancel(handle)),
                    Op::Reset(handle, delay) => {
                        failures += u64::from(!engine.reset(handle, ms(delay)));
                    }
                    Op::EndOfTick => done.send(failures).unwrap(),
                }
            }
        }));
    }
    for phase in 0..8 {
        let long = phase % 2 == 0;
        for _ in 0..10 {
            for i in 0..1_000 {
                let delay = if long {
                    5_000 + rng.below(500)
                } else {
                    300 + rng.below(2_000)
                };
                let id = model.schedule(&engine, delay);
                // Every few schedules, hand a recent timer to a helper: the helper's
                // cancel or reset races this thread's next reclaims of it.
                if i % 3 == 0 {
                    let victim = id - (rng.below(150) as usize).min(id);
                    if !model.is_pending(victim) {
                        continue;
                    }
                    // One helper per timer, so that its operations arrive in order.
                    let helper = &to_helpers[victim % HELPERS];
                    let handle = model.timers[victim].0;
                    let now = model.now_ms();
                    if !long && rng.below(3) != 0 || rng.below(4) == 0 {
                        helper.send(Op::Cancel(handle)).unwrap();
                        model.timers[victim].1 = None;
                        model.cancelled += 1;
                    } else {
                        let delay = match rng.below(3) {
                            0 => 1 + rng.below(4),
                            1 => 5 + rng.below(60),
                            _ => 7_000 + rng.below(500),
                        };
                        helper.send(Op::Reset(handle, delay)).unwrap();
                        model.timers[victim].1 = Some(now + delay);
                        model.reset += 1;
                    }
                }
            }
            for helper in &to_helpers {
                helper.send(Op::EndOfTick).unwrap();
            }
            let failures: u64 = (0..HELPERS).map(|_| done_rx.recv().unwrap()).sum();
            assert_eq!(failures, 0, "a cancel or reset of a pending timer failed");
            run_for(&engine, &clock, 1);
        }
    }
    drop(to_helpers);
    for helper in helpers {
        helper.join().unwrap();
    }
    model.settle(&engine, 8_000);
}

/// Threads alternate phases on their lanes (one ms of the manual clock per round, moved by the main
/// thread between barriers) and exit, in generations that live different numbers of
/// rounds, with timers kept, parked and forwarded on their lanes: every timer fires once
/// at its own tick, and every node comes back.
#[test]
#[cfg_attr(miri, ignore)]
fn threads_exiting_with_held_timers_lose_nothing() {
    const THREADS: usize = 3;
    let (engine, clock) = manual(2);
    let start = clock.now();
    let fired: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let expected: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let next_id = AtomicUsize::new(0);
    let live = Live::default();
    let (scheduled, cancelled) = (AtomicU64::new(0), AtomicU64::new(0));
    for generation in 0..4_u64 {
        let rounds = 5 + 4 * generation as usize;
        let barrier = Barrier::new(THREADS + 1);
        std::thread::scope(|scope| {
            let mut threads = Vec::new();
            for t in 0..THREADS {
                let (engine, clock, fired, expected, next_id, live, barrier) = (
                    &engine, &clock, &fired, &expected, &next_id, &live, &barrier,
                );
                let (scheduled, cancelled) = (&scheduled, &cancelled);
                threads.push(scope.spawn(move || {
                    let mut rng = Rng(0x5EED_0100 + 16 * generation + t as u64);
                    for round in 0..rounds {
                        let long = (round / 4 + t) % 2 == 0;
                        let now = clock.now().duration_since(start).as_millis() as u64;
                        let mut recent = Vec::new();
                        for i in 0..1_000 {
                            let id = next_id.fetch_add(1, Ordering::Relaxed);
                            let delay = if long && i % 10 != 0 {
                                2_000 + rng.below(1_000)
                            } else {
                                1 + rng.below(400)
                            };
                            let (fired, clock, w) =
                                (Arc::clone(fired), clock.clone(), live.witness());
                            let handle = engine
                                .schedule(ms(delay), move || {
                                    let _keep = &w;
                                    let at = clock.now().duration_since(start).as_millis() as u64;
                                    fired.lock().unwrap().push((id, at));
                                })
                                .unwrap();
                            scheduled.fetch_add(1, Ordering::Relaxed);
                            recent.push((id, handle, now + delay));
                            if !long && recent.len() > 8 {
                                let (_, handle, _) = recent.remove(0);
                                assert!(engine.cancel(handle));
                                cancelled.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        expected
                            .lock()
                            .unwrap()
                            .extend(recent.into_iter().map(|(id, _, at)| (id, at)));
                        barrier.wait();
                        barrier.wait();
                    }
                    // Exits here, with whatever its lane holds.
                }));
            }
            for _ in 0..rounds {
                barrier.wait();
                run_for(&engine, &clock, 1);
                barrier.wait();
            }
            // A scope ends once the threads' closures have returned, maybe before their
            // thread-locals (this engine's contexts, which close the lanes) are destroyed;
            // a join waits for those too. Without it, a thread preempted while closing its
            // lane holds its timers through the next turns, which then fire them late
            // (seen here at 1 to 3 ticks): the same as a producer holding nodes on a worker
            // engine, whose close wakes the worker afterwards.
            for thread in threads {
                thread.join().unwrap();
            }
        });
        // A few ticks between generations, some timers of the last one coming due.
        run_for(&engine, &clock, 1 + generation);
    }
    run_for(&engine, &clock, 3_100);
    let mut fired = fired.lock().unwrap().clone();
    fired.sort_unstable();
    let mut expected = expected.lock().unwrap().clone();
    expected.sort_unstable();
    assert_eq!(fired.len(), expected.len(), "each timer fired once");
    let wrong: Vec<_> = fired
        .iter()
        .zip(&expected)
        .filter(|(f, e)| f != e)
        .take(12)
        .collect();
    assert!(
        wrong.is_empty(),
        "each timer at its own tick: (fired, expected) {wrong:?}"
    );
    assert_eq!(live.count(), 0, "every capture dropped");
    assert_eq!(engine.nodes_in_use(), 0, "every node back");
    let stats = engine.stats().total;
    assert_eq!(
        stats.scheduled,
        scheduled.load(Ordering::Relaxed),
        "{stats:?}"
    );
    assert_eq!(
        stats.cancelled,
        cancelled.load(Ordering::Relaxed),
        "{stats:?}"
    );
    assert_eq!(stats.fired, expected.len() as u64, "{stats:?}");
    assert_eq!(stats.pending, 0, "{stats:?}");
}

/// Per-timer records of a real-clock race.
struct Book {
    ok: Vec<AtomicBool>,
    cancelled: Vec<AtomicBool>,
    runs: Vec<AtomicUsize>,
    /// When each ran (the last run), and by when it was due.
    ran_at: Vec<Mutex<Option<Instant>>>,
    due: Vec<Mutex<Option<Instant>>>,
}

impl Book {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Self {
            ok: (0..n).map(|_| AtomicBool::new(false)).collect(),
            cancelled: (0..n).map(|_| AtomicBool::new(false)).collect(),
            runs: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            ran_at: (0..n).map(|_| Mutex::new(None)).collect(),
            due: (0..n).map(|_| Mutex::new(None)).collect(),
        })
    }
}

/// Threads whose lanes are in either state (some forwarding long timers at their first
/// claim, some holding short-lived ones) schedule, cancel and reset until the shutdown
/// refuses them: never early (before the shutdown), exactly once, nothing lost, and
/// `stats()` equal to what the callers were told.
fn shutdown_races_lanes_in_either_state(pending: PendingTimers, seed: u64) {
    const THREADS: usize = 4;
    const PER: usize = 30_000;
    let engine = unpinned(2);
    let live = Live::default();
    let book = Book::new(THREADS * PER);
    let resets = AtomicU64::new(0);
    let go = AtomicBool::new(false);
    let shutdown_at: Mutex<Option<Instant>> = Mutex::new(None);
    let report = std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (engine, live, book, resets, go) = (&engine, &live, &book, &resets, &go);
            scope.spawn(move || {
                let mut rng = Rng(seed + t as u64);
                let forwarding = t % 2 == 0;
                let mut recent: Vec<(usize, TimerHandle)> = Vec::new();
                while !go.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
                for k in 0..PER {
                    let id = t * PER + k;
                    let delay = match rng.below(10) {
                        0..=1 => ms(rng.below(5)),
                        2 => ms(5 + rng.below(40)),
                        _ if forwarding => Duration::from_secs(60),
                        _ => ms(50 + rng.below(200)),
                    };
                    let (b, w) = (Arc::clone(book), live.witness());
                    let armed = Instant::now();
                    let Ok(handle) = engine.schedule(delay, move || {
                        let _keep = &w;
                        b.runs[id].fetch_add(1, Ordering::SeqCst);
                        *b.ran_at[id].lock().unwrap() = Some(Instant::now());
                    }) else {
                        return;
                    };
                    *book.due[id].lock().unwrap() = Some(armed + delay);
                    book.ok[id].store(true, Ordering::SeqCst);
                    recent.push((id, handle));
                    if !forwarding && recent.len() > 12 {
                        let (victim, handle) = recent.remove(0);
                        if engine.cancel(handle) {
                            book.cancelled[victim].store(true, Ordering::SeqCst);
                        }
                    }
                    if recent.len() > 64 {
                        recent.remove(0);
                    }
                    if k % 29 == 0 && !recent.is_empty() {
                        let (victim, handle) = recent[rng.below(recent.len() as u64) as usize];
                        let later = rng.below(2) == 0;
                        let delay = if later { ms(300) } else { ms(rng.below(3)) };
                        let start = Instant::now();
                        if engine.reset(handle, delay) {
                            resets.fetch_add(1, Ordering::Relaxed);
                            *book.due[victim].lock().unwrap() = Some(start + delay);
                        }
                    }
                }
            });
        }
        go.store(true, Ordering::SeqCst);
        std::thread::sleep(ms(40));
        *shutdown_at.lock().unwrap() = Some(Instant::now());
        engine.shutdown(pending)
    });
    let report = {
        let again = engine.shutdown(pending);
        assert!(again.ran >= report.ran && again.dropped >= report.dropped);
        again
    };
    let shutdown_at = shutdown_at.lock().unwrap().unwrap();
    let (mut scheduled, mut cancelled, mut runs) = (0_u64, 0_u64, 0_u64);
    for id in 0..THREADS * PER {
        let r = book.runs[id].load(Ordering::SeqCst) as u64;
        let ok = book.ok[id].load(Ordering::SeqCst);
        assert!(r <= 1, "timer {id} ran {r} times");
        if !ok {
            assert_eq!(r, 0, "timer {id}: refused, yet it ran");
            continue;
        }
        scheduled += 1;
        if book.cancelled[id].load(Ordering::SeqCst) {
            assert_eq!(r, 0, "timer {id}: cancelled, yet it ran");
            cancelled += 1;
        }
        if let Some(at) = *book.ran_at[id].lock().unwrap() {
            let due = book.due[id].lock().unwrap().unwrap();
            if at < shutdown_at {
                // The due instant was taken before the schedule read the clock, so a run
                // before it is early by any reading.
                assert!(at >= due, "timer {id} ran {:?} early", due - at);
            }
        }
        runs += r;
    }
    let stats = engine.stats().total;
    match pending {
        PendingTimers::Run => assert_eq!(report.dropped, 0),
        PendingTimers::Drop => assert_eq!(report.ran, 0),
    }
    assert_eq!(
        cancelled + (runs - report.ran) + report.ran + report.dropped,
        scheduled,
        "each scheduled timer cancelled, run or dropped, exactly once: {report:?} {stats:?}"
    );
    assert_all_given_back(&engine, &live);
    assert_eq!(stats.scheduled, scheduled, "{stats:?}");
    assert_eq!(stats.cancelled, cancelled, "{stats:?}");
    assert_eq!(stats.reset, resets.load(Ordering::Relaxed), "{stats:?}");
    assert_eq!(stats.pending, 0, "{stats:?}");
}

#[test]
#[cfg_attr(miri, ignore)]
fn shutdown_running_pending_races_held_lanes() {
    for seed in 0..2 {
        shutdown_races_lanes_in_either_state(PendingTimers::Run, 0x5EED_1000 + 16 * seed);
    }
}

#[test]
#[cfg_attr(miri, ignore)]
fn shutdown_dropping_pending_races_held_lanes() {
    for seed in 0..2 {
        shutdown_races_lanes_in_either_state(PendingTimers::Drop, 0x5EED_2000 + 16 * seed);
    }
}

/// What one racing thread was told.
#[derive(Default)]
struct Told {
    ok: AtomicU64,
    cancelled: AtomicU64,
    refused: AtomicU64,
}

/// Schedules and cancels at once until refused; counts what it was told.
fn schedule_until_refused(engine: &TimerEngine, told: &Told, live: &Live) {
    loop {
        let w = live.witness();
        match engine.schedule(Duration::from_secs(3_600), move || drop(w)) {
            Ok(handle) => {
                told.ok.fetch_add(1, Ordering::Relaxed);
                if engine.cancel(handle) {
                    told.cancelled.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(ScheduleError::Shutdown) => {
                told.refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(error) => panic!("{error:?}"),
        }
    }
}

/// A thread's last act: its thread-local's destructor schedules until refused, on the
/// path without a lane (this thread's contexts are gone by then).
struct ExitScheduler(Option<(Arc<TimerEngine>, Arc<Told>, Live)>);

impl Drop for ExitScheduler {
    fn drop(&mut self) {
        if let Some((engine, told, live)) = self.0.take() {
            schedule_until_refused(&engine, &told, &live);
        }
    }
}

std::thread_local! {
    static EXIT_SCHEDULER: RefCell<ExitScheduler> = const { RefCell::new(ExitScheduler(None)) };
}

/// Many threads with lanes, and threads exiting through thread-local destructors (no
/// lane), schedule until the shutdown refuses them, in both modes: `stats()` counts
/// exactly the schedules told `Ok` and the cancels that returned `true`, and every timer
/// told `Ok` and not cancelled ran or was dropped by the shutdown.
#[test]
#[cfg_attr(miri, ignore)]
fn refused_schedules_with_and_without_lanes_count_exactly() {
    for round in 0..8 {
        let pending = if round % 2 == 0 {
            PendingTimers::Run
        } else {
            PendingTimers::Drop
        };
        let engine = Arc::new(
            TimerEngine::builder()
                .workers(2)
                .pin_workers(false)
                .build()
                .unwrap(),
        );
        let told = Arc::new(Told::default());
        let live = Live::default();
        let exit = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for t in 0..6 {
            let (engine, told, live, exit) = (
                Arc::clone(&engine),
                Arc::clone(&told),
                live.clone(),
                Arc::clone(&exit),
            );
            threads.push(std::thread::spawn(move || {
                if t % 2 == 0 {
                    // Registered before this thread first touches the engine, so destroyed
                    // after its contexts: the destructor schedules without a lane.
                    EXIT_SCHEDULER.with(|slot| {
                        *slot.borrow_mut() =
                            ExitScheduler(Some((Arc::clone(&engine), told.clone(), live.clone())));
                    });
                    while !exit.load(Ordering::SeqCst) {
                        let w = live.witness();
                        if let Ok(handle) = engine.schedule(ms(3_600_000), move || drop(w)) {
                            told.ok.fetch_add(1, Ordering::Relaxed);
                            if engine.cancel(handle) {
                                told.cancelled.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                } else {
                    schedule_until_refused(&engine, &told, &live);
                }
            }));
        }
        std::thread::sleep(ms(5));
        exit.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_micros(200 * (round % 4)));
        let report = engine.shutdown(pending);
        for thread in threads {
            thread.join().unwrap();
        }
        let report = {
            let again = engine.shutdown(pending);
            assert!(again.ran >= report.ran && again.dropped >= report.dropped);
            again
        };
        assert_all_given_back(&engine, &live);
        let stats = engine.stats().total;
        let (ok, cancelled) = (
            told.ok.load(Ordering::Relaxed),
            told.cancelled.load(Ordering::Relaxed),
        );
        assert_eq!(stats.scheduled, ok, "round {round}: {stats:?}");
        assert_eq!(stats.cancelled, cancelled, "round {round}: {stats:?}");
        assert_eq!(
            ok - cancelled,
            report.ran + report.dropped,
            "round {round}: {report:?} {stats:?}"
        );
        assert_eq!(stats.pending, 0, "round {round}: {stats:?}");
    }
}

/// A repeating timer whose schedule races the shutdown: pushed before the flag, run by a
/// `PendingTimers::Run` shutdown's last turn while the schedule, seeing the flag, tries to
/// take it back. A cancel would succeed there (a repeating timer cancels "mid-callback")
/// and tell the caller `Err(Shutdown)` though its callback ran; the schedule must stand
/// instead. The callbacks sleep while they run at shutdown, to widen the window.
#[test]
#[cfg_attr(miri, ignore)]
fn a_refused_repeating_schedule_never_runs() {
    const THREADS: usize = 6;
    let mut refused_runs = Vec::new();
    for round in 0..60 {
        let engine = unpinned(1);
        let ran: Arc<Mutex<Vec<usize>>> = Arc::default();
        let shutting = Arc::new(AtomicBool::new(false));
        let go = AtomicBool::new(false);
        let refused: Mutex<Vec<usize>> = Mutex::new(Vec::new());
        let ok_count = AtomicU64::new(0);
        let cancel_count = AtomicU64::new(0);
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let (engine, ran, shutting, go, refused) =
                    (&engine, &ran, &shutting, &go, &refused);
                let (ok_count, cancel_count) = (&ok_count, &cancel_count);
                scope.spawn(move || {
                    while !go.load(Ordering::SeqCst) {
                        std::hint::spin_loop();
                    }
                    for k in 0.. {
                        let id = t * 1_000_000 + k;
                        let (ran, shutting) = (Arc::clone(ran), Arc::clone(shutting));
                        match engine.schedule_repeating(Duration::from_secs(3_600), move || {
                            ran.lock().unwrap().push(id);
                            if shutting.load(Ordering::SeqCst) {
                                std::thread::sleep(ms(2));
                            }
                        }) {
                            Ok(handle) => {
                                ok_count.fetch_add(1, Ordering::Relaxed);
                                if engine.cancel(handle) {
                                    cancel_count.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            Err(_) => {
                                refused.lock().unwrap().push(id);
                                return;
                            }
                        }
                    }
                });
            }
            go.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_micros(500 + 37 * (round % 20)));
            shutting.store(true, Ordering::SeqCst);
            engine.shutdown(PendingTimers::Run);
        });
        let ran = ran.lock().unwrap().clone();
        for id in refused.lock().unwrap().iter() {
            if ran.contains(id) {
                let stats = engine.stats().total;
                refused_runs.push((round, *id, stats));
            }
        }
    }
    assert!(
        refused_runs.is_empty(),
        "refused with Err(Shutdown), yet run (round, id, stats): {refused_runs:?}"
    );
}
