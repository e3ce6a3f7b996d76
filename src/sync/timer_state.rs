//! The shared state of one pooled timer: who wins when a cancel or reset races the owner
//! firing it, and who may give the node back. One `AtomicU64`, so every transition is one
//! compare-and-swap that also checks the generation: a stale handle changes nothing.
//!
//! Layout: `generation (32) | WAKER | reset sequence (23) | LOCKED | FILED | MSG | REPEATING |
//! phase (4)`.
//!
//! - `MSG`: the node is in transit to its owner. Exactly one party sets it and pushes the
//!   node, and only whoever takes it off the queue clears it: a node is on at most one
//!   queue, and never freed while a queue holds it.
//! - `FILED`: the owner has the node in its wheel.
//! - `LOCKED`, while pending: a resetter is writing the deadline (or a `Sleep` its waker);
//!   the owner does not fire it, and others wait for the unlock, two instructions away.
//!   While a waker timer is firing, `LOCKED` says its wake has begun.
//! - `WAKER`: the timer wakes a [`Sleep`](crate::Sleep)'s task. The runner claims the wake
//!   ([`TimerState::begin_wake`]), so a dropped `Sleep` may defuse one not yet begun
//!   ([`TimerState::defuse`]).
//!
//! The owner fires a timer only by swapping `Pending` to `Firing` from the exact word it read
//! before the deadline; a reset bumps the sequence, so one in between fails the swap. So
//! either a reset returns `true` and the timer fires no earlier than the new deadline, or
//! `false`: it had already started firing, or is over.

use crate::sync::atomic::{AtomicU64, Ordering, update};

const PHASE_MASK: u64 = 0xF;
const REPEATING: u64 = 1 << 4;
const MSG: u64 = 1 << 5;
const FILED: u64 = 1 << 6;
const LOCKED: u64 = 1 << 7;
const SEQUENCE_SHIFT: u32 = 8;
const SEQUENCE_MASK: u64 = ((1 << 23) - 1) << SEQUENCE_SHIFT;
const WAKER: u64 = 1 << 31;
const GENERATION_SHIFT: u32 = 32;

/// `word` with its sequence moved on by one (wrapping within its bits).
#[inline]
const fn bump_sequence(word: u64) -> u64 {
    let sequence = (word & SEQUENCE_MASK).wrapping_add(1 << SEQUENCE_SHIFT);
    (word & !SEQUENCE_MASK) | (sequence & SEQUENCE_MASK)
}

/// Where a timer is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// The node holds no timer.
    Free = 0,
    /// Armed: may be cancelled, reset or fired.
    Pending = 1,
    /// Claimed for running; a repeating timer goes back to `Pending` after.
    Firing = 2,
    /// A repeating timer cancelled while firing (not re-armed), or a waker timer whose
    /// `Sleep` was dropped before the wake began (will not wake).
    FiringCancelled = 3,
    /// Stopped by a cancel before it fired; waiting to be given back to the pool.
    Cancelled = 4,
    /// Ran, and is waiting for a message in transit to arrive before going back to the pool.
    Done = 5,
}

impl Phase {
    const fn from_bits(bits: u64) -> Self {
        match bits & PHASE_MASK {
            1 => Self::Pending,
            2 => Self::Firing,
            3 => Self::FiringCancelled,
            4 => Self::Cancelled,
            5 => Self::Done,
            _ => Self::Free,
        }
    }
}

/// A snapshot of a [`TimerState`], to hand back to [`TimerState::try_fire`] unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed(u64);

impl Observed {
    /// The phase at the time of the snapshot.
    pub const fn phase(self) -> Phase {
        Phase::from_bits(self.0)
    }

    /// The generation at the time of the snapshot.
    pub const fn generation(self) -> u32 {
        (self.0 >> GENERATION_SHIFT) as u32
    }

    /// Whether a resetter was writing the deadline.
    pub const fn is_locked(self) -> bool {
        self.0 & LOCKED != 0
    }

    /// Whether the node was in transit to its owner.
    pub const fn in_transit(self) -> bool {
        self.0 & MSG != 0
    }

    /// Whether the owner had the node in its wheel.
    pub const fn is_filed(self) -> bool {
        self.0 & FILED != 0
    }

    /// Whether the timer re-arms after it fires.
    pub const fn is_repeating(self) -> bool {
        self.0 & REPEATING != 0
    }

    /// Whether the timer wakes a future's task.
    pub const fn is_waker(self) -> bool {
        self.0 & WAKER != 0
    }

    /// Whether a resetter holds the lock of a pending timer.
    const fn is_reset_locked(self) -> bool {
        self.is_locked() && matches!(self.phase(), Phase::Pending)
    }

