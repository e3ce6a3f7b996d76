//! What an engine costs once a handed-out burst is over or a filed burst was cancelled
//! (wake-ups, context switches, CPU), fire storms on a manual clock after a long idle sleep
//! across level-2 and level-3 boundaries at a finer tick (each timer at exactly its tick),
//! bursts on far more workers than cores with aggressive stand-ins and panics,
//! `MissedTicks::Burst` repeating timers walked in a burst, and past deadlines armed in
//! bulk while the lists are out.
//!
//! Real-clock tests assert only what holds on a loaded 2-core machine (never early,
//! exactly once, nothing lost, no hang) and, once an engine has nothing pending, that it
//! keeps still; the tests that measure CPU hold the binary alone (`support::serial`), the
//! others only keep out of their way (`support::shared`).

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::driven::{await_drivers, multi_thread};
use crate::support::fire_book::{Book, arm, arm_then, nanos};
use crate::support::{
    CpuWindow, Live, Rng, assert_one_shot_stats, eventually, ms, settle_wakes, within,
    worker_switches_total,
};
use corewheel::{Clock, ManualClock, MissedTicks, PendingTimers, Stats, TimerEngine};

/// How long a test may take before it counts as hung.
const LIMIT: Duration = Duration::from_secs(30);

/// How long an engine with nothing pending may take to fall still ([`settle_wakes`]).
const SETTLE_LIMIT: Duration = Duration::from_secs(20);

fn real(workers: usize, stealing: bool, rescue: Option<u32>) -> Arc<TimerEngine> {
    Arc::new(support::unpinned_balancing(workers, stealing, rescue))
}

/// Waits (up to 20 s) until every timer of `book` not `cancelled` has run, gives an extra
/// run (a cancelled timer's, or a second) 50 ms to show, then checks that each of them ran
/// once and never before its deadline, that no cancelled one ran, and that the stats agree
/// ([`assert_one_shot_stats`]). The stats it checked.
fn each_ran_once(
    engine: &TimerEngine,
    book: &Book,
    (deadlines, cancelled): (&[u64], &[bool]),
    what: &str,
) -> Stats {
    let expected = cancelled.iter().filter(|&&c| !c).count();
    assert!(
        eventually(Duration::from_secs(20), || book.total() >= expected),
        "{what}: {} of {expected} ran",
        book.total()
    );
    std::thread::sleep(ms(50));
    assert_eq!(book.check(deadlines, cancelled, false), expected, "{what}");
    assert_one_shot_stats(engine, expected as u64)
}

/// Shuts `engine` down with nothing left pending: nothing to run or drop, every node back.
fn shut_down_empty(engine: &TimerEngine) {
    let report = engine.shutdown(PendingTimers::Drop);
    assert_eq!(
        (report.ran, report.dropped),
        (0, 0),
        "left pending at shutdown"
    );
    assert_eq!(engine.nodes_in_use(), 0, "every node back");
}

