//! Driven engines (`EngineBuilder::driven`, `TimerEngine::drivers`) under misuse.
//!
//! Two kinds of test:
//! - Manual clock, with a small executor of our own ([`Exec`]) that polls a driver only
//!   when its waker was woken, and whose sleeps complete only when the manual clock reaches
//!   their instant and then wake their waker: a faithful model of a runtime, so that a
//!   missed wake-up shows up as a timer that never fires, deterministically.
//! - Real runtimes (tokio multi-thread and current-thread, smol's executor with async-io
//!   timers): only never early, exactly once, nothing lost (within generous limits), and
//!   drivers ending after shutdown.
//!
//! Seven tests check faults since fixed; each one's doc says what the fault was
//! ("Found:"): one driver per shard at a time, a driver that yields when its sleep ends
//! before the engine's tick, and one that waits for the wake-up of the thread holding its
//! shard instead of polling itself.

use crate::support;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use corewheel::{ManualClock, PendingTimers, ScheduleError, TimerEngine};

use crate::support::XorShift as Rng;
use crate::support::ms;

const LIMIT: Duration = Duration::from_secs(30);

/// Shuts `engine` down (dropping what is pending), lets `exec` run what that woke, and
/// checks that every driver ended and every node went back to its pool.
fn shut_down_and_check(engine: &TimerEngine, exec: &mut Exec) {
    engine.shutdown(PendingTimers::Drop);
    exec.run_until_idle();
    assert!(exec.all_done(), "a driver did not end after shutdown");
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Arms `each` timers `delay` out from each of two threads of their own (so on two
/// shards' lanes, closed when the threads exit), with callbacks that `make` makes.
fn arm_far_from_two_threads<F: FnOnce() + Send + 'static>(
    engine: &Arc<TimerEngine>,
    each: usize,
    delay: Duration,
    make: impl Fn() -> F + Clone + Send + 'static,
) {
    for _ in 0..2 {
        let (engine, make) = (Arc::clone(engine), make.clone());
        std::thread::spawn(move || {
            for _ in 0..each {
                engine.schedule(delay, make()).unwrap();
            }
        })
        .join()
        .unwrap();
    }
}

/// Callbacks that count their runs in `ran`, for [`arm_far_from_two_threads`].
fn counting_in(
    ran: &Arc<AtomicUsize>,
) -> impl Fn() -> Box<dyn FnOnce() + Send> + Clone + Send + use<> {
    let ran = Arc::clone(ran);
    move || {
        let ran = Arc::clone(&ran);
        Box::new(move || {
            ran.fetch_add(1, Ordering::SeqCst);
        })
    }
}

// ---------------------------------------------------------------------------------------
// A faithful manual executor.
// ---------------------------------------------------------------------------------------

/// A task's "ready to poll" flag, set by its waker.
#[derive(Default)]
struct Flag {
    set: AtomicBool,
    wakes: AtomicUsize,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.set.store(true, Ordering::SeqCst);
    }
}

/// The sleeps waiting on the manual clock: (instant, waker).
#[derive(Default)]
struct SleepQueue(Mutex<Vec<(Instant, Waker)>>);

/// A sleep on the manual clock that, like a runtime's timer, registers its waker and is
/// woken once the clock reaches its instant ([`Exec::fire_sleeps`]).
struct ManualSleep {
    clock: ManualClock,
    at: Instant,
    queue: Arc<SleepQueue>,
}

impl Future for ManualSleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if corewheel::Clock::now(&self.clock) >= self.at {
            return Poll::Ready(());
        }
        self.queue
            .0
            .lock()
            .unwrap()
            .push((self.at, cx.waker().clone()));
        Poll::Pending
    }
}

type BoxedTask = Pin<Box<dyn Future<Output = ()> + Send>>;

struct Task {
    future: BoxedTask,
    flag: Arc<Flag>,
    done: bool,
}

/// Polls each task only when its waker has been woken (each starts woken).
struct Exec {
    clock: ManualClock,
    queue: Arc<SleepQueue>,
    tasks: Vec<Task>,
    /// Instants the drivers asked to sleep until.
    asked: Arc<Mutex<Vec<Instant>>>,
}

impl Exec {
    fn new(clock: &ManualClock) -> Self {
        Self {
            clock: clock.clone(),
            queue: Arc::default(),
            tasks: Vec::new(),
            asked: Arc::default(),
        }
    }

    /// The `sleep_until` function drivers get.
    fn sleeper(&self) -> impl FnMut(Instant) -> ManualSleep + Clone + Send + 'static {
        let (clock, queue, asked) = (
            self.clock.clone(),
            Arc::clone(&self.queue),
            Arc::clone(&self.asked),
        );
        move |at| {
            asked.lock().unwrap().push(at);
            ManualSleep {
                clock: clock.clone(),
                at,
                queue: Arc::clone(&queue),
            }
        }
    }

    /// Spawns every driver of `engine` (one set).
    fn spawn_drivers(&mut self, engine: &TimerEngine) -> Vec<usize> {
        let drivers = engine.drivers(self.sleeper());
        drivers
            .into_iter()
            .map(|driver| self.spawn(Box::pin(driver)))
            .collect()
    }

    fn spawn(&mut self, future: BoxedTask) -> usize {
        let flag = Arc::new(Flag::default());
        flag.set.store(true, Ordering::SeqCst);
        self.tasks.push(Task {
            future,
            flag,
            done: false,
        });
        self.tasks.len() - 1
    }

    /// Wakes the sleeps whose instant the clock has reached.
    fn fire_sleeps(&self) {
        let now = corewheel::Clock::now(&self.clock);
        let due: Vec<Waker> = {
            let mut queue = self.queue.0.lock().unwrap();
            let mut due = Vec::new();
            queue.retain(|(at, waker)| {
                if *at <= now {
                    due.push(waker.clone());
                    false
                } else {
                    true
                }
            });
            due
        };
        for waker in due {
            waker.wake();
        }
    }

    /// Polls woken tasks until none is woken. Panics if that never settles (a task that
    /// wakes itself forever at a fixed clock is a busy loop).
    fn run_until_idle(&mut self) {
        for _round in 0..10_000 {
            self.fire_sleeps();
            let mut polled = false;
            for task in self.tasks.iter_mut() {
                if task.done || !task.flag.set.swap(false, Ordering::SeqCst) {
                    continue;
                }
                polled = true;
                let waker = Waker::from(Arc::clone(&task.flag));
                if task
                    .future
                    .as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_ready()
                {
                    task.done = true;
                }
            }
            if !polled {
                return;
            }
        }
        panic!("the executor never went idle: a driver keeps waking itself");
    }

    fn advance(&mut self, by: Duration) {
        self.clock.advance(by);
        self.run_until_idle();
    }

    fn done(&self, task: usize) -> bool {
        self.tasks[task].done
    }

    fn all_done(&self) -> bool {
        self.tasks.iter().all(|task| task.done)
    }
}

fn manual_engine(workers: usize) -> (Arc<TimerEngine>, ManualClock) {
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(workers)
        .driven()
        .manual_clock(clock.clone())
        .build()
        .unwrap();
    (Arc::new(engine), clock)
}

fn now(clock: &ManualClock) -> Instant {
    corewheel::Clock::now(clock)
}

/// Every run of every timer: id -> instants (of the manual clock) it ran at.
type Runs = Arc<Mutex<HashMap<u64, Vec<Instant>>>>;

fn record(runs: &Runs, id: u64, clock: &ManualClock) -> impl FnOnce() + Send + 'static {
    let (runs, clock) = (Arc::clone(runs), clock.clone());
    move || {
        runs.lock()
            .unwrap()
            .entry(id)
            .or_default()
            .push(now(&clock));
    }
}

