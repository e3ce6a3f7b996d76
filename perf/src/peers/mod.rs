//! The subjects a workload drives: corewheel's `Wheel` and real peer crates, behind one small
//! trait so that every subject runs exactly the same harness loop; and the multi-thread
//! subjects, corewheel's `TimerEngine` and tokio's `sleep`, which the engine workloads drive
//! from several threads the way their users do.

pub mod async_timers;
pub mod binary_heap;
pub mod delay_queue;
pub mod engine;
pub mod keyed;
pub mod mutex_heap;
pub mod timeouts;
pub mod tokio_sleep;
pub mod wheel;

use std::time::{Duration, Instant};

use binary_heap::TombstoneHeap;

/// One timer structure under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// corewheel's single-owner `Wheel`.
    Corewheel,
    DelayQueue,
    BinaryHeap,
    /// corewheel's multi-core `TimerEngine`.
    Engine,
    /// The same engine built `driven()`: no worker threads, its shards turned by driver
    /// tasks on the application's tokio runtime (light-load).
    EngineDriven,
    TokioSleep,
    TokioTimeout,
    PingoraTimeout,
    /// One `BinaryHeap` behind a `Mutex`, shared by every thread, with a timer thread.
    MutexHeap,
    /// corewheel's async layer: `corewheel::sleep`, `timeout`, `Sleep::reset`.
    CorewheelAsync,
    /// tokio's `sleep` and `timeout` on its default timer (the async-* workloads).
    Tokio,
    /// async-io's `Timer`: smol's timer.
    AsyncIo,
    /// corewheel's `KeyedTimers` (the keyed-* workloads).
    Keyed,
    /// A `Mutex<HashMap>` of engine timer handles, as users write a timer per key.
    MutexMap,
    /// tokio-util's `DelayQueue` with a key map, behind one lock.
    DelayQueueMap,
    /// dashmap alone, doing `KeyedTimers`' map operations without timers.
    Dashmap,
    /// scc's `HashMap` alone, the same.
    Scc,
}

