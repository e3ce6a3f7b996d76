//! The rescue watch: an owner that begins running callbacks does not wake a parked worker
//! to watch it when another worker is awake (and not running) or plans to wake within
//! `rescue_after` ticks (`Balance::running`, `another_looks_by`), and a lane message's lazy
//! need follows the worker's planned wake-up down to the next tick (`LANE_HORIZON`).
//!
//! The cases: a callback blocked on one shard while timers on that shard (and on the
//! others) come due, with the other workers idle, waking soon for their own timers, busy in
//! slow callbacks, stuck themselves, or stuck in a callback they run *for* another shard (a
//! stand-in: such a worker is awake and its own shard is not marked running, so
//! `another_looks_by` counts on it to watch); a watch that outlives the stuck episode that
//! started it; timers armed on a shard while its owner is stuck; exactly-once, never-early
//! and nothing-lost under threads arming, cancelling and resetting while callbacks block;
//! cancels and resets sent from threads to idle and awake workers; and an idle engine's
//! CPU cost after a rescue.
//!
//! Real-clock tests assert only what holds on a loaded 2-core machine: a timer due after a
//! callback blocked fires while it is still blocked, within a generous limit ([`LIMIT`]);
//! a blocked callback is released either way, so a failing test fails rather than hangs.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use crate::support;

use crate::support::stuck::{
    Gate, Job, agents, block_owner_and_stand_in, blocking, engine, home_of, on_agent, started,
    worker_index,
};
use crate::support::{
    Live, Rng, assert_all_given_back, cores_until_below, eventually, idle_cores, manual, ms,
    run_for, serial, within,
};
use corewheel::{Clock, PendingTimers, TimerEngine};

/// How long a timer that must be rescued may take before the test calls it held up.
const LIMIT: Duration = Duration::from_secs(20);

/// Set once, from any thread.
#[derive(Clone, Default)]
struct Flag(Arc<AtomicBool>);

impl Flag {
    fn set(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// A callback that sets the flag, and counts an early run if it runs before `due`.
    fn callback(&self, due: Instant, early: &Arc<AtomicUsize>) -> impl FnOnce() + Send + 'static {
        let (flag, early) = (self.clone(), Arc::clone(early));
        move || {
            if Instant::now() < due {
                early.fetch_add(1, Ordering::SeqCst);
            }
            flag.set();
        }
    }
}

/// A timer armed on a shard while its owner is stuck (here by the stuck callback itself,
/// just before it blocks, so it sits on the owner's own lane with a lazy need, and the
/// stuck shard's published next deadline does not know of it) must be rescued too.
///
/// Fails when the timer has not fired [`LIMIT`] after it was due while the callback is
/// still blocked (it fires once released).
#[test]
fn a_timer_armed_on_a_stuck_shard_while_it_is_stuck_is_rescued() {
    let _serial = serial();
    let mut held_up = Vec::new();
    for (workers, rescue) in [(2, Some(2)), (3, Some(8))] {
        let engine = engine(workers, rescue);
        let (gate, fired, early) = (Gate::default(), Flag::default(), Arc::default());
        let (started_tx, started_rx) = mpsc::channel();
        let later = {
            let (engine, gate, fired, early) = (
                Arc::clone(&engine),
                gate.clone(),
                fired.clone(),
                Arc::clone(&early),
            );
            move || {
                let due = Instant::now() + ms(300);
                engine
                    .schedule_at(due, fired.callback(due, &early))
                    .unwrap();
                let _ = started_tx.send(worker_index());
                gate.wait();
            }
        };
        engine.schedule(ms(20), later).unwrap();
        started(&started_rx, "the blocking callback");
        let blocked_at = Instant::now();
        let rescued = eventually(LIMIT, || fired.is_set());
        eprintln!(
            "{workers} workers: fired {:?} after the callback blocked, rescued {:?}",
            blocked_at.elapsed(),
            engine
                .stats()
                .shards
                .iter()
                .map(|s| s.rescued)
                .collect::<Vec<_>>()
        );
        gate.open();
        assert!(eventually(LIMIT, || fired.is_set()), "never fired at all");
        assert_eq!(early.load(Ordering::SeqCst), 0, "fired early");
        assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
        if !rescued {
            held_up.push((workers, rescue));
        }
    }
    assert!(
        held_up.is_empty(),
        "a timer armed on a stuck shard waited for its callback (workers, rescue_after): \
         {held_up:?}"
    );
}

