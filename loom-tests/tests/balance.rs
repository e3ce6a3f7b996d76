//! Expiry balancing, one shard driven by hand: a thief taking claimed timers off the run
//! queue against the owner claiming and running them, a steal against a cancel, a worker
//! standing in for a stuck owner against the owner coming back, and a steal against
//! shutdown. Each checks that every timer runs exactly once unless a cancel returned
//! `true`, that nobody else touches the wheel while one thread holds it (loom checks the
//! wheel's cell), and that every node goes back to the pool. And, with two shards, an owner
//! beginning to run timers against another worker going to sleep: someone always watches,
//! also when the sleeper picked its watch while that owner was stuck.
#![cfg(loom)]

use corewheel::loom_exports::shard_steps::{
    now_tick, owner_begins_running, owner_look, owner_look_at, owner_run, set_owner_running,
    stand_in, stand_in_at, steal, worker_sleeps_until,
};
use corewheel::{Clock, DEFAULT_RESCUE_AFTER, ManualClock, PendingTimers, TimerEngine};
use corewheel_loom_tests::{MESSAGE_TICKS, Probe, engine, filed, model, settle, ticks};
use loom::sync::Arc;
use loom::thread;

/// Two due timers: the owner claims them and runs its queue one timer at a time while a
/// thief takes one. Each runs exactly once, on one of the two, and the thief's runs are
/// counted as stolen.
#[test]
fn a_steal_against_the_owner_runs_each_timer_once() {
    model(None, || {
        let (engine, clock) = engine();
        let (first, second) = (Probe::new(), Probe::new());
        filed(&engine, &clock, 3, first.callback());
        filed(&engine, &clock, 2, second.callback());
        // Both are due now (the second helper call advanced the clock a tick).
        clock.advance(ticks(1));
        let thief = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || steal(&engine, 0, 1))
        };
        let mut owner = 0;
        if owner_look(&engine, 0) > 0 {
            owner += owner_run(&engine, 0, 1);
        }
        let stolen = thief.join().unwrap();
        owner += owner_run(&engine, 0, 2);
        assert_eq!(owner + stolen, 2, "owner ran {owner}, thief ran {stolen}");
        assert_eq!((first.ran(), second.ran()), (1, 1));
        assert_eq!(engine.stats().total.stolen, stolen as u64);
        assert_eq!(settle(&engine, &clock), 0);
        assert_eq!(engine.nodes_in_use(), 0, "a node was not given back");
        assert_eq!((first.dropped(), second.dropped()), (1, 1));
    });
}

/// A due timer is claimed by its owner and taken by a thief while another thread cancels
/// it: exactly one of the cancel and the run wins.
#[test]
fn a_steal_against_a_cancel_has_one_winner() {
    model(None, || {
        let (engine, clock) = engine();
        let probe = Probe::new();
        let handle = filed(&engine, &clock, 2, probe.callback());
        clock.advance(ticks(1));
        let owner = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || owner_look(&engine, 0))
        };
        let thief = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || steal(&engine, 0, 1))
        };
        let cancelled = engine.cancel(handle);
        owner.join().unwrap();
        let stolen = thief.join().unwrap();
        let rest = owner_run(&engine, 0, 1);
        assert_eq!(stolen + rest, probe.ran());
        probe.assert_one_winner(cancelled);
        settle(&engine, &clock);
        assert_eq!(probe.ran(), usize::from(!cancelled), "ran after the race");
        assert_eq!(engine.nodes_in_use(), 0, "the node was not given back");
        assert_eq!(probe.dropped(), 1);
    });
}

/// The owner is stuck (awake, not looking at its wheel) while a timer is due; another
/// worker stands in for it just as the owner comes back and looks itself. The wheel has
/// one holder at a time, and the timer runs exactly once.
#[test]
fn a_stand_in_against_the_owner_coming_back_runs_the_timer_once() {
    model(None, || {
        let (engine, clock) = engine();
        let probe = Probe::new();
        filed(&engine, &clock, 2, probe.callback());
        clock.advance(ticks(1));
        let rescued = stand_in_against_the_owner_coming_back(&engine, 1);
        assert_eq!(probe.ran(), 1);
        let stats = engine.stats().total;
        assert_eq!(stats.stolen, rescued as u64);
        assert!(stats.rescued <= 1);
        assert_eq!(settle(&engine, &clock), 0);
        assert_eq!(engine.nodes_in_use(), 0, "the node was not given back");
    });
}

