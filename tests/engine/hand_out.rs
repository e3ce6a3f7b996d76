//! Bursts whose due lists the owner hands out to the other workers (`engine::hand_out`), on
//! the real clock: a shutdown in the middle of the walk, callbacks that block while they
//! hold what they claimed, and repeating timers among the burst. Each asserts only what
//! holds on a loaded machine: never early, exactly once (or reported by the shutdown),
//! nothing lost, every node back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::support::fire_book::{Book, arm_then};
use crate::support::within;
use corewheel::{PendingTimers, TimerEngine};

/// Timers in a burst: enough that a look finds more due than the run queue holds, so the
/// owner hands the rest of its due lists out.
const BURST: usize = 100_000;

/// How long a test may take before it counts as hung.
const LIMIT: Duration = Duration::from_secs(120);

/// A burst of `BURST` one-shot timers from this thread, due within 5 ms from `lead` after
/// the book's origin on, every `block_every`th callback then blocking for a tenth of a
/// second; returns the book and the deadlines (ns since its origin).
fn arm_burst(
    engine: &TimerEngine,
    lead: Duration,
    seed: u64,
    block_every: Option<usize>,
) -> (Arc<Book>, Vec<u64>) {
    let book = Book::new(BURST);
    let window = (book.origin + lead, Duration::from_millis(5));
    let (deadlines, _) = arm_then(engine, &book, window, seed, move |id| {
        if block_every.is_some_and(|every| id % every == 0) {
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    (book, deadlines)
}

/// Checks that no timer ran twice or early; returns how many ran.
fn ran_once_never_early(book: &Book, deadlines: &[u64]) -> u64 {
    book.check(deadlines, &vec![false; BURST], true) as u64
}

fn engine(workers: usize) -> TimerEngine {
    TimerEngine::builder()
        .workers(workers)
        .pin_workers(false)
        .build()
        .expect("workers start")
}

/// A shutdown lands in the middle of a burst, while workers walk the owner's lists, in
/// both modes: each timer ran once or was reported dropped (or run) by the shutdown, never
/// both, none lost, every node back.
#[test]
fn a_shutdown_in_the_middle_of_a_walked_burst_settles_each_timer_once() {
    for (round, pending) in [PendingTimers::Drop, PendingTimers::Run]
        .into_iter()
        .enumerate()
    {
        within(LIMIT, "a burst shut down mid-walk", move || {
            let engine = engine(3);
            let lead = Duration::from_millis(200);
            let (book, deadlines) = arm_burst(&engine, lead, 0x9E37 + round as u64, None);
            let origin = book.origin;
            // Within the burst: its first 2 ms are due, the rest not.
            let stop = origin + lead + Duration::from_millis(2);
            std::thread::sleep(stop.saturating_duration_since(Instant::now()));
            let before = engine.stats().total.fired;
            let report = engine.shutdown(pending);
            let ran = ran_once_never_early(&book, &deadlines);
            match pending {
                PendingTimers::Drop => {
                    assert_eq!(ran + report.dropped, BURST as u64, "ran {ran}, {report:?}");
                    assert_eq!(report.ran, 0);
                }
                PendingTimers::Run => {
                    // A timer run at shutdown may run before its deadline: the shutdown
                    // asked for that. Count it apart from the early check above.
                    assert_eq!(ran, BURST as u64, "{report:?}");
                }
            }
            assert!(ran >= before, "fires went missing");
            assert_eq!(engine.nodes_in_use(), 0, "every node is back in its pool");
        });
    }
}

/// Some of the burst's callbacks block for a while (a tenth of a second, one in ten
/// thousand): a walker runs what it claimed only after giving its lists back, so the rest
/// of the burst still fires, and the owner's wheel is never left waiting for a blocked
/// walker. Every timer runs once, never early, and the burst is over within the limit.
#[test]
fn blocking_callbacks_in_a_walked_burst_hold_up_no_list() {
    within(LIMIT, "a burst with blocking callbacks", || {
        let engine = engine(3);
        let lead = Duration::from_millis(200);
        let (book, deadlines) = arm_burst(&engine, lead, 0xB10C, Some(10_000));
        while engine.stats().total.fired < BURST as u64 {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(ran_once_never_early(&book, &deadlines), BURST as u64);
        // Every timer another worker claimed, that worker ran (one-shots all).
        let stats = engine.stats().total;
        assert!(stats.claimed_elsewhere <= stats.stolen, "{stats:?}");
        let report = engine.shutdown(PendingTimers::Drop);
        assert_eq!(report.dropped, 0);
        assert_eq!(engine.nodes_in_use(), 0, "every node is back in its pool");
    });
}

/// Repeating timers among a burst's one-shots, and another thread cancelling them as they
/// come due: a walker fires a repeating timer and sends it back to the owner, whose wheel
/// waits for its lists, so the re-arm waits on the inbox. No repeating timer runs after a
/// cancel that returned `true`, none runs more than once a period, one-shots run once and
/// never early, and every node comes back.
#[test]
fn repeating_timers_walked_in_a_burst_stop_at_their_cancel() {
    const REPEATING: usize = 2_000;
    within(LIMIT, "repeating timers in a walked burst", || {
        let engine = engine(2);
        let lead = Duration::from_millis(200);
        let (book, deadlines) = arm_burst(&engine, lead, 0x5EED, None);
        let origin = book.origin;
        let period = Duration::from_millis(20);
        let stopped: Arc<Vec<AtomicBool>> =
            Arc::new((0..REPEATING).map(|_| AtomicBool::new(false)).collect());
        let after_stop: Arc<Vec<AtomicU64>> =
            Arc::new((0..REPEATING).map(|_| AtomicU64::new(0)).collect());
        let runs: Arc<Vec<AtomicU64>> =
            Arc::new((0..REPEATING).map(|_| AtomicU64::new(0)).collect());
        // First due in the middle of the burst, on the owner's wheel like the rest.
        let handles: Vec<_> = (0..REPEATING)
            .map(|id| {
                let (stopped, after_stop, runs) = (
                    Arc::clone(&stopped),
                    Arc::clone(&after_stop),
                    Arc::clone(&runs),
                );
                let start = origin + lead + Duration::from_micros((id as u64 * 7) % 5_000);
                let handle = engine
                    .schedule_repeating(period, move || {
                        runs[id].fetch_add(1, Ordering::Relaxed);
                        if stopped[id].load(Ordering::SeqCst) {
                            after_stop[id].fetch_add(1, Ordering::Relaxed);
                        }
                    })
                    .expect("scheduled");
                assert!(engine.reset_at(handle, start), "moved into the burst");
                handle
            })
            .collect();
        // Cancel them from the burst's start on, racing their first fires and re-arms.
        std::thread::sleep((origin + lead).saturating_duration_since(Instant::now()));
        for (id, &handle) in handles.iter().enumerate() {
            if engine.cancel(handle) {
                // Set after the cancel returned: a run that began before it may still see
                // the flag clear or set, but none may begin after it.
                stopped[id].store(true, Ordering::SeqCst);
            }
        }
        let cancel_done = origin.elapsed();
        while engine.stats().total.fired < BURST as u64 {
            std::thread::sleep(Duration::from_millis(5));
        }
        // Two periods for any re-arm in flight to prove it stays stopped.
        std::thread::sleep(2 * period);
        assert_eq!(ran_once_never_early(&book, &deadlines), BURST as u64);
        let elapsed = origin.elapsed().saturating_sub(lead);
        for id in 0..REPEATING {
            let runs = runs[id].load(Ordering::Relaxed);
            // A run begun before the cancel returned may see the flag set: at most one.
            assert!(
                after_stop[id].load(Ordering::Relaxed) <= 1,
                "repeating timer {id} ran after its cancel (cancels done at {cancel_done:?})"
            );
            let most = (elapsed.as_nanos() / period.as_nanos()) as u64 + 2;
            assert!(runs <= most, "repeating timer {id} ran {runs} times");
        }
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0, "every node is back in its pool");
    });
}