/// Three workers. Shard A's owner blocks; the worker W that stands in for it runs A's next
/// timer, which blocks too. W's own shard is not marked running (only an owner's own runs
/// mark it), so nobody ever counts it stuck: its own timers must still fire, as must A's
/// later timer (the third worker is idle and could run both).
///
/// Fails naming whichever of those has not fired [`LIMIT`] after it was due.
/// Shard A's owner blocked in a callback, and the worker W that stood in for it blocked in
/// A's next one.
struct StandInStuck {
    engine: Arc<TimerEngine>,
    agents: Vec<mpsc::Sender<Job>>,
    a: usize,
    w: usize,
    gate: Gate,
    early: Arc<AtomicUsize>,
    started_tx: mpsc::Sender<Option<usize>>,
    started_rx: mpsc::Receiver<Option<usize>>,
}

/// An engine of `workers` workers (`rescue_after` 2) in which shard A's owner blocks in a
/// callback due 100 ms from now, and its stand-in W in A's next one, due 30 ms later;
/// returns once both have begun.
fn stand_in_stuck(workers: usize) -> StandInStuck {
    let engine = engine(workers, Some(2));
    let agents = agents(&engine);
    let a = home_of(&engine);
    let (gate, early) = (Gate::default(), Arc::new(AtomicUsize::new(0)));
    let (started_tx, started_rx) = mpsc::channel();
    let (owner, w) = block_owner_and_stand_in(&engine, (&gate, &gate), (&started_tx, &started_rx));
    assert_eq!(owner, Some(a));
    let w = w.expect("run by a worker");
    StandInStuck {
        engine,
        agents,
        a,
        w,
        gate,
        early,
        started_tx,
        started_rx,
    }
}

#[test]
fn a_worker_stuck_standing_in_leaves_nothing_unwatched() {
    let _serial = serial();
    let StandInStuck {
        engine,
        agents,
        a,
        w,
        gate,
        early,
        ..
    } = stand_in_stuck(3);
    let late_due = Instant::now() + ms(20);
    let owners_later = Flag::default();
    engine
        .schedule_at(late_due, owners_later.callback(late_due, &early))
        .unwrap();
    let per_shard: Vec<Flag> = (0..3).map(|_| Flag::default()).collect();
    for (shard, agent) in agents.iter().enumerate() {
        let (engine, flag, early) = (
            Arc::clone(&engine),
            per_shard[shard].clone(),
            Arc::clone(&early),
        );
        on_agent(agent, move || {
            engine
                .schedule_at(late_due, flag.callback(late_due, &early))
                .unwrap();
        });
    }
    let all = eventually(LIMIT, || {
        owners_later.is_set() && per_shard.iter().all(Flag::is_set)
    });
    let missing: Vec<String> = std::iter::once(("A's later timer".to_owned(), &owners_later))
        .chain(
            per_shard
                .iter()
                .enumerate()
                .map(|(shard, flag)| (format!("shard {shard}'s timer"), flag)),
        )
        .filter(|(_, flag)| !flag.is_set())
        .map(|(name, _)| name)
        .collect();
    gate.open();
    assert!(eventually(LIMIT, || owners_later.is_set()
        && per_shard.iter().all(Flag::is_set)));
    assert_eq!(early.load(Ordering::SeqCst), 0, "fired early");
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
    assert!(
        all,
        "held up while A (shard {a}) and its stand-in (worker {w}) were blocked: {missing:?}"
    );
}

/// Four workers. Shard A's owner blocks; its stand-in W blocks in A's next timer. Then a
/// third shard C's owner begins a callback that blocks: W is awake and its shard not
/// running, so C's owner counts on W to watch and wakes nobody, though the fourth worker
/// sleeps with nothing to do. C's later timer must still fire.
///
/// Fails when C's later timer has not fired [`LIMIT`] after it was due.
#[test]
fn an_owner_counting_on_a_stuck_stand_in_to_watch_is_still_rescued() {
    let _serial = serial();
    let StandInStuck {
        engine,
        agents,
        a,
        w,
        gate,
        early,
        started_tx,
        started_rx,
    } = stand_in_stuck(4);
    let c = (0..4).find(|&shard| shard != a && shard != w).unwrap();
    let c_later = Flag::default();
    {
        let (engine, gate, started_tx, flag, early) = (
            Arc::clone(&engine),
            gate.clone(),
            started_tx.clone(),
            c_later.clone(),
            Arc::clone(&early),
        );
        on_agent(&agents[c], move || {
            let now = Instant::now();
            engine
                .schedule_at(now + ms(20), blocking(&gate, &started_tx))
                .unwrap();
            engine
                .schedule_at(now + ms(60), flag.callback(now + ms(60), &early))
                .unwrap();
        });
    }
    assert_eq!(started(&started_rx, "C's blocking callback"), Some(c));
    let rescued = eventually(LIMIT, || c_later.is_set());
    gate.open();
    assert!(eventually(LIMIT, || c_later.is_set()), "never fired at all");
    assert_eq!(early.load(Ordering::SeqCst), 0, "fired early");
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
    assert!(
        rescued,
        "shard {c}'s timer waited for its owner's callback while A (shard {a}) and its \
         stand-in (worker {w}) were blocked and the fourth worker slept"
    );
}

