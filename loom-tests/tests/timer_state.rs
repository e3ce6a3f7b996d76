//! The per-timer state word: cancel against fire, reset against fire, and a stale handle
//! against the slot's reuse, each resolved to exactly one outcome.
#![cfg(loom)]

use corewheel::loom_exports::{Phase, TimerState};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;

/// What the owner did with a due timer.
#[derive(Debug, PartialEq)]
enum Owner {
    Fired,
    /// Saw a later deadline and would re-file the timer instead.
    Refiled,
    /// Found it cancelled.
    Skipped,
}

/// The owner's expiry step for a timer it believes is due at `now`.
fn expire(state: &TimerState, deadline: &AtomicU64, now: u64) -> Owner {
    loop {
        let seen = state.observe();
        if seen.phase() != Phase::Pending {
            return Owner::Skipped;
        }
        if deadline.load(Ordering::Acquire) > now {
            return Owner::Refiled;
        }
        if state.try_fire(seen) {
            return Owner::Fired;
        }
    }
}

/// A cancel from another thread races the owner firing: exactly one of them wins.
#[test]
fn cancel_against_fire_has_exactly_one_winner() {
    loom::model(|| {
        let state = Arc::new(TimerState::new());
        let deadline = Arc::new(AtomicU64::new(10));
        let generation = state.arm();
        let canceller = {
            let state = Arc::clone(&state);
            thread::spawn(move || state.try_cancel(generation, false))
        };
        let owner = expire(&state, &deadline, 10);
        let cancelled = canceller.join().unwrap();
        assert_eq!(
            cancelled,
            owner != Owner::Fired,
            "cancel={cancelled}, owner={owner:?}"
        );
        if owner == Owner::Fired {
            assert!(!state.finish_fire(false));
        }
    });
}

/// A reset to a later deadline races the owner's expiry: either the reset succeeds and the
/// timer is not fired at the old deadline, or the timer fired first and the reset fails.
#[test]
fn reset_against_fire_never_fires_at_the_old_deadline_after_a_successful_reset() {
    loom::model(|| {
        let state = Arc::new(TimerState::new());
        let deadline = Arc::new(AtomicU64::new(10));
        let generation = state.arm();
        let resetter = {
            let (state, deadline) = (Arc::clone(&state), Arc::clone(&deadline));
            thread::spawn(move || {
                deadline.store(20, Ordering::Release);
                state.try_reset(generation)
            })
        };
        let owner = expire(&state, &deadline, 10);
        let reset = resetter.join().unwrap();
        match owner {
            Owner::Fired => assert!(!reset, "reset succeeded but the timer fired at 10"),
            Owner::Refiled => assert!(reset, "saw the new deadline of a failed reset"),
            Owner::Skipped => panic!("nothing cancelled this timer"),
        }
    });
}

/// A cancel carrying the old generation races the owner freeing the slot and arming the next
/// timer in it: the new timer is never touched, and the old one fired or was cancelled once.
#[test]
fn a_stale_handle_never_cancels_the_timer_that_reused_its_slot() {
    loom::model(|| {
        let state = Arc::new(TimerState::new());
        let deadline = Arc::new(AtomicU64::new(0));
        let old = state.arm();
        let stale = {
            let state = Arc::clone(&state);
            thread::spawn(move || state.try_cancel(old, false))
        };
        let owner = expire(&state, &deadline, 0);
        if owner == Owner::Fired {
            state.finish_fire(false);
        }
        state.free();
        let new = state.arm();
        let cancelled = stale.join().unwrap();
        assert_ne!(old, new);
        assert_eq!(cancelled, owner == Owner::Skipped);
        assert!(
            state.is_pending(new),
            "the stale handle reached the new timer"
        );
    });
}

/// A cancel racing a repeating timer's firing stops it from running again, whether it lands
/// while the callback runs (no re-arm) or after the re-arm (the re-armed timer is cancelled),
/// and reports that it stopped it.
#[test]
fn a_repeating_timer_cancelled_while_firing_stays_stopped() {
    loom::model(|| {
        let state = Arc::new(TimerState::new());
        let deadline = Arc::new(AtomicU64::new(0));
        let generation = state.arm();
        let canceller = {
            let state = Arc::clone(&state);
            thread::spawn(move || state.try_cancel(generation, true))
        };
        let owner = expire(&state, &deadline, 0);
        let rearmed = owner == Owner::Fired && state.finish_fire(true);
        let cancelled = canceller.join().unwrap();
        assert!(
            cancelled,
            "a repeating timer can always be stopped from running again"
        );
        assert!(
            !state.is_pending(generation),
            "still armed after a successful cancel"
        );
        if rearmed {
            assert_eq!(state.observe().phase(), Phase::Cancelled);
        }
        assert_eq!(
            expire(&state, &deadline, 0),
            Owner::Skipped,
            "ran again after a successful cancel"
        );
    });
}
