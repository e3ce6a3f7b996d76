//! Shutdown reached from where it cannot simply wait: callbacks that a shutdown runs and
//! captures it drops calling back into the engine, a shutdown begun inside a callback with
//! other threads still turning or waiting, and schedules that race it; each test hung or
//! failed before the fix it checks. Every body runs on a thread of its own under a time
//! limit, so a hang fails the test instead of stalling the suite.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::Duration;

use corewheel::{ManualClock, PendingTimers, ScheduleError, ShutdownReport, TimerEngine};

use crate::support::{Live, unpinned, within};

const MS: Duration = Duration::from_millis(1);

fn manual(workers: usize) -> (Arc<TimerEngine>, ManualClock) {
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(workers)
        .manual_clock(clock.clone())
        .build()
        .unwrap();
    (Arc::new(engine), clock)
}

/// A callback that `shutdown(Run)` runs on a hand-driven engine turns the engine: it gets
/// 0, as from inside any turn (before, it waited forever for the wheel its own thread held).
#[test]
fn a_turn_inside_a_callback_that_shutdown_runs_returns_zero() {
    within(Duration::from_secs(30), "shutdown(Run)", || {
        let (engine, _clock) = manual(1);
        let inside = Arc::clone(&engine);
        let got = Arc::new(AtomicUsize::new(usize::MAX));
        let seen = Arc::clone(&got);
        engine
            .schedule(Duration::from_secs(3600), move || {
                seen.store(inside.turn(), Ordering::SeqCst);
            })
            .unwrap();
        let report = engine.shutdown(PendingTimers::Run);
        assert_eq!(report.ran, 1);
        assert_eq!(got.load(Ordering::SeqCst), 0);
        assert_eq!(engine.nodes_in_use(), 0);
    });
}

/// Turns the engine it holds when dropped, and counts that it was.
struct TurnsOnDrop(Arc<TimerEngine>, Arc<AtomicUsize>);

impl Drop for TurnsOnDrop {
    fn drop(&mut self) {
        self.1.fetch_add(self.0.turn() + 1, Ordering::SeqCst);
    }
}

/// A capture that `shutdown(Drop)` drops turns the engine in its destructor: it gets 0
/// (before, the shutdown hung).
#[test]
fn a_capture_that_turns_the_engine_as_shutdown_drops_it_gets_zero() {
    within(Duration::from_secs(30), "shutdown(Drop)", || {
        let (engine, _clock) = manual(1);
        let turned = Arc::new(AtomicUsize::new(0));
        let guard = TurnsOnDrop(Arc::clone(&engine), Arc::clone(&turned));
        engine
            .schedule(Duration::from_secs(3600), move || drop(guard))
            .unwrap();
        let report = engine.shutdown(PendingTimers::Drop);
        assert_eq!(report.dropped, 1);
        // Dropped once, and its turn returned 0.
        assert_eq!(turned.load(Ordering::SeqCst), 1);
        assert_eq!(engine.nodes_in_use(), 0);
    });
}

/// A callback of thread A's turn shuts the engine down, then waits for thread B's turn:
/// B's turn returns at once, leaving A's shard for A to finish (before, B waited for A).
/// A's turn then makes every last turn still owed.
#[test]
fn a_turn_after_a_shutdown_begun_in_another_threads_callback_waits_for_nothing() {
    within(Duration::from_secs(30), "turns", || {
        let (engine, clock) = manual(2);
        let inside = Arc::clone(&engine);
        let (sent, received) = mpsc::channel();
        engine
            .schedule(MS, move || {
                inside.shutdown(PendingTimers::Drop);
                let other = Arc::clone(&inside);
                let turned = std::thread::spawn(move || other.turn()).join().unwrap();
                sent.send(turned).unwrap();
            })
            .unwrap();
        let later = engine.schedule(Duration::from_secs(60), || {}).unwrap();
        clock.advance(MS);
        engine.turn();
        assert_eq!(received.recv().unwrap(), 0);
        assert!(!engine.cancel(later), "dropped by the shutdown");
        let report = engine.shutdown(PendingTimers::Drop);
        assert_eq!(report.dropped, 1);
        assert_eq!(engine.nodes_in_use(), 0);
    });
}