/// What the workers other than the stuck owner's do meanwhile.
#[derive(Debug, Clone, Copy)]
enum Others {
    /// Nothing: they sleep with nothing planned.
    Idle,
    /// A timer every 3 ms each: they plan to wake within `rescue_after` ticks.
    WakingSoon,
    /// A timer every 4 ms each whose callback sleeps 3 ms: mostly running.
    Busy,
    /// Each blocks in a callback of its own a tick after the first owner (all but one).
    StuckToo,
}

/// Shard A's owner blocks at `t0`; its later timers (and, for [`Others::StuckToo`], the
/// other stuck owners' later timers) must fire while it is blocked.
///
/// Fails naming the timers not fired [`LIMIT`] after they were due.
fn owner_stuck_while_others(workers: usize, rescue: Option<u32>, others: Others) {
    let engine = engine(workers, rescue);
    let a = home_of(&engine);
    let agents = agents(&engine);
    let (gate, early) = (Gate::default(), Arc::new(AtomicUsize::new(0)));
    let (started_tx, started_rx) = mpsc::channel();
    let t0 = Instant::now() + ms(200);
    let mut must_fire: Vec<(String, Flag)> = Vec::new();
    let mut repeating = Vec::new();
    // When the owner's look comes late (a loaded machine), a timer of A's may be claimed in
    // the blocking callback's run, and such a timer waits for it (documented in
    // docs/design.md): those due by a tick after the block began are excused until the gate
    // opens, and must fire after it.
    let blocked_at = Arc::new(OnceLock::<Instant>::new());
    let block = blocking(&gate, &started_tx);
    let mark = Arc::clone(&blocked_at);
    engine
        .schedule_at(t0, move || {
            let _ = mark.set(Instant::now());
            block();
        })
        .unwrap();
    let mut a_dues = Vec::new();
    for k in 1..=3 {
        let (due, flag) = (t0 + ms(50 * k), Flag::default());
        engine.schedule_at(due, flag.callback(due, &early)).unwrap();
        must_fire.push((format!("A's timer at t0+{}ms", 50 * k), flag));
        a_dues.push(due);
    }
    let in_blocked_run = |index: usize| {
        let began = blocked_at.get().copied();
        a_dues
            .get(index)
            .is_some_and(|&due| began.is_some_and(|began| due <= began + ms(2)))
    };
    let mut stuck_too = 0;
    for (shard, agent) in agents.iter().enumerate().filter(|&(shard, _)| shard != a) {
        let engine = Arc::clone(&engine);
        match others {
            Others::Idle => {}
            Others::WakingSoon | Others::Busy => {
                let busy = matches!(others, Others::Busy);
                let every = if busy { ms(4) } else { ms(3) };
                repeating.push(on_agent(agent, move || {
                    engine
                        .schedule_repeating(every, move || {
                            if busy {
                                std::thread::sleep(ms(3));
                            }
                        })
                        .unwrap()
                }));
            }
            Others::StuckToo => {
                // All but one of the others: someone must be left to stand in.
                if stuck_too + 2 >= workers {
                    continue;
                }
                stuck_too += 1;
                let (gate, started_tx, early) =
                    (gate.clone(), started_tx.clone(), Arc::clone(&early));
                let flag = Flag::default();
                must_fire.push((format!("shard {shard}'s timer at t0+100ms"), flag.clone()));
                on_agent(agent, move || {
                    engine
                        .schedule_at(t0 + ms(1), blocking(&gate, &started_tx))
                        .unwrap();
                    let due = t0 + ms(100);
                    engine.schedule_at(due, flag.callback(due, &early)).unwrap();
                });
            }
        }
    }
    for _ in 0..=stuck_too {
        started(&started_rx, "a blocking callback");
    }
    let waiting =
        |(index, (_, flag)): (usize, &(String, Flag))| !flag.is_set() && !in_blocked_run(index);
    let all = eventually(LIMIT, || !must_fire.iter().enumerate().any(waiting));
    let missing: Vec<&str> = must_fire
        .iter()
        .enumerate()
        .filter(|&entry| waiting(entry))
        .map(|(_, (name, _))| name.as_str())
        .collect();
    gate.open();
    for handle in repeating {
        engine.cancel(handle);
    }
    assert!(eventually(LIMIT, || must_fire
        .iter()
        .all(|(_, flag)| flag.is_set())));
    assert_eq!(early.load(Ordering::SeqCst), 0, "fired early");
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
    assert!(
        all,
        "{workers} workers, rescue_after {rescue:?}, others {others:?}: held up while shard \
         {a}'s owner was blocked: {missing:?}"
    );
}

