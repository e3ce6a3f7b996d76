//! Faults from callbacks and odd input: callbacks that panic with booby-trapped payloads
//! or drop each other's engines, absurd periods, timers armed from thread-local
//! destructors, cancels racing shutdown, and thousands of workers. Each test checks a fault
//! since fixed. Real-clock tests assert only what holds on a loaded 2-core machine; the
//! waits they allow are generous, so only a dead or hung worker fails them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use corewheel::{ManualClock, PendingTimers, ScheduleError, TimerEngine};

use crate::support::{Live, unpinned};

const MS: Duration = Duration::from_millis(1);

/// A panic payload whose own `Drop` panics.
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("a panic payload's drop");
    }
}

/// Waits up to a minute for `done`, so that only a dead worker fails, not a slow machine.
fn eventually(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(60), "{what}");
        std::thread::sleep(MS);
    }
}

/// Schedules a callback due in 1 ms that panics with a [`Bomb`], then ten timers due a
/// tick apart from `first` ms; returns how many of the ten have fired.
fn bomb_then_ten(engine: &TimerEngine, first: u32) -> Arc<AtomicUsize> {
    engine.schedule(MS, || std::panic::panic_any(Bomb)).unwrap();
    let fired = Arc::new(AtomicUsize::new(0));
    for k in 0..10 {
        let fired = Arc::clone(&fired);
        engine
            .schedule(MS * (first + k), move || {
                fired.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    fired
}

/// A callback panics with a payload whose `Drop` panics too: the turn that runs it returns,
/// the panic is counted once, and the shard's later timers fire.
#[test]
fn a_panic_payload_whose_drop_panics_is_contained_on_a_manual_engine() {
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(1)
        .manual_clock(clock.clone())
        .build()
        .unwrap();
    let fired = bomb_then_ten(&engine, 1);
    for _ in 0..10 {
        clock.advance(MS);
        engine.turn();
    }
    assert_eq!(fired.load(Ordering::SeqCst), 10);
    let stats = engine.stats().total;
    assert_eq!((stats.panicked, stats.pending), (1, 0));
}

/// The same on worker threads: with one worker, the timers after the bomb still fire; with
/// two, a shutdown that drops pending timers reports them and drops their captures.
#[test]
fn a_panic_payload_whose_drop_panics_does_not_kill_a_worker() {
    let engine = TimerEngine::builder()
        .workers(1)
        .pin_workers(false)
        .build()
        .unwrap();
    let fired = bomb_then_ten(&engine, 2);
    eventually("the worker died: later timers never fired", || {
        fired.load(Ordering::SeqCst) == 10
    });
    assert_eq!(engine.stats().total.panicked, 1);

    let engine = TimerEngine::builder()
        .workers(2)
        .pin_workers(false)
        .build()
        .unwrap();
    let live = Live::default();
    for shard_thread in 0..2 {
        let (engine, live) = (&engine, live.clone());
        std::thread::scope(|scope| {
            scope.spawn(move || {
                engine.schedule(MS, || std::panic::panic_any(Bomb)).unwrap();
                for _ in 0..=shard_thread {
                    let witness = live.witness();
                    engine
                        .schedule(Duration::from_secs(3600), move || drop(witness))
                        .unwrap();
                }
            });
        });
    }
    eventually("the bombs never went off", || {
        engine.stats().total.panicked == 2
    });
    let report = engine.shutdown(PendingTimers::Drop);
    assert_eq!(report.dropped, 3);
    assert_eq!(
        live.count(),
        0,
        "captures of dropped timers are still alive"
    );
    assert_eq!(engine.nodes_in_use(), 0);
}

/// A repeating period longer than a timer can keep (2^62 - 2 ticks) was shortened silently:
/// with a 1 ns tick, a 200-year period ran at 200 years and again at 350, 50 years early.
/// Now it runs once and never again by itself, and can still be cancelled.
#[test]
fn a_period_too_long_to_keep_never_runs_early() {
    const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(1)
        .tick(Duration::from_nanos(1))
        .manual_clock(clock.clone())
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let handle = engine
        .schedule_repeating(YEAR * 200, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    clock.advance(YEAR * 200 - MS);
    engine.turn();
    assert_eq!(runs.load(Ordering::SeqCst), 0, "never early");
    clock.advance(MS);
    engine.turn();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the first run is on time");
    for _ in 0..38 {
        // Ten years a turn, up to 580 years: past the next run's true time (400 years),
        // and short of the end of the 1 ns tick range (584 years).
        clock.advance(YEAR * 10);
        engine.turn();
        assert_eq!(runs.load(Ordering::SeqCst), 1, "ran again");
    }
    assert!(engine.is_pending(handle));
    assert!(engine.cancel(handle));
}

/// Threads that schedule, cancel and reset from thread-local destructors, some of which
/// run after the engine's own thread locals are gone: every operation is counted in the
/// stats, and the timers behave as on any thread.
#[test]
fn work_done_in_thread_local_destructors_is_counted() {
    const THREADS: usize = 50;
    let clock = ManualClock::new();
    let engine = Arc::new(
        TimerEngine::builder()
            .workers(2)
            .manual_clock(clock.clone())
            .build()
            .unwrap(),
    );
    let fired = Arc::new(AtomicUsize::new(0));

    /// On drop: schedules two timers, cancels one and resets the other.
    struct AtExit(Option<(Arc<TimerEngine>, Arc<AtomicUsize>)>);
    impl Drop for AtExit {
        fn drop(&mut self) {
            let Some((engine, fired)) = self.0.take() else {
                return;
            };
            let cancelled = engine.schedule(MS * 5, || {}).unwrap();
            let reset = engine
                .schedule(MS * 50, move || {
                    fired.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
            assert!(engine.cancel(cancelled));
            assert!(engine.reset(reset, MS * 3));
        }
    }
    std::thread_local! {
        static AT_EXIT: std::cell::RefCell<AtExit> = const { std::cell::RefCell::new(AtExit(None)) };
    }

    for thread in 0..THREADS {
        let (engine, fired) = (Arc::clone(&engine), Arc::clone(&fired));
        std::thread::spawn(move || {
            let arm = || {
                AT_EXIT.with(|at_exit| {
                    at_exit.borrow_mut().0 = Some((Arc::clone(&engine), Arc::clone(&fired)))
                })
            };
            // Destructors run in the reverse order of first use: half the threads' run
            // after the engine's thread locals are destroyed, half before.
            if thread % 2 == 0 {
                arm();
            }
            engine.schedule(MS * 2, || {}).unwrap();
            if thread % 2 == 1 {
                arm();
            }
        })
        .join()
        .unwrap();
    }
    let stats = engine.stats().total;
    assert_eq!(
        (stats.scheduled, stats.cancelled, stats.reset),
        (3 * THREADS as u64, THREADS as u64, THREADS as u64),
        "{stats:?}"
    );
    for _ in 0..5 {
        clock.advance(MS);
        engine.turn();
    }
    assert_eq!(
        fired.load(Ordering::SeqCst),
        THREADS,
        "every reset timer fired"
    );
    let stats = engine.stats().total;
    assert_eq!(
        (stats.fired, stats.pending),
        (2 * THREADS as u64, 0),
        "{stats:?}"
    );
}

/// Two engines, each with a callback holding the last handle to the other, which it drops
/// while the other's callback does the same: each drop ran on a worker and waited for the
/// other engine's workers, forever. A drop on any engine's worker now waits for none; the
/// workers finish by themselves, and the dropped engines' other timers' captures go too.
#[test]
fn engines_dropped_from_each_others_callbacks_do_not_deadlock() {
    let live = Live::default();
    let (dropped_tx, dropped) = mpsc::channel();
    let build = || {
        Arc::new(
            TimerEngine::builder()
                .workers(1)
                .pin_workers(false)
                .build()
                .unwrap(),
        )
    };
    let (first, second) = (build(), build());
    let meet = Arc::new(std::sync::Barrier::new(2));
    for (engine, other) in [(&first, &second), (&second, &first)] {
        let (other, meet, dropped_tx) = (Arc::clone(other), Arc::clone(&meet), dropped_tx.clone());
        engine
            .schedule(MS * 5, move || {
                // Both callbacks drop at once, each on its own engine's worker.
                meet.wait();
                drop(other);
                dropped_tx.send(()).unwrap();
            })
            .unwrap();
        let witness = live.witness();
        engine
            .schedule(Duration::from_secs(3600), move || drop(witness))
            .unwrap();
    }
    drop((first, second));
    for _ in 0..2 {
        dropped
            .recv_timeout(Duration::from_secs(30))
            .expect("a drop on a worker waited for the other engine's worker: deadlock");
    }
    eventually(
        "the dropped engines' pending timers were never dropped",
        || live.count() == 0,
    );
}

/// A shutdown that runs pending timers, called from inside a callback, cannot wait for the
/// workers; its report must still agree with the stats, and a later call, once the workers
/// are done, reports the final figures.
#[test]
fn a_shutdown_report_from_inside_a_callback_agrees_with_the_stats() {
    let engine = Arc::new(
        TimerEngine::builder()
            .workers(1)
            .pin_workers(false)
            .build()
            .unwrap(),
    );
    let (reported_tx, reported) = mpsc::channel();
    let ran = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&ran);
    engine
        .schedule(Duration::from_secs(3600), move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let inside = Arc::clone(&engine);
    engine
        .schedule(MS, move || {
            reported_tx
                .send(inside.shutdown(PendingTimers::Run))
                .unwrap();
        })
        .unwrap();
    let first = reported.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(first.ran <= 1);
    eventually("the pending timer never ran at shutdown", || {
        ran.load(Ordering::SeqCst) == 1
    });
    eventually("the workers never finished", || {
        engine.stats().total.ran_at_shutdown == 1
    });
    let later = engine.shutdown(PendingTimers::Drop);
    let stats = engine.stats().total;
    assert_eq!((later.ran, later.dropped), (1, 0));
    assert_eq!(
        (later.ran, later.dropped),
        (stats.ran_at_shutdown, stats.dropped_at_shutdown)
    );
}

/// Threads cancel filed timers while the engine shuts down, dropping pending timers: once
/// shutdown has returned and the cancelling threads have joined, every closure has been
/// dropped (before, a cancel whose message arrived after the shard's last turn left its
/// closure alive until the engine was dropped: up to 247k of 300k), every timer was either
/// cancelled or dropped by the shutdown, and every node is back in its pool.
#[test]
fn cancels_racing_shutdown_drop_every_closure_by_the_time_both_return() {
    let timers: usize = if cfg!(debug_assertions) {
        40_000
    } else {
        300_000
    };
    let engine = unpinned(2);
    let live = Live::default();
    let handles: Vec<_> = (0..timers)
        .map(|_| {
            let witness = live.witness();
            engine
                .schedule(Duration::from_secs(3600), move || drop(witness))
                .unwrap()
        })
        .collect();
    // Let the workers take the lanes and file the timers.
    std::thread::sleep(Duration::from_millis(100));
    let handles = Arc::new(handles);
    let cancellers: Vec<_> = (0..2)
        .map(|part| {
            let (engine, handles) = (Arc::clone(&engine), Arc::clone(&handles));
            std::thread::spawn(move || {
                handles
                    .iter()
                    .skip(part)
                    .step_by(2)
                    .filter(|&&handle| engine.cancel(handle))
                    .count()
            })
        })
        .collect();
    std::thread::sleep(MS);
    let report = engine.shutdown(PendingTimers::Drop);
    let cancelled: usize = cancellers.into_iter().map(|c| c.join().unwrap()).sum();
    assert_eq!(cancelled + report.dropped as usize, timers, "{report:?}");
    assert_eq!(live.count(), 0, "cancelled closures outlived their timers");
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Threads schedule without pause while the engine shuts down, dropping pending timers.
/// Whether a schedule returned `Ok` (its timer dropped by the shutdown or swept up after
/// it) or `Err(Shutdown)`, once the shutdown and the schedulers have returned no closure
/// is still alive.
#[test]
fn schedules_racing_shutdown_keep_no_closure_alive() {
    for _ in 0..20 {
        let engine = unpinned(2);
        let live = Live::default();
        let schedulers: Vec<_> = (0..3)
            .map(|_| {
                let (engine, live) = (Arc::clone(&engine), live.clone());
                std::thread::spawn(move || {
                    let mut refused = 0;
                    while refused < 100 {
                        let witness = live.witness();
                        let scheduled =
                            engine.schedule(Duration::from_secs(3600), move || drop(witness));
                        if scheduled == Err(ScheduleError::Shutdown) {
                            refused += 1;
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(MS);
        engine.shutdown(PendingTimers::Drop);
        for scheduler in schedulers {
            scheduler.join().unwrap();
        }
        assert_eq!(live.count(), 0, "closures outlived their timers");
        assert_eq!(engine.nodes_in_use(), 0);
    }
}

/// What `build` reports about pinning is already final when it returns: the count read at
/// once equals the count read after the workers have long started.
#[test]
fn pinned_workers_is_final_when_build_returns() {
    for workers in [1, 2, 4] {
        let engine = TimerEngine::builder()
            .workers(workers)
            .pin_workers(true)
            .build()
            .unwrap();
        let at_once = engine.stats().pinned_workers;
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(at_once, engine.stats().pinned_workers, "{workers} workers");
        assert!(at_once <= workers);
    }
}
