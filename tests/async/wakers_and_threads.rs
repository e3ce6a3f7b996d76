//! The async layer (`Sleep`, `Timeout`, `Interval`, the free functions and `HyperTimer`)
//! across wakers and threads: which waker a fire wakes once polling stops, sleeps armed,
//! reset and dropped from thread-exit destructors (no thread context: the inbox path),
//! forgotten sleeps, wakers whose clone or drop panics and whose wake blocks, sleeps moved
//! between three executors, async load that puts the workers into close sleep
//! (src/engine/worker.rs `Closeness`), `Timeout` and `Interval` edges, and
//! `HyperTimer::reset` with odd deadlines and sleeps.
//!
//! Manual-clock tests check exact behaviour; real-clock tests assert only what holds on a
//! loaded 2-core machine (never early, exactly once, nothing lost, nothing leaked) with
//! generous limits (30 s before a wake counts as lost).
//!
//! Three tests check faults since fixed: an `Interval` on a shut-down engine must not tick
//! when polled after its next deadline; an unpolled `Interval` whose next deadline is
//! "never" must not tick once a manual clock passes the 30-year placeholder
//! `Sleep::deadline` reads; and a waker whose drop panics inside `poll` must not leave the
//! `Sleep` with a stale waker identity (the old waker is dropped after the `Sleep` notes
//! the new one), or a later poll's task is not woken.

use std::cell::RefCell;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Wake, Waker};
use std::time::{Duration, Instant};

use corewheel::{Elapsed, ManualClock, MissedTicks, PendingTimers, Sleep, TimerEngine};

use crate::support;
use crate::support::{Rng, eventually, poll, run_for, tokio_next, within};

const MS: Duration = Duration::from_millis(1);
/// How long a wake may take after its deadline before the test calls it lost.
const LOST: Duration = Duration::from_secs(30);

// ------------------------------------------------------------------------------ helpers

/// Counts its wakes, and lets a thread wait for them.
#[derive(Default)]
struct Wakes {
    count: AtomicUsize,
    lock: Mutex<()>,
    signal: Condvar,
}

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.count.fetch_add(1, Ordering::SeqCst);
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.signal.notify_all();
    }
}

impl Wakes {
    fn new() -> (Arc<Self>, Waker) {
        let wakes = Arc::new(Self::default());
        let waker = Waker::from(Arc::clone(&wakes));
        (wakes, waker)
    }

    fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Waits until woken at least `n` times in all, or `limit` passes.
    fn wait_for(&self, n: usize, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if self.count() >= n {
                return true;
            }
            let now = Instant::now();
            if now >= end {
                return false;
            }
            guard = self
                .signal
                .wait_timeout(guard, (end - now).min(Duration::from_millis(50)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Every node back in its pool within [`LOST`].
fn assert_nodes_come_back(engine: &TimerEngine) {
    assert!(
        eventually(LOST, || engine.nodes_in_use() == 0),
        "nodes leaked: {} in use",
        engine.nodes_in_use()
    );
}

fn leaked_real(workers: usize) -> &'static TimerEngine {
    support::leaked_unpinned(workers)
}

fn leaked_manual(workers: usize) -> (&'static TimerEngine, ManualClock) {
    let (engine, clock) = support::manual(workers);
    (Box::leak(Box::new(engine)), clock)
}

// ------------------------------------------------------ (1) the last waker registered

/// Four threads race polls of one `Sleep`, each with its own waker, and then stop at a
/// random moment around the deadline (before it, as it fires, or after). If no poll saw it
/// complete, the waker registered by the last `Pending` poll must be woken (a replaced
/// waker is dropped, never woken, and a lost replacement would leave that task waiting for
/// ever), and the poll that wake brings completes it, never before its deadline. The
/// existing many-waker test keeps polling until `Ready`, so it cannot see a lost wake.
#[test]
fn the_waker_registered_last_before_polling_stops_is_the_one_woken() {
    within(Duration::from_secs(120), "last-waker rounds", || {
        let engine = leaked_real(2);
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        struct Shared<'e> {
            sleep: Sleep<'e>,
            last: Option<usize>,
            ready: bool,
        }
        let watchers: Vec<Arc<Wakes>> = (0..4).map(|_| Arc::new(Wakes::default())).collect();
        for round in 0..1000 {
            for watcher in &watchers {
                watcher.count.store(0, Ordering::SeqCst);
            }
            let start = Instant::now();
            let deadline = start + Duration::from_micros(rng.below(4_000));
            let stop_at = start + Duration::from_micros(rng.below(6_000));
            let shared = Arc::new(Mutex::new(Shared {
                sleep: engine.sleep_until(deadline),
                last: None,
                ready: false,
            }));
            {
                let mut first = shared.lock().unwrap();
                let waker = Waker::from(Arc::clone(&watchers[0]));
                match poll(&mut first.sleep, &waker) {
                    Poll::Ready(()) => {
                        assert!(Instant::now() >= deadline, "round {round}: early at once");
                        first.ready = true;
                    }
                    Poll::Pending => first.last = Some(0),
                }
            }
            let threads: Vec<_> = (0..4)
                .map(|t| {
                    let shared = Arc::clone(&shared);
                    let waker = Waker::from(Arc::clone(&watchers[t]));
                    std::thread::spawn(move || {
                        let mut cx = Context::from_waker(&waker);
                        while Instant::now() < stop_at {
                            let mut state = shared.lock().unwrap();
                            if state.ready {
                                return;
                            }
                            match Pin::new(&mut state.sleep).poll(&mut cx) {
                                Poll::Ready(()) => {
                                    assert!(Instant::now() >= deadline, "completed early");
                                    state.ready = true;
                                }
                                Poll::Pending => state.last = Some(t),
                            }
                            drop(state);
                            std::thread::yield_now();
                        }
                    })
                })
                .collect();
            for thread in threads {
                thread.join().expect("a polling thread failed");
            }
            let mut state = shared.lock().unwrap();
            if !state.ready {
                let last = state.last.expect("at least one poll");
                assert!(
                    watchers[last].wait_for(1, LOST),
                    "round {round}: lost wake-up: thread {last}'s waker, registered by the \
                     last pending poll, was never woken (deadline +{:?}, stopped +{:?})",
                    deadline - start,
                    stop_at - start
                );
                let waker = Waker::from(Arc::clone(&watchers[last]));
                assert_eq!(
                    poll(&mut state.sleep, &waker),
                    Poll::Ready(()),
                    "round {round}: woken, yet not complete"
                );
                assert!(Instant::now() >= deadline, "round {round}: early");
                for (t, watcher) in watchers.iter().enumerate() {
                    if t != last {
                        assert_eq!(
                            watcher.count(),
                            0,
                            "round {round}: replaced waker {t} woken"
                        );
                    }
                }
            }
            drop(state);
            // A wake that began before a `Ready` poll may land just after it.
            let settled = eventually(LOST, || {
                watchers.iter().map(|w| w.count()).sum::<usize>() <= 1
            });
            assert!(settled, "round {round}: one timer woke several wakers");
        }
        // Every clone the engine held is released: woken (consumed) or replaced (dropped).
        assert!(
            eventually(LOST, || watchers.iter().all(|w| Arc::strong_count(w) == 1)),
            "waker clones still held: {:?}",
            watchers.iter().map(Arc::strong_count).collect::<Vec<_>>()
        );
        assert_nodes_come_back(engine);
    });
}

/// The same race with resets: the threads also reset the sleep (earlier, later, to the
/// past, to far off) and keep racing after it completes (a reset then re-arms it). Once
/// polling stops, if the last thing done was a `Pending` poll, that poll's task must be
/// woken (perhaps first by a timer a later reset left at an older deadline, whose poll then
/// re-arms) until a poll completes it, at or after its deadline.
#[test]
fn resets_racing_polls_and_the_fire_never_strand_the_last_task() {
    within(Duration::from_secs(120), "reset race rounds", || {
        let engine = leaked_real(2);
        let mut rng = Rng(0x5151_2024_0000_0001);
        struct Shared<'e> {
            sleep: Sleep<'e>,
            /// The thread whose poll was the last thing done, if it was `Pending`.
            pending_by: Option<usize>,
            early: Vec<String>,
        }
        let watchers: Vec<Arc<Wakes>> = (0..4).map(|_| Arc::new(Wakes::default())).collect();
        for round in 0..600_u64 {
            let start = Instant::now();
            let stop_at = start + Duration::from_micros(1_000 + rng.below(8_000));
            let shared = Arc::new(Mutex::new(Shared {
                sleep: engine.sleep(Duration::from_micros(rng.below(4_000))),
                pending_by: None,
                early: Vec::new(),
            }));
            let threads: Vec<_> = (0..4_usize)
                .map(|t| {
                    let shared = Arc::clone(&shared);
                    let waker = Waker::from(Arc::clone(&watchers[t]));
                    let mut rng = Rng(round * 31 + t as u64 + 1);
                    std::thread::spawn(move || {
                        let mut cx = Context::from_waker(&waker);
                        while Instant::now() < stop_at {
                            let mut state = shared.lock().unwrap();
                            if rng.below(4) == 0 {
                                let now = Instant::now();
                                let to = match rng.below(5) {
                                    0 => now + Duration::from_micros(rng.below(3_000)),
                                    1 => {
                                        state.sleep.deadline()
                                            + Duration::from_micros(rng.below(3_000))
                                    }
                                    2 => now.checked_sub(MS).unwrap_or(now),
                                    3 => now + Duration::from_secs(3600),
                                    _ => state.sleep.deadline(),
                                };
                                state.sleep.reset(to);
                                // A reset after a `Ready` needs a poll to arm: until one
                                // comes, no task waits on this sleep.
                            }
                            match Pin::new(&mut state.sleep).poll(&mut cx) {
                                Poll::Ready(()) => {
                                    let now = Instant::now();
                                    if now < state.sleep.deadline() {
                                        let late = state.sleep.deadline() - now;
                                        state.early.push(format!("early by {late:?}"));
                                    }
                                    state.pending_by = None;
                                }
                                Poll::Pending => state.pending_by = Some(t),
                            }
                            drop(state);
                            std::thread::yield_now();
                        }
                    })
                })
                .collect();
            for thread in threads {
                thread.join().expect("a polling thread failed");
            }
            let mut state = shared.lock().unwrap();
            assert!(state.early.is_empty(), "round {round}: {:?}", state.early);
            if let Some(t) = state.pending_by {
                // Make it finish within the limit: a deadline an hour off is brought in
                // from this thread (a reset earlier moves the timer and needs no poll).
                if state.sleep.deadline() > Instant::now() + Duration::from_secs(1) {
                    state.sleep.reset(Instant::now() + MS);
                }
                let waker = Waker::from(Arc::clone(&watchers[t]));
                let end = Instant::now() + LOST;
                loop {
                    let seen = watchers[t].count();
                    if poll(&mut state.sleep, &waker).is_ready() {
                        assert!(
                            Instant::now() >= state.sleep.deadline(),
                            "round {round}: early"
                        );
                        break;
                    }
                    assert!(
                        watchers[t]
                            .wait_for(seen + 1, end.saturating_duration_since(Instant::now())),
                        "round {round}: lost wake-up: thread {t}'s task, the last to see \
                         Pending, was never woken (deadline {:?} from now)",
                        state
                            .sleep
                            .deadline()
                            .saturating_duration_since(Instant::now())
                    );
                }
            }
        }
        assert_nodes_come_back(engine);
        assert!(
            eventually(LOST, || watchers.iter().all(|w| Arc::strong_count(w) == 1)),
            "waker clones still held"
        );
    });
}

/// Threads swap wakers on many pending sleeps (each poll with the other of two wakers)
/// while the engine shuts down: shutdown wakes every waker timer, so for each sleep the
/// waker its last `Pending` poll registered must be woken, and the next poll completes.
/// The swap holds the timer's reset lock, which the last turn must wait out, not skip.
#[test]
fn waker_swaps_racing_shutdown_wake_the_last_registered() {
    within(Duration::from_secs(120), "swaps vs shutdown", || {
        let mut rng = Rng(99);
        for round in 0..60 {
            let engine = leaked_real(2);
            let go = Arc::new(AtomicBool::new(false));
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let go = Arc::clone(&go);
                    std::thread::spawn(move || {
                        let pairs: Vec<_> = (0..16).map(|_| (Wakes::new(), Wakes::new())).collect();
                        let mut sleeps: Vec<Sleep<'static>> = (0..16)
                            .map(|i| engine.sleep(Duration::from_secs(3600 + i)))
                            .collect();
                        // The index (0 or 1) of the waker last registered, per sleep.
                        let mut last: Vec<Option<usize>> = vec![None; 16];
                        let mut done = vec![false; 16];
                        while !go.load(Ordering::SeqCst) {
                            std::hint::spin_loop();
                        }
                        let mut turn = 0_usize;
                        while done.iter().any(|d| !d) && turn < 200_000 {
                            turn += 1;
                            let i = turn % 16;
                            if done[i] {
                                continue;
                            }
                            let which = turn / 16 % 2;
                            let waker = if which == 0 {
                                &pairs[i].0.1
                            } else {
                                &pairs[i].1.1
                            };
                            match poll(&mut sleeps[i], waker) {
                                Poll::Ready(()) => done[i] = true,
                                Poll::Pending => last[i] = Some(which),
                            }
                        }
                        (pairs, sleeps, last, done)
                    })
                })
                .collect();
            go.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_micros(rng.below(3_000)));
            engine.shutdown(PendingTimers::Drop);
            for thread in threads {
                let (pairs, mut sleeps, last, done) = thread.join().expect("a swapping thread");
                for i in 0..16 {
                    if done[i] {
                        continue;
                    }
                    let which = last[i].expect("polled at least once");
                    let (wakes, waker) = if which == 0 { &pairs[i].0 } else { &pairs[i].1 };
                    assert!(
                        wakes.wait_for(1, LOST),
                        "round {round}: sleep {i}: the waker registered last was not woken by shutdown"
                    );
                    assert_eq!(poll(&mut sleeps[i], waker), Poll::Ready(()));
                }
                drop(sleeps);
                for (a, b) in &pairs {
                    assert!(
                        // One count for the `Arc`, one for the pair's own `Waker`.
                        eventually(LOST, || Arc::strong_count(&a.0) == 2
                            && Arc::strong_count(&b.0) == 2),
                        "round {round}: a waker clone outlived shutdown"
                    );
                }
            }
            assert_eq!(
                engine.nodes_in_use(),
                0,
                "round {round}: nodes after shutdown"
            );
        }
    });
}

// --------------------------------------------------- (2) thread-exit destructors

