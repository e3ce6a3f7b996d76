//! Wall time, behind a trait so that tests drive it by hand.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The source of wall-clock time that due times are compared against.
///
/// Production code uses [`SystemClock`]; tests use [`ManualWallClock`] so that the window
/// loader, retries and backoff run deterministically.
pub trait WallClock: Send + Sync + 'static {
    /// The current wall-clock time.
    fn now(&self) -> SystemTime;
}

/// The operating system's wall clock (`SystemTime::now`).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A wall clock that moves only when told to, forwards or backwards.
#[derive(Debug)]
pub struct ManualWallClock {
    now: Mutex<SystemTime>,
}

impl ManualWallClock {
    /// A clock that reads `start` until moved.
    pub fn new(start: SystemTime) -> Self {
        Self {
            now: Mutex::new(start),
        }
    }

    /// Moves the clock forwards by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        *now += by;
    }

    /// Sets the clock to `to`, which may be earlier than it reads now (a step backwards).
    pub fn set(&self, to: SystemTime) {
        *self.now.lock().unwrap_or_else(|p| p.into_inner()) = to;
    }
}

impl WallClock for ManualWallClock {
    fn now(&self) -> SystemTime {
        *self.now.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Milliseconds since the Unix epoch, rounded down: a task is due once this reaches its
/// due time. Times before the epoch read as 0.
pub(crate) fn floor_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Milliseconds since the Unix epoch, rounded up, so that a due time is never reached
/// before the instant it names.
pub(crate) fn ceil_ms(t: SystemTime) -> u64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => {
            let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
            if d.subsec_nanos() % 1_000_000 != 0 {
                ms.saturating_add(1)
            } else {
                ms
            }
        }
        Err(_) => 0,
    }
}

/// The wall-clock time `ms` milliseconds after the Unix epoch.
pub(crate) fn to_system(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}
