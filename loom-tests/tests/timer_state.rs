//! The per-timer state word on its own: a cancel or reset from another thread against the
//! owner firing, two cancels, a cancel against resets, a repeating timer cancelled
//! mid-fire, a waker timer's wake against its `Sleep`'s drop, and a stale handle against the
//! node's reuse. Each race must end in exactly one outcome, and
//! every node must be pushed to its owner at most once at a time and freed exactly once.
#![cfg(loom)]

use corewheel::loom_exports::{AfterFire, Cancelled, Defused, Kind, Phase, Received, TimerState};
use corewheel_loom_tests::model;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;

/// What the owner did with a timer its wheel handed out as due at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// Claimed it and ran the callback.
    Fired,
    /// Saw a later deadline and filed it there.
    Refiled,
    /// Found a reset mid-write and filed it for the next tick.
    Locked,
    /// Found it cancelled, with the cancel's message still to come.
    Skipped,
}

/// The wheel holder's expiry step (`HeldWheel::claim_due`, then the runner) for one timer, against the deadline
/// stored beside the state word.
fn expire(state: &TimerState, deadline: &AtomicU64, now: u64) -> Owner {
    loop {
        let seen = state.observe();
        match seen.phase() {
            Phase::Cancelled => {
                assert!(
                    !state.keep_filed(),
                    "a cancelled timer must leave the wheel"
                );
                return Owner::Skipped;
            }
            Phase::Pending if seen.is_locked() => return Owner::Locked,
            Phase::Pending => {
                if deadline.load(Ordering::Acquire) > now {
                    assert!(state.keep_filed());
                    return Owner::Refiled;
                }
                if state.try_fire(seen) {
                    return Owner::Fired;
                }
            }
            phase => panic!("a {phase:?} timer in the wheel"),
        }
    }
}

/// A timer armed and filed by its owner, with its deadline.
fn filed(repeating: bool, due: u64) -> (Arc<TimerState>, Arc<AtomicU64>, u32) {
    let state = TimerState::new();
    let kind = if repeating {
        Kind::Repeating
    } else {
        Kind::OneShot
    };
    let generation = state.arm(kind);
    assert_eq!(state.receive(), Received::File);
    (Arc::new(state), Arc::new(AtomicU64::new(due)), generation)
}

/// A cancel from another thread races the owner firing a filed timer: exactly one wins,
/// and the node is freed exactly once, by the firing or by the cancel's message.
#[test]
fn cancel_against_fire_has_exactly_one_winner() {
    model(None, || {
        let (state, deadline, generation) = filed(false, 10);
        let canceller = {
            let state = Arc::clone(&state);
            thread::spawn(move || state.try_cancel(generation))
        };
        let owner = expire(&state, &deadline, 10);
        let after = (owner == Owner::Fired).then(|| state.finish_fire());
        let cancelled = canceller.join().unwrap();
        match (owner, cancelled) {
            (Owner::Fired, None) => assert_eq!(after, Some(AfterFire::Free)),
            // The message finds the owner already took the node out of the wheel.
            (Owner::Skipped, Some(Cancelled::Notify)) => {
                assert_eq!(state.receive(), Received::Free);
            }
            other => panic!("cancel and fire disagree: {other:?}"),
        }
        assert!(state.free());
        assert_eq!(state.try_cancel(generation), None, "the handle is stale");
    });
}

/// Two cancels of the same filed timer from two threads: exactly one succeeds, and it
/// alone owes the owner a message.
#[test]
fn two_cancels_have_exactly_one_winner() {
    model(None, || {
        let (state, _deadline, generation) = filed(false, 10);
        let other = {
            let state = Arc::clone(&state);
            thread::spawn(move || state.try_cancel(generation))
        };
        let mine = state.try_cancel(generation);
        let theirs = other.join().unwrap();
        let mut outcomes = [mine, theirs];
        outcomes.sort_by_key(Option::is_none);
        assert_eq!(outcomes, [Some(Cancelled::Notify), None]);
        assert_eq!(state.receive(), Received::UnlinkAndFree);
    });
}