/// With nothing pending and the engine settled: over `window`, no worker wake-up counted,
/// no worker context switch, and the process near no CPU. The caller holds [`alone`].
fn assert_still(engine: &TimerEngine, window: Duration, what: &str) {
    let (before, switches) = (engine.stats().total, worker_switches_total());
    let cpu = CpuWindow::start();
    std::thread::sleep(window);
    let cores = cpu.cores();
    let (after, switches_after) = (engine.stats().total, worker_switches_total());
    assert_eq!(
        before.wakes, after.wakes,
        "{what}: an idle engine woke its workers"
    );
    assert_eq!(
        switches, switches_after,
        "{what}: idle workers were switched in and out (voluntary context switches)"
    );
    if let Some(cores) = cores {
        assert!(
            cores < 0.1,
            "{what}: an idle engine used {cores:.2} cores over {window:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 1. What an engine costs once a burst is over.
// ---------------------------------------------------------------------------------------

/// A 40,000-timer burst due within 2 ms, big enough to be handed out, on 3 workers; a
/// second thread cancels every third timer from just before it comes due, racing the
/// walkers. Exactly once (or cancelled), never early, stats agree. Then, with nothing
/// pending, the engine falls still within a few seconds (rescue off: at once; on: once the
/// watcher's linger is over) and stays still: no wake-up, no context switch, no CPU.
#[test]
fn an_engine_after_a_walked_burst_with_racing_cancels_falls_still() {
    let _alone = support::serial();
    for rescue in [None, Some(8)] {
        within(LIMIT, "walked burst then idle", move || {
            const N: usize = 40_000;
            let engine = real(3, true, rescue);
            let book = Book::new(N);
            let due = Instant::now() + ms(150);
            let mut deadlines = Vec::with_capacity(N);
            let handles: Vec<_> = (0..N)
                .map(|id| {
                    let at = due + Duration::from_micros((id as u64 * 37) % 2_000);
                    deadlines.push(book.ns(at));
                    let book = Arc::clone(&book);
                    engine
                        .schedule_at(at, move || book.hit(id))
                        .expect("scheduled")
                })
                .collect();
            let canceller = {
                let engine = Arc::clone(&engine);
                std::thread::spawn(move || {
                    std::thread::sleep(
                        due.saturating_duration_since(Instant::now())
                            .saturating_sub(ms(1)),
                    );
                    (0..N)
                        .map(|id| id % 3 == 0 && engine.cancel(handles[id]))
                        .collect::<Vec<_>>()
                })
            };
            let cancelled = canceller.join().expect("canceller");
            let what = format!("rescue {rescue:?}");
            let stats = each_ran_once(&engine, &book, (&deadlines, &cancelled), &what);
            eprintln!(
                "{what}: claimed elsewhere {}, stolen {}",
                stats.total.claimed_elsewhere, stats.total.stolen
            );
            settle_wakes(&engine, ms(300), SETTLE_LIMIT, "after the burst");
            assert_still(&engine, ms(600), "after the burst");
            assert_eq!(engine.nodes_in_use(), 0, "every node back");
            let report = engine.shutdown(PendingTimers::Drop);
            assert_eq!((report.ran, report.dropped), (0, 0));
        });
    }
}

/// 40,000 timers a minute out, filed in the wheel (the arming thread waits past its lane's
/// 32-tick horizon), all cancelled from another thread. Every capture is dropped and every
/// node back within a second or two (the documented "within a few ticks", up to 32 for a
/// quiet thread); nothing runs; the cancels cost the workers few wake-ups (not one per
/// timer or per batch of 64); and the engine then stays still.
#[test]
fn a_cancelled_filed_burst_is_cheap_and_leaves_the_engine_still() {
    let _alone = support::serial();
    within(LIMIT, "cancelled filed burst", || {
        const N: usize = 40_000;
        let engine = real(2, true, Some(8));
        let live = Live::default();
        let ran = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..N)
            .map(|id| {
                let (witness, ran) = (live.witness(), Arc::clone(&ran));
                engine
                    .schedule(Duration::from_secs(60) + ms(id as u64 % 500), move || {
                        let _ = &witness;
                        ran.fetch_add(1, Ordering::SeqCst);
                    })
                    .expect("scheduled")
            })
            .collect();
        // Past the lane's horizon: the owner has filed them.
        std::thread::sleep(ms(200));
        settle_wakes(&engine, ms(200), SETTLE_LIMIT, "after arming");
        let before = engine.stats().total;
        let canceller = {
            let engine = Arc::clone(&engine);
            std::thread::spawn(move || handles.iter().filter(|&&h| engine.cancel(h)).count())
        };
        assert_eq!(canceller.join().expect("canceller"), N, "every cancel took");
        assert!(
            eventually(Duration::from_secs(10), || live.count() == 0
                && engine.nodes_in_use() == 0),
            "cancelled timers not given back: {} captures, {} nodes",
            live.count(),
            engine.nodes_in_use()
        );
        settle_wakes(&engine, ms(300), SETTLE_LIMIT, "after the cancels");
        let after = engine.stats().total;
        let spent = after.wakes.total() - before.wakes.total();
        eprintln!("{N} cancels of filed timers cost {spent} worker wake-ups");
        assert!(
            spent < (N / 64 / 4) as u64,
            "cancelling {N} filed timers woke the workers {spent} times: {:?} -> {:?}",
            before.wakes,
            after.wakes
        );
        assert_eq!(ran.load(Ordering::SeqCst), 0, "a cancelled timer ran");
        assert_eq!(after.cancelled, N as u64);
        assert_eq!(after.pending, 0, "{after:?}");
        assert_still(&engine, ms(600), "after the cancels");
        let report = engine.shutdown(PendingTimers::Run);
        assert_eq!((report.ran, report.dropped), (0, 0));
    });
}

// ---------------------------------------------------------------------------------------
// 2. Fire storms on a manual clock: a long idle, then a storm at a finer tick.
// ---------------------------------------------------------------------------------------

/// One storm on a manual clock: `n` timers due over `span` from `start` (after the
/// engine's origin), on a `tick` engine; no turn from the arming until `wake` (the long
/// idle sleep), then a turn every `step` (a whole number of ticks) to past the storm.
/// Before the idle, a tenth of the timers are cancelled and a tenth reset elsewhere in the
/// storm, and `REPEATING` Skip timers of a 3-tick period start inside it. Every one-shot
/// runs once, at exactly the first turn at or after its tick; every repeating timer at
/// exactly the turns Skip's rule gives (the first turn at or after each deadline, the
/// next deadline the first of its period's ticks after that turn).
fn storm_case(
    tick: Duration,
    (start, span): (Duration, Duration),
    (wake, step): (Duration, Duration),
    seed: u64,
) {
    const N: usize = 30_000;
    const REPEATING: usize = 200;
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(2)
        .tick(tick)
        .manual_clock(clock.clone())
        .build()
        .expect("manual engine");
    let origin = clock.now();
    let t = nanos(tick);
    let ceil = |d: Duration| nanos(d).div_ceil(t) * t;
    let (wake_ns, step_ns) = (nanos(wake), nanos(step));
    assert!(
        wake_ns % t == 0 && step_ns % t == 0 && step_ns > 0,
        "turns on tick boundaries"
    );
    let end = nanos(start + span) + 4 * step_ns;
    // The turns' times after the idle; the first turn at or after `x`.
    let turns: Vec<u64> = (0..)
        .map(|j| wake_ns + j * step_ns)
        .take_while(|&x| x <= end + step_ns)
        .collect();
    let first_turn = |x: u64| {
        turns
            .get(turns.partition_point(|&turn| turn < x))
            .copied()
            .unwrap_or(u64::MAX)
    };
    let at: Arc<Vec<AtomicU64>> = Arc::new((0..N).map(|_| AtomicU64::new(u64::MAX)).collect());
    let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..N).map(|_| AtomicUsize::new(0)).collect());
    let mut rng = Rng(seed);
    let mut deadline = Vec::with_capacity(N);
    let handles: Vec<_> = (0..N)
        .map(|id| {
            let d = start + Duration::from_nanos(rng.below(nanos(span)));
            deadline.push(Some(ceil(d)));
            let (at, runs, clock) = (Arc::clone(&at), Arc::clone(&runs), clock.clone());
            engine
                .schedule_at(origin + d, move || {
                    at[id].store(nanos(clock.now() - origin), Ordering::SeqCst);
                    runs[id].fetch_add(1, Ordering::SeqCst);
                })
                .expect("scheduled")
        })
        .collect();
    for id in 0..N {
        match rng.below(10) {
            0 => {
                assert!(engine.cancel(handles[id]));
                deadline[id] = None;
            }
            1 => {
                let d = start + Duration::from_nanos(rng.below(nanos(span)));
                assert!(engine.reset_at(handles[id], origin + d));
                deadline[id] = Some(ceil(d));
            }
            _ => {}
        }
    }
    let period = 3 * tick;
    let rep_runs: Arc<Vec<std::sync::Mutex<Vec<u64>>>> = Arc::new(
        (0..REPEATING)
            .map(|_| std::sync::Mutex::new(Vec::new()))
            .collect(),
    );
    let mut rep_first = Vec::with_capacity(REPEATING);
    let rep_handles: Vec<_> = (0..REPEATING)
        .map(|id| {
            let (rep_runs, clock) = (Arc::clone(&rep_runs), clock.clone());
            let handle = engine
                .schedule_repeating_with(period, MissedTicks::Skip, move || {
                    rep_runs[id]
                        .lock()
                        .unwrap()
                        .push(nanos(clock.now() - origin));
                })
                .expect("scheduled");
            let d = start + Duration::from_nanos(rng.below(nanos(span) / 2));
            assert!(engine.reset_at(handle, origin + d));
            rep_first.push(ceil(d));
            handle
        })
        .collect();
    // One turn at the start (files everything), then the long idle sleep: no turn.
    assert_eq!(engine.turn(), 0);
    let mut turns_ran = 0;
    for &turn in &turns {
        if turn > end {
            break;
        }
        clock.advance_to(origin + Duration::from_nanos(turn));
        turns_ran += engine.turn();
    }
    let stop = nanos(clock.now() - origin);
    for handle in rep_handles {
        assert!(engine.cancel(handle), "a repeating timer stopped by itself");
    }
    let mut one_shots = 0;
    for id in 0..N {
        let (runs, at) = (
            runs[id].load(Ordering::SeqCst),
            at[id].load(Ordering::SeqCst),
        );
        match deadline[id] {
            None => assert_eq!(runs, 0, "timer {id} ran after its cancel"),
            Some(d) => {
                assert_eq!(runs, 1, "timer {id} (due {d} ns) ran {runs} times");
                assert!(at >= d, "timer {id} ran {} ns early", d - at);
                let expected = first_turn(d);
                assert_eq!(
                    at,
                    expected,
                    "timer {id} due at {d} ns ran {} turns late (idle until {wake_ns})",
                    (at - expected) / step_ns
                );
                one_shots += 1;
            }
        }
    }
    let mut repeats = 0;
    let p = nanos(period);
    for (id, &first) in rep_first.iter().enumerate() {
        let seen = rep_runs[id].lock().unwrap().clone();
        let mut expected = Vec::new();
        let mut due = first;
        loop {
            let turn = first_turn(due);
            if turn > stop {
                break;
            }
            expected.push(turn);
            due += p * ((turn - due) / p + 1);
        }
        assert_eq!(
            seen, expected,
            "repeating timer {id} (first due {first} ns)"
        );
        repeats += seen.len();
    }
    assert_eq!(turns_ran, one_shots + repeats, "turn() counts disagree");
    let stats = engine.stats().total;
    assert_eq!(stats.fired, turns_ran as u64, "{stats:?}");
    assert_eq!(stats.pending, 0, "{stats:?}");
    if wake_ns <= nanos(start) && step_ns == t {
        // Turned every tick from before the storm: nothing ran late.
        assert_eq!(
            stats.late, 0,
            "timers counted late on an exact clock: {stats:?}"
        );
    }
    shut_down_empty(&engine);
}

