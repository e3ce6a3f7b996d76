//! The futures that turn a driven engine's shards on the application's async runtime
//! ([`EngineBuilder::driven`](crate::EngineBuilder::driven)), in place of worker threads: a driver
//! sleeps on the runtime's own timer, so one wake-up serves both.
//!
//! The handshake with arming threads is the worker's: the driver stores its waker, then publishes
//! its plan (`wake_at`); a thread whose timer is due sooner swaps `wake_at` to awake and wakes the
//! waker. After publishing, the driver looks once more
//! ([`must_turn_before`](crate::engine::held_wheel::HeldWheel::must_turn_before)).

use std::future::Future;
use std::marker::PhantomPinned;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use crate::engine::TimerEngine;
use crate::engine::reentrancy::Turn;
use crate::engine::shard_state::AWAKE;
use crate::engine::shared::EngineShared;
use crate::sync::Arc;
use crate::sync::atomic::Ordering;

/// Turns one shard of a driven engine on the runtime it is spawned on, until the shard's
/// last turn is over. Made by [`TimerEngine::drivers`], one per shard.
///
/// Between turns it waits on `sleep_until`'s sleep for the shard's next deadline, or for a thread
/// arming a timer due sooner. Dropped early, it leaves its shard to [`TimerEngine::turn`] until
/// [`TimerEngine::drivers`] makes another.
#[must_use = "a driver does nothing unless it is spawned or polled"]
pub struct Driver<F, S> {
    shared: Arc<EngineShared>,
    index: usize,
    sleep_until: F,
    /// The sleep for `planned`, if there is one.
    sleep: Option<S>,
    /// The tick published as the plan; `None` before the first turn and after a wake-up.
    planned: Option<u64>,
    /// `sleep` is pinned in place.
    _pinned: PhantomPinned,
}

impl<F, S> std::fmt::Debug for Driver<F, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("shard", &self.index)
            .field("planned", &self.planned)
            .finish_non_exhaustive()
    }
}

impl TimerEngine {
    /// The futures that run a [driven](crate::EngineBuilder::driven) engine's timers, one per
    /// shard, to spawn on the application's runtime. `sleep_until` makes the runtime's sleep for an
    /// instant of the engine's clock.
    ///
    /// A shard has at most one driver at a time: while one lives, another call makes none
    /// for it; once dropped, a call makes a new one that takes over. Empty for an engine
    /// with worker threads.
    ///
    /// ```
    /// # #[cfg(not(miri))] {
    /// use corewheel::TimerEngine;
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use std::time::Duration;
    ///
    /// let runtime = tokio::runtime::Builder::new_multi_thread()
    ///     .worker_threads(2)
    ///     .enable_time()
    ///     .build()
    ///     .unwrap();
    /// let engine = Arc::new(TimerEngine::builder().workers(2).driven().build().unwrap());
    /// for driver in engine.drivers(|at| tokio::time::sleep_until(at.into())) {
    ///     runtime.spawn(driver);
    /// }
    /// let fired = Arc::new(AtomicBool::new(false));
    /// let flag = Arc::clone(&fired);
    /// engine
    ///     .schedule(Duration::from_millis(5), move || flag.store(true, Ordering::Relaxed))
    ///     .unwrap();
    /// let given_up = std::time::Instant::now() + Duration::from_secs(10);
    /// while !fired.load(Ordering::Relaxed) && std::time::Instant::now() < given_up {
    ///     std::thread::sleep(Duration::from_millis(1));
    /// }
    /// assert!(fired.load(Ordering::Relaxed), "fired on a runtime thread");
    /// # }
    /// ```
    pub fn drivers<F, S>(&self, sleep_until: F) -> Vec<Driver<F, S>>
    where
        F: FnMut(Instant) -> S + Clone,
        S: Future<Output = ()>,
    {
        if !self.driven {
            return Vec::new();
        }
        (0..self.shared.shards.len())
            .filter(|&index| self.shared.shards[index].claim_driver())
            .map(|index| Driver {
                shared: Arc::clone(&self.shared),
                index,
                sleep_until: sleep_until.clone(),
                sleep: None,
                planned: None,
                _pinned: PhantomPinned,
            })
            .collect()
    }
}

impl<F, S> Future for Driver<F, S>
where
    F: FnMut(Instant) -> S,
    S: Future<Output = ()>,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // SAFETY: nothing is moved out of the pinned driver (`!Unpin`): `sleep`, its one
        // structurally pinned field, is only pinned in place below and replaced in place, which
        // drops the old sleep where it lies.
        let this = unsafe { self.get_unchecked_mut() };
        let shard = &this.shared.shards[this.index];
        loop {
            // Stored before the shutdown flag and the plan are read: a later shutdown or plan swap
            // finds this waker, an earlier one is seen below.
            shard.register_driver(cx.waker());
            if this.shared.shutdown.load(Ordering::SeqCst) {
                return this.finish(cx);
            }
            if let Some(planned) = this.planned {
                let called = shard.wake_plan() != planned || this.shared.now_tick() >= planned;
                if !called {
                    let Some(sleep) = this.sleep.as_mut() else {
                        if planned == u64::MAX {
                            // Nothing planned: a thread's or the shutdown's wake-up comes.
                            return Poll::Pending;
                        }
                        // Slept, yet the engine's clock has not come to the tick.
                        return yield_now(cx);
                    };
                    // SAFETY: `sleep` is pinned structurally (see above).
                    let sleep = unsafe { Pin::new_unchecked(sleep) };
                    if sleep.poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    this.sleep = None;
                    if this.shared.now_tick() < planned {
                        return yield_now(cx);
                    }
                }
                this.planned = None;
            }
            let Ok(turn) = Turn::begin(this.shared.id.get()) else {
                // Polled from inside a callback of this engine.
                return yield_now(cx);
            };
            if !shard.try_own() {
                // A `turn` caller has the shard, and wakes this once done.
                return Poll::Pending;
            }
            shard.plan_wake(AWAKE);
            let (_fired, next) = TimerEngine::turn_owned(&this.shared, shard);
            let plan = next.unwrap_or(u64::MAX);
            shard.plan_wake(plan);
            let must_turn = shard.with_wheel_waiting(|wheel| wheel.must_turn_before(shard, plan));
            shard.disown();
            drop(turn);
            if must_turn {
                continue;
            }
            this.planned = Some(plan);
            // Assigning drops the old sleep in place: the pinned value never moves.
            this.sleep =
                (plan != u64::MAX).then(|| (this.sleep_until)(this.shared.ticks.instant_at(plan)));
            if plan <= this.shared.now_tick() {
                return yield_now(cx);
            }
        }
    }
}

