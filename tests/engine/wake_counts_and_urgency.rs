//! `stats().wakes` (why each shard's worker woke, counted by the owner) and urgency (a
//! reclaim that publishes more pending timers than its look-again array holds asks for
//! urgency again if a reset asked for it meanwhile), from the public API only.
//!
//! Wake counts: consistency of every snapshot (the total is the shards' sum, field by
//! field; `total()` is the sum of the causes) and monotonicity between snapshots, from
//! readers racing load and shutdown; an idle engine keeping still with 1, 2, 3 and 8
//! workers, rescue on (1 and 8 ticks) and off, pinned or not, 1 and 10 ms ticks, after
//! timers, cancels, resets, a repeating timer and a blocking callback; a shutdown of an
//! idle engine waking each worker exactly once (counted `woken`, nothing else) and the
//! counts frozen after it; watch wake-ups while a callback blocks (2, 4, 8 workers), none
//! without rescue; `woken` and `due` for a timer armed from another thread before the
//! worker's plan; a hand-driven engine (threads turning at once, stand-ins, shutdown)
//! counting none; shutdown and drop racing arming and reading.
//!
//! Urgency: on a manual clock, exact ticks for parked and kept timers reset earlier
//! between ticks, for resets racing reclaims (turned once all are quiet), for resets
//! racing both reclaims and turns (at their tick or the next), and a constructed race in
//! which a reset and a turn land inside the reclaim that holds the kept timer (the turn
//! spends the urgent tick; `look_again` must ask for it anew). On the real clock, threads
//! arm long timers at a steady pace with a quarter (or three quarters) cancelled while
//! held, so that each old generation taken back holds hundreds of pending timers; as a
//! take-back begins, resets (from a callback on the worker, from threads, or from a thread
//! while a thread pinned to the arming thread's CPU freezes it mid take-back) move some of
//! that generation's timers to a deadline already past or 1 to 5 ms out. Asserted: never
//! early, exactly once, nothing lost; the lateness is printed (`--nocapture`), and the
//! `URGENCY_STRESS_*` variables (see `with_env`) reshape or lengthen the stress.
//!
//! Mutants each fail some of these tests: `woken`, `watch` or `due` never counted,
//! `ShardStats::add` without the wake-ups, `total()` without `woken`, a watch that never
//! stops lingering, `take_urgent` never true, a reset of a timer in transit asking no
//! urgency, the reclaim's `look_again` removed. The ask-again itself is covered only by
//! the loom model: on a manual clock every turn takes every forward ring, and on the real
//! clock the worker's other wake-ups pick a stale need up within the noise.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{Live, Rng, eventually, ms, settle_wakes};
use corewheel::{
    Clock, ManualClock, PendingTimers, ShardStats, Stats, TimerEngine, TimerHandle, WorkerWakes,
};

// ---------------------------------------------------------------------------------------
// Wake counts: consistency of the snapshots.
// ---------------------------------------------------------------------------------------

/// Every count of a `ShardStats`, wake-ups included, in a fixed order (`pending`, fifth,
/// is derived, and may go down).
fn fields(s: &ShardStats) -> [u64; 16] {
    let w = s.wakes;
    [
        s.scheduled,
        s.fired,
        s.cancelled,
        s.reset,
        s.pending,
        s.panicked,
        s.late,
        s.stolen,
        s.rescued,
        s.ran_at_shutdown,
        s.dropped_at_shutdown,
        w.due,
        w.wheel,
        w.lane,
        w.watch,
        w.woken,
    ]
}
const FIRED: usize = 1;
/// The wake-up counts' place in `fields`.
const WAKES: std::ops::Range<usize> = 11..16;

/// A snapshot is consistent: the total is the sum of the shards, field by field, and each
/// `WorkerWakes::total` is the sum of its causes.
fn check_sums(stats: &Stats, what: &str) {
    let total = fields(&stats.total);
    let mut sum = [0_u64; 16];
    for shard in &stats.shards {
        for (s, v) in sum.iter_mut().zip(fields(shard)) {
            *s += v;
        }
        let w = shard.wakes;
        assert_eq!(
            w.total(),
            w.due + w.wheel + w.lane + w.watch + w.woken,
            "{what}: a shard's wake-ups are not the sum of their causes: {w:?}"
        );
    }
    assert_eq!(
        total, sum,
        "{what}: the total is not the sum of the shards: {stats:?}"
    );
    let w = stats.total.wakes;
    assert_eq!(
        w.total(),
        w.due + w.wheel + w.lane + w.watch + w.woken,
        "{what}: {w:?}"
    );
}

/// No wake-up count, and no `fired`, went down from `before` to `after` in any shard.
fn check_monotonic(before: &Stats, after: &Stats, what: &str) {
    assert_eq!(before.shards.len(), after.shards.len());
    for (index, (b, a)) in before.shards.iter().zip(&after.shards).enumerate() {
        let (b, a) = (fields(b), fields(a));
        for i in WAKES.chain([FIRED]) {
            assert!(
                a[i] >= b[i],
                "{what}: shard {index}'s count {i} went down: {} to {}",
                b[i],
                a[i]
            );
        }
    }
}

/// The wake-ups of each shard.
fn wakes_of(stats: &Stats) -> Vec<WorkerWakes> {
    stats.shards.iter().map(|s| s.wakes).collect()
}

/// A `WorkerWakes` with every cause of `a` minus `b`'s (each must not have gone down).
fn delta(a: WorkerWakes, b: WorkerWakes) -> WorkerWakes {
    let sub = |x: u64, y: u64| {
        assert!(x >= y, "a wake-up count went down: {b:?} to {a:?}");
        x - y
    };
    WorkerWakes {
        due: sub(a.due, b.due),
        wheel: sub(a.wheel, b.wheel),
        lane: sub(a.lane, b.lane),
        watch: sub(a.watch, b.watch),
        woken: sub(a.woken, b.woken),
    }
}

fn real_engine(workers: usize, rescue: Option<u32>, tick: Duration, pin: bool) -> Arc<TimerEngine> {
    Arc::new(
        TimerEngine::builder()
            .workers(workers)
            .pin_workers(pin)
            .rescue_after(rescue)
            .tick(tick)
            .build()
            .unwrap(),
    )
}

/// Keeps the engine's workers busy for a while from `threads` threads (which exit before
/// it returns): one-shot timers 1 to 40 ticks out, some cancelled, some reset earlier or
/// later, a repeating timer cancelled after a few runs, and a callback that blocks for a
/// few ticks (watched when rescue is on). Waits until nothing is pending.
fn exercise(engine: &Arc<TimerEngine>, threads: usize, live: &Live) {
    let tick = engine.tick();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let engine = Arc::clone(engine);
            let live = live.clone();
            scope.spawn(move || {
                let mut rng = Rng(t as u64 + 1);
                let mut handles = Vec::new();
                for k in 0..40_u32 {
                    let witness = live.witness();
                    let h = engine
                        .schedule(tick * (1 + rng.below(40) as u32), move || {
                            let _ = &witness;
                        })
                        .unwrap();
                    handles.push(h);
                    if k % 5 == 0 {
                        engine.cancel(h);
                    } else if k % 7 == 0 {
                        engine.reset(h, tick * (1 + rng.below(20) as u32));
                    }
                }
                if t == 0 {
                    engine
                        .schedule(tick * 2, move || std::thread::sleep(tick * 12))
                        .unwrap();
                    let repeating = engine.schedule_repeating(tick * 3, || {}).unwrap();
                    std::thread::sleep(tick * 20);
                    assert!(engine.cancel(repeating));
                }
                std::thread::sleep(tick * 5);
                for h in handles.iter().step_by(3) {
                    engine.cancel(*h);
                }
            });
        }
    });
    assert!(
        eventually(Duration::from_secs(20), || engine.stats().total.pending
            == 0),
        "timers still pending: {:?}",
        engine.stats().total
    );
}