/// Storms after a long idle sleep at a 1 ms tick: over a level-2 boundary (4,096 ticks)
/// and a level-3 boundary (262,144 ticks), waking just before the storm, and waking in the
/// middle of it (everything due by then runs at the wake, the rest at its tick).
#[test]
fn storms_after_a_long_idle_across_level_boundaries_fire_each_at_its_tick() {
    let _shared = support::shared();
    within(LIMIT, "storms at 1 ms", || {
        let s = Duration::from_millis;
        storm_case(s(1), (s(4_096 - 300), s(600)), (s(4_096 - 310), s(1)), 1);
        storm_case(
            s(1),
            (s(262_144 - 400), s(800)),
            (s(262_144 - 401), s(1)),
            2,
        );
        storm_case(s(1), (s(262_144 - 400), s(800)), (s(262_144 + 17), s(1)), 3);
        // Turns every 7 ticks: each takes several due finest slots at once.
        storm_case(
            s(1),
            (s(262_144 - 400), s(800)),
            (s(262_144 - 450), s(7)),
            6,
        );
    });
}

/// The same at a finer tick, as the fire storms need (250 µs and 100 µs): the
/// storm a second wide straddles a level-3 boundary (64³ ticks: 65.5 s and 26.2 s out).
#[test]
fn storms_after_a_long_idle_at_a_finer_tick_fire_each_at_its_tick() {
    let _shared = support::shared();
    within(LIMIT, "storms at a finer tick", || {
        let us = Duration::from_micros;
        let quarter = 262_144 * 250;
        storm_case(
            us(250),
            (us(quarter - 500_000), us(1_000_000)),
            (us(quarter - 500_250), us(250)),
            4,
        );
        let tenth = 262_144 * 100;
        storm_case(
            us(100),
            (us(tenth - 300_000), us(600_000)),
            (us(tenth), us(100)),
            5,
        );
        // A microsecond tick over a level-4 boundary (64^4 ticks, 16.8 s out), a turn every
        // 37 ticks; a nanosecond tick over a level-5 boundary (64^5 ticks, 1.07 s out), a
        // turn every 1,013 ticks: turns that cross many finest slots, and whole blocks.
        let ns = Duration::from_nanos;
        let l4 = 16_777_216;
        storm_case(
            us(1),
            (us(l4 - 100_000), us(200_000)),
            (us(l4 - 100_037), us(37)),
            7,
        );
        let l5 = 1_073_741_824;
        storm_case(
            ns(1),
            (ns(l5 - 5_000_000), ns(10_000_000)),
            (ns(l5 - 5_001_013), ns(1_013)),
            8,
        );
    });
}

