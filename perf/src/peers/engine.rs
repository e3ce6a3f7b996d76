//! corewheel's `TimerEngine` as a subject: built the way a service builds it (one worker per CPU, pinned, 1 ms tick)
//! and driven from application threads. The engine does part of each timer's work on its workers (filing timers that
//! leave a thread's lane, unlinking the ones cancelled after that), so a measurement ends only when it has settled:
//! every timer cancelled or fired by its `stats()`, and every pool node free again.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use corewheel::{Stats, TimerEngine, TimerHandle};

use super::SharedTimers;
use crate::sys::{named_threads_cpu_time, process_cpu_time};

/// How long a run waits for the engine to settle before calling it a failure.
const SETTLE_LIMIT: Duration = Duration::from_secs(10);

/// Callbacks the engine ran: a timeout handler's first step is to note the timeout.
static CALLBACKS_RUN: AtomicU64 = AtomicU64::new(0);

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
        let scheduled = self.schedule(delay, on_timeout(id));
        scheduled.map_err(|error| format!("schedule failed: {error}"))
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

/// An engine as a service makes one: a pinned worker per CPU; `driven`: no workers, the caller runs its drivers.
pub fn build(driven: bool) -> Result<TimerEngine, String> {
    let builder = TimerEngine::builder().workers(cpus());
    let built = if driven { builder.driven() } else { builder }.build();
    built.map_err(|error| format!("could not start the engine: {error}"))
}

/// What a run's wait for the engine to settle found: how long it waited, the stats, and the process's and the
/// workers' CPU time, read before the walk of the pool that confirmed every node free (the harness's check, not the
/// engine's work).
pub struct Settled {
    pub waited: Duration,
    pub stats: Stats,
    pub process_cpu: Option<Duration>,
    pub workers_cpu: Option<Duration>,
}

/// Waits until every timer the engine was given has been cancelled or has fired, and every node is back in its pool.
/// A walk of the pool reads lines the workers may be writing, so after a slow walk (over 100 µs) the next waits for
/// the workers to go quiet (or 50 ms), and for four times the last walk's length: the check must cost less than the
/// cancels it waits for.
pub fn settle(engine: &TimerEngine) -> Result<Settled, String> {
    let (long_walk, still_walk) = (Duration::from_micros(100), Duration::from_millis(50));
    let watch = Duration::from_millis(1);
    let started = Instant::now();
    let (mut pause, mut last_walk, mut walk_after) =
        (Duration::from_micros(20), Duration::ZERO, started);
    let (mut mark, mut quiet) = ((started, workers_cpu_time()), false);
    loop {
        let (stats, now) = (engine.stats(), Instant::now());
        if now - mark.0 >= watch {
            let workers = workers_cpu_time();
            quiet = match (mark.1, workers) {
                (Some(before), Some(after)) => (after.saturating_sub(before)) * 4 < now - mark.0,
                _ => true,
            };
            mark = (now, workers);
        }
        // A while since the last walk also counts: workers that never go quiet must not keep a settled engine
        // looking unsettled.
        let walk_now = last_walk <= long_walk || quiet || now >= walk_after + still_walk;
        if stats.total.pending == 0 && now >= walk_after && walk_now {
            let (waited, process_cpu, workers_cpu) =
                (started.elapsed(), process_cpu_time(), workers_cpu_time());
            let walk = Instant::now();
            if engine.nodes_in_use() == 0 {
                let stats = engine.stats();
                return Ok(Settled {
                    waited,
                    stats,
                    process_cpu,
                    workers_cpu,
                });
            }
            (last_walk, quiet) = (walk.elapsed(), false);
            walk_after = Instant::now() + last_walk * 4;
        }
        if started.elapsed() > SETTLE_LIMIT {
            let (pending, in_use) = (stats.total.pending, engine.nodes_in_use());
            return Err(format!(
                "the engine did not settle within {SETTLE_LIMIT:?}: {pending} timers pending, {in_use} nodes in use, stats {:?}",
                stats.total
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

/// Checks the engine's counts at the end of a run against what the application threads were told.
pub fn check_counts(
    stats: &Stats,
    scheduled: u64,
    cancelled: u64,
    not_cancelled: u64,
) -> Result<(), String> {
    let t = &stats.total;
    if (t.scheduled, t.cancelled, t.fired, t.panicked) == (scheduled, cancelled, not_cancelled, 0) {
        return Ok(());
    }
    Err(format!(
        "the engine's counts disagree with the run: scheduled {} (the threads scheduled {scheduled}), cancelled {} (cancel returned true {cancelled} times), fired {} (cancel returned false {not_cancelled} times), panicked {}",
        t.scheduled, t.cancelled, t.fired, t.panicked
    ))
}

/// CPU time the engine's worker threads (`corewheel-0`, `corewheel-1`, ...) have used so far.
pub fn workers_cpu_time() -> Option<Duration> {
    named_threads_cpu_time("corewheel-")
}

/// Waits, polling the engine's stats every `every`, until `timers` have fired; an error if that takes over `give_up`.
pub fn wait_until_fired(
    engine: &TimerEngine,
    timers: u64,
    every: Duration,
    give_up: Duration,
) -> Result<(), String> {
    let limit = Instant::now() + give_up;
    while engine.stats().total.fired < timers {
        if Instant::now() > limit {
            let fired = engine.stats().total.fired;
            return Err(format!(
                "only {fired} of {timers} timers fired within {give_up:?}"
            ));
        }
        std::thread::sleep(every);
    }
    Ok(())
}
