//! Handed-out lists of due timers (`engine::due_lists`), one shard driven by hand: the
//! wheel's holder hands its due slots' lists out whole, and walkers on other threads claim
//! and run their timers while a cancel, a reset, the owner's own turn or a shutdown races
//! them. Each model checks that a timer runs exactly once unless a cancel returned `true`,
//! that a reset that won is never fired early, that nobody touches a list or a timer's
//! links while another holds it (loom checks the links' cells), and that every node goes
//! back to the pool.
#![cfg(loom)]

use corewheel::loom_exports::shard_steps::{hand_out, walk};
use corewheel::{PendingTimers, TimerEngine};
use corewheel_loom_tests::{Probe, engine, filed, model, settle, ticks};
use loom::sync::Arc;
use loom::thread;

/// A walker on another thread, walking one batch of shard 0's lists.
fn walker(engine: &Arc<TimerEngine>) -> thread::JoinHandle<Option<usize>> {
    let engine = Arc::clone(engine);
    thread::spawn(move || walk(&engine, 0))
}

/// Two due timers' list is handed out; a walker claims them while another thread cancels
/// the first: exactly one of the walker and the cancel wins it, and the cancelled timer's
/// node comes back through its cancel's message once the owner has the list back. The
/// other timer runs once.
#[test]
fn a_walker_against_a_cancel_has_one_winner() {
    model(Some(3), || {
        let (engine, clock) = engine();
        let (probe, other) = (Probe::new(), Probe::new());
        let handle = filed(&engine, &clock, 3, probe.callback());
        // On the same list as `probe`'s, after it.
        filed(&engine, &clock, 2, other.callback());
        clock.advance(ticks(1));
        assert!(hand_out(&engine, 0), "the due timers' list goes out");
        let walker = walker(&engine);
        let cancelled = engine.cancel(handle);
        let walked = walker.join().unwrap();
        assert_eq!(
            walked,
            Some(probe.ran() + other.ran()),
            "the walker ran what it claimed"
        );
        probe.assert_one_winner(cancelled);
        let rest = settle(&engine, &clock);
        assert_eq!(other.ran(), 1, "the other timer ran");
        assert_eq!(rest, usize::from(walked == Some(0)), "nothing ran twice");
        assert_eq!(probe.ran(), usize::from(!cancelled), "ran after its cancel");
        assert_eq!(engine.nodes_in_use(), 0, "a node was not given back");
        assert_eq!((probe.dropped(), other.dropped()), (1, 1));
    });
}

/// A due timer's list is handed out; a walker takes it while another thread pushes it
/// back two ticks. Either the walker fired it first and the reset fails, or the reset won
/// and the walker sends the timer back (locked or no longer due): the owner files it
/// again, and it fires once, at its new deadline and not before.
#[test]
fn a_walker_against_a_reset_fires_once_and_never_early() {
    model(None, || {
        let (engine, clock) = engine();
        let probe = Probe::new();
        let handle = filed(&engine, &clock, 2, probe.callback());
        clock.advance(ticks(1));
        assert!(hand_out(&engine, 0));
        let walker = walker(&engine);
        let reset = engine.reset(handle, ticks(2));
        walker.join().unwrap();
        assert_eq!(probe.ran(), usize::from(!reset), "reset={reset}");
        // The owner takes the list back; a timer the reset moved is not due yet.
        assert_eq!(engine.turn(), 0, "fired before its new deadline");
        clock.advance(ticks(1));
        assert_eq!(engine.turn(), 0, "fired before its new deadline");
        clock.advance(ticks(1));
        engine.turn();
        assert_eq!(probe.ran(), 1, "reset={reset}");
        settle(&engine, &clock);
        assert_eq!(probe.ran(), 1, "ran again");
        assert_eq!(engine.nodes_in_use(), 0, "the node was not given back");
        assert_eq!(probe.dropped(), 1);
    });
}

/// Three due timers, on two lists, handed out; two walkers and the owner's own turn (which
/// walks what is open and waits out a walker holding the rest) take them. Each runs exactly
/// once, and the walkers' runs are counted as stolen.
#[test]
fn two_walkers_and_the_owner_run_each_timer_once() {
    model(Some(3), || {
        let (engine, clock) = engine();
        let probes = [Probe::new(), Probe::new(), Probe::new()];
        // Two lists: the first and the third timer share one.
        for (probe, ticks_out) in probes.iter().zip([4, 3, 2]) {
            filed(&engine, &clock, ticks_out, probe.callback());
        }
        clock.advance(ticks(1));
        assert!(hand_out(&engine, 0));
        let walkers = [walker(&engine), walker(&engine)];
        let owner = engine.turn();
        let walked: usize = walkers
            .into_iter()
            .map(|walker| walker.join().unwrap().unwrap_or(0))
            .sum();
        assert_eq!(owner + walked, 3, "owner ran {owner}, walkers {walked}");
        assert!(probes.iter().all(|probe| probe.ran() == 1));
        assert_eq!(engine.stats().total.stolen, walked as u64);
        assert_eq!(settle(&engine, &clock), 0);
        assert_eq!(engine.nodes_in_use(), 0, "a node was not given back");
        assert!(probes.iter().all(|probe| probe.dropped() == 1));
    });
}

/// Two due timers' lists are out when a shutdown that drops pending timers begins, while a
/// walker walks them: the last turn waits for the walker and takes the lists back. Each
/// timer either ran (claimed by the walker) or was dropped, never both, never neither.
#[test]
fn a_shutdown_against_a_walker_runs_or_drops_each_timer_once() {
    model(None, || {
        let (engine, clock) = engine();
        let (first, second) = (Probe::new(), Probe::new());
        filed(&engine, &clock, 3, first.callback());
        filed(&engine, &clock, 2, second.callback());
        // Both are due now (the second `filed` advanced the clock a tick).
        clock.advance(ticks(1));
        assert!(hand_out(&engine, 0));
        let walker = walker(&engine);
        let report = engine.shutdown(PendingTimers::Drop);
        let walked = walker.join().unwrap().unwrap_or(0);
        assert_eq!(first.ran() + second.ran(), walked);
        assert_eq!(walked as u64 + report.dropped, 2, "walked {walked}");
        assert_eq!(engine.nodes_in_use(), 0, "a node was not given back");
        assert_eq!((first.dropped(), second.dropped()), (1, 1));
    });
}

/// A repeating timer's list is handed out; a walker fires it (sending it back to the owner
/// to be filed again) while another thread cancels it. It runs at most once before the
/// cancel, and never after a cancel that returned `true`; its node comes back.
#[test]
fn a_walked_repeating_timer_against_a_cancel_stops() {
    model(None, || {
        let (engine, clock) = engine();
        let probe = Probe::new();
        // Filed as `filed` files a one-shot timer: out due in a tick, pushed back to two.
        let handle = engine
            .schedule_repeating(ticks(1), probe.repeating_callback())
            .expect("the engine is running");
        assert!(engine.reset(handle, ticks(2)));
        clock.advance(ticks(1));
        assert_eq!(engine.turn(), 0, "filed, not yet due");
        clock.advance(ticks(1));
        assert!(hand_out(&engine, 0));
        let walker = walker(&engine);
        let cancelled = engine.cancel(handle);
        walker.join().unwrap();
        let before = probe.ran();
        assert!(before <= 1);
        settle(&engine, &clock);
        if cancelled {
            assert_eq!(probe.ran(), before, "ran after its cancel returned true");
        }
        assert_eq!(engine.nodes_in_use(), 0, "the node was not given back");
        assert_eq!(probe.dropped(), 1);
    });
}
