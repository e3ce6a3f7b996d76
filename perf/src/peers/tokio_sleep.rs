//! tokio's `sleep` as a subject, used the way a proxy on tokio uses it: each timer is a `Sleep` that its task pins and
//! polls (which registers it in tokio's timer wheel with the task's waker), dropped to cancel it, or pushed back with
//! `Sleep::reset`. A task may register many timers in one poll: a `Sleep` poll that returns `Pending` gives back the
//! cooperative budget unit it took (the test below checks that every one is in the wheel).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use tokio::runtime::{Builder, Runtime};

/// How long the tasks of a run may take to all be running at once before the run fails.
const GATHER_LIMIT: Duration = Duration::from_secs(10);
const CALLED_OFF: &str = "the run was called off";

/// A multi-thread runtime with `workers` worker threads and the time driver.
pub fn runtime(workers: usize) -> Result<Runtime, String> {
    let mut builder = Builder::new_multi_thread();
    let built = builder.worker_threads(workers.max(1)).enable_time().build();
    built.map_err(|error| format!("could not start a tokio runtime: {error}"))
}

/// Polls a fresh timer future once, which registers it. `true` if it was already done (due at once).
#[inline]
pub fn register<F: Future>(timer: Pin<&mut F>, cx: &mut Context<'_>) -> bool {
    timer.poll(cx).is_ready()
}

/// The start line the tasks of one run wait at: a task spins until every task has arrived (which proves they run on
/// distinct worker threads at once), and then until the main thread says go.
#[derive(Default)]
pub struct StartLine {
    arrived: AtomicUsize,
    go: AtomicBool,
    failed: AtomicBool,
}

impl StartLine {
    /// Called by each task when it is ready; returns once the main thread said go. Spins without yielding, so that
    /// the task holds its worker thread.
    pub fn arrive_and_wait(&self) -> Result<(), String> {
        self.arrived.fetch_add(1, Ordering::AcqRel);
        while !self.gone()? {
            std::hint::spin_loop();
        }
        Ok(())
    }

    /// The same for tasks that may share a worker: it yields now and then, so that a task queued behind this one on
    /// the same worker arrives too. Proves nothing about distinct threads.
    pub async fn arrive_and_wait_yielding(&self) -> Result<(), String> {
        self.arrived.fetch_add(1, Ordering::AcqRel);
        let mut spins = 0_u32;
        while !self.gone()? {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1 << 12) {
                tokio::task::yield_now().await;
            }
            std::hint::spin_loop();
        }
        Ok(())
    }

    /// Whether the main thread said go; an error once it called the run off.
    fn gone(&self) -> Result<bool, String> {
        match self.failed.load(Ordering::Acquire) {
            true => Err(CALLED_OFF.to_string()),
            false => Ok(self.go.load(Ordering::Acquire)),
        }
    }

    /// Called by the main thread: waits until `tasks` tasks have arrived; fails (and releases them) if they never all
    /// run at once.
    pub fn gather(&self, tasks: usize) -> Result<(), String> {
        let started = Instant::now();
        while self.arrived.load(Ordering::Acquire) < tasks {
            if started.elapsed() > GATHER_LIMIT {
                self.failed.store(true, Ordering::Release);
                let arrived = self.arrived.load(Ordering::Acquire);
                return Err(format!(
                    "only {arrived} of {tasks} tasks were running at once after {GATHER_LIMIT:?}"
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
    let (tasks, ran_on) = (threads.len(), distinct.len());
    match tasks == ran_on {
        true => Ok(()),
        false => Err(format!("{tasks} tasks ran on only {ran_on} worker threads")),
    }
}

/// Runs `f` once with the calling task's context, as one poll: for loops that poll many timers with their task's waker.
pub async fn with_context<R>(f: impl FnOnce(&mut Context<'_>) -> R) -> R {
    let mut f = Some(f);
    std::future::poll_fn(move |cx| Poll::Ready(f.take().expect("polled once")(cx))).await
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

    /// Thousands of sleeps registered in one poll of a plain task are each in the wheel: none is ready or woken at
    /// once (an exhausted budget would wake them), and every one wakes its waker when it comes due.
    #[test]
    fn one_task_poll_registers_every_sleep() {
        const SLEEPS: usize = 1_000;
        let (rt, counter) = (
            runtime(1).expect("a runtime"),
            Arc::new(Counter(AtomicUsize::new(0))),
        );
        let waker = Waker::from(Arc::clone(&counter));
        let at = Instant::now() + Duration::from_secs(1);
        let (ready, sleeps) = rt.block_on(async move {
            let sleep = || Box::pin(tokio::time::sleep_until(at.into()));
            let mut sleeps: Vec<_> = (0..SLEEPS).map(|_| sleep()).collect();
            let mut cx = Context::from_waker(&waker);
            let register_all = |_: &mut Context<'_>| {
                let done = sleeps.iter_mut().map(|s| register(s.as_mut(), &mut cx));
                done.filter(|&done| done).count()
            };
            (with_context(register_all).await, sleeps)
        });
        let woken = || counter.0.load(Ordering::SeqCst);
        if Instant::now() < at {
            assert_eq!((ready, woken()), (0, 0), "none done before its deadline");
        }
        let waiting = Instant::now();
        while woken() + ready < SLEEPS && waiting.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(woken() + ready, SLEEPS, "each fired once");
        drop(sleeps);
    }
}
