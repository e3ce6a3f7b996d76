//! corewheel as hyper's timer: [`HyperTimer`] implements [`hyper::rt::Timer`], so hyper's
//! connection timeouts (HTTP/1 `header_read_timeout`, HTTP/2 keep-alive pings) run on a
//! corewheel engine instead of on an async runtime's timer.

use std::pin::Pin;
use std::time::{Duration, Instant};

use crate::{Sleep, TimerEngine};

/// A [`hyper::rt::Timer`] whose sleeps are corewheel [`Sleep`]s on one engine.
///
/// hyper asks for a timer wherever it enforces a timeout; pass this one to the connection
/// builder's `timer`. `HyperTimer::default()` uses the process-wide
/// [`default_engine`](crate::default_engine); [`HyperTimer::new`] takes any engine that
/// lives for the rest of the program.
///
/// hyper moves a connection's timeout by calling [`Timer::reset`](hyper::rt::Timer::reset)
/// on the sleep it already has (for HTTP/2 keep-alive, after every ping). This timer resets
/// its own sleeps in place, as hyper-util's `TokioTimer` does, so a keep-alive connection
/// does not allocate a sleep per ping.
///
/// ```
/// use corewheel::HyperTimer;
/// use std::time::Duration;
///
/// let mut http1 = hyper::server::conn::http1::Builder::new();
/// http1
///     .timer(HyperTimer::default())
///     .header_read_timeout(Duration::from_secs(5));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct HyperTimer {
    // `'static` because hyper keeps its timer in an `Arc<dyn Timer>` with no lifetime, and
    // boxes every sleep as `dyn Sleep` with none either.
    engine: &'static TimerEngine,
}

impl HyperTimer {
    /// A timer on `engine`, for an engine built with its own settings (a manual clock, a
    /// tick, a worker count) rather than the default one.
    ///
    /// ```
    /// use corewheel::{HyperTimer, TimerEngine};
    /// use std::sync::OnceLock;
    /// use std::time::Duration;
    ///
    /// static ENGINE: OnceLock<TimerEngine> = OnceLock::new();
    /// let engine = ENGINE.get_or_init(|| TimerEngine::builder().workers(1).build().unwrap());
    ///
    /// let mut http1 = hyper::server::conn::http1::Builder::new();
    /// http1
    ///     .timer(HyperTimer::new(engine))
    ///     .header_read_timeout(Duration::from_secs(5));
    /// ```
    pub fn new(engine: &'static TimerEngine) -> Self {
        Self { engine }
    }
}

impl Default for HyperTimer {
    /// A timer on the process-wide [`default_engine`](crate::default_engine), which starts
    /// on first use.
    ///
    /// ```
    /// use corewheel::HyperTimer;
    /// use hyper::rt::Timer;
    ///
    /// let timer = HyperTimer::default();
    /// let _timeout = timer.sleep(std::time::Duration::from_secs(1));
    /// ```
    fn default() -> Self {
        Self::new(crate::default_engine())
    }
}

impl hyper::rt::Timer for HyperTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.engine.sleep(duration))
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.engine.sleep_until(deadline))
    }

    // hyper computes its deadlines as `now() + timeout`; they must come from the clock the
    // engine fires by, or a manual-clock engine would see deadlines from another clock.
    fn now(&self) -> Instant {
        self.engine.now()
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        match sleep.as_mut().downcast_mut_pin::<Sleep<'static>>() {
            // In place: keeps the box and the armed timer (a later deadline moves nothing;
            // an earlier one moves the timer) rather than cancelling one and arming another. A corewheel sleep from another engine
            // stays on that engine; hyper only resets sleeps its own timer made.
            Some(ours) => ours.get_mut().reset(new_deadline),
            // hyper's default, for a sleep some other timer made: a new sleep, on this
            // engine, dropping (and so cancelling) the old one.
            None => *sleep = self.sleep_until(new_deadline),
        }
    }
}

