//! The typed errors of the wheel and the engine.

use std::fmt;

/// A wheel geometry that corewheel cannot build, returned by
/// [`WheelBuilder::build`](crate::WheelBuilder::build).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GeometryError {
    /// The tick was zero: a wheel needs time to move in steps of some size.
    ZeroTick,
    /// Slots per level must be a power of two from 2 to 64, so that one `u64` bitmap
    /// covers a level.
    SlotsPerLevel(usize),
    /// Levels must be at least 1, and levels times log2(slots per level) at most 64, so that
    /// every level's span fits in a `u64` count of ticks.
    Levels(usize),
}

impl fmt::Display for GeometryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroTick => write!(f, "the wheel's tick must be longer than zero"),
            Self::SlotsPerLevel(n) => {
                write!(
                    f,
                    "slots per level must be a power of two in 2..=64, not {n}"
                )
            }
            Self::Levels(n) => write!(
                f,
                "levels must be at least 1 and span at most 2^64 ticks in all, not {n}"
            ),
        }
    }
}

impl std::error::Error for GeometryError {}

/// The wheel already holds the most timers its 32-bit slab index can name (about four
/// billion, which is more memory than any machine this runs on has to give them).
///
/// Returned by [`Wheel::try_insert`](crate::Wheel::try_insert), with the value that could not
/// be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityError<T>(pub T);

impl<T> fmt::Display for CapacityError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the wheel's slab index space is exhausted")
    }
}

impl<T: fmt::Debug> std::error::Error for CapacityError<T> {}

/// Why [`EngineBuilder::build`](crate::EngineBuilder::build) failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// Zero workers were asked for; an engine needs at least one.
    NoWorkers,
    /// More workers were asked for than an engine may have
    /// ([`MAX_WORKERS`](crate::MAX_WORKERS), 1024).
    TooManyWorkers(usize),
    /// The tick was zero.
    ZeroTick,
    /// The operating system refused to start a worker thread.
    Spawn(std::io::Error),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoWorkers => write!(f, "an engine needs at least one worker"),
            Self::TooManyWorkers(n) => write!(
                f,
                "{n} workers is more than an engine may have (MAX_WORKERS)"
            ),
            Self::ZeroTick => write!(f, "the tick must be longer than zero"),
            Self::Spawn(error) => write!(f, "could not start a worker thread: {error}"),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Spawn(error) => Some(error),
            _ => None,
        }
    }
}

/// Why a timer could not be scheduled. The callback is dropped unrun.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The engine has been shut down.
    Shutdown,
    /// The shard's pool is full: as many timers are in flight on that shard as
    /// [`EngineBuilder::capacity`](crate::EngineBuilder::capacity) allows.
    Capacity,
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Shutdown => write!(f, "the timer engine has been shut down"),
            Self::Capacity => write!(f, "the shard's timer pool is full"),
        }
    }
}

impl std::error::Error for ScheduleError {}

/// A [`Timeout`](crate::Timeout)'s deadline passed before its future finished.
///
/// ```
/// use corewheel::{Elapsed, ManualClock, TimerEngine};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let engine = TimerEngine::builder().manual_clock(clock.clone()).build().unwrap();
/// let mut late = Box::pin(engine.timeout(Duration::from_millis(5), std::future::pending::<()>()));
/// let waker = std::task::Waker::noop();
/// let mut cx = std::task::Context::from_waker(waker);
/// assert!(late.as_mut().poll(&mut cx).is_pending());
/// clock.advance(Duration::from_millis(5));
/// engine.turn();
/// assert_eq!(late.as_mut().poll(&mut cx), std::task::Poll::Ready(Err(Elapsed)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Elapsed;

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the deadline has elapsed")
    }
}

impl std::error::Error for Elapsed {}

#[cfg(feature = "keyed")]
/// Why [`KeyedTimers::set`](crate::KeyedTimers::set) armed no timer, with the value it was
/// given, which is not lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedError<V> {
    /// The value `set` was given.
    pub value: V,
    /// Why it was refused.
    pub reason: Refused,
}

#[cfg(feature = "keyed")]
impl<V> KeyedError<V> {
    pub(crate) fn new(value: V, reason: Refused) -> Self {
        Self { value, reason }
    }
}

#[cfg(feature = "keyed")]
impl<V> fmt::Display for KeyedError<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the keyed timer was refused: {}", self.reason)
    }
}

#[cfg(feature = "keyed")]
impl<V: fmt::Debug> std::error::Error for KeyedError<V> {}

#[cfg(feature = "keyed")]
/// Why a [`KeyedTimers`](crate::KeyedTimers) refused a `set`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refused {
    /// [`stop`](crate::KeyedTimers::stop) was called, or the `KeyedTimers` is being dropped.
    Stopped,
    /// The engine refused the timer: it has shut down, or its pool is full.
    Engine(ScheduleError),
}

#[cfg(feature = "keyed")]
impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stopped => write!(f, "the keyed timers were stopped"),
            Self::Engine(error) => error.fmt(f),
        }
    }
}
