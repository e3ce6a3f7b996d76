//! The futures on the real clock, under three executors (tokio's multi-thread runtime,
//! `futures::executor`, smol) and under hostile use: tasks moving between threads, wakers
//! changing under a firing timer, sleeps dropped as they fire, and an engine shut down
//! under waiting tasks. Each asserts only what holds on a loaded machine: never early,
//! exactly once, nothing lost (a time limit turns a hang into a failure).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use crate::support::{leaked_unpinned, unpinned, within};
use corewheel::{Elapsed, PendingTimers, TimerEngine};

const LIMIT: Duration = Duration::from_secs(120);
const TASKS: u64 = 400;

/// The delay of task `i`: 1 to 40 ms.
fn delay(i: u64) -> Duration {
    Duration::from_millis(1 + (i * 7919) % 40)
}

/// What each executor runs: `TASKS` tasks, each sleeping, timing out and ticking on
/// `engine`, each checking it was never early. Returns how many finished.
async fn workload(engine: &'static TimerEngine, i: u64) -> usize {
    let start = Instant::now();
    engine.sleep(delay(i)).await;
    assert!(start.elapsed() >= delay(i), "a sleep completed early");

    let start = Instant::now();
    let stalled = engine
        .timeout(delay(i + 1), std::future::pending::<()>())
        .await;
    assert_eq!(stalled, Err(Elapsed));
    assert!(start.elapsed() >= delay(i + 1), "a timeout elapsed early");

    let answered = engine.timeout(Duration::from_secs(60), async { i }).await;
    assert_eq!(answered, Ok(i));

    let start = Instant::now();
    let mut ticks = engine.interval(Duration::from_millis(2));
    let first = ticks.tick().await;
    let third = {
        ticks.tick().await;
        ticks.tick().await
    };
    assert_eq!(
        third - first,
        Duration::from_millis(4),
        "burst keeps the phase"
    );
    assert!(
        start.elapsed() >= Duration::from_millis(4),
        "a tick came early"
    );
    1
}

/// Runs `body` on a tokio multi-thread runtime of `workers` threads, within the limit.
fn on_tokio<T: Send + 'static>(
    what: &str,
    workers: usize,
    body: impl Future<Output = T> + Send + 'static,
) -> T {
    within(LIMIT, what, move || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .build()
            .expect("a runtime")
            .block_on(body)
    })
}

/// Waits for every task and adds up what they return.
async fn sum_of(tasks: Vec<tokio::task::JoinHandle<usize>>) -> usize {
    let mut done = 0;
    for task in tasks {
        done += task.await.expect("a task panicked");
    }
    done
}

fn engine() -> &'static TimerEngine {
    leaked_unpinned(2)
}

#[test]
fn under_tokio_multi_thread() {
    let engine = engine();
    let done = on_tokio("tokio tasks", 4, async move {
        sum_of(
            (0..TASKS)
                .map(|i| tokio::spawn(workload(engine, i)))
                .collect(),
        )
        .await
    });
    assert_eq!(done as u64, TASKS);
}

#[test]
fn under_futures_executor() {
    let engine = engine();
    let done = within(LIMIT, "futures tasks", move || {
        let threads: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    let mut pool = futures::executor::LocalPool::new();
                    let done = Arc::new(AtomicUsize::new(0));
                    for i in (t..TASKS).step_by(4) {
                        let done = Arc::clone(&done);
                        futures::task::LocalSpawnExt::spawn_local(&pool.spawner(), async move {
                            done.fetch_add(workload(engine, i).await, Ordering::SeqCst);
                        })
                        .expect("spawned");
                    }
                    pool.run();
                    done.load(Ordering::SeqCst)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a thread panicked"))
            .sum::<usize>()
    });
    assert_eq!(done as u64, TASKS);
}

#[test]
fn under_smol() {
    let engine = engine();
    let done = within(LIMIT, "smol tasks", move || {
        let executor = Arc::new(smol::Executor::new());
        let (stop, stopped) = smol::channel::unbounded::<()>();
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let executor = Arc::clone(&executor);
                let stopped = stopped.clone();
                std::thread::spawn(move || smol::block_on(executor.run(stopped.recv())))
            })
            .collect();
        let tasks: Vec<_> = (0..TASKS)
            .map(|i| executor.spawn(workload(engine, i)))
            .collect();
        let done: usize = smol::block_on(async {
            let mut done = 0;
            for task in tasks {
                done += task.await;
            }
            done
        });
        drop(stop);
        for thread in threads {
            let _ = thread.join();
        }
        done
    });
    assert_eq!(done as u64, TASKS);
}

/// A waker that counts its wakes.
#[derive(Default)]
struct Watched {
    wakes: AtomicUsize,
}

impl Wake for Watched {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }
}

