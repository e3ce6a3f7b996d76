//! The whole engine, one shard driven by hand: cancels and resets against the worker's
//! turn firing or filing the timer, schedules from two threads, and a schedule against
//! shutdown. These run the real producer, lane, inbox, wheel and pool code, so they check
//! that the state word's outcomes are acted on: a callback runs exactly when nobody
//! stopped it, never early nor a turn late, and every node goes back to the pool.
//!
//! loom's `join` returns before the joined thread's thread-locals are destroyed (std's
//! waits for them), so a spawned thread's context may still be closing its lane, and
//! forwarding what it holds to the inbox, while the main thread checks the outcome. So
//! the timer under test is cancelled, reset or scheduled by the main thread, whose lane
//! stays open; where spawned threads schedule, the main thread turns until their timers
//! arrive, or their lanes are empty before they exit.
#![cfg(loom)]

use std::time::Duration;

use corewheel::{PendingTimers, ScheduleError, ShutdownReport};
use corewheel_loom_tests::{Probe, engine, filed, model, settle, ticks};
use loom::sync::Arc;
use loom::sync::atomic::{Ordering, fence};
use loom::thread;

/// A timer in the wheel, cancelled while the worker turns at its deadline: exactly one of
/// the cancel and the callback wins, and once the cancel's message has arrived the node is
/// back in the pool and the callback has been dropped.
#[test]
fn cancel_against_fire_has_exactly_one_winner() {
    model(None, || {
        let (engine, clock) = engine();
        let probe = Probe::new();
        let handle = filed(&engine, &clock, 3, probe.callback());
        clock.advance(ticks(2));
        let worker = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || engine.turn())
        };
        let cancelled = engine.cancel(handle);
        let fired = worker.join().unwrap();
        assert_eq!(fired, probe.ran());
        probe.assert_one_winner(cancelled);
        assert!(!engine.is_pending(handle));
        // The cancel's message, if it sent one, is on this thread's lane.
        assert_eq!(settle(&engine, &clock), 0);
        assert_eq!(probe.ran(), usize::from(!cancelled), "ran after the race");
        assert_eq!(engine.nodes_in_use(), 0, "the node was not given back");
        assert_eq!(
            probe.dropped(),
            1,
            "the callback was not dropped exactly once"
        );
        assert!(!engine.cancel(handle), "the handle is stale");
    });
}

/// A repeating timer in the wheel, cancelled while the worker turns at its deadline. The
/// cancel lands before the run, during it or after the re-arm, and succeeds every time
/// (a repeating timer can always be stopped from running again); the callback ran at most
/// once, never runs afterwards, and is dropped when the node goes back to the pool.
#[test]
fn cancel_against_a_repeating_timer_firing_stops_it_for_good() {
    model(None, || {
        let (engine, clock) = engine();
        let probe = Probe::new();
        let handle = engine
            .schedule_repeating(ticks(1), probe.repeating_callback())
            .unwrap();
        // Filed in the wheel as in `filed`: the reset moves the first run later.
        assert!(engine.reset(handle, ticks(3)));
        clock.advance(ticks(1));
        assert_eq!(engine.turn(), 0);
        clock.advance(ticks(2));
        let worker = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || engine.turn())
        };
        assert!(
            engine.cancel(handle),
            "a repeating timer can always be cancelled"
        );
        let fired = worker.join().unwrap();
        assert_eq!(fired, probe.ran());
        assert!(probe.ran() <= 1);
        assert!(!engine.is_pending(handle));
        let ran = probe.ran();
        assert_eq!(
            settle(&engine, &clock),
            0,
            "ran again after a successful cancel"
        );
        assert_eq!(probe.ran(), ran);
        assert_eq!(engine.nodes_in_use(), 0, "the node was not given back");
        assert_eq!(
            probe.dropped(),
            1,
            "the callback was not dropped exactly once"
        );
    });
}