/// Asks to be polled again, after the runtime's other tasks.
fn yield_now(cx: &mut Context<'_>) -> Poll<()> {
    cx.waker().wake_by_ref();
    Poll::Pending
}

impl<F, S> Drop for Driver<F, S> {
    fn drop(&mut self) {
        self.shared.shards[self.index].release_driver();
    }
}

impl<F, S> Driver<F, S> {
    /// After a shutdown: the shard's last turn, unless made or being made.
    fn finish(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.sleep = None;
        let shard = &self.shared.shards[self.index];
        if shard.is_finished() {
            return Poll::Ready(());
        }
        let Ok(turn) = Turn::begin(self.shared.id.get()) else {
            return yield_now(cx);
        };
        if !shard.try_own() {
            // Whoever has it finishes it, then wakes this.
            return Poll::Pending;
        }
        shard.finish(self.shared.pending_mode(), self.shared.clock.now());
        shard.disown();
        drop(turn);
        Poll::Ready(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::cell::Cell;
    use std::future::Future;
    use std::marker::PhantomPinned;
    use std::pin::{Pin, pin};
    use std::sync::Arc as StdArc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll, Waker};
    use std::time::{Duration, Instant};

    use crate::{ManualClock, PendingTimers, TimerEngine};

    /// A sleep that must not move once polled: it remembers where it was first polled
    /// and fails if polled anywhere else. Ready once the manual clock has reached `at`.
    struct Pinned {
        at: Instant,
        clock: ManualClock,
        polled_at: Cell<usize>,
        dropped: StdArc<AtomicUsize>,
        _pinned: PhantomPinned,
    }

    impl Future for Pinned {
        type Output = ();

        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            let here = std::ptr::from_ref::<Self>(&self) as usize;
            match self.polled_at.get() {
                0 => self.polled_at.set(here),
                first => assert_eq!(first, here, "a pinned sleep moved"),
            }
            if crate::Clock::now(&self.clock) >= self.at {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    impl Drop for Pinned {
        fn drop(&mut self) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The driver keeps its sleep pinned where it lies, replaces it in place when the plan
    /// changes (dropping the old one), and drops the last one when it ends at shutdown.
    #[test]
    fn a_driver_replaces_its_pinned_sleep_in_place_and_ends_at_shutdown() {
        let clock = ManualClock::new();
        let engine = TimerEngine::builder()
            .workers(1)
            .driven()
            .manual_clock(clock.clone())
            .build()
            .unwrap();
        let (made, dropped) = (
            StdArc::new(AtomicUsize::new(0)),
            StdArc::new(AtomicUsize::new(0)),
        );
        let (made_here, dropped_here, sleep_clock) =
            (StdArc::clone(&made), StdArc::clone(&dropped), clock.clone());
        let mut drivers = engine.drivers(move |at| {
            made_here.fetch_add(1, Ordering::Relaxed);
            Pinned {
                at,
                clock: sleep_clock.clone(),
                polled_at: Cell::new(0),
                dropped: StdArc::clone(&dropped_here),
                _pinned: PhantomPinned,
            }
        });
        let mut driver = pin!(drivers.remove(0));
        let mut cx = Context::from_waker(Waker::noop());
        let ran = StdArc::new(AtomicUsize::new(0));
        for delay in [3, 7] {
            let ran = StdArc::clone(&ran);
            engine
                .schedule(Duration::from_millis(delay), move || {
                    ran.fetch_add(1, Ordering::Relaxed);
                })
                .unwrap();
        }
        let mut poll_for = |ms: u64| {
            for _ in 0..ms {
                assert!(driver.as_mut().poll(&mut cx).is_pending());
                clock.advance(Duration::from_millis(1));
            }
        };
        poll_for(5);
        assert_eq!(ran.load(Ordering::Relaxed), 1);
        assert_eq!(made.load(Ordering::Relaxed), 2, "one sleep per deadline");
        assert_eq!(
            dropped.load(Ordering::Relaxed),
            1,
            "the first sleep was not dropped"
        );
        poll_for(5);
        assert_eq!(ran.load(Ordering::Relaxed), 2);
        assert_eq!(
            made.load(Ordering::Relaxed),
            2,
            "a sleep with nothing planned"
        );
        assert_eq!(
            dropped.load(Ordering::Relaxed),
            2,
            "a sleep kept with nothing planned"
        );
        engine.schedule(Duration::from_secs(60), || {}).unwrap();
        assert!(driver.as_mut().poll(&mut cx).is_pending());
        assert_eq!(made.load(Ordering::Relaxed), 3);
        engine.shutdown(PendingTimers::Drop);
        assert!(driver.as_mut().poll(&mut cx).is_ready());
        assert_eq!(
            dropped.load(Ordering::Relaxed),
            3,
            "the last sleep outlived the driver"
        );
        assert_eq!(engine.nodes_in_use(), 0);
    }
}
