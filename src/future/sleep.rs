//! [`Sleep`]: a future that completes at a deadline, on a pooled engine timer.

use crate::sync::atomic::Ordering;
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
/// **What it costs.** A `Sleep` is 56 bytes on 64-bit targets (tokio's is 112) and `Unpin`,
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
/// it could wait for the executor, which may be waiting for the dropping thread. After a
/// [`reset`](Self::reset) to a later deadline, the timer left at the old one wakes the
/// task once at that deadline (a spurious wake, so that the poll it brings arms the new
/// deadline); the `Sleep` never completes before its current deadline. A deadline given as
/// an instant that has already passed (by [`sleep_until`](crate::sleep_until),
/// [`timeout_at`](crate::timeout_at) or a reset) completes at the next poll, as tokio's
/// does, without arming a timer. A deadline too far off
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
    /// The deadline in nanoseconds from the engine's origin (negative before it): half an
    /// `Instant`'s size, and a tick away by one divide.
    deadline: i64,
    /// The timer last armed, which may have fired since (for an older deadline, after a
    /// later reset); `None` before the first poll and when a poll found the pool full.
    timer: Option<TimerHandle>,
    /// The data and vtable pointers of the waker the timer holds, to tell a poll with the
    /// same waker without touching the node. Integers, so that `Sleep` stays `Send`.
    waker: [usize; 2],
    elapsed: bool,
    /// The deadline asked for was past the engine's range (`deadline` then holds about 30
    /// years from when it was asked): the timer never fires.
    never: bool,
    /// The deadline was given as an instant, which may have passed already: the next poll
    /// compares it with the clock before arming anything. A deadline made from a delay
    /// is ahead of the clock when made, and skips that read.
    maybe_past: bool,
}

impl<'e> Sleep<'e> {
    /// A `Sleep` until `deadline` nanoseconds from the engine's origin, or never if `None`.
    /// `maybe_past`: the deadline was given as an instant rather than as a delay from now.
    pub(crate) fn new(engine: &'e TimerEngine, deadline: Option<i64>, maybe_past: bool) -> Self {
        let mut sleep = Self {
            engine,
            deadline: 0,
            timer: None,
            waker: [0; 2],
            elapsed: false,
            never: false,
            maybe_past,
        };
        sleep.set_deadline(deadline);
        sleep
    }

    /// The deadline tick its timer is armed at.
    fn tick(&self) -> u64 {
        if self.never {
            u64::MAX
        } else {
            self.engine.shared.ticks.ceil_signed(self.deadline)
        }
    }

    /// The instant it completes at (before rounding up to the engine's tick). A deadline
    /// more than 292 years after the engine started reads as about 30 years on (at most
    /// that end of the engine's range), and never comes.
    pub fn deadline(&self) -> Instant {
        self.engine.shared.ticks.instant_at_signed(self.deadline)
    }

    /// Whether it has completed: its timer has fired and the engine's clock has reached its
    /// deadline's tick (or its engine has shut down). `false` before its first poll,
    /// whatever the clock says, as the timer is armed by that poll.
    pub fn is_elapsed(&self) -> bool {
        // A waker timer never repeats, so "pending" is "has not begun firing".
        self.elapsed
            || self
                .timer
                .is_some_and(|handle| !self.engine.is_pending(handle) && self.fired_for_deadline())
    }

    /// Moves the deadline to `deadline`, whether or not it has completed: the way to make
    /// an idle timeout from one `Sleep`, pushed back on every read.
    ///
    /// **Later** (the idle timeout's case) touches nothing shared: only the `Sleep`'s own
    /// deadline changes. The timer stays where it was; when it fires, its wake makes the
    /// task poll, and that poll finds the deadline not reached and arms a timer for it. So
    /// an idle timeout pushed back on every read costs one spurious wake and one new timer
    /// per old deadline, not a message to the engine per read. **Earlier** moves the timer
    /// in place (a few atomic operations on its node, and a message to the engine), and
    /// costs nothing when the new deadline falls in the same engine tick as the old one. A
    /// `Sleep` already complete stays so for an earlier deadline, which has passed too.
    /// Either way, poll the `Sleep` again after a reset, as with tokio's: it is that poll
    /// that arms the timer for the new deadline when one is needed.
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
    /// // The old deadline has passed: the poll its wake asks for arms the new one.
    /// assert!(std::pin::pin!(&mut idle).poll(&mut cx).is_pending());
    /// assert!(!idle.is_elapsed(), "40 s in, but only 20 s idle");
    /// clock.advance(Duration::from_secs(10));
    /// engine.turn();
    /// assert!(idle.is_elapsed());
    /// ```
    pub fn reset(&mut self, deadline: Instant) {
        self.reset_to(Some(deadline));
    }