/// A callback begins `shutdown(Run)` on a worker, which cannot wait; a later shutdown from
/// the main thread waits for the workers: every pending timer has run and every node is
/// back when it returns (before, it returned at once, with a timer still running).
#[test]
fn a_later_shutdown_waits_for_what_one_begun_in_a_callback_could_not() {
    within(Duration::from_secs(60), "shutdowns", || {
        let engine = unpinned(1);
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&ran);
        engine
            .schedule(Duration::from_secs(3600), move || {
                std::thread::sleep(MS * 300);
                counter.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        let (sent, received) = mpsc::channel();
        let inside = Arc::clone(&engine);
        engine
            .schedule(MS, move || {
                sent.send(inside.shutdown(PendingTimers::Run)).unwrap();
            })
            .unwrap();
        received.recv_timeout(Duration::from_secs(30)).unwrap();
        let report = engine.shutdown(PendingTimers::Drop);
        assert_eq!(
            ran.load(Ordering::SeqCst),
            1,
            "returned before the pending timer ran"
        );
        assert_eq!(report.ran, 1, "{report:?}");
        assert_eq!(engine.nodes_in_use(), 0);
    });
}

/// Threads schedule, reset and cancel repeating timers while the engine shuts down,
/// running or dropping pending timers: every callback runs on a worker (before, a sweep
/// after the last turn ran repeating callbacks on the scheduling thread, inside its
/// `schedule_repeating`), and once everything has returned no closure is alive and every
/// node is back.
#[test]
fn repeating_timers_racing_shutdown_run_only_on_workers_and_leave_nothing_alive() {
    within(Duration::from_secs(120), "rounds", || {
        let off_worker = Arc::new(AtomicUsize::new(0));
        for round in 0..40 {
            let pending = [PendingTimers::Run, PendingTimers::Drop][round % 2];
            let engine = unpinned(2);
            let live = Live::default();
            let stop = Arc::new(AtomicBool::new(false));
            let threads: Vec<_> = (0..3)
                .map(|_| {
                    let (engine, live) = (Arc::clone(&engine), live.clone());
                    let (off_worker, stop) = (Arc::clone(&off_worker), Arc::clone(&stop));
                    std::thread::spawn(move || {
                        let mut handles = Vec::new();
                        let mut refused = 0;
                        while refused < 50 && !stop.load(Ordering::SeqCst) {
                            let (witness, off_worker) = (live.witness(), Arc::clone(&off_worker));
                            let period =
                                Duration::from_micros(500 + (handles.len() as u64 % 7) * 100);
                            let scheduled = engine.schedule_repeating(period, move || {
                                let _ = &witness;
                                let name = std::thread::current().name().map(str::to_owned);
                                if !name.is_some_and(|name| name.starts_with("corewheel-")) {
                                    off_worker.fetch_add(1, Ordering::SeqCst);
                                }
                            });
                            match scheduled {
                                Ok(handle) => handles.push(handle),
                                Err(_) => refused += 1,
                            }
                            if let Some(&handle) = handles.get(handles.len() / 2) {
                                if handles.len() % 3 == 0 {
                                    engine.cancel(handle);
                                } else {
                                    engine.reset(handle, Duration::from_micros(200));
                                }
                            }
                        }
                        for handle in handles {
                            engine.cancel(handle);
                        }
                    })
                })
                .collect();
            std::thread::sleep(MS * 3);
            let report = engine.shutdown(pending);
            stop.store(true, Ordering::SeqCst);
            for thread in threads {
                thread.join().unwrap();
            }
            assert_eq!(
                live.count(),
                0,
                "round {round} ({pending:?}): closures alive, {report:?}"
            );
            assert_eq!(engine.nodes_in_use(), 0, "round {round}: nodes in use");
        }
        assert_eq!(
            off_worker.load(Ordering::SeqCst),
            0,
            "callbacks ran off the workers"
        );
    });
}

/// A thread holds a lock its repeating callback takes while it schedules, as it may when
/// callbacks run on workers, while the engine shuts down running pending timers: no
/// callback runs inside `schedule_repeating`, so nothing deadlocks.
#[test]
fn scheduling_under_a_lock_the_callback_takes_does_not_deadlock_against_shutdown() {
    within(Duration::from_secs(120), "rounds", || {
        for _ in 0..100 {
            let engine = unpinned(2);
            let threads: Vec<_> = (0..3)
                .map(|_| {
                    let engine = Arc::clone(&engine);
                    std::thread::spawn(move || {
                        let lock = Arc::new(Mutex::new(0_u64));
                        loop {
                            let guard = lock.lock().unwrap();
                            let taken = Arc::clone(&lock);
                            let scheduled = engine.schedule_repeating(MS, move || {
                                *taken.lock().unwrap() += 1;
                            });
                            drop(guard);
                            if scheduled.is_err() {
                                break;
                            }
                        }
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_micros(500));
            engine.shutdown(PendingTimers::Run);
            for thread in threads {
                thread.join().unwrap();
            }
        }
    });
}

/// Two hand-driven engines, each turned by its own thread, whose callbacks shut the other
/// down at the same moment: neither shutdown waits for the other thread's turn, and each
/// turn makes its own engine's last turn when it ends (before, both spun forever).
#[test]
fn hand_driven_engines_shutting_each_other_down_from_callbacks_do_not_deadlock() {
    within(Duration::from_secs(30), "turns", || {
        let ((x, x_clock), (y, y_clock)) = (manual(1), manual(1));
        let both = Arc::new(Barrier::new(2));
        for (engine, other) in [(&x, &y), (&y, &x)] {
            let (other, both) = (Arc::downgrade(other), Arc::clone(&both));
            engine
                .schedule(MS, move || {
                    both.wait();
                    if let Some(other) = other.upgrade() {
                        other.shutdown(PendingTimers::Drop);
                    }
                })
                .unwrap();
        }
        x_clock.advance(MS);
        y_clock.advance(MS);
        let turns: Vec<_> = [&x, &y]
            .into_iter()
            .map(|engine| {
                let engine = Arc::clone(engine);
                std::thread::spawn(move || engine.turn())
            })
            .collect();
        for turn in turns {
            assert_eq!(turn.join().unwrap(), 1);
        }
        for engine in [&x, &y] {
            assert_eq!(
                engine.schedule(MS, || {}).err(),
                Some(ScheduleError::Shutdown)
            );
            assert_eq!(engine.nodes_in_use(), 0);
        }
    });
}

/// A worker's callback shuts down a hand-driven engine whose turning thread, inside one of
/// its callbacks, is shutting down the worker's engine: the worker waits for no turn, and
/// both finish (before, the worker spun on the shard the other thread was turning).
#[test]
fn a_worker_shutting_down_a_hand_driven_engine_waits_for_no_turn() {
    within(Duration::from_secs(30), "shutdowns", || {
        let (hand, clock) = manual(1);
        let workers = unpinned(1);
        let both = Arc::new(Barrier::new(2));
        {
            let (workers, both) = (Arc::clone(&workers), Arc::clone(&both));
            hand.schedule(MS, move || {
                both.wait();
                workers.shutdown(PendingTimers::Drop);
            })
            .unwrap();
        }
        {
            let (hand, both) = (Arc::downgrade(&hand), Arc::clone(&both));
            workers
                .schedule(MS, move || {
                    both.wait();
                    if let Some(hand) = hand.upgrade() {
                        hand.shutdown(PendingTimers::Drop);
                    }
                })
                .unwrap();
        }
        clock.advance(MS);
        assert_eq!(hand.turn(), 1);
        assert_eq!(hand.nodes_in_use(), 0);
        workers.shutdown(PendingTimers::Drop);
        assert_eq!(workers.nodes_in_use(), 0);
    });
}

/// Shuts its engine down, running pending timers, when its thread's locals are destroyed,
/// and sends the report and how many captures were still alive.
struct ShutsDownOnExit(Option<OnExit>);

/// What [`ShutsDownOnExit`] holds: the engine, where to send the report, and the captures.
type OnExit = (
    Arc<TimerEngine>,
    mpsc::Sender<(ShutdownReport, usize)>,
    Live,
);

impl Drop for ShutsDownOnExit {
    fn drop(&mut self) {
        if let Some((engine, sent, live)) = self.0.take() {
            let report = engine.shutdown(PendingTimers::Run);
            let _ = sent.send((report, live.count()));
        }
    }
}

std::thread_local! {
    static ON_EXIT: RefCell<ShutsDownOnExit> = const { RefCell::new(ShutsDownOnExit(None)) };
}

/// `shutdown(Run)` of a hand-driven engine from a thread-local destructor, after the
/// engine's own thread locals are gone: it runs the pending timer and drops its capture
/// before returning (before, it took the exiting thread for one inside a turn, and left
/// everything pending).
#[test]
fn a_shutdown_from_a_thread_local_destructor_finishes_the_engine() {
    within(Duration::from_secs(30), "thread exit", || {
        let (engine, _clock) = manual(1);
        let live = Live::default();
        let witness = live.witness();
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&ran);
        engine
            .schedule(Duration::from_secs(3600), move || {
                let _ = &witness;
                counter.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        let (sent, received) = mpsc::channel();
        let (on_exit, counted) = (Arc::clone(&engine), live.clone());
        std::thread::spawn(move || {
            // Registered first, so destroyed after the locals that `turn` registers.
            ON_EXIT.with(|slot| slot.borrow_mut().0 = Some((Arc::clone(&on_exit), sent, counted)));
            on_exit.turn();
        })
        .join()
        .unwrap();
        let (report, alive) = received.recv().unwrap();
        assert_eq!((report.ran, ran.load(Ordering::SeqCst), alive), (1, 1, 0));
        assert_eq!(engine.nodes_in_use(), 0);
    });
}