    const fn with_phase(self, phase: Phase) -> u64 {
        (self.0 & !PHASE_MASK) | phase as u64
    }
}

/// What a successful cancel obliges the canceller to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// Nothing: the node is in transit or mid-callback, and whoever holds it frees it.
    Done,
    /// Push the node to its owner, so that it leaves the wheel and goes back to the pool now.
    Notify,
}

/// What the owner does with a node it took off a lane or the inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// A new timer: file it in the wheel at its deadline.
    File,
    /// A filed timer whose deadline was brought forward: re-file it.
    Refile,
    /// A cancelled timer still in the wheel: unlink it, then give it back.
    UnlinkAndFree,
    /// A timer in no wheel that will not run again: give it back.
    Free,
    /// Nothing to do (it is firing right now, and the firing path settles it).
    Ignore,
}

/// What a callback a node holds does when it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Runs once.
    OneShot,
    /// Runs every period until cancelled.
    Repeating,
    /// Wakes a future's task, once.
    Waker,
}

/// What a dropped `Sleep` found its timer doing, when it could not cancel it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defused {
    /// The wake had not begun, and now never will.
    BeforeWake,
    /// The wake has begun on some thread and has not ended yet.
    Waking,
    /// The timer is over: woken already, or no longer this generation's.
    Over,
}

/// What the worker that ran a timer does with it afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFire {
    /// A repeating timer, `Pending` again and in transit: send it to its owner to file.
    Rearm,
    /// A repeating timer, `Pending` again, that a message already in transit will file.
    RearmOnArrival,
    /// Give the node back to the pool now.
    Free,
    /// Leave it: a message is in transit, and its arrival frees the node.
    AwaitMessage,
}

/// The atomic state word of one timer node. See the module documentation.
pub struct TimerState {
    word: AtomicU64,
}

impl Default for TimerState {
    fn default() -> Self {
        Self::new()
    }
}

impl TimerState {
    /// A free node at generation 0.
    pub fn new() -> Self {
        Self {
            word: AtomicU64::new(Phase::Free as u64),
        }
    }

    /// Reads the state. Acquire: pairs with a reset's Release unlock, so a deadline read
    /// after sees at least that reset's.
    pub fn observe(&self) -> Observed {
        Observed(self.word.load(Ordering::Acquire))
    }

    /// Arms a free node the caller holds, in transit; returns the handles' generation.
    pub fn arm(&self, kind: Kind) -> u32 {
        let generation = self.observe().generation();
        let flags = MSG
            | match kind {
                Kind::OneShot => 0,
                Kind::Repeating => REPEATING,
                Kind::Waker => WAKER,
            };
        self.word.store(
            (u64::from(generation) << GENERATION_SHIFT) | flags | Phase::Pending as u64,
            Ordering::Release,
        );
        generation
    }

    /// Waits out a resetter's lock (not a firing timer's, which is a wake under way).
    fn unlocked(&self) -> u64 {
        let current = self.word.load(Ordering::Acquire);
        if !Observed(current).is_reset_locked() {
            return current;
        }
        crate::sync::spin_until(|| {
            let current = self.word.load(Ordering::Acquire);
            (!Observed(current).is_reset_locked()).then_some(current)
        })
    }

    /// Stops the timer of `generation` from running (again): `Some` if and only if this
    /// call did it (pending, or repeating and firing).
    #[inline]
    pub fn try_cancel(&self, generation: u32) -> Option<Cancelled> {
        self.stop(generation, true)
    }

    /// [`try_cancel`](Self::try_cancel) of a timer that has never run (the sequence has not
    /// moved: only a re-arm can, as nobody else holds the handle yet), for a schedule
    /// taking its timer back at shutdown.
    #[inline]
    pub fn try_withdraw(&self, generation: u32) -> Option<Cancelled> {
        self.stop(generation, false)
    }

    /// [`try_cancel`](Self::try_cancel), or without `after_a_run`
    /// [`try_withdraw`](Self::try_withdraw).
    #[inline]
    fn stop(&self, generation: u32, after_a_run: bool) -> Option<Cancelled> {
        let mut current = self.unlocked();
        loop {
            let seen = Observed(current);
            if seen.generation() != generation || !(after_a_run || current & SEQUENCE_MASK == 0) {
                return None;
            }
            let (next, outcome) = match seen.phase() {
                Phase::Pending if seen.is_filed() && !seen.in_transit() => {
                    (seen.with_phase(Phase::Cancelled) | MSG, Cancelled::Notify)
                }
                Phase::Pending => (seen.with_phase(Phase::Cancelled), Cancelled::Done),
                Phase::Firing if after_a_run && seen.is_repeating() => {
                    (seen.with_phase(Phase::FiringCancelled), Cancelled::Done)
                }
                _ => return None,
            };
            match self
                .word
                .compare_exchange(current, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(outcome),
                Err(actual) if Observed(actual).is_reset_locked() => current = self.unlocked(),
                Err(actual) => current = actual,
            }
        }
    }

