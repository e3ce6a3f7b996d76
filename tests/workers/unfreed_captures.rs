//! `Unfreed`: a cancelled timer's captures whose `Drop` runs code are
//! dropped after the look lets the shard's wheel go, marked running. Attacks: captures
//! whose `Drop` blocks, panics, re-enters the engine (stale handles, schedule, cancel,
//! turn, shutdown, dropping the last engine), waker timers, many threads racing shutdown,
//! and what cancels cost in wake-ups afterwards (`cancelled_captures_leave_no_watcher_lingering`:
//! no watcher may linger for half a second after each drop of captures, which
//! `Balance::dropping` prevents).
//!
//! Real-clock tests assert only what holds on a loaded 2-core machine (generous limits,
//! never early, exactly once, nothing lost) and release their gates on failure.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{RawWaker, RawWakerVTable, Waker};
use std::time::{Duration, Instant};

use crate::support;

use crate::support::stuck::{
    Gate, OpenOnDrop, agents, blocking, engine, on_agent, started, worker_index,
};
use crate::support::{Live, Rng, Wakes, eventually, ms, poll, serial, within};
use corewheel::{Clock, ManualClock, PendingTimers, TimerEngine, TimerHandle};

/// How long a timer that must be rescued, or a capture that must be dropped, may take.
const LIMIT: Duration = Duration::from_secs(20);

/// A hand-driven engine of one shard, shareable, with turns that stand in for a turn stuck
/// for more than two ticks.
fn manual_one() -> (Arc<TimerEngine>, ManualClock) {
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(1)
        .rescue_after(Some(2))
        .manual_clock(clock.clone())
        .build()
        .expect("a manual engine");
    (Arc::new(engine), clock)
}

/// Counts drops of a capture: more than one is a double free.
#[derive(Clone, Default)]
struct Drops(Arc<AtomicUsize>);

impl Drops {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A capture that counts its drop, and reports the thread it was dropped on.
struct Counted {
    drops: Drops,
    on: Option<mpsc::Sender<Option<usize>>>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.drops.0.fetch_add(1, Ordering::SeqCst);
        if let Some(on) = &self.on {
            let _ = on.send(worker_index());
        }
    }
}

fn counted(drops: &Drops) -> Counted {
    Counted {
        drops: drops.clone(),
        on: None,
    }
}

/// A capture whose `Drop` reports in, then blocks on its gate.
struct BlocksOnDrop {
    gate: Gate,
    dropping: mpsc::Sender<Option<usize>>,
    drops: Drops,
}

impl BlocksOnDrop {
    /// A capture blocking on `gate` once dropped, the channel its drops report the worker
    /// on, and its drop count.
    fn new(gate: &Gate) -> (Self, mpsc::Receiver<Option<usize>>, Drops) {
        let (dropping, reports) = mpsc::channel();
        let drops = Drops::default();
        let capture = Self {
            gate: gate.clone(),
            dropping,
            drops: drops.clone(),
        };
        (capture, reports, drops)
    }
}

/// Blocks the owner of `agent`'s shard on `gate` in a callback due 50 ms from now, and
/// returns once it runs, with the worker running it.
fn block_owner(
    engine: &Arc<TimerEngine>,
    agent: &mpsc::Sender<support::stuck::Job>,
    gate: &Gate,
) -> Option<usize> {
    let (started_tx, started_rx) = mpsc::channel();
    let (engine, callback) = (Arc::clone(engine), blocking(gate, &started_tx));
    on_agent(agent, move || {
        engine.schedule(ms(50), callback).unwrap();
    });
    started(&started_rx, "the owner's callback")
}

/// Arms a timer an hour out on `agent`'s shard whose callback holds `capture`, and cancels
/// it at once: its owner frees it (and drops `capture`) at its next look.
fn arm_and_cancel(
    engine: &Arc<TimerEngine>,
    agent: &mpsc::Sender<support::stuck::Job>,
    capture: BlocksOnDrop,
) -> TimerHandle {
    let engine = Arc::clone(engine);
    on_agent(agent, move || {
        let x = engine
            .schedule(Duration::from_secs(3600), move || {
                let _ = &capture;
            })
            .unwrap();
        assert!(engine.cancel(x));
        x
    })
}

impl Drop for BlocksOnDrop {
    fn drop(&mut self) {
        self.drops.0.fetch_add(1, Ordering::SeqCst);
        let _ = self.dropping.send(worker_index());
        self.gate.wait();
    }
}

/// A capture whose `Drop` panics.
struct PanicsOnDrop(Drops);

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        self.0.0.fetch_add(1, Ordering::SeqCst);
        panic!("hostile_unfreed: a capture's Drop panics (expected)");
    }
}

/// What a re-entering capture saw from inside its `Drop`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Seen {
    pending: bool,
    cancel_self: bool,
    reset_self: bool,
    turned: usize,
    cancel_other: bool,
    scheduled_new: bool,
    new_is_self: bool,
}