/// What a thread-exit destructor does with a sleep it is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AtExit {
    /// Polls it (arming its timer) and sends it back.
    Poll,
    /// Resets it earlier (it was polled already), polls it and sends it back.
    ResetEarlier(Duration),
    /// Resets it later (it was polled already), polls it and sends it back.
    ResetLater(Duration),
    /// Drops it (it was polled already): its waker must never be woken.
    Drop,
}

struct ExitJob {
    sleeps: Vec<(usize, Sleep<'static>, AtExit, Waker)>,
    back: mpsc::Sender<(usize, Sleep<'static>)>,
}

impl Drop for ExitJob {
    fn drop(&mut self) {
        for (id, mut sleep, what, waker) in self.sleeps.drain(..) {
            match what {
                AtExit::Poll => {}
                AtExit::ResetEarlier(by) => sleep.reset(sleep.deadline() - by),
                AtExit::ResetLater(by) => sleep.reset(sleep.deadline() + by),
                AtExit::Drop => {
                    drop(sleep);
                    continue;
                }
            }
            // A deadline passed already completes only on the engine's next turn.
            let _ = poll(&mut sleep, &waker);
            let _ = self.back.send((id, sleep));
        }
    }
}

thread_local! {
    /// Set before the thread first touches the engine, so that where destructors run in
    /// reverse order of registration (Linux) its destructor runs after the engine's thread
    /// contexts are gone: the no-lane path (`arm_direct`, `send_direct`).
    static BEFORE_ENGINE: RefCell<Option<ExitJob>> = const { RefCell::new(None) };
    /// Set after the thread used the engine: its destructor runs with the lanes still open.
    static AFTER_ENGINE: RefCell<Option<ExitJob>> = const { RefCell::new(None) };
}

/// One sleep of the thread-exit test: what the destructor does, and its deadline after.
struct ExitCase {
    what: AtExit,
    sleep: Option<Sleep<'static>>,
    wakes: Arc<Wakes>,
    waker: Waker,
}

fn exit_cases(engine: &'static TimerEngine, base: Duration, rng: &mut Rng) -> Vec<ExitCase> {
    (0..24)
        .map(|i| {
            let what = match i % 4 {
                0 => AtExit::Poll,
                1 => AtExit::ResetEarlier(Duration::from_millis(
                    1 + rng.below(base.as_millis() as u64 / 2),
                )),
                2 => AtExit::ResetLater(Duration::from_millis(1 + rng.below(20))),
                _ => AtExit::Drop,
            };
            let (wakes, waker) = Wakes::new();
            let mut sleep = engine.sleep(base + Duration::from_millis(rng.below(20)));
            if what != AtExit::Poll {
                // Armed here, on the test's thread; reset or dropped at the other's exit.
                assert!(poll(&mut sleep, &waker).is_pending());
            }
            ExitCase {
                what,
                sleep: Some(sleep),
                wakes,
                waker,
            }
        })
        .collect()
}

/// Hands the cases to a thread that does their work in its two exit destructors (half
/// each), and collects the sleeps it sends back.
fn run_exit_thread(
    engine: &'static TimerEngine,
    cases: &mut [ExitCase],
) -> Vec<(usize, Sleep<'static>)> {
    let (back, returned) = mpsc::channel();
    let mut first = Vec::new();
    let mut second = Vec::new();
    for (id, case) in cases.iter_mut().enumerate() {
        let job = (
            id,
            case.sleep.take().unwrap(),
            case.what,
            case.waker.clone(),
        );
        if id % 2 == 0 {
            first.push(job);
        } else {
            second.push(job);
        }
    }
    let (first_back, second_back) = (back.clone(), back);
    std::thread::spawn(move || {
        BEFORE_ENGINE.with(|slot| {
            *slot.borrow_mut() = Some(ExitJob {
                sleeps: first,
                back: first_back,
            })
        });
        // The thread uses the engine (its context and lanes open), then registers the
        // second job.
        let (_, waker) = Wakes::new();
        let mut own = engine.sleep(Duration::from_secs(3600));
        assert!(poll(&mut own, &waker).is_pending());
        drop(own);
        AFTER_ENGINE.with(|slot| {
            *slot.borrow_mut() = Some(ExitJob {
                sleeps: second,
                back: second_back,
            })
        });
    })
    .join()
    .expect("the exiting thread");
    let mut got: Vec<_> = returned.try_iter().collect();
    got.sort_by_key(|(id, _)| *id);
    got
}

/// Sleeps armed, reset earlier and later, and dropped by thread-local destructors as their
/// thread exits, on a hand-driven engine: each completes exactly at its deadline's tick,
/// never before; a dropped one wakes nobody; every node comes back.
#[test]
fn sleeps_armed_reset_and_dropped_at_thread_exit_on_a_manual_clock() {
    let (engine, clock) = leaked_manual(2);
    let mut rng = Rng(7);
    let mut cases = exit_cases(engine, Duration::from_millis(40), &mut rng);
    let back = run_exit_thread(engine, &mut cases);
    let expected = cases.iter().filter(|c| c.what != AtExit::Drop).count();
    assert_eq!(back.len(), expected, "every sleep not dropped came back");
    let mut pending: Vec<(usize, Sleep<'static>)> = back;
    // Some, now on the lane-less inbox path or moved off the exited thread's lane, are
    // reset earlier from this thread before any turn: a message for a node in transit.
    for (id, sleep) in pending.iter_mut() {
        if *id % 3 == 0 {
            sleep.reset(sleep.deadline() - Duration::from_millis(7));
            assert!(poll(sleep, &cases[*id].waker).is_pending());
        }
    }
    for _ in 0..200 {
        clock.advance(MS);
        engine.turn();
        let now = engine.now();
        pending.retain_mut(|(id, sleep)| {
            let case = &cases[*id];
            // A poll only when woken: what a task does.
            let woken = case.wakes.count() > 0;
            if !woken {
                // Deadlines fall on whole ticks here: the turn that reaches one wakes.
                assert!(
                    now < sleep.deadline(),
                    "sleep {id} ({:?}): not woken {:?} after its deadline",
                    case.what,
                    now.duration_since(sleep.deadline())
                );
                return true;
            }
            match poll(sleep, &case.waker) {
                Poll::Ready(()) => {
                    assert!(
                        now >= sleep.deadline(),
                        "sleep {id} ({:?}): early",
                        case.what
                    );
                    assert!(
                        now.duration_since(sleep.deadline()) < MS,
                        "sleep {id} ({:?}): a tick late or more",
                        case.what
                    );
                    false
                }
                Poll::Pending => {
                    // A later reset's timer left at the old deadline wakes once then.
                    case.wakes.count.store(0, Ordering::SeqCst);
                    true
                }
            }
        });
    }
    assert!(
        pending.is_empty(),
        "never completed: {:?}",
        pending.iter().map(|p| p.0).collect::<Vec<_>>()
    );
    for (id, case) in cases.iter().enumerate() {
        if case.what == AtExit::Drop {
            assert_eq!(case.wakes.count(), 0, "dropped sleep {id} woke its task");
        }
    }
    run_for(engine, &clock, 100);
    assert_eq!(
        engine.nodes_in_use(),
        0,
        "nodes leaked by the thread-exit paths"
    );
    for case in &cases {
        assert_eq!(
            Arc::strong_count(&case.wakes),
            2,
            "a waker clone is still held"
        );
    }
}

/// The same on a real clock, two workers: never early, nothing lost, nothing leaked.
#[test]
fn sleeps_armed_reset_and_dropped_at_thread_exit_on_a_real_clock() {
    within(Duration::from_secs(90), "thread-exit sleeps", || {
        let engine = leaked_real(2);
        let mut rng = Rng(11);
        for _round in 0..10 {
            let mut cases = exit_cases(engine, Duration::from_millis(30), &mut rng);
            let back = run_exit_thread(engine, &mut cases);
            for (id, mut sleep) in back {
                let case = &cases[id];
                let end = Instant::now() + LOST;
                loop {
                    let seen = case.wakes.count();
                    if poll(&mut sleep, &case.waker).is_ready() {
                        assert!(Instant::now() >= sleep.deadline(), "sleep {id} early");
                        break;
                    }
                    assert!(
                        case.wakes
                            .wait_for(seen + 1, end.saturating_duration_since(Instant::now())),
                        "sleep {id} ({:?}): lost wake-up",
                        case.what
                    );
                }
            }
            for (id, case) in cases.iter().enumerate() {
                if case.what == AtExit::Drop {
                    assert_eq!(case.wakes.count(), 0, "dropped sleep {id} woke its task");
                }
            }
        }
        assert_nodes_come_back(engine);
    });
}

// ------------------------------------------------------------------- (3) mem::forget

/// A forgotten `Sleep` cannot cancel: its timer fires at its deadline, wakes the task once
/// (a spurious wake), releases the waker clone and gives its node back. One forgotten with
/// a deadline past the engine's range holds its node until shutdown, which wakes it and
/// frees the node. One forgotten after a later reset fires only at the old deadline.
#[test]
fn forgotten_sleeps_wake_once_and_give_their_nodes_back() {
    let (engine, clock) = leaked_manual(1);
    let (near, near_waker) = Wakes::new();
    let (lazy, lazy_waker) = Wakes::new();
    let (never, never_waker) = Wakes::new();

    let mut a = engine.sleep(Duration::from_millis(10));
    assert!(poll(&mut a, &near_waker).is_pending());
    std::mem::forget(a);

    let mut b = engine.sleep(Duration::from_millis(5));
    assert!(poll(&mut b, &lazy_waker).is_pending());
    b.reset(engine.now() + Duration::from_millis(50));
    std::mem::forget(b);

    let mut c = engine.sleep(Duration::MAX);
    assert!(poll(&mut c, &never_waker).is_pending());
    std::mem::forget(c);

    run_for(engine, &clock, 4);
    assert_eq!((near.count(), lazy.count()), (0, 0), "early");
    run_for(engine, &clock, 1);
    assert_eq!(
        lazy.count(),
        1,
        "the forgotten lazy sleep fires at its old deadline"
    );
    run_for(engine, &clock, 4);
    assert_eq!(near.count(), 0, "early");
    run_for(engine, &clock, 1);
    assert_eq!(near.count(), 1);
    run_for(engine, &clock, 100);
    assert_eq!(
        (near.count(), lazy.count(), never.count()),
        (1, 1, 0),
        "exactly once"
    );
    assert_eq!(Arc::strong_count(&near), 2, "the fired clone was released");
    assert_eq!(Arc::strong_count(&lazy), 2, "the fired clone was released");
    assert_eq!(
        engine.nodes_in_use(),
        1,
        "only the never-firing one holds a node"
    );
    engine.shutdown(PendingTimers::Drop);
    assert_eq!(never.count(), 1, "shutdown wakes a waker timer");
    assert_eq!(engine.nodes_in_use(), 0);
    assert_eq!(Arc::strong_count(&never), 2);
}

// --------------------------------------------------------- (4) hostile waker vtables

/// A waker whose clone or drop panics on demand, counting its live clones.
struct Hostile {
    live: AtomicUsize,
    wakes: AtomicUsize,
    panic_on_clone: AtomicBool,
    panic_on_drop: AtomicBool,
}

static HOSTILE_VTABLE: RawWakerVTable = RawWakerVTable::new(
    hostile_clone,
    hostile_wake,
    hostile_wake_by_ref,
    hostile_drop,
);

unsafe fn hostile_clone(data: *const ()) -> RawWaker {
    // SAFETY: `data` is a leaked `Hostile`, alive for the program.
    let hostile = unsafe { &*(data as *const Hostile) };
    if hostile.panic_on_clone.load(Ordering::SeqCst) {
        panic!("hostile waker: clone");
    }
    hostile.live.fetch_add(1, Ordering::SeqCst);
    RawWaker::new(data, &HOSTILE_VTABLE)
}

unsafe fn hostile_wake(data: *const ()) {
    // SAFETY: as above; wake consumes the clone.
    unsafe {
        hostile_wake_by_ref(data);
        hostile_drop(data);
    }
}

unsafe fn hostile_wake_by_ref(data: *const ()) {
    // SAFETY: as above.
    let hostile = unsafe { &*(data as *const Hostile) };
    hostile.wakes.fetch_add(1, Ordering::SeqCst);
}

unsafe fn hostile_drop(data: *const ()) {
    // SAFETY: as above.
    let hostile = unsafe { &*(data as *const Hostile) };
    hostile.live.fetch_sub(1, Ordering::SeqCst);
    if hostile.panic_on_drop.load(Ordering::SeqCst) {
        panic!("hostile waker: drop");
    }
}

fn hostile() -> (&'static Hostile, Waker) {
    let hostile: &'static Hostile = Box::leak(Box::new(Hostile {
        live: AtomicUsize::new(1),
        wakes: AtomicUsize::new(0),
        panic_on_clone: AtomicBool::new(false),
        panic_on_drop: AtomicBool::new(false),
    }));
    let raw = RawWaker::new((hostile as *const Hostile).cast(), &HOSTILE_VTABLE);
    // SAFETY: the vtable keeps the contract (clone, wake, drop manage `live`).
    (hostile, unsafe { Waker::from_raw(raw) })
}

