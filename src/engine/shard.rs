//! One shard: its [`ShardState`], and its held wheel behind a hand-over flag, so another
//! worker can stand in for a stuck owner.

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

/// One shard, as seen from any thread: its shared state, and its held wheel.
pub(crate) struct Shard {
    parts: ShardState,
    /// The held wheel, touched only by the thread whose [`HELD`] bit is in `wheel_hold`.
    wheel: UnsafeCell<HeldWheel>,
    /// [`HELD`] while a thread holds the wheel, with [`SWEEP`] when a late pusher at
    /// shutdown asks the holder to sweep before letting go. One word, changed only by
    /// read-modify-writes, so a request and a release cannot miss each other.
    wheel_hold: CachePadded<AtomicU8>,
    /// The last turn is over: a later finish must not wait for the wheel (a sweep holds it).
    finished: AtomicBool,
}

// SAFETY: every field is shared through atomics or lock-free queues, except `wheel`, which
// only the `HELD` bit's holder touches (ground rule 1).
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

    /// Runs `f` on the held wheel unless another thread holds it (`None`). Nobody waits
    /// long for it: a holder runs user code only in the last turn (ground rules 1 and 4).
    pub(crate) fn with_wheel<R>(&self, f: impl FnOnce(&mut HeldWheel) -> R) -> Option<R> {
        self.try_hold_wheel().then(|| self.held_wheel(f))
    }

    /// [`with_wheel`](Self::with_wheel) for the owner, waiting out a stand-in's short hold.
    pub(crate) fn with_wheel_waiting<R>(&self, f: impl FnOnce(&mut HeldWheel) -> R) -> R {
        crate::sync::spin_until(|| self.try_hold_wheel().then_some(()));
        self.held_wheel(f)
    }

    fn try_hold_wheel(&self) -> bool {
        self.wheel_hold
            .compare_exchange(0, HELD, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Runs `f` on the wheel this thread has just come to hold, then lets it go.
    fn held_wheel<R>(&self, f: impl FnOnce(&mut HeldWheel) -> R) -> R {
        // SAFETY: ground rule 1: `try_hold_wheel` succeeded, so this thread is the only
        // holder until `let_go_of_wheel`; its Acquire pairs with the last release.
        let result = self.wheel.with_mut(|wheel| f(unsafe { &mut *wheel }));
        self.let_go_of_wheel();
        result
    }

    /// Lets the wheel go, first sweeping for each thread that asked meanwhile: the release
    /// succeeds only on a word with no request, so a later request takes the wheel itself.
    fn let_go_of_wheel(&self) {
        // Acquire on failure: the sweep must see the push made before the request.
        while self
            .wheel_hold
            .compare_exchange(HELD, 0, Ordering::Release, Ordering::Acquire)
            .is_err()
        {
            // A read-modify-write, so a request made meanwhile stays and fails the next release.
            self.wheel_hold.fetch_and(!SWEEP, Ordering::Relaxed);
            // SAFETY: this thread still holds the wheel.
            self.wheel
                .with_mut(|wheel| unsafe { &mut *wheel }.sweep(self));
        }
    }

    /// By a thread that pushed onto this shard, then saw the shutdown: after the last turn
    /// nobody takes what is pushed, so it sweeps itself, or asks the holder to. Never waits.
    pub(crate) fn settle_after_shutdown(&self) {
        // Release: a holder seeing the request sees the push. Acquire: taking the wheel
        // here follows the last holder's release.
        let before = self.wheel_hold.fetch_or(HELD | SWEEP, Ordering::AcqRel);
        if before & HELD == 0 {
            // Held now, with this thread's own request in the word.
            self.let_go_of_wheel();
        }
    }

    /// The shard's last turn at shutdown, once no other worker can take its timers.
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

    /// The owner's look at its wheel: claims what is due and records its heartbeat.
    pub(crate) fn owner_look(&self, now: Instant, now_tick: u64) -> Extracted {
        let look = self.with_wheel_waiting(|wheel| wheel.extract(self, now));
        self.beat(now_tick);
        look
    }
}