/// A timer just scheduled, still in transit on this thread's lane, cancelled while the
/// worker takes the lane and files it (a timer due at once, behind it on the lane, makes
/// the lane due now). The cancel lands before the worker receives the node (which then
/// frees it) or after it was filed (and then sends it a message); either way the cancel
/// wins, the callback never runs, and the node goes back to the pool once.
#[test]
fn cancel_against_the_worker_filing_the_timer() {
    model(None, || {
        let (engine, clock) = engine();
        let (probe, due) = (Probe::new(), Probe::new());
        let handle = engine.schedule(ticks(9), probe.callback()).unwrap();
        engine.schedule(Duration::ZERO, due.callback()).unwrap();
        let worker = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || engine.turn())
        };
        assert!(engine.cancel(handle), "nothing else could have stopped it");
        assert_eq!(
            worker.join().unwrap(),
            1,
            "only the timer due at once fires"
        );
        assert_eq!(settle(&engine, &clock), 0);
        assert_eq!((probe.ran(), probe.dropped()), (0, 1));
        assert_eq!(due.ran(), 1);
        assert_eq!(engine.nodes_in_use(), 0, "a node was not given back");
    });
}

/// A timer in the wheel, reset to a later deadline while the worker turns at the old one:
/// either the reset failed and the callback ran, or the reset succeeded and the callback
/// runs once, at the new deadline and not a tick before.
#[test]
fn reset_against_fire_moves_the_timer_or_fails() {
    model(None, || {
        let (engine, clock) = engine();
        let probe = Probe::new();
        let handle = filed(&engine, &clock, 3, probe.callback());
        clock.advance(ticks(2));
        let worker = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || engine.turn())
        };
        let reset = engine.reset(handle, ticks(3));
        let fired = worker.join().unwrap();
        assert_eq!(fired, probe.ran());
        if reset {
            assert_eq!(probe.ran(), 0, "fired at the old deadline after a reset");
            assert!(engine.is_pending(handle));
            clock.advance(ticks(2));
            assert_eq!(engine.turn(), 0, "fired before the new deadline");
            clock.advance(ticks(1));
            assert_eq!(engine.turn(), 1, "did not fire at the new deadline");
        } else {
            assert_eq!(probe.ran(), 1, "a failed reset must mean the timer fired");
        }
        assert_eq!(probe.ran(), 1);
        assert!(!engine.is_pending(handle));
        assert_eq!(engine.nodes_in_use(), 0, "the node was not given back");
        assert_eq!(probe.dropped(), 1);
    });
}

/// A timer still in transit on this thread's lane, due late, reset to the next tick while
/// the worker turns at this one. The lane's need (the earliest tick at which the worker
/// takes it) is later than the new deadline, so the reset marks the shard urgent; a turn
/// that finds the urgent tick still ahead must leave it for the next turn, which takes the
/// lane and fires the timer at the new deadline, not when the lane comes due.
///
/// This relies on a fresh lane's need being at least two ticks out (the engine's lane
/// horizon): with a horizon of one tick the lane would come due at the new deadline by
/// itself, and the model would no longer tell whether the urgent tick was kept.
#[test]
fn earlier_reset_of_a_timer_in_transit_fires_at_the_new_deadline() {
    model(None, || {
        let (engine, clock) = engine();
        let probe = Probe::new();
        let handle = engine.schedule(ticks(9), probe.callback()).unwrap();
        let worker = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || engine.turn())
        };
        assert!(
            engine.reset(handle, ticks(1)),
            "nothing else touches the timer"
        );
        assert_eq!(worker.join().unwrap(), 0, "fired before the new deadline");
        clock.advance(ticks(1));
        assert_eq!(engine.turn(), 1, "did not fire at the new deadline");
        assert_eq!(probe.ran(), 1);
        assert_eq!(engine.nodes_in_use(), 0, "the node was not given back");
    });
}