/// A waker whose clone panics, then one whose drop panics, passed to `poll`: the panic
/// reaches the poller (the executor's bug, not the engine's), and the `Sleep` stays
/// consistent: polled again with a sane waker it completes at its deadline, never early,
/// the sane waker is the one woken, and the panicking clone left in a node that the engine
/// frees is contained there. The engine goes on firing other sleeps on time.
#[test]
fn wakers_whose_clone_or_drop_panics_leave_the_sleep_and_engine_consistent() {
    let (engine, clock) = leaked_manual(1);
    let (good, good_waker) = Wakes::new();
    let (bad, bad_waker) = hostile();
    let mut sleep = engine.sleep(Duration::from_millis(10));
    assert!(poll(&mut sleep, &good_waker).is_pending());

    bad.panic_on_clone.store(true, Ordering::SeqCst);
    let outcome = catch_unwind(AssertUnwindSafe(|| poll(&mut sleep, &bad_waker)));
    assert!(outcome.is_err(), "the clone's panic reaches the poller");
    bad.panic_on_clone.store(false, Ordering::SeqCst);

    // The bad waker goes in; putting the good one back drops the bad clone, which panics.
    assert!(poll(&mut sleep, &bad_waker).is_pending());
    bad.panic_on_drop.store(true, Ordering::SeqCst);
    let outcome = catch_unwind(AssertUnwindSafe(|| poll(&mut sleep, &good_waker)));
    assert!(
        outcome.is_err(),
        "the old waker's drop panics in the poll that replaces it"
    );
    bad.panic_on_drop.store(false, Ordering::SeqCst);
    assert!(poll(&mut sleep, &good_waker).is_pending());

    run_for(engine, &clock, 9);
    assert_eq!(good.count(), 0, "early");
    assert_eq!(
        bad.wakes.load(Ordering::SeqCst),
        0,
        "a replaced waker was woken"
    );
    run_for(engine, &clock, 1);
    assert_eq!(good.count(), 1, "the waker registered last is woken");
    assert_eq!(poll(&mut sleep, &good_waker), Poll::Ready(()));
    assert_eq!(
        bad.live.load(Ordering::SeqCst),
        1,
        "every bad clone was released"
    );

    // A bad clone whose drop panics, left in a node the engine frees (its sleep dropped).
    let mut other = engine.sleep(Duration::from_millis(10));
    assert!(poll(&mut other, &bad_waker).is_pending());
    bad.panic_on_drop.store(true, Ordering::SeqCst);
    drop(other);
    run_for(engine, &clock, 100);
    bad.panic_on_drop.store(false, Ordering::SeqCst);
    assert_eq!(
        bad.live.load(Ordering::SeqCst),
        1,
        "the engine dropped the clone"
    );
    assert_eq!(
        bad.wakes.load(Ordering::SeqCst),
        0,
        "a dropped sleep woke its task"
    );

    // The engine still works.
    let mut after = engine.sleep(Duration::from_millis(3));
    assert!(poll(&mut after, &good_waker).is_pending());
    run_for(engine, &clock, 3);
    assert_eq!(poll(&mut after, &good_waker), Poll::Ready(()));
    assert_eq!(engine.nodes_in_use(), 0);
}