#[test]
fn a_stuck_owner_is_rescued_while_the_others_are_idle() {
    let _serial = serial();
    for workers in [2, 3, 4] {
        owner_stuck_while_others(workers, Some(2), Others::Idle);
    }
}

#[test]
fn a_stuck_owner_is_rescued_while_the_others_wake_soon_for_their_own_timers() {
    let _serial = serial();
    for (workers, rescue) in [(2, Some(8)), (3, Some(8)), (4, Some(4))] {
        owner_stuck_while_others(workers, rescue, Others::WakingSoon);
    }
}

#[test]
fn a_stuck_owner_is_rescued_while_the_others_run_slow_callbacks() {
    let _serial = serial();
    for (workers, rescue) in [(2, Some(8)), (3, Some(2))] {
        owner_stuck_while_others(workers, rescue, Others::Busy);
    }
}

#[test]
fn stuck_owners_are_rescued_while_others_get_stuck_right_after() {
    let _serial = serial();
    for (workers, rescue) in [(3, Some(2)), (4, Some(2)), (5, Some(8))] {
        owner_stuck_while_others(workers, rescue, Others::StuckToo);
    }
}

/// Two workers. A first stuck episode with nothing else on the shard ends; a second one
/// on the same shard, with a later timer filed before it, must be rescued like the first:
/// a watch taken for the first episode (the stuck shard had nothing due then) must not
/// keep the engine's one watch so that the second owner wakes nobody.
///
/// Fails when the second episode's later timer has not fired [`LIMIT`] after it was due.
#[test]
fn a_watch_does_not_outlive_the_stuck_owner_it_watched() {
    let _serial = serial();
    let engine = engine(2, Some(2));
    let (gate1, gate2, early) = (
        Gate::default(),
        Gate::default(),
        Arc::new(AtomicUsize::new(0)),
    );
    let (started_tx, started_rx) = mpsc::channel();
    engine
        .schedule(ms(20), blocking(&gate1, &started_tx))
        .unwrap();
    started(&started_rx, "the first blocking callback");
    // Long enough for the other worker to stand in once (nothing due) and sleep again.
    std::thread::sleep(ms(300));
    gate1.open();
    std::thread::sleep(ms(300));
    let due = Instant::now() + ms(150);
    let later = Flag::default();
    engine
        .schedule(ms(50), blocking(&gate2, &started_tx))
        .unwrap();
    engine
        .schedule_at(due, later.callback(due, &early))
        .unwrap();
    let who = started(&started_rx, "the second blocking callback");
    let blocked_at = Instant::now();
    let rescued = eventually(LIMIT, || later.is_set());
    let stats = engine.stats();
    gate2.open();
    assert!(eventually(LIMIT, || later.is_set()), "never fired at all");
    assert_eq!(early.load(Ordering::SeqCst), 0, "fired early");
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
    assert!(
        rescued,
        "the second stuck episode's later timer waited for its callback (run by worker \
         {who:?}, which blocked {:?} before the timer was due; rescued per shard {:?}, \
         pending {:?})",
        due.saturating_duration_since(blocked_at),
        stats.shards.iter().map(|s| s.rescued).collect::<Vec<_>>(),
        stats.shards.iter().map(|s| s.pending).collect::<Vec<_>>(),
    );
}