    /// Locks a pending timer of `generation` for a reset, then to store the deadline and
    /// call [`unlock_reset`](Self::unlock_reset). `false` if it is not pending.
    pub fn lock_for_reset(&self, generation: u32) -> bool {
        let mut current = self.unlocked();
        loop {
            let seen = Observed(current);
            if seen.generation() != generation || seen.phase() != Phase::Pending {
                return false;
            }
            match self.word.compare_exchange(
                current,
                current | LOCKED,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) if Observed(actual).is_reset_locked() => current = self.unlocked(),
                Err(actual) => current = actual,
            }
        }
    }

    /// Publishes the deadline stored under the lock and bumps the sequence. `true` if the
    /// caller must push the node: earlier, in the wheel, and no message already in transit.
    pub fn unlock_reset(&self, earlier: bool) -> bool {
        let mut notify = false;
        // Only the owner clearing MSG or FILED changes a locked word: few retries.
        update(
            &self.word,
            Ordering::Release,
            Ordering::Relaxed,
            |current| {
                let mut next = bump_sequence(current) & !LOCKED;
                notify = earlier && current & FILED != 0 && current & MSG == 0;
                if notify {
                    next |= MSG;
                }
                next
            },
        );
        notify
    }

    /// The owner took the node off a lane or the inbox: clears `MSG` and says what to do.
    pub fn receive(&self) -> Received {
        let mut outcome = Received::Ignore;
        update(&self.word, Ordering::AcqRel, Ordering::Acquire, |current| {
            let seen = Observed(current);
            let cleared = current & !MSG;
            let next;
            (next, outcome) = match seen.phase() {
                Phase::Pending if seen.is_filed() => (cleared, Received::Refile),
                Phase::Pending => (cleared | FILED, Received::File),
                Phase::Cancelled if seen.is_filed() => (cleared & !FILED, Received::UnlinkAndFree),
                Phase::Cancelled | Phase::Done => (cleared, Received::Free),
                Phase::Free | Phase::Firing | Phase::FiringCancelled => (cleared, Received::Ignore),
            };
            next
        });
        outcome
    }

    /// The owner files back a node its wheel just handed out (deadline moved later, or
    /// locked). For a cancelled node with a message in transit, clears `FILED` and returns
    /// `false`: the message's arrival frees it.
    pub fn keep_filed(&self) -> bool {
        let seen = self.observe();
        if seen.phase() == Phase::Cancelled {
            self.word.fetch_and(!FILED, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// The owner claims the timer for firing, if the state is still exactly `seen` (pending,
    /// unlocked, no reset since the deadline was read).
    pub fn try_fire(&self, seen: Observed) -> bool {
        self.claim(seen, Phase::Firing)
    }

    /// Moves a pending, unlocked timer out of the wheel into `phase`, if still exactly `seen`.
    fn claim(&self, seen: Observed, phase: Phase) -> bool {
        seen.phase() == Phase::Pending
            && !seen.is_locked()
            && self
                .word
                .compare_exchange(
                    seen.0,
                    seen.with_phase(phase) & !FILED,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// The runner finished the callback. A repeating timer not cancelled meanwhile goes back
    /// to `Pending`, in transit (its next deadline already stored); anything else is done.
    pub fn finish_fire(&self) -> AfterFire {
        let mut outcome = AfterFire::Free;
        update(&self.word, Ordering::AcqRel, Ordering::Acquire, |current| {
            let seen = Observed(current);
            let next;
            (next, outcome) = match seen.phase() {
                // A re-armed timer moves its sequence on: a pending timer whose
                // sequence is still its arm's has never run (see `try_withdraw`).
                Phase::Firing if seen.is_repeating() && seen.in_transit() => (
                    bump_sequence(seen.with_phase(Phase::Pending)),
                    AfterFire::RearmOnArrival,
                ),
                Phase::Firing if seen.is_repeating() => (
                    bump_sequence(seen.with_phase(Phase::Pending) | MSG),
                    AfterFire::Rearm,
                ),
                _ if seen.in_transit() => (
                    seen.with_phase(Phase::Done) & !LOCKED,
                    AfterFire::AwaitMessage,
                ),
                // A woken timer stays `LOCKED` until it is freed: a drop of its
                // `Sleep` must not write to a word its holder is about to store over.
                _ => (current, AfterFire::Free),
            };
            next
        });
        outcome
    }

    /// Begins a claimed waker timer's wake: `false` if its `Sleep` defused it first. Only a
    /// defuse races the runner here, so the loop retries at most once.
    pub fn begin_wake(&self) -> bool {
        let mut current = self.word.load(Ordering::Acquire);
        loop {
            if Observed(current).phase() != Phase::Firing {
                return false;
            }
            match self.word.compare_exchange(
                current,
                current | LOCKED,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    /// A waker timer's `Sleep` is dropped and could not cancel it: stops a wake not begun,
    /// or says one is under way (or over).
    pub fn defuse(&self, generation: u32) -> Defused {
        let mut current = self.word.load(Ordering::Acquire);
        loop {
            let seen = Observed(current);
            if seen.generation() != generation || seen.phase() != Phase::Firing {
                return Defused::Over;
            }
            if seen.is_locked() {
                return Defused::Waking;
            }
            match self.word.compare_exchange(
                current,
                seen.with_phase(Phase::FiringCancelled),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Defused::BeforeWake,
                Err(actual) => current = actual,
            }
        }
    }

    /// The owner ends a pending timer at shutdown unrun; `false` if a canceller won.
    pub fn try_discard(&self, seen: Observed) -> bool {
        self.claim(seen, Phase::Cancelled)
    }

    /// The owner ends a timer it ran or discarded at shutdown but a message still names:
    /// `Done`, so no handle sees it pending.
    pub fn end(&self) {
        update(&self.word, Ordering::AcqRel, Ordering::Acquire, |current| {
            Observed(current).with_phase(Phase::Done)
        });
    }

    /// Gives the node back, moving the generation on. `false` when it is exhausted: the
    /// node must be retired, or a handle a full wrap old would name its next timer.
    pub fn free(&self) -> bool {
        let generation = self.observe().generation();
        match generation.checked_add(1) {
            Some(next) => {
                self.word.store(
                    (u64::from(next) << GENERATION_SHIFT) | Phase::Free as u64,
                    Ordering::Release,
                );
                true
            }
            None => false,
        }
    }

    /// Whether the timer of `generation` will still run (pending, or repeating and firing).
    pub fn is_pending(&self, generation: u32) -> bool {
        let seen = self.observe();
        seen.generation() == generation
            && match seen.phase() {
                Phase::Pending => true,
                Phase::Firing => seen.is_repeating(),
                _ => false,
            }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn armed(repeating: bool) -> (TimerState, u32) {
        let state = TimerState::new();
        let generation = state.arm(if repeating {
            Kind::Repeating
        } else {
            Kind::OneShot
        });
        (state, generation)
    }

    #[test]
    fn cancel_in_transit_needs_no_message_and_wins_once() {
        let (state, generation) = armed(false);
        assert_eq!(state.try_cancel(generation), Some(Cancelled::Done));
        assert_eq!(state.try_cancel(generation), None);
        assert_eq!(state.receive(), Received::Free);
    }

    #[test]
    fn cancel_of_a_filed_timer_asks_for_one_message() {
        let (state, generation) = armed(false);
        assert_eq!(state.receive(), Received::File);
        assert_eq!(state.try_cancel(generation), Some(Cancelled::Notify));
        assert_eq!(state.receive(), Received::UnlinkAndFree);
    }

    #[test]
    fn withdraw_takes_only_a_timer_that_never_ran() {
        // Unrun, in transit or filed: withdrawn, with a message for a filed one.
        let (state, generation) = armed(true);
        assert_eq!(state.try_withdraw(generation), Some(Cancelled::Done));
        let (state, generation) = armed(false);
        assert_eq!(state.receive(), Received::File);
        assert_eq!(state.try_withdraw(generation), Some(Cancelled::Notify));
        // A repeating timer running, or re-armed after a run, stands.
        let (state, generation) = armed(true);
        assert_eq!(state.receive(), Received::File);
        assert!(state.try_fire(state.observe()));
        assert_eq!(state.try_withdraw(generation), None, "running");
        assert_eq!(state.finish_fire(), AfterFire::Rearm);
        assert_eq!(state.observe().phase(), Phase::Pending);
        assert_eq!(state.try_withdraw(generation), None, "ran once");
        assert_eq!(state.try_cancel(generation), Some(Cancelled::Done));
    }

    #[test]
    fn fire_beats_a_later_cancel() {
        let (state, generation) = armed(false);
        assert_eq!(state.receive(), Received::File);
        assert!(state.try_fire(state.observe()));
        assert_eq!(state.try_cancel(generation), None);
        assert!(!state.lock_for_reset(generation));
        assert_eq!(state.finish_fire(), AfterFire::Free);
    }

    #[test]
    fn a_reset_between_observe_and_fire_makes_the_fire_fail() {
        let (state, generation) = armed(false);
        state.receive();
        let seen = state.observe();
        assert!(state.lock_for_reset(generation));
        assert!(!state.unlock_reset(false));
        assert!(!state.try_fire(seen));
        assert!(state.try_fire(state.observe()));
    }

    #[test]
    fn an_earlier_reset_of_a_filed_timer_asks_for_a_message_once() {
        let (state, generation) = armed(false);
        state.receive();
        assert!(state.lock_for_reset(generation));
        assert!(state.unlock_reset(true));
        assert!(state.lock_for_reset(generation));
        assert!(!state.unlock_reset(true), "a message is already in transit");
        assert_eq!(state.receive(), Received::Refile);
    }

    #[test]
    fn a_locked_timer_does_not_fire() {
        let (state, generation) = armed(false);
        state.receive();
        assert!(state.lock_for_reset(generation));
        assert!(!state.try_fire(state.observe()));
        state.unlock_reset(false);
    }

    #[test]
    fn repeating_timers_rearm_unless_cancelled_while_firing() {
        let (state, generation) = armed(true);
        state.receive();
        assert!(state.try_fire(state.observe()));
        assert!(state.is_pending(generation));
        assert_eq!(state.finish_fire(), AfterFire::Rearm);
        assert_eq!(
            state.receive(),
            Received::File,
            "a re-armed timer is filed anew"
        );
        assert!(state.try_fire(state.observe()));
        assert_eq!(state.try_cancel(generation), Some(Cancelled::Done));
        assert!(!state.is_pending(generation));
        assert_eq!(state.finish_fire(), AfterFire::Free);
    }

    #[test]
    fn stale_generations_touch_nothing() {
        let (state, generation) = armed(false);
        state.try_cancel(generation);
        state.receive();
        assert!(state.free());
        let next = state.arm(Kind::OneShot);
        assert_ne!(next, generation);
        assert_eq!(state.try_cancel(generation), None);
        assert!(!state.lock_for_reset(generation));
        assert!(!state.is_pending(generation));
        assert!(state.is_pending(next));
    }

    #[test]
    fn a_fire_with_a_message_in_transit_waits_for_it() {
        let (state, generation) = armed(false);
        state.receive();
        assert!(state.lock_for_reset(generation));
        assert!(state.unlock_reset(true));
        assert!(state.try_fire(state.observe()));
        assert_eq!(state.finish_fire(), AfterFire::AwaitMessage);
        assert_eq!(state.receive(), Received::Free);
    }

    fn fired_waker() -> (TimerState, u32) {
        let state = TimerState::new();
        let generation = state.arm(Kind::Waker);
        state.receive();
        assert!(state.try_fire(state.observe()));
        (state, generation)
    }

    #[test]
    fn a_defused_wake_never_begins() {
        let (state, generation) = fired_waker();
        assert_eq!(state.defuse(generation), Defused::BeforeWake);
        assert!(!state.begin_wake());
        assert_eq!(state.finish_fire(), AfterFire::Free);
    }

    #[test]
    fn a_wake_under_way_is_not_defused() {
        let (state, generation) = fired_waker();
        assert!(state.begin_wake());
        assert_eq!(state.defuse(generation), Defused::Waking);
        assert_eq!(
            state.try_cancel(generation),
            None,
            "a wake's lock is no reset's"
        );
        assert!(!state.lock_for_reset(generation));
        assert_eq!(state.finish_fire(), AfterFire::Free);
        assert_eq!(
            state.defuse(generation),
            Defused::Waking,
            "until the node is freed"
        );
        assert!(state.free());
        assert_eq!(state.defuse(generation), Defused::Over);
    }

    #[test]
    fn a_waker_timer_is_locked_for_a_new_waker_like_a_reset() {
        let state = TimerState::new();
        let generation = state.arm(Kind::Waker);
        state.receive();
        assert!(state.lock_for_reset(generation));
        assert!(!state.try_fire(state.observe()));
        assert!(!state.unlock_reset(false));
        assert!(state.observe().is_waker());
        assert!(state.try_fire(state.observe()));
    }

    #[test]
    fn the_last_generation_is_retired() {
        let state = TimerState {
            word: AtomicU64::new((u64::from(u32::MAX)) << GENERATION_SHIFT),
        };
        assert!(!state.free());
    }
}