/// A spawned thread schedules a timer due at once while the main thread schedules one of
/// its own and turns. Each thread opens its lane into the shard as it schedules (the two
/// opens race each other and the turn's refresh of its lane list), and the spawned one, as
/// it exits, closes its lane, forwarding what the lane still holds to the inbox and giving
/// its magazine back to the pool, against the turn. Each callback runs exactly once and
/// every node goes back to the pool. The main thread turns until both have run, yielding
/// so that the exiting thread can finish closing its lane. (Two spawned producers and a
/// turning main thread take minutes at this bound; concurrent pushes onto the inbox have
/// their own model in `mpsc`.)
#[test]
fn schedules_from_two_threads_each_fire_once() {
    model(Some(2), || {
        let (engine, _clock) = engine();
        let probes = [Probe::new(), Probe::new()];
        let producer = {
            let (engine, callback) = (Arc::clone(&engine), probes[0].callback());
            thread::spawn(move || {
                engine.schedule(Duration::ZERO, callback).unwrap();
            })
        };
        engine
            .schedule(Duration::ZERO, probes[1].callback())
            .unwrap();
        let mut fired = engine.turn();
        producer.join().unwrap();
        // Unbounded: a timer that never arrives makes loom stop the model for exceeding
        // its branch limit, which fails the test.
        while probes.iter().any(|probe| probe.ran() == 0) {
            thread::yield_now();
            fired += engine.turn();
        }
        assert_eq!(fired, 2);
        for probe in &probes {
            assert_eq!((probe.ran(), probe.dropped()), (1, 1));
        }
        assert_eq!(engine.nodes_in_use(), 0, "a node was not given back");
    });
}

/// A schedule races `shutdown(pending)` on another thread. The schedule either fails with
/// `Shutdown`, and its callback never runs, or succeeds, and the shutdown settles the timer
/// as `pending` says: runs it once, or drops it unrun, and counts it either way.
///
/// The other thread shuts down from inside a callback of its own turn (the turn then runs
/// the workers' last turn) and fences between the two. The handshake that keeps a racing
/// schedule from being lost (the flag store then the lanes' loads, against the lane push
/// then the flag load) rests on `SeqCst` loads and stores, which loom models as `AcqRel`
/// only (loom's README, "Unsupported features"). A `SeqCst` fence, which loom does model,
/// stands in for what the `SeqCst` accesses promise. The library fences on both sides
/// too: the last turn (`HeldWheel::finish`) before it reads the lanes, and the schedule in
/// `Shard::wake_for`, which it calls after pushing onto its empty lane. That thread's lane
/// is empty again before it exits, so closing it races the checks harmlessly.
///
/// Three preemptions, not more. Each model takes 3-4 s at three, 37-110 s at four and
/// 210-240 s at five (the loom stage's largest cost). At two already they catch a schedule
/// that does not look at the flag after its push (the timer goes unsettled) and a
/// withdrawal that cancels a repeating timer mid-callback (`Err` for a callback that
/// ran). With the fence above removed, or both of the library's, the model that runs
/// pending timers passes at every bound up to five: the extra depth bought nothing that
/// was measured.
///
/// With `repeating`, the timer is a repeating one: the last turn of a shutdown that runs
/// pending timers may be running it when the schedule sees the flag, and a repeating timer
/// can be cancelled mid-callback. The schedule must then stand (`Ok`), as it did for the
/// callback: `Err` means the callback never ran.
fn schedule_against_shutdown(pending: PendingTimers, repeating: bool) {
    model(Some(3), move || {
        let (engine, _clock) = engine();
        let probe = Probe::new();
        let stopper = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || {
                let inner = Arc::clone(&engine);
                engine
                    .schedule(Duration::ZERO, move || {
                        inner.shutdown(pending);
                        fence(Ordering::SeqCst);
                    })
                    .expect("scheduled before the shutdown");
                assert_eq!(engine.turn(), 1, "the shutdown timer is due at once");
            })
        };
        let scheduled = if repeating {
            engine.schedule_repeating(ticks(5), probe.repeating_callback())
        } else {
            engine.schedule(ticks(5), probe.callback())
        };
        stopper.join().unwrap();
        let stats = engine.stats().total;
        let settled = ShutdownReport {
            ran: stats.ran_at_shutdown,
            dropped: stats.dropped_at_shutdown,
        };
        match scheduled {
            Ok(handle) => {
                let expected = match pending {
                    PendingTimers::Run => ShutdownReport { ran: 1, dropped: 0 },
                    PendingTimers::Drop => ShutdownReport { ran: 0, dropped: 1 },
                };
                assert_eq!(settled, expected, "the timer was not settled by shutdown");
                assert_eq!(probe.ran(), expected.ran as usize);
                assert_eq!(probe.dropped(), 1);
                assert!(!engine.is_pending(handle));
                assert_eq!(engine.nodes_in_use(), 0, "the node was not given back");
            }
            Err(error) => {
                assert_eq!(error, ScheduleError::Shutdown);
                assert_eq!(settled, ShutdownReport::default());
                assert_eq!(probe.ran(), 0, "a failed schedule's callback ran");
                assert_eq!(probe.dropped(), 1, "a failed schedule kept its callback");
            }
        }
        assert_eq!(
            engine.schedule(ticks(1), || {}).unwrap_err(),
            ScheduleError::Shutdown
        );
        assert_eq!(engine.turn(), 0);
    });
}

