//! The multi-core `TimerEngine`'s hot paths, with tokio's timer beside it in the same run:
//! schedule, cancel, reset to a later deadline, and schedule + cancel from 1 and 2 threads.
//! Ends with a table of ratios read back from criterion's own estimates. Then, for the
//! engine alone, the owner's drain of a burst of due timers (`engine_due_drain`).
//!
//! The engine is a real one, with worker threads (unpinned here), driven from plain threads
//! with `schedule(delay, closure)`, `cancel(handle)` and `reset(handle, delay)`. tokio runs
//! a multi-thread runtime with the same number of workers; its timers are `Sleep` futures
//! polled once with their task's waker (which registers them in tokio's timer wheel),
//! dropped to cancel them and moved with `Sleep::reset`; a task polls many of them in one
//! poll of its own, which tokio's cooperative budget allows, since a poll that returns
//! `Pending` gives its budget unit back.
//!
//! Criterion times the calling threads only. The engine's workers do part of each timer's
//! work on their own time (filing what the lanes forward, unlinking cancelled timers), on the
//! other core; `cargo run --release -p corewheel-perf` counts that work too.

use std::future::{Future, poll_fn};
use std::hint::black_box;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use corewheel::{ManualClock, TimerEngine, TimerHandle};
use criterion::{BenchmarkId, Criterion};
use mimalloc::MiMalloc;
use tokio::runtime::Runtime;
use tokio::time::Sleep;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

/// Worker threads of the engine and of the tokio runtime.
const WORKERS: usize = 2;
/// Timers per untimed clean-up.
const BATCH: u64 = 1_000;
/// Timers per batch of the cancel benchmarks, and how long each batch waits (untimed) for
/// the engine's workers to file them, so that the cancels find them in the wheel, as a
/// request's timeout is when its response arrives.
const CANCEL_BATCH: u64 = 10_000;
const FILING_WAIT: Duration = Duration::from_millis(2);
const THIRTY_S_US: u64 = 30_000_000;
/// Live timers of the reset benchmarks: idle timeouts due in 30..60 s, reset to 60 s.
const RESET_SIZES: [(usize, &str); 2] = [(1_000, "1k"), (1_000_000, "1M")];
const IDLE_BASE: Duration = Duration::from_secs(30);
const RESET_TO: Duration = Duration::from_secs(60);

/// Timers of the due-drain benchmark (`cargo test` runs the first only), and the ticks
/// their deadlines spread over.
const DRAIN_SIZES: [(u64, &str); 2] = [(10_000, "10k"), (1_000_000, "1M")];
const DRAIN_TICKS: u64 = 10;

/// The next number of a xorshift generator in `x`: the benches' delays, cheap and
/// reproducible.
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Delays drawn ahead of time, uniform in 1 ms..30 s like request timeouts, so the timed
/// loops measure the timers rather than random number generation.
#[derive(Clone)]
struct Delays {
    ring: Arc<[Duration]>,
    next: usize,
}

impl Delays {
    const LEN: usize = 4096;

    fn new() -> Self {
        let mut x = 0x2545_F491_4F6C_DD1D_u64;
        let ring = (0..Self::LEN)
            .map(|_| Duration::from_micros(1_000 + xorshift(&mut x) % THIRTY_S_US))
            .collect();
        Self { ring, next: 0 }
    }

    #[inline]
    fn next(&mut self) -> Duration {
        self.next = (self.next + 1) % Self::LEN;
        self.ring[self.next]
    }
}

/// A timeout handler: one word of captures, stored in the node without an allocation.
fn handler(id: u64) -> impl FnOnce() + Send + 'static {
    move || {
        black_box(id);
    }
}

fn engine() -> TimerEngine {
    TimerEngine::builder()
        .workers(WORKERS)
        .pin_workers(false)
        .build()
        .expect("the engine starts")
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_time()
        .build()
        .expect("the runtime starts")
}

/// Runs `f` on a fresh thread: the engine keeps a per-thread context (its lanes) for each
/// thread that uses it, released when the thread exits.
fn on_thread<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|scope| scope.spawn(f).join().expect("the bench thread ran"))
}