impl Subject {
    pub const ALL: [Subject; 17] = [
        Subject::Corewheel,
        Subject::DelayQueue,
        Subject::BinaryHeap,
        Subject::Engine,
        Subject::EngineDriven,
        Subject::TokioSleep,
        Subject::TokioTimeout,
        Subject::PingoraTimeout,
        Subject::MutexHeap,
        Subject::CorewheelAsync,
        Subject::Tokio,
        Subject::AsyncIo,
        Subject::Keyed,
        Subject::MutexMap,
        Subject::DelayQueueMap,
        Subject::Dashmap,
        Subject::Scc,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Subject::Corewheel => "corewheel",
            Subject::DelayQueue => "delay-queue",
            Subject::BinaryHeap => "binary-heap",
            Subject::Engine => "engine",
            Subject::EngineDriven => "engine-driven",
            Subject::TokioSleep => "tokio-sleep",
            Subject::TokioTimeout => "tokio-timeout",
            Subject::PingoraTimeout => "pingora-timeout",
            Subject::MutexHeap => "mutex-heap",
            Subject::CorewheelAsync => "corewheel-async",
            Subject::Tokio => "tokio",
            Subject::AsyncIo => "async-io",
            Subject::Keyed => "keyed",
            Subject::MutexMap => "mutex-map",
            Subject::DelayQueueMap => "delay-queue-map",
            Subject::Dashmap => "dashmap",
            Subject::Scc => "scc",
        }
    }

    /// A structure one thread owns, driven through [`TimerQueue`] by the single-thread
    /// workloads; the others are driven from several threads by the engine workloads.
    pub fn is_single_owner(self) -> bool {
        matches!(
            self,
            Subject::Corewheel | Subject::DelayQueue | Subject::BinaryHeap
        )
    }

    /// The CSV metric of corewheel's ratio against this subject; `None` for corewheel's own.
    pub fn ratio_metric(self) -> Option<&'static str> {
        match self {
            Subject::DelayQueue => Some("vs_delay_queue"),
            Subject::BinaryHeap => Some("vs_binary_heap"),
            Subject::TokioSleep => Some("vs_tokio_sleep"),
            Subject::TokioTimeout => Some("vs_tokio_timeout"),
            Subject::PingoraTimeout => Some("vs_pingora_timeout"),
            Subject::MutexHeap => Some("vs_mutex_heap"),
            Subject::Tokio => Some("vs_tokio"),
            Subject::AsyncIo => Some("vs_async_io"),
            Subject::MutexMap => Some("vs_mutex_map"),
            Subject::DelayQueueMap => Some("vs_delay_queue_map"),
            Subject::Dashmap => Some("vs_dashmap"),
            Subject::Scc => Some("vs_scc"),
            Subject::Corewheel
            | Subject::Engine
            | Subject::EngineDriven
            | Subject::CorewheelAsync
            | Subject::Keyed => None,
        }
    }

    /// corewheel's own subjects, whose rows get the "vs peer" ratio columns.
    pub fn is_corewheel(self) -> bool {
        matches!(
            self,
            Subject::Corewheel
                | Subject::Engine
                | Subject::EngineDriven
                | Subject::CorewheelAsync
                | Subject::Keyed
        )
    }

    /// How the subject is built and driven, for the header.
    pub fn describe(self) -> &'static str {
        match self {
            Subject::Corewheel => {
                "corewheel::Wheel, 1 ms tick, owned by one thread as an event loop embeds it"
            }
            Subject::DelayQueue => {
                "tokio-util 0.7 DelayQueue, owned by one task in a current_thread runtime with the time driver"
            }
            Subject::BinaryHeap => {
                "std BinaryHeap, lazy cancellation: a tombstone per cancelled timer, dropped at the top or in a rebuild once tombstones outnumber live timers"
            }
            Subject::Engine => {
                "corewheel::TimerEngine, one pinned worker per CPU, 1 ms tick; application threads call schedule(delay, closure) / cancel(handle) / reset(handle, delay)"
            }
            Subject::EngineDriven => {
                "the same engine built driven(): no worker threads, one driver task per shard on the application's tokio runtime, each sleeping on tokio's timer (sleep_until) until its shard's next deadline"
            }
            Subject::TokioSleep => {
                "tokio 1 time::sleep in a rt-multi-thread runtime, one task per application thread: each Sleep pinned and polled once with its task's waker (registered in tokio's timer wheel), dropped to cancel, Sleep::reset to push back"
            }
            Subject::TokioTimeout => {
                "tokio 1 time::timeout around a read that is pending, in the same runtime: polled once (which arms it), dropped to cancel"
            }
            Subject::PingoraTimeout => {
                "pingora-timeout 0.9 timeout (fast_timeout: 10 ms ticks, one timer shared per tick) around a pending read, in the same runtime: polled once, dropped to cancel; in the async-* workloads its sleep (fast_sleep) and timeout, re-created to reset (it has no reset)"
            }
            Subject::MutexHeap => {
                "the naive baseline: one std BinaryHeap (tombstone cancel) behind one Mutex shared by every application thread, and a timer thread waiting on a Condvar for the earliest deadline"
            }
            Subject::CorewheelAsync => {
                "corewheel's async layer (corewheel::sleep, timeout, Sleep::reset on the default engine), in a tokio rt-multi-thread runtime of T workers like tokio's, one task per worker: each future polled once with the task's waker, dropped to cancel"
            }
            Subject::Tokio => {
                "tokio 1 time::sleep, time::timeout, Sleep::reset on the default timer, in a rt-multi-thread runtime of T workers, one task per worker"
            }
            Subject::AsyncIo => {
                "async-io 2 Timer (smol's timer: after, set_at; a timeout as smol writes one, read.or(timer)), polled in the same tokio runtime as the others"
            }
            Subject::Keyed => {
                "corewheel::KeyedTimers<u64, u64> (set, move_to, remove) on a TimerEngine of one pinned worker per CPU, dashmap underneath"
            }
            Subject::MutexMap => {
                "a timer per key as users write it over the engine: one Mutex<HashMap<key, (value, TimerHandle)>>, reset or schedule under the lock"
            }
            Subject::DelayQueueMap => {
                "tokio-util 0.7 DelayQueue<(key, value)> and a HashMap<key, delay_queue::Key>, both behind one Mutex shared by the threads"
            }
            Subject::Dashmap => "dashmap 6 alone: the map operations KeyedTimers does, no timer",
            Subject::Scc => "scc 3 HashMap alone: the map operations KeyedTimers does, no timer",
        }
    }
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl clap::ValueEnum for Subject {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()).help(self.describe()))
    }
}