/// A filed timer is cancelled, and its cancel's message waits for the next look; another
/// timer is due. The owner, stuck by its mark, comes back and looks while a worker stands
/// in for it. Whichever look receives the cancel frees the cancelled timer, and drops its
/// capture (which has a `Drop`) only after letting the wheel go: nobody else may take that
/// node meanwhile, the capture is dropped exactly once, the due timer runs once, and
/// every node goes back to the pool.
#[test]
fn a_capture_dropped_after_a_look_lets_the_wheel_go_is_dropped_once() {
    model(None, || {
        let (engine, clock) = engine();
        let (cancelled, due) = (Probe::new(), Probe::new());
        let handle = filed(&engine, &clock, 3, cancelled.callback());
        filed(&engine, &clock, 2, due.callback());
        assert!(engine.cancel(handle));
        // The cancel's message and the second timer are both due now.
        clock.advance(ticks(MESSAGE_TICKS));
        assert_eq!(
            cancelled.dropped(),
            0,
            "the cancel's message waits for a look"
        );
        stand_in_against_the_owner_coming_back(&engine, 1);
        assert_eq!((cancelled.ran(), due.ran()), (0, 1));
        assert_eq!(cancelled.dropped(), 1, "the cancelled capture, once");
        assert_eq!(settle(&engine, &clock), 0);
        assert_eq!(engine.nodes_in_use(), 0, "a node was not given back");
        assert_eq!(due.dropped(), 1);
    });
}

/// Shard 0's owner, marked running (stuck), comes back, looks and runs its queue while
/// another worker stands in for it; `due` timers are due. Each runs once, on one of the
/// two. Returns how many the stand-in ran.
fn stand_in_against_the_owner_coming_back(engine: &Arc<TimerEngine>, due: usize) -> usize {
    set_owner_running(engine, 0, true);
    let stand_in = {
        let engine = Arc::clone(engine);
        thread::spawn(move || stand_in(&engine, 0))
    };
    let mut owner = 0;
    if owner_look(engine, 0) > 0 {
        owner = owner_run(engine, 0, due);
    }
    let rescued = stand_in.join().unwrap();
    owner += owner_run(engine, 0, due);
    set_owner_running(engine, 0, false);
    assert_eq!(
        owner + rescued,
        due,
        "owner ran {owner}, stand-in ran {rescued}"
    );
    rescued
}

/// A claimed timer waits on the run queue when shutdown begins, while a thief tries to
/// take it: it runs exactly once (claimed timers were due, so shutdown runs them even when
/// it drops pending ones), and the shutdown leaves every node in the pool.
#[test]
fn a_steal_against_shutdown_runs_the_claimed_timer_once() {
    model(None, || {
        let (engine, clock) = engine();
        let probe = Probe::new();
        filed(&engine, &clock, 2, probe.callback());
        clock.advance(ticks(1));
        assert_eq!(owner_look(&engine, 0), 1);
        let thief = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || steal(&engine, 0, 1))
        };
        let report = engine.shutdown(PendingTimers::Drop);
        let stolen = thief.join().unwrap();
        assert_eq!(report.dropped, 0);
        assert_eq!(probe.ran(), 1, "stolen={stolen}");
        assert_eq!(probe.dropped(), 1);
        assert_eq!(engine.nodes_in_use(), 0, "the node was not given back");
    });
}