/// hyper boxes sleeps as `dyn hyper::rt::Sleep`; implementing it for corewheel's own sleep,
/// rather than for a wrapper, is what lets [`HyperTimer`] downcast the box back and reset
/// the sleep in place.
///
/// ```
/// use hyper::rt::Sleep;
///
/// fn assert_hyper_sleep<S: Sleep>(_: &S) {}
/// assert_hyper_sleep(&corewheel::sleep(std::time::Duration::from_millis(1)));
/// ```
impl hyper::rt::Sleep for Sleep<'static> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ManualClock;
    use hyper::rt::Timer;
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    fn manual_engine() -> (ManualClock, &'static TimerEngine) {
        let clock = ManualClock::new();
        let engine = TimerEngine::builder()
            .workers(1)
            .manual_clock(clock.clone())
            .build()
            .unwrap();
        // Leaked: `HyperTimer` needs an engine that lives for the rest of the program.
        (clock, Box::leak(Box::new(engine)))
    }

    fn poll(sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>) -> Poll<()> {
        sleep.as_mut().poll(&mut Context::from_waker(Waker::noop()))
    }

    fn address(sleep: &Pin<Box<dyn hyper::rt::Sleep>>) -> *const () {
        let sleep: &dyn hyper::rt::Sleep = &**sleep;
        (sleep as *const dyn hyper::rt::Sleep).cast()
    }

    fn deadline(sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>) -> Instant {
        sleep
            .as_mut()
            .downcast_mut_pin::<Sleep<'static>>()
            .expect("a corewheel sleep")
            .deadline()
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "leaks the 'static engine HyperTimer needs (Miri reports it); no unsafe code here"
    )]
    fn reset_moves_our_sleep_in_place() {
        let (clock, engine) = manual_engine();
        let timer = HyperTimer::new(engine);
        let start = timer.now();
        let mut sleep = timer.sleep(Duration::from_secs(1));
        let boxed_at = address(&sleep);
        // Armed before the reset, so the reset has a live timer to move.
        assert!(poll(&mut sleep).is_pending());

        timer.reset(&mut sleep, start + Duration::from_secs(5));
        assert_eq!(address(&sleep), boxed_at, "reset allocated a new sleep");
        assert_eq!(deadline(&mut sleep), start + Duration::from_secs(5));

        // The old deadline passes without firing it; the new one fires it.
        clock.advance(Duration::from_secs(2));
        engine.turn();
        assert!(poll(&mut sleep).is_pending());
        clock.advance(Duration::from_secs(3));
        engine.turn();
        assert!(poll(&mut sleep).is_ready());

        // hyper's keep-alive resets a sleep that has already fired, and needs it pending
        // again until the new deadline.
        timer.reset(&mut sleep, start + Duration::from_secs(7));
        assert_eq!(address(&sleep), boxed_at);
        assert!(poll(&mut sleep).is_pending());
        clock.advance(Duration::from_secs(2));
        engine.turn();
        assert!(poll(&mut sleep).is_ready());
    }

    /// A sleep some other timer made.
    struct Foreign;

    impl Future for Foreign {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            Poll::Pending
        }
    }

    impl hyper::rt::Sleep for Foreign {}

    #[test]
    #[cfg_attr(
        miri,
        ignore = "leaks the 'static engine HyperTimer needs (Miri reports it); no unsafe code here"
    )]
    fn reset_replaces_a_foreign_sleep_with_ours() {
        let (clock, engine) = manual_engine();
        let timer = HyperTimer::new(engine);
        let mut sleep: Pin<Box<dyn hyper::rt::Sleep>> = Box::pin(Foreign);
        let deadline_at = timer.now() + Duration::from_secs(1);

        timer.reset(&mut sleep, deadline_at);
        assert!(!sleep.is::<Foreign>());
        assert_eq!(deadline(&mut sleep), deadline_at);
        assert!(poll(&mut sleep).is_pending());
        clock.advance(Duration::from_secs(1));
        engine.turn();
        assert!(poll(&mut sleep).is_ready());
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "leaks the 'static engine HyperTimer needs (Miri reports it); no unsafe code here"
    )]
    fn now_is_the_engines_clock() {
        let (clock, engine) = manual_engine();
        let timer = HyperTimer::new(engine);
        let before = timer.now();
        clock.advance(Duration::from_secs(3600));
        assert_eq!(timer.now() - before, Duration::from_secs(3600));
    }
}