/// Attack 1: Hand-driven, one shard. A cancelled timer A's capture re-enters the engine from its
/// `Drop`, which a turn runs once it has let the wheel go: A's own (stale) handle must read
/// not pending and refuse cancel and reset; a nested turn returns 0; it cancels another
/// pending timer B (true) and schedules a new timer C (which must not get A's node, and
/// must fire once, on time). A's capture is dropped once, B's once, C never early, and
/// every node goes back.
#[test]
fn a_capture_reentering_the_engine_from_its_drop_sees_a_dead_handle() {
    let _serial = serial();
    let (engine, clock) = manual_one();
    let b_drops = Drops::default();
    let b = engine
        .schedule(ms(1000), {
            let capture = counted(&b_drops);
            move || {
                let _ = &capture;
            }
        })
        .unwrap();
    let a_handle: Arc<Mutex<Option<TimerHandle>>> = Arc::default();
    let seen: Arc<Mutex<Option<Seen>>> = Arc::default();
    let c_fired: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let c_handle: Arc<Mutex<Option<TimerHandle>>> = Arc::default();
    let a_drops = Drops::default();
    struct Reenter {
        engine: Arc<TimerEngine>,
        clock: ManualClock,
        me: Arc<Mutex<Option<TimerHandle>>>,
        other: TimerHandle,
        seen: Arc<Mutex<Option<Seen>>>,
        c_fired: Arc<Mutex<Vec<Instant>>>,
        c_handle: Arc<Mutex<Option<TimerHandle>>>,
        drops: Drops,
    }
    impl Drop for Reenter {
        fn drop(&mut self) {
            self.drops.0.fetch_add(1, Ordering::SeqCst);
            let me = self.me.lock().unwrap().expect("A's handle");
            let engine = &self.engine;
            let (fired, clock) = (Arc::clone(&self.c_fired), self.clock.clone());
            let new = engine.schedule(ms(5), move || fired.lock().unwrap().push(clock.now()));
            let new_is_self = new.as_ref().is_ok_and(|&h| h == me);
            *self.c_handle.lock().unwrap() = new.as_ref().ok().copied();
            *self.seen.lock().unwrap() = Some(Seen {
                pending: engine.is_pending(me),
                cancel_self: engine.cancel(me),
                reset_self: engine.reset(me, ms(1)),
                turned: engine.turn(),
                cancel_other: engine.cancel(self.other),
                scheduled_new: new.is_ok(),
                new_is_self,
            });
        }
    }
    let capture = Reenter {
        engine: Arc::clone(&engine),
        clock: clock.clone(),
        me: Arc::clone(&a_handle),
        other: b,
        seen: Arc::clone(&seen),
        c_fired: Arc::clone(&c_fired),
        c_handle: Arc::clone(&c_handle),
        drops: a_drops.clone(),
    };
    let a = engine
        .schedule(ms(1000), move || {
            let _ = &capture;
        })
        .unwrap();
    *a_handle.lock().unwrap() = Some(a);
    assert!(engine.cancel(a), "A cancelled");
    // Past the cancel message's lazy need: the turn frees A.
    clock.advance(ms(100));
    let scheduled_at = clock.now();
    assert_eq!(engine.turn(), 0, "nothing was due");
    assert_eq!(a_drops.count(), 1, "A's capture dropped once by the turn");
    assert_eq!(
        seen.lock().unwrap().clone(),
        Some(Seen {
            pending: false,
            cancel_self: false,
            reset_self: false,
            turned: 0,
            cancel_other: true,
            scheduled_new: true,
            new_is_self: false,
        }),
        "what A's capture saw from its Drop"
    );
    // A's handle stays dead while its node is reused.
    let reused: Vec<TimerHandle> = (0..64)
        .map(|_| engine.schedule(ms(1000), || {}).unwrap())
        .collect();
    assert!(!engine.is_pending(a) && !engine.cancel(a) && !engine.reset(a, ms(1)));
    assert!(
        reused.iter().all(|&h| engine.is_pending(h)),
        "reused timers intact"
    );
    for _ in 0..10 {
        clock.advance(ms(1));
        engine.turn();
    }
    let fired = c_fired.lock().unwrap().clone();
    assert_eq!(fired.len(), 1, "C (scheduled from A's Drop) fired once");
    assert!(fired[0] >= scheduled_at + ms(5), "C fired early");
    clock.advance(ms(100));
    engine.turn();
    assert_eq!(b_drops.count(), 1, "B's capture dropped once");
    assert_eq!(a_drops.count(), 1, "A's capture still dropped once");
    for h in reused {
        assert!(engine.cancel(h));
    }
    clock.advance(ms(100));
    engine.turn();
    assert_eq!(engine.nodes_in_use(), 0, "every node went back");
    let report = engine.shutdown(PendingTimers::Drop);
    assert_eq!(report.dropped, 0);
    drop(c_handle);
}

/// Attack 2: Hand-driven, one shard, rescue after 2 ticks. Thread T's turn claims a due timer B,
/// then frees a cancelled timer A whose capture's `Drop` blocks. While it blocks, this
/// thread's turns must stand in: run B (once, not T), not run C before its deadline and run
/// it once after, and free another cancelled timer D (dropping its capture here). Then T
/// is let go: it runs nothing more, and every node goes back.
#[test]
fn a_turn_blocked_in_a_captures_drop_is_stood_in_for() {
    let _serial = serial();
    let (engine, clock) = manual_one();
    let gate = Gate::default();
    let _open = OpenOnDrop(gate.clone());
    let (capture, dropping, a_drops) = BlocksOnDrop::new(&gate);
    let a = engine
        .schedule(ms(1000), move || {
            let _ = &capture;
        })
        .unwrap();
    assert!(engine.cancel(a));
    let b_runs = Arc::new(Mutex::new(Vec::new()));
    let b_runs_in = Arc::clone(&b_runs);
    engine
        .schedule(ms(50), move || {
            b_runs_in
                .lock()
                .unwrap()
                .push(std::thread::current().name().map(str::to_owned))
        })
        .unwrap();
    clock.advance(ms(100));
    let turning = {
        let engine = Arc::clone(&engine);
        std::thread::Builder::new()
            .name("turner-T".into())
            .spawn(move || engine.turn())
            .unwrap()
    };
    dropping
        .recv_timeout(LIMIT)
        .expect("A's capture is dropped");
    assert!(
        b_runs.lock().unwrap().is_empty(),
        "T blocked before running B"
    );
    // C, due 30 ms from now, on the blocked shard.
    let c_at = clock.now() + ms(30);
    let c_runs = Arc::new(Mutex::new(Vec::new()));
    let (c_runs_in, c_clock) = (Arc::clone(&c_runs), clock.clone());
    engine
        .schedule_at(c_at, move || c_runs_in.lock().unwrap().push(c_clock.now()))
        .unwrap();
    // D: cancelled while T blocks; a stand-in's look frees it.
    let d_drops = Drops::default();
    let d_capture = counted(&d_drops);
    let d = engine
        .schedule(ms(1000), move || {
            let _ = &d_capture;
        })
        .unwrap();
    assert!(engine.cancel(d));
    clock.advance(ms(10));
    assert_eq!(engine.turn(), 1, "this turn stands in and runs B");
    assert_eq!(
        b_runs.lock().unwrap().clone(),
        vec![std::thread::current().name().map(str::to_owned)],
        "B ran once, here"
    );
    while clock.now() + ms(1) < c_at {
        clock.advance(ms(1));
        engine.turn();
        assert!(
            c_runs.lock().unwrap().is_empty(),
            "C ran before its deadline"
        );
    }
    for _ in 0..200 {
        clock.advance(ms(1));
        engine.turn();
    }
    let c = c_runs.lock().unwrap().clone();
    assert_eq!(c.len(), 1, "C ran once while T blocked");
    assert!(c[0] >= c_at, "C early");
    assert_eq!(d_drops.count(), 1, "D's capture was dropped by a stand-in");
    assert_eq!(a_drops.count(), 1);
    gate.open();
    let t_fired = within(LIMIT, "T's turn", move || turning.join().unwrap());
    assert_eq!(t_fired, 0, "T ran nothing the stand-in ran");
    assert_eq!(b_runs.lock().unwrap().len(), 1, "B still ran once");
    assert_eq!(a_drops.count(), 1, "A's capture dropped once");
    clock.advance(ms(100));
    engine.turn();
    assert_eq!(engine.nodes_in_use(), 0, "every node went back");
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
}

