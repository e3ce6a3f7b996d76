//! A driven engine's driver (`EngineBuilder::driven`) against a thread arming a timer, and
//! against a shutdown. The driver publishes the tick it sleeps until after storing its
//! waker, and looks once more for arrivals; a thread whose timer is due sooner swaps the
//! plan and wakes the waker. Checked: no wake-up is lost (a driver left waiting is woken,
//! or sleeps until no later than the timer's tick), nothing runs early, every timer runs
//! once, and a shutdown ends the driver with every node given back.
#![cfg(loom)]

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use corewheel::{ManualClock, PendingTimers, TimerEngine};
use corewheel_loom_tests::{Probe, Wakes, counting, model, ticks};
use loom::sync::Arc;
use loom::sync::atomic::{Ordering, fence};
use loom::thread;

/// The one driver of a one-shard driven engine on a manual clock, and the instant its
/// latest sleep was for. Its sleeps never complete by themselves: a model polls the driver
/// again only where a runtime would, when woken or when that instant has come.
type Asked = std::sync::Arc<std::sync::Mutex<Option<Instant>>>;

fn driven() -> (
    Arc<TimerEngine>,
    ManualClock,
    Pin<Box<impl Future<Output = ()> + Send>>,
    Asked,
) {
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(1)
        .tick(corewheel_loom_tests::TICK)
        .driven()
        .manual_clock(clock.clone())
        .build()
        .expect("a driven engine starts no threads");
    let asked = Asked::default();
    let record = std::sync::Arc::clone(&asked);
    let mut drivers = engine.drivers(move |at| {
        *record.lock().unwrap() = Some(at);
        std::future::pending::<()>()
    });
    let driver = Box::pin(drivers.remove(0));
    (Arc::new(engine), clock, driver, asked)
}

/// The driver, left waiting, will be polled again by now: it was woken, or the sleep it
/// asked for has come. Otherwise a runtime would never poll it, and its timer is lost.
fn assert_woken_or_due(wakes: &Wakes, asked: &Asked, engine: &TimerEngine) {
    let asked = *asked.lock().unwrap();
    assert!(
        wakes.count() > 0 || asked.is_some_and(|at| at <= engine.now()),
        "the driver waits past the timer, unwoken (sleep until {asked:?})"
    );
}

fn poll(driver: &mut Pin<Box<impl Future<Output = ()>>>, waker: &Waker) -> Poll<()> {
    driver.as_mut().poll(&mut Context::from_waker(waker))
}

/// A timer armed on the main thread while the driver turns on another and goes to wait:
/// either the driver's look found it, and its sleep is for the timer's tick at the latest,
/// or the arming woke it. Polled again once that tick has come, it runs the timer once.
#[test]
fn a_timer_armed_while_the_driver_turns_is_not_slept_through() {
    // Three preemptions (0.4 s) catch both a driver that skips its look after publishing
    // its plan (two needed) and an arming that wakes no driver; every interleaving takes
    // nearly five minutes.
    model(Some(3), || {
        let (engine, clock, mut driver, asked) = driven();
        let (wakes, waker) = counting();
        let poller = thread::spawn(move || {
            assert!(poll(&mut driver, &waker).is_pending());
            driver
        });
        let probe = Probe::new();
        engine.schedule(ticks(2), probe.callback()).unwrap();
        let mut driver = poller.join().unwrap();
        assert_eq!(probe.ran(), 0, "ran before its deadline");
        clock.advance(ticks(2));
        assert_woken_or_due(&wakes, &asked, &engine);
        let (_, waker) = counting();
        assert!(poll(&mut driver, &waker).is_pending());
        assert_eq!(probe.ran(), 1);
        assert_eq!((probe.ran(), probe.dropped()), (1, 1));
        assert_eq!(engine.nodes_in_use(), 0, "the node was not given back");
    });
}

/// A shutdown that runs pending timers, on another thread, while the driver is polled
/// again: whichever makes the shard's last turn, the timer runs once, the shutdown wakes a
/// driver still waiting, and the driver then ends.
#[test]
fn shutdown_against_a_driver_ends_it_and_settles_the_timer() {
    // Three preemptions catch a driver that stores its waker after looking at the flag.
    model(Some(3), || {
        let (engine, _clock, mut driver, _asked) = driven();
        let probe = Probe::new();
        engine.schedule(ticks(5), probe.callback()).unwrap();
        let (_, waker) = counting();
        assert!(poll(&mut driver, &waker).is_pending());
        let stopper = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || {
                let report = engine.shutdown(PendingTimers::Run);
                fence(Ordering::SeqCst);
                report
            })
        };
        let (wakes, waker) = counting();
        let first = poll(&mut driver, &waker);
        stopper.join().unwrap();
        if first.is_pending() {
            assert!(wakes.count() > 0, "the shutdown left the driver waiting");
            let (_, waker) = counting();
            assert!(
                poll(&mut driver, &waker).is_ready(),
                "the driver outlived shutdown"
            );
        }
        assert_eq!((probe.ran(), probe.dropped()), (1, 1));
        assert_eq!(engine.stats().total.ran_at_shutdown, 1);
        assert_eq!(engine.nodes_in_use(), 0, "the node was not given back");
    });
}

/// A thread calling `turn` holds the shard while the driver is polled: the driver that
/// finds it taken waits without spinning, and the turn's end wakes it, or the driver got
/// the shard and planned for the timer itself. Polled again once the timer is due, it runs
/// the timer once.
#[test]
fn a_driver_that_finds_its_shard_turned_is_woken_when_the_turn_ends() {
    // Three preemptions catch a turn that gives the shard back without waking the driver.
    model(Some(3), || {
        let (engine, clock, mut driver, asked) = driven();
        let probe = Probe::new();
        engine.schedule(ticks(2), probe.callback()).unwrap();
        let turner = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || engine.turn())
        };
        let (wakes, waker) = counting();
        assert!(poll(&mut driver, &waker).is_pending());
        assert_eq!(turner.join().unwrap(), 0, "nothing is due yet");
        clock.advance(ticks(2));
        assert_woken_or_due(&wakes, &asked, &engine);
        let (_, waker) = counting();
        assert!(poll(&mut driver, &waker).is_pending());
        assert_eq!((probe.ran(), probe.dropped()), (1, 1));
    });
}
