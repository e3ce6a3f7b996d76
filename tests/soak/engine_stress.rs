//! Real-clock stress on two threads: a million timers, and a burst claimed in batches,
//! with cancels and resets racing the workers firing them. Asserts only what holds on a
//! loaded 2-core machine: never early, each surviving timer fired exactly once, no
//! cancelled timer fired, and every node back in its pool at shutdown. Nothing here
//! depends on how fast the machine is.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use corewheel::{PendingTimers, TimerEngine};

use crate::support::XorShift as Rng;

const THREADS: usize = 2;
const PER_THREAD: usize = 500_000;

/// A small deterministic generator, so a failure can be replayed.
struct Timer {
    fires: AtomicU8,
    /// Nanoseconds after `origin` at which the callback ran.
    fired_at: AtomicU64,
}

#[test]
fn a_million_timers_with_racing_cancels_and_resets() {
    let engine = Arc::new(
        TimerEngine::builder()
            .workers(THREADS)
            .pin_workers(false)
            .build()
            .expect("two workers"),
    );
    let origin = Instant::now();
    let timers: Arc<Vec<Timer>> = Arc::new(
        (0..THREADS * PER_THREAD)
            .map(|_| Timer {
                fires: AtomicU8::new(0),
                fired_at: AtomicU64::new(0),
            })
            .collect(),
    );
    // Per timer: the deadline the engine last accepted (ns after origin), and whether a
    // cancel returned true.
    let outcomes: Vec<Vec<(u64, bool)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|thread| {
                let engine = Arc::clone(&engine);
                let timers = Arc::clone(&timers);
                scope.spawn(move || {
                    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (thread as u64 + 1));
                    let mut outcomes = Vec::with_capacity(PER_THREAD);
                    let mut recent = Vec::with_capacity(64);
                    for local in 0..PER_THREAD {
                        let id = thread * PER_THREAD + local;
                        let delay = Duration::from_micros(rng.next() % 20_000);
                        let deadline = Instant::now() + delay;
                        let timers_for_callback = Arc::clone(&timers);
                        let handle = engine
                            .schedule_at(deadline, move || {
                                let timer = &timers_for_callback[id];
                                let at = origin.elapsed().as_nanos() as u64;
                                timer.fired_at.store(at, Ordering::Relaxed);
                                timer.fires.fetch_add(1, Ordering::Relaxed);
                            })
                            .expect("scheduled");
                        outcomes.push(((deadline - origin).as_nanos() as u64, false));
                        recent.push((local, handle));
                        if recent.len() == 64 {
                            // Race the workers: some of these have fired already.
                            for &(slot, handle) in &recent {
                                match rng.next() % 4 {
                                    0 if engine.cancel(handle) => outcomes[slot].1 = true,
                                    1 => {
                                        let delay = Duration::from_micros(rng.next() % 5_000);
                                        let deadline = Instant::now() + delay;
                                        if engine.reset_at(handle, deadline) {
                                            outcomes[slot].0 =
                                                (deadline - origin).as_nanos() as u64;
                                        }
                                    }
                                    _ => {}
                                }
                            }
                            recent.clear();
                        }
                    }
                    outcomes
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("no panic"))
            .collect()
    });

    // Wait until every timer that was not cancelled has fired. The deadlines are all within
    // 25 ms; the limit is only there so that a lost timer fails the test instead of hanging
    // it, and is far beyond anything a loaded machine needs.
    let expected = outcomes.iter().flatten().filter(|(_, c)| !c).count() as u64;
    let waiting = Instant::now();
    loop {
        let stats = engine.stats();
        if stats.total.fired >= expected && stats.total.pending == 0 {
            break;
        }
        assert!(
            waiting.elapsed() < Duration::from_secs(300),
            "timers lost: expected {expected} fires, {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    let mut fired = 0;
    for (id, &(deadline, cancelled)) in outcomes.iter().flatten().enumerate() {
        let timer = &timers[id];
        let fires = timer.fires.load(Ordering::Relaxed);
        if cancelled {
            assert_eq!(fires, 0, "timer {id} ran after its cancel returned true");
        } else {
            assert_eq!(fires, 1, "timer {id} ran {fires} times");
            let at = timer.fired_at.load(Ordering::Relaxed);
            assert!(
                at >= deadline,
                "timer {id} fired {} ns early",
                deadline - at
            );
            fired += 1;
        }
    }
    assert_eq!(fired, expected);
    let stats = engine.stats();
    assert_eq!(stats.total.scheduled, (THREADS * PER_THREAD) as u64);
    assert_eq!(stats.total.fired, expected);
    assert_eq!(stats.total.panicked, 0);

    let report = engine.shutdown(PendingTimers::Drop);
    assert_eq!(report.dropped, 0, "nothing was left pending");
    assert_eq!(engine.nodes_in_use(), 0, "every node is back in its pool");
}

/// A missed wake-up shows as a timer that fires only when something else wakes its worker.
/// Here nothing else does: the worker sleeps until a timer an hour away, and a thread arms
/// one short timer and then stays idle (its lane holds the timer until the worker takes
/// it), or exits (its lane is closed and forwarded). Each must fire within a minute: on
/// time is a millisecond or two, and a lost wake-up is never fired at all, so only a lost
/// wake-up can miss the bound, not a slow machine.
#[test]
fn a_lone_timer_wakes_a_sleeping_worker() {
    let engine = Arc::new(
        TimerEngine::builder()
            .workers(1)
            .pin_workers(false)
            .build()
            .expect("one worker"),
    );
    engine
        .schedule(Duration::from_secs(3600), || {})
        .expect("the far timer");
    for (round, delay_ms) in [0_u64, 1, 3, 7, 20].into_iter().enumerate() {
        let fired = Arc::new(AtomicU8::new(0));
        let stays_alive = round % 2 == 0;
        let (go_idle, idle) = std::sync::mpsc::channel::<()>();
        let armer = {
            let (engine, fired) = (Arc::clone(&engine), Arc::clone(&fired));
            std::thread::spawn(move || {
                // Let the worker settle into its long sleep first.
                std::thread::sleep(Duration::from_millis(20));
                engine
                    .schedule(Duration::from_millis(delay_ms), move || {
                        fired.fetch_add(1, Ordering::SeqCst);
                    })
                    .expect("scheduled");
                if stays_alive {
                    let _ = idle.recv();
                }
            })
        };
        let waiting = Instant::now();
        while fired.load(Ordering::SeqCst) == 0 {
            assert!(
                waiting.elapsed() < Duration::from_secs(60),
                "round {round}: a {delay_ms} ms timer from a thread that {} never fired",
                if stays_alive { "went idle" } else { "exited" }
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(go_idle);
        armer.join().expect("no panic");
        assert_eq!(fired.load(Ordering::SeqCst), 1);
    }
}

/// A burst armed ahead, as burst-steal arms it: 200,000 timers from one thread, all due
/// within the same 5 ms, 300 ms out, so that the owner claims them in batches across many
/// due slots at once. While the burst is claimed and run, another thread cancels a
/// quarter of them and resets another quarter (half earlier, half later), racing the
/// batches. Never early, exactly once for every timer whose cancel did not succeed, none
/// for those whose cancel did, nothing lost, every node back.
#[test]
fn a_burst_claimed_in_batches_with_racing_cancels_and_resets() {
    const BURST: usize = 200_000;
    let engine = TimerEngine::builder()
        .workers(THREADS)
        .pin_workers(false)
        .build()
        .expect("two workers");
    let origin = Instant::now();
    let timers: Arc<Vec<Timer>> = Arc::new(
        (0..BURST)
            .map(|_| Timer {
                fires: AtomicU8::new(0),
                fired_at: AtomicU64::new(0),
            })
            .collect(),
    );
    let first = origin + Duration::from_millis(300);
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut deadlines = Vec::with_capacity(BURST);
    let handles: Vec<_> = (0..BURST)
        .map(|id| {
            let deadline = first + Duration::from_nanos(rng.next() % 5_000_000);
            deadlines.push((deadline - origin).as_nanos() as u64);
            let timers = Arc::clone(&timers);
            engine
                .schedule_at(deadline, move || {
                    let timer = &timers[id];
                    timer
                        .fired_at
                        .store(origin.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    timer.fires.fetch_add(1, Ordering::Relaxed);
                })
                .expect("scheduled")
        })
        .collect();
    // From the first deadline on, race the burst: each change lands before, during or after
    // its timer's claim, whichever the machine makes it (the changes take longer than the
    // burst's claim, so the later ones find fired timers).
    std::thread::sleep(first.saturating_duration_since(Instant::now()));
    let mut cancelled = vec![false; BURST];
    for id in 0..BURST {
        match rng.next() % 4 {
            0 => cancelled[id] = engine.cancel(handles[id]),
            1 => {
                let delay = Duration::from_micros(rng.next() % 8_000);
                let deadline = Instant::now() + delay;
                if engine.reset_at(handles[id], deadline) {
                    deadlines[id] = (deadline - origin).as_nanos() as u64;
                }
            }
            _ => {}
        }
    }
    let expected = cancelled.iter().filter(|&&c| !c).count() as u64;
    let waiting = Instant::now();
    while engine.stats().total.fired < expected || engine.stats().total.pending > 0 {
        assert!(
            waiting.elapsed() < Duration::from_secs(300),
            "timers lost: expected {expected} fires, {:?}",
            engine.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for id in 0..BURST {
        let timer = &timers[id];
        let fires = timer.fires.load(Ordering::Relaxed);
        if cancelled[id] {
            assert_eq!(fires, 0, "timer {id} ran after its cancel returned true");
        } else {
            assert_eq!(fires, 1, "timer {id} ran {fires} times");
            let at = timer.fired_at.load(Ordering::Relaxed);
            assert!(
                at >= deadlines[id],
                "timer {id} fired {} ns early",
                deadlines[id] - at
            );
        }
    }
    assert_eq!(engine.stats().total.fired, expected);
    let report = engine.shutdown(PendingTimers::Drop);
    assert_eq!(report.dropped, 0, "nothing was left pending");
    assert_eq!(engine.nodes_in_use(), 0, "every node is back in its pool");
}