static PANIC_VTABLE: RawWakerVTable = RawWakerVTable::new(
    |_| RawWaker::new(std::ptr::dangling::<()>(), &PANIC_VTABLE),
    |_| {},
    |_| {},
    |data| {
        if !data.is_null() {
            panic!("hostile_unfreed: a waker clone's drop panics (expected)");
        }
    },
);

/// Attack 3: Hand-driven: cancelled timers (one-shot inline and boxed, repeating) whose captures
/// panic in `Drop`, and a `Sleep` whose waker clone panics when dropped, are freed by a
/// turn: each panic is caught and counted in `panicked`, each capture dropped once, the
/// turn goes on and later timers still fire, and every node goes back.
#[test]
fn captures_and_wakers_that_panic_in_drop_are_counted_and_contained() {
    let _serial = serial();
    support::quiet_panics_marked("(expected)");
    let (engine, clock) = manual_one();
    let drops = Drops::default();
    let mut handles = Vec::new();
    for _ in 0..3 {
        let capture = PanicsOnDrop(drops.clone());
        handles.push(
            engine
                .schedule(ms(1000), move || {
                    let _ = &capture;
                })
                .unwrap(),
        );
        let (capture, big) = (PanicsOnDrop(drops.clone()), [7_u64; 8]);
        handles.push(
            engine
                .schedule(ms(1000), move || {
                    let _ = (&capture, big);
                })
                .unwrap(),
        );
        let capture = PanicsOnDrop(drops.clone());
        handles.push(
            engine
                .schedule_repeating(ms(10), move || {
                    let _ = &capture;
                })
                .unwrap(),
        );
    }
    // The waker this thread holds is null (its drop is quiet); its clones panic.
    // SAFETY: the vtable's functions do nothing unsound for any data pointer.
    let waker = unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &PANIC_VTABLE)) };
    {
        let mut sleep = engine.sleep(ms(1000));
        assert!(poll(&mut sleep, &waker).is_pending());
    }
    let fired = Arc::new(AtomicUsize::new(0));
    let fired_in = Arc::clone(&fired);
    engine
        .schedule(ms(150), move || {
            fired_in.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    for &h in &handles {
        assert!(engine.cancel(h));
    }
    clock.advance(ms(100));
    assert_eq!(engine.turn(), 0);
    assert_eq!(drops.count(), 9, "each capture dropped once");
    assert_eq!(
        engine.stats().total.panicked,
        10,
        "nine captures' panics and one waker's"
    );
    clock.advance(ms(60));
    assert_eq!(engine.turn(), 1, "a later timer still fires");
    assert_eq!(fired.load(Ordering::SeqCst), 1);
    assert_eq!(engine.nodes_in_use(), 0);
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
    assert_eq!(drops.count(), 9);
}

/// Attack 4: Real clock, 2 workers: on each shard, cancelled timers whose captures panic in
/// `Drop`. Each panic is counted, and each shard's worker goes on: a timer armed after
/// fires, not early.
#[test]
fn workers_go_on_after_captures_panic_in_drop() {
    let _serial = serial();
    support::quiet_panics_marked("(expected)");
    let engine = engine(2, Some(8));
    let agents = agents(&engine);
    let drops = Drops::default();
    for agent in &agents {
        let (engine, drops) = (Arc::clone(&engine), drops.clone());
        on_agent(agent, move || {
            for _ in 0..10 {
                let capture = PanicsOnDrop(drops.clone());
                let h = engine
                    .schedule(ms(5000), move || {
                        let _ = &capture;
                    })
                    .unwrap();
                assert!(engine.cancel(h));
            }
        });
    }
    assert!(
        eventually(LIMIT, || engine.stats().total.panicked == 20),
        "20 panics counted, saw {}",
        engine.stats().total.panicked
    );
    assert_eq!(drops.count(), 20, "each capture dropped once");
    let (tx, rx) = mpsc::channel();
    for agent in &agents {
        let (engine, tx) = (Arc::clone(&engine), tx.clone());
        on_agent(agent, move || {
            let at = Instant::now() + ms(20);
            engine
                .schedule_at(at, move || {
                    let _ = tx.send(Instant::now() >= at);
                })
                .unwrap();
        });
    }
    for shard in 0..agents.len() {
        let on_time = rx.recv_timeout(LIMIT).expect("a later timer fired");
        assert!(on_time, "shard {shard}: fired early");
    }
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
    assert!(eventually(ms(5000), || engine.nodes_in_use() == 0));
}

/// A capture whose `Drop` shuts its engine down (from the worker that frees it).
struct ShutsDown {
    engine: Option<Arc<TimerEngine>>,
    done: mpsc::Sender<Option<usize>>,
}

impl Drop for ShutsDown {
    fn drop(&mut self) {
        if let Some(engine) = &self.engine {
            engine.shutdown(PendingTimers::Run);
        }
        let _ = self.done.send(worker_index());
    }
}

/// Attack 5: Real clock, 2 workers: a cancelled timer's capture calls `shutdown(Run)` from its
/// `Drop`, on the worker freeing it, with other timers pending on both shards. It must
/// return (not wait for its own worker), and a later `shutdown` here must report every
/// pending timer run once, with every node back.
#[test]
fn a_captures_drop_that_shuts_the_engine_down() {
    let _serial = serial();
    let engine = engine(2, Some(8));
    let agents = agents(&engine);
    let runs = Arc::new(AtomicUsize::new(0));
    for agent in &agents {
        let (engine, runs) = (Arc::clone(&engine), Arc::clone(&runs));
        on_agent(agent, move || {
            for _ in 0..5 {
                let runs = Arc::clone(&runs);
                engine
                    .schedule(Duration::from_secs(3600), move || {
                        runs.fetch_add(1, Ordering::SeqCst);
                    })
                    .unwrap();
            }
        });
    }
    let (done_tx, done) = mpsc::channel();
    let capture = ShutsDown {
        engine: Some(Arc::clone(&engine)),
        done: done_tx,
    };
    let engine_a = Arc::clone(&engine);
    on_agent(&agents[1], move || {
        let h = engine_a
            .schedule(ms(1000), move || {
                let _ = &capture;
            })
            .unwrap();
        assert!(engine_a.cancel(h));
    });
    let by = done
        .recv_timeout(LIMIT)
        .expect("the Drop's shutdown returned");
    assert!(by.is_some(), "dropped on a worker");
    let engine_w = Arc::clone(&engine);
    let report = within(LIMIT, "shutdown after the Drop's", move || {
        engine_w.shutdown(PendingTimers::Run)
    });
    assert_eq!(report.ran, 10, "every pending timer ran: {report:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 10, "each once");
    assert!(
        eventually(ms(5000), || engine.nodes_in_use() == 0),
        "nodes in use: {}",
        engine.nodes_in_use()
    );
}

/// Attack 6: Real clock, 2 workers: a batch of cancelled timers whose captures have a `Drop`,
/// one of which holds the last `Arc<TimerEngine>`, so that a worker freeing the batch
/// drops the engine midway through it. Every capture (the rest of the batch, and the
/// timers still pending, dropped by the shutdown the drop makes) must be dropped, once.
#[test]
fn a_capture_holding_the_last_engine_dropped_midway_through_a_batch() {
    let _serial = serial();
    let engine = engine(2, Some(8));
    let live = Live::default();
    let (done_tx, done) = mpsc::channel();
    let mut handles = Vec::new();
    for _ in 0..40 {
        let witness = live.witness();
        handles.push(
            engine
                .schedule(Duration::from_secs(3600), move || {
                    let _ = &witness;
                })
                .unwrap(),
        );
    }
    let capture = ShutsDown {
        engine: None,
        done: done_tx,
    };
    let holder = (Arc::clone(&engine), capture);
    handles.insert(
        20,
        engine
            .schedule(Duration::from_secs(3600), move || {
                let _ = &holder;
            })
            .unwrap(),
    );
    for _ in 0..20 {
        let witness = live.witness();
        engine
            .schedule(Duration::from_secs(3600), move || {
                let _ = &witness;
            })
            .unwrap();
    }
    for &h in &handles {
        assert!(engine.cancel(h));
    }
    // The last reference but the capture's: the worker that frees it drops the engine.
    drop(engine);
    let by = done.recv_timeout(LIMIT).expect("the holder was dropped");
    assert!(
        eventually(LIMIT, || live.count() == 0),
        "captures left alive: {} (holder dropped on worker {by:?})",
        live.count()
    );
    println!("the last engine was dropped on worker {by:?}");
}

/// A capture with an id: counts its drops and its runs in shared tables.
struct Tracked {
    id: usize,
    drops: Arc<Vec<AtomicU8>>,
    slow: bool,
    /// Re-enters the engine from the `Drop`: schedules a timer with a counted capture and
    /// cancels it, or leaves it to fire or to the shutdown.
    reenter: Option<(std::sync::Weak<TimerEngine>, Live)>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if self.slow {
            std::thread::sleep(Duration::from_micros(300));
        }
        if let Some((engine, live)) = &self.reenter
            && let Some(engine) = engine.upgrade()
        {
            let witness = live.witness();
            if let Ok(h) = engine.schedule(ms(self.id as u64 % 7), move || {
                let _ = &witness;
            }) && self.id % 2 == 0
            {
                let _ = engine.cancel(h);
            }
        }
        self.drops[self.id].fetch_add(1, Ordering::SeqCst);
    }
}

/// Attack 7: Real clock, 2 workers, rounds: four threads schedule one-shot and repeating timers
/// whose captures have a `Drop` (some slow), cancel most of them (at once, later, after a
/// reset), while a fifth shuts the engine down midway (`Run` or `Drop`) and the last
/// reference is dropped. Every capture, including those of schedules refused after the
/// shutdown, is dropped exactly once; a one-shot whose cancel returned true never runs and
/// none runs twice; every node is back after the shutdown; nothing hangs.
#[test]
fn many_threads_cancel_drop_bearing_timers_racing_shutdown() {
    let _serial = serial();
    let rounds: usize = std::env::var("UNFREED_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    for (round, pending) in [PendingTimers::Drop, PendingTimers::Run]
        .into_iter()
        .cycle()
        .take(rounds)
        .enumerate()
    {
        const PER: usize = 400;
        const THREADS: usize = 4;
        let drops: Arc<Vec<AtomicU8>> =
            Arc::new((0..PER * THREADS).map(|_| AtomicU8::new(0)).collect());
        let runs: Arc<Vec<AtomicU8>> =
            Arc::new((0..PER * THREADS).map(|_| AtomicU8::new(0)).collect());
        let cancelled_true: Arc<Vec<AtomicBool>> =
            Arc::new((0..PER * THREADS).map(|_| AtomicBool::new(false)).collect());
        let repeating: Arc<Vec<AtomicBool>> =
            Arc::new((0..PER * THREADS).map(|_| AtomicBool::new(false)).collect());
        let extra = Live::default();
        let extra_r = extra.clone();
        let engine_r = engine(2, Some(8));
        let result = within(Duration::from_secs(40), "a round", move || {
            let extra = extra_r;
            let engine = engine_r;
            std::thread::scope(|scope| {
                for thread in 0..THREADS {
                    let (engine, extra) = (Arc::clone(&engine), extra.clone());
                    let (drops, runs, cancelled_true, repeating) = (
                        Arc::clone(&drops),
                        Arc::clone(&runs),
                        Arc::clone(&cancelled_true),
                        Arc::clone(&repeating),
                    );
                    scope.spawn(move || {
                        let mut rng = Rng(0x5eed + (round * 16 + thread) as u64);
                        let mut held: Vec<(usize, TimerHandle)> = Vec::new();
                        for i in 0..PER {
                            let id = thread * PER + i;
                            let capture = Tracked {
                                id,
                                drops: Arc::clone(&drops),
                                slow: rng.percent(3),
                                reenter: rng
                                    .percent(20)
                                    .then(|| (Arc::downgrade(&engine), extra.clone())),
                            };
                            let runs_in = Arc::clone(&runs);
                            let scheduled = if rng.percent(30) {
                                repeating[id].store(true, Ordering::SeqCst);
                                engine.schedule_repeating(ms(rng.range(1, 6)), move || {
                                    let _ = &capture;
                                    runs_in[id].fetch_add(1, Ordering::SeqCst);
                                })
                            } else {
                                engine.schedule(ms(rng.range(0, 30)), move || {
                                    let _ = &capture;
                                    runs_in[id].fetch_add(1, Ordering::SeqCst);
                                })
                            };
                            let Ok(handle) = scheduled else { continue };
                            match rng.below(4) {
                                0 => {
                                    if engine.cancel(handle) {
                                        cancelled_true[id].store(true, Ordering::SeqCst);
                                    }
                                }
                                1 => {
                                    let _ = engine.reset(handle, ms(rng.range(1, 20)));
                                    held.push((id, handle));
                                }
                                _ => held.push((id, handle)),
                            }
                            if rng.percent(10) {
                                std::thread::sleep(Duration::from_micros(rng.range(50, 800)));
                            }
                            if rng.percent(30)
                                && let Some(at) = (!held.is_empty())
                                    .then(|| rng.below(held.len() as u64) as usize)
                            {
                                let (id, handle) = held.swap_remove(at);
                                if engine.cancel(handle) {
                                    cancelled_true[id].store(true, Ordering::SeqCst);
                                }
                            }
                        }
                        // The rest: repeating ones cancelled, one-shots left to fire or
                        // to the shutdown.
                        for (id, handle) in held {
                            if (repeating[id].load(Ordering::SeqCst) || id % 2 == 0)
                                && engine.cancel(handle)
                            {
                                cancelled_true[id].store(true, Ordering::SeqCst);
                            }
                        }
                    });
                }
                let engine_s = Arc::clone(&engine);
                scope.spawn(move || {
                    std::thread::sleep(ms(10 + 25 * (round % 4) as u64));
                    engine_s.shutdown(pending);
                });
            });
            let report = engine.shutdown(pending);
            let in_use = if eventually(ms(5000), || engine.nodes_in_use() == 0) {
                0
            } else {
                engine.nodes_in_use()
            };
            drop(engine);
            let mut faults = Vec::new();
            for id in 0..PER * THREADS {
                let d = drops[id].load(Ordering::SeqCst);
                let r = runs[id].load(Ordering::SeqCst);
                let rep = repeating[id].load(Ordering::SeqCst);
                if d != 1 {
                    faults.push(format!("timer {id}: capture dropped {d} times"));
                }
                if cancelled_true[id].load(Ordering::SeqCst) && !rep && r != 0 {
                    faults.push(format!("timer {id}: cancelled (true) but ran {r} times"));
                }
                if !rep && r > 1 {
                    faults.push(format!("timer {id}: one-shot ran {r} times"));
                }
            }
            if !eventually(ms(5000), || extra.count() == 0) {
                faults.push(format!(
                    "{} captures of timers scheduled from Drops left alive",
                    extra.count()
                ));
            }
            (report, in_use, faults)
        });
        let (report, in_use, faults) = result;
        assert!(
            faults.is_empty(),
            "round {round}: {} faults, first: {:?}",
            faults.len(),
            &faults[..faults.len().min(5)]
        );
        assert_eq!(
            in_use, 0,
            "round {round}: nodes in use after shutdown ({report:?})"
        );
    }
}

/// Attack 8: Real clock, 3 workers (rescue after 8 ticks). Owner of shard S is stuck in a
/// blocking callback; a timer X on S, whose capture's `Drop` blocks, is cancelled, so the
/// stand-in's look frees it and its worker H blocks in the `Drop` (helping, its own shard
/// marked running). Then a timer due 50 ms on each shard must fire while both block
/// (rescued by the one worker left), not early, once.
#[test]
fn a_stand_in_blocked_in_a_captures_drop_is_stood_in_for() {
    let _serial = serial();
    let engine = engine(3, Some(8));
    let agents = agents(&engine);
    let owner_gate = Gate::default();
    let drop_gate = Gate::default();
    let _open = (
        OpenOnDrop(owner_gate.clone()),
        OpenOnDrop(drop_gate.clone()),
    );
    let stuck = 1;
    let owner = block_owner(&engine, &agents[stuck], &owner_gate);
    let (capture, dropping, x_drops) = BlocksOnDrop::new(&drop_gate);
    arm_and_cancel(&engine, &agents[stuck], capture);
    let helper = dropping
        .recv_timeout(LIMIT)
        .expect("X's capture was dropped");
    assert!(helper.is_some(), "X dropped on a worker");
    assert_ne!(
        helper, owner,
        "X dropped by a stand-in, not the stuck owner"
    );
    let (fired_tx, fired) = mpsc::channel();
    for (shard, agent) in agents.iter().enumerate() {
        let (engine, fired_tx) = (Arc::clone(&engine), fired_tx.clone());
        on_agent(agent, move || {
            let at = Instant::now() + ms(50);
            engine
                .schedule_at(at, move || {
                    let _ = fired_tx.send((shard, Instant::now() >= at, worker_index()));
                })
                .unwrap();
        });
    }
    let mut seen = Vec::new();
    for _ in 0..agents.len() {
        match fired.recv_timeout(LIMIT) {
            Ok(one) => seen.push(one),
            Err(_) => panic!(
                "owner {owner:?} stuck, stand-in {helper:?} blocked in a Drop: only {seen:?} fired"
            ),
        }
    }
    assert!(
        seen.iter().all(|&(_, on_time, _)| on_time),
        "early: {seen:?}"
    );
    owner_gate.open();
    drop_gate.open();
    assert!(fired.recv_timeout(ms(300)).is_err(), "a timer fired twice");
    assert_eq!(x_drops.count(), 1);
    let engine_w = Arc::clone(&engine);
    let report = within(LIMIT, "shutdown", move || {
        engine_w.shutdown(PendingTimers::Drop)
    });
    assert_eq!(report.dropped, 0);
    assert!(eventually(ms(5000), || engine.nodes_in_use() == 0));
}

/// A waker whose last reference's drop schedules a timer on its engine.
struct Rearms {
    engine: Arc<TimerEngine>,
    fired: Arc<AtomicUsize>,
    scheduled: Arc<AtomicUsize>,
}

impl std::task::Wake for Rearms {
    fn wake(self: Arc<Self>) {}
}

impl Drop for Rearms {
    fn drop(&mut self) {
        let fired = Arc::clone(&self.fired);
        if self
            .engine
            .schedule(ms(5), move || {
                fired.fetch_add(1, Ordering::SeqCst);
            })
            .is_ok()
        {
            self.scheduled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Attack 9: Hand-driven: `Sleep`s polled and dropped before their deadline. Each waker clone in
/// a node is dropped exactly once by the turn that frees it (none leaked, none twice), and
/// a waker whose last drop schedules on the engine does so from the turn, its timer firing
/// later; every node goes back.
#[test]
fn dropped_sleeps_wakers_are_dropped_once_even_when_their_drop_reenters() {
    let _serial = serial();
    let (engine, clock) = manual_one();
    let (wakes, waker) = Wakes::waker();
    for _ in 0..50 {
        let mut sleep = engine.sleep(ms(1000));
        assert!(poll(&mut sleep, &waker).is_pending());
    }
    let (fired, scheduled) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    {
        let rearm = Waker::from(Arc::new(Rearms {
            engine: Arc::clone(&engine),
            fired: Arc::clone(&fired),
            scheduled: Arc::clone(&scheduled),
        }));
        let mut sleep = engine.sleep(ms(1000));
        assert!(poll(&mut sleep, &rearm).is_pending());
        drop(rearm);
        // The node holds the last reference now; dropping the Sleep cancels it.
    }
    assert!(Arc::strong_count(&wakes) > 2, "the nodes hold clones");
    clock.advance(ms(100));
    assert_eq!(engine.turn(), 0);
    assert_eq!(Arc::strong_count(&wakes), 2, "every clone dropped, once");
    assert_eq!(wakes.count(), 0, "no wakes");
    assert_eq!(
        scheduled.load(Ordering::SeqCst),
        1,
        "the waker's drop scheduled"
    );
    for _ in 0..6 {
        clock.advance(ms(1));
        engine.turn();
    }
    assert_eq!(fired.load(Ordering::SeqCst), 1, "its timer fired once");
    assert_eq!(engine.nodes_in_use(), 0);
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
}

/// Attack 10: Hand-driven: repeating timers whose captures have a `Drop`: A cancelled while
/// filed between runs (freed by a look); B cancelling itself from its own second run, and
/// C from there too (claimed in the same look: cancelled on the run queue, or already run).
/// Each capture is dropped once, and none runs after its cancel returned true.
#[test]
fn repeating_timers_with_drop_captures_cancelled_every_way() {
    let _serial = serial();
    let (engine, clock) = manual_one();
    let (filed, itself, claimed) = (Drops::default(), Drops::default(), Drops::default());
    let runs: Arc<[AtomicUsize; 3]> = Arc::default();
    let a = {
        let (capture, runs) = (counted(&filed), Arc::clone(&runs));
        engine
            .schedule_repeating(ms(10), move || {
                let _ = &capture;
                runs[0].fetch_add(1, Ordering::SeqCst);
            })
            .unwrap()
    };
    let c = {
        let (capture, runs) = (counted(&claimed), Arc::clone(&runs));
        engine
            .schedule_repeating(ms(10), move || {
                let _ = &capture;
                runs[2].fetch_add(1, Ordering::SeqCst);
            })
            .unwrap()
    };
    let self_handle: Arc<Mutex<Option<TimerHandle>>> = Arc::default();
    // (B's cancel of itself, of C, C's runs then)
    let cancels: Arc<Mutex<Option<(bool, bool, usize)>>> = Arc::default();
    let b = {
        let capture = counted(&itself);
        let (engine2, me, cancels, runs) = (
            Arc::clone(&engine),
            Arc::clone(&self_handle),
            Arc::clone(&cancels),
            Arc::clone(&runs),
        );
        engine
            .schedule_repeating(ms(10), move || {
                let _ = &capture;
                if runs[1].fetch_add(1, Ordering::SeqCst) == 1
                    && let Some(me) = *me.lock().unwrap()
                {
                    let c_runs = runs[2].load(Ordering::SeqCst);
                    *cancels.lock().unwrap() =
                        Some((engine2.cancel(me), engine2.cancel(c), c_runs));
                }
            })
            .unwrap()
    };
    *self_handle.lock().unwrap() = Some(b);
    clock.advance(ms(10));
    assert_eq!(engine.turn(), 3);
    assert!(engine.cancel(a), "A cancelled while filed");
    clock.advance(ms(10));
    engine.turn();
    let (b_cancel, c_cancel, c_runs) = cancels.lock().unwrap().expect("B ran twice");
    assert!(b_cancel && c_cancel, "B's cancels of itself and C");
    for _ in 0..5 {
        clock.advance(ms(30));
        engine.turn();
    }
    let r: Vec<usize> = runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
    assert_eq!(r, vec![1, 2, c_runs], "runs after cancels");
    assert_eq!(
        (filed.count(), itself.count(), claimed.count()),
        (1, 1, 1),
        "each capture dropped once"
    );
    assert_eq!(engine.nodes_in_use(), 0);
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
}

/// Voluntary context switches of this process's threads named `corewheel-*` that are not
/// in `skip` (threads of earlier engines), in all, and how many threads that was.
fn worker_switches(skip: &[String]) -> Option<(u64, usize)> {
    let threads: Vec<u64> = support::worker_switches()
        .into_iter()
        .filter(|(tid, _)| !skip.contains(tid))
        .map(|(_, switches)| switches)
        .collect();
    (!threads.is_empty()).then(|| (threads.iter().sum(), threads.len()))
}

fn worker_tids() -> Vec<String> {
    support::worker_switches()
        .into_iter()
        .map(|(tid, _)| tid)
        .collect()
}

/// Attack 11: Cost, real clock, 2 workers (rescue after 8 ticks): cancelling 1000 timers must
/// not leave a watcher lingering, whatever their captures: the workers' voluntary context
/// switches over the next 600 ms stay few. Captures without drop glue are freed under the
/// wheel and mark nothing; captures with a `Drop` (a captured `Arc`, a dropped `Sleep`'s
/// waker) are dropped marked running, which may wake a watcher once, but records no run
/// (`Balance::dropping`). When it did (`Balance::running`), a watcher woke every 8 ticks
/// for half a second after: 31-56 wake-ups here with `Arc`s, 56 with `Sleep`s.
#[test]
fn cancelled_captures_leave_no_watcher_lingering() {
    let _serial = serial();
    let skip = worker_tids();
    let engine = engine(2, Some(8));
    let agents = agents(&engine);
    let measure = |glue: u8| -> u64 {
        for agent in &agents {
            let engine = Arc::clone(&engine);
            on_agent(agent, move || {
                if glue == 2 {
                    // Sleeps (waker timers, with a no-op waker) polled, then dropped.
                    let mut sleeps: Vec<_> = (0..500)
                        .map(|_| engine.sleep(Duration::from_secs(60)))
                        .collect();
                    for sleep in &mut sleeps {
                        assert!(poll(sleep, Waker::noop()).is_pending());
                    }
                    std::thread::sleep(ms(200));
                    drop(sleeps);
                    return;
                }
                let glue = glue == 1;
                let handles: Vec<TimerHandle> = (0..500)
                    .map(|i| {
                        if glue {
                            let capture = Arc::new(i as u64);
                            engine.schedule(Duration::from_secs(60), move || {
                                let _ = &capture;
                            })
                        } else {
                            let capture = [i as u64, 1];
                            engine.schedule(Duration::from_secs(60), move || {
                                let _ = capture;
                            })
                        }
                        .unwrap()
                    })
                    .collect();
                std::thread::sleep(ms(200));
                for h in handles {
                    assert!(engine.cancel(h));
                }
            });
        }
        // The cancels' messages are taken within ~34 ms; then count.
        std::thread::sleep(ms(100));
        let (before, threads) = worker_switches(&skip).unwrap_or((0, 0));
        std::thread::sleep(ms(600));
        let (after, _) = worker_switches(&skip).unwrap_or((0, 0));
        assert!(
            threads == 0 || threads == 2,
            "found {threads} worker threads"
        );
        after - before
    };
    let plain = measure(0);
    std::thread::sleep(ms(700));
    let glue = measure(1);
    std::thread::sleep(ms(700));
    let sleeps = measure(2);
    println!(
        "worker wake-ups in 600 ms after 1000 cancels: plain {plain}, drop glue {glue}, \
         dropped sleeps {sleeps}"
    );
    for (what, woke) in [
        ("plain", plain),
        ("drop glue", glue),
        ("dropped sleeps", sleeps),
    ] {
        assert!(
            woke <= 12,
            "cancels ({what}) woke the workers {woke} times in the 600 ms after them"
        );
    }
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
}

/// A capture whose `Drop` schedules a timer (from the thread dropping it: a worker's
/// timers go to its own shard) and waits for it to fire, as a `Drop` that sends on a
/// channel another timer drains would.
/// What a [`WaitsForATimer`] reports: the worker it was dropped on, and the worker its
/// timer fired on (or why it did not).
type Waited = (Option<usize>, Result<Option<usize>, String>);

struct WaitsForATimer {
    engine: Arc<TimerEngine>,
    result: mpsc::Sender<Waited>,
    /// Told the dropping thread's name as the `Drop` begins.
    entered: Option<mpsc::Sender<Option<String>>>,
}

impl Drop for WaitsForATimer {
    fn drop(&mut self) {
        if let Some(entered) = &self.entered {
            let _ = entered.send(std::thread::current().name().map(str::to_owned));
        }
        let (tx, rx) = mpsc::channel();
        let scheduled = self.engine.schedule(ms(20), move || {
            let _ = tx.send(worker_index());
        });
        let outcome = match scheduled {
            Err(error) => Err(format!("schedule: {error:?}")),
            Ok(_) => rx
                .recv_timeout(LIMIT)
                .map_err(|_| "the timer never fired".to_owned()),
        };
        let _ = self.result.send((worker_index(), outcome));
    }
}

/// Attack 12: Real clock, 2 workers (rescue after 8 ticks): a cancelled timer's capture whose
/// `Drop`, on the worker freeing it, waits for a timer it schedules on that worker's own
/// shard. A stand-in must run that timer (the owner is in the `Drop`), so the `Drop`
/// returns; before `Unfreed` the owner held the wheel and this waited out the limit.
#[test]
fn a_drop_waiting_for_a_timer_on_its_own_shard_is_rescued() {
    let _serial = serial();
    let engine = engine(2, Some(8));
    let agents = agents(&engine);
    for (shard, agent) in agents.iter().enumerate() {
        let (result_tx, result) = mpsc::channel();
        let capture = WaitsForATimer {
            engine: Arc::clone(&engine),
            result: result_tx,
            entered: None,
        };
        let engine_a = Arc::clone(&engine);
        on_agent(agent, move || {
            let h = engine_a
                .schedule(Duration::from_secs(3600), move || {
                    let _ = &capture;
                })
                .unwrap();
            assert!(engine_a.cancel(h));
        });
        let (dropper, outcome) = result
            .recv_timeout(LIMIT + LIMIT)
            .expect("the capture's Drop returned");
        let fired_on = outcome.unwrap_or_else(|why| {
            panic!("shard {shard}: dropped on {dropper:?}, its timer: {why}")
        });
        assert!(dropper.is_some(), "shard {shard}: dropped on a worker");
        assert_ne!(fired_on, dropper, "shard {shard}: a stand-in ran the timer");
    }
    let engine_w = Arc::clone(&engine);
    let report = within(LIMIT, "shutdown", move || {
        engine_w.shutdown(PendingTimers::Drop)
    });
    assert_eq!(report.dropped, 0);
    assert!(eventually(ms(5000), || engine.nodes_in_use() == 0));
}

/// Attack 13: Hand-driven, one shard: thread T's turn frees a cancelled timer whose capture's
/// `Drop` schedules a timer 20 ms on and waits for it. This thread's turns, the clock
/// advanced, stand in and run it (at or after its deadline), so T's `Drop` and turn
/// return; every node goes back.
#[test]
fn a_turns_drop_waiting_for_a_timer_is_rescued_by_another_turn() {
    let _serial = serial();
    let (engine, clock) = manual_one();
    let (result_tx, result) = mpsc::channel();
    let (entered_tx, entered) = mpsc::channel();
    let capture = WaitsForATimer {
        engine: Arc::clone(&engine),
        result: result_tx,
        entered: Some(entered_tx),
    };
    let h = engine
        .schedule(ms(1000), move || {
            let _ = &capture;
        })
        .unwrap();
    assert!(engine.cancel(h));
    clock.advance(ms(100));
    let turning = {
        let engine = Arc::clone(&engine);
        std::thread::Builder::new()
            .name("turner-T".into())
            .spawn(move || engine.turn())
            .unwrap()
    };
    let dropper = entered
        .recv_timeout(LIMIT)
        .expect("T's turn drops the capture");
    assert_eq!(dropper.as_deref(), Some("turner-T"));
    let start = Instant::now();
    let mut outcome = None;
    while outcome.is_none() && start.elapsed() < LIMIT {
        clock.advance(ms(1));
        engine.turn();
        outcome = result.recv_timeout(ms(5)).ok();
    }
    let (_, outcome) = outcome.expect("the Drop returned");
    assert!(
        outcome.is_ok(),
        "its timer: {outcome:?}; stats {:?}, nodes in use {}",
        engine.stats().total,
        engine.nodes_in_use()
    );
    let fired = within(LIMIT, "T's turn", move || turning.join().unwrap());
    assert_eq!(fired, 0, "T ran nothing: the stand-in ran the timer");
    clock.advance(ms(100));
    engine.turn();
    assert_eq!(engine.nodes_in_use(), 0);
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
}

/// Attack 14: Real clock, 2 workers (rescue after 8 ticks). Shard 1's owner is stuck in a
/// blocking callback; a timer X on shard 1, whose capture's `Drop` blocks, is cancelled,
/// so worker 0, standing in, frees it and blocks in the `Drop` (shard 0 marked running).
/// Then shard 1's owner is let go. While worker 0 still blocks: X's handle reads dead
/// (not pending, cancel and reset refused) and no new timer gets its node; timers due on
/// both shards fire (shard 1's by its owner, which must find its wheel free, shard 0's by
/// worker 1 standing in), each once and never early; and the process does not spin (an
/// owner waiting for a wheel held by a blocked stand-in would burn a core).
#[test]
fn an_owner_back_from_its_callback_finds_its_wheel_free_while_a_stand_in_drops() {
    let _serial = serial();
    let engine = engine(2, Some(8));
    let agents = agents(&engine);
    let owner_gate = Gate::default();
    let drop_gate = Gate::default();
    let _open = (
        OpenOnDrop(owner_gate.clone()),
        OpenOnDrop(drop_gate.clone()),
    );
    let owner = block_owner(&engine, &agents[1], &owner_gate);
    assert_eq!(owner, Some(1), "shard 1's owner runs its callback");
    let (capture, dropping, x_drops) = BlocksOnDrop::new(&drop_gate);
    let x = arm_and_cancel(&engine, &agents[1], capture);
    let helper = dropping
        .recv_timeout(LIMIT)
        .expect("X's capture was dropped");
    assert_eq!(helper, Some(0), "worker 0 stood in and dropped X");
    owner_gate.open();
    // X's handle, while its node waits on worker 0's Unfreed chain.
    assert!(!engine.is_pending(x) && !engine.cancel(x) && !engine.reset(x, ms(5)));
    let (fired_tx, fired) = mpsc::channel();
    let mut news = Vec::new();
    for (shard, agent) in agents.iter().enumerate() {
        let (engine, fired_tx) = (Arc::clone(&engine), fired_tx.clone());
        news.extend(on_agent(agent, move || {
            let at = Instant::now() + ms(50);
            (0..50)
                .map(|i| {
                    let fired_tx = fired_tx.clone();
                    engine
                        .schedule_at(at, move || {
                            let _ = fired_tx.send((shard, i, Instant::now() >= at));
                        })
                        .unwrap()
                })
                .collect::<Vec<_>>()
        }));
    }
    assert!(news.iter().all(|&h| h != x), "a new timer got X's node");
    let window = support::CpuWindow::start();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..100 {
        match fired.recv_timeout(LIMIT) {
            Ok((shard, i, on_time)) => {
                assert!(on_time, "shard {shard} timer {i} early");
                assert!(seen.insert((shard, i)), "shard {shard} timer {i} twice");
            }
            Err(_) => panic!(
                "worker 0 blocked in a stand-in's Drop: only {} of 100 fired: {:?}",
                seen.len(),
                (0..2)
                    .map(|s| seen.iter().filter(|(shard, _)| *shard == s).count())
                    .collect::<Vec<_>>()
            ),
        }
    }
    std::thread::sleep(ms(1000));
    let cores = window.cores();
    assert!(!engine.is_pending(x) && !engine.cancel(x));
    drop_gate.open();
    assert!(
        cores.is_none_or(|cores| cores < 0.6),
        "the process spun while a stand-in blocked in a Drop: {cores:?} cores"
    );
    assert!(fired.recv_timeout(ms(300)).is_err(), "a timer fired twice");
    assert!(eventually(LIMIT, || x_drops.count() == 1));
    let engine_w = Arc::clone(&engine);
    let report = within(LIMIT, "shutdown", move || {
        engine_w.shutdown(PendingTimers::Drop)
    });
    assert_eq!(report.dropped, 0);
    assert!(eventually(ms(5000), || engine.nodes_in_use() == 0));
    assert_eq!(x_drops.count(), 1);
}