// ---------------------------------------------------------------------------------------
// 3. Bursts on odd worker counts, with panics and eager stand-ins.
// ---------------------------------------------------------------------------------------

/// A 30,000-timer burst (1% of callbacks panic) on 64 workers (32 per core here) with
/// stand-ins after a tick (`rescue_after(Some(0))`), and on 1 worker: walkers preempted
/// while holding lists, stand-ins taking the wheel between an owner's looks. Exactly once,
/// never early, every panic counted once, stats agree, every node back.
#[test]
fn a_burst_with_panics_on_far_more_workers_than_cores() {
    let _shared = support::shared();
    support::quiet_panics_marked("hostile panic");
    for (workers, rescue) in [(64, Some(0)), (64, None), (1, Some(0))] {
        within(LIMIT, "burst on many workers", move || {
            const N: usize = 30_000;
            let engine = real(workers, true, rescue);
            let book = Book::new(N);
            let window = (Instant::now() + ms(200), ms(3));
            let (deadlines, _) = arm_then(&engine, &book, window, 0x3a, |id| {
                if id % 100 == 7 {
                    panic!("hostile panic in timer {id}");
                }
            });
            let what = format!("{workers} workers, rescue {rescue:?}");
            let stats = each_ran_once(&engine, &book, (&deadlines, &vec![false; N]), &what);
            assert!(
                eventually(Duration::from_secs(20), || engine.stats().total.panicked
                    == (N / 100) as u64),
                "panics counted: {:?}",
                engine.stats().total
            );
            eprintln!(
                "{what}: claimed elsewhere {}, stolen {}, rescued {}",
                stats.total.claimed_elsewhere, stats.total.stolen, stats.total.rescued
            );
            shut_down_empty(&engine);
        });
    }
}

