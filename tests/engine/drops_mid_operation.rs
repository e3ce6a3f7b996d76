//! The engine acting from inside its own operations: callbacks' and captures' drops that
//! run in the middle of a cancel, reset, schedule or shutdown and call back into the
//! engine. Each test checks a fault since fixed. The drop hooks only make an interleaving
//! deterministic: another thread acting at that instant does the same.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corewheel::{Clock, ManualClock, PendingTimers, ScheduleError, TimerEngine};

/// Runs a closure when dropped: lets a test act in the middle of the engine's own code,
/// at the point where it drops a cancelled timer's callback.
struct OnDrop(Option<Box<dyn FnOnce() + Send>>);
impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// a shutdown that lands while a scheduling thread holds its claimed young stack
/// (inside `EngineShared::reclaim`) never runs nor drops the timers in that stack.
/// The drop hook only makes the interleaving deterministic: another thread calling
/// `shutdown` at that instant does the same.
#[test]
fn a_shutdown_during_a_reclaim_settles_every_pending_timer() {
    let clock = ManualClock::new();
    let engine = Arc::new(
        TimerEngine::builder()
            .workers(1)
            .manual_clock(clock.clone())
            .build()
            .unwrap(),
    );
    let ran = Arc::new(AtomicUsize::new(0));
    let report = Arc::new(Mutex::new(None));

    // A: a pending timer, an hour out.
    let counter = Arc::clone(&ran);
    let a = engine
        .schedule(Duration::from_secs(3600), move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    // X: cancelled at once, so that the next reclaim recycles it and drops its callback.
    let (e, r) = (Arc::clone(&engine), Arc::clone(&report));
    let hook = OnDrop(Some(Box::new(move || {
        *r.lock().unwrap() = Some(e.shutdown(PendingTimers::Run));
    })));
    let x = engine
        .schedule(Duration::from_secs(3600), move || drop(hook))
        .unwrap();
    assert!(engine.cancel(x));
    // Fill the lane to 64 pushes; the 65th schedule reclaims.
    for _ in 0..62 {
        let counter = Arc::clone(&ran);
        engine
            .schedule(Duration::from_secs(3600), move || {
                counter.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    let last = engine.schedule(Duration::from_secs(3600), || {});
    assert!(matches!(last, Err(ScheduleError::Shutdown)));
    let report = report
        .lock()
        .unwrap()
        .expect("shutdown ran inside the reclaim");
    eprintln!(
        "report {report:?}, ran {} of 63 pending timers, is_pending(a) = {}",
        ran.load(Ordering::SeqCst),
        engine.is_pending(a)
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        63,
        "PendingTimers::Run must run every timer pending at shutdown"
    );
}

/// `now_tick() + LANE_HORIZON` overflows once the clock reaches the end of the
/// tick range (1 ns tick, ~584 years of manual time): debug builds panic in `schedule`.
#[test]
fn schedule_at_the_end_of_time_does_not_panic() {
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(1)
        .tick(Duration::from_nanos(1))
        .manual_clock(clock.clone())
        .build()
        .unwrap();
    clock.advance(Duration::MAX);
    let _ = engine.schedule(Duration::from_millis(1), || {});
    engine.turn();
}

struct PanicOnDrop;
impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("drop of a callback's captured state");
        }
    }
}

/// a callback's captured state is dropped outside `catch_unwind` when a
/// repeating timer is cancelled (or any timer is cancelled): a panic there kills the
/// worker thread, and every other timer on that shard is lost.
#[test]
fn a_panicking_capture_drop_does_not_kill_the_worker() {
    let engine = TimerEngine::builder()
        .workers(1)
        .pin_workers(false)
        .build()
        .unwrap();
    let guard = PanicOnDrop;
    let h = engine
        .schedule_repeating(Duration::from_millis(1), move || {
            let _ = &guard;
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(engine.cancel(h));
    std::thread::sleep(Duration::from_millis(20));
    let fired = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&fired);
    engine
        .schedule(Duration::from_millis(1), move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    // A generous wait, so that only a dead worker fails this, not a slow machine.
    let waiting = std::time::Instant::now();
    while fired.load(Ordering::SeqCst) == 0 && waiting.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        fired.load(Ordering::SeqCst),
        1,
        "the shard's worker is dead"
    );
    assert_eq!(
        engine.stats().total.panicked,
        1,
        "the drop's panic was counted"
    );
}

/// a thread scheduling while another shuts down.
#[test]
fn a_concurrent_shutdown_settles_every_timer_scheduled_ok() {
    let mut losses = 0;
    let mut runs = 0;
    for round in 0..100u64 {
        let engine = Arc::new(
            TimerEngine::builder()
                .workers(1)
                .pin_workers(false)
                .build()
                .unwrap(),
        );
        let ran = Arc::new(AtomicUsize::new(0));
        let go = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let producer = {
            let (engine, ran, go) = (Arc::clone(&engine), Arc::clone(&ran), Arc::clone(&go));
            std::thread::spawn(move || {
                let mut ok = 0usize;
                loop {
                    let counter = Arc::clone(&ran);
                    match engine.schedule(Duration::from_secs(3600), move || {
                        counter.fetch_add(1, Ordering::SeqCst);
                    }) {
                        Ok(_) => ok += 1,
                        Err(_) => return ok,
                    }
                    if ok == 1000 {
                        go.store(true, Ordering::SeqCst);
                    }
                }
            })
        };
        while !go.load(Ordering::SeqCst) {
            std::hint::spin_loop();
        }
        for _ in 0..(round % 97) * 50 {
            std::hint::spin_loop();
        }
        let report = engine.shutdown(PendingTimers::Run);
        let ok = producer.join().unwrap();
        let ran = ran.load(Ordering::SeqCst);
        runs += 1;
        if ran != ok {
            losses += 1;
            eprintln!(
                "round {round}: {ok} scheduled Ok, {ran} ran, report {report:?}, in use {}",
                engine.nodes_in_use()
            );
        }
    }
    assert_eq!(losses, 0, "{losses} of {runs} shutdowns lost timers");
}

/// a reset that brings forward a timer the scheduling thread holds privately
/// during a reclaim raises the urgent tick; the worker consumes it and finds nothing; the
/// reclaim then parks the timer with the need of its old deadline. It fires up to
/// OLD_HORIZON ticks late. The hook stands for the reset and the worker's turn happening on
/// other threads at that instant.
#[test]
fn an_earlier_reset_during_a_reclaim_fires_on_time() {
    let clock = ManualClock::new();
    let engine = Arc::new(
        TimerEngine::builder()
            .workers(1)
            .manual_clock(clock.clone())
            .build()
            .unwrap(),
    );
    let t0 = clock.now();
    let fired_at = Arc::new(Mutex::new(None));
    let slot: Arc<Mutex<Option<corewheel::TimerHandle>>> = Arc::new(Mutex::new(None));
    let (e, c, s) = (Arc::clone(&engine), clock.clone(), Arc::clone(&slot));
    let hook = OnDrop(Some(Box::new(move || {
        let a = s.lock().unwrap().expect("a scheduled");
        assert!(e.reset(a, Duration::from_millis(1)), "a is pending");
        c.advance(Duration::from_millis(1));
        e.turn(); // the worker, at the new deadline, takes the urgent tick
    })));
    let x = engine
        .schedule(Duration::from_secs(3600), move || drop(hook))
        .unwrap();
    assert!(engine.cancel(x));
    let (f, c) = (Arc::clone(&fired_at), clock.clone());
    let a = engine
        .schedule(Duration::from_secs(3600), move || {
            *f.lock().unwrap() = Some((c.now() - t0).as_millis());
        })
        .unwrap();
    *slot.lock().unwrap() = Some(a);
    for _ in 0..62 {
        engine.schedule(Duration::from_secs(3600), || {}).unwrap();
    }
    engine.schedule(Duration::from_secs(3600), || {}).unwrap(); // reclaims
    for _ in 0..10 {
        if fired_at.lock().unwrap().is_some() {
            break;
        }
        clock.advance(Duration::from_millis(1));
        engine.turn();
    }
    let at = fired_at.lock().unwrap().expect("fired");
    assert_eq!(at, 1, "reset to 1 ms, fired at {at} ms");
}
