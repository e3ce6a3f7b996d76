//! One shard: its [`ShardState`], and its held wheel behind a hand-over flag, so another worker can
//! stand in for a stuck owner.

use std::ops::Deref;
use std::time::Instant;

use crossbeam_utils::CachePadded;

use crate::engine::held_wheel::{Extracted, HeldWheel};
use crate::engine::shard_state::ShardState;
use crate::engine::shutdown::PendingTimers;
use crate::sync::UnsafeCell;
use crate::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use crate::time::ticks::Ticks;

/// In `wheel_hold`: a thread holds the wheel.
const HELD: u8 = 1;
/// In `wheel_hold`, only with [`HELD`]: a sweep is asked of the holder.
const SWEEP: u8 = 2;

/// One shard, as seen from any thread.
pub(crate) struct Shard {
    parts: ShardState,
    /// Touched only by the thread whose [`HELD`] bit is in `wheel_hold`.
    wheel: UnsafeCell<HeldWheel>,
    /// [`HELD`] while a thread holds the wheel, with [`SWEEP`] when a late pusher at shutdown asks
    /// for a sweep. Changed only by read-modify-writes, so a request and a release cannot miss each
    /// other.
    wheel_hold: CachePadded<AtomicU8>,
    /// The last turn is over (a later finish must not wait for a sweep's wheel).
    finished: AtomicBool,
}

// SAFETY: all is atomic or lock-free but `wheel`, which only the `HELD` bit's holder touches
// (ground rule 1).
unsafe impl Sync for Shard {}

impl Deref for Shard {
    type Target = ShardState;

    #[inline]
    fn deref(&self) -> &ShardState {
        &self.parts
    }
}

impl Shard {
    pub(crate) fn new(capacity: usize, ticks: Ticks, hands_out: bool) -> Self {
        Self {
            parts: ShardState::new(capacity),
            wheel: UnsafeCell::new(HeldWheel::new(ticks, hands_out)),
            wheel_hold: CachePadded::new(AtomicU8::new(0)),
            finished: AtomicBool::new(false),
        }
    }

    /// Runs `f` on the held wheel unless another thread holds it (`None`). A holder runs user code
    /// only in the last turn, so nobody waits long.
    pub(crate) fn with_wheel<R>(&self, f: impl FnOnce(&mut HeldWheel) -> R) -> Option<R> {
        self.try_hold_wheel().then(|| self.held_wheel(f))
    }

    /// [`with_wheel`](Self::with_wheel), waiting out a stand-in's short hold.
    pub(crate) fn with_wheel_waiting<R>(&self, f: impl FnOnce(&mut HeldWheel) -> R) -> R {
        crate::sync::spin_until(|| self.try_hold_wheel().then_some(()));
        self.held_wheel(f)
    }

    fn try_hold_wheel(&self) -> bool {
        self.wheel_hold
            .compare_exchange(0, HELD, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    fn held_wheel<R>(&self, f: impl FnOnce(&mut HeldWheel) -> R) -> R {
        // SAFETY: ground rule 1: `try_hold_wheel` succeeded (Acquire), so this thread holds it
        // until `let_go_of_wheel`.
        let result = self.wheel.with_mut(|wheel| f(unsafe { &mut *wheel }));
        self.let_go_of_wheel();
        result
    }

    fn let_go_of_wheel(&self) {
        // Sweeps for each request first: a release succeeds only on a word with none. Acquire on
        // failure: the sweep sees the push before the request.
        while self
            .wheel_hold
            .compare_exchange(HELD, 0, Ordering::Release, Ordering::Acquire)
            .is_err()
        {
            // A read-modify-write: a request made meanwhile fails the next release.
            self.wheel_hold.fetch_and(!SWEEP, Ordering::Relaxed);
            // SAFETY: this thread still holds the wheel.
            self.wheel
                .with_mut(|wheel| unsafe { &mut *wheel }.sweep(self));
        }
    }

    /// By a thread that pushed, then saw the shutdown: after the last turn nobody takes what is
    /// pushed, so it sweeps itself, or asks the holder to. Never waits.
    pub(crate) fn settle_after_shutdown(&self) {
        // Release: a holder seeing the request sees the push. Acquire: follows the last release.
        let before = self.wheel_hold.fetch_or(HELD | SWEEP, Ordering::AcqRel);
        if before & HELD == 0 {
            self.let_go_of_wheel();
        }
    }

    /// The shard's last turn at shutdown.
    pub(crate) fn finish(&self, pending: PendingTimers, now: Instant) {
        if self.is_finished() {
            return;
        }
        self.wait_for_hands();
        self.with_wheel_waiting(|wheel| wheel.finish(self, pending, now));
        self.finished.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }

    /// The owner's look at its wheel, recording its heartbeat.
    pub(crate) fn owner_look(&self, now: Instant, now_tick: u64) -> Extracted {
        let look = self.with_wheel_waiting(|wheel| wheel.extract(self, now));
        self.beat(now_tick);
        look
    }
}
