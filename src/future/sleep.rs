//! [`Sleep`]: a future that completes at a deadline, on a pooled engine timer.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::engine::TimerEngine;
use crate::engine::handle::TimerHandle;
use crate::engine::shared::EngineShared;
use crate::error::ScheduleError;

/// A future that completes at its deadline, never earlier: corewheel's `tokio::time::Sleep`.
///
/// Made by [`sleep`](crate::sleep) and [`sleep_until`](crate::sleep_until) on the default
/// engine, or [`TimerEngine::sleep`] and [`TimerEngine::sleep_until`] on a chosen one. It
/// depends on no runtime: any executor polls it.
///
/// **What it costs.** A `Sleep` is 64 bytes on 64-bit targets (tokio's is 112) and `Unpin`,
/// so it needs no `Box::pin`. It holds a handle, not a timer: its first poll arms a
/// timer whose node, taken from the engine's pool, holds a clone of the task's waker, so
/// sleeping allocates nothing once the pool is warm. Polling again with a waker that
/// [`will_wake`](Waker::will_wake) the same task touches nothing shared; another waker
/// replaces the one in the node. Dropping a `Sleep` before it completes cancels its
/// timer, and the node goes back to the pool, with the waker clone it holds, within a few
/// ticks.
///
/// **Guarantees.** It completes at or after its deadline (rounded up to the engine's
/// tick), and its task is woken then. Dropping it before its deadline cancels the wake; a
/// drop that races the wake stops it if it has not begun, and otherwise lets it land,
/// perhaps after the drop returns (a spurious wake, harmless, as with tokio): waiting for
/// it could wait for the executor, which may be waiting for the dropping thread. A reset
/// or a past deadline takes effect on the engine's next turn, not at the next poll (tokio
/// completes a past deadline at the next poll). A deadline too far off
/// for the engine (as from `Duration::MAX`) never comes; the `Sleep` stays pending. When
/// its engine shuts down, a pending `Sleep` is woken and completes, so no task waits on a
/// timer that will never fire; on an engine already shut down it completes at once. When
/// the engine's pool is full, it wakes its task to poll again rather than fail.
///
/// ```
/// use corewheel::{ManualClock, TimerEngine};
/// use std::task::{Context, Poll, Waker};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let engine = TimerEngine::builder().manual_clock(clock.clone()).build().unwrap();
/// let mut sleep = engine.sleep(Duration::from_millis(10));
/// let mut cx = Context::from_waker(Waker::noop());
/// assert!(std::pin::pin!(&mut sleep).poll(&mut cx).is_pending());
/// clock.advance(Duration::from_millis(10));
/// engine.turn();
/// assert!(sleep.is_elapsed());
/// ```
#[must_use = "a Sleep does nothing unless polled"]
pub struct Sleep<'e> {
    engine: &'e TimerEngine,
    deadline: Instant,
    /// The armed timer; `None` before the first poll and after a reset found the timer gone.
    timer: Option<TimerHandle>,
    /// The data and vtable pointers of the waker the timer holds, to tell a poll with the
    /// same waker without touching the node. Integers, so that `Sleep` stays `Send`.
    waker: [usize; 2],
    elapsed: bool,
    /// The deadline asked for was past the end of `Instant`: the timer never fires.
    never: bool,
}

impl<'e> Sleep<'e> {
    pub(crate) fn new(engine: &'e TimerEngine, deadline: Option<Instant>) -> Self {
        Self {
            engine,
            deadline: deadline.unwrap_or_else(|| far_future(engine.now())),
            timer: None,
            waker: [0; 2],
            elapsed: false,
            never: deadline.is_none(),
        }
    }

    /// The deadline tick its timer is armed at.
    fn tick(&self) -> u64 {
        if self.never {
            u64::MAX
        } else {
            self.engine.shared.ticks.ceil(self.deadline)
        }
    }

    /// The instant it completes at (before rounding up to the engine's tick).
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether it has completed: its timer has fired (or its engine shut down). `false`
    /// before its first poll, whatever the clock says, as the timer is armed by that poll.
    pub fn is_elapsed(&self) -> bool {
        // A waker timer never repeats, so "pending" is "has not begun firing".
        self.elapsed
            || self
                .timer
                .is_some_and(|handle| !self.engine.is_pending(handle))
    }

    /// Moves the deadline to `deadline`, whether or not it has completed: the way to make
    /// an idle timeout from one `Sleep`, pushed back on every read.
    ///
    /// A pending timer is moved in place: a few atomic operations on its node, and no
    /// message to the engine unless the deadline moves earlier; nothing at all when the
    /// new deadline falls in the same engine tick as the old one. A timer that already
    /// fired is let go, and the next poll arms a new one, so poll the `Sleep` again after
    /// a reset (as with tokio's).
    ///
    /// ```
    /// use corewheel::{ManualClock, TimerEngine};
    /// use std::task::{Context, Waker};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let engine = TimerEngine::builder().manual_clock(clock.clone()).build().unwrap();
    /// let mut idle = engine.sleep(Duration::from_secs(30));
    /// let mut cx = Context::from_waker(Waker::noop());
    /// assert!(std::pin::pin!(&mut idle).poll(&mut cx).is_pending());
    /// clock.advance(Duration::from_secs(20));
    /// idle.reset(engine.now() + Duration::from_secs(30)); // a read arrived
    /// clock.advance(Duration::from_secs(20));
    /// engine.turn();
    /// assert!(!idle.is_elapsed(), "40 s in, but only 20 s idle");
    /// ```
    pub fn reset(&mut self, deadline: Instant) {
        self.reset_to(Some(deadline));
    }