    /// [`reset`](Self::reset), to a deadline past the end of `Instant` (never) if `None`.
    pub(crate) fn reset_to(&mut self, deadline: Option<Instant>) {
        let deadline =
            deadline.and_then(|deadline| self.engine.shared.ticks.signed_nanos(deadline));
        self.maybe_past = true;
        let earlier = match (deadline, self.never) {
            (None, _) => false,
            (Some(_), true) => true,
            (Some(new), false) => new < self.deadline,
        };
        if !earlier {
            // The timer, if any, fires at or before the new deadline, and the poll its wake
            // brings judges it then (`poll`, `is_elapsed`).
            self.set_deadline(deadline);
            self.elapsed = false;
            return;
        }
        let old_tick = self.tick();
        self.set_deadline(deadline);
        if self.elapsed {
            // Complete, so the old deadline has passed, and the earlier one with it.
            return;
        }
        let Some(handle) = self.timer else {
            return;
        };
        let new_tick = self.tick();
        if new_tick != old_tick {
            // The timer is armed at or before the old deadline's tick (earlier when a later
            // reset left it there), and this moves it to the new deadline's tick: earlier,
            // or later than a timer a later reset left behind, never past the deadline. A
            // timer that has fired already is judged at the next poll.
            let _moved = EngineShared::reset(&self.engine.shared, handle, new_tick);
        }
    }

    /// Sets the deadline (as [`Ticks::signed_nanos`](crate::time::ticks::Ticks::signed_nanos)),
    /// to never when `None`.
    fn set_deadline(&mut self, deadline: Option<i64>) {
        self.never = deadline.is_none();
        self.deadline = deadline.unwrap_or_else(|| {
            let ticks = &self.engine.shared.ticks;
            ticks
                .signed_nanos(far_future(self.engine.now()))
                .unwrap_or(i64::MAX)
        });
    }

    /// Whether a timer that no longer waits completes this `Sleep`: the engine's clock has
    /// reached the deadline's tick (a timer left at an older deadline by a later reset may
    /// fire before), or the engine has shut down, which wakes every waker timer and arms no
    /// more.
    fn fired_for_deadline(&self) -> bool {
        (!self.never && self.engine.shared.now_tick() >= self.tick()) || self.engine_is_shut_down()
    }

    /// Whether the engine's clock has certainly reached the deadline's tick, so that
    /// completing now cannot be early.
    fn deadline_reached(&self) -> bool {
        !self.never && EngineShared::has_reached(&self.engine.shared, self.tick())
    }

    /// Whether its deadline is too far off for the engine (as from `Duration::MAX`): it
    /// never comes, whatever [`deadline`](Self::deadline) reads.
    pub(crate) fn is_never(&self) -> bool {
        self.never
    }

    /// Whether its engine has shut down: no timer fires any more.
    pub(crate) fn engine_is_shut_down(&self) -> bool {
        self.engine.shared.shutdown.load(Ordering::Acquire)
    }

    /// The engine it sleeps on.
    pub(crate) fn engine(&self) -> &'e TimerEngine {
        self.engine
    }

    /// Whether it holds a timer (it has been polled since it was made): one still waiting,
    /// or one that fired for its deadline or for an older one.
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
        if std::mem::take(&mut this.maybe_past) && this.deadline_reached() {
            // Past already: complete now, and let go of a timer left at an older deadline.
            if let Some(handle) = this.timer.take() {
                EngineShared::retire_waker(&this.engine.shared, handle);
            }
            this.elapsed = true;
            return Poll::Ready(());
        }
        let Some(handle) = this.timer else {
            return this.arm(cx);
        };
        let waiting = if this.holds(cx.waker()) {
            this.engine.is_pending(handle)
        } else if let Some(old) = this.engine.shared.replace_waker(handle, cx.waker()) {
            // Noted before the old waker's drop, which may panic: the timer holds the new
            // one from here on.
            this.waker = identity(cx.waker());
            drop(old);
            true
        } else {
            false
        };
        if waiting {
            Poll::Pending
        } else if this.fired_for_deadline() {
            this.elapsed = true;
            Poll::Ready(())
        } else {
            // Fired for a deadline a later reset has moved on from: the handle is spent
            // (nothing to cancel), and a timer for the deadline is armed now.
            this.timer = None;
            this.arm(cx)
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
            .field("deadline", &self.deadline())
            .field("elapsed", &self.is_elapsed())
            .finish_non_exhaustive()
    }
}

impl TimerEngine {
    /// A [`Sleep`] that completes `delay` from now on this engine's clock.
    ///
    /// A delay that takes the deadline more than 292 years past the engine's start (as
    /// `Duration::MAX` does) gives a `Sleep` that never completes by itself (until reset);
    /// its [`deadline`](Sleep::deadline) reads about 30 years on, or the end of that range if
    /// sooner.
    pub fn sleep(&self, delay: Duration) -> Sleep<'_> {
        Sleep::new(self, EngineShared::nanos_after(&self.shared, delay), false)
    }

    /// A [`Sleep`] that completes at `deadline`. A deadline already past completes at the
    /// first poll; one more than 292 years past the engine's start never comes, as with
    /// [`sleep`](Self::sleep).
    pub fn sleep_until(&self, deadline: Instant) -> Sleep<'_> {
        Sleep::new(self, self.shared.ticks.signed_nanos(deadline), true)
    }
}

/// About 30 years from `now` (tokio's choice for an overflowing deadline), or as far as
/// `Instant` goes. Only shown by [`Sleep::deadline`]: such a `Sleep` never fires.
fn far_future(now: Instant) -> Instant {
    const THIRTY_YEARS: Duration = Duration::from_secs(30 * 365 * 86_400);
    now.checked_add(THIRTY_YEARS).unwrap_or(now)
}