/// Runs `f` once as one poll of a task of `rt`, with the task's context.
fn in_task<R: Send + 'static>(
    rt: &Runtime,
    f: impl FnOnce(&mut Context<'_>) -> R + Send + 'static,
) -> R {
    let mut f = Some(f);
    let task = rt.spawn(poll_fn(move |cx| {
        Poll::Ready(f.take().expect("polled once")(cx))
    }));
    rt.block_on(task).expect("the bench task ran")
}

/// Polls a fresh Sleep once, which registers it in tokio's timer wheel.
#[inline]
fn register(sleep: Pin<&mut Sleep>, cx: &mut Context<'_>) {
    let ready = sleep.poll(cx).is_ready();
    debug_assert!(!ready, "a 1 ms..30 s sleep was due at once");
    black_box(ready);
}

/// Runs `iters` operations in batches of at most `batch`, adding up only what each call of
/// `f` says it timed.
fn batched(iters: u64, batch: u64, mut f: impl FnMut(u64) -> Duration) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(batch);
        total += f(n);
        left -= n;
    }
    total
}

fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut group = c.benchmark_group(name);
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500))
        .sample_size(20);
    group
}

/// `engine.schedule` / a Sleep created and registered; the timers are cancelled untimed.
fn schedule(c: &mut Criterion) {
    let mut group = group(c, "engine_schedule");
    let engine = engine();
    group.bench_function(BenchmarkId::new("corewheel", "1t"), |b| {
        b.iter_custom(|iters| {
            on_thread(|| {
                let mut delays = Delays::new();
                let mut handles: Vec<TimerHandle> = Vec::with_capacity(BATCH as usize);
                batched(iters, BATCH, |n| {
                    let start = Instant::now();
                    for i in 0..n {
                        let handle = engine.schedule(delays.next(), handler(i));
                        handles.push(handle.expect("scheduled"));
                    }
                    let timed = start.elapsed();
                    for handle in handles.drain(..) {
                        engine.cancel(handle);
                    }
                    timed
                })
            })
        })
    });
    drop(engine);
    let rt = runtime();
    group.bench_function(BenchmarkId::new("tokio", "1t"), |b| {
        b.iter_custom(|iters| {
            in_task(&rt, move |cx| {
                let mut delays = Delays::new();
                let mut slots: Vec<Pin<Box<Option<Sleep>>>> =
                    (0..BATCH).map(|_| Box::pin(None)).collect();
                batched(iters, BATCH, |n| {
                    let start = Instant::now();
                    for slot in &mut slots[..n as usize] {
                        slot.as_mut().set(Some(tokio::time::sleep(delays.next())));
                        if let Some(sleep) = slot.as_mut().as_pin_mut() {
                            register(sleep, cx);
                        }
                    }
                    let timed = start.elapsed();
                    for slot in &mut slots[..n as usize] {
                        slot.as_mut().set(None);
                    }
                    timed
                })
            })
        })
    });
    group.finish();
}

/// `engine.cancel` of a timer its worker has filed / dropping a registered Sleep.
fn cancel(c: &mut Criterion) {
    let mut group = group(c, "engine_cancel");
    let engine = engine();
    group.bench_function(BenchmarkId::new("corewheel", "1t"), |b| {
        b.iter_custom(|iters| {
            on_thread(|| {
                let mut delays = Delays::new();
                let mut handles: Vec<TimerHandle> = Vec::with_capacity(CANCEL_BATCH as usize);
                batched(iters, CANCEL_BATCH, |n| {
                    for i in 0..n {
                        let handle = engine.schedule(delays.next(), handler(i));
                        handles.push(handle.expect("scheduled"));
                    }
                    std::thread::sleep(FILING_WAIT);
                    let start = Instant::now();
                    for handle in handles.drain(..) {
                        black_box(engine.cancel(handle));
                    }
                    start.elapsed()
                })
            })
        })
    });
    drop(engine);
    let rt = runtime();
    group.bench_function(BenchmarkId::new("tokio", "1t"), |b| {
        b.iter_custom(|iters| {
            in_task(&rt, move |cx| {
                let mut delays = Delays::new();
                let mut slots: Vec<Pin<Box<Option<Sleep>>>> =
                    (0..CANCEL_BATCH).map(|_| Box::pin(None)).collect();
                batched(iters, CANCEL_BATCH, |n| {
                    for slot in &mut slots[..n as usize] {
                        slot.as_mut().set(Some(tokio::time::sleep(delays.next())));
                        if let Some(sleep) = slot.as_mut().as_pin_mut() {
                            register(sleep, cx);
                        }
                    }
                    let start = Instant::now();
                    for slot in &mut slots[..n as usize] {
                        slot.as_mut().set(None);
                    }
                    start.elapsed()
                })
            })
        })
    });
    group.finish();
}

