//! A driven engine (`EngineBuilder::driven`): no worker threads, its shards turned by
//! driver futures on the application's runtime. With a manual clock, the drivers' logic
//! step by step: what each poll runs, the plan it sleeps until, the wake-up a sooner
//! timer sends, and nothing armed while nothing is pending. On tokio with the real clock:
//! never early, exactly once, nothing lost, from threads and tasks at once, and shutdown
//! or drop ending the drivers.

use crate::support;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::support::Wakes;
use crate::support::ms;
use corewheel::{Clock, ManualClock, PendingTimers, TimerEngine};

/// A sleep on the manual clock: ready once the clock has reached its instant. Polled only
/// when the test polls its driver.
struct ManualSleep {
    clock: ManualClock,
    at: Instant,
}

impl Future for ManualSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if self.clock.now() >= self.at {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// A driven one-shard engine on a manual clock, its driver, and the instants the driver
/// asked to sleep until.
struct Manual<D> {
    engine: Arc<TimerEngine>,
    clock: ManualClock,
    driver: Pin<Box<D>>,
    sleeps: Arc<Mutex<Vec<Instant>>>,
    wakes: Arc<Wakes>,
    waker: Waker,
}

fn manual() -> Manual<impl Future<Output = ()>> {
    let clock = ManualClock::new();
    let engine = Arc::new(
        TimerEngine::builder()
            .workers(1)
            .driven()
            .manual_clock(clock.clone())
            .build()
            .unwrap(),
    );
    let sleeps = Arc::new(Mutex::new(Vec::new()));
    let (asked, sleep_clock) = (Arc::clone(&sleeps), clock.clone());
    let mut drivers = engine.drivers(move |at| {
        asked.lock().unwrap().push(at);
        ManualSleep {
            clock: sleep_clock.clone(),
            at,
        }
    });
    assert_eq!(drivers.len(), 1, "one driver per shard");
    let driver = Box::pin(drivers.remove(0));
    let (wakes, waker) = Wakes::waker();
    Manual {
        engine,
        clock,
        driver,
        sleeps,
        wakes,
        waker,
    }
}

impl<D: Future<Output = ()>> Manual<D> {
    fn poll(&mut self) -> Poll<()> {
        self.driver
            .as_mut()
            .poll(&mut Context::from_waker(&self.waker))
    }

    fn wakes(&self) -> usize {
        self.wakes.count()
    }

    fn last_sleep(&self) -> Option<Instant> {
        self.sleeps.lock().unwrap().last().copied()
    }