/// Threads make sleeps due in 0 to 2 ms, poll them, and drop them at once or after a
/// spin, so that many drops land while the workers are waking them: a sleep dropped before
/// its deadline is never woken, none is woken twice, and every node and waker clone goes
/// back. (A wake already under way when the drop comes may land after it: a drop does not
/// wait for the executor's code.)
#[test]
fn sleeps_dropped_as_they_fire_are_woken_at_most_once_and_never_if_dropped_early() {
    let engine = unpinned(2);
    let shared = Arc::clone(&engine);
    within(LIMIT, "dropping threads", move || {
        let threads: Vec<_> = (0..4_u64)
            .map(|t| {
                let engine = Arc::clone(&shared);
                std::thread::spawn(move || {
                    let mut released = Vec::new();
                    for i in 0..5_000_u64 {
                        let watched = Arc::new(Watched::default());
                        let waker = Waker::from(Arc::clone(&watched));
                        let mut sleep = engine.sleep(Duration::from_micros((i * 37 + t) % 2_000));
                        let _ = Pin::new(&mut sleep).poll(&mut Context::from_waker(&waker));
                        let spin = Instant::now() + Duration::from_micros(i % 1_500);
                        while Instant::now() < spin {
                            std::hint::spin_loop();
                        }
                        // A drop that ended before the deadline began before it too: the
                        // timer could not have been claimed, so the drop cancelled it.
                        let deadline = sleep.deadline();
                        drop(sleep);
                        let early = Instant::now() < deadline;
                        drop(waker);
                        released.push((early, watched));
                    }
                    // A cancelled timer's node, and the waker clone in it, go back to the
                    // pool within a few ticks.
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while released.iter().any(|(_, w)| Arc::strong_count(w) > 1) {
                        assert!(
                            Instant::now() < deadline,
                            "a waker clone was never released"
                        );
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    for (early, watched) in &released {
                        let wakes = watched.wakes.load(Ordering::SeqCst);
                        assert!(wakes <= 1, "woken {wakes} times");
                        assert!(
                            !early || wakes == 0,
                            "dropped before its deadline, yet woken"
                        );
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("a dropping thread failed");
        }
    });
    engine.shutdown(PendingTimers::Drop);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// One `Sleep`, behind a lock, polled by four threads with their own wakers as it fires:
/// the wake goes to whichever waker was registered last, and polling never completes it
/// before its deadline.
#[test]
fn a_sleep_polled_from_many_threads_with_changing_wakers_is_never_early_or_lost() {
    let engine: &'static TimerEngine = engine();
    within(LIMIT, "polling threads", move || {
        for round in 0..200_u64 {
            let deadline = Instant::now() + Duration::from_micros(round * 10 % 1_000);
            let sleep = Arc::new(Mutex::new(engine.sleep_until(deadline)));
            let watchers: Vec<Arc<Watched>> =
                (0..4).map(|_| Arc::new(Watched::default())).collect();
            let last = Arc::new(AtomicUsize::new(usize::MAX));
            let threads: Vec<_> = (0..4)
                .map(|t| {
                    let sleep = Arc::clone(&sleep);
                    let watched = Arc::clone(&watchers[t]);
                    let last = Arc::clone(&last);
                    std::thread::spawn(move || {
                        let waker = Waker::from(watched);
                        let mut cx = Context::from_waker(&waker);
                        loop {
                            let mut sleep = sleep.lock().expect("unpoisoned");
                            let polled = Pin::new(&mut *sleep).poll(&mut cx);
                            if polled.is_ready() {
                                assert!(Instant::now() >= deadline, "completed early");
                                return;
                            }
                            last.store(t, Ordering::SeqCst);
                        }
                    })
                })
                .collect();
            for thread in threads {
                thread.join().expect("a polling thread failed");
            }
            let woken: usize = watchers
                .iter()
                .map(|w| w.wakes.load(Ordering::SeqCst))
                .sum();
            assert!(woken <= 1, "one timer woke {woken} wakers");
        }
    });
}

/// Shutting an engine down under tasks waiting on it wakes them all, and they complete
/// (documented: a `Sleep` completes when its engine shuts down).
#[test]
fn shutdown_under_waiting_tasks_wakes_them_all() {
    let engine: &'static TimerEngine = engine();
    let done = on_tokio("tasks waiting through a shutdown", 2, async move {
        let tasks: Vec<_> = (0..200)
            .map(|_| {
                tokio::spawn(async move {
                    engine.sleep(Duration::from_secs(3600)).await;
                    1
                })
            })
            .collect();
        // Most tasks are waiting by then; any that are not find the engine shut down
        // when they first poll, and complete at once.
        engine.sleep(Duration::from_millis(50)).await;
        engine.shutdown(PendingTimers::Drop);
        sum_of(tasks).await
    });
    assert_eq!(done, 200);
}

/// A `Sleep` polled by a future that yields in between, so that each poll comes from a
/// different tokio worker thread and often with a new waker.
#[test]
fn a_sleep_moving_between_worker_threads_completes_once_on_time() {
    let engine = engine();
    let done = on_tokio("wandering tasks", 4, async move {
        let tasks: Vec<_> = (0..TASKS)
            .map(|i| {
                tokio::spawn(async move {
                    let start = Instant::now();
                    let mut sleep = engine.sleep(delay(i));
                    let mut polls = 0_u32;
                    std::future::poll_fn(|cx| {
                        polls += 1;
                        if Pin::new(&mut sleep).poll(cx).is_ready() {
                            return Poll::Ready(());
                        }
                        // Come back on whichever worker picks the task up next.
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    })
                    .await;
                    assert!(start.elapsed() >= delay(i), "completed early");
                    assert!(polls > 0);
                    1_usize
                })
            })
            .collect();
        sum_of(tasks).await
    });
    assert_eq!(done as u64, TASKS);
}

/// The futures are plain `Future`s: a hand-written executor's poll sees the same.
#[test]
fn a_timeout_is_a_plain_future() {
    fn is_future<F: Future<Output = Result<(), Elapsed>> + Send + Unpin>(_: &F) {}
    let engine = engine();
    let timeout = engine.timeout(Duration::from_millis(1), std::future::pending::<()>());
    is_future(&timeout);
    assert_eq!(futures::executor::block_on(timeout), Err(Elapsed));
}