    /// [`reset`](Self::reset), to a deadline past the end of `Instant` (never) if `None`.
    pub(crate) fn reset_to(&mut self, deadline: Option<Instant>) {
        let old_tick = self.timer.map(|_| self.tick());
        self.deadline = deadline.unwrap_or_else(|| far_future(self.engine.now()));
        self.never = deadline.is_none();
        let Some(old_tick) = old_tick else {
            self.elapsed = false;
            return;
        };
        let new_tick = self.tick();
        if new_tick == old_tick {
            // The timer is due at that tick already (an idle timeout pushed back by reads
            // within one tick): nothing in the engine changes. If it has fired, `elapsed`
            // stays true, which is sound because the engine fires a tick only once its clock
            // has reached the tick's start (`Ticks::floor`), at or after any deadline that
            // rounds up to it (`Ticks::ceil`).
            return;
        }
        self.elapsed = false;
        let Some(handle) = self.timer else {
            return;
        };
        if !EngineShared::reset(&self.engine.shared, handle, new_tick) {
            // It has fired: the next poll arms a new timer. Its wake is let land, even
            // after this: the task that polled may be another than this one, and only that
            // wake makes it poll again.
            self.timer = None;
        }
    }

    /// The engine it sleeps on.
    pub(crate) fn engine(&self) -> &'e TimerEngine {
        self.engine
    }

    /// Whether its timer is armed (it has been polled since it was made or last reset a
    /// fired timer).
    pub(crate) fn is_armed(&self) -> bool {
        self.timer.is_some()
    }

    /// Whether the timer holds a waker that wakes the same task as `waker`.
    fn holds(&self, waker: &Waker) -> bool {
        self.waker == identity(waker)
    }

    /// Arms the timer with `cx`'s waker.
    fn arm(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let tick = self.tick();
        match EngineShared::arm_waker(&self.engine.shared, tick, cx.waker().clone()) {
            Ok(handle) => {
                self.timer = Some(handle);
                self.waker = identity(cx.waker());
                Poll::Pending
            }
            Err(ScheduleError::Capacity) => {
                // No node to be had: poll again soon rather than complete early.
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Err(_) => {
                self.elapsed = true;
                Poll::Ready(())
            }
        }
    }
}

/// A waker's identity, as [`Waker::will_wake`] compares it.
fn identity(waker: &Waker) -> [usize; 2] {
    [
        waker.data() as usize,
        std::ptr::from_ref(waker.vtable()) as usize,
    ]
}

impl Future for Sleep<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.elapsed {
            return Poll::Ready(());
        }
        let Some(handle) = this.timer else {
            return this.arm(cx);
        };
        let waiting = if this.holds(cx.waker()) {
            this.engine.is_pending(handle)
        } else {
            this.engine.shared.replace_waker(handle, cx.waker())
        };
        if waiting {
            this.waker = identity(cx.waker());
            Poll::Pending
        } else {
            this.elapsed = true;
            Poll::Ready(())
        }
    }
}

impl Drop for Sleep<'_> {
    fn drop(&mut self) {
        if let Some(handle) = self.timer.take() {
            EngineShared::retire_waker(&self.engine.shared, handle);
        }
    }
}

impl std::fmt::Debug for Sleep<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sleep")
            .field("deadline", &self.deadline)
            .field("elapsed", &self.is_elapsed())
            .finish_non_exhaustive()
    }
}

impl TimerEngine {
    /// A [`Sleep`] that completes `delay` from now on this engine's clock.
    ///
    /// A delay too long to add to now (`Duration::MAX`) gives a `Sleep` that never
    /// completes by itself (until reset); its [`deadline`](Sleep::deadline) reads about 30
    /// years on. A deadline within `Instant`'s range but past the engine's (about 584
    /// million years at a 1 ms tick) never comes either.
    pub fn sleep(&self, delay: Duration) -> Sleep<'_> {
        Sleep::new(self, EngineShared::instant_after(&self.shared, delay))
    }

    /// A [`Sleep`] that completes at `deadline`. A deadline already past completes on the
    /// engine's next turn after the first poll.
    pub fn sleep_until(&self, deadline: Instant) -> Sleep<'_> {
        Sleep::new(self, Some(deadline))
    }
}

/// About 30 years from `now` (tokio's choice for an overflowing deadline), or as far as
/// `Instant` goes. Only shown by [`Sleep::deadline`]: such a `Sleep` never fires.
fn far_future(now: Instant) -> Instant {
    const THIRTY_YEARS: Duration = Duration::from_secs(30 * 365 * 86_400);
    now.checked_add(THIRTY_YEARS).unwrap_or(now)
}
