//! corewheel as hyper's timer (feature `hyper`).

use std::pin::Pin;
use std::time::{Duration, Instant};

use crate::engine::TimerEngine;
use crate::future::default_engine::default_engine;
use crate::future::sleep::Sleep;

/// hyper's [`Timer`](hyper::rt::Timer) on a corewheel engine: give it to a hyper builder's
/// `timer` method. `reset` moves hyper's sleep in place instead of boxing a new one.
#[derive(Debug, Clone, Copy)]
pub struct HyperTimer {
    engine: &'static TimerEngine,
}

impl HyperTimer {
    /// A timer on `engine`, which must live for the rest of the program (a `static`, or a
    /// leaked box), as hyper's sleeps may outlive any scope.
    pub fn new(engine: &'static TimerEngine) -> Self {
        Self { engine }
    }
}

impl Default for HyperTimer {
    /// A timer on the [`default_engine`](crate::default_engine).
    fn default() -> Self {
        Self::new(default_engine())
    }
}

impl hyper::rt::Sleep for Sleep<'static> {}

impl hyper::rt::Timer for HyperTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.engine.sleep(duration))
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.engine.sleep_until(deadline))
    }

    fn now(&self) -> Instant {
        self.engine.now()
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        match sleep.as_mut().downcast_mut_pin::<Sleep<'static>>() {
            Some(ours) => ours.get_mut().reset(new_deadline),
            None => *sleep = self.sleep_until(new_deadline),
        }
    }
}
