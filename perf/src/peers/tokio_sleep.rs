//! tokio's `sleep` as a subject, used the way a proxy on tokio uses it: inside a multi-thread runtime whose worker
//! threads run the application, each timer is a `Sleep` that its task pins and polls (which registers it in tokio's
//! timer wheel, with the task's waker), and that is dropped to cancel it, or pushed back with `Sleep::reset`.
//!
//! Each application task registers many timers within one poll of the task. tokio's cooperative budget does not get
//! in the way: a `Sleep` poll that returns `Pending` gives back the budget unit it took, so only timers that are
//! already due spend it. The tests below check that every Sleep polled this way really is in the wheel.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use tokio::runtime::{Builder, Runtime};

/// How long the tasks of a run may take to all be running at once before the run fails.
const GATHER_LIMIT: Duration = Duration::from_secs(10);

/// Spins between yields in [`StartLine::arrive_and_wait_yielding`]: a few microseconds.
const YIELD_EVERY: u32 = 1 << 12;

/// A multi-thread runtime with `workers` worker threads and the time driver.
pub fn runtime(workers: usize) -> Result<Runtime, String> {
    Builder::new_multi_thread()
        .worker_threads(workers.max(1))
        .enable_time()
        .build()
        .map_err(|error| format!("could not start a tokio runtime: {error}"))
}

/// Polls a fresh `Sleep` (or a `timeout()` around a pending read) once, which registers its timer. `true` if it was
/// already done: due at once, so not waiting in any timer.
#[inline]
pub fn register<F: Future>(timer: Pin<&mut F>, cx: &mut Context<'_>) -> bool {
    timer.poll(cx).is_ready()
}

/// The start line the tasks of one run wait at: a task spins (without yielding, so that it holds its worker thread)
/// until every task has arrived, which proves they run on distinct worker threads at once, and then until the main
/// thread says go.
#[derive(Default)]
pub struct StartLine {
    arrived: AtomicUsize,
    go: AtomicBool,
    failed: AtomicBool,
}

impl StartLine {
    /// Called by each task when it is ready; returns once the main thread said go, or `false` if the run was called
    /// off.
    pub fn arrive_and_wait(&self) -> bool {
        self.arrived.fetch_add(1, Ordering::AcqRel);
        while !self.go.load(Ordering::Acquire) {
            if self.failed.load(Ordering::Acquire) {
                return false;
            }
            std::hint::spin_loop();
        }
        true
    }

    /// [`arrive_and_wait`](Self::arrive_and_wait) for tasks that may share a worker: it yields to the runtime now and
    /// then while it waits, so that a task queued behind this one on the same worker runs and arrives too. Proves
    /// nothing about distinct threads.
    pub async fn arrive_and_wait_yielding(&self) -> bool {
        self.arrived.fetch_add(1, Ordering::AcqRel);
        let mut spins = 0_u32;
        while !self.go.load(Ordering::Acquire) {
            if self.failed.load(Ordering::Acquire) {
                return false;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(YIELD_EVERY) {
                tokio::task::yield_now().await;
            }
            std::hint::spin_loop();
        }
        true
    }

    /// Called by the main thread: waits until `tasks` tasks have arrived. Fails (and releases the tasks) if they
    /// never all run at once.
    pub fn gather(&self, tasks: usize) -> Result<(), String> {
        let started = Instant::now();
        while self.arrived.load(Ordering::Acquire) < tasks {
            if started.elapsed() > GATHER_LIMIT {
                self.failed.store(true, Ordering::Release);
                return Err(format!(
                    "only {} of {tasks} tasks were running at once after {GATHER_LIMIT:?}",
                    self.arrived.load(Ordering::Acquire)
                ));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }

    /// Called by the main thread once every task arrived: lets them go, and returns when.
    pub fn go(&self) -> Instant {
        let start = Instant::now();
        self.go.store(true, Ordering::Release);
        start
    }
}

/// Checks that the tasks of a run ran on distinct threads.
pub fn check_spread(threads: &[ThreadId]) -> Result<(), String> {
    let mut distinct = threads.to_vec();
    distinct.sort_by_key(|id| format!("{id:?}"));
    distinct.dedup();
    if distinct.len() != threads.len() {
        return Err(format!(
            "{} tasks ran on only {} worker threads",
            threads.len(),
            distinct.len()
        ));
    }
    Ok(())
}

/// Runs `f` once, with the calling task's context, as one poll: for loops that poll many sleeps with their task's
/// waker.
pub async fn with_context<R>(f: impl FnOnce(&mut Context<'_>) -> R) -> R {
    let mut f = Some(f);
    std::future::poll_fn(move |cx| {
        let f = f.take().expect("polled once");
        Poll::Ready(f(cx))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::{register, runtime, with_context};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Wake, Waker};
    use std::time::{Duration, Instant};

    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Thousands of sleeps registered in one poll of a plain task are each in the wheel: a second out, none is ready
    /// or woken at once (an exhausted budget would wake them), and every one wakes its waker when it comes due.
    #[test]
    fn one_task_poll_registers_every_sleep() {
        const SLEEPS: usize = 1_000;
        let rt = runtime(1).expect("a runtime");
        let counter = Arc::new(Counter(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&counter));
        let at = Instant::now() + Duration::from_secs(1);
        let (ready, sleeps) = rt.block_on(async move {
            let mut sleeps: Vec<_> = (0..SLEEPS)
                .map(|_| Box::pin(tokio::time::sleep_until(at.into())))
                .collect();
            let mut cx = Context::from_waker(&waker);
            let ready = with_context(|_| {
                sleeps
                    .iter_mut()
                    .map(|s| usize::from(register(s.as_mut(), &mut cx)))
                    .sum::<usize>()
            })
            .await;
            (ready, sleeps)
        });
        if Instant::now() < at {
            assert_eq!(
                (ready, counter.0.load(Ordering::SeqCst)),
                (0, 0),
                "none done before its deadline"
            );
        }
        let waiting = Instant::now();
        while counter.0.load(Ordering::SeqCst) + ready < SLEEPS
            && waiting.elapsed() < Duration::from_secs(60)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            counter.0.load(Ordering::SeqCst) + ready,
            SLEEPS,
            "each fired once"
        );
        drop(sleeps);
    }
}
