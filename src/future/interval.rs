//! [`Interval`]: ticks at a fixed period, with tokio's missed-tick behaviours.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::engine::TimerEngine;
use crate::engine::periodic::MissedTicks;
use crate::future::sleep::Sleep;

/// How late a tick may be before it counts as missed (tokio's threshold): a tick this late
/// or less is followed by the next one a period after its deadline, whatever the policy.
const MISSED_AFTER: Duration = Duration::from_millis(5);

/// Ticks every period: corewheel's `tokio::time::Interval`, with the same semantics.
///
/// Made by [`interval`](crate::interval) and [`interval_at`](crate::interval_at), or
/// [`TimerEngine::interval`] and [`TimerEngine::interval_at`]. Each [`tick`](Self::tick)
/// completes at the next deadline and returns it. The first tick of `interval(period)`
/// completes at once. When a tick is more than 5 ms late, the next deadline follows the
/// [`MissedTicks`] policy (tokio's `MissedTickBehavior`), which is
/// [`Burst`](MissedTicks::Burst) by default, as in tokio.
///
/// Differences from tokio, all documented choices:
/// - A zero period does not panic: it is taken as one tick of the engine.
/// - Once its engine has shut down, no tick comes any more (`tick` stays pending): its
///   timers will not fire, and ticking early instead would turn a loop over `tick` into a
///   busy loop.
/// - The ticks are read against the engine's clock, so an engine on a
///   [`ManualClock`](crate::ManualClock) drives an `Interval` deterministically.
/// - A deadline is rounded up to the engine's tick when the timer is armed; the instants
///   `tick` returns are the exact ones (start + n × period for `Burst`).
///
/// ```
/// use corewheel::{ManualClock, TimerEngine};
/// use std::task::{Context, Poll, Waker};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let engine = TimerEngine::builder().manual_clock(clock.clone()).build().unwrap();
/// let start = engine.now();
/// let mut heartbeat = engine.interval(Duration::from_secs(10));
/// let mut cx = Context::from_waker(Waker::noop());
/// assert_eq!(heartbeat.poll_tick(&mut cx), Poll::Ready(start), "the first tick is at once");
/// assert!(heartbeat.poll_tick(&mut cx).is_pending());
/// clock.advance(Duration::from_secs(10));
/// engine.turn();
/// assert_eq!(heartbeat.poll_tick(&mut cx), Poll::Ready(start + Duration::from_secs(10)));
/// ```
#[derive(Debug)]
pub struct Interval<'e> {
    sleep: Sleep<'e>,
    period: Duration,
    missed: MissedTicks,
}

impl<'e> Interval<'e> {
    fn new(engine: &'e TimerEngine, start: Instant, period: Duration) -> Self {
        let period = if period.is_zero() {
            engine.tick()
        } else {
            period
        };
        Self {
            sleep: engine.sleep_until(start),
            period,
            missed: MissedTicks::Burst,
        }
    }

    /// Completes at the next tick, and returns its deadline.
    pub async fn tick(&mut self) -> Instant {
        std::future::poll_fn(|cx| self.poll_tick(cx)).await
    }

    /// Polls for the next tick: `Ready` with its deadline once it has come, or `Pending`,
    /// and the task is woken when it comes.
    pub fn poll_tick(&mut self, cx: &mut Context<'_>) -> Poll<Instant> {
        let armed = self.sleep.is_armed();
        if armed && Pin::new(&mut self.sleep).poll(cx).is_pending() {
            return Poll::Pending;
        }
        let now = self.sleep.engine().now();
        // Unarmed, a tick already due completes now rather than on the engine's next turn
        // (the first tick of `interval` is at once, as in tokio).
        if !armed && self.sleep.deadline() > now && Pin::new(&mut self.sleep).poll(cx).is_pending()
        {
            return Poll::Pending;
        }
        let due = self.sleep.deadline();
        if now < due || self.sleep.is_never() || self.sleep.engine_is_shut_down() {
            // Not yet; or never (the deadline reads a placeholder far off, which a manual
            // clock can pass); or the engine has shut down, which completes the sleep early
            // and after which no tick comes.
            return Poll::Pending;
        }
        let missed = due
            .checked_add(MISSED_AFTER)
            .is_some_and(|limit| now > limit);
        let next = if missed {
            next_after_missed(self.missed, due, now, self.period)
        } else {
            due.checked_add(self.period)
        };
        // Past the end of `Instant`, the next tick never comes.
        self.sleep.reset_to(next);
        Poll::Ready(due)
    }

    /// Starts again: the next tick is a period from now.
    pub fn reset(&mut self) {
        self.reset_after(self.period);
    }

    /// The next tick is now; the ones after it a period apart.
    pub fn reset_immediately(&mut self) {
        self.reset_at(self.sleep.engine().now());
    }

    /// The next tick is `after` from now; the ones after it a period apart.
    pub fn reset_after(&mut self, after: Duration) {
        let now = self.sleep.engine().now();
        self.sleep.reset_to(now.checked_add(after));
    }

    /// The next tick is at `deadline`; the ones after it a period apart.
    pub fn reset_at(&mut self, deadline: Instant) {
        self.sleep.reset(deadline);
    }

    /// The period (a zero period asked for reads as the engine's tick).
    pub fn period(&self) -> Duration {
        self.period
    }

    /// What happens to ticks missed by more than 5 ms.
    pub fn missed_tick_behavior(&self) -> MissedTicks {
        self.missed
    }

    /// Chooses what happens to ticks missed by more than 5 ms.
    pub fn set_missed_tick_behavior(&mut self, behavior: MissedTicks) {
        self.missed = behavior;
    }
}

/// The deadline after a tick due at `due` that completed at `now`, more than
/// [`MISSED_AFTER`] late, as tokio computes it; `None` past the end of `Instant`.
fn next_after_missed(
    policy: MissedTicks,
    due: Instant,
    now: Instant,
    period: Duration,
) -> Option<Instant> {
    match policy {
        MissedTicks::Burst => due.checked_add(period),
        MissedTicks::Delay => now.checked_add(period),
        MissedTicks::Skip => {
            let late = now.saturating_duration_since(due).as_nanos();
            let into_period = late % period.as_nanos().max(1);
            // `into_period` < period, which is a `Duration`, so it fits in one.
            let back = Duration::from_nanos(u64::try_from(into_period).unwrap_or(u64::MAX));
            now.checked_add(period.saturating_sub(back))
        }
    }
}

impl TimerEngine {
    /// An [`Interval`] whose first tick is now, and then every `period` (a zero period is
    /// one tick of the engine).
    pub fn interval(&self, period: Duration) -> Interval<'_> {
        Interval::new(self, self.now(), period)
    }

    /// An [`Interval`] whose first tick is at `start`, and then every `period`.
    pub fn interval_at(&self, start: Instant, period: Duration) -> Interval<'_> {
        Interval::new(self, start, period)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn missed_ticks_follow_tokio() {
        let due = Instant::now();
        let period = Duration::from_millis(10);
        let now = due + Duration::from_millis(25);
        let next = |policy| next_after_missed(policy, due, now, period);
        assert_eq!(next(MissedTicks::Burst), Some(due + period));
        assert_eq!(next(MissedTicks::Delay), Some(now + period));
        assert_eq!(
            next(MissedTicks::Skip),
            Some(due + Duration::from_millis(30))
        );
        let on_a_tick = due + Duration::from_millis(20);
        assert_eq!(
            next_after_missed(MissedTicks::Skip, due, on_a_tick, period),
            Some(due + Duration::from_millis(30)),
            "a tick exactly on time for a later period waits for the next one"
        );
    }
}