/// After its timers fired and the watch for stuck owners has lingered out, an engine's
/// wake-up counts stay still, with 1, 2, 3 or 8 workers, rescue on (at 1 and 8 ticks) or
/// off, pinned or not, at 1 ms and 10 ms ticks; a shutdown then wakes each worker exactly
/// once (counted as woken, nothing else), and the counts never move again. Every snapshot
/// on the way is consistent and none goes down.
#[test]
fn an_idle_engine_keeps_still_and_its_shutdown_wakes_each_worker_once() {
    let configs: [(usize, Option<u32>, u64, bool); 9] = [
        (1, Some(8), 1, false),
        (1, None, 1, false),
        (2, Some(8), 1, false),
        (2, None, 1, false),
        (2, Some(8), 1, true),
        (3, Some(1), 1, false),
        (8, Some(8), 1, false),
        (8, None, 1, false),
        (2, Some(1), 10, false),
    ];
    std::thread::scope(|scope| {
        for (workers, rescue, tick_ms, pin) in configs {
            scope.spawn(move || {
                let what =
                    format!("{workers} workers, rescue {rescue:?}, tick {tick_ms} ms, pin {pin}");
                let engine = real_engine(workers, rescue, ms(tick_ms), pin);
                let live = Live::default();
                let start = engine.stats();
                check_sums(&start, &what);
                exercise(&engine, workers.min(3), &live);
                let busy = engine.stats();
                check_sums(&busy, &what);
                check_monotonic(&start, &busy, &what);
                assert!(
                    busy.total.wakes.total() > 0,
                    "{what}: workers ran timers without a wake-up counted: {busy:?}"
                );
                // The watch lingers 64 x rescue_after ticks after the last run (512 ms at
                // 8 x 1 ms, 640 ms at 1 x 10 ms).
                settle_wakes(&engine, ms(700), Duration::from_secs(20), &what);
                let idle = engine.stats();
                std::thread::sleep(Duration::from_millis(600));
                let later = engine.stats();
                check_sums(&later, &what);
                check_monotonic(&busy, &idle, &what);
                assert_eq!(
                    wakes_of(&idle),
                    wakes_of(&later),
                    "{what}: an idle engine's workers woke up"
                );
                engine.shutdown(PendingTimers::Drop);
                let shut = engine.stats();
                check_sums(&shut, &what);
                for (index, (before, after)) in later.shards.iter().zip(&shut.shards).enumerate() {
                    let d = delta(after.wakes, before.wakes);
                    assert_eq!(
                        d,
                        WorkerWakes {
                            woken: 1,
                            ..WorkerWakes::default()
                        },
                        "{what}: shard {index}'s worker, asleep with nothing to do, was \
                         woken once by the shutdown"
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
                assert_eq!(engine.stats(), shut, "{what}: counts moved after shutdown");
                support::assert_all_given_back(&engine, &live);
            });
        }
    });
}

/// While a callback blocks, another worker wakes to watch the stuck owner (counted as
/// `watch`) when rescue is on, with 2, 4 and 8 workers; never with rescue off, however
/// long it blocks. After the callback returns and the watch has lingered out, the counts
/// stay still.
#[test]
fn a_blocked_callback_is_watched_only_with_rescue_on_and_the_watch_ends() {
    let configs: [(usize, Option<u32>); 5] = [
        (2, Some(2)),
        (4, Some(8)),
        (8, Some(8)),
        (2, None),
        (4, None),
    ];
    std::thread::scope(|scope| {
        for (workers, rescue) in configs {
            scope.spawn(move || {
                let what = format!("{workers} workers, rescue {rescue:?}");
                let engine = real_engine(workers, rescue, ms(1), false);
                let released = Arc::new(AtomicBool::new(false));
                let entered = Arc::new(AtomicBool::new(false));
                let (r, e) = (Arc::clone(&released), Arc::clone(&entered));
                let started = Instant::now();
                engine
                    .schedule(ms(1), move || {
                        e.store(true, Ordering::SeqCst);
                        while !r.load(Ordering::SeqCst)
                            && started.elapsed() < Duration::from_secs(30)
                        {
                            std::thread::sleep(ms(1));
                        }
                    })
                    .unwrap();
                assert!(eventually(Duration::from_secs(10), || entered.load(Ordering::SeqCst)));
                let blocked = engine.stats();
                // With rescue on, watch wake-ups until there are three (a watcher kept off
                // its core takes longer, not fewer); without, none in 400 ms.
                let watched = |stats: &Stats| delta(stats.total.wakes, blocked.total.wakes).watch;
                match rescue {
                    Some(_) => {
                        eventually(Duration::from_secs(20), || watched(&engine.stats()) >= 3);
                    }
                    None => std::thread::sleep(ms(400)),
                }
                let during = engine.stats();
                check_sums(&during, &what);
                check_monotonic(&blocked, &during, &what);
                released.store(true, Ordering::SeqCst);
                match rescue {
                    Some(_) => assert!(
                        watched(&during) >= 3,
                        "{what}: {} watch wake-ups in 20 s of a blocked callback: {during:?}",
                        watched(&during)
                    ),
                    None => assert_eq!(
                        during.total.wakes.watch, 0,
                        "{what}: a watch without rescue: {during:?}"
                    ),
                }
                settle_wakes(&engine, ms(700), Duration::from_secs(20), &what);
                let idle = engine.stats();
                std::thread::sleep(ms(500));
                let later = engine.stats();
                check_monotonic(&during, &idle, &what);
                assert_eq!(wakes_of(&idle), wakes_of(&later), "{what}: still watching");
                if rescue.is_none() {
                    assert_eq!(later.total.wakes.watch, 0, "{what}: {later:?}");
                }
            });
        }
    });
}

/// A thread arming a timer due long before the sleeping worker's plan wakes it early
/// (`woken`), and the timer's own tick is then a wake-up with a timer due (`due`). Rounds
/// from one long-lived thread (a thread's exit also wakes the worker, to drop its lane),
/// with one worker, and with three (the thread's home shard is counted), until three
/// rounds have shown each count, twenty at most. A worker kept off its core past the
/// timer's deadline claims it in the early wake-up, which counts as `woken` alone (5 of 14
/// runs with a 4 ms timer on a loaded machine), so a round asserts only that the run was
/// counted in one of the two.
#[test]
fn a_sooner_timer_wakes_the_worker_early_and_its_tick_counts_as_due() {
    /// The most rounds a worker count may take to show both counts three times.
    const ROUNDS: usize = 20;
    for workers in [1, 3] {
        let engine = real_engine(workers, Some(8), ms(1), false);
        let (jobs, rx) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let armer = std::thread::spawn(move || {
            for job in rx {
                job();
            }
        });
        let run = |job: Box<dyn FnOnce() + Send>| {
            let (done, wait) = std::sync::mpsc::channel();
            jobs.send(Box::new(move || {
                job();
                done.send(()).unwrap();
            }))
            .unwrap();
            wait.recv_timeout(Duration::from_secs(20)).unwrap();
        };
        // Opens the thread's lane, with a timer far out.
        let e = Arc::clone(&engine);
        run(Box::new(move || {
            e.schedule(Duration::from_secs(60), || {}).unwrap();
        }));
        let (mut woken_rounds, mut due_rounds) = (0, 0);
        let mut rounds = Vec::new();
        while rounds.len() < ROUNDS && (woken_rounds < 3 || due_rounds < 3) {
            std::thread::sleep(ms(300));
            let before = engine.stats();
            let fired = Arc::new(AtomicBool::new(false));
            let (e, f) = (Arc::clone(&engine), Arc::clone(&fired));
            run(Box::new(move || {
                e.schedule(ms(50), move || f.store(true, Ordering::SeqCst))
                    .unwrap();
            }));
            assert!(eventually(Duration::from_secs(10), || fired.load(Ordering::SeqCst)));
            std::thread::sleep(ms(30));
            let after = engine.stats();
            check_sums(&after, "rounds");
            check_monotonic(&before, &after, "rounds");
            let d = delta(after.total.wakes, before.total.wakes);
            rounds.push(d);
            assert!(
                d.due + d.woken >= 1,
                "{workers} workers: the wake-up that ran the timer was not counted: {d:?}"
            );
            woken_rounds += usize::from(d.woken >= 1);
            due_rounds += usize::from(d.due >= 1);
        }
        assert!(
            woken_rounds >= 3 && due_rounds >= 3,
            "{workers} workers: in {} rounds, a timer due before the worker's plan woke it \
             early in {woken_rounds} and its tick was counted as due in {due_rounds}: \
             {rounds:?}",
            rounds.len()
        );
        drop(jobs);
        armer.join().unwrap();
    }
}

/// Readers calling `stats()` without pause on four threads while three workers run
/// timers armed, cancelled and reset from two threads (some callbacks blocking long
/// enough to be stood in for), through a shutdown racing all of it: every snapshot is
/// consistent (totals are the shards' sums), and no wake-up count nor `fired` ever goes
/// down between two snapshots of one reader. Nothing is lost: each timer armed is run,
/// cancelled or dropped by the shutdown, once.
#[test]
fn readers_see_consistent_and_monotonic_counts_through_load_and_shutdown() {
    let engine = real_engine(3, Some(2), ms(1), false);
    let stop_arming = Arc::new(AtomicBool::new(false));
    let stop_reading = Arc::new(AtomicBool::new(false));
    let live = Live::default();
    let ran = Arc::new(AtomicU64::new(0));
    let (armed, cancelled) = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..4)
            .map(|r| {
                let (engine, stop) = (Arc::clone(&engine), Arc::clone(&stop_reading));
                scope.spawn(move || {
                    let mut last = engine.stats();
                    let mut n = 0_u64;
                    while !stop.load(Ordering::Relaxed) {
                        let now = engine.stats();
                        check_sums(&now, &format!("reader {r}"));
                        check_monotonic(&last, &now, &format!("reader {r}"));
                        last = now;
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let armers: Vec<_> = (0..2)
            .map(|t| {
                let (engine, stop, live, ran) = (
                    Arc::clone(&engine),
                    Arc::clone(&stop_arming),
                    live.clone(),
                    Arc::clone(&ran),
                );
                scope.spawn(move || {
                    let mut rng = Rng(77 + t);
                    let (mut armed, mut cancelled) = (0_u64, 0_u64);
                    let mut handles = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let witness = live.witness();
                        let ran = Arc::clone(&ran);
                        let slow = rng.percent(1);
                        let result = engine.schedule(ms(rng.below(15)), move || {
                            let _ = &witness;
                            ran.fetch_add(1, Ordering::SeqCst);
                            if slow {
                                std::thread::sleep(ms(6));
                            }
                        });
                        let Ok(h) = result else { break };
                        armed += 1;
                        handles.push(h);
                        if rng.percent(20) {
                            let h = handles[rng.below(handles.len() as u64) as usize];
                            if engine.cancel(h) {
                                cancelled += 1;
                            }
                        } else if rng.percent(20) {
                            let h = handles[rng.below(handles.len() as u64) as usize];
                            engine.reset(h, ms(rng.below(10)));
                        }
                        if handles.len() > 2000 {
                            handles.drain(..1000);
                        }
                        if rng.percent(5) {
                            std::thread::sleep(Duration::from_micros(200));
                        }
                    }
                    (armed, cancelled)
                })
            })
            .collect();
        std::thread::sleep(ms(1500));
        // Shutdown (running what is pending) while the armers and readers go on.
        let report = engine.shutdown(PendingTimers::Run);
        stop_arming.store(true, Ordering::SeqCst);
        let totals = armers
            .into_iter()
            .map(|a| a.join().unwrap())
            .fold((0, 0), |(a, c), (x, y)| (a + x, c + y));
        std::thread::sleep(ms(50));
        stop_reading.store(true, Ordering::SeqCst);
        for reader in readers {
            assert!(reader.join().unwrap() > 10, "a reader hardly read");
        }
        assert_eq!(report.dropped, 0);
        totals
    });
    let stats = engine.stats();
    check_sums(&stats, "after");
    assert_eq!(stats.total.scheduled, armed);
    assert_eq!(stats.total.cancelled, cancelled);
    assert_eq!(
        ran.load(Ordering::SeqCst),
        armed - cancelled,
        "each timer armed and not cancelled ran once (a shutdown that runs them): {stats:?}"
    );
    assert_eq!(stats.total.fired, armed - cancelled);
    assert!(stats.total.wakes.total() > 0);
    support::assert_all_given_back(&engine, &live);
    std::thread::sleep(ms(50));
    assert_eq!(engine.stats(), stats, "counts moved after shutdown");
}

/// Engines shut down or dropped while threads arm timers on them and read their stats,
/// twenty times over with 1 to 4 workers, rescue on and off: no panic, every snapshot
/// consistent and monotonic, every capture dropped; a dropped engine's last holder may be
/// any of those threads.
#[test]
fn shutdown_and_drop_race_arming_and_reading() {
    let mut rng = Rng(4242);
    for round in 0..20_u64 {
        let workers = 1 + (round % 4) as usize;
        let rescue = if round % 2 == 0 { Some(2) } else { None };
        let engine = real_engine(workers, rescue, ms(1), false);
        let live = Live::default();
        let ran = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let drop_it = round % 3 == 2;
        let mut threads = Vec::new();
        for t in 0..2_u64 {
            let (engine, live, ran, stop) = (
                Arc::clone(&engine),
                live.clone(),
                Arc::clone(&ran),
                Arc::clone(&stop),
            );
            threads.push(std::thread::spawn(move || {
                let mut rng = Rng(round * 10 + t);
                let mut ok = 0_u64;
                while !stop.load(Ordering::Relaxed) {
                    let witness = live.witness();
                    let ran = Arc::clone(&ran);
                    match engine.schedule(ms(rng.below(5)), move || {
                        let _ = &witness;
                        ran.fetch_add(1, Ordering::SeqCst);
                    }) {
                        Ok(h) => {
                            ok += 1;
                            if rng.percent(30) {
                                engine.reset(h, ms(rng.below(3)));
                            }
                        }
                        Err(_) => break,
                    }
                }
                ok
            }));
        }
        let reader = {
            let (engine, stop) = (Arc::clone(&engine), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut last = engine.stats();
                while !stop.load(Ordering::Relaxed) {
                    let now = engine.stats();
                    check_sums(&now, "reader");
                    check_monotonic(&last, &now, "reader");
                    last = now;
                }
                last
            })
        };
        std::thread::sleep(ms(5 + rng.below(30)));
        if drop_it {
            // The last holder drops it (and so shuts it down), whoever that is.
            let stopper = Arc::clone(&stop);
            drop(engine);
            std::thread::sleep(ms(rng.below(5)));
            stopper.store(true, Ordering::SeqCst);
            let _ = reader.join().unwrap();
            for t in threads {
                t.join().unwrap();
            }
            assert!(
                eventually(Duration::from_secs(10), || live.count() == 0),
                "round {round}: captures left after the engine was dropped: {}",
                live.count()
            );
            continue;
        }
        let pending = if round % 2 == 0 {
            PendingTimers::Run
        } else {
            PendingTimers::Drop
        };
        let report = engine.shutdown(pending);
        stop.store(true, Ordering::SeqCst);
        let ok: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let last = reader.join().unwrap();
        let after = engine.stats();
        check_sums(&after, "after");
        check_monotonic(&last, &after, "after");
        assert_eq!(
            ran.load(Ordering::SeqCst) + report.dropped,
            ok,
            "round {round}: each timer scheduled ran once or was dropped by the shutdown"
        );
        support::assert_all_given_back(&engine, &live);
        std::thread::sleep(ms(20));
        assert_eq!(wakes_of(&engine.stats()), wakes_of(&after));
    }
}

/// A hand-driven engine counts no wake-up: three shards, rescue after 2 ticks, turned by
/// two threads at once while the clock moves, with callbacks that block (so that turns
/// stand in for each other), timers armed, cancelled and reset from other threads, and a
/// shutdown that runs what is left.
#[test]
fn a_hand_driven_engine_counts_no_wake_up_whatever_drives_it() {
    let clock = ManualClock::new();
    let engine = Arc::new(
        TimerEngine::builder()
            .workers(3)
            .rescue_after(Some(2))
            .manual_clock(clock.clone())
            .build()
            .unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let ran = Arc::new(AtomicU64::new(0));
    std::thread::scope(|scope| {
        for t in 0..2_u64 {
            let (engine, stop, ran) = (Arc::clone(&engine), Arc::clone(&stop), Arc::clone(&ran));
            scope.spawn(move || {
                let mut rng = Rng(t + 9);
                while !stop.load(Ordering::Relaxed) {
                    let ran = Arc::clone(&ran);
                    let slow = rng.percent(3);
                    let h = engine
                        .schedule(ms(rng.below(10)), move || {
                            ran.fetch_add(1, Ordering::SeqCst);
                            if slow {
                                std::thread::sleep(ms(3));
                            }
                        })
                        .unwrap();
                    if rng.percent(20) {
                        engine.cancel(h);
                    } else if rng.percent(20) {
                        engine.reset(h, ms(rng.below(5)));
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
            });
        }
        for _ in 0..2 {
            let (engine, stop, clock) = (Arc::clone(&engine), Arc::clone(&stop), clock.clone());
            scope.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    clock.advance(ms(1));
                    engine.turn();
                    std::thread::sleep(Duration::from_micros(300));
                }
            });
        }
        std::thread::sleep(ms(600));
        stop.store(true, Ordering::SeqCst);
    });
    let before = engine.stats();
    assert!(before.total.fired > 0, "nothing ran: {before:?}");
    engine.shutdown(PendingTimers::Run);
    let stats = engine.stats();
    check_sums(&stats, "manual");
    assert_eq!(stats.total.wakes, WorkerWakes::default(), "{stats:?}");
    for shard in &stats.shards {
        assert_eq!(shard.wakes, WorkerWakes::default());
    }
}

/// `Stats::total` is the shards' sum for wake-ups too, on an engine whose shards woke
/// for different reasons: timers armed from threads homed on different shards, one
/// blocking callback (watched), and idle shards.
#[test]
fn the_total_of_wake_ups_is_the_sum_of_the_shards() {
    let engine = real_engine(4, Some(2), ms(1), false);
    std::thread::scope(|scope| {
        for t in 0..6_u64 {
            let engine = Arc::clone(&engine);
            scope.spawn(move || {
                for k in 0..20 {
                    engine.schedule(ms(1 + (k * 3 + t) % 25), || {}).unwrap();
                }
                if t == 1 {
                    engine
                        .schedule(ms(2), || std::thread::sleep(ms(40)))
                        .unwrap();
                }
            });
        }
    });
    assert!(eventually(Duration::from_secs(10), || engine
        .stats()
        .total
        .pending
        == 0));
    let stats = engine.stats();
    check_sums(&stats, "four shards");
    let busy_shards = stats.shards.iter().filter(|s| s.wakes.total() > 0).count();
    assert!(busy_shards >= 2, "{stats:?}");
    assert!(
        stats.total.wakes.due >= 1 && stats.total.wakes.watch >= 1,
        "{stats:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Urgency on a manual clock: exact ticks.
// ---------------------------------------------------------------------------------------

/// The timers of a hand-driven urgency test: the ms (manual clock, since `start`) each is
/// expected to run at (`u64::MAX`: not before the end), when it ran, how often.
struct ManualBook {
    clock: ManualClock,
    start: Instant,
    due: Vec<AtomicU64>,
    ran_at: Vec<AtomicU64>,
    runs: Vec<AtomicU64>,
    cancelled: Vec<AtomicBool>,
    handles: Vec<Mutex<Option<TimerHandle>>>,
    /// The tick each was armed at.
    armed_at: Vec<AtomicU64>,
    /// Its arming thread will cancel it.
    doomed: Vec<AtomicBool>,
}

impl ManualBook {
    fn new(clock: &ManualClock, n: usize) -> Self {
        let v = || (0..n).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        Self {
            clock: clock.clone(),
            start: clock.now(),
            due: (0..n).map(|_| AtomicU64::new(u64::MAX)).collect(),
            ran_at: v(),
            runs: v(),
            cancelled: (0..n).map(|_| AtomicBool::new(false)).collect(),
            handles: (0..n).map(|_| Mutex::new(None)).collect(),
            armed_at: v(),
            doomed: (0..n).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.clock.now().duration_since(self.start).as_millis() as u64
    }

    /// Arms timer `id` a minute out (never due during the test) on the calling thread's
    /// lane; `doomed` if that thread will cancel it.
    fn arm(self: &Arc<Self>, engine: &TimerEngine, id: usize, live: &Live, doomed: bool) {
        self.doomed[id].store(doomed, Ordering::SeqCst);
        let (book, witness) = (Arc::clone(self), live.witness());
        let handle = engine
            .schedule(Duration::from_secs(60), move || {
                let _ = &witness;
                book.ran_at[id].store(book.now_ms(), Ordering::SeqCst);
                book.runs[id].fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        self.armed_at[id].store(self.now_ms(), Ordering::SeqCst);
        *self.handles[id].lock().unwrap() = Some(handle);
    }

    /// Cancels timer `id`, which must be pending.
    fn cancel(&self, engine: &TimerEngine, id: usize) {
        let handle = self.handles[id].lock().unwrap().unwrap();
        self.cancelled[id].store(true, Ordering::SeqCst);
        assert!(engine.cancel(handle), "timer {id} was pending");
    }

    /// Resets timer `id`, pending and never reset, to `delay_ms` from now.
    fn reset(&self, engine: &TimerEngine, id: usize, delay_ms: u64) {
        let handle = self.handles[id].lock().unwrap().unwrap();
        self.due[id].store(self.now_ms() + delay_ms, Ordering::SeqCst);
        assert!(engine.reset(handle, ms(delay_ms)), "timer {id} was pending");
    }

    /// Whether `id` may be reset: armed, not cancelled, not reset yet.
    fn resettable(&self, id: usize) -> bool {
        self.handles[id].lock().unwrap().is_some()
            && !self.doomed[id].load(Ordering::SeqCst)
            && !self.cancelled[id].load(Ordering::SeqCst)
            && self.due[id].load(Ordering::SeqCst) == u64::MAX
    }

    /// Every timer ran at its expected ms (or up to `slack` ms later) or, never reset, not
    /// at all; and exactly once.
    fn check(&self, what: &str, slack: u64) -> usize {
        let mut reset = 0;
        let mut wrong = Vec::new();
        for id in 0..self.due.len() {
            let (due, runs) = (
                self.due[id].load(Ordering::SeqCst),
                self.runs[id].load(Ordering::SeqCst),
            );
            if due == u64::MAX {
                if runs != 0 {
                    wrong.push(format!("{id}: never reset, ran {runs} times"));
                }
                continue;
            }
            reset += 1;
            let at = self.ran_at[id].load(Ordering::SeqCst);
            if runs != 1 || at < due || at > due + slack {
                wrong.push(format!(
                    "{id} (armed at {} ms): due at {due} ms, ran {runs} times, last at {at} ms",
                    self.armed_at[id].load(Ordering::SeqCst)
                ));
            }
        }
        assert!(
            wrong.is_empty(),
            "{what}: {} wrong: {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(20)]
        );
        reset
    }
}

/// A thread that runs jobs sent to it, so that what it arms goes on its own lane.
struct Runner {
    jobs: Option<std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Runner {
    fn new() -> Self {
        let (jobs, rx) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let thread = std::thread::spawn(move || {
            for job in rx {
                job();
            }
        });
        Self {
            jobs: Some(jobs),
            thread: Some(thread),
        }
    }

    /// Starts `job`; the returned receiver gets its result when it is done.
    fn start<R: Send + 'static>(
        &self,
        job: impl FnOnce() -> R + Send + 'static,
    ) -> std::sync::mpsc::Receiver<R> {
        let (done, wait) = std::sync::mpsc::channel();
        self.jobs
            .as_ref()
            .unwrap()
            .send(Box::new(move || {
                let _ = done.send(job());
            }))
            .unwrap();
        wait
    }

    fn run(&self, job: impl FnOnce() + Send + 'static) {
        self.start(job)
            .recv_timeout(Duration::from_secs(30))
            .expect("the job finished");
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// On a manual clock, a thread arms 150 long timers a tick (a quarter cancelled by it
/// about 100 schedules later, so that its lane holds them back and parks a few hundred in
/// each old generation) while the engine is turned every tick; between ticks another
/// thread resets timers of every age (on the young stack, kept, in either old generation,
/// taken back and filed) to 1 to 6 ms from now. Each runs at exactly that ms, once; no
/// other timer runs; after a shutdown nothing is left.
#[test]
fn parked_timers_reset_earlier_run_at_their_exact_tick() {
    let (engine, clock) = support::manual(1);
    let engine = Arc::new(engine);
    const PER_TICK: usize = 150;
    const TICKS: usize = 60;
    let book = Arc::new(ManualBook::new(&clock, PER_TICK * TICKS));
    let live = Live::default();
    let (armer, resetter) = (Runner::new(), Runner::new());
    let mut rng = Rng(31);
    for tick in 0..TICKS {
        let (e, b, l) = (Arc::clone(&engine), Arc::clone(&book), live.clone());
        armer.run(move || {
            for k in 0..PER_TICK {
                let id = tick * PER_TICK + k;
                b.arm(&e, id, &l, id % 4 == 0);
                if id >= 100 && (id - 100) % 4 == 0 {
                    b.cancel(&e, id - 100);
                }
            }
        });
        if tick >= 4 && tick % 3 == 0 {
            // Ten timers of every age, from 0 to `tick` ticks.
            let mut picks = Vec::new();
            for age in 0..=tick.min(12) {
                let cohort = (tick - age) * PER_TICK;
                for _ in 0..10 {
                    let id = cohort + rng.below(PER_TICK as u64) as usize;
                    if book.resettable(id) && !picks.iter().any(|p: &(usize, u64)| p.0 == id) {
                        picks.push((id, 1 + rng.below(6)));
                    }
                }
            }
            let (e, b) = (Arc::clone(&engine), Arc::clone(&book));
            resetter.run(move || {
                for (id, delay) in picks {
                    b.reset(&e, id, delay);
                }
            });
        }
        clock.advance(ms(1));
        engine.turn();
    }
    for _ in 0..10 {
        clock.advance(ms(1));
        engine.turn();
    }
    let reset = book.check("after the last turn", 0);
    assert!(reset > 500, "only {reset} timers were reset");
    shut_down_dropping_the_rest(&engine, &live, (armer, resetter));
}

/// Lets the model's threads go, then shuts `engine` down dropping what is pending: the
/// report drops exactly the timers its stats counted as neither cancelled nor fired before
/// the threads went, and every node and capture comes back.
fn shut_down_dropping_the_rest(engine: &TimerEngine, live: &Live, threads: impl Sized) {
    let stats = engine.stats();
    drop(threads);
    let report = engine.shutdown(PendingTimers::Drop);
    assert_eq!(
        report.dropped,
        stats.total.scheduled - stats.total.cancelled - stats.total.fired
    );
    support::assert_all_given_back(engine, live);
}

/// On a manual clock with two shards: two threads arm 150 long timers each a tick (a
/// quarter cancelled about 100 schedules later) while, at the same time, a third thread
/// resets a dozen of their timers (likely in the generations being taken back) to 1 to 3
/// ms from now; once all three are done, the engine is turned. A reset racing a reclaim
/// that holds its timer must still reach the turn at its tick: each reset timer runs at
/// exactly its ms, once, and no other runs.
#[test]
fn resets_racing_reclaims_run_at_their_exact_tick() {
    let (engine, clock) = support::manual(2);
    let engine = Arc::new(engine);
    const PER_TICK: usize = 150;
    const TICKS: usize = 80;
    const ARMERS: usize = 2;
    let book = Arc::new(ManualBook::new(&clock, PER_TICK * TICKS * ARMERS));
    let live = Live::default();
    let armers: Vec<Runner> = (0..ARMERS).map(|_| Runner::new()).collect();
    let resetter = Runner::new();
    let mut rng = Rng(32);
    let id_of = |armer: usize, tick: usize, k: usize| (tick * ARMERS + armer) * PER_TICK + k;
    for tick in 0..TICKS {
        let mut waits = Vec::new();
        for (a, armer) in armers.iter().enumerate() {
            let (e, b, l) = (Arc::clone(&engine), Arc::clone(&book), live.clone());
            waits.push(armer.start(move || {
                for k in 0..PER_TICK {
                    let id = id_of(a, tick, k);
                    let n = tick * PER_TICK + k;
                    b.arm(&e, id, &l, n % 4 == 0);
                    // A quarter of the timers this thread armed 100 schedules ago.
                    if n >= 100 && (n - 100) % 4 == 0 {
                        let old = n - 100;
                        b.cancel(&e, id_of(a, old / PER_TICK, old % PER_TICK));
                    }
                }
            }));
        }
        if tick >= 5 {
            let mut picks = Vec::new();
            for _ in 0..24 {
                let a = rng.below(ARMERS as u64) as usize;
                let age = 4 + rng.below(5) as usize;
                if age > tick {
                    continue;
                }
                let id = id_of(a, tick - age, rng.below(PER_TICK as u64) as usize);
                if book.resettable(id) && !picks.iter().any(|p: &(usize, u64, u64)| p.0 == id) {
                    picks.push((id, 1 + rng.below(3), rng.below(400)));
                }
                if picks.len() == 12 {
                    break;
                }
            }
            let (e, b) = (Arc::clone(&engine), Arc::clone(&book));
            waits.push(resetter.start(move || {
                let began = Instant::now();
                for (id, delay, at_us) in picks {
                    // Spread over the armers' work.
                    while began.elapsed() < Duration::from_micros(at_us) {
                        std::hint::spin_loop();
                    }
                    b.reset(&e, id, delay);
                }
            }));
        }
        for wait in waits {
            wait.recv_timeout(Duration::from_secs(30)).expect("done");
        }
        clock.advance(ms(1));
        engine.turn();
    }
    for _ in 0..10 {
        clock.advance(ms(1));
        engine.turn();
    }
    let reset = book.check("after the last turn", 0);
    assert!(reset > 500, "only {reset} timers were reset");
    shut_down_dropping_the_rest(&engine, &live, (armers, resetter));
}

/// On a manual clock, a turner thread turns the engine without pause while a thread arms
/// 150 long timers a tick (a quarter cancelled about 100 schedules later) and another
/// resets timers it armed moments ago (on its young stack, held by its reclaims) or a
/// generation ago, to 0 to 2 ms from now: the turns take the urgent ticks those resets
/// ask for while the arming thread may be holding the timers. Then the clock moves a
/// tick and the engine is turned once more. Each reset timer runs at its tick, or at the
/// latest at the next (when a turn of its tick raced the reclaim holding it), never
/// earlier, once; no other runs. (Without the reclaim's look again, a kept or parked timer
/// would wait for its stack's old need, up to 32 ticks.)
#[test]
fn resets_racing_reclaims_and_turns_run_by_the_next_tick() {
    let (engine, clock) = support::manual(1);
    let engine = Arc::new(engine);
    const PER_TICK: usize = 150;
    const TICKS: usize = 100;
    let book = Arc::new(ManualBook::new(&clock, PER_TICK * TICKS));
    let live = Live::default();
    let (armer, resetter) = (Runner::new(), Runner::new());
    let mut rng = Rng(33);
    let armed = Arc::new(AtomicUsize::new(0));
    let mut slack = Vec::new();
    std::thread::scope(|scope| {
        for tick in 0..TICKS {
            let busy = Arc::new(AtomicUsize::new(2));
            let (e, b, l, n, d) = (
                Arc::clone(&engine),
                Arc::clone(&book),
                live.clone(),
                Arc::clone(&armed),
                Arc::clone(&busy),
            );
            let arming = armer.start(move || {
                for k in 0..PER_TICK {
                    let id = tick * PER_TICK + k;
                    b.arm(&e, id, &l, id % 4 == 0);
                    n.store(id + 1, Ordering::SeqCst);
                    if id >= 100 && (id - 100) % 4 == 0 {
                        b.cancel(&e, id - 100);
                    }
                }
                d.fetch_sub(1, Ordering::SeqCst);
            });
            let (e, b, n, d) = (
                Arc::clone(&engine),
                Arc::clone(&book),
                Arc::clone(&armed),
                Arc::clone(&busy),
            );
            let seed = rng.next();
            let resetting = resetter.start(move || {
                let mut rng = Rng(seed);
                for _ in 0..12 {
                    // Now and then while the armer works: a timer armed within its last
                    // 130 schedules, or 4 to 8 ticks ago.
                    let began = Instant::now();
                    while began.elapsed() < Duration::from_micros(rng.below(40))
                        && d.load(Ordering::SeqCst) == 2
                    {
                        std::hint::spin_loop();
                    }
                    let upto = n.load(Ordering::SeqCst);
                    let back = if rng.percent(60) {
                        1 + rng.below(130)
                    } else {
                        (4 + rng.below(5)) * PER_TICK as u64
                    } as usize;
                    if upto < back {
                        continue;
                    }
                    let id = upto - back;
                    if b.resettable(id) {
                        b.reset(&e, id, rng.below(3));
                    }
                }
                d.fetch_sub(1, Ordering::SeqCst);
            });
            let (e, d) = (Arc::clone(&engine), Arc::clone(&busy));
            let turner = scope.spawn(move || {
                while d.load(Ordering::SeqCst) > 0 {
                    e.turn();
                }
            });
            arming.recv_timeout(Duration::from_secs(30)).unwrap();
            resetting.recv_timeout(Duration::from_secs(30)).unwrap();
            turner.join().unwrap();
            clock.advance(ms(1));
            engine.turn();
        }
    });
    for _ in 0..40 {
        clock.advance(ms(1));
        engine.turn();
    }
    let mut reset = 0;
    let mut wrong = Vec::new();
    for id in 0..PER_TICK * TICKS {
        let (due, runs, at) = (
            book.due[id].load(Ordering::SeqCst),
            book.runs[id].load(Ordering::SeqCst),
            book.ran_at[id].load(Ordering::SeqCst),
        );
        if due == u64::MAX {
            if runs != 0 {
                wrong.push(format!("{id}: never reset, ran {runs} times"));
            }
            continue;
        }
        reset += 1;
        if runs != 1 || at < due || at > due + 1 {
            wrong.push(format!(
                "{id}: due at {due} ms, ran {runs} times, last at {at} ms"
            ));
        } else {
            slack.push(at - due);
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(20)]
    );
    assert!(reset > 300, "only {reset} timers were reset");
    eprintln!(
        "manual race: {reset} resets, {} of them run a tick after their deadline",
        slack.iter().filter(|&&s| s == 1).count()
    );
    shut_down_dropping_the_rest(&engine, &live, (armer, resetter));
}

/// On a manual clock, rounds of: a thread arms long timers (it arms nothing else, so it
/// knows which of its calls reclaim its lane: once 64 pushes are on it) up to its second
/// reclaim of the round, cancelling a quarter of those armed before the first (which that
/// reclaim kept); the second reclaim then parks those and
/// keeps the 64 armed since, the last of which it takes first. As that call begins, a
/// second thread resets that last timer to now and turns the engine at once, taking the
/// urgent tick the reset asks for while the reclaim may hold the timer. Then the clock
/// moves a tick, and the engine turns. The reset timer must have run by
/// then: a kept timer whose deadline moved while its thread held it goes back on the
/// young stack with the need of its old deadline (due in 32 ticks), and only the
/// reclaim's look again (`look_again`) asks for the urgent tick anew.
#[test]
fn a_kept_timer_reset_while_its_reclaim_holds_it_runs_by_the_next_tick() {
    let (engine, clock) = support::manual(1);
    let engine = Arc::new(engine);
    const ROUNDS: usize = 150;
    const SLOTS: usize = 140;
    let book = Arc::new(ManualBook::new(&clock, SLOTS * ROUNDS));
    let live = Live::default();
    let (armer, resetter) = (Runner::new(), Runner::new());
    let mut rng = Rng(34);
    let mut late = Vec::new();
    // Pushes onto the armer's lane since its last reclaim.
    let pushes = Arc::new(AtomicUsize::new(0));
    let mut racing_calls = Vec::new();
    // Rounds whose reset and turn both fell inside the racing call.
    let mut raced = 0;
    for round in 0..ROUNDS {
        let first = round * SLOTS;
        let in_call = Arc::new(AtomicBool::new(false));
        let busy = Arc::new(AtomicUsize::new(2));
        // The timer to reset: the last armed before the racing call.
        let target = Arc::new(AtomicUsize::new(usize::MAX));
        let (e, b, l, c, d, p, x) = (
            Arc::clone(&engine),
            Arc::clone(&book),
            live.clone(),
            Arc::clone(&in_call),
            Arc::clone(&busy),
            Arc::clone(&pushes),
            Arc::clone(&target),
        );
        let arming = armer.start(move || {
            let mut k = 0;
            let mut reclaims = 0;
            let mut took = Duration::ZERO;
            loop {
                let reclaiming = p.load(Ordering::SeqCst) >= 64;
                let racing = reclaiming && reclaims == 1;
                if racing {
                    x.store(first + k - 1, Ordering::SeqCst);
                    c.store(true, Ordering::SeqCst);
                }
                let began = Instant::now();
                b.arm(
                    &e,
                    first + k,
                    &l,
                    reclaims == 0 && !reclaiming && k % 4 == 0,
                );
                took = took.max(began.elapsed());
                c.store(false, Ordering::SeqCst);
                p.store(
                    if reclaiming {
                        1
                    } else {
                        p.load(Ordering::SeqCst) + 1
                    },
                    Ordering::SeqCst,
                );
                k += 1;
                if racing {
                    break;
                }
                if reclaiming {
                    reclaims += 1;
                    // Kept by that reclaim: caught by the next.
                    for j in (0..k - 1).step_by(4) {
                        b.cancel(&e, first + j);
                    }
                }
                assert!(k < SLOTS, "the armer's lane never reclaimed");
            }
            d.fetch_sub(1, Ordering::SeqCst);
            let _ = took;
        });
        let (e, b, c, d, x) = (
            Arc::clone(&engine),
            Arc::clone(&book),
            Arc::clone(&in_call),
            Arc::clone(&busy),
            Arc::clone(&target),
        );
        let offset = Duration::from_nanos(rng.below(4_000));
        let resetting = resetter.start(move || {
            // Until the racing call begins (or, missed, the armer is done).
            while !c.load(Ordering::SeqCst) && d.load(Ordering::SeqCst) == 2 {
                std::hint::spin_loop();
            }
            let began = Instant::now();
            while began.elapsed() < offset {
                std::hint::spin_loop();
            }
            let inside = c.load(Ordering::SeqCst);
            b.reset(&e, x.load(Ordering::SeqCst), 0);
            // The turn that takes the urgent tick, right after the reset.
            e.turn();
            d.fetch_sub(1, Ordering::SeqCst);
            inside && c.load(Ordering::SeqCst)
        });
        arming.recv_timeout(Duration::from_secs(30)).unwrap();
        if resetting.recv_timeout(Duration::from_secs(30)).unwrap() {
            raced += 1;
        }
        clock.advance(ms(1));
        engine.turn();
        let id = target.load(Ordering::SeqCst);
        racing_calls.push(id);
        if book.runs[id].load(Ordering::SeqCst) != 1 {
            late.push((
                round,
                id,
                book.due[id].load(Ordering::SeqCst),
                book.now_ms(),
            ));
        }
        // A few quiet ticks between rounds.
        for _ in 0..3 {
            clock.advance(ms(1));
            engine.turn();
        }
    }
    assert!(
        late.is_empty(),
        "reset timers (round, id, due ms, now ms) not run by the next tick, {} of \
         {ROUNDS}: {late:?}",
        late.len()
    );
    eprintln!(
        "kept timer race: reset and turn inside the reclaiming call in {raced} of {ROUNDS} rounds"
    );
    for _ in 0..40 {
        clock.advance(ms(1));
        engine.turn();
    }
    book.check("after the rounds", 1);
    shut_down_dropping_the_rest(&engine, &live, (armer, resetter));
}

// ---------------------------------------------------------------------------------------
// Urgency on the real clock: resets racing the take-back of large old generations.
// ---------------------------------------------------------------------------------------

/// Every timer of the urgency stress: when it ran, how often, and what was asked of it.
struct Book {
    base: Instant,
    /// Nanoseconds after `base` of its (first) run, 0 if none.
    ran_at: Vec<AtomicU64>,
    runs: Vec<AtomicU64>,
    /// Nanoseconds after `base` at which a successful reset began, 0 if none.
    reset_at: Vec<AtomicU64>,
    cancelled: Vec<AtomicBool>,
    /// The delay that reset asked for, in ns (0: a deadline already past).
    reset_delay: Vec<AtomicU64>,
    /// For a reset made during a reclaim of its arming thread: the nanosecond that
    /// reclaim began (its `schedule` call), to find when it ended; 0 otherwise.
    reset_during: Vec<AtomicU64>,
    /// The arming thread of each id.
    thread_of: Vec<AtomicU64>,
}

impl Book {
    fn new(n: usize) -> Self {
        let v = |n| (0..n).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        Self {
            base: Instant::now(),
            ran_at: v(n),
            runs: v(n),
            reset_at: v(n),
            cancelled: (0..n).map(|_| AtomicBool::new(false)).collect(),
            reset_during: v(n),
            reset_delay: v(n),
            thread_of: v(n),
        }
    }

    fn nanos(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }
}

/// One arming thread's log, for the resetters: (id, handle, scheduled at in ns since base).
#[derive(Default)]
struct Log {
    entries: Mutex<Vec<(usize, TimerHandle, u64)>>,
    /// The thread expects its next reclaim to take an old generation back (the last one
    /// was at least three ticks ago).
    expect_take_back: AtomicBool,
    /// Nanoseconds since base at which the thread's current reclaiming `schedule` call
    /// began (it pushes nothing else onto its lane, so it knows which calls reclaim: the
    /// first with 64 pushes since the last), 0 when not in one.
    in_reclaim_since: AtomicU64,
    /// A triggered callback is running on the worker, waiting for the take-back.
    trigger_running: AtomicBool,
    /// Reclaiming calls that took an old generation back, and how long each took (µs).
    take_back_us: Mutex<Vec<u64>>,
    /// Every reclaiming call: when it began and ended (ns since base).
    reclaims: Mutex<Vec<(u64, u64)>>,
}

/// How an arming thread waits out the rest of each tick once it has armed its timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pace {
    /// It sleeps (and, waking, is seldom preempted in its short bursts of work).
    Sleep,
    /// It spins, so that it is always runnable and preempted at any point of its work,
    /// the middle of a take-back included, when it shares its CPU.
    Spin,
    /// It does not wait: it arms as fast as it can (CPU-bound, preempted anywhere).
    Flat,
}

/// Which timers a canceller cancels (about 100 schedules after they were armed, while
/// their lane holds them back): this many in 20 (the others are never cancelled, and are
/// the ones resets pick).
#[derive(Debug, Clone, Copy)]
struct Cancels(usize);

impl Cancels {
    fn cancels(self, id: usize) -> bool {
        id % 20 < self.0
    }
}

/// Who resets timers in the middle of a take-back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resetter {
    /// A helper thread per arming thread, spinning on the arming thread's signals.
    Thread,
    /// A one-shot callback the arming thread schedules (due at once) just before its
    /// take-back: it runs on the worker, waits for the take-back to begin, resets, and
    /// returns, so that the worker's next look (which takes the urgent tick) follows the
    /// resets within microseconds, while the arming thread may still hold them.
    Trigger,
    /// A helper thread as in `Thread`, which also wakes a thread that shares the arming
    /// thread's CPU as the take-back begins: woken from a sleep, it preempts the arming
    /// thread and spins for a while, so that the arming thread holds the timers of the
    /// generation it is taking back for that long, while the resets are made and the
    /// worker takes the urgent tick, plans, and goes back to sleep.
    Freeze,
}

struct StressConfig {
    workers: usize,
    tick: Duration,
    arming_threads: usize,
    /// Timers each arming thread schedules per tick.
    per_tick: usize,
    /// How the arming threads keep their pace.
    pace: Pace,
    run_for: Duration,
    /// How far into a take-back a burst of resets lands: up to this many µs after it began.
    offset_us: u64,
    burst: usize,
    /// Ticks a resetter rests after a burst (or an arming thread between triggers): the
    /// worker's wake-ups for the resets must not put it into close sleep, where it wakes
    /// every few ticks anyway.
    cooldown: u32,
    resetter: Resetter,
    /// The ages, in ticks, of the timers a burst resets.
    age: (u64, u64),
    /// Threads that only spin, so that the arming threads are preempted now and then in
    /// the middle of a take-back, holding its timers for a whole time slice.
    hogs: usize,
    /// Pins the arming threads and the hogs to the first CPU (the workers and resetters
    /// are left to the others).
    pin_arming: bool,
    cancels: Cancels,
    /// How long a freezer spins (`Resetter::Freeze`).
    freeze: Duration,
    /// The delay each reset asks for, drawn in this range of µs; `None`: a deadline a
    /// tick past, so that the worker takes the urgent tick at once.
    delay_us: Option<(u64, u64)>,
}

/// The lateness (ns from the reset to the run; each reset asked for a deadline already
/// past) of every reset timer, sorted.
struct StressOutcome {
    lateness: Vec<u64>,
    /// The same, from the end of the reclaim the reset raced (when its thread let go of
    /// the timer) if that was later: what the worker adds.
    after_release: Vec<u64>,
    resets: usize,
    bursts: usize,
    scheduled: u64,
    late_stat: u64,
    /// Take-backs seen, and their durations in µs: p10, p50, p90, max.
    take_backs: usize,
    take_back_us: [u64; 4],
}

fn quantile(sorted: &[u64], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    Duration::from_nanos(sorted[i])
}

fn count_over(sorted: &[u64], d: Duration) -> usize {
    let d = d.as_nanos() as u64;
    sorted.iter().filter(|&&l| l > d).count()
}

impl StressOutcome {
    fn report(&self, what: &str, tick: Duration) {
        eprintln!(
            "{what}: {} scheduled, {} take-backs (p10/p50/p90/max {:?} µs), {} resets in {} \
             bursts; stats late {}",
            self.scheduled,
            self.take_backs,
            self.take_back_us,
            self.resets,
            self.bursts,
            self.late_stat,
        );
        for (name, l) in [
            ("from the reset", &self.lateness),
            ("from the reclaim's end", &self.after_release),
        ] {
            eprintln!(
                "    lateness {name}: p50 {:?} p90 {:?} p99 {:?} max {:?}; over 1 tick {}, \
                 over 2 ticks {}, over 4 ticks {}",
                quantile(l, 0.5),
                quantile(l, 0.9),
                quantile(l, 0.99),
                quantile(l, 1.0),
                count_over(l, tick),
                count_over(l, tick * 2),
                count_over(l, tick * 4),
            );
        }
    }
}

/// How a burst of resets is made, by a helper thread or by a triggered callback.
#[derive(Clone)]
struct Burster {
    burst: usize,
    offset_ns: u64,
    tick: Duration,
    tick_ns: u64,
    /// The ages, in ticks, of the timers a burst resets.
    age: (u64, u64),
    cancels: Cancels,
    /// The delay a reset asks for, in µs (drawn in this range), or `None` for a deadline
    /// already past.
    delay_us: Option<(u64, u64)>,
    /// Burst only once the reclaim has lasted `offset_ns` (a fixed offset, not a random
    /// one up to it): a thread resetter waits for a take-back preempted in the middle.
    fixed_offset: bool,
}

impl Burster {
    /// Waits a moment: a thread resetter sleeps, leaving its CPU to the worker; a callback
    /// spins (the worker must look right after it).
    fn pause(&self) {
        if self.fixed_offset {
            std::thread::sleep(Duration::from_micros(20));
        } else {
            std::hint::spin_loop();
        }
    }

    /// Waits (spinning, at most `max_wait`) for the arming thread of `log` to enter a
    /// reclaim it expects to take an old generation back, then for a random offset into
    /// it, then resets a burst of its timers likely in that generation to a deadline
    /// already past. Whether it reset any.
    fn burst(
        &self,
        engine: &TimerEngine,
        (log, book): (&Log, &Book),
        rng: &mut Rng,
        resets: &AtomicUsize,
        max_wait: Duration,
    ) -> bool {
        let until = Instant::now() + max_wait;
        let since = loop {
            let since = log.in_reclaim_since.load(Ordering::SeqCst);
            if since != 0 && log.expect_take_back.load(Ordering::SeqCst) {
                break since;
            }
            if Instant::now() > until {
                return false;
            }
            self.pause();
        };
        let offset = if self.fixed_offset {
            self.offset_ns
        } else {
            rng.below(self.offset_ns + 1)
        };
        while book.nanos() < since + offset && log.in_reclaim_since.load(Ordering::SeqCst) == since
        {
            self.pause();
        }
        if log.in_reclaim_since.load(Ordering::SeqCst) != since {
            return false;
        }
        // Timers likely in the generation being taken back (parked one to two horizons
        // ago), not cancelled (ids 0 mod 4 are), not reset yet.
        let mut picked: Vec<(usize, TimerHandle)> = Vec::with_capacity(self.burst);
        {
            let entries = log.entries.lock().unwrap();
            let now = book.nanos();
            let lo = entries.partition_point(|e| e.2 + self.age.1 * self.tick_ns < now);
            let hi = entries.partition_point(|e| e.2 + self.age.0 * self.tick_ns < now);
            if hi > lo {
                for _ in 0..self.burst * 4 {
                    let e = entries[lo + rng.below((hi - lo) as u64) as usize];
                    if !self.cancels.cancels(e.0)
                        && book.reset_at[e.0].load(Ordering::SeqCst) == 0
                        && !picked.iter().any(|p| p.0 == e.0)
                    {
                        picked.push((e.0, e.1));
                    }
                    if picked.len() == self.burst {
                        break;
                    }
                }
            }
        }
        for &(id, handle) in &picked {
            let start = book.nanos().max(1);
            book.reset_during[id].store(since, Ordering::SeqCst);
            let delay = self.delay_us.map(|(lo, hi)| lo + rng.below(hi - lo + 1));
            // Written before the reset: the timer may run before it returns.
            book.reset_delay[id].store(delay.unwrap_or(0) * 1000, Ordering::SeqCst);
            book.reset_at[id].store(start, Ordering::SeqCst);
            let ok = match delay {
                Some(delay) => engine.reset(handle, Duration::from_micros(delay)),
                // Due a tick ago: urgent at once.
                None => engine.reset_at(handle, Instant::now() - self.tick),
            };
            assert!(ok, "timer {id} was pending, 120 s out, never reset");
            resets.fetch_add(1, Ordering::Relaxed);
        }
        !picked.is_empty()
    }
}

/// Threads arm long timers (120 s) at a steady pace, and nothing else on their lanes (so
/// each knows which of its `schedule` calls reclaims); a helper per thread cancels a
/// quarter of them about 100 schedules later, and the lane
/// parks hundreds of timers in each old generation. When a thread's reclaim takes a
/// generation back, a burst of resets (by a helper thread, or by a callback the thread
/// triggered on the worker) moves a few of its timers to a deadline already past, so that
/// the worker takes the urgent tick at once, while the thread may still hold them.
/// Asserts never early, exactly once, nothing lost; returns the lateness of the resets.
fn urgency_stress(config: &StressConfig) -> StressOutcome {
    const LONG: Duration = Duration::from_secs(120);
    // Room for twice the run: it may be extended (below).
    let per_thread = if config.pace == Pace::Flat {
        2 * config.run_for.as_millis() as usize * 1000 + 1024
    } else {
        2 * (config.run_for.as_nanos() / config.tick.as_nanos()) as usize * (config.per_tick + 2)
            + 1024
    };
    let total_ids = per_thread * config.arming_threads;
    let book = Arc::new(Book::new(total_ids));
    let live = Live::default();
    let engine = Arc::new(
        TimerEngine::builder()
            .workers(config.workers)
            .pin_workers(false)
            .tick(config.tick)
            .build()
            .unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let logs: Vec<Arc<Log>> = (0..config.arming_threads)
        .map(|_| Arc::new(Log::default()))
        .collect();
    let scheduled = Arc::new(AtomicU64::new(0));
    let bursts = Arc::new(AtomicUsize::new(0));
    let resets = Arc::new(AtomicUsize::new(0));
    // Triggered callbacks scheduled, and their runs.
    let triggers = Arc::new(AtomicU64::new(0));
    let trigger_runs = Arc::new(AtomicU64::new(0));
    let tick_ns = config.tick.as_nanos() as u64;
    let burster = Burster {
        burst: config.burst,
        offset_ns: config.offset_us * 1000,
        tick: config.tick,
        tick_ns,
        age: config.age,
        fixed_offset: config.resetter == Resetter::Thread,
        cancels: config.cancels,
        delay_us: config.delay_us,
    };

    std::thread::scope(|scope| {
        for (t, log) in logs.iter().enumerate() {
            let (engine, book, stop, live) = (
                Arc::clone(&engine),
                Arc::clone(&book),
                Arc::clone(&stop),
                live.clone(),
            );
            let (scheduled, triggers, trigger_runs, resets, bursts) = (
                Arc::clone(&scheduled),
                Arc::clone(&triggers),
                Arc::clone(&trigger_runs),
                Arc::clone(&resets),
                Arc::clone(&bursts),
            );
            let (per_tick, tick, resetter) = (config.per_tick, config.tick, config.resetter);
            let pace = config.pace;
            let cooldown_ns = u64::from(config.cooldown) * tick_ns;
            let burster = burster.clone();
            let log = Arc::clone(log);
            let pin = config.pin_arming;
            scope.spawn(move || {
                if pin {
                    pin_to_first_core();
                }
                let first = t * per_thread;
                let mut n = 0_usize;
                // Pushes onto this thread's lane since its last reclaim (`Lane::wants_claim`
                // reclaims before the push once there are 64).
                let mut pushes = 0_usize;
                let mut next_slot = Instant::now();
                let mut last_take_back = 0_u64;
                let mut triggered = false;
                let mut last_trigger = 0_u64;
                let mut seed = 0xbeef + t as u64;
                while !stop.load(Ordering::Relaxed) && n + per_tick < per_thread {
                    for _ in 0..per_tick {
                        let expect = book.nanos() >= last_take_back + 3 * tick_ns;
                        log.expect_take_back.store(expect, Ordering::SeqCst);
                        if resetter == Resetter::Trigger
                            && expect
                            && !triggered
                            && pushes == 63
                            && book.nanos() >= last_trigger + cooldown_ns
                        {
                            last_trigger = book.nanos();
                            // Push 64: the next call reclaims. The callback, due at once,
                            // wakes the worker, which runs it before that call begins.
                            triggered = true;
                            seed += 1;
                            let (book, trigger_log, weak) =
                                (Arc::clone(&book), Arc::clone(&log), Arc::downgrade(&engine));
                            let (burster, resets, bursts, runs) = (
                                burster.clone(),
                                Arc::clone(&resets),
                                Arc::clone(&bursts),
                                Arc::clone(&trigger_runs),
                            );
                            log.trigger_running.store(false, Ordering::SeqCst);
                            engine
                                .schedule_at(Instant::now() - tick, move || {
                                    runs.fetch_add(1, Ordering::SeqCst);
                                    let log = &trigger_log;
                                    log.trigger_running.store(true, Ordering::SeqCst);
                                    let Some(engine) = weak.upgrade() else {
                                        return;
                                    };
                                    let mut rng = Rng(seed);
                                    if burster.burst(
                                        &engine,
                                        (log, &book),
                                        &mut rng,
                                        &resets,
                                        Duration::from_millis(20),
                                    ) {
                                        bursts.fetch_add(1, Ordering::Relaxed);
                                    }
                                })
                                .expect("scheduled");
                            triggers.fetch_add(1, Ordering::Relaxed);
                            pushes += 1;
                            eventually(Duration::from_millis(50), || {
                                log.trigger_running.load(Ordering::SeqCst)
                            });
                        }
                        let id = first + n;
                        let witness = live.witness();
                        let b = Arc::clone(&book);
                        let reclaims = pushes >= 64;
                        let started = book.nanos();
                        if reclaims {
                            log.in_reclaim_since.store(started, Ordering::SeqCst);
                        }
                        let handle = engine
                            .schedule(LONG, move || {
                                let _ = &witness;
                                b.ran_at[id].store(b.nanos(), Ordering::SeqCst);
                                b.runs[id].fetch_add(1, Ordering::SeqCst);
                            })
                            .expect("scheduled");
                        pushes = if reclaims { 1 } else { pushes + 1 };
                        if reclaims {
                            log.in_reclaim_since.store(0, Ordering::SeqCst);
                            let ended = book.nanos();
                            log.reclaims.lock().unwrap().push((started, ended));
                            let took = ended - started;
                            if took > 20_000 {
                                log.take_back_us.lock().unwrap().push(took / 1000);
                                last_take_back = started;
                                triggered = false;
                            }
                        }
                        n += 1;
                        book.thread_of[id].store(t as u64, Ordering::Relaxed);
                        log.entries.lock().unwrap().push((id, handle, started));
                    }
                    scheduled.fetch_add(per_tick as u64, Ordering::Relaxed);
                    if pace == Pace::Flat {
                        continue;
                    }
                    next_slot += tick;
                    let now = Instant::now();
                    if next_slot <= now {
                        next_slot = now;
                    } else if pace == Pace::Sleep {
                        std::thread::sleep(next_slot - now);
                    } else {
                        while Instant::now() < next_slot && !stop.load(Ordering::Relaxed) {
                            std::hint::spin_loop();
                        }
                    }
                }
                log.expect_take_back.store(false, Ordering::SeqCst);
            });
        }
        // Per arming thread: a canceller, and a resetter when resets come from a thread.
        for (t, log) in logs.iter().enumerate() {
            let (c_engine, c_book, c_stop) =
                (Arc::clone(&engine), Arc::clone(&book), Arc::clone(&stop));
            let cancels = config.cancels;
            scope.spawn(move || {
                let (engine, book, stop) = (c_engine, c_book, c_stop);
                let mut cancelled_upto = 0_usize;
                while !stop.load(Ordering::Relaxed) {
                    // Once 100 later ones are scheduled: on the lane still, or parked.
                    {
                        let entries = log.entries.lock().unwrap();
                        while cancelled_upto + 100 < entries.len() {
                            let (id, handle, _) = entries[cancelled_upto];
                            cancelled_upto += 1;
                            if cancels.cancels(id) {
                                book.cancelled[id].store(true, Ordering::SeqCst);
                                assert!(engine.cancel(handle), "a timer 120 s out was pending");
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
            });
            if config.resetter == Resetter::Trigger {
                continue;
            }
            // The freezer: shares the arming thread's CPU, sleeps until woken, then spins.
            let freezer = (config.resetter == Resetter::Freeze).then(|| {
                let stop = Arc::clone(&stop);
                let freeze = config.freeze;
                scope.spawn(move || {
                    pin_to_first_core();
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::park();
                        let until = Instant::now() + freeze;
                        while Instant::now() < until {
                            std::hint::spin_loop();
                        }
                    }
                })
            });
            let freezer = freezer.map(|handle| handle.thread().clone());
            let (engine, book, stop, bursts, resets) = (
                Arc::clone(&engine),
                Arc::clone(&book),
                Arc::clone(&stop),
                Arc::clone(&bursts),
                Arc::clone(&resets),
            );
            let burster = burster.clone();
            let cooldown_ns = u64::from(config.cooldown) * tick_ns;
            scope.spawn(move || {
                let mut rng = Rng(0x5eed + t as u64);
                while !stop.load(Ordering::Relaxed) {
                    if !log.expect_take_back.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_micros(50));
                        continue;
                    }
                    let wait = burster.tick * 2;
                    if let Some(freezer) = &freezer {
                        // As soon as the take-back begins.
                        let until = Instant::now() + wait;
                        while log.in_reclaim_since.load(Ordering::SeqCst) == 0
                            && log.expect_take_back.load(Ordering::SeqCst)
                            && Instant::now() < until
                        {
                            std::hint::spin_loop();
                        }
                        if log.in_reclaim_since.load(Ordering::SeqCst) != 0 {
                            freezer.unpark();
                        }
                    }
                    if burster.burst(&engine, (log, &book), &mut rng, &resets, wait) {
                        bursts.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_nanos(cooldown_ns));
                    }
                }
                if let Some(freezer) = freezer {
                    freezer.unpark();
                }
            });
        }
        for _ in 0..config.hogs {
            let stop = Arc::clone(&stop);
            let pin = config.pin_arming;
            scope.spawn(move || {
                if pin {
                    pin_to_first_core();
                }
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
        }
        std::thread::sleep(config.run_for);
        // On a loaded machine the bursts may seldom meet a take-back: a little longer.
        let extra = Instant::now() + config.run_for;
        while resets.load(Ordering::Relaxed) < 30 && Instant::now() < extra {
            std::thread::sleep(ms(50));
        }
        stop.store(true, Ordering::SeqCst);
    });

    // Every reset timer runs, exactly once, and never before its reset (the deadline it
    // asked for had passed already).
    let reset_ids: Vec<usize> = (0..total_ids)
        .filter(|&id| book.reset_at[id].load(Ordering::SeqCst) != 0)
        .collect();
    let all_ran = eventually(Duration::from_secs(20), || {
        reset_ids
            .iter()
            .all(|&id| book.runs[id].load(Ordering::SeqCst) > 0)
    });
    let missing: Vec<usize> = reset_ids
        .iter()
        .copied()
        .filter(|&id| book.runs[id].load(Ordering::SeqCst) == 0)
        .collect();
    assert!(all_ran, "reset timers never ran: {missing:?}");
    let triggers_n = triggers.load(Ordering::SeqCst);
    assert!(
        eventually(Duration::from_secs(20), || trigger_runs
            .load(Ordering::SeqCst)
            == triggers_n),
        "a triggered callback never ran"
    );
    let late_stat = engine.stats().total.late;
    let report = engine.shutdown(PendingTimers::Drop);
    let mut lateness = Vec::with_capacity(reset_ids.len());
    let mut after_release = Vec::with_capacity(reset_ids.len());
    let mut ran_total = 0;
    for id in 0..total_ids {
        let runs = book.runs[id].load(Ordering::SeqCst);
        ran_total += runs;
        let reset = book.reset_at[id].load(Ordering::SeqCst);
        if reset == 0 {
            assert_eq!(runs, 0, "timer {id}, never reset, ran before its 120 s");
            continue;
        }
        assert_eq!(runs, 1, "timer {id} ran {runs} times");
        assert!(
            !book.cancelled[id].load(Ordering::SeqCst),
            "timer {id} was cancelled and reset"
        );
        let ran = book.ran_at[id].load(Ordering::SeqCst);
        // `reset` (with a delay: never before it; a deadline already past: any time after).
        let due = reset + book.reset_delay[id].load(Ordering::SeqCst);
        assert!(
            ran >= due,
            "timer {id} ran {} ns before the deadline its reset asked for",
            due - ran
        );
        lateness.push(ran - due);
        // Measured from when its thread could have let go of it: the end of the reclaim
        // the reset raced, if later than the reset.
        let during = book.reset_during[id].load(Ordering::SeqCst);
        let log = &logs[book.thread_of[id].load(Ordering::Relaxed) as usize];
        let reclaims = log.reclaims.lock().unwrap();
        let ended = reclaims
            .binary_search_by_key(&during, |r| r.0)
            .map_or(0, |i| reclaims[i].1);
        after_release.push(ran.saturating_sub(due.max(ended)));
    }
    lateness.sort_unstable();
    after_release.sort_unstable();
    let stats = engine.stats().total;
    let scheduled_n = scheduled.load(Ordering::Relaxed);
    let cancelled_n = (0..total_ids)
        .filter(|&id| book.cancelled[id].load(Ordering::SeqCst))
        .count() as u64;
    assert_eq!(stats.scheduled, scheduled_n + triggers_n);
    assert_eq!(stats.cancelled, cancelled_n);
    assert_eq!(stats.fired, ran_total + triggers_n);
    assert_eq!(
        report.dropped,
        scheduled_n - cancelled_n - ran_total,
        "every timer neither cancelled nor run was dropped by the shutdown"
    );
    support::assert_all_given_back(&engine, &live);
    let mut take_back_us: Vec<u64> = logs
        .iter()
        .flat_map(|l| l.take_back_us.lock().unwrap().clone())
        .collect();
    take_back_us.sort_unstable();
    let at = |q: f64| {
        take_back_us
            .get(((take_back_us.len().max(1) - 1) as f64 * q) as usize)
            .copied()
            .unwrap_or(0)
    };
    StressOutcome {
        resets: resets.load(Ordering::Relaxed),
        bursts: bursts.load(Ordering::Relaxed),
        scheduled: scheduled_n,
        late_stat,
        take_backs: take_back_us.len(),
        take_back_us: [at(0.1), at(0.5), at(0.9), at(1.0)],
        lateness,
        after_release,
    }
}

/// Pins the calling thread to the first CPU, if it can.
fn pin_to_first_core() {
    if let Some(core) = core_affinity::get_core_ids().and_then(|ids| ids.first().copied()) {
        core_affinity::set_for_current(core);
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `base` with any `URGENCY_STRESS_*` variable set in the environment in its place (to
/// run the stress longer or shaped otherwise, here or on another build).
fn with_env(base: StressConfig) -> StressConfig {
    StressConfig {
        workers: env_or("URGENCY_STRESS_WORKERS", base.workers),
        tick: Duration::from_micros(env_or(
            "URGENCY_STRESS_TICK_US",
            base.tick.as_micros() as u64,
        )),
        arming_threads: env_or("URGENCY_STRESS_THREADS", base.arming_threads),
        per_tick: env_or("URGENCY_STRESS_PER_TICK", base.per_tick),
        pace: match env_or("URGENCY_STRESS_PACE", 9) {
            0 => Pace::Sleep,
            1 => Pace::Spin,
            2 => Pace::Flat,
            _ => base.pace,
        },
        run_for: ms(env_or("URGENCY_STRESS_MS", base.run_for.as_millis() as u64)),
        offset_us: env_or("URGENCY_STRESS_OFFSET_US", base.offset_us),
        burst: env_or("URGENCY_STRESS_BURST", base.burst),
        cooldown: env_or("URGENCY_STRESS_COOLDOWN", base.cooldown),
        resetter: base.resetter,
        age: (
            env_or("URGENCY_STRESS_AGE_LO", base.age.0),
            env_or("URGENCY_STRESS_AGE_HI", base.age.1),
        ),
        hogs: env_or("URGENCY_STRESS_HOGS", base.hogs),
        pin_arming: env_or("URGENCY_STRESS_PIN", u8::from(base.pin_arming)) == 1,
        cancels: Cancels(env_or("URGENCY_STRESS_CANCEL_OF_20", base.cancels.0)),
        freeze: Duration::from_micros(env_or(
            "URGENCY_STRESS_FREEZE_US",
            base.freeze.as_micros() as u64,
        )),
        delay_us: match (
            env_or("URGENCY_STRESS_DELAY_LO_US", u64::MAX),
            env_or("URGENCY_STRESS_DELAY_HI_US", u64::MAX),
        ) {
            (u64::MAX, _) | (_, u64::MAX) => base.delay_us,
            (lo, hi) => Some((lo, hi.max(lo))),
        },
    }
}

/// Two threads arming 100 timers a 1 ms tick (sleeping out the rest of it), a quarter
/// cancelled while held: old generations of about 150 pending timers each, taken back
/// every 4 ticks in 30 to 100 µs (debug build).
fn paced(resetter: Resetter, run_for: Duration) -> StressConfig {
    StressConfig {
        workers: 1,
        tick: ms(1),
        arming_threads: 2,
        per_tick: 100,
        pace: Pace::Sleep,
        run_for,
        offset_us: 100,
        burst: 3,
        cooldown: 4,
        resetter,
        age: (4, 9),
        hogs: 0,
        pin_arming: false,
        cancels: Cancels(5),
        freeze: Duration::ZERO,
        delay_us: None,
    }
}

/// Runs the urgency stress until a burst of resets has met a take-back, at most three
/// times: each run's checks of correctness hold whatever it met, but on a machine loaded by
/// the other stresses of this file (the test harness runs them side by side) a run's
/// bursts can miss every take-back, and a run that tested nothing should not pass for one
/// that did.
fn stress_until_resets_meet_take_backs(config: &StressConfig, label: &str) {
    for attempt in 1..=3 {
        let outcome = urgency_stress(config);
        outcome.report(&format!("{label}, run {attempt}"), config.tick);
        if outcome.resets > 0 {
            return;
        }
    }
    panic!("{label}: no burst of resets met a take-back in three runs");
}

/// A resetter on the worker: a triggered callback resets a few timers of the generation
/// being taken back while its thread walks it, and the worker's next look takes the
/// urgent tick within microseconds. Never early, exactly once, nothing lost; the lateness
/// is printed (run with `--nocapture`).
#[test]
fn resets_from_a_callback_racing_take_backs_fire_once_never_early() {
    let config = with_env(paced(Resetter::Trigger, ms(2500)));
    stress_until_resets_meet_take_backs(&config, "urgency stress (trigger)");
}

/// Resetter threads, watching their arming thread's take-backs, reset timers to 1 to 5
/// ms from now.
#[test]
fn resets_from_threads_racing_take_backs_fire_once_never_early() {
    let mut base = paced(Resetter::Thread, ms(2000));
    base.offset_us = 40;
    base.delay_us = Some((1000, 5000));
    let config = with_env(base);
    stress_until_resets_meet_take_backs(&config, "urgency stress (thread)");
}

/// One arming thread with a generation of about 3,000 timers (750 pending) every 4 ms
/// tick, frozen for 3 ms in the middle of each take-back by a thread pinned to its CPU,
/// while a resetter thread resets ten of that generation's timers and the worker takes
/// the urgent tick, plans, and sleeps: the arming thread then publishes timers whose
/// deadlines moved while it held them.
#[test]
fn resets_racing_frozen_take_backs_fire_once_never_early() {
    let config = with_env(StressConfig {
        tick: ms(4),
        arming_threads: 1,
        per_tick: 750,
        burst: 10,
        cooldown: 3,
        age: (4, 10),
        pin_arming: true,
        cancels: Cancels(15),
        freeze: ms(3),
        ..paced(Resetter::Freeze, ms(2500))
    });
    stress_until_resets_meet_take_backs(&config, "urgency stress (freeze)");
}