/// A poll in which the replaced waker's drop panics must leave the `Sleep` knowing that
/// the node holds the new waker: `replace_waker` used to drop the old waker before `poll`
/// noted the new one's identity, so a later poll with the old waker touched nothing
/// (`will_wake` said same) and the fire woke the other task, never the one that polled
/// last.
#[test]
fn a_panicking_waker_drop_leaves_a_stale_waker_identity() {
    let (engine, clock) = leaked_manual(1);
    let (good, good_waker) = Wakes::new();
    let (bad, bad_waker) = hostile();
    let mut sleep = engine.sleep(Duration::from_millis(10));
    assert!(poll(&mut sleep, &bad_waker).is_pending());
    bad.panic_on_drop.store(true, Ordering::SeqCst);
    let outcome = catch_unwind(AssertUnwindSafe(|| poll(&mut sleep, &good_waker)));
    assert!(outcome.is_err());
    bad.panic_on_drop.store(false, Ordering::SeqCst);
    // The task with the bad waker polls last.
    assert!(poll(&mut sleep, &bad_waker).is_pending());
    run_for(engine, &clock, 10);
    assert_eq!(
        (bad.wakes.load(Ordering::SeqCst), good.count()),
        (1, 0),
        "the last poll's waker was not the one woken (bad, good)"
    );
}