/// Per-timer record of the churn test.
struct Churn {
    /// The deadline in force, nanoseconds after `base`; held while a reset is made, so
    /// that a run reads the deadline of the arming it belongs to.
    deadline: Vec<Mutex<u64>>,
    fires: Vec<AtomicU8>,
    cancelled: Vec<AtomicBool>,
    early: AtomicUsize,
    base: Instant,
}

/// Threads arm, cancel and reset timers while some callbacks block for up to 150 ms, with
/// a small and the default `rescue_after`: no timer fires early or twice, a cancelled one
/// never fires, every other one fires, and every node and capture comes back.
///
/// Fails on an early or double fire, a fire after a successful cancel, a timer never
/// fired within [`LIMIT`], or a node or capture not given back.
#[test]
fn churn_while_callbacks_block_is_exactly_once_and_never_early() {
    let _serial = serial();
    for rescue in [Some(1), Some(2), Some(8)] {
        within(Duration::from_secs(90), "churn", move || churn(rescue));
    }
}

fn churn(rescue: Option<u32>) {
    const THREADS: usize = 4;
    const EACH: usize = 600;
    let engine = engine(4, rescue);
    let live = Live::default();
    let n = THREADS * EACH;
    let base = Instant::now();
    let churn = Arc::new(Churn {
        deadline: (0..n).map(|_| Mutex::new(0)).collect(),
        fires: (0..n).map(|_| AtomicU8::new(0)).collect(),
        cancelled: (0..n).map(|_| AtomicBool::new(false)).collect(),
        early: AtomicUsize::new(0),
        base,
    });
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let (engine, churn, live) = (&engine, &churn, &live);
            scope.spawn(move || {
                let mut rng = Rng(0x5eed + thread as u64 + 100 * u64::from(rescue.unwrap_or(0)));
                let mut armed = Vec::new();
                for k in 0..EACH {
                    let index = thread * EACH + k;
                    let delay = ms(rng.range(0, 40));
                    let block = if rng.percent(2) {
                        ms(rng.range(50, 150))
                    } else if rng.percent(20) {
                        ms(rng.range(1, 5))
                    } else {
                        Duration::ZERO
                    };
                    let witness = live.witness();
                    let churn_in = Arc::clone(churn);
                    let mut slot = churn.deadline[index].lock().unwrap();
                    let before = Instant::now();
                    let handle = engine
                        .schedule(delay, move || {
                            let _witness = witness;
                            let now = Instant::now();
                            let deadline = *churn_in.deadline[index].lock().unwrap();
                            if now < churn_in.base + Duration::from_nanos(deadline) {
                                churn_in.early.fetch_add(1, Ordering::SeqCst);
                            }
                            churn_in.fires[index].fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(block);
                        })
                        .unwrap();
                    // Its deadline is at least this late; the callback waits for the lock.
                    *slot = (before + delay - base).as_nanos() as u64;
                    drop(slot);
                    armed.push((index, handle));
                    // Act on an earlier timer now and then.
                    if rng.percent(30) && !armed.is_empty() {
                        let (index, handle) = armed[rng.below(armed.len() as u64) as usize];
                        if rng.percent(50) {
                            if engine.cancel(handle) {
                                churn.cancelled[index].store(true, Ordering::SeqCst);
                            }
                        } else {
                            let delay = ms(rng.range(0, 30));
                            let mut slot = churn.deadline[index].lock().unwrap();
                            let before = Instant::now();
                            if engine.reset(handle, delay) {
                                *slot = (before + delay - base).as_nanos() as u64;
                            }
                        }
                    }
                    if k % 50 == 0 {
                        std::thread::sleep(ms(1));
                    }
                }
            });
        }
    });
    let settled = |index: usize| {
        let fires = churn.fires[index].load(Ordering::SeqCst);
        if churn.cancelled[index].load(Ordering::SeqCst) {
            fires == 0
        } else {
            fires == 1
        }
    };
    let all = eventually(LIMIT, || (0..n).all(settled));
    std::thread::sleep(ms(50));
    let wrong: Vec<(usize, u8, bool)> = (0..n)
        .filter(|&index| !settled(index))
        .map(|index| {
            (
                index,
                churn.fires[index].load(Ordering::SeqCst),
                churn.cancelled[index].load(Ordering::SeqCst),
            )
        })
        .take(10)
        .collect();
    assert!(
        all && wrong.is_empty(),
        "rescue_after {rescue:?}: timers not fired exactly once (or fired after a cancel): \
         (index, fires, cancelled) {wrong:?}"
    );
    assert_eq!(
        churn.early.load(Ordering::SeqCst),
        0,
        "rescue_after {rescue:?}: early fires"
    );
    assert_all_given_back(&engine, &live);
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
}