/// A random live idle timer pushed back to now + 60 s: `engine.reset(handle, 60 s)` /
/// `Sleep::reset(Instant::now() + 60 s)`.
fn reset_later(c: &mut Criterion, sizes: &[(usize, &str)]) {
    let mut group = group(c, "engine_reset_later");
    for &(live, label) in sizes {
        let engine = engine();
        let armed = Instant::now();
        // Armed from a thread that then exits, so its lanes are handed to the workers.
        let handles: Vec<TimerHandle> = on_thread(|| {
            let mut delays = Delays::new();
            (0..live as u64)
                .map(|i| {
                    let delay = IDLE_BASE + delays.next();
                    engine.schedule(delay, handler(i)).expect("scheduled")
                })
                .collect()
        });
        group.bench_function(BenchmarkId::new("corewheel", label), |b| {
            b.iter_custom(|iters| {
                on_thread(|| {
                    let mut pick = Delays::new();
                    let start = Instant::now();
                    for _ in 0..iters {
                        let v = pick.next().as_micros() as usize % handles.len();
                        black_box(engine.reset(handles[v], RESET_TO));
                    }
                    start.elapsed()
                })
            })
        });
        // Nothing is due before IDLE_BASE after `armed`; past that (a very slow machine) a
        // timer the resets missed may have fired, and the check would prove nothing.
        let checked = Instant::now();
        let pending = handles.iter().filter(|&&h| engine.is_pending(h)).count();
        assert!(
            pending == handles.len() || checked >= armed + IDLE_BASE,
            "a reset lost a timer: {pending} of {} pending",
            handles.len()
        );
        drop(engine);

        let rt = runtime();
        let sleeps = in_task(&rt, move |cx| {
            let mut delays = Delays::new();
            let mut sleeps: Vec<Pin<Box<Sleep>>> = (0..live)
                .map(|_| Box::pin(tokio::time::sleep(IDLE_BASE + delays.next())))
                .collect();
            for sleep in &mut sleeps {
                register(sleep.as_mut(), cx);
            }
            sleeps
        });
        let sleeps = Arc::new(Mutex::new(Some(sleeps)));
        group.bench_function(BenchmarkId::new("tokio", label), |b| {
            b.iter_custom(|iters| {
                let mut live = sleeps.lock().expect("unpoisoned").take().expect("sleeps");
                let (elapsed, live) = in_task(&rt, move |_| {
                    let mut pick = Delays::new();
                    let start = Instant::now();
                    for _ in 0..iters {
                        let v = pick.next().as_micros() as usize % live.len();
                        live[v]
                            .as_mut()
                            .reset(tokio::time::Instant::now() + RESET_TO);
                    }
                    (start.elapsed(), live)
                });
                *sleeps.lock().expect("unpoisoned") = Some(live);
                elapsed
            })
        });
        let live = sleeps.lock().expect("unpoisoned").take().expect("sleeps");
        // Only a sleep whose deadline has passed may have fired (on a very slow machine).
        let now = tokio::time::Instant::now();
        assert!(
            live.iter()
                .all(|sleep| !sleep.is_elapsed() || sleep.deadline() <= now),
            "a reset sleep fired before its deadline"
        );
        drop(live);
        drop(rt);
    }
    group.finish();
}

