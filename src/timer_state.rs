//! The shared state of one pooled timer: who wins when a cancel or reset from another thread
//! races the owner firing it.
//!
//! One `AtomicU64` holds the slot's generation, a reset sequence and the phase, so that every
//! transition is a single compare-and-swap that also checks the generation: a stale handle
//! (whose generation has moved on) can never cancel or reset the timer that reused the slot.
//!
//! Layout: `generation (32 bits) | reset sequence (28 bits) | phase (4 bits)`.
//!
//! The owner fires a timer only by moving it from `Pending` to `Firing` with the exact word
//! it read before looking at the deadline. A reset stores the new deadline and then bumps the
//! sequence; if that happens between the owner's read and its swap, the swap fails and the
//! owner looks at the deadline again. So either the reset returns `true` and the timer fires
//! no earlier than the new deadline, or it returns `false` because the timer had already
//! started firing (or was cancelled, or is gone).

use crate::sync::atomic::{AtomicU64, Ordering};

const PHASE_BITS: u32 = 4;
const SEQUENCE_BITS: u32 = 28;
const PHASE_MASK: u64 = (1 << PHASE_BITS) - 1;
const SEQUENCE_MASK: u64 = ((1 << SEQUENCE_BITS) - 1) << PHASE_BITS;
const GENERATION_SHIFT: u32 = PHASE_BITS + SEQUENCE_BITS;

/// Where a timer is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// The slot holds no timer.
    Free = 0,
    /// Armed: may be cancelled, reset or fired.
    Pending = 1,
    /// The owner is running its callback; a repeating timer goes back to `Pending` after.
    Firing = 2,
    /// Firing, and a cancel arrived meanwhile: a repeating timer will not be re-armed.
    FiringCancelled = 3,
    /// Stopped by a cancel before it fired; waiting for the owner to unlink and free it.
    Cancelled = 4,
    /// A one-shot timer that has run; waiting for the owner to free it.
    Fired = 5,
}

impl Phase {
    const fn from_bits(bits: u64) -> Self {
        match bits {
            1 => Self::Pending,
            2 => Self::Firing,
            3 => Self::FiringCancelled,
            4 => Self::Cancelled,
            5 => Self::Fired,
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
        Phase::from_bits(self.0 & PHASE_MASK)
    }

    /// The generation at the time of the snapshot.
    pub const fn generation(self) -> u32 {
        (self.0 >> GENERATION_SHIFT) as u32
    }
}

/// The atomic state word of one timer slot. See the module documentation.
pub struct TimerState {
    word: AtomicU64,
}

const fn pack(generation: u32, sequence: u64, phase: Phase) -> u64 {
    ((generation as u64) << GENERATION_SHIFT) | (sequence & SEQUENCE_MASK) | phase as u64
}

impl TimerState {
    /// A free slot at generation 0.
    pub fn new() -> Self {
        Self {
            word: AtomicU64::new(pack(0, 0, Phase::Free)),
        }
    }

    /// Reads the state. Acquire: pairs with a reset's Release, so a caller that then reads
    /// the deadline sees at least the one that reset stored.
    pub fn observe(&self) -> Observed {
        Observed(self.word.load(Ordering::Acquire))
    }

    /// Arms a free slot: the slot's taker does this before publishing the handle, so no
    /// other thread can see the slot yet. Returns the generation handles must carry.
    pub fn arm(&self) -> u32 {
        let generation = self.observe().generation();
        self.word
            .store(pack(generation, 0, Phase::Pending), Ordering::Release);
        generation
    }