/// Cancels and resets sent from threads to a worker that sleeps with nothing planned, and
/// to one that wakes every tick (its own repeating timer): cancelled timers' nodes and
/// captures come back, and a timer reset earlier from a thread fires at its new deadline,
/// never early, while the far deadline it had is still an hour off.
///
/// Fails when a node or capture is not back within 5 s, or a reset timer does not fire
/// within [`LIMIT`].
#[test]
fn cancels_and_resets_from_threads_reach_idle_and_awake_workers() {
    let _serial = serial();
    for awake in [false, true] {
        let engine = engine(2, Some(8));
        let live = Live::default();
        let early = Arc::new(AtomicUsize::new(0));
        let ticking = awake.then(|| {
            std::thread::scope(|scope| {
                (0..2)
                    .map(|_| {
                        let engine = &engine;
                        scope
                            .spawn(move || engine.schedule_repeating(ms(1), || {}).unwrap())
                            .join()
                            .unwrap()
                    })
                    .collect::<Vec<_>>()
            })
        });
        let fired: Vec<Flag> = (0..8).map(|_| Flag::default()).collect();
        std::thread::scope(|scope| {
            for thread in 0..4 {
                let (engine, live, early, fired) = (&engine, &live, &early, &fired);
                scope.spawn(move || {
                    for round in 0..50 {
                        let witness = live.witness();
                        let handle = engine
                            .schedule(Duration::from_secs(3600), move || drop(witness))
                            .unwrap();
                        // Let the worker file it, then cancel it: a message on the lane.
                        std::thread::sleep(ms(if round % 2 == 0 { 0 } else { 3 }));
                        assert!(engine.cancel(handle));
                    }
                    for k in 0..2 {
                        let (flag, early) = (fired[2 * thread + k].clone(), Arc::clone(early));
                        let due = Instant::now() + ms(20 + 7 * k as u64);
                        let handle = engine
                            .schedule(Duration::from_secs(3600), move || {
                                if Instant::now() < due {
                                    early.fetch_add(1, Ordering::SeqCst);
                                }
                                flag.set();
                            })
                            .unwrap();
                        // Filed by the worker (or still on the lane) when the reset comes.
                        std::thread::sleep(ms(if k == 0 { 0 } else { 5 }));
                        assert!(engine.reset_at(handle, due));
                    }
                });
            }
        });
        assert!(
            eventually(LIMIT, || fired.iter().all(Flag::is_set)),
            "awake {awake}: a timer reset earlier from a thread waited for its old deadline"
        );
        assert_eq!(
            early.load(Ordering::SeqCst),
            0,
            "awake {awake}: early fires"
        );
        for handle in ticking.into_iter().flatten() {
            assert!(engine.cancel(handle));
        }
        assert_all_given_back(&engine, &live);
        assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
    }
}

/// On a hand-driven engine, tick by tick: a timer armed far out from a thread then reset
/// earlier from another thread fires at the new tick exactly, and a cancel sent from a
/// thread frees the node within the idle lane horizon (32 ticks). A hand-driven engine
/// never publishes a planned wake-up, so this pins the behaviour the lane horizon must
/// keep, not the horizon's own path.
///
/// Fails on a fire at any other tick, or a node still in use after 40 ticks.
#[test]
fn on_a_manual_clock_thread_resets_and_cancels_land_on_their_tick() {
    let _serial = support::serial();
    let (engine, clock) = manual(2);
    let engine = Arc::new(engine);
    let fired_at = Arc::new(AtomicU64::new(0));
    let origin = clock.now();
    let handle = {
        let (engine, fired_at, clock) = (Arc::clone(&engine), Arc::clone(&fired_at), clock.clone());
        std::thread::spawn(move || {
            engine
                .schedule(Duration::from_secs(3600), move || {
                    let at = clock.now().duration_since(origin).as_millis() as u64;
                    fired_at.store(at, Ordering::SeqCst);
                })
                .unwrap()
        })
        .join()
        .unwrap()
    };
    run_for(&engine, &clock, 3);
    {
        let engine = Arc::clone(&engine);
        std::thread::spawn(move || assert!(engine.reset(handle, ms(5))))
            .join()
            .unwrap();
    }
    for tick in 4..=8 {
        run_for(&engine, &clock, 1);
        let expected = if tick >= 8 { 8 } else { 0 };
        assert_eq!(fired_at.load(Ordering::SeqCst), expected, "at tick {tick}");
    }
    let victim = {
        let engine = Arc::clone(&engine);
        std::thread::spawn(move || engine.schedule(Duration::from_secs(3600), || {}).unwrap())
            .join()
            .unwrap()
    };
    run_for(&engine, &clock, 40);
    assert_eq!(engine.nodes_in_use(), 1);
    {
        let engine = Arc::clone(&engine);
        std::thread::spawn(move || assert!(engine.cancel(victim)))
            .join()
            .unwrap();
    }
    run_for(&engine, &clock, 40);
    assert_eq!(engine.nodes_in_use(), 0, "the cancelled node came back");
}