/// What plain application threads do to a timer structure they all share: the engine, or
/// the locked heap. One call each of the structure's own operations.
pub trait SharedTimers: Sync {
    /// What the structure hands back to name a timer.
    type Handle: Copy + Send;

    /// Arms timer `id` to fire `delay` from now.
    fn arm(&self, delay: Duration, id: u64) -> Result<Self::Handle, String>;

    /// `true` if the timer was pending and is now stopped; `false` if it had fired.
    fn cancel(&self, handle: Self::Handle) -> bool;

    /// Moves a pending timer to `delay` from now, and returns what names it from then on;
    /// `None` if it had fired.
    fn reset(&self, handle: Self::Handle, delay: Duration) -> Option<Self::Handle>;

    /// Whether the timer is still waiting to fire.
    fn is_pending(&self, handle: Self::Handle) -> bool;
}

/// What the single-owner workloads do to a timer structure.
///
/// The methods are the structure's own operations, one call each, so the harness measures
/// the structure and not an adapter.
pub trait TimerQueue<T> {
    /// What the structure hands back to name a timer.
    type Key: Copy;

    fn arm(&mut self, deadline: Instant, value: T) -> Self::Key;

    /// Stops the timer, returning its value, or `None` if the key names no pending timer.
    fn cancel(&mut self, key: Self::Key) -> Option<T>;

    /// Moves the timer's deadline and returns the key that now names it (a tombstone heap
    /// has to mint a new one).
    fn reset(&mut self, key: Self::Key, deadline: Instant) -> Self::Key;

    /// Puts the structure in the state a live event loop keeps it in, by polling it once.
    /// Fails if that poll fired a timer, which would mean the machine stalled for
    /// milliseconds and the run's bookkeeping no longer holds.
    fn settle(&mut self) -> Result<(), String> {
        Ok(())
    }

    /// Returns spare memory to the allocator where the structure has a way to; `false` if
    /// it has none.
    fn release_spare_memory(&mut self) -> bool {
        false
    }

    /// The heap bytes the structure says it holds, where it can say.
    fn accounted_bytes(&self) -> Option<usize> {
        None
    }
}

/// A measurement that runs the same code on any subject's structure.
///
/// A trait rather than a closure because the measurement is generic over the structure.
/// A queue that its owner drives by polling with the current time, the way an event loop
/// drives its timers; DelayQueue is driven by its runtime instead.
pub trait PolledQueue<T> {
    /// When the next timer is due, or `None` when none is pending.
    fn next_deadline(&mut self) -> Option<Instant>;

    /// The next timer due at `now`, or `None` once nothing is.
    fn pop_expired(&mut self, now: Instant) -> Option<T>;
}

pub trait Measure<T> {
    type Output;

    fn measure<Q: TimerQueue<T>>(self, queue: &mut Q) -> Result<Self::Output, String>;
}

/// Runs `measurement` on a fresh, empty structure of `subject`'s kind, inside a runtime for
/// DelayQueue. The multi-thread subjects have no single-owner structure to give.
pub fn measure_fresh<T, M: Measure<T>>(
    subject: Subject,
    measurement: M,
) -> Result<M::Output, String> {
    match subject {
        Subject::Corewheel => measurement.measure(&mut wheel::new_wheel::<T>()),
        Subject::DelayQueue => delay_queue::with_queue(|queue| measurement.measure(queue))?,
        Subject::BinaryHeap => measurement.measure(&mut TombstoneHeap::<T>::new()),
        Subject::Engine
        | Subject::EngineDriven
        | Subject::TokioSleep
        | Subject::TokioTimeout
        | Subject::PingoraTimeout
        | Subject::MutexHeap
        | Subject::CorewheelAsync
        | Subject::Tokio
        | Subject::AsyncIo
        | Subject::Keyed
        | Subject::MutexMap
        | Subject::DelayQueueMap
        | Subject::Dashmap
        | Subject::Scc => Err(format!(
            "{} is driven from several threads, not as a single-owner structure",
            subject.name()
        )),
    }
}