// ---------------------------------------------------------------------------------------
// 4. Repeating timers that catch up, walked in a burst.
// ---------------------------------------------------------------------------------------

/// 500 `MissedTicks::Burst` repeating timers of a 1 ms period first due inside a
/// 30,000-timer burst on 3 workers: walkers run them and send them back while the lists
/// are out, and they fall behind and catch up. The k-th run (from 0) of each after its
/// move into the burst never begins before `first + k` ms (a run due 1 ms after it was
/// scheduled, before the move, is not counted); after a cancel that returned `true`, no
/// run begins; one-shots run once and never early.
#[test]
fn catching_up_repeating_timers_in_a_walked_burst_are_never_early() {
    let _shared = support::shared();
    within(LIMIT, "burst-mode repeating timers", || {
        const N: usize = 30_000;
        const REPEATING: usize = 500;
        let engine = real(3, true, Some(8));
        let book = Book::new(N);
        let due = Instant::now() + ms(200);
        let (deadlines, _) = arm(&engine, &book, (due, ms(2)), 0x4b);
        let period = ms(1);
        let early = Arc::new(AtomicUsize::new(0));
        let after_cancel = Arc::new(AtomicUsize::new(0));
        let stopped: Arc<Vec<AtomicBool>> =
            Arc::new((0..REPEATING).map(|_| AtomicBool::new(false)).collect());
        let counts: Arc<Vec<AtomicU64>> =
            Arc::new((0..REPEATING).map(|_| AtomicU64::new(0)).collect());
        let moved: Arc<Vec<AtomicBool>> =
            Arc::new((0..REPEATING).map(|_| AtomicBool::new(false)).collect());
        let handles: Vec<_> = (0..REPEATING)
            .map(|id| {
                let first = due + Duration::from_micros((id as u64 * 53) % 2_000);
                let (early, after_cancel, stopped, counts, moved_here) = (
                    Arc::clone(&early),
                    Arc::clone(&after_cancel),
                    Arc::clone(&stopped),
                    Arc::clone(&counts),
                    Arc::clone(&moved),
                );
                let handle = engine
                    .schedule_repeating_with(period, MissedTicks::Burst, move || {
                        let now = Instant::now();
                        if !moved_here[id].load(Ordering::SeqCst) {
                            // Due `period` after scheduling, and the arming thread was
                            // away longer than that before it moved the timer.
                            return;
                        }
                        if stopped[id].load(Ordering::SeqCst) {
                            after_cancel.fetch_add(1, Ordering::SeqCst);
                        }
                        let k = counts[id].fetch_add(1, Ordering::SeqCst);
                        let earliest = first + period * u32::try_from(k).unwrap_or(u32::MAX);
                        if now < earliest {
                            early.fetch_add(1, Ordering::SeqCst);
                        }
                    })
                    .expect("scheduled");
                assert!(engine.reset_at(handle, first), "moved into the burst");
                moved[id].store(true, Ordering::SeqCst);
                handle
            })
            .collect();
        assert!(
            eventually(Duration::from_secs(20), || book.total() >= N),
            "{} of {N} one-shots ran",
            book.total()
        );
        // Let them run (and catch up) a while, then stop them.
        std::thread::sleep(ms(150));
        let mut stopped_now = 0;
        for (id, &handle) in handles.iter().enumerate() {
            if engine.cancel(handle) {
                stopped[id].store(true, Ordering::SeqCst);
                stopped_now += 1;
            }
        }
        assert_eq!(
            stopped_now, REPEATING,
            "a repeating timer stopped by itself"
        );
        std::thread::sleep(ms(50));
        assert_eq!(book.check(&deadlines, &vec![false; N], false), N);
        assert_eq!(
            early.load(Ordering::SeqCst),
            0,
            "a catching-up repeating run began before its period's deadline"
        );
        // A run that began before the cancel returned may see the flag: one each at most.
        assert!(
            after_cancel.load(Ordering::SeqCst) <= REPEATING,
            "runs began after their cancel returned true"
        );
        let total_runs: u64 = counts.iter().map(|c| c.load(Ordering::SeqCst)).sum();
        assert!(total_runs >= REPEATING as u64, "every repeating timer ran");
        let report = engine.shutdown(PendingTimers::Drop);
        assert_eq!(report.dropped, 0);
        assert_eq!(engine.nodes_in_use(), 0, "every node back");
    });
}