    fn sleeps_asked(&self) -> usize {
        self.sleeps.lock().unwrap().len()
    }
}

/// A callback that counts its runs in `ran`.
fn count(ran: &Arc<AtomicUsize>) -> impl FnOnce() + Send + 'static {
    let ran = Arc::clone(ran);
    move || {
        ran.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_driver_runs_its_shard_at_the_deadline_and_sleeps_until_the_next() {
    let mut m = manual();
    let ran = Arc::new(AtomicUsize::new(0));
    let start = m.clock.now();
    m.engine.schedule(ms(10), count(&ran)).unwrap();
    m.engine.schedule(ms(30), count(&ran)).unwrap();
    assert!(m.poll().is_pending());
    let first = m.last_sleep().expect("a sleep for the first deadline");
    assert!(first >= start + ms(10), "asked to wake before the deadline");
    assert!(
        first <= start + ms(11),
        "asked to wake a tick late: {:?}",
        first - start
    );
    m.clock.advance(ms(9));
    assert!(m.poll().is_pending());
    assert_eq!(ran.load(Ordering::SeqCst), 0, "never early");
    m.clock.advance_to(first);
    assert!(m.poll().is_pending());
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    let second = m.last_sleep().unwrap();
    assert!(second >= start + ms(30) && second <= start + ms(31));
    m.clock.advance_to(second);
    assert!(m.poll().is_pending());
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    assert_eq!(m.engine.stats().total.fired, 2);
}

#[test]
fn nothing_pending_arms_no_sleep_and_a_new_timer_wakes_the_driver() {
    let mut m = manual();
    assert!(m.poll().is_pending());
    assert!(m.poll().is_pending());
    assert_eq!(
        m.sleeps_asked(),
        0,
        "an idle engine armed the runtime's timer"
    );
    assert_eq!(m.wakes(), 0);
    let ran = Arc::new(AtomicUsize::new(0));
    m.engine.schedule(ms(5), count(&ran)).unwrap();
    assert_eq!(
        m.wakes(),
        1,
        "the driver slept through a timer it did not know of"
    );
    assert!(m.poll().is_pending());
    assert_eq!(m.sleeps_asked(), 1);
    m.clock.advance(ms(5));
    assert!(m.poll().is_pending());
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    // Fired and gone: nothing pending again, and no new sleep.
    assert!(m.poll().is_pending());
    assert_eq!(m.sleeps_asked(), 1);
}

#[test]
fn a_sooner_timer_wakes_the_driver_and_a_later_one_does_not() {
    let mut m = manual();
    let ran = Arc::new(AtomicUsize::new(0));
    m.engine.schedule(ms(50), count(&ran)).unwrap();
    assert!(m.poll().is_pending());
    let wakes = m.wakes();
    m.engine.schedule(ms(80), count(&ran)).unwrap();
    assert_eq!(m.wakes(), wakes, "a later timer woke the driver");
    m.engine.schedule(ms(20), count(&ran)).unwrap();
    assert_eq!(
        m.wakes(),
        wakes + 1,
        "a sooner timer did not wake the driver"
    );
    assert!(m.poll().is_pending());
    let start = m.clock.now();
    let sleep = m.last_sleep().unwrap();
    assert!(
        sleep <= start + ms(21),
        "still asleep until the later deadline"
    );
    m.clock.advance(ms(20));
    assert!(m.poll().is_pending());
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[test]
fn a_spurious_poll_runs_nothing_early() {
    let mut m = manual();
    let ran = Arc::new(AtomicUsize::new(0));
    m.engine.schedule(ms(10), count(&ran)).unwrap();
    for _ in 0..9 {
        assert!(m.poll().is_pending());
        m.clock.advance(ms(1));
        assert_eq!(ran.load(Ordering::SeqCst), 0, "fired early");
    }
    m.clock.advance(ms(1));
    assert!(m.poll().is_pending());
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[test]
fn shutdown_ends_a_waiting_driver_and_settles_its_timers() {
    let mut m = manual();
    let ran = Arc::new(AtomicUsize::new(0));
    for delay in [5, 50, 500] {
        m.engine.schedule(ms(delay), count(&ran)).unwrap();
    }
    assert!(m.poll().is_pending());
    let wakes = m.wakes();
    let report = m.engine.shutdown(PendingTimers::Run);
    assert_eq!(report.ran, 3);
    assert_eq!(ran.load(Ordering::SeqCst), 3);
    assert!(m.wakes() > wakes, "shutdown did not wake the driver");
    assert!(
        m.poll().is_ready(),
        "the driver outlived the engine's shutdown"
    );
}

#[test]
fn a_driver_polled_after_shutdown_makes_the_last_turn_nobody_made() {
    let mut m = manual();
    let ran = Arc::new(AtomicUsize::new(0));
    m.engine.schedule(ms(5), count(&ran)).unwrap();
    // Shut down from inside a callback the driver runs: the shutdown cannot wait for
    // the turn it is in, so the driver finishes the shard when that turn ends.
    let inner = Arc::clone(&m.engine);
    m.engine
        .schedule(ms(1), move || {
            inner.shutdown(PendingTimers::Drop);
        })
        .unwrap();
    m.clock.advance(ms(1));
    assert!(m.poll().is_ready());
    assert_eq!(ran.load(Ordering::SeqCst), 0, "a dropped timer ran");
    assert_eq!(m.engine.stats().total.dropped_at_shutdown, 1);
    assert_eq!(m.engine.nodes_in_use(), 0);
}

#[test]
fn an_engine_with_worker_threads_has_no_drivers() {
    let engine = TimerEngine::builder().workers(2).build().unwrap();
    let drivers = engine.drivers(|_| std::future::ready(()));
    assert!(drivers.is_empty());
}

#[test]
fn without_drivers_a_turn_from_any_thread_runs_a_driven_engine() {
    let engine = TimerEngine::builder().workers(2).driven().build().unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    engine.schedule(ms(2), count(&ran)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while ran.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the timer never fired");
        engine.turn();
        std::thread::sleep(ms(1));
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

/// On a tokio runtime with the real clock: timers armed from tokio tasks and from plain
/// threads, some cancelled and some reset, fire exactly once, never before their deadline,
/// and none is lost; then a shutdown ends every driver.
#[test]
fn on_tokio_timers_fire_once_never_early_and_shutdown_ends_the_drivers() {
    let runtime = support::driven::multi_thread(2);
    let engine = Arc::new(TimerEngine::builder().workers(2).driven().build().unwrap());
    let drivers = support::driven::spawn_drivers(&engine, &runtime);
    // Every timer's deadline and the instants its callback ran at.
    let fires: Arc<Mutex<HashMap<u64, Vec<Instant>>>> = Arc::default();
    const PER_SOURCE: u64 = 2_000;
    let arm = {
        let (engine, fires) = (Arc::clone(&engine), Arc::clone(&fires));
        move |source: u64| {
            let mut deadlines = Vec::new();
            let mut x = source.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for n in 0..PER_SOURCE {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let id = source * PER_SOURCE + n;
                let delay = Duration::from_micros(x % 40_000);
                let fires = Arc::clone(&fires);
                let armed = Instant::now();
                let handle = engine
                    .schedule(delay, move || {
                        fires
                            .lock()
                            .unwrap()
                            .entry(id)
                            .or_default()
                            .push(Instant::now());
                    })
                    .unwrap();
                // One in eight is cancelled at once (unless it has fired already, it never
                // does), and one in eight pushed back, due 10 ms later than it was.
                let reset_at = Instant::now();
                let deadline = match x % 8 {
                    0 if engine.cancel(handle) => continue,
                    1 if engine.reset(handle, delay + ms(10)) => reset_at + delay + ms(10),
                    _ => armed + delay,
                };
                deadlines.push((id, deadline));
            }
            deadlines
        }
    };
    let from_tasks: Vec<_> = (0..2)
        .map(|source| {
            runtime.spawn_blocking({
                let arm = arm.clone();
                move || arm(source)
            })
        })
        .collect();
    let from_threads: Vec<_> = (2..4)
        .map(|source| {
            std::thread::spawn({
                let arm = arm.clone();
                move || arm(source)
            })
        })
        .collect();
    let mut expected: Vec<(u64, Instant)> = from_threads
        .into_iter()
        .flat_map(|thread| thread.join().unwrap())
        .collect();
    for task in from_tasks {
        expected.extend(runtime.block_on(task).unwrap());
    }
    let wait_until = Instant::now() + Duration::from_secs(60);
    loop {
        let fired = fires.lock().unwrap().len();
        if expected
            .iter()
            .all(|(id, _)| fires.lock().unwrap().contains_key(id))
        {
            break;
        }
        assert!(
            Instant::now() < wait_until,
            "{fired} fired of {} expected after 60 s",
            expected.len()
        );
        std::thread::sleep(ms(5));
    }
    let fires = fires.lock().unwrap().clone();
    let expected_ids: std::collections::HashSet<u64> = expected.iter().map(|(id, _)| *id).collect();
    for (id, deadline) in &expected {
        let runs = &fires[id];
        assert_eq!(runs.len(), 1, "timer {id} ran {} times", runs.len());
        // Read before `schedule` (or `reset`) was called, so no later than the engine's
        // deadline: a run before it is early for certain.
        assert!(
            runs[0] >= *deadline,
            "timer {id} ran {:?} early",
            *deadline - runs[0]
        );
    }
    for id in fires.keys() {
        assert!(expected_ids.contains(id), "cancelled timer {id} ran");
    }
    let report = engine.shutdown(PendingTimers::Drop);
    assert_eq!(report.ran, 0);
    support::driven::await_drivers(&runtime, drivers);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// A callback on one shard's driver shuts the engine down: that shutdown cannot wait for
/// the turn it is inside, yet every driver, the other shard's one asleep with nothing
/// planned included, ends, and every pending timer is settled.
#[test]
fn a_shutdown_from_a_callback_ends_every_driver() {
    let runtime = support::driven::multi_thread(2);
    let engine = Arc::new(TimerEngine::builder().workers(2).driven().build().unwrap());
    let drivers = support::driven::spawn_drivers(&engine, &runtime);
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..100 {
        engine
            .schedule(Duration::from_secs(3600), count(&ran))
            .unwrap();
    }
    let inner = Arc::clone(&engine);
    engine
        .schedule(ms(5), move || {
            inner.shutdown(PendingTimers::Run);
        })
        .unwrap();
    for driver in drivers {
        runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(30), driver).await })
            .expect("a driver did not end after a shutdown from a callback")
            .unwrap();
    }
    assert_eq!(
        ran.load(Ordering::SeqCst),
        100,
        "pending timers not run at shutdown"
    );
    assert_eq!(engine.nodes_in_use(), 0);
}

/// The async layer on a driven engine: `Sleep` futures awaited by tokio tasks complete,
/// none before its deadline, on wake-ups of the runtime that also drives the engine.
#[test]
fn sleeps_on_a_driven_engine_complete_never_early() {
    let runtime = support::driven::multi_thread(2);
    let engine: &'static TimerEngine = Box::leak(Box::new(
        TimerEngine::builder().workers(2).driven().build().unwrap(),
    ));
    let drivers = support::driven::spawn_drivers(engine, &runtime);
    let tasks: Vec<_> = (0..200_u64)
        .map(|n| {
            runtime.spawn(async move {
                let delay = Duration::from_micros(n * 137 % 20_000);
                let start = Instant::now();
                engine.sleep(delay).await;
                start.elapsed() >= delay
            })
        })
        .collect();
    for task in tasks {
        let on_time = runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(30), task).await })
            .expect("a sleep never completed")
            .unwrap();
        assert!(on_time, "a sleep completed before its delay");
    }
    engine.shutdown(PendingTimers::Drop);
    for driver in drivers {
        runtime.block_on(driver).unwrap();
    }
    assert_eq!(engine.nodes_in_use(), 0);
}