/// A task whose waker blocks in `wake` (an executor that runs the task inline and gets
/// stuck) holds up its worker; the other worker stands in (`rescue_after`), so sleeps due
/// later, polled from threads homed on both shards, still complete, never early, while the
/// wake is still blocked.
#[test]
fn a_wake_that_blocks_does_not_hold_up_later_sleeps() {
    struct Blocking {
        gate: Mutex<bool>,
        open: Condvar,
        entered: AtomicBool,
    }
    impl Wake for Blocking {
        fn wake(self: Arc<Self>) {
            self.entered.store(true, Ordering::SeqCst);
            let mut open = self.gate.lock().unwrap();
            let end = Instant::now() + Duration::from_secs(40);
            while !*open && Instant::now() < end {
                open = self.open.wait_timeout(open, MS * 50).unwrap().0;
            }
        }
    }
    let engine = leaked_real(2);
    let blocking = Arc::new(Blocking {
        gate: Mutex::new(false),
        open: Condvar::new(),
        entered: AtomicBool::new(false),
    });
    let blocker_waker = Waker::from(Arc::clone(&blocking));
    let mut blocker = engine.sleep(Duration::from_millis(5));
    assert!(poll(&mut blocker, &blocker_waker).is_pending());
    let early = Arc::new(AtomicUsize::new(0));
    let pollers: Vec<_> = (0..4)
        .map(|t| {
            let early = Arc::clone(&early);
            std::thread::spawn(move || {
                let sleeps: Vec<_> = (0..50_u64)
                    .map(|i| {
                        let early = Arc::clone(&early);
                        let sleep = engine.sleep(Duration::from_millis(30 + (i * 7 + t) % 150));
                        async move {
                            let deadline = sleep.deadline();
                            sleep.await;
                            if Instant::now() < deadline {
                                early.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    })
                    .collect();
                futures::executor::block_on(futures::future::join_all(sleeps));
            })
        })
        .collect();
    let (done_tx, done_rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        for poller in pollers {
            poller.join().expect("a poller");
        }
        let _ = done_tx.send(());
    });
    let finished = done_rx.recv_timeout(Duration::from_secs(20));
    let entered = blocking.entered.load(Ordering::SeqCst);
    *blocking.gate.lock().unwrap() = true;
    blocking.open.notify_all();
    assert!(entered, "the blocking waker was never woken");
    assert!(
        finished.is_ok(),
        "sleeps on the engine waited for a wake blocked on a worker (no stand-in)"
    );
    waiter.join().expect("joined");
    assert_eq!(early.load(Ordering::SeqCst), 0, "a sleep completed early");
    assert_eq!(poll(&mut blocker, &blocker_waker), Poll::Ready(()));
    drop(blocker);
    assert_nodes_come_back(engine);
}

// ----------------------------------------------------------- (5) close sleep, async

/// One record of the close-sleep storm: what went wrong, if anything.
type Faults = Arc<Mutex<Vec<String>>>;

fn fault(faults: &Faults, what: String) {
    faults.lock().unwrap().push(what);
}

/// Async load with many short, varied deadlines from tokio's two workers (the stream that
/// undercuts the engine workers' plans and makes them sleep close, planning at most 3 ticks
/// ahead), mixed with timeouts, resets both ways, polled-then-dropped sleeps and longer
/// sleeps; then, as the close spell runs out, sleeps due around its end (256 ticks). Every
/// completion is at or after its deadline, every timeout's outcome agrees with the clocks,
/// nothing is lost (the whole run has a limit), and every node comes back.
#[test]
fn async_load_across_close_sleep_is_never_early_nor_lost() {
    let engine = leaked_real(2);
    let faults: Faults = Arc::new(Mutex::new(Vec::new()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("tokio");
    let task_faults = Arc::clone(&faults);
    within(Duration::from_secs(60), "close-sleep storm", move || {
        runtime.block_on(async move {
            let tasks: Vec<_> = (0..64_u64)
                .map(|t| {
                    let faults = Arc::clone(&task_faults);
                    tokio::spawn(async move {
                        let mut rng = Rng(t * 0x9E37 + 1);
                        for step in 0..40 {
                            storm_step(engine, &mut rng, &faults, t, step).await;
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.expect("a storm task panicked");
            }
            // Sleeps due around the end of the close spell the storm started.
            let tail: Vec<_> = (0..32_u64)
                .map(|i| {
                    let faults = Arc::clone(&task_faults);
                    tokio::spawn(async move {
                        let sleep = engine.sleep(Duration::from_millis(200 + i * 3));
                        let deadline = sleep.deadline();
                        sleep.await;
                        if Instant::now() < deadline {
                            fault(&faults, format!("tail sleep {i} early"));
                        }
                    })
                })
                .collect();
            for task in tail {
                task.await.expect("a tail task panicked");
            }
        });
    });
    let faults = faults.lock().unwrap();
    assert!(
        faults.is_empty(),
        "{} faults: {:?}",
        faults.len(),
        &faults[..faults.len().min(10)]
    );
    assert_nodes_come_back(engine);
}

async fn storm_step(
    engine: &'static TimerEngine,
    rng: &mut Rng,
    faults: &Faults,
    t: u64,
    step: u32,
) {
    let op = rng.below(8);
    match op {
        // Short sleeps: the undercutting stream.
        0..=2 => {
            let sleep = engine.sleep(Duration::from_micros(rng.below(5_000)));
            let deadline = sleep.deadline();
            sleep.await;
            if Instant::now() < deadline {
                fault(faults, format!("task {t} step {step}: short sleep early"));
            }
        }
        // A timeout over a sleep: either outcome must agree with the clocks.
        3 | 4 => {
            let inner = engine.sleep(Duration::from_micros(rng.below(6_000)));
            let inner_deadline = inner.deadline();
            let timeout = engine.timeout(Duration::from_micros(rng.below(6_000)), inner);
            let deadline = timeout.deadline();
            let outcome = timeout.await;
            let now = Instant::now();
            match outcome {
                Ok(()) if now < inner_deadline => {
                    fault(faults, format!("task {t} step {step}: inner sleep early"))
                }
                Err(Elapsed) if now < deadline => {
                    fault(faults, format!("task {t} step {step}: timeout early"))
                }
                _ => {}
            }
        }
        // A longer sleep, polled, reset earlier or later (or to the past), awaited.
        5 | 6 => {
            let mut sleep = engine.sleep(Duration::from_millis(10 + rng.below(40)));
            std::future::poll_fn(|cx| {
                let _ = Pin::new(&mut sleep).poll(cx);
                Poll::Ready(())
            })
            .await;
            tokio::task::yield_now().await;
            let now = Instant::now();
            let to = match rng.below(4) {
                0 => now + Duration::from_micros(rng.below(4_000)),
                1 => sleep.deadline() + Duration::from_millis(rng.below(30)),
                2 => now.checked_sub(Duration::from_millis(5)).unwrap_or(now),
                _ => sleep.deadline() - Duration::from_millis(rng.below(10)),
            };
            sleep.reset(to);
            let deadline = sleep.deadline();
            sleep.await;
            if Instant::now() < deadline {
                fault(faults, format!("task {t} step {step}: reset sleep early"));
            }
        }
        // Polled, then dropped before its deadline: cancels.
        _ => {
            let mut sleep = engine.sleep(Duration::from_millis(1 + rng.below(200)));
            std::future::poll_fn(|cx| {
                let _ = Pin::new(&mut sleep).poll(cx);
                Poll::Ready(())
            })
            .await;
            drop(sleep);
        }
    }
}

// ----------------------------------------------------------- (6) executors and moves

/// A `Sleep` polled on tokio, moved to smol's executor and polled there, then moved to a
/// `futures` executor to complete: each move replaces the waker in the node; the last
/// executor's task is woken, at or after the deadline.
#[test]
#[allow(
    clippy::async_yields_async,
    reason = "the tasks hand the sleep itself on, to be polled on the next executor"
)]
fn a_sleep_moved_from_tokio_to_smol_to_futures_completes_once_on_time() {
    within(Duration::from_secs(60), "executor hops", || {
        let engine = leaked_real(2);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .expect("tokio");
        let executor = Arc::new(smol::Executor::new());
        let stop = Arc::new(AtomicBool::new(false));
        let smol_threads: Vec<_> = (0..2)
            .map(|_| {
                let executor = Arc::clone(&executor);
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    smol::block_on(executor.run(async move {
                        while !stop.load(Ordering::SeqCst) {
                            smol::Timer::after(Duration::from_millis(5)).await;
                        }
                    }))
                })
            })
            .collect();
        for round in 0..50_u64 {
            let delay = Duration::from_millis(3 + round % 12);
            let mut sleep = engine.sleep(delay);
            let deadline = sleep.deadline();
            // Polled once on tokio (armed with a tokio waker) and handed back.
            let sleep_back = runtime.block_on(async move {
                tokio::spawn(async move {
                    std::future::poll_fn(|cx| {
                        assert!(
                            Pin::new(&mut sleep).poll(cx).is_pending()
                                || Instant::now() >= deadline
                        );
                        Poll::Ready(())
                    })
                    .await;
                    sleep
                })
                .await
                .expect("tokio task")
            });
            // Polled once on smol (its waker replaces tokio's), then handed on.
            let mut sleep = sleep_back;
            let sleep = smol::block_on(executor.spawn(async move {
                std::future::poll_fn(|cx| {
                    let _ = Pin::new(&mut sleep).poll(cx);
                    Poll::Ready(())
                })
                .await;
                sleep
            }));
            // Completed on a futures executor.
            futures::executor::block_on(sleep);
            assert!(
                Instant::now() >= deadline,
                "round {round}: early after the hops"
            );
        }
        stop.store(true, Ordering::SeqCst);
        for thread in smol_threads {
            thread.join().expect("smol thread");
        }
        drop(runtime);
        assert_nodes_come_back(engine);
    });
}

/// The free functions on the default engine under smol: never early, timeouts both ways,
/// an interval's ticks a period apart at least.
#[test]
fn free_functions_under_smol() {
    within(Duration::from_secs(60), "free functions", || {
        smol::block_on(async {
            for i in 0..20_u64 {
                let deadline = Instant::now() + Duration::from_micros(i * 300);
                corewheel::sleep_until(deadline).await;
                assert!(Instant::now() >= deadline);
                let start = Instant::now();
                corewheel::sleep(Duration::from_millis(i % 4)).await;
                assert!(start.elapsed() >= Duration::from_millis(i % 4));
            }
            let start = Instant::now();
            let stalled =
                corewheel::timeout(Duration::from_millis(5), std::future::pending::<()>());
            assert_eq!(stalled.await, Err(Elapsed));
            assert!(start.elapsed() >= Duration::from_millis(5));
            let fast = corewheel::timeout_at(Instant::now() + Duration::from_secs(5), async { 7 });
            assert_eq!(fast.await, Ok(7));
            let mut interval = corewheel::interval(Duration::from_millis(3));
            let mut last = interval.tick().await;
            for _ in 0..5 {
                let next = interval.tick().await;
                assert!(
                    next >= last + Duration::from_millis(3),
                    "ticks closer than a period"
                );
                assert!(Instant::now() >= next, "a tick before its deadline");
                last = next;
            }
            let start = Instant::now() + Duration::from_millis(4);
            let mut at = corewheel::interval_at(start, Duration::from_millis(2));
            assert_eq!(at.tick().await, start);
            assert!(Instant::now() >= start);
        });
    });
}

// ------------------------------------------------------------------ (7) Timeout edges

/// `Timeout` edges on a hand-driven engine: an inner sleep due at the same instant as the
/// timeout (the inner future is polled first, so `Ok`); an inner future that wakes itself
/// on every poll and never finishes (the timeout still elapses exactly at its deadline); an
/// inner future that panics (the timer is released when the `Timeout` is dropped);
/// `Duration::MAX` (never elapses, yields the output).
#[test]
fn timeout_edges_on_a_manual_clock() {
    let (engine, clock) = leaked_manual(1);
    let (wakes, waker) = Wakes::new();
    let deadline = engine.now() + Duration::from_millis(10);

    let mut same = engine.timeout_at(deadline, engine.sleep_until(deadline));
    assert!(poll(&mut same, &waker).is_pending());
    run_for(engine, &clock, 9);
    assert!(poll(&mut same, &waker).is_pending(), "early");
    run_for(engine, &clock, 1);
    assert_eq!(poll(&mut same, &waker), Poll::Ready(Ok(())), "inner first");
    drop(same);

    struct Busy;
    impl Future for Busy {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
    let start = engine.now();
    let mut busy = engine.timeout(Duration::from_millis(7), Busy);
    for ms in 0..7 {
        for _ in 0..3 {
            assert!(
                poll(&mut busy, &waker).is_pending(),
                "elapsed early at {ms} ms"
            );
        }
        run_for(engine, &clock, 1);
    }
    assert_eq!(engine.now() - start, Duration::from_millis(7));
    assert_eq!(poll(&mut busy, &waker), Poll::Ready(Err(Elapsed)));
    drop(busy);

    struct Bomb(bool);
    impl Future for Bomb {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            if self.0 {
                panic!("inner future failure");
            }
            self.0 = true;
            Poll::Pending
        }
    }
    let mut bomb = engine.timeout(Duration::from_millis(50), Bomb(false));
    assert!(poll(&mut bomb, &waker).is_pending());
    assert!(catch_unwind(AssertUnwindSafe(|| poll(&mut bomb, &waker))).is_err());
    drop(bomb);

    let mut forever = engine.timeout(Duration::MAX, std::future::pending::<()>());
    assert!(poll(&mut forever, &waker).is_pending());
    clock.advance(Duration::from_secs(86_400 * 365 * 100));
    engine.turn();
    assert!(
        poll(&mut forever, &waker).is_pending(),
        "a Duration::MAX timeout elapsed"
    );
    drop(forever);
    let before = wakes.count();
    run_for(engine, &clock, 100);
    assert_eq!(wakes.count(), before, "a dropped timeout woke its task");
    assert_eq!(engine.nodes_in_use(), 0);
}

// ----------------------------------------------------------------- (8) Interval edges

/// Intervals whose start is an hour before the engine's origin (negative deadlines), with
/// each missed-tick policy: Burst catches up every period exactly (start + n × period),
/// Delay and Skip tick once and then follow tokio's rule; then a gap of a day, and
/// `reset` in the middle of the catch-up.
#[test]
fn intervals_starting_before_the_engines_origin_follow_tokio() {
    for policy in [MissedTicks::Burst, MissedTicks::Delay, MissedTicks::Skip] {
        let real = Instant::now();
        let clock = ManualClock::starting_at(real);
        let engine = TimerEngine::builder()
            .workers(1)
            .manual_clock(clock.clone())
            .build()
            .unwrap();
        let waker = Waker::noop();
        let cx = &mut Context::from_waker(waker);
        let Some(start) = real.checked_sub(Duration::from_secs(3600)) else {
            return; // a platform whose Instant cannot go back an hour from here
        };
        let period = Duration::from_secs(60);
        let mut interval = engine.interval_at(start, period);
        interval.set_missed_tick_behavior(policy);
        let mut expected = start;
        let mut ticks = 0;
        while let Poll::Ready(due) = interval.poll_tick(cx) {
            assert_eq!(due, expected, "{policy:?}: tick {ticks}");
            assert!(due <= engine.now(), "{policy:?}: early");
            expected = tokio_next(policy, due, engine.now(), period);
            ticks += 1;
            assert!(ticks <= 62, "{policy:?}: runaway ticks");
        }
        match policy {
            MissedTicks::Burst => assert_eq!(ticks, 61, "an hour of minutes, and the start"),
            _ => assert_eq!(ticks, 1),
        }
        // A day passes; reset in the middle of a burst starts from now.
        clock.advance(Duration::from_secs(86_400));
        engine.turn();
        let mut burst = 0;
        while let Poll::Ready(due) = interval.poll_tick(cx) {
            assert_eq!(due, expected, "{policy:?}: after a day");
            expected = tokio_next(policy, due, engine.now(), period);
            burst += 1;
            if burst == 3 {
                interval.reset();
                expected = engine.now() + period;
                break;
            }
        }
        assert!(
            interval.poll_tick(cx).is_pending(),
            "{policy:?}: after reset"
        );
        clock.advance(period);
        engine.turn();
        assert_eq!(
            interval.poll_tick(cx),
            Poll::Ready(expected),
            "{policy:?}: a period on"
        );
        drop(interval);
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0);
    }
}

/// Degenerate periods after a huge gap: 1 ns with Delay and Skip must not become a busy
/// stream of ticks (one tick, then pending until the next engine tick), and
/// `Duration::MAX` with every policy ticks once and then never, even twenty years on.
#[test]
fn degenerate_periods_after_huge_gaps() {
    let (engine, clock) = leaked_manual(1);
    let waker = Waker::noop();
    let cx = &mut Context::from_waker(waker);
    for policy in [MissedTicks::Delay, MissedTicks::Skip] {
        let mut fine = engine.interval(Duration::from_nanos(1));
        fine.set_missed_tick_behavior(policy);
        assert!(fine.poll_tick(cx).is_ready());
        clock.advance(Duration::from_secs(3600));
        engine.turn();
        assert!(fine.poll_tick(cx).is_ready(), "{policy:?}: the missed tick");
        assert!(
            fine.poll_tick(cx).is_pending(),
            "{policy:?}: a stream of ticks"
        );
        clock.advance(MS);
        engine.turn();
        match fine.poll_tick(cx) {
            Poll::Ready(due) => assert!(due <= engine.now(), "{policy:?}: early"),
            Poll::Pending => panic!("{policy:?}: the 1 ns interval stopped"),
        }
    }
    for policy in [MissedTicks::Burst, MissedTicks::Delay, MissedTicks::Skip] {
        let mut huge = engine.interval(Duration::MAX);
        huge.set_missed_tick_behavior(policy);
        assert_eq!(huge.poll_tick(cx), Poll::Ready(engine.now()));
        clock.advance(Duration::from_secs(86_400 * 365 * 20));
        engine.turn();
        assert!(
            huge.poll_tick(cx).is_pending(),
            "{policy:?}: a second tick of a MAX period"
        );
        huge.reset_immediately();
        engine.turn();
        assert!(
            huge.poll_tick(cx).is_ready(),
            "{policy:?}: reset_immediately"
        );
        assert!(huge.poll_tick(cx).is_pending());
    }
}

/// A never-coming deadline (a `Duration::MAX` period) reads as "about 30 years on" in the
/// `Sleep`'s `deadline()`, and the `Sleep` never completes. An `Interval` left unpolled
/// from its first tick until a manual clock passes that reading used to compare the
/// reading with the clock, and tick at a deadline that was never meant to come.
#[test]
fn a_never_interval_stays_pending_past_thirty_years() {
    let (engine, clock) = leaked_manual(1);
    let cx = &mut Context::from_waker(Waker::noop());
    let mut huge = engine.interval(Duration::MAX);
    assert!(huge.poll_tick(cx).is_ready());
    let mut pushed = engine.interval(Duration::from_secs(1));
    assert!(pushed.poll_tick(cx).is_ready());
    pushed.reset_after(Duration::MAX);
    clock.advance(Duration::from_secs(86_400 * 366 * 31));
    engine.turn();
    let huge_tick = huge.poll_tick(cx);
    let pushed_tick = pushed.poll_tick(cx);
    assert!(
        huge_tick.is_pending() && pushed_tick.is_pending(),
        "never-deadlines ticked 31 years on: MAX period {huge_tick:?}, reset_after(MAX) {pushed_tick:?}"
    );
}

/// Documented: "Once its engine has shut down, no tick comes any more (`tick` stays
/// pending)". Polled again after the clock has passed the next deadline, does it?
#[test]
fn an_interval_after_shutdown_stays_pending_as_documented() {
    let (engine, clock) = leaked_manual(1);
    let waker = Waker::noop();
    let cx = &mut Context::from_waker(waker);
    let mut interval = engine.interval(Duration::from_millis(10));
    assert!(interval.poll_tick(cx).is_ready());
    assert!(interval.poll_tick(cx).is_pending());
    engine.shutdown(PendingTimers::Drop);
    assert!(interval.poll_tick(cx).is_pending());
    let mut ticks = 0;
    for _ in 0..5 {
        clock.advance(Duration::from_millis(10));
        if interval.poll_tick(cx).is_ready() {
            ticks += 1;
        }
    }
    assert_eq!(ticks, 0, "{ticks} ticks came after shutdown");
}

// ------------------------------------------------------------------------ (9) hyper

// Gated like `hyper_timer`: run with `--features hyper`.
#[cfg(feature = "hyper")]
mod hyper_attacks {
    use super::*;
    use corewheel::HyperTimer;
    use hyper::rt::Timer;

    type HyperSleep = Pin<Box<dyn hyper::rt::Sleep>>;

    fn hpoll(sleep: &mut HyperSleep, waker: &Waker) -> Poll<()> {
        sleep.as_mut().poll(&mut Context::from_waker(waker))
    }

    /// A sleep some other timer made, that says when it is dropped.
    struct Foreign(Arc<AtomicBool>);
    impl Future for Foreign {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            Poll::Pending
        }
    }
    impl hyper::rt::Sleep for Foreign {}
    impl Drop for Foreign {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// `HyperTimer::reset` with deadlines before the engine's origin (completes at the
    /// next poll), a thousand years on (never), then back (completes on
    /// time); a foreign sleep is dropped and replaced; a corewheel sleep of another engine
    /// stays on that engine; `sleep(Duration::MAX)` never completes.
    #[test]
    fn hyper_reset_with_odd_deadlines_and_sleeps() {
        let (engine, clock) = leaked_manual(1);
        let (other, other_clock) = leaked_manual(1);
        let timer = HyperTimer::new(engine);
        let (wakes, waker) = Wakes::new();

        let mut sleep = timer.sleep(Duration::from_secs(1));
        assert!(hpoll(&mut sleep, &waker).is_pending());
        let before_origin = timer.now().checked_sub(Duration::from_secs(3600));
        if let Some(past) = before_origin {
            timer.reset(&mut sleep, past);
            assert_eq!(
                hpoll(&mut sleep, &waker),
                Poll::Ready(()),
                "a past reset completes at the next poll"
            );
        }
        if let Some(far) = timer
            .now()
            .checked_add(Duration::from_secs(86_400 * 365 * 1000))
        {
            timer.reset(&mut sleep, far);
            assert!(hpoll(&mut sleep, &waker).is_pending());
            clock.advance(Duration::from_secs(86_400 * 365 * 100));
            engine.turn();
            assert!(
                hpoll(&mut sleep, &waker).is_pending(),
                "a 1000-year deadline came"
            );
        }
        let back = timer.now() + Duration::from_millis(5);
        timer.reset(&mut sleep, back);
        assert!(hpoll(&mut sleep, &waker).is_pending());
        run_for(engine, &clock, 4);
        assert!(hpoll(&mut sleep, &waker).is_pending(), "early");
        run_for(engine, &clock, 1);
        assert!(
            wakes.count() >= 1,
            "the reset-back sleep's task was not woken"
        );
        assert_eq!(hpoll(&mut sleep, &waker), Poll::Ready(()));
        drop(sleep);

        let dropped = Arc::new(AtomicBool::new(false));
        let mut foreign: HyperSleep = Box::pin(Foreign(Arc::clone(&dropped)));
        let at = timer.now() + Duration::from_millis(3);
        timer.reset(&mut foreign, at);
        assert!(dropped.load(Ordering::SeqCst), "the foreign sleep was kept");
        assert!(hpoll(&mut foreign, &waker).is_pending());
        run_for(engine, &clock, 3);
        assert_eq!(hpoll(&mut foreign, &waker), Poll::Ready(()));
        drop(foreign);

        let other_timer = HyperTimer::new(other);
        let mut theirs = other_timer.sleep(Duration::from_millis(50));
        assert!(hpoll(&mut theirs, &waker).is_pending());
        timer.reset(&mut theirs, other.now() + Duration::from_millis(2));
        run_for(engine, &clock, 10);
        assert!(
            hpoll(&mut theirs, &waker).is_pending(),
            "completed by the wrong engine"
        );
        for _ in 0..2 {
            other_clock.advance(MS);
            other.turn();
        }
        assert_eq!(
            hpoll(&mut theirs, &waker),
            Poll::Ready(()),
            "on its own engine"
        );
        drop(theirs);

        let mut never = timer.sleep(Duration::MAX);
        assert!(hpoll(&mut never, &waker).is_pending());
        clock.advance(Duration::from_secs(86_400 * 365 * 100));
        engine.turn();
        assert!(hpoll(&mut never, &waker).is_pending());
        drop(never);
        run_for(engine, &clock, 100);
        assert_eq!(engine.nodes_in_use(), 0);
        assert_eq!(other.nodes_in_use(), 0);
    }

    /// A `HyperTimer` whose engine has shut down: new sleeps complete at once (documented
    /// for a `Sleep` on a shut-down engine), a foreign sleep reset through it is replaced by
    /// one that completes at once, and resets of pending ones neither panic nor hang.
    #[test]
    fn hyper_timer_on_a_shut_down_engine() {
        let (engine, _clock) = leaked_manual(1);
        let timer = HyperTimer::new(engine);
        let (_wakes, waker) = Wakes::new();
        let mut pending = timer.sleep(Duration::from_secs(60));
        assert!(hpoll(&mut pending, &waker).is_pending());
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(hpoll(&mut pending, &waker), Poll::Ready(()));
        timer.reset(&mut pending, timer.now() + Duration::from_secs(5));
        assert_eq!(hpoll(&mut pending, &waker), Poll::Ready(()));
        let mut fresh = timer.sleep_until(timer.now() + Duration::from_secs(5));
        assert_eq!(hpoll(&mut fresh, &waker), Poll::Ready(()));
        let mut foreign: HyperSleep = Box::pin(Foreign(Arc::new(AtomicBool::new(false))));
        timer.reset(&mut foreign, timer.now() + Duration::from_secs(5));
        assert_eq!(hpoll(&mut foreign, &waker), Poll::Ready(()));
        assert_eq!(engine.nodes_in_use(), 0);
    }
}
