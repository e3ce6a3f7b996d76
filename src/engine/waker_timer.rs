//! Timers that wake a future's task: the engine's side of a [`Sleep`](crate::Sleep).
//!
//! The waker lives in the timer's pooled node, in the callback slot, so a sleep allocates
//! nothing and shares no `Arc` with its timer. Its `Sleep` alone holds the handle, and so is
//! the only thread that ever resets, re-wakers or cancels it:
//!
//! - **A new waker** is written under the state word's reset lock, which keeps the owner
//!   from firing the timer (and every other thread from freeing it) while the slot changes.
//!   If the lock cannot be had the timer has fired, and the future is done.
//! - **The wake** begins with [`TimerState::begin_wake`](crate::sync::timer_state::TimerState::begin_wake),
//!   so a drop can defuse a wake that has not begun. A wake already under way is let be: it
//!   may land after the drop returns (a spurious wake, harmless, as with tokio), because
//!   waiting for it would wait for the executor's code, which may be waiting for the
//!   dropping thread. A reset never defuses: the task that polled may be another than the
//!   one resetting, and only the wake tells it to poll again and arm the new timer.
//! - **At shutdown** a pending waker timer is woken whatever the pending mode, so that no
//!   task waits for a timer that will never fire.
//!
//! Who may touch what, and when: the ground rules in [`engine`](crate::engine).

use std::task::Waker;

use crate::engine::handle::TimerHandle;
use crate::engine::shared::{EngineShared, When};
use crate::error::ScheduleError;
use crate::sync::Arc;
use crate::sync::timer_state::{Defused, Kind};

impl EngineShared {
    /// Arms a timer at `tick` that wakes `waker`.
    #[inline]
    pub(crate) fn arm_waker(
        this: &Arc<Self>,
        tick: u64,
        waker: Waker,
    ) -> Result<TimerHandle, ScheduleError> {
        Self::arm(this, When::AtTick(tick), Kind::Waker, |callback| {
            callback.set_waker(waker)
        })
    }

    /// Makes the pending waker timer `handle` wake `waker` instead of the waker it holds,
    /// and returns that one, for the caller to drop once it has noted the change (its drop
    /// runs the executor's code, which may panic). `None` if the timer no longer waits (it
    /// fired, or is over).
    pub(crate) fn replace_waker(&self, handle: TimerHandle, waker: &Waker) -> Option<Waker> {
        let (_, node) = self.lookup(handle)?;
        // Cloned before the lock and the old one dropped after it: either runs the
        // executor's code, which must not run while the owner cannot fire this timer.
        let new = waker.clone();
        if !node.state.lock_for_reset(handle.generation()) {
            return None;
        }
        // The reset lock on a pending waker timer makes this thread (its `Sleep`'s) the
        // only one touching the callback slot (ground rule 3), and the slot holds the waker
        // `arm_waker` stored, since only a run or a free empties it and neither can happen
        // to a pending, locked timer.
        // SAFETY: this thread holds the slot alone, and it holds a waker (both as above).
        let old =
            unsafe { node.with_callback(|callback| std::mem::replace(callback.waker_mut(), new)) };
        node.state.unlock_reset(false);
        Some(old)
    }

    /// The dropped `Sleep` of the waker timer `handle` lets it go: cancels it, or defuses a
    /// wake that has not begun. Never waits: a wake already under way may still land.
    pub(crate) fn retire_waker(this: &Arc<Self>, handle: TimerHandle) {
        if Self::cancel(this, handle) {
            return;
        }
        if let Some((_, node)) = this.lookup(handle) {
            // `Waking` or `Over`: nothing to stop.
            let _: Defused = node.state.defuse(handle.generation());
        }
    }
}
