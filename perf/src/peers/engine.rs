//! corewheel's `TimerEngine` as a subject: built the way a service builds it (one worker per CPU, pinned, 1 ms tick)
//! and driven from application threads with `schedule`, `cancel` and `reset`.
//!
//! The engine does part of each timer's work on its workers: filing timers that leave a thread's lane, unlinking and
//! freeing the ones cancelled after that. So a measurement ends only when the engine has settled: every scheduled
//! timer cancelled or fired by the counts in `stats()`, and every pool node free again.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use corewheel::{Stats, TimerEngine, TimerHandle};

use super::SharedTimers;
use crate::sys as cpu_time;

/// The prefix of the engine's worker thread names (`corewheel-0`, `corewheel-1`, ...).
pub const WORKER_PREFIX: &str = "corewheel-";

/// How long a run waits for the engine to settle before calling it a failure.
pub const SETTLE_LIMIT: Duration = Duration::from_secs(10);

/// Callbacks the engine ran, across every engine workload. The timers are request and idle timeouts, so their
/// callbacks do what a timeout handler's first step does: note it.
pub static CALLBACKS_RUN: AtomicU64 = AtomicU64::new(0);

/// The timeout handler of request `id`: two words of captures, stored in the timer's node without an allocation.
#[inline]
pub fn on_timeout(id: u64) -> impl FnOnce() + Send + 'static {
    move || {
        black_box(id);
        CALLBACKS_RUN.fetch_add(1, Ordering::Relaxed);
    }
}

impl SharedTimers for TimerEngine {
    type Handle = TimerHandle;

    #[inline]
    fn arm(&self, delay: Duration, id: u64) -> Result<TimerHandle, String> {
        self.schedule(delay, on_timeout(id))
            .map_err(|error| format!("schedule failed: {error}"))
    }

    #[inline]
    fn cancel(&self, handle: TimerHandle) -> bool {
        TimerEngine::cancel(self, handle)
    }

    #[inline]
    fn reset(&self, handle: TimerHandle, delay: Duration) -> Option<TimerHandle> {
        TimerEngine::reset(self, handle, delay).then_some(handle)
    }

    fn is_pending(&self, handle: TimerHandle) -> bool {
        TimerEngine::is_pending(self, handle)
    }
}

/// CPUs this process may use: the engine's default worker count.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |cpus| cpus.get())
}

/// An engine as a service makes one: one worker per CPU, pinned.
pub fn build() -> Result<TimerEngine, String> {
    TimerEngine::builder()
        .workers(cpus())
        .build()
        .map_err(|error| format!("could not start the engine: {error}"))
}

/// The engine as a service on tokio builds it to ride the runtime's wake-ups: one shard per CPU, no worker threads
/// (see [`Subject::EngineDriven`](super::Subject::EngineDriven)); the caller spawns its drivers.
pub fn build_driven() -> Result<TimerEngine, String> {
    TimerEngine::builder()
        .workers(cpus())
        .driven()
        .build()
        .map_err(|error| format!("could not start the engine: {error}"))
}

/// What a run's wait for the engine to settle found.
pub struct Settled {
    /// From the call to the moment the engine was seen settled.
    pub waited: Duration,
    pub stats: Stats,
    /// The process's CPU time, and the workers', read once the workers were quiet and before the walk of the pool
    /// that confirmed every node free: that walk is the harness's check, not the engine's work.
    pub process_cpu: Option<Duration>,
    pub workers_cpu: Option<Duration>,
}

/// Waits until every timer the engine was given has been cancelled or has fired, and every node is back in its pool:
/// the engine has nothing left to do for this run.
///
/// Counting free nodes walks the whole pool (a million nodes in engine-live-1m), and every node read takes a line the
/// workers may still be writing. So once a walk has found nodes in use and took long (over 100 µs), the next waits
/// until the workers have used less than a quarter of a core over at least 1 ms (or 50 ms more have passed), and
/// never comes sooner than four times the last walk's length after it. The CPU readings it returns leave out the
/// final walk only: earlier ones that found nodes in use are counted. Otherwise the check would cost more CPU than
/// the cancels it waits for, and slow the workers it watches.
pub fn settle(engine: &TimerEngine) -> Result<Settled, String> {
    const LONG_WALK: Duration = Duration::from_micros(100);
    const WATCH: Duration = Duration::from_millis(1);
    const STILL_WALK: Duration = Duration::from_millis(50);
    let started = Instant::now();
    let (mut pause, mut last_walk, mut walk_after) =
        (Duration::from_micros(20), Duration::ZERO, started);
    let (mut mark, mut quiet) = ((started, workers_cpu_time()), false);
    loop {
        let stats = engine.stats();
        let now = Instant::now();
        if now - mark.0 >= WATCH {
            let workers = workers_cpu_time();
            quiet = match (mark.1, workers) {
                (Some(before), Some(after)) => (after.saturating_sub(before)) * 4 < now - mark.0,
                _ => true,
            };
            mark = (now, workers);
        }
        // Quiet, or a while since the last walk: workers that never go quiet (a callback spinning) must not make a
        // settled engine look unsettled.
        let waited_enough = now >= walk_after + STILL_WALK;
        if stats.total.pending == 0
            && now >= walk_after
            && (last_walk <= LONG_WALK || quiet || waited_enough)
        {
            let (waited, process_cpu, workers_cpu) = (
                started.elapsed(),
                cpu_time::process_cpu_time(),
                workers_cpu_time(),
            );
            let walk = Instant::now();
            if engine.nodes_in_use() == 0 {
                return Ok(Settled {
                    waited,
                    stats: engine.stats(),
                    process_cpu,
                    workers_cpu,
                });
            }
            (last_walk, quiet) = (walk.elapsed(), false);
            walk_after = Instant::now() + last_walk * 4;
        }
        if started.elapsed() > SETTLE_LIMIT {
            return Err(format!(
                "the engine did not settle within {SETTLE_LIMIT:?}: {} timers pending, {} nodes in use, stats {:?}",
                stats.total.pending,
                engine.nodes_in_use(),
                stats.total
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

/// Checks the engine's counts at the end of a run: everything scheduled was cancelled or fired, and as many as the
/// application threads were told.
pub fn check_counts(
    stats: &Stats,
    scheduled: u64,
    cancelled: u64,
    not_cancelled: u64,
) -> Result<(), String> {
    let total = &stats.total;
    if total.scheduled != scheduled
        || total.cancelled != cancelled
        || total.fired != not_cancelled
        || total.panicked != 0
    {
        return Err(format!(
            "the engine's counts disagree with the run: scheduled {} (the threads scheduled {scheduled}), cancelled {} (cancel returned true {cancelled} times), fired {} (cancel returned false {not_cancelled} times), panicked {}",
            total.scheduled, total.cancelled, total.fired, total.panicked
        ));
    }
    Ok(())
}

/// CPU time the engine's worker threads have used so far.
pub fn workers_cpu_time() -> Option<Duration> {
    cpu_time::named_threads_cpu_time(WORKER_PREFIX)
}

/// Waits, polling the engine's stats every `every`, until `timers` have fired; an error naming how many had if that
/// takes longer than `give_up`.
pub fn wait_until_fired(
    engine: &TimerEngine,
    timers: u64,
    every: Duration,
    give_up: Duration,
) -> Result<(), String> {
    let limit = Instant::now() + give_up;
    while engine.stats().total.fired < timers {
        if Instant::now() > limit {
            return Err(format!(
                "only {} of {timers} timers fired within {give_up:?}",
                engine.stats().total.fired
            ));
        }
        std::thread::sleep(every);
    }
    Ok(())
}