#[test]
fn schedule_against_shutdown_that_runs_pending_timers() {
    schedule_against_shutdown(PendingTimers::Run, false);
}

#[test]
fn schedule_against_shutdown_that_drops_pending_timers() {
    schedule_against_shutdown(PendingTimers::Drop, false);
}

#[test]
fn repeating_schedule_against_shutdown_that_runs_pending_timers() {
    schedule_against_shutdown(PendingTimers::Run, true);
}

/// A shutdown that runs pending timers races a thread whose third schedule reclaims its
/// lane (under loom a lane is reclaimed every two pushes): the reclaim holds the first two
/// timers in its own hands for a moment and parks them on the old stack. The worker's last
/// turn must wait for that (the lane's busy mark) or the reclaim must see the shutdown and
/// leave them on the lane: either way every timer whose schedule returned `Ok` runs once.
#[test]
fn shutdown_against_a_reclaim_settles_every_timer() {
    model(Some(2), || {
        let (engine, _clock) = engine();
        let probes: Vec<Probe> = (0..3).map(|_| Probe::new()).collect();
        let stopper = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || {
                engine.shutdown(PendingTimers::Run);
                fence(Ordering::SeqCst);
            })
        };
        let scheduled: Vec<bool> = probes
            .iter()
            .map(|probe| engine.schedule(ticks(5), probe.callback()).is_ok())
            .collect();
        stopper.join().unwrap();
        for (probe, ok) in probes.iter().zip(&scheduled) {
            assert_eq!(probe.ran(), usize::from(*ok), "scheduled Ok: {ok}");
        }
    });
}

/// A timer in the wheel is cancelled while another thread shuts the engine down, dropping
/// pending timers. Whichever wins, once both have returned the callback has been dropped
/// and its node is back in the pool, with no turn after: a cancel whose message arrives
/// after the shard's last turn sweeps it up itself (or has the wheel's holder do it),
/// rather than leave the callback alive until the engine is dropped.
#[test]
fn cancel_against_shutdown_drops_the_callback_before_both_return() {
    model(Some(3), || {
        let (engine, clock) = engine();
        let probe = Probe::new();
        let handle = filed(&engine, &clock, 5, probe.callback());
        let stopper = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || {
                let report = engine.shutdown(PendingTimers::Drop);
                fence(Ordering::SeqCst);
                report
            })
        };
        let cancelled = engine.cancel(handle);
        let report = stopper.join().unwrap();
        assert_eq!(probe.ran(), 0);
        assert_eq!(
            u64::from(cancelled) + engine.stats().total.dropped_at_shutdown,
            1,
            "cancelled={cancelled}, report={report:?}"
        );
        assert_eq!(probe.dropped(), 1, "the callback outlived its timer");
        assert_eq!(engine.nodes_in_use(), 0, "the node was not given back");
    });
}