/// A reset to a later deadline (lock, store, unlock) races the owner's expiry at the old
/// one: either the reset wins and the timer does not fire before the new deadline, or the
/// timer fired first and the reset reports failure.
#[test]
fn reset_against_fire_never_fires_at_the_old_deadline_after_a_successful_reset() {
    model(None, || {
        let (state, deadline, generation) = filed(false, 10);
        let resetter = {
            let (state, deadline) = (Arc::clone(&state), Arc::clone(&deadline));
            thread::spawn(move || {
                if !state.lock_for_reset(generation) {
                    return false;
                }
                deadline.store(20, Ordering::Relaxed);
                assert!(!state.unlock_reset(false), "a later deadline sends nothing");
                true
            })
        };
        let mut owner = expire(&state, &deadline, 10);
        let mut now = 10;
        while owner == Owner::Locked {
            // Filed for the next tick, where the owner looks again.
            thread::yield_now();
            now += 1;
            owner = expire(&state, &deadline, now);
        }
        let reset = resetter.join().unwrap();
        match owner {
            Owner::Fired => {
                assert!(!reset, "the reset succeeded but the timer fired at 10");
                assert_eq!(state.finish_fire(), AfterFire::Free);
            }
            Owner::Refiled => {
                assert!(reset, "the owner saw the new deadline of a failed reset");
                assert_eq!(expire(&state, &deadline, 20), Owner::Fired);
                assert_eq!(state.finish_fire(), AfterFire::Free);
            }
            other => panic!("nothing cancelled or locked this timer: {other:?}"),
        }
    });
}

/// A cancel races two resets that each bring the deadline forward, with no firing: the
/// cancel always wins (nothing claims the timer), a reset wins only if it locked before
/// the cancel (which waits out the lock), and exactly one message goes to the owner however
/// they interleave (the first earlier reset or the cancel sends it; whoever comes after
/// finds it in transit). The owner then unlinks and frees the node.
#[test]
fn cancel_against_earlier_resets_sends_exactly_one_message() {
    model(None, || {
        let (state, deadline, generation) = filed(false, 10);
        let resetter = {
            let (state, deadline) = (Arc::clone(&state), Arc::clone(&deadline));
            thread::spawn(move || {
                let (mut won, mut messages) = (0, 0);
                for tick in [5, 3] {
                    if !state.lock_for_reset(generation) {
                        break;
                    }
                    deadline.store(tick, Ordering::Relaxed);
                    won += 1;
                    messages += u8::from(state.unlock_reset(true));
                }
                (won, messages)
            })
        };
        let cancelled = state.try_cancel(generation);
        let (resets_won, reset_messages) = resetter.join().unwrap();
        assert!(
            cancelled.is_some(),
            "nothing else could have stopped the timer"
        );
        if cancelled == Some(Cancelled::Notify) {
            // The cancel found the timer filed, unlocked and with no message: before any
            // reset locked it, so every reset must have failed.
            assert_eq!(resets_won, 0, "a reset succeeded on a cancelled timer");
        }
        assert_eq!(
            reset_messages + u8::from(cancelled == Some(Cancelled::Notify)),
            1,
            "reset messages {reset_messages}, cancel {cancelled:?}"
        );
        assert!(!state.is_pending(generation));
        assert!(!state.observe().is_locked());
        assert_eq!(state.receive(), Received::UnlinkAndFree);
        assert!(state.free());
    });
}

