use corewheel::{ManualClock, PendingTimers, TimerEngine};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[test]
fn smoke_threaded() {
    let engine = TimerEngine::builder()
        .workers(2)
        .pin_workers(false)
        .build()
        .unwrap();
    let fired = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut handles = Vec::new();
    for i in 0..10_000u64 {
        let f = Arc::clone(&fired);
        let deadline = start + Duration::from_millis(1 + i % 50);
        handles.push(
            engine
                .schedule_at(deadline, move || {
                    assert!(Instant::now() >= deadline);
                    f.fetch_add(1, Ordering::Relaxed);
                })
                .unwrap(),
        );
    }
    let mut cancelled = 0;
    for h in handles.iter().step_by(3) {
        if engine.cancel(*h) {
            cancelled += 1;
        }
    }
    // Every deadline is within 50 ms; the limit only turns a lost timer into a failure, and
    // is far beyond anything a loaded machine needs.
    let waiting = Instant::now();
    while fired.load(Ordering::Relaxed) + cancelled < 10_000
        && waiting.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = engine.stats();
    assert_eq!(stats.total.panicked, 0, "a timer fired early: {stats:?}");
    assert_eq!(
        fired.load(Ordering::Relaxed) + cancelled,
        10_000,
        "{stats:?}"
    );
    let report = engine.shutdown(PendingTimers::Drop);
    assert_eq!(report.dropped, 0);
    assert_eq!(engine.nodes_in_use(), 0);
}

#[test]
fn smoke_manual() {
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(2)
        .manual_clock(clock.clone())
        .build()
        .unwrap();
    let fired = Arc::new(AtomicUsize::new(0));
    for i in 0..1000u64 {
        let f = Arc::clone(&fired);
        engine
            .schedule(Duration::from_millis(i % 100), move || {
                f.fetch_add(1, Ordering::Relaxed);
            })
            .unwrap();
    }
    for _ in 0..100 {
        clock.advance(Duration::from_millis(1));
        engine.turn();
    }
    assert_eq!(fired.load(Ordering::Relaxed), 1000, "{:?}", engine.stats());
}
