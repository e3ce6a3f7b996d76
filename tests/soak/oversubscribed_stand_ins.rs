//! Stand-ins on the real clock with every CPU taken: owners preempted mid-run, and other
//! workers standing in for them with clock readings of their own (the manual-clock cases
//! are in the engine binary's `stale_readings`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use corewheel::{PendingTimers, TimerEngine};

use crate::support::within;

const MS: Duration = Duration::from_millis(1);

/// On the real clock, with every CPU taken by spinning threads so that owners are
/// preempted mid-run and others stand in for them with readings of their own: 2 workers,
/// rescue on, 40,000 timers a second due within 0-10 ms, one in 2000 of them blocking its
/// worker for 20 ms, for 30 s (`COREWHEEL_SOAK_SECS` sets another length). Every shard
/// keeps firing (no 10 s window passes in which one fires nothing), every timer fires
/// exactly once and never early, and shutdown returns.
#[test]
fn oversubscribed_workers_standing_in_for_each_other_keep_every_shard_firing() {
    use std::sync::atomic::{AtomicBool, AtomicU8};
    use std::time::Instant;

    const PRODUCERS: usize = 2;
    const PER_MS: usize = 20;
    const BLOCK_EVERY: usize = 2000;
    const WINDOW: Duration = Duration::from_secs(10);
    let seconds: u64 = std::env::var("COREWHEEL_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let per_producer = seconds as usize * 1000 * PER_MS;
    let engine = Arc::new(TimerEngine::builder().workers(2).build().unwrap());
    let fires: Arc<Vec<AtomicU8>> = Arc::new(
        (0..PRODUCERS * per_producer)
            .map(|_| AtomicU8::new(0))
            .collect(),
    );
    let early = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let hogs: Vec<_> = (0..4)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (engine, fires, early) =
                (Arc::clone(&engine), Arc::clone(&fires), Arc::clone(&early));
            std::thread::spawn(move || {
                let start = Instant::now();
                for k in 0..per_producer {
                    if k % PER_MS == 0 {
                        // 1 ms per batch, so 20 per ms per producer.
                        let at = start + MS * (k / PER_MS) as u32;
                        std::thread::sleep(at.saturating_duration_since(Instant::now()));
                    }
                    let index = p * per_producer + k;
                    let delay = Duration::from_micros((index as u64 * 7919) % 10_000);
                    let not_before = Instant::now() + delay;
                    let (fires, early) = (Arc::clone(&fires), Arc::clone(&early));
                    engine
                        .schedule(delay, move || {
                            if Instant::now() < not_before {
                                early.fetch_add(1, Ordering::Relaxed);
                            }
                            if index % BLOCK_EVERY == 0 {
                                // Longer than `rescue_after`: the owner is stuck, and the
                                // other worker stands in for it.
                                std::thread::sleep(MS * 20);
                            }
                            fires[index].fetch_add(1, Ordering::Relaxed);
                        })
                        .unwrap();
                }
            })
        })
        .collect();
    // Watch every shard's fired count, a window at a time, while the producers run.
    let mut last = [0; 2];
    let mut windows = 0;
    while producers.iter().any(|p| !p.is_finished()) {
        std::thread::sleep(WINDOW);
        let stats = engine.stats();
        for (shard, seen) in stats.shards.iter().zip(last.iter_mut()) {
            if !producers.iter().any(|p| !p.is_finished()) {
                break;
            }
            assert!(
                shard.fired > *seen || shard.pending == 0,
                "a shard fired nothing for {WINDOW:?} with {} timers pending: {stats:?}",
                shard.pending
            );
            *seen = shard.fired;
        }
        windows += 1;
    }
    for producer in producers {
        producer.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for hog in hogs {
        hog.join().unwrap();
    }
    // Everything is due within 10 ms of the last schedule, but a loaded machine may leave a
    // backlog of a million timers that takes minutes to drain: a lost timer shows as
    // pending timers while nothing fires, not as a drain that is merely slow.
    const STALL: Duration = Duration::from_secs(60);
    let (mut fired, mut progressed) = (engine.stats().total.fired, Instant::now());
    loop {
        let stats = engine.stats();
        if stats.total.pending == 0 {
            break;
        }
        if stats.total.fired != fired {
            (fired, progressed) = (stats.total.fired, Instant::now());
        }
        assert!(
            progressed.elapsed() < STALL,
            "timers were lost: nothing fired for {STALL:?}: {stats:?}"
        );
        std::thread::sleep(MS * 10);
    }
    let report = within(Duration::from_secs(30), "shutdown", {
        let engine = Arc::clone(&engine);
        move || engine.shutdown(PendingTimers::Drop)
    });
    assert_eq!(report.dropped, 0);
    assert_eq!(early.load(Ordering::Relaxed), 0, "a timer fired early");
    let wrong = fires
        .iter()
        .filter(|f| f.load(Ordering::Relaxed) != 1)
        .count();
    assert_eq!(wrong, 0, "timers that did not fire exactly once");
    let stats = engine.stats().total;
    println!(
        "{windows} windows; {} fired, {} stolen, {} rescued, {} late",
        stats.fired, stats.stolen, stats.rescued, stats.late
    );
}