// ---------------------------------------------------------------------------------------
// Manual clock, faithful executor.
// ---------------------------------------------------------------------------------------

/// Timers armed from several threads (so on every shard), some cancelled, some reset
/// sooner or later, some arming children from their callbacks, with the clock moving in
/// uneven steps and each driver polled only when woken: every timer runs exactly once, at
/// or after its deadline, and by the time the clock has reached its deadline (a driver
/// that slept through a wake-up would leave it unrun), and nothing cancelled runs.
#[test]
fn manual_wakeups_run_every_timer_on_time_exactly_once() {
    let (engine, clock) = manual_engine(3);
    let mut exec = Exec::new(&clock);
    let drivers = exec.spawn_drivers(&engine);
    assert_eq!(drivers.len(), 3);
    exec.run_until_idle();
    let runs: Runs = Arc::default();
    // id -> deadline, for timers that must run.
    let expected: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let next_id = Arc::new(AtomicUsize::new(0));
    let mut rng = Rng::new(7);
    for round in 0..60 {
        // Arm from three threads (each homes on a shard of its own, round robin).
        let threads: Vec<_> = (0..3)
            .map(|t| {
                let (engine, runs, expected, next_id, clock) = (
                    Arc::clone(&engine),
                    Arc::clone(&runs),
                    Arc::clone(&expected),
                    Arc::clone(&next_id),
                    clock.clone(),
                );
                let seed = rng.next() ^ t;
                std::thread::spawn(move || {
                    let mut rng = Rng::new(seed);
                    for _ in 0..20 {
                        let id = next_id.fetch_add(1, Ordering::SeqCst) as u64;
                        let delay = ms(rng.below(40));
                        let at = now(&clock);
                        let child_seed = rng.next();
                        let (runs2, expected2, next_id2, clock2, engine2) = (
                            Arc::clone(&runs),
                            Arc::clone(&expected),
                            Arc::clone(&next_id),
                            clock.clone(),
                            Arc::clone(&engine),
                        );
                        let mut inner = Some(record(&runs, id, &clock));
                        let handle = engine
                            .schedule(delay, move || {
                                (inner.take().unwrap())();
                                // A third of them arm a child from the callback.
                                if child_seed % 3 == 0 {
                                    let child = next_id2.fetch_add(1, Ordering::SeqCst) as u64;
                                    let delay = ms(child_seed % 17);
                                    let at = now(&clock2);
                                    expected2.lock().unwrap().insert(child, at + delay);
                                    engine2
                                        .schedule(delay, record(&runs2, child, &clock2))
                                        .unwrap();
                                }
                            })
                            .unwrap();
                        match rng.below(6) {
                            0 => {
                                assert!(engine.cancel(handle), "a pending timer not cancelled");
                            }
                            1 => {
                                let delay = ms(rng.below(60));
                                assert!(engine.reset(handle, delay));
                                expected.lock().unwrap().insert(id, at + delay);
                            }
                            _ => {
                                expected.lock().unwrap().insert(id, at + delay);
                            }
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        exec.run_until_idle();
        let step = ms(rng.below(if round % 10 == 9 { 30 } else { 6 }));
        exec.advance(step);
        let t = now(&clock);
        let runs = runs.lock().unwrap();
        for (id, deadline) in expected.lock().unwrap().iter() {
            match runs.get(id) {
                Some(at) => {
                    assert_eq!(at.len(), 1, "timer {id} ran {} times", at.len());
                    assert!(at[0] >= *deadline, "timer {id} ran early");
                }
                None => assert!(
                    *deadline > t,
                    "timer {id} due {:?} ago did not run: its driver slept through it",
                    t - *deadline
                ),
            }
        }
        let expected = expected.lock().unwrap();
        for id in runs.keys() {
            assert!(expected.contains_key(id), "cancelled timer {id} ran");
        }
    }
    // Everything left runs as the clock moves on.
    for _ in 0..20 {
        exec.advance(ms(10));
    }
    let runs = runs.lock().unwrap();
    for id in expected.lock().unwrap().keys() {
        assert_eq!(runs.get(id).map(Vec::len), Some(1), "timer {id} lost");
    }
    drop(runs);
    assert!(!exec.all_done());
    let report = engine.shutdown(PendingTimers::Drop);
    assert_eq!(report.ran + report.dropped, 0, "nothing was left");
    exec.run_until_idle();
    assert!(exec.all_done(), "a driver did not end after shutdown");
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Sleeps the drivers ask for are never before the shard's next deadline (waking too early
/// costs only a spurious poll, but a sleep asked for a pending, never-due plan would spin)
/// and an idle engine asks for none.
#[test]
fn manual_sleeps_are_for_real_deadlines_only() {
    let (engine, clock) = manual_engine(2);
    let mut exec = Exec::new(&clock);
    exec.spawn_drivers(&engine);
    exec.run_until_idle();
    exec.advance(ms(100));
    assert!(
        exec.asked.lock().unwrap().is_empty(),
        "an idle engine armed a sleep"
    );
    let start = now(&clock);
    let ran = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&ran);
    engine
        .schedule(ms(25), move || {
            r.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    exec.run_until_idle();
    let asked = exec.asked.lock().unwrap().clone();
    assert!(!asked.is_empty(), "no sleep for a pending timer");
    for at in &asked {
        assert!(*at > start, "a sleep for an instant already past");
        assert!(*at <= start + ms(25), "a sleep past the deadline");
    }
    exec.advance(ms(24));
    assert_eq!(ran.load(Ordering::SeqCst), 0, "fired early");
    exec.advance(ms(1));
    assert_eq!(ran.load(Ordering::SeqCst), 1, "not fired on time");
    let before = exec.asked.lock().unwrap().len();
    exec.advance(ms(1000));
    assert_eq!(
        exec.asked.lock().unwrap().len(),
        before,
        "a sleep after the last timer"
    );
}

/// Repeating timers on a driven engine: every run at or after its period boundary, the
/// right number of runs, a cancel from the callback itself stops it, and shutdown returns
/// every node.
#[test]
fn manual_repeating_timers_never_early_and_stop_on_cancel() {
    let (engine, clock) = manual_engine(2);
    let mut exec = Exec::new(&clock);
    exec.spawn_drivers(&engine);
    let start = now(&clock);
    let runs: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let r = Arc::clone(&runs);
    let c = clock.clone();
    engine
        .schedule_repeating(ms(7), move || r.lock().unwrap().push(now(&c)))
        .unwrap();
    // One that cancels itself on its third run.
    let self_runs = Arc::new(AtomicUsize::new(0));
    let handle_slot: Arc<Mutex<Option<corewheel::TimerHandle>>> = Arc::default();
    let (sr, hs, e) = (
        Arc::clone(&self_runs),
        Arc::clone(&handle_slot),
        Arc::clone(&engine),
    );
    let handle = engine
        .schedule_repeating(ms(3), move || {
            if sr.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
                let handle = hs.lock().unwrap().expect("handle stored");
                assert!(
                    e.cancel(handle),
                    "a repeating timer could not cancel itself"
                );
            }
        })
        .unwrap();
    *handle_slot.lock().unwrap() = Some(handle);
    // A zero period is clamped to one tick, never a busy loop.
    let zero_runs = Arc::new(AtomicUsize::new(0));
    let z = Arc::clone(&zero_runs);
    let zero = engine
        .schedule_repeating(Duration::ZERO, move || {
            z.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    for _ in 0..100 {
        exec.advance(ms(1));
    }
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 14, "runs of a 7 ms timer in 100 ms");
    for (k, at) in runs.iter().enumerate() {
        assert!(*at >= start + ms(7 * (k as u64 + 1)), "run {k} early");
    }
    assert_eq!(self_runs.load(Ordering::SeqCst), 3);
    let zeros = zero_runs.load(Ordering::SeqCst);
    assert!(
        (99..=100).contains(&zeros),
        "zero period ran {zeros} times in 100 ticks"
    );
    assert!(engine.cancel(zero));
    exec.advance(ms(10));
    assert_eq!(zero_runs.load(Ordering::SeqCst), zeros);
    shut_down_and_check(&engine, &mut exec);
}

/// Callbacks that turn the engine (gets 0, no deadlock), panic (contained, counted; the
/// driver goes on), reset another timer sooner, cancel one, and arm one with zero delay.
#[test]
fn manual_callbacks_turning_panicking_resetting() {
    let (engine, clock) = manual_engine(1);
    let mut exec = Exec::new(&clock);
    exec.spawn_drivers(&engine);
    exec.run_until_idle();
    let log: Arc<Mutex<Vec<(&'static str, Instant)>>> = Arc::default();
    let push = |name: &'static str| {
        let (log, clock) = (Arc::clone(&log), clock.clone());
        move || log.lock().unwrap().push((name, now(&clock)))
    };
    let start = now(&clock);
    let late = engine.schedule(ms(500), push("late")).unwrap();
    let doomed = engine.schedule(ms(30), push("doomed")).unwrap();
    let e = Arc::clone(&engine);
    let turned = Arc::new(AtomicUsize::new(usize::MAX));
    let t = Arc::clone(&turned);
    let zero = push("zero");
    let e2 = Arc::clone(&engine);
    engine
        .schedule(ms(5), move || {
            t.store(e.turn(), Ordering::SeqCst);
            assert!(e.reset(late, ms(10)), "reset from a callback");
            assert!(e.cancel(doomed), "cancel from a callback");
            e2.schedule(Duration::ZERO, zero).unwrap();
        })
        .unwrap();
    engine
        .schedule(ms(6), || panic!("a callback panics on the driver"))
        .unwrap();
    engine.schedule(ms(7), push("after-panic")).unwrap();
    for _ in 0..40 {
        exec.advance(ms(1));
    }
    assert_eq!(
        turned.load(Ordering::SeqCst),
        0,
        "a nested turn ran something"
    );
    let log = log.lock().unwrap().clone();
    let at = |name| {
        log.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, at)| *at - start)
    };
    // Armed at 5 ms with zero delay: due at 5 ms, run in the same turn or the next tick.
    let zero_at = at("zero").expect("a zero-delay timer from a callback never ran");
    assert!(
        zero_at >= ms(5) && zero_at <= ms(6),
        "zero delay ran at {zero_at:?}"
    );
    assert_eq!(at("after-panic"), Some(ms(7)));
    assert_eq!(at("late"), Some(ms(15)), "reset sooner from a callback");
    assert_eq!(at("doomed"), None, "a cancelled timer ran");
    assert_eq!(log.len(), 3);
    assert_eq!(engine.stats().total.panicked, 1);
    shut_down_and_check(&engine, &mut exec);
}

/// A thread resets a far timer much sooner while the driver sleeps until the far deadline:
/// it is woken, and the timer runs at its new deadline, not before, not after.
#[test]
fn manual_reset_sooner_from_another_thread_wakes_the_driver() {
    let (engine, clock) = manual_engine(2);
    let mut exec = Exec::new(&clock);
    exec.spawn_drivers(&engine);
    let runs: Runs = Arc::default();
    let start = now(&clock);
    let handles: Vec<_> = (0..4u64)
        .map(|id| {
            let (engine, runs, clock) = (Arc::clone(&engine), Arc::clone(&runs), clock.clone());
            std::thread::spawn(move || {
                engine
                    .schedule(ms(3_600_000), record(&runs, id, &clock))
                    .unwrap()
            })
            .join()
            .unwrap()
        })
        .collect();
    exec.run_until_idle();
    exec.advance(ms(5));
    for (n, handle) in handles.iter().enumerate() {
        let engine = Arc::clone(&engine);
        let handle = *handle;
        std::thread::spawn(move || assert!(engine.reset(handle, ms(3 + n as u64))))
            .join()
            .unwrap();
    }
    exec.run_until_idle();
    for _ in 0..10 {
        exec.advance(ms(1));
    }
    let runs = runs.lock().unwrap();
    for n in 0..4u64 {
        let at = runs.get(&n).expect("a timer reset sooner did not run");
        assert_eq!(at.len(), 1);
        assert_eq!(
            at[0] - start,
            ms(5 + 3 + n),
            "timer {n} not on its new deadline"
        );
    }
}

/// A shutdown from a callback (which cannot wait for its own turn) ends every driver,
/// including ones asleep with nothing planned, when each is polled only on its wake-ups;
/// the pending timers run once each (`PendingTimers::Run`), and a driver polled after it
/// completed stays complete.
#[test]
fn manual_shutdown_from_a_callback_ends_every_driver() {
    let (engine, clock) = manual_engine(3);
    let mut exec = Exec::new(&clock);
    let drivers = exec.spawn_drivers(&engine);
    exec.run_until_idle();
    let ran = Arc::new(AtomicUsize::new(0));
    // Pending timers on two shards (two threads), far away.
    arm_far_from_two_threads(&engine, 10, ms(100_000), counting_in(&ran));
    let e = Arc::clone(&engine);
    let report = Arc::new(Mutex::new(None));
    let rep = Arc::clone(&report);
    engine
        .schedule(ms(2), move || {
            *rep.lock().unwrap() = Some(e.shutdown(PendingTimers::Run));
            // Again, from inside: returns, no deadlock.
            e.shutdown(PendingTimers::Drop);
            assert!(matches!(
                e.schedule(ms(1), || {}),
                Err(ScheduleError::Shutdown)
            ));
        })
        .unwrap();
    exec.run_until_idle();
    exec.advance(ms(2));
    assert!(
        report.lock().unwrap().is_some(),
        "the shutdown callback never ran"
    );
    for driver in &drivers {
        assert!(exec.done(*driver), "driver {driver} never woke to end");
    }
    assert_eq!(ran.load(Ordering::SeqCst), 20);
    let report = engine.shutdown(PendingTimers::Drop);
    assert_eq!(report.ran, 20);
    assert_eq!(engine.nodes_in_use(), 0);
    // Polling a completed driver again: still ready, no panic.
    let again = engine.drivers(exec.sleeper());
    for driver in again {
        let mut driver = Box::pin(driver);
        let waker = Waker::from(Arc::new(Flag::default()));
        for _ in 0..3 {
            assert!(
                driver
                    .as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_ready()
            );
        }
    }
}

/// The last `Arc` of the engine is dropped inside a callback its driver runs: every
/// driver ends (polled on wake-ups only), and every pending timer's captures are dropped.
#[test]
fn manual_engine_dropped_inside_a_callback() {
    let (engine, clock) = manual_engine(2);
    let mut exec = Exec::new(&clock);
    let drivers = exec.spawn_drivers(&engine);
    exec.run_until_idle();
    let sentinel = Arc::new(());
    let held = Arc::clone(&sentinel);
    arm_far_from_two_threads(&engine, 5, ms(10_000), move || {
        let s = Arc::clone(&held);
        move || drop(s)
    });
    let slot = Arc::new(Mutex::new(Some(Arc::clone(&engine))));
    let s = Arc::clone(&slot);
    engine
        .schedule(ms(3), move || {
            let last = s.lock().unwrap().take();
            drop(last);
        })
        .unwrap();
    drop(engine);
    exec.run_until_idle();
    exec.advance(ms(3));
    for driver in &drivers {
        assert!(exec.done(*driver), "driver {driver} outlived its engine");
    }
    assert_eq!(
        Arc::strong_count(&sentinel),
        1,
        "pending timers' captures leaked"
    );
}

/// A driver dropped after its first poll (its waker still stored) and one never spawned:
/// the shard is still turned by `TimerEngine::turn` from a thread, nothing runs early, and
/// shutdown settles everything and returns every node.
#[test]
fn manual_dropped_and_unspawned_drivers_leave_turn_and_shutdown_working() {
    let (engine, clock) = manual_engine(2);
    let exec = Exec::new(&clock);
    let mut drivers = engine.drivers(exec.sleeper());
    let kept = drivers.pop().unwrap();
    let mut dropped = Box::pin(drivers.pop().unwrap());
    let waker = Waker::from(Arc::new(Flag::default()));
    assert!(
        dropped
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
    );
    drop(dropped);
    drop(kept); // never polled
    let runs: Runs = Arc::default();
    let start = now(&clock);
    for id in 0..4u64 {
        let (engine, runs, clock) = (Arc::clone(&engine), Arc::clone(&runs), clock.clone());
        std::thread::spawn(move || {
            engine
                .schedule(ms(5 + id), record(&runs, id, &clock))
                .unwrap();
        })
        .join()
        .unwrap();
    }
    clock.advance(ms(4));
    engine.turn();
    assert!(runs.lock().unwrap().is_empty(), "ran early");
    clock.advance(ms(10));
    engine.turn();
    let runs = runs.lock().unwrap();
    for id in 0..4u64 {
        let at = runs.get(&id).expect("a timer did not run");
        assert_eq!(at.len(), 1);
        assert!(at[0] >= start + ms(5 + id));
    }
    let pending = engine.schedule(ms(1000), || {}).unwrap();
    assert!(engine.is_pending(pending));
    let report = engine.shutdown(PendingTimers::Drop);
    assert_eq!(report.dropped, 1);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Found: `drivers()` may be called more than once (nothing forbids it; the brief's
/// "spawn the drivers twice"), giving two drivers per shard. The shard keeps one waker
/// slot, so only the driver that registered last is ever woken: at shutdown the other
/// one, asleep with nothing planned, is never woken and never completes.
///
/// Sequence: one shard, `drivers()` twice (A, B); poll A, then B (both idle, nothing
/// planned, both Pending); `shutdown`; only B's waker is woken; A is never woken again,
/// so a runtime never polls it: it stays Pending forever (a task leaked on the runtime,
/// and `JoinHandle::await` on it hangs; shown on tokio in
/// `tokio_spawning_the_drivers_twice_then_shutdown_ends_them_all`).
#[test]
fn manual_drivers_called_twice_shutdown_ends_them_all() {
    let (engine, clock) = manual_engine(1);
    let mut exec = Exec::new(&clock);
    let first = exec.spawn_drivers(&engine);
    let second = exec.spawn_drivers(&engine);
    assert!(
        second.is_empty(),
        "a second driver for a shard whose driver lives"
    );
    exec.run_until_idle();
    engine.shutdown(PendingTimers::Drop);
    exec.run_until_idle();
    for driver in first.iter().chain(&second) {
        assert!(
            exec.done(*driver),
            "driver {driver} never woke to end after shutdown"
        );
    }
}

/// Found (same root): two drivers for one shard, one of them dropped (its task aborted):
/// the survivor was never woken for a timer armed after the drop (the arming thread woke
/// the dropped one's stale waker, the only one the shard kept), so the timer was lost
/// while a driver for its shard still ran. Now a shard has one driver at a time: a second
/// `drivers()` makes none while the first lives, and one made after the first is dropped
/// takes over and runs a timer armed then.
#[test]
fn manual_surviving_duplicate_driver_still_runs_new_timers() {
    let (engine, clock) = manual_engine(1);
    let mut exec = Exec::new(&clock);
    let a = engine.drivers(exec.sleeper());
    assert_eq!(a.len(), 1);
    assert!(
        engine.drivers(exec.sleeper()).is_empty(),
        "a second driver while the first lives"
    );
    let waker = Waker::from(Arc::new(Flag::default()));
    let mut a = Box::pin(a.into_iter().next().unwrap());
    assert!(
        a.as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
    );
    // Its task aborted: a driver made now takes over the shard.
    drop(a);
    let mut b = engine.drivers(exec.sleeper());
    assert_eq!(b.len(), 1, "no driver after the first was dropped");
    exec.spawn(Box::pin(b.pop().unwrap()));
    exec.run_until_idle();
    let ran = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&ran);
    engine
        .schedule(ms(5), move || {
            r.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    for _ in 0..10 {
        exec.advance(ms(10));
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the timer was lost");
}

/// Found: a sleep that completes before the engine's clock reaches its instant makes the
/// driver busy-loop inside ONE `poll` (it turns, finds nothing due, makes a new sleep for
/// the same instant, finds it complete, turns again, ...) until the engine's clock gets
/// there: it never returns `Pending`, so it holds the runtime thread (on a current-thread
/// runtime, the whole runtime, including the task that would move the clock or shut the
/// engine down). This happens with a manual-clock driven engine on a runtime's real timer
/// (the manual clock lags real time), tokio's paused test clock (`start_paused`: tokio's
/// instants run ahead of `Instant::now`), or any sleep that completes early. The worker
/// thread version has no such spin; a driver could yield (wake itself and return
/// `Pending`) when its sleep completes before its plan is due.
///
/// Sequence: manual clock; `sleep_until = |_| std::future::ready(())` (any early sleep);
/// arm a timer 10 ms ahead; poll the driver once from a thread: the poll does not return
/// until the manual clock is advanced past 10 ms (here after 20 s), having made hundreds of
/// thousands of sleeps.
#[test]
fn an_early_sleep_makes_the_driver_yield_not_spin() {
    let (engine, clock) = manual_engine(1);
    let made = Arc::new(AtomicUsize::new(0));
    let m = Arc::clone(&made);
    let mut drivers = engine.drivers(move |_| {
        m.fetch_add(1, Ordering::SeqCst);
        std::future::ready(())
    });
    let mut driver = Box::pin(drivers.remove(0));
    engine.schedule(ms(10), || {}).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let poller = std::thread::spawn(move || {
        let waker = Waker::from(Arc::new(Flag::default()));
        let first = driver.as_mut().poll(&mut Context::from_waker(&waker));
        tx.send(first.is_pending()).unwrap();
        driver
    });
    let returned = rx.recv_timeout(Duration::from_secs(20));
    // Let the spin end either way, so the test ends.
    clock.advance(ms(20));
    let _driver = poller.join().unwrap();
    let made = made.load(Ordering::SeqCst);
    assert!(
        returned.is_ok(),
        "the driver's poll did not return within 20 s ({made} sleeps made)"
    );
    assert!(made < 100, "{made} sleeps made for one deadline");
}

/// The same spin, reached the realistic way: a manual-clock driven engine whose drivers
/// sleep on smol's executor with async-io's real timer (`Timer::at`), one executor thread.
/// Once real time passes the manual plan, the driver's poll spins (async-io's timer is
/// ready at once for a past instant, and has no cooperative budget) and never returns, so
/// the task on the same executor that would advance the manual clock never runs.
///
/// Sequence: `ManualClock::new()`; `.driven().manual_clock(clock)`; one smol executor
/// thread running the driver (`|at| async move { smol::Timer::at(at).await; }`) and a task
/// that waits 20 ms of real time then advances the clock 5 ms; arm a timer 5 ms (manual).
/// At 5 ms real, the driver's sleep completes, the manual clock is still at 0: the driver
/// loops inside its poll, and the clock-advancing task is starved forever (the test frees
/// it after 20 s by advancing the clock from outside).
#[test]
fn manual_clock_on_a_single_thread_smol_executor_does_not_starve_it() {
    let (engine, clock) = manual_engine(1);
    let (tx, rx) = std::sync::mpsc::channel();
    let e = Arc::clone(&engine);
    let c = clock.clone();
    let runner = std::thread::spawn(move || {
        let executor = smol::LocalExecutor::new();
        let ran = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&ran);
        e.schedule(ms(5), move || {
            r.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        let drivers: Vec<_> = e
            .drivers(|at| async move {
                smol::Timer::at(at).await;
            })
            .into_iter()
            .map(|d| executor.spawn(d))
            .collect();
        smol::block_on(executor.run(async {
            smol::Timer::after(ms(20)).await;
            c.advance(ms(5));
            smol::Timer::after(ms(5)).await;
        }));
        let fired = ran.load(Ordering::SeqCst);
        e.shutdown(PendingTimers::Drop);
        for d in drivers {
            smol::block_on(executor.run(d));
        }
        tx.send(fired).unwrap();
    });
    let result = rx.recv_timeout(Duration::from_secs(20));
    if result.is_err() {
        // Unstick it: the spin ends once the manual clock reaches the plan.
        clock.advance(ms(10));
    }
    let _ = runner.join();
    assert_eq!(
        result.ok(),
        Some(1),
        "the executor was starved by a spinning driver"
    );
}

/// On tokio the same early-completing sleep (manual clock behind real time) does not
/// starve the runtime, only because tokio's cooperative budget makes a sleep return
/// `Pending` now and then; meanwhile the driver busy-loops, making a new sleep per turn.
/// Checks the number of sleeps asked for while the manual clock stands still.
#[test]
fn manual_clock_on_tokio_does_not_busy_loop() {
    let (engine, clock) = manual_engine(1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let made = Arc::new(AtomicUsize::new(0));
    let m = Arc::clone(&made);
    let ran = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&ran);
    engine
        .schedule(ms(5), move || {
            r.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let drivers: Vec<_> = engine
        .drivers(move |at| {
            m.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep_until(at.into())
        })
        .into_iter()
        .map(|d| runtime.spawn(d))
        .collect();
    let c = clock.clone();
    runtime.block_on(async {
        tokio::time::sleep(ms(30)).await;
        c.advance(ms(5));
        tokio::time::sleep(ms(5)).await;
    });
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    engine.shutdown(PendingTimers::Drop);
    for d in drivers {
        runtime.block_on(d).unwrap();
    }
    let made = made.load(Ordering::SeqCst);
    assert!(made < 100, "{made} sleeps made for one deadline in 30 ms");
}

// ---------------------------------------------------------------------------------------
// Real runtimes.
// ---------------------------------------------------------------------------------------

/// Every timer's deadline (a lower bound read before arming) and its runs.
#[derive(Default)]
struct Ledger {
    runs: Mutex<HashMap<u64, Vec<Instant>>>,
    expected: Mutex<Vec<(u64, Instant)>>,
    cancelled: Mutex<Vec<u64>>,
}

impl Ledger {
    fn callback(self: &Arc<Self>, id: u64) -> impl FnOnce() + Send + 'static {
        let ledger = Arc::clone(self);
        move || {
            let at = Instant::now();
            ledger.runs.lock().unwrap().entry(id).or_default().push(at);
        }
    }

    /// Arms `count` timers from the calling thread with ids from `base`, cancelling and
    /// resetting some.
    fn arm(self: &Arc<Self>, engine: &TimerEngine, base: u64, count: u64, max_us: u64) {
        let mut rng = Rng::new(base + 1);
        for n in 0..count {
            let id = base + n;
            let delay = Duration::from_micros(rng.below(max_us));
            let armed = Instant::now();
            let handle = engine.schedule(delay, self.callback(id)).unwrap();
            let choice = rng.below(8);
            let later = delay + ms(rng.below(15));
            let sooner = Duration::from_micros(rng.below(max_us / 4 + 1));
            // Read before the reset: no later than the deadline it sets.
            let reset_at = Instant::now();
            let deadline = match choice {
                0 if engine.cancel(handle) => {
                    self.cancelled.lock().unwrap().push(id);
                    continue;
                }
                1 if engine.reset(handle, later) => reset_at + later,
                2 if engine.reset(handle, sooner) => reset_at + sooner,
                _ => armed + delay,
            };
            self.expected.lock().unwrap().push((id, deadline));
        }
    }

    /// Waits (bounded) for every expected timer, then checks exactly once, never early,
    /// and no cancelled one ran.
    fn check(&self) {
        let until = Instant::now() + LIMIT;
        loop {
            let missing = {
                let runs = self.runs.lock().unwrap();
                self.expected
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(id, _)| !runs.contains_key(id))
                    .count()
            };
            if missing == 0 {
                break;
            }
            assert!(
                Instant::now() < until,
                "{missing} timers lost after {LIMIT:?}"
            );
            std::thread::sleep(ms(5));
        }
        let runs = self.runs.lock().unwrap();
        for (id, deadline) in self.expected.lock().unwrap().iter() {
            let at = &runs[id];
            assert_eq!(at.len(), 1, "timer {id} ran {} times", at.len());
            assert!(
                at[0] >= *deadline,
                "timer {id} ran {:?} early",
                *deadline - at[0]
            );
        }
        for id in self.cancelled.lock().unwrap().iter() {
            assert!(!runs.contains_key(id), "cancelled timer {id} ran");
        }
    }
}

/// Whether the engine has shut down, seen by a user: a schedule fails.
trait ShutdownProbe {
    fn is_pending_shutdown_probe(&self) -> bool;
}

impl ShutdownProbe for TimerEngine {
    fn is_pending_shutdown_probe(&self) -> bool {
        match self.schedule(Duration::from_secs(3600), || {}) {
            Ok(handle) => {
                self.cancel(handle);
                false
            }
            Err(_) => true,
        }
    }
}

/// Drivers on a 2-thread tokio runtime for a 4-shard engine, timers armed, cancelled and
/// reset from tokio tasks (armed inside async tasks, on the runtime's own threads), from
/// plain threads, and from callbacks, while another thread calls `turn()` in a loop (racing
/// the drivers for their shards): exactly once, never early, nothing lost; then shutdown
/// ends the drivers and returns every node.
#[test]
fn tokio_tasks_threads_and_turns_race_the_drivers() {
    let runtime = support::driven::multi_thread(2);
    let engine = Arc::new(TimerEngine::builder().workers(4).driven().build().unwrap());
    let drivers = support::driven::spawn_drivers(&engine, &runtime);
    let ledger = Arc::new(Ledger::default());
    let stop = Arc::new(AtomicBool::new(false));
    let turner = {
        let (engine, stop) = (Arc::clone(&engine), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                engine.turn();
                std::thread::sleep(Duration::from_micros(300));
            }
        })
    };
    let tasks: Vec<_> = (0..4u64)
        .map(|t| {
            let (engine, ledger) = (Arc::clone(&engine), Arc::clone(&ledger));
            runtime.spawn(async move {
                for chunk in 0..10 {
                    ledger.arm(&engine, t * 10_000 + chunk * 100, 100, 30_000);
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    let threads: Vec<_> = (4..6u64)
        .map(|t| {
            let (engine, ledger) = (Arc::clone(&engine), Arc::clone(&ledger));
            std::thread::spawn(move || ledger.arm(&engine, t * 10_000, 1000, 30_000))
        })
        .collect();
    // Callbacks that arm more (from the drivers' threads).
    for k in 0..50u64 {
        let (e, l) = (Arc::clone(&engine), Arc::clone(&ledger));
        let id = 900_000 + k;
        let armed = Instant::now();
        let delay = ms(k % 20);
        ledger.expected.lock().unwrap().push((id, armed + delay));
        let cb = ledger.callback(id);
        engine
            .schedule(delay, move || {
                cb();
                l.arm(&e, 800_000 + k * 10, 10, 10_000);
            })
            .unwrap();
    }
    for t in tasks {
        runtime.block_on(t).unwrap();
    }
    for t in threads {
        t.join().unwrap();
    }
    ledger.check();
    stop.store(true, Ordering::SeqCst);
    turner.join().unwrap();
    engine.shutdown(PendingTimers::Drop);
    support::driven::await_drivers(&runtime, drivers);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Found (see `manual_drivers_called_twice_shutdown_ends_them_all`), on tokio: `drivers()`
/// called twice and both sets spawned; timers still fire exactly once, but after shutdown
/// one driver per shard never completes.
#[test]
fn tokio_spawning_the_drivers_twice_then_shutdown_ends_them_all() {
    let runtime = support::driven::multi_thread(2);
    let engine = Arc::new(TimerEngine::builder().workers(2).driven().build().unwrap());
    let mut drivers = Vec::new();
    for _ in 0..2 {
        for d in engine.drivers(|at| tokio::time::sleep_until(at.into())) {
            drivers.push(runtime.spawn(d));
        }
    }
    let ledger = Arc::new(Ledger::default());
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let (engine, ledger) = (Arc::clone(&engine), Arc::clone(&ledger));
            std::thread::spawn(move || ledger.arm(&engine, t * 10_000, 500, 20_000))
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    ledger.check();
    engine.shutdown(PendingTimers::Drop);
    support::driven::await_drivers(&runtime, drivers);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Drivers on a current-thread runtime run by a thread of its own (`block_on` a task
/// that awaits them), timers armed from other threads: all fire once, never early; a
/// shutdown from a plain thread ends the drivers.
#[test]
fn tokio_current_thread_runtime_drives_and_shuts_down() {
    let engine = Arc::new(TimerEngine::builder().workers(3).driven().build().unwrap());
    let e = Arc::clone(&engine);
    let runner = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let handles: Vec<_> = e
                .drivers(|at| tokio::time::sleep_until(at.into()))
                .into_iter()
                .map(tokio::spawn)
                .collect();
            drop(e);
            for h in handles {
                h.await.unwrap();
            }
        });
    });
    let ledger = Arc::new(Ledger::default());
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let (engine, ledger) = (Arc::clone(&engine), Arc::clone(&ledger));
            std::thread::spawn(move || ledger.arm(&engine, t * 10_000, 800, 25_000))
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    ledger.check();
    let report = engine.shutdown(PendingTimers::Run);
    assert_eq!(report.ran, 0);
    let until = Instant::now() + LIMIT;
    while !runner.is_finished() {
        assert!(Instant::now() < until, "drivers did not end after shutdown");
        std::thread::sleep(ms(2));
    }
    runner.join().unwrap();
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Shutdown from a task on a current-thread runtime, from inside a tokio task (not a
/// callback), with the drivers on that same runtime: no deadlock (nobody holds a shard
/// across a yield), and the drivers end.
#[test]
fn tokio_shutdown_from_a_task_on_the_drivers_runtime() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let engine = Arc::new(TimerEngine::builder().workers(2).driven().build().unwrap());
    let drivers = support::driven::spawn_drivers(&engine, &runtime);
    let ran = Arc::new(AtomicUsize::new(0));
    for d in [0, 1, 2, 3_600_000] {
        let r = Arc::clone(&ran);
        engine
            .schedule(ms(d), move || {
                r.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    let e = Arc::clone(&engine);
    let report = runtime.block_on(async move {
        tokio::time::sleep(ms(20)).await;
        e.shutdown(PendingTimers::Run)
    });
    assert_eq!(report.ran, 1, "the hour-long timer runs at shutdown");
    support::driven::await_drivers(&runtime, drivers);
    assert_eq!(ran.load(Ordering::SeqCst), 4);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Threads arm (and cancel some) as fast as they can while the main thread shuts down
/// (`PendingTimers::Run`) and the drivers run: every timer armed Ok and not cancelled
/// runs exactly once (fired by a driver or run by the shutdown), nothing cancelled runs,
/// arming after shutdown fails cleanly, the drivers end, and every node returns.
#[test]
fn tokio_shutdown_races_arming_and_drivers() {
    for round in 0..4u64 {
        let runtime = support::driven::multi_thread(2);
        let engine = Arc::new(TimerEngine::builder().workers(3).driven().build().unwrap());
        let drivers = support::driven::spawn_drivers(&engine, &runtime);
        let runs: Arc<Mutex<HashMap<u64, usize>>> = Arc::default();
        let armers: Vec<_> = (0..3u64)
            .map(|t| {
                let (engine, runs) = (Arc::clone(&engine), Arc::clone(&runs));
                std::thread::spawn(move || {
                    let mut rng = Rng::new(round * 10 + t);
                    let (mut ok, mut cancelled) = (Vec::new(), Vec::new());
                    for n in 0.. {
                        let id = (t << 32) | n;
                        let r = Arc::clone(&runs);
                        let delay = Duration::from_micros(rng.below(5_000));
                        match engine.schedule(delay, move || {
                            *r.lock().unwrap().entry(id).or_default() += 1;
                        }) {
                            Ok(handle) => {
                                if rng.below(4) == 0 && engine.cancel(handle) {
                                    cancelled.push(id);
                                } else {
                                    ok.push(id);
                                }
                            }
                            Err(ScheduleError::Shutdown) => break,
                            Err(other) => panic!("unexpected {other:?}"),
                        }
                    }
                    (ok, cancelled)
                })
            })
            .collect();
        // And a thread turning the engine, racing the drivers and the shutdown.
        let turner = {
            let engine = Arc::clone(&engine);
            std::thread::spawn(move || {
                while !engine.is_pending_shutdown_probe() {
                    engine.turn();
                    std::thread::sleep(Duration::from_micros(200));
                }
            })
        };
        std::thread::sleep(ms(15 + round * 5));
        engine.shutdown(PendingTimers::Run);
        turner.join().unwrap();
        let mut ok = Vec::new();
        let mut cancelled = Vec::new();
        for a in armers {
            let (o, c) = a.join().unwrap();
            ok.extend(o);
            cancelled.extend(c);
        }
        support::driven::await_drivers(&runtime, drivers);
        // A final shutdown from a thread that can wait.
        let report = engine.shutdown(PendingTimers::Run);
        let runs = runs.lock().unwrap();
        for id in &ok {
            assert_eq!(
                runs.get(id).copied(),
                Some(1),
                "timer {id:#x} armed Ok ran {:?} times (report {report:?})",
                runs.get(id)
            );
        }
        for id in &cancelled {
            assert!(!runs.contains_key(id), "cancelled {id:#x} ran");
        }
        assert_eq!(runs.len(), ok.len());
        assert_eq!(engine.nodes_in_use(), 0, "nodes leaked in round {round}");
    }
}

/// A callback blocks on its driver's runtime thread until a later timer of the same shard
/// has run: a thread calling `turn()` stands in for the stuck driver (`rescue_after`) and
/// runs it; both run exactly once, never early.
#[test]
fn tokio_turn_stands_in_for_a_driver_stuck_in_a_callback() {
    let runtime = support::driven::multi_thread(2);
    let engine = Arc::new(
        TimerEngine::builder()
            .workers(1)
            .rescue_after(Some(2))
            .driven()
            .build()
            .unwrap(),
    );
    let drivers = support::driven::spawn_drivers(&engine, &runtime);
    let second_ran = Arc::new(AtomicUsize::new(0));
    let first_ran = Arc::new(AtomicUsize::new(0));
    let released = Arc::new(AtomicBool::new(false));
    let (s, f, rel) = (
        Arc::clone(&second_ran),
        Arc::clone(&first_ran),
        Arc::clone(&released),
    );
    engine
        .schedule(ms(2), move || {
            f.fetch_add(1, Ordering::SeqCst);
            let until = Instant::now() + LIMIT;
            while s.load(Ordering::SeqCst) == 0 && Instant::now() < until {
                std::thread::sleep(Duration::from_micros(200));
            }
            rel.store(s.load(Ordering::SeqCst) == 1, Ordering::SeqCst);
        })
        .unwrap();
    // Only once the driver is inside the blocking callback: a `turn()` before would run
    // that callback itself, on this thread; and a second timer armed before might be
    // claimed in one run with the first (a driver polled late, on a loaded machine), and
    // wait for it, as the engine documents.
    let until = Instant::now() + LIMIT;
    while first_ran.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < until,
            "the driver never ran the first timer"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    let s = Arc::clone(&second_ran);
    let second_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let sa = Arc::clone(&second_at);
    let armed = Instant::now();
    engine
        .schedule(ms(4), move || {
            *sa.lock().unwrap() = Some(Instant::now());
            s.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    while second_ran.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < until,
            "nobody stood in for the stuck driver"
        );
        engine.turn();
        std::thread::sleep(Duration::from_micros(500));
    }
    let until = Instant::now() + LIMIT;
    while !released.load(Ordering::SeqCst) {
        assert!(
            Instant::now() < until,
            "the blocked callback never saw the rescue"
        );
        std::thread::sleep(ms(1));
    }
    assert!(
        second_at.lock().unwrap().unwrap() >= armed + ms(4),
        "ran early"
    );
    engine.shutdown(PendingTimers::Drop);
    support::driven::await_drivers(&runtime, drivers);
    assert_eq!(first_ran.load(Ordering::SeqCst), 1);
    assert_eq!(second_ran.load(Ordering::SeqCst), 1);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Two driven engines on one runtime, each with a callback that shuts down the other
/// (and then its own): no deadlock, every driver of both ends. The drivers start once
/// every timer is armed: a driver running meanwhile could fire the 3 ms shutdowns before
/// the last `schedule`, which would then meet a shut-down engine.
#[test]
fn tokio_two_engines_shut_each_other_down_from_callbacks() {
    for _ in 0..5 {
        let runtime = support::driven::multi_thread(2);
        let a = Arc::new(TimerEngine::builder().workers(2).driven().build().unwrap());
        let b = Arc::new(TimerEngine::builder().workers(2).driven().build().unwrap());
        for (this, other) in [(&a, &b), (&b, &a)] {
            let (this2, other2) = (Arc::clone(this), Arc::clone(other));
            this.schedule(ms(3), move || {
                other2.shutdown(PendingTimers::Run);
                this2.shutdown(PendingTimers::Run);
            })
            .unwrap();
            let o = Arc::clone(other);
            this.schedule(ms(3), move || drop(o)).unwrap();
            this.schedule(ms(60_000), || {}).unwrap();
        }
        let mut drivers = Vec::new();
        for engine in [&a, &b] {
            for d in engine.drivers(|at| tokio::time::sleep_until(at.into())) {
                drivers.push(runtime.spawn(d));
            }
        }
        support::driven::await_drivers(&runtime, drivers);
        for engine in [&a, &b] {
            engine.shutdown(PendingTimers::Run);
            assert_eq!(engine.nodes_in_use(), 0);
        }
    }
}

/// The last `Arc` of the engine dropped inside a callback on tokio (multi-thread): the
/// drivers end, and the pending timers' captures are dropped.
#[test]
fn tokio_engine_dropped_inside_a_callback() {
    let runtime = support::driven::multi_thread(2);
    let engine = Arc::new(TimerEngine::builder().workers(2).driven().build().unwrap());
    let drivers = support::driven::spawn_drivers(&engine, &runtime);
    let sentinel = Arc::new(());
    let held = Arc::clone(&sentinel);
    arm_far_from_two_threads(&engine, 50, ms(3_600_000), move || {
        let s = Arc::clone(&held);
        move || drop(s)
    });
    let slot = Arc::new(Mutex::new(Some(Arc::clone(&engine))));
    let s = Arc::clone(&slot);
    engine
        .schedule(ms(3), move || drop(s.lock().unwrap().take()))
        .unwrap();
    drop(engine);
    support::driven::await_drivers(&runtime, drivers);
    assert_eq!(Arc::strong_count(&sentinel), 1, "captures leaked");
}

/// Bad and extreme input on a driven engine on tokio: zero, huge and `Duration::MAX`
/// delays, deadlines in the past and at the far end of time, resets to `Duration::MAX`,
/// and a one-hour tick: no panic (the drivers hand tokio no instant it cannot take), the
/// small ones fire, and shutdown settles the rest.
#[test]
fn tokio_extreme_delays_and_ticks_do_not_panic_the_drivers() {
    for tick in [Duration::from_nanos(1), ms(1), Duration::from_secs(3600)] {
        let runtime = support::driven::multi_thread(2);
        let engine = Arc::new(
            TimerEngine::builder()
                .workers(2)
                .tick(tick)
                .driven()
                .build()
                .unwrap(),
        );
        let drivers = support::driven::spawn_drivers(&engine, &runtime);
        let fired = Arc::new(AtomicUsize::new(0));
        let count = || {
            let f = Arc::clone(&fired);
            move || {
                f.fetch_add(1, Ordering::SeqCst);
            }
        };
        let far = [
            Duration::MAX,
            Duration::from_secs(u64::MAX / 3),
            Duration::from_secs(1 << 40),
            Duration::from_secs(86_400 * 365 * 1000),
        ];
        let mut handles = Vec::new();
        for d in far {
            handles.push(engine.schedule(d, count()).unwrap());
            let _ = engine.schedule_repeating(d, count()).unwrap();
        }
        let past = Instant::now()
            .checked_sub(Duration::from_secs(3600))
            .unwrap_or_else(Instant::now);
        engine.schedule_at(past, count()).unwrap();
        engine.schedule(Duration::ZERO, count()).unwrap();
        let h = engine.schedule(ms(1), count()).unwrap();
        assert!(engine.reset(h, Duration::MAX));
        let h2 = engine.schedule(Duration::MAX, count()).unwrap();
        assert!(engine.reset(h2, Duration::ZERO));
        // Small ones: past, zero, reset to zero. With a one-hour tick, "zero" and the
        // reset one are due in the next tick, an hour out: only the past one can fire.
        let small = if tick >= Duration::from_secs(1) { 1 } else { 3 };
        let until = Instant::now() + LIMIT;
        while fired.load(Ordering::SeqCst) < small {
            assert!(
                Instant::now() < until,
                "small timers never fired (tick {tick:?})"
            );
            std::thread::sleep(ms(2));
        }
        std::thread::sleep(ms(20));
        assert!(
            drivers.iter().all(|d| !d.is_finished()),
            "a driver ended (panicked?) early"
        );
        assert_eq!(
            fired.load(Ordering::SeqCst),
            small,
            "a far timer fired (tick {tick:?})"
        );
        let report = engine.shutdown(PendingTimers::Drop);
        assert!(report.dropped >= 9, "{report:?}");
        support::driven::await_drivers(&runtime, drivers);
        assert_eq!(engine.nodes_in_use(), 0);
    }
}

/// Drivers dropped mid-way on tokio (their tasks aborted while asleep): the engine's
/// shutdown still settles every timer and returns every node; `turn()` still runs the
/// orphaned shard meanwhile.
#[test]
fn tokio_aborted_drivers_leave_turn_and_shutdown_working() {
    let runtime = support::driven::multi_thread(2);
    let engine = Arc::new(TimerEngine::builder().workers(2).driven().build().unwrap());
    let drivers = support::driven::spawn_drivers(&engine, &runtime);
    let ran = Arc::new(AtomicUsize::new(0));
    arm_far_from_two_threads(&engine, 20, ms(3_600_000), counting_in(&ran));
    std::thread::sleep(ms(10));
    for d in &drivers {
        d.abort();
    }
    for d in drivers {
        let _ = runtime.block_on(d);
    }
    // Now nothing turns the shards but `turn()`.
    let r = Arc::clone(&ran);
    let armed = Instant::now();
    let at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let a = Arc::clone(&at);
    engine
        .schedule(ms(3), move || {
            *a.lock().unwrap() = Some(Instant::now());
            r.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let until = Instant::now() + LIMIT;
    while ran.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < until,
            "turn() did not run the orphaned shard"
        );
        engine.turn();
        std::thread::sleep(ms(1));
    }
    assert!(at.lock().unwrap().unwrap() >= armed + ms(3));
    let report = engine.shutdown(PendingTimers::Run);
    assert_eq!(report.ran, 40);
    assert_eq!(ran.load(Ordering::SeqCst), 41);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Drivers on smol's executor (async-executor, two threads) sleeping on async-io timers
/// (`Timer::at`): timers armed from threads fire once, never early, none lost; shutdown
/// ends the drivers.
#[test]
fn smol_executor_with_async_io_timers() {
    let engine = Arc::new(TimerEngine::builder().workers(2).driven().build().unwrap());
    let executor = Arc::new(smol::Executor::new());
    let (stop_tx, stop_rx) = smol::channel::unbounded::<()>();
    let runners: Vec<_> = (0..2)
        .map(|_| {
            let (ex, rx) = (Arc::clone(&executor), stop_rx.clone());
            std::thread::spawn(move || smol::block_on(ex.run(rx.recv())))
        })
        .collect();
    let tasks: Vec<_> = engine
        .drivers(|at| async move {
            smol::Timer::at(at).await;
        })
        .into_iter()
        .map(|d| executor.spawn(d))
        .collect();
    let ledger = Arc::new(Ledger::default());
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let (engine, ledger) = (Arc::clone(&engine), Arc::clone(&ledger));
            std::thread::spawn(move || ledger.arm(&engine, t * 10_000, 800, 25_000))
        })
        .collect();
    // And from a task on the executor.
    let (e, l) = (Arc::clone(&engine), Arc::clone(&ledger));
    let from_task = executor.spawn(async move { l.arm(&e, 50_000, 500, 25_000) });
    for t in threads {
        t.join().unwrap();
    }
    smol::block_on(from_task);
    ledger.check();
    engine.shutdown(PendingTimers::Drop);
    for task in tasks {
        let finished = smol::block_on(async {
            futures::future::select(Box::pin(task), Box::pin(smol::Timer::after(LIMIT))).await
        });
        assert!(
            matches!(finished, futures::future::Either::Left(_)),
            "a driver did not end after shutdown"
        );
    }
    assert_eq!(engine.nodes_in_use(), 0);
    drop(stop_tx);
    for r in runners {
        let _ = r.join().unwrap();
    }
}

/// A `sleep_until` that panics (user code, called by the driver's poll) kills that
/// driver's task only: the shard was already given back, so `turn()` still runs it, and
/// shutdown settles everything without waiting for anyone. The sleep panics once a timer
/// has run, and a timer an hour out keeps a next deadline to sleep for, so the driver
/// dies however late the runtime polls it (a turn that ran both short timers at once
/// used to leave nothing to sleep for, and the test waited out its limit).
#[test]
fn tokio_a_panicking_sleep_until_kills_only_its_driver() {
    let runtime = support::driven::multi_thread(2);
    let engine = Arc::new(TimerEngine::builder().workers(1).driven().build().unwrap());
    let ran = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&ran);
    let drivers: Vec<_> = engine
        .drivers(move |at| {
            if seen.load(Ordering::SeqCst) >= 1 {
                panic!("sleep_until panics");
            }
            tokio::time::sleep_until(at.into())
        })
        .into_iter()
        .map(|d| runtime.spawn(d))
        .collect();
    for delay in [2, 4] {
        let r = Arc::clone(&ran);
        engine
            .schedule(ms(delay), move || {
                r.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    engine.schedule(ms(3_600_000), || {}).unwrap();
    for d in drivers {
        let result = runtime.block_on(async { tokio::time::timeout(LIMIT, d).await });
        assert!(
            result
                .expect("the driver neither ended nor panicked")
                .is_err(),
            "the driver should have died of the panic"
        );
    }
    let until = Instant::now() + LIMIT;
    while ran.load(Ordering::SeqCst) < 2 {
        assert!(
            Instant::now() < until,
            "turn() did not take over the orphaned shard"
        );
        engine.turn();
        std::thread::sleep(ms(1));
    }
    let report = engine.shutdown(PendingTimers::Drop);
    assert_eq!(report.dropped, 1);
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// While a thread's `turn()` holds a shard (its callback blocks for 200 ms), that shard's
/// driver, woken by a timer armed meanwhile, waits by waking itself on every poll: a busy
/// loop on a runtime thread for as long as the callback blocks (here counted as polls of
/// the driver). The same loop runs in a driver's `finish` while a shutdown's last turn or
/// a `turn()` holds the shard. Not one of the listed promises, but a runtime thread at
/// 100% for the length of someone else's callback.
///
/// Sequence: driven engine, one shard, real clock, driver on a current-thread tokio
/// runtime (its own thread). Thread T: `engine.turn()`, which runs a callback due now
/// that sleeps 200 ms. Meanwhile arm a timer due in 1 ms: it wakes the driver, whose
/// poll finds the shard owned (`try_own` fails), wakes itself and returns `Pending`, over
/// and over: tens of thousands of polls in 200 ms.
#[test]
fn a_driver_waiting_for_a_turn_caller_does_not_busy_loop() {
    let engine = Arc::new(TimerEngine::builder().workers(1).driven().build().unwrap());
    let polls = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&started);
    // Due at once: the next `turn()` runs it.
    engine
        .schedule(Duration::ZERO, move || {
            s.store(true, Ordering::SeqCst);
            std::thread::sleep(ms(200));
        })
        .unwrap();
    std::thread::sleep(ms(2));
    let e = Arc::clone(&engine);
    let turner = std::thread::spawn(move || e.turn());
    let until = Instant::now() + LIMIT;
    while !started.load(Ordering::SeqCst) {
        assert!(Instant::now() < until);
        std::thread::sleep(Duration::from_micros(100));
    }
    // Now the turner holds the shard, inside the callback. Start the driver.
    let e = Arc::clone(&engine);
    let p = Arc::clone(&polls);
    let runner = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let mut driver = Box::pin(
            e.drivers(|at| tokio::time::sleep_until(at.into()))
                .pop()
                .unwrap(),
        );
        drop(e);
        runtime.block_on(std::future::poll_fn(move |cx| {
            p.fetch_add(1, Ordering::SeqCst);
            driver.as_mut().poll(cx)
        }));
    });
    let fired = Arc::new(AtomicBool::new(false));
    let f = Arc::clone(&fired);
    engine
        .schedule(ms(1), move || f.store(true, Ordering::SeqCst))
        .unwrap();
    turner.join().unwrap();
    let until = Instant::now() + LIMIT;
    while !fired.load(Ordering::SeqCst) {
        assert!(Instant::now() < until, "the timer was lost");
        std::thread::sleep(ms(1));
    }
    let polls_while_blocked = polls.load(Ordering::SeqCst);
    engine.shutdown(PendingTimers::Drop);
    runner.join().unwrap();
    assert!(
        polls_while_blocked < 1000,
        "{polls_while_blocked} polls of the driver while another thread's callback blocked 200 ms"
    );
}