/// A cancel races a repeating timer's firing: however it lands (before the fire, during
/// the callback, or after the re-arm), the cancel succeeds, the timer never runs again, and
/// the node is freed exactly once.
#[test]
fn a_repeating_timer_cancelled_mid_fire_stays_stopped() {
    model(None, || {
        let (state, deadline, generation) = filed(true, 10);
        let canceller = {
            let state = Arc::clone(&state);
            thread::spawn(move || state.try_cancel(generation))
        };
        let owner = expire(&state, &deadline, 10);
        let mut freed = 0;
        let mut rearmed = false;
        if owner == Owner::Fired {
            // The callback runs here; then the runner stores the next deadline and settles.
            deadline.store(20, Ordering::Release);
            match state.finish_fire() {
                AfterFire::Rearm => rearmed = true,
                AfterFire::Free => freed += 1,
                other => panic!("no message was sent to a firing timer, yet {other:?}"),
            }
        }
        let cancelled = canceller.join().unwrap();
        assert!(
            cancelled.is_some(),
            "a repeating timer can always be stopped from running again"
        );
        assert!(
            !state.is_pending(generation),
            "still armed after a successful cancel"
        );
        if cancelled == Some(Cancelled::Notify) {
            match state.receive() {
                Received::UnlinkAndFree | Received::Free => freed += 1,
                other => panic!("the cancel's message found {other:?}"),
            }
        } else {
            assert_eq!(owner, Owner::Fired, "only a firing timer needs no message");
        }
        if rearmed {
            // The re-armed timer reaches its owner after the cancel stopped it.
            match state.receive() {
                Received::Free => freed += 1,
                other => panic!("the re-armed timer arrived to {other:?}"),
            }
        }
        assert_eq!(freed, 1, "the node must be freed exactly once");
        assert_ne!(state.observe().phase(), Phase::Pending, "it re-armed");
    });
}

/// A stale handle's cancel and reset race the owner freeing the node and arming the next
/// timer in it: the old timer fired or was cancelled once, and the new one is untouched.
#[test]
fn a_stale_handle_never_touches_the_timer_that_reused_its_node() {
    model(None, || {
        let (state, deadline, old) = filed(false, 0);
        let stale = {
            let state = Arc::clone(&state);
            thread::spawn(move || {
                let cancelled = state.try_cancel(old);
                // After its own cancel or the fire, the handle is stale even before the
                // node is reused.
                assert!(!state.lock_for_reset(old), "a stale reset locked the node");
                assert!(!state.is_pending(old));
                cancelled
            })
        };
        let owner = expire(&state, &deadline, 0);
        if owner == Owner::Fired {
            assert_eq!(state.finish_fire(), AfterFire::Free);
        } else {
            // The cancel's message arrives; the owner took the node out of its wheel.
            assert_eq!(owner, Owner::Skipped);
            assert_eq!(state.receive(), Received::Free);
        }
        assert!(state.free());
        let new = state.arm(Kind::OneShot);
        assert_eq!(state.receive(), Received::File);
        let cancelled = stale.join().unwrap();
        assert_ne!(old, new);
        assert_eq!(cancelled.is_some(), owner == Owner::Skipped);
        assert!(
            state.is_pending(new),
            "the stale handle reached the new timer"
        );
        assert_eq!(state.observe().generation(), new);
        assert!(!state.observe().is_locked());
    });
}

/// A waker timer claimed for firing: the runner begins, makes and settles the wake while
/// the `Sleep`'s drop tries to defuse it. Exactly one of "defused before the wake" and
/// "woken" happens, and the defuse never writes to the word once the runner has it.
#[test]
fn a_wake_against_its_sleeps_drop_is_defused_or_made_never_both() {
    model(None, || {
        let state = TimerState::new();
        let generation = state.arm(Kind::Waker);
        assert_eq!(state.receive(), Received::File);
        assert!(state.try_fire(state.observe()));
        let state = Arc::new(state);
        let woke = Arc::new(AtomicU64::new(0));
        let runner = {
            let (state, woke) = (Arc::clone(&state), Arc::clone(&woke));
            thread::spawn(move || {
                let wake = state.begin_wake();
                if wake {
                    woke.store(1, Ordering::Release);
                }
                assert_eq!(state.finish_fire(), AfterFire::Free);
                assert!(state.free());
                wake
            })
        };
        let defused = state.defuse(generation);
        let woke_at_all = runner.join().unwrap();
        assert_eq!(woke.load(Ordering::Acquire), u64::from(woke_at_all));
        match defused {
            Defused::BeforeWake => assert!(!woke_at_all),
            Defused::Waking | Defused::Over => assert!(woke_at_all),
        }
        assert_eq!(state.observe().phase(), Phase::Free);
    });
}