/// Arm a timer and cancel it at once, from 1 thread and from 2 threads at the same time.
/// With 2 threads, each does half of the iterations and the time is the wall time of both
/// together, so the figure is ns per timer for the process.
fn schedule_cancel(c: &mut Criterion) {
    let mut group = group(c, "engine_schedule_cancel");
    for threads in [1, 2] {
        let label = format!("{threads}t");
        let engine = engine();
        group.bench_function(BenchmarkId::new("corewheel", &label), |b| {
            b.iter_custom(|iters| {
                let barrier = Barrier::new(threads);
                let engine = &engine;
                let ends: Vec<(Instant, Instant)> = std::thread::scope(|scope| {
                    let handles: Vec<_> = (0..threads)
                        .map(|t| {
                            let barrier = &barrier;
                            scope.spawn(move || {
                                let mut delays = Delays::new();
                                delays.next = t * 1000;
                                let n = share(iters, threads, t);
                                barrier.wait();
                                let start = Instant::now();
                                for i in 0..n {
                                    let handle = engine.schedule(delays.next(), handler(i));
                                    black_box(engine.cancel(handle.expect("scheduled")));
                                }
                                (start, Instant::now())
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("the bench thread ran"))
                        .collect()
                });
                span(&ends)
            })
        });
        drop(engine);

        let rt = runtime();
        group.bench_function(BenchmarkId::new("tokio", &label), |b| {
            b.iter_custom(|iters| {
                let arrived = Arc::new(AtomicUsize::new(0));
                let tasks: Vec<_> = (0..threads)
                    .map(|t| {
                        let arrived = Arc::clone(&arrived);
                        rt.spawn(async move {
                            let n = share(iters, threads, t);
                            let mut delays = Delays::new();
                            delays.next = t * 1000;
                            // Spin without yielding until every task is running, each on
                            // its own worker thread.
                            arrived.fetch_add(1, Ordering::AcqRel);
                            while arrived.load(Ordering::Acquire) < threads {
                                std::hint::spin_loop();
                            }
                            poll_fn(|cx| {
                                let start = Instant::now();
                                for _ in 0..n {
                                    let sleep = pin!(tokio::time::sleep(delays.next()));
                                    register(sleep, cx);
                                }
                                Poll::Ready((start, Instant::now()))
                            })
                            .await
                        })
                    })
                    .collect();
                let ends: Vec<(Instant, Instant)> = rt.block_on(async {
                    let mut ends = Vec::new();
                    for task in tasks {
                        ends.push(task.await.expect("the bench task ran"));
                    }
                    ends
                });
                span(&ends)
            })
        });
        drop(rt);
    }
    group.finish();
}

/// A request timeout answered in time: a sleep made, polled once with the task's waker (which
/// arms or registers it) and dropped (which cancels it), inside a tokio task for both, so
/// both clone the same kind of waker. corewheel's `Sleep` on the engine, tokio's on its
/// runtime's timer.
fn sleep_poll_drop(c: &mut Criterion) {
    let mut group = group(c, "async_sleep_poll_drop");
    let engine: &'static TimerEngine = Box::leak(Box::new(engine()));
    let rt = runtime();
    group.bench_function(BenchmarkId::new("corewheel", "1t"), |b| {
        b.iter_custom(|iters| {
            in_task(&rt, move |cx| {
                let mut delays = Delays::new();
                let start = Instant::now();
                for _ in 0..iters {
                    let mut sleep = engine.sleep(delays.next());
                    black_box(Pin::new(&mut sleep).poll(cx).is_ready());
                }
                start.elapsed()
            })
        })
    });
    group.bench_function(BenchmarkId::new("tokio", "1t"), |b| {
        b.iter_custom(|iters| {
            in_task(&rt, move |cx| {
                let mut delays = Delays::new();
                let start = Instant::now();
                for _ in 0..iters {
                    let sleep = pin!(tokio::time::sleep(delays.next()));
                    register(sleep, cx);
                }
                start.elapsed()
            })
        })
    });
    group.finish();
}

/// The owner's claim in a burst: a hand-driven engine (one shard, manual clock) holding
/// `timers` filed timers due over [`DRAIN_TICKS`] ticks is turned a tick at a time until
/// every timer has run, as a worker meets a burst tick after tick. Timed: the turns (the
/// claims off the wheel and the runs of a do-nothing callback), not the scheduling and
/// filing before them. Criterion reports the time of a whole drain, and timers per second.
fn due_drain(c: &mut Criterion, sizes: &[(u64, &str)]) {
    let mut group = c.benchmark_group("engine_due_drain");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(10);
    for &(timers, label) in sizes {
        group.throughput(criterion::Throughput::Elements(timers));
        group.bench_function(BenchmarkId::new("corewheel", label), |b| {
            b.iter_custom(|iters| (0..iters).map(|seed| drain_once(timers, seed)).sum())
        });
    }
    group.finish();
}

/// One drain of [`due_drain`], its timers' delays drawn from `seed`.
fn drain_once(timers: u64, seed: u64) -> Duration {
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(1)
        .manual_clock(clock.clone())
        .build()
        .expect("the engine starts");
    let mut x = 0x9E37_79B9_7F4A_7C15 ^ seed;
    for _ in 0..timers {
        let delay = Duration::from_micros(1_000 + xorshift(&mut x) % (DRAIN_TICKS * 1_000));
        engine
            .schedule(delay, || {})
            .expect("the engine takes the timer");
    }
    // Files them all: none is due yet.
    assert_eq!(engine.turn(), 0);
    let start = Instant::now();
    let mut fired = 0;
    for _ in 0..=DRAIN_TICKS {
        clock.advance(Duration::from_millis(1));
        fired += engine.turn();
    }
    // Every deadline has come; a turn runs what its run queue had room for.
    while fired < timers as usize {
        let ran = engine.turn();
        assert!(ran > 0, "a turn ran nothing with {fired} of {timers} fired");
        fired += ran;
    }
    start.elapsed()
}

/// Thread `t`'s share of `iters` split over `threads`.
fn share(iters: u64, threads: usize, t: usize) -> u64 {
    let threads = threads as u64;
    iters / threads + u64::from((t as u64) < iters % threads)
}

/// From the earliest start to the latest end.
fn span(ends: &[(Instant, Instant)]) -> Duration {
    let start = ends.iter().map(|(start, _)| *start).min();
    let end = ends.iter().map(|(_, end)| *end).max();
    match (start, end) {
        (Some(start), Some(end)) => end - start,
        _ => Duration::ZERO,
    }
}

/// Criterion's typical estimate for one benchmark, in nanoseconds, if this run produced one:
/// the slope of its linear fit where it made one (the figure criterion prints), else the
/// mean.
fn typical_ns(group: &str, subject: &str, label: &str) -> Option<f64> {
    let path = format!("target/criterion/{group}/{subject}/{label}/new/estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["slope"]["point_estimate"]
        .as_f64()
        .or_else(|| json["mean"]["point_estimate"].as_f64())
}

fn print_ratios() {
    println!(
        "\n{:<24} {:>9} {:>12} {:>12} {:>9}",
        "operation", "threads", "corewheel", "tokio", "ratio"
    );
    let rows = [
        ("engine_schedule", "schedule", "1t"),
        ("engine_cancel", "cancel (filed timer)", "1t"),
        ("engine_reset_later", "reset later, 1k live", "1k"),
        ("engine_reset_later", "reset later, 1M live", "1M"),
        ("engine_schedule_cancel", "schedule + cancel", "1t"),
        ("engine_schedule_cancel", "schedule + cancel", "2t"),
        ("async_sleep_poll_drop", "Sleep: poll once, drop", "1t"),
    ];
    for (group, operation, label) in rows {
        if let (Some(w), Some(t)) = (
            typical_ns(group, "corewheel", label),
            typical_ns(group, "tokio", label),
        ) {
            let threads = if label == "2t" { "2" } else { "1" };
            println!(
                "{operation:<24} {threads:>9} {w:>9.1} ns {t:>9.1} ns {:>8.2}x",
                t / w
            );
        }
    }
    println!(
        "(ratio = tokio / corewheel: above 1, corewheel is faster; criterion's estimate of ns per operation on the calling threads, both threads together for 2; allocator: mimalloc)"
    );
    println!(
        "(criterion times the calling threads only: the engine's workers file and unlink timers on the other core, which `cargo run --release -p corewheel-perf` counts)"
    );
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let mut c = Criterion::default().configure_from_args();
    schedule(&mut c);
    cancel(&mut c);
    // `cargo test` runs each bench once without `--bench`: a million live timers is only
    // set-up time there.
    reset_later(
        &mut c,
        if full {
            &RESET_SIZES
        } else {
            &RESET_SIZES[..1]
        },
    );
    schedule_cancel(&mut c);
    sleep_poll_drop(&mut c);
    due_drain(
        &mut c,
        if full {
            &DRAIN_SIZES
        } else {
            &DRAIN_SIZES[..1]
        },
    );
    c.final_summary();
    if full {
        print_ratios();
    }
}