    /// Stops the timer of `generation` from running (again). `true` if and only if this call
    /// did it: the timer was pending, or was a repeating timer in the middle of firing.
    pub fn try_cancel(&self, generation: u32, repeating: bool) -> bool {
        self.word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
                let seen = Observed(current);
                if seen.generation() != generation {
                    return None;
                }
                let next = match seen.phase() {
                    Phase::Pending => Phase::Cancelled,
                    Phase::Firing if repeating => Phase::FiringCancelled,
                    _ => return None,
                };
                Some((current & !PHASE_MASK) | next as u64)
            })
            .is_ok()
    }

    /// Publishes a reset of the timer of `generation`, whose new deadline the caller has
    /// already stored (with Release or stronger). `true` if the timer was still pending, so
    /// that the owner will see the new deadline before it fires the timer.
    pub fn try_reset(&self, generation: u32) -> bool {
        self.word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
                let seen = Observed(current);
                if seen.generation() != generation || seen.phase() != Phase::Pending {
                    return None;
                }
                let sequence = (current & SEQUENCE_MASK) + (1 << PHASE_BITS);
                Some(pack(generation, sequence, Phase::Pending))
            })
            .is_ok()
    }

    /// The owner claims the timer for firing, if the state is still exactly `seen` (pending,
    /// with no reset since the owner read the deadline). On `false` the owner observes again.
    pub fn try_fire(&self, seen: Observed) -> bool {
        seen.phase() == Phase::Pending
            && self
                .word
                .compare_exchange(
                    seen.0,
                    (seen.0 & !PHASE_MASK) | Phase::Firing as u64,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// The owner finishes a firing: a one-shot timer becomes `Fired`; a repeating one is
    /// `Pending` again, unless a cancel arrived while it ran. Returns whether it is pending.
    pub fn finish_fire(&self, repeating: bool) -> bool {
        let rearms = |word: u64| repeating && Observed(word).phase() == Phase::Firing;
        let previous = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
                let next = if rearms(current) {
                    Phase::Pending
                } else {
                    Phase::Fired
                };
                Some((current & !PHASE_MASK) | next as u64)
            })
            .unwrap_or_else(|word| word);
        rearms(previous)
    }

    /// The owner frees the slot once the timer is unlinked and done: the generation moves
    /// on, so every outstanding handle is stale from here.
    pub fn free(&self) {
        let generation = self.observe().generation().wrapping_add(1);
        self.word
            .store(pack(generation, 0, Phase::Free), Ordering::Release);
    }

    /// Whether the timer of `generation` is armed and has not started firing.
    pub fn is_pending(&self, generation: u32) -> bool {
        let seen = self.observe();
        seen.generation() == generation && seen.phase() == Phase::Pending
    }
}

impl Default for TimerState {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_one_shot_timer_fires_or_is_cancelled_never_both() {
        let state = TimerState::new();
        let generation = state.arm();
        let seen = state.observe();
        assert!(state.try_fire(seen));
        assert!(!state.try_cancel(generation, false), "too late to cancel");
        assert!(!state.finish_fire(false));
        assert_eq!(state.observe().phase(), Phase::Fired);

        state.free();
        let generation = state.arm();
        assert!(state.try_cancel(generation, false));
        assert!(!state.try_cancel(generation, false), "double cancel");
        assert!(
            !state.try_fire(state.observe()),
            "a cancelled timer never fires"
        );
    }

    #[test]
    fn a_reset_after_the_owner_looked_makes_its_swap_fail() {
        let state = TimerState::new();
        let generation = state.arm();
        let seen = state.observe();
        assert!(state.try_reset(generation));
        assert!(
            !state.try_fire(seen),
            "the owner must look at the new deadline"
        );
        assert!(state.try_fire(state.observe()));
        assert!(
            !state.try_reset(generation),
            "a firing timer cannot be reset"
        );
    }

    #[test]
    fn a_repeating_timer_cancelled_while_firing_is_not_rearmed() {
        let state = TimerState::new();
        let generation = state.arm();
        assert!(state.try_fire(state.observe()));
        assert!(state.try_cancel(generation, true));
        assert!(
            !state.try_cancel(generation, true),
            "only the first cancel wins"
        );
        assert!(!state.finish_fire(true));
        let generation = {
            state.free();
            state.arm()
        };
        assert!(state.try_fire(state.observe()));
        assert!(state.finish_fire(true), "re-armed");
        assert!(state.is_pending(generation));
    }

    #[test]
    fn a_stale_generation_touches_nothing() {
        let state = TimerState::new();
        let old = state.arm();
        state.try_cancel(old, false);
        state.free();
        let new = state.arm();
        assert_ne!(old, new);
        assert!(!state.try_cancel(old, false));
        assert!(!state.try_reset(old));
        assert!(!state.is_pending(old));
        assert!(state.is_pending(new));
    }
}
