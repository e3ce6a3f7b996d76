//! Timers that wake a future's task: the engine's side of a [`Sleep`](crate::Sleep). The waker
//! lives in the node's callback slot; only its `Sleep` holds the handle.
//!
//! - **A new waker** is written under the reset lock, which keeps the timer from firing or being
//!   freed meanwhile.
//! - **The wake** begins with
//!   [`TimerState::begin_wake`](crate::sync::timer_state::TimerState::begin_wake), so a drop can
//!   defuse one not begun. One under way may land after the drop returns (a harmless spurious
//!   wake): waiting for it could wait on executor code waiting for the dropping thread.
//! - **At shutdown** a pending waker timer is woken whatever the pending mode.

use std::task::Waker;

use crate::engine::handle::TimerHandle;
use crate::engine::shared::{EngineShared, When};
use crate::error::ScheduleError;
use crate::sync::Arc;
use crate::sync::timer_state::{Defused, Kind};

impl EngineShared {
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

    /// Makes the pending waker timer `handle` wake `waker`; returns the old one (`None` if it no
    /// longer waits), for the caller to drop, as it may panic.
    pub(crate) fn replace_waker(&self, handle: TimerHandle, waker: &Waker) -> Option<Waker> {
        let (_, node) = self.lookup(handle)?;
        // Cloned before the lock, dropped after: no executor code under it.
        let new = waker.clone();
        if !node.state.lock_for_reset(handle.generation()) {
            return None;
        }
        // SAFETY: ground rule 2: the reset lock on a pending waker timer makes this thread the
        // slot's only user, and the slot holds `arm_waker`'s waker.
        let old =
            unsafe { node.with_callback(|callback| std::mem::replace(callback.waker_mut(), new)) };
        node.state.unlock_reset(false);
        Some(old)
    }

    /// A dropped `Sleep` cancels its timer, or defuses a wake not begun; never waits.
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