// ---------------------------------------------------------------------------------------
// 5. Past deadlines armed in bulk while the burst's lists are out.
// ---------------------------------------------------------------------------------------

/// The arming thread's own shard bursts (30,000 timers at one instant, 2 workers), and at
/// that instant the same thread arms 6,000 timers whose deadlines are already past (due
/// at once: the wheel's ready list) and 6,000 zero delays, cancelling every third as it
/// goes; its lane waits while the lists are out. Each runs once unless its cancel returned
/// `true`, none before it was armed (nor a burst timer early), all within the limit.
#[test]
fn past_deadlines_armed_in_bulk_while_lists_are_out() {
    let _shared = support::shared();
    within(LIMIT, "past deadlines against a hand-out", || {
        const BURST: usize = 30_000;
        const LATE: usize = 12_000;
        let engine = real(2, true, Some(8));
        let book = Book::new(BURST + LATE);
        let due = Instant::now() + ms(200);
        let mut deadlines = Vec::with_capacity(BURST + LATE);
        for id in 0..BURST {
            deadlines.push(book.ns(due));
            let book = Arc::clone(&book);
            engine
                .schedule_at(due, move || book.hit(id))
                .expect("scheduled");
        }
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let mut cancelled = vec![false; BURST + LATE];
        for k in 0..LATE {
            let id = BURST + k;
            // Its "deadline" for the never-early check: when it was armed.
            deadlines.push(book.ns(Instant::now()));
            let hit = Arc::clone(&book);
            let handle = if k % 2 == 0 {
                let past = Instant::now() - ms(40 + (k as u64 % 200));
                engine.schedule_at(past, move || hit.hit(id))
            } else {
                engine.schedule(Duration::ZERO, move || hit.hit(id))
            }
            .expect("scheduled");
            if k % 3 == 0 {
                cancelled[id] = engine.cancel(handle);
            }
        }
        each_ran_once(&engine, &book, (&deadlines, &cancelled), "the burst");
        shut_down_empty(&engine);
    });
}

