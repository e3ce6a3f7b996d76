//! The subjects a workload drives: corewheel's `Wheel` and real peer crates, behind one small trait so that every
//! subject runs exactly the same harness loop; and the multi-thread subjects, corewheel's `TimerEngine` and tokio's
//! `sleep`, which the engine workloads drive from several threads the way their users do.

pub mod async_timers;
pub mod binary_heap;
pub mod delay_queue;
pub mod engine;
pub mod keyed;
pub mod mutex_heap;
pub mod tokio_sleep;
pub mod wheel;

use std::time::{Duration, Instant};

use binary_heap::TombstoneHeap;

crate::named::named_enum! {
    /// One timer structure under test.
    pub enum Subject {
        Corewheel = "corewheel": "corewheel::Wheel, 1 ms tick, owned by one thread (an event loop)",
        DelayQueue = "delay-queue": "tokio-util 0.7 DelayQueue, owned by one task on a current_thread runtime",
        BinaryHeap = "binary-heap": "std BinaryHeap, a tombstone per cancel, rebuilt once they outnumber live",
        Engine = "engine": "corewheel::TimerEngine, a pinned worker per CPU, 1 ms tick, from threads",
        EngineDriven = "engine-driven": "the same engine built driven(): its shards turned by tokio tasks",
        TokioSleep = "tokio-sleep": "tokio 1 time::sleep, one task per thread, polled once, dropped to cancel",
        TokioTimeout = "tokio-timeout": "tokio 1 time::timeout around a pending read, polled once and dropped",
        PingoraTimeout = "pingora-timeout": "pingora-timeout 0.9 timeout and sleep (10 ms ticks), no reset",
        MutexHeap = "mutex-heap": "one BinaryHeap behind a Mutex shared by all threads, a timer thread",
        CorewheelAsync = "corewheel-async": "corewheel::sleep, timeout, Sleep::reset on the default engine",
        Tokio = "tokio": "tokio 1 time::sleep, timeout, Sleep::reset, one task per worker",
        AsyncIo = "async-io": "async-io 2 Timer (smol's): after, set_at, read.or(timer)",
        Keyed = "keyed": "corewheel::KeyedTimers<u64, u64> (set, move_to, remove) on an engine",
        MutexMap = "mutex-map": "a Mutex<HashMap<key, (value, TimerHandle)>> over the engine",
        DelayQueueMap = "delay-queue-map": "DelayQueue<(key, value)> and a key map behind one Mutex",
        Dashmap = "dashmap": "dashmap 6 alone: KeyedTimers' map operations, no timer",
        Scc = "scc": "scc 3 HashMap alone: KeyedTimers' map operations, no timer",
    }
}

impl Subject {
    /// A structure one thread owns, driven through [`TimerQueue`] by the single-thread workloads; the others are
    /// driven from several threads.
    pub fn is_single_owner(self) -> bool {
        matches!(
            self,
            Subject::Corewheel | Subject::DelayQueue | Subject::BinaryHeap
        )
    }

    /// corewheel's own subjects, whose rows get the "vs peer" ratio columns.
    pub fn is_corewheel(self) -> bool {
        use Subject::*;
        matches!(
            self,
            Corewheel | Engine | EngineDriven | CorewheelAsync | Keyed
        )
    }

    /// The CSV metric of corewheel's ratio against this subject; `None` for corewheel's own.
    pub fn ratio_metric(self) -> Option<String> {
        (!self.is_corewheel()).then(|| format!("vs_{}", self.name().replace('-', "_")))
    }
}

/// What plain application threads do to a timer structure they all share: the engine, or the locked heap. One call
/// each of the structure's own operations.
pub trait SharedTimers: Sync {
    /// What the structure hands back to name a timer.
    type Handle: Copy + Send;

    /// Arms timer `id` to fire `delay` from now.
    fn arm(&self, delay: Duration, id: u64) -> Result<Self::Handle, String>;

    /// `true` if the timer was pending and is now stopped; `false` if it had fired.
    fn cancel(&self, handle: Self::Handle) -> bool;

    /// Moves a pending timer to `delay` from now, and returns what names it from then on; `None` if it had fired.
    fn reset(&self, handle: Self::Handle, delay: Duration) -> Option<Self::Handle>;

    /// Whether the timer is still waiting to fire.
    fn is_pending(&self, handle: Self::Handle) -> bool;
}

/// What the single-owner workloads do to a timer structure.
///
/// The methods are the structure's own operations, one call each, so the harness measures the structure and not an
/// adapter.
pub trait TimerQueue<T> {
    /// What the structure hands back to name a timer.
    type Key: Copy;

    fn arm(&mut self, deadline: Instant, value: T) -> Self::Key;

    /// Stops the timer, returning its value, or `None` if the key names no pending timer.
    fn cancel(&mut self, key: Self::Key) -> Option<T>;

    /// Moves the timer's deadline and returns the key that now names it (a tombstone heap has to mint a new one).
    fn reset(&mut self, key: Self::Key, deadline: Instant) -> Self::Key;

    /// Puts the structure in the state a live event loop keeps it in, by polling it once. Fails if that poll fired a
    /// timer, which would mean the machine stalled for milliseconds and the run's bookkeeping no longer holds.
    fn settle(&mut self) -> Result<(), String> {
        Ok(())
    }

    /// Returns spare memory to the allocator where the structure has a way to; `false` if it has none.
    fn release_spare_memory(&mut self) -> bool {
        false
    }

    /// The heap bytes the structure says it holds, where it can say.
    fn accounted_bytes(&self) -> Option<usize> {
        None
    }
}

/// A queue that its owner drives by polling with the current time, the way an event loop drives its timers;
/// DelayQueue is driven by its runtime instead.
pub trait PolledQueue<T> {
    /// When the next timer is due, or `None` when none is pending.
    fn next_deadline(&mut self) -> Option<Instant>;

    /// The next timer due at `now`, or `None` once nothing is.
    fn pop_expired(&mut self, now: Instant) -> Option<T>;
}

/// A measurement that runs the same code on any single-owner structure: a trait rather than a closure because the
/// measurement is generic over the structure.
pub trait Measure<T> {
    /// What the measurement finds.
    type Output;

    /// Measures `queue`.
    fn measure<Q: TimerQueue<T>>(self, queue: &mut Q) -> Result<Self::Output, String>;
}

/// Runs `measurement` on a fresh, empty structure of `subject`'s kind, inside a runtime for DelayQueue.
pub fn measure_fresh<T, M: Measure<T>>(
    subject: Subject,
    measurement: M,
) -> Result<M::Output, String> {
    match subject {
        Subject::Corewheel => measurement.measure(&mut wheel::new_wheel::<T>()),
        Subject::DelayQueue => delay_queue::with_queue(|queue| measurement.measure(queue))?,
        Subject::BinaryHeap => measurement.measure(&mut TombstoneHeap::<T>::new()),
        _ => Err(format!(
            "{} is not a single-owner structure",
            subject.name()
        )),
    }
}