/// Two workers stand in for a stuck owner with clock readings taken at different times,
/// while the owner, back from its callback, files new timers and looks with a third: one
/// stand-in read tick 4, the other tick 2, the owner tick 3. Whatever order they take the
/// wheel in, a reading older than the wheel's latest is read as the latest, so every look
/// returns (a due timer is never filed back as due), and each timer runs exactly once.
#[test]
fn stand_ins_and_the_owner_with_different_readings_run_each_timer_once() {
    model(Some(2), || {
        let (engine, clock) = engine();
        let origin = clock.now();
        let at = move |tick: u32| origin + ticks(tick);
        let filed_early = Probe::new();
        filed(&engine, &clock, 2, filed_early.callback());
        // The clock stands at tick 1; every look below brings its own reading.
        let (soon, later) = (Probe::new(), Probe::new());
        let late_reader = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || stand_in_at(&engine, 0, at(4)))
        };
        let early_reader = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || stand_in_at(&engine, 0, at(2)))
        };
        // The owner's new timers travel on its lane, due at ticks 2 and 3: the lane is
        // taken whole by a look that reads tick 2.
        engine.schedule(ticks(1), soon.callback()).unwrap();
        engine.schedule(ticks(2), later.callback()).unwrap();
        let mut ran = 0;
        if owner_look_at(&engine, 0, at(3)) > 0 {
            ran += owner_run(&engine, 0, 3);
        }
        ran += late_reader.join().unwrap();
        ran += early_reader.join().unwrap();
        owner_look_at(&engine, 0, at(4));
        ran += owner_run(&engine, 0, 3);
        assert_eq!(ran, 3);
        assert_eq!(
            (filed_early.ran(), soon.ran(), later.ran()),
            (1, 1, 1),
            "each timer runs exactly once"
        );
        assert_eq!(settle(&engine, &clock), 0);
        assert_eq!(engine.nodes_in_use(), 0, "a node was not given back");
    });
}

/// Shard 0's owner begins running timers while shard 1's worker goes to sleep until a
/// tick near (within `rescue_after`) or far. The owner wakes nobody when the sleeper will
/// look again soon, so a stuck callback is still found: either the owner woke a worker to
/// watch, or the sleeper watches, or it sleeps no longer than `rescue_after` ticks and,
/// going to sleep again then with the owner still running, watches.
#[test]
fn an_owner_beginning_to_run_is_watched_or_wakes_a_watcher() {
    for ahead in [3, 100] {
        model(None, move || {
            let clock = ManualClock::new();
            let engine = TimerEngine::builder()
                .workers(2)
                .manual_clock(clock)
                .build()
                .expect("a manual engine starts no threads");
            let engine = Arc::new(engine);
            let plan = now_tick(&engine) + ahead;
            let sleeper = {
                let engine = Arc::clone(&engine);
                thread::spawn(move || worker_sleeps_until(&engine, 1, plan))
            };
            let woke = owner_begins_running(&engine, 0);
            let sleeper = sleeper.join().unwrap().expect("no helpers' work waits");
            if !woke && sleeper.watch().is_none() {
                let soon = now_tick(&engine) + u64::from(DEFAULT_RESCUE_AFTER);
                assert!(
                    plan <= soon,
                    "nobody watches, and the sleeper wakes at {plan}"
                );
                sleeper.wake(&engine);
                let again = worker_sleeps_until(&engine, 1, plan + 100);
                assert!(
                    again.expect("no helpers' work waits").watch().is_some(),
                    "back from its sleep, the worker does not watch the running owner"
                );
            }
        });
    }
}

/// Shard 0's owner, stuck in a callback with nothing due, returns while shard 1's worker
/// goes to sleep (so the sleeper may find it stuck as it picks its watch, and no longer
/// running as it looks for work); then the owner begins running again. Whoever watches
/// must look within `rescue_after` ticks, or the owner must wake someone: a watch picked
/// for a stuck shard with nothing due used to be "never", kept the engine's one watch, and
/// the owner, seeing it taken, woke nobody (fails so with `watch_until`'s stuck case at
/// the shard's next deadline alone).
#[test]
fn a_watch_picked_while_an_owner_was_stuck_looks_again_within_rescue_after() {
    model(None, || {
        let clock = ManualClock::new();
        let engine = TimerEngine::builder()
            .workers(2)
            .manual_clock(clock.clone())
            .build()
            .expect("a manual engine starts no threads");
        let engine = Arc::new(engine);
        set_owner_running(&engine, 0, true);
        clock.advance(ticks(DEFAULT_RESCUE_AFTER + 2));
        let sleeper = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || worker_sleeps_until(&engine, 1, u64::MAX))
        };
        set_owner_running(&engine, 0, false);
        let sleeper = sleeper.join().unwrap();
        let woke = owner_begins_running(&engine, 0);
        let soon = now_tick(&engine) + u64::from(DEFAULT_RESCUE_AFTER);
        if let Some(sleeper) = sleeper {
            let watch = sleeper.watch();
            assert!(
                woke || watch.is_some_and(|tick| tick <= soon),
                "the owner woke nobody, and the sleeper watches until {watch:?} (now {})",
                now_tick(&engine)
            );
        }
    });
}