// ---------------------------------------------------------------------------------------
// 6. A driven engine: a burst on the runtime's threads, then nothing.
// ---------------------------------------------------------------------------------------

/// A driven engine of 2 shards on a 2-thread tokio runtime: a 20,000-timer burst from two
/// threads (both shards), a third of it cancelled as it comes due. Exactly once (or
/// cancelled), never early, stats agree. Then, with nothing pending, the drivers make no
/// new sleep (a driver with nothing planned waits for a wake-up), the process uses no CPU,
/// and the shutdown ends both drivers.
#[test]
fn a_driven_engine_after_a_burst_makes_no_more_sleeps() {
    let _alone = support::serial();
    within(LIMIT, "driven burst then idle", || {
        const N: usize = 20_000;
        let runtime = multi_thread(2);
        let engine = Arc::new(
            TimerEngine::builder()
                .workers(2)
                .driven()
                .build()
                .expect("driven engine"),
        );
        let sleeps = Arc::new(AtomicUsize::new(0));
        let made = Arc::clone(&sleeps);
        let drivers: Vec<_> = engine
            .drivers(move |at| {
                made.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep_until(at.into())
            })
            .into_iter()
            .map(|driver| runtime.spawn(driver))
            .collect();
        assert_eq!(drivers.len(), 2);
        let book = Book::new(N);
        let due = Instant::now() + ms(150);
        let arm = |range: std::ops::Range<usize>| {
            let (engine, book) = (Arc::clone(&engine), Arc::clone(&book));
            std::thread::spawn(move || {
                range
                    .map(|id| {
                        let at = due + Duration::from_micros((id as u64 * 41) % 3_000);
                        let hit = Arc::clone(&book);
                        let handle = engine
                            .schedule_at(at, move || hit.hit(id))
                            .expect("scheduled");
                        (id, book.ns(at), handle)
                    })
                    .collect::<Vec<_>>()
            })
        };
        let (a, b) = (arm(0..N / 2), arm(N / 2..N));
        let mut armed = a.join().expect("arming");
        armed.extend(b.join().expect("arming"));
        armed.sort_by_key(|&(id, _, _)| id);
        let deadlines: Vec<u64> = armed.iter().map(|&(_, d, _)| d).collect();
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let cancelled: Vec<bool> = armed
            .iter()
            .map(|&(id, _, handle)| id % 3 == 1 && engine.cancel(handle))
            .collect();
        each_ran_once(&engine, &book, (&deadlines, &cancelled), "the burst");
        assert!(
            eventually(Duration::from_secs(10), || engine.nodes_in_use() == 0),
            "nodes left: {}",
            engine.nodes_in_use()
        );
        // Quiet lanes hand their cancels over within 32 ticks; then nothing is planned.
        let mut last = sleeps.load(Ordering::SeqCst);
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            std::thread::sleep(ms(300));
            let now = sleeps.load(Ordering::SeqCst);
            if now == last {
                break;
            }
            assert!(Instant::now() < until, "drivers still making sleeps: {now}");
            last = now;
        }
        let cpu = CpuWindow::start();
        std::thread::sleep(ms(600));
        assert_eq!(
            sleeps.load(Ordering::SeqCst),
            last,
            "an idle driven engine made new sleeps"
        );
        if let Some(cores) = cpu.cores() {
            assert!(cores < 0.1, "an idle driven engine used {cores:.2} cores");
        }
        let report = engine.shutdown(PendingTimers::Drop);
        assert_eq!((report.ran, report.dropped), (0, 0));
        await_drivers(&runtime, drivers);
    });
}