/// After a stuck episode with rescues (and a second owner stuck after it), once every
/// callback has returned and nothing is pending, the engine goes quiet: measured in 2 s
/// windows until one is idle, for up to 30 s (the watcher lingers 64 x `rescue_after`
/// ticks after the last run, a fraction of a second here).
///
/// Fails if every 2 s window for 30 s shows a tenth of a core or more.
#[test]
fn an_engine_goes_quiet_after_a_rescue() {
    let _serial = serial();
    let engine = engine(4, Some(2));
    let gate = Gate::default();
    let (started_tx, started_rx) = mpsc::channel();
    let t0 = Instant::now() + ms(50);
    engine
        .schedule_at(t0, blocking(&gate, &started_tx))
        .unwrap();
    engine
        .schedule_at(t0 + ms(30), blocking(&gate, &started_tx))
        .unwrap();
    engine.schedule_at(t0 + ms(60), || {}).unwrap();
    started(&started_rx, "the blocking callback");
    started(&started_rx, "the second blocking callback");
    std::thread::sleep(ms(200));
    gate.open();
    assert!(eventually(LIMIT, || engine.stats().total.pending == 0));
    std::thread::sleep(Duration::from_secs(1));
    let (cores, windows) = idle_cores(Duration::from_secs(30));
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
    if let Some(cores) = cores {
        assert!(cores < 0.1, "busy after the rescue: {windows:?}");
    }
}

/// An owner stuck in a callback with nothing else due costs the other workers no CPU: the
/// worker watching it looks every `rescue_after` ticks (or at the stuck shard's next
/// deadline) rather than spinning until the callback returns. A timer armed on the stuck
/// shard meanwhile is still rescued. Before, a worker stood in for the stuck owner over and
/// over, a core busy for as long as the callback blocked.
///
/// Fails if every 2 s window for 30 s while the callback blocks shows 0.3 cores or more (a
/// worker standing in over and over used a whole one; one look every 2 ticks, about 0.04
/// here in a debug build), or if the timer armed meanwhile is not rescued within [`LIMIT`].
#[test]
fn a_stuck_owner_with_nothing_due_costs_no_cpu() {
    let _serial = serial();
    for (workers, rescue) in [(2, Some(2)), (4, Some(8))] {
        let engine = engine(workers, rescue);
        let gate = Gate::default();
        let (started_tx, started_rx) = mpsc::channel();
        engine
            .schedule(ms(20), blocking(&gate, &started_tx))
            .unwrap();
        started(&started_rx, "the blocking callback");
        std::thread::sleep(ms(200));
        let (cores, windows) = cores_until_below(0.3, Duration::from_secs(30));
        let (fired, early) = (Flag::default(), Arc::new(AtomicUsize::new(0)));
        let due = Instant::now() + ms(30);
        engine
            .schedule_at(due, fired.callback(due, &early))
            .unwrap();
        let rescued = eventually(LIMIT, || fired.is_set());
        gate.open();
        assert!(eventually(LIMIT, || fired.is_set()), "never fired at all");
        assert_eq!(early.load(Ordering::SeqCst), 0, "fired early");
        assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
        println!("{workers} workers, rescue_after {rescue:?}: 2 s windows {windows:?} cores");
        if let Some(cores) = cores {
            assert!(
                cores < 0.3,
                "{workers} workers busy while an owner was stuck with nothing due: \
                 {windows:?} cores"
            );
        }
        assert!(
            rescued,
            "a timer armed on the stuck shard waited for its callback"
        );
    }
}
