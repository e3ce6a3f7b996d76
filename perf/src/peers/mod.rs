//! The subjects a workload drives: corewheel's `Wheel` and real peer crates behind one small trait each, so that
//! every subject runs exactly the same harness loop; and the multi-thread subjects, driven from several threads the
//! way their users do.

pub mod async_timers;
pub mod binary_heap;
pub mod engine;
pub mod keyed;
pub mod mutex_heap;
pub mod tokio_sleep;

use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use binary_heap::TombstoneHeap;
use corewheel::{TimerKey, Wheel};
use tokio::runtime::{Builder, Runtime};
use tokio_util::time::DelayQueue;
use tokio_util::time::delay_queue::{Expired, Key};

/// The wheel's tick: the resolution DelayQueue has too, so lateness compares like with like.
pub const TICK: Duration = Duration::from_millis(1);

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
    /// A structure one thread owns, driven through [`TimerQueue`]; the others are driven from several threads.
    pub fn is_single_owner(self) -> bool {
        use Subject::*;
        matches!(self, Corewheel | DelayQueue | BinaryHeap)
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

/// What application threads do to a timer structure they share (the engine, the locked heap), one call each; `cancel`
/// is `false` if the timer had fired, `reset` returns what names the timer from then on (`None`: it had fired).
pub trait SharedTimers: Sync {
    type Handle: Copy + Send;
    fn arm(&self, delay: Duration, id: u64) -> Result<Self::Handle, String>;
    fn cancel(&self, handle: Self::Handle) -> bool;
    fn reset(&self, handle: Self::Handle, delay: Duration) -> Option<Self::Handle>;
    fn is_pending(&self, handle: Self::Handle) -> bool;
}

/// What the single-owner workloads do to a structure: its own operations, one call each; `cancel` returns `None` for
/// a key naming no pending timer, `reset` the key now naming the timer (a tombstone heap mints a new one).
pub trait TimerQueue<T> {
    type Key: Copy;
    fn arm(&mut self, deadline: Instant, value: T) -> Self::Key;
    fn cancel(&mut self, key: Self::Key) -> Option<T>;
    fn reset(&mut self, key: Self::Key, deadline: Instant) -> Self::Key;

    /// Puts the structure in the state a live event loop keeps it in, by polling it once. Fails if that poll fired a
    /// timer: the machine stalled for milliseconds and the run's bookkeeping no longer holds.
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

/// A queue its owner drives by polling with the current time, as an event loop does (DelayQueue's runtime drives it).
pub trait PolledQueue<T> {
    fn next_deadline(&mut self) -> Option<Instant>;
    fn pop_expired(&mut self, now: Instant) -> Option<T>;
}

/// A measurement that runs the same code on any single-owner structure (a trait: it is generic over the structure).
pub trait Measure<T> {
    type Output;
    fn measure<Q: TimerQueue<T>>(self, queue: &mut Q) -> Result<Self::Output, String>;
}

/// Runs `measurement` on a fresh, empty structure of `subject`'s kind, inside a runtime for DelayQueue.
pub fn measure_fresh<T, M: Measure<T>>(
    subject: Subject,
    measurement: M,
) -> Result<M::Output, String> {
    match subject {
        Subject::Corewheel => measurement.measure(&mut Wheel::<T>::new(TICK, Instant::now())),
        Subject::DelayQueue => {
            runtime()?.block_on(async move { measurement.measure(&mut DelayQueue::new()) })
        }
        Subject::BinaryHeap => measurement.measure(&mut TombstoneHeap::<T>::default()),
        _ => Err(format!("{subject} is not a single-owner structure")),
    }
}

impl<T> TimerQueue<T> for Wheel<T> {
    type Key = TimerKey;

    #[inline]
    fn arm(&mut self, deadline: Instant, value: T) -> TimerKey {
        self.insert(deadline, value)
    }

    #[inline]
    fn cancel(&mut self, key: TimerKey) -> Option<T> {
        Wheel::cancel(self, key)
    }

    #[inline]
    fn reset(&mut self, key: TimerKey, deadline: Instant) -> TimerKey {
        let moved = Wheel::reset(self, key, deadline);
        debug_assert!(moved, "the harness reset a stale key");
        key
    }

    fn release_spare_memory(&mut self) -> bool {
        self.shrink_to_fit();
        true
    }

    fn accounted_bytes(&self) -> Option<usize> {
        Some(self.allocated_bytes())
    }
}

impl<T> PolledQueue<T> for Wheel<T> {
    fn next_deadline(&mut self) -> Option<Instant> {
        Wheel::next_deadline(self)
    }

    fn pop_expired(&mut self, now: Instant) -> Option<T> {
        self.poll_expired(now)
    }
}

/// The current_thread runtime with the time driver that DelayQueue runs in, as its users run it.
pub fn runtime() -> Result<Runtime, String> {
    let runtime = Builder::new_current_thread().enable_time().build();
    runtime.map_err(|error| format!("could not start a tokio runtime: {error}"))
}

impl<T> TimerQueue<T> for DelayQueue<T> {
    type Key = Key;

    #[inline]
    fn arm(&mut self, deadline: Instant, value: T) -> Key {
        self.insert_at(value, deadline.into())
    }

    #[inline]
    fn cancel(&mut self, key: Key) -> Option<T> {
        self.try_remove(&key).map(Expired::into_inner)
    }

    #[inline]
    fn reset(&mut self, key: Key, deadline: Instant) -> Key {
        self.reset_at(&key, deadline.into());
        key
    }

    /// A queue that its task has polled holds a registered Sleep and the task's waker, and its later inserts and
    /// resets go through that Sleep: measuring a never-polled queue would skip that cost.
    fn settle(&mut self) -> Result<(), String> {
        let stalled = "a timer fired while the queue was being set up: the machine stalled for milliseconds; run again";
        match self.poll_expired(&mut Context::from_waker(Waker::noop())) {
            Poll::Pending | Poll::Ready(None) => Ok(()),
            Poll::Ready(Some(_)) => Err(stalled.to_string()),
        }
    }

    fn release_spare_memory(&mut self) -> bool {
        self.shrink_to_fit();
        true
    }
}
