//! `Sleep`, `Timeout`, `Interval` and the engine's waker-timer protocol under misuse. Each
//! test says what it tries; those that check a fault since fixed say what the fault was,
//! and one marked open records an engine limit that only a manual clock reaches.
//!
//! Real-clock tests assert only what holds on a loaded 2-core machine: never early, exactly
//! once, nothing lost, with generous time limits.

use crate::support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Wake, Waker};
use std::time::{Duration, Instant};

use crate::support::{Wakes, leaked_unpinned, manual, poll, within};
use corewheel::{Elapsed, Interval, MissedTicks, PendingTimers, Sleep, Timeout, TimerEngine};

const MS: Duration = Duration::from_millis(1);
const LIMIT: Duration = Duration::from_secs(60);

fn leaked_manual(workers: usize) -> (&'static TimerEngine, corewheel::ManualClock) {
    let (engine, clock) = manual(workers);
    (Box::leak(Box::new(engine)), clock)
}

/// Waits (bounded) until `flag` is set; `false` if it never was.
fn wait_for(flag: &AtomicBool, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while !flag.load(Ordering::SeqCst) {
        if Instant::now() > until {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    true
}

/// Polls `future` once, from inside a task.
async fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *future).poll(cx))).await
}

/// Runs the ignored test `name` in a child process (its body runs only there), killing it
/// after `limit`: `None` if it had to be killed (it hung).
fn run_child(name: &str, limit: Duration) -> Option<std::process::ExitStatus> {
    let exe = std::env::current_exe().expect("the test binary");
    // The test's full name in its binary: this module's path without the crate's name.
    let module = module_path!()
        .split_once("::")
        .map_or("", |(_, module)| module);
    let name = format!("{module}::{name}");
    let mut child = std::process::Command::new(exe)
        .args(["--exact", &name, "--ignored", "--test-threads=1"])
        .env("CHILD_PROCESS_TEST", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the child");
    let until = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("waitable") {
            return Some(status);
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn describe(status: Option<std::process::ExitStatus>) -> String {
    match status {
        None => "hung (killed)".to_string(),
        Some(s) if s.code() == Some(3) => "deadlocked: the wake never returned".to_string(),
        Some(s) => format!("the child exited: {s}"),
    }
}

/// The latest `Instant` reachable from `from` by `checked_add`.
fn end_of_instant(from: Instant) -> Instant {
    let mut at = from;
    let mut step = Duration::from_secs(1 << 62);
    while step > Duration::ZERO {
        if let Some(next) = at.checked_add(step) {
            at = next;
        } else {
            step /= 2;
        }
    }
    at
}

// ---------------------------------------------------------------------------------------
// Faults since fixed, each with its check (one marked open is not fixed)
// ---------------------------------------------------------------------------------------

/// Fixed (deadlock in `Sleep::drop`): a drop that finds the wake under way on a worker
/// spins until that wake ends (`retire_waker`), so a wake that needs anything the
/// dropping thread holds deadlocks. Here the waker's `wake` takes a mutex (as an executor
/// pushing onto a locked run queue does) and the task's thread drops the `Sleep` while
/// holding it. tokio's `Sleep::drop` never waits for a waker's code. The wake here gives up
/// after 3 s so that the test ends; without that it would never return.
#[test]
fn drop_holding_a_lock_the_wake_needs_deadlocks() {
    static QUEUE: Mutex<Vec<u32>> = Mutex::new(Vec::new());
    static ENTERED: AtomicBool = AtomicBool::new(false);
    static GAVE_UP: AtomicBool = AtomicBool::new(false);
    struct Queued;
    impl Wake for Queued {
        fn wake(self: Arc<Self>) {
            ENTERED.store(true, Ordering::SeqCst);
            let until = Instant::now() + Duration::from_secs(3);
            loop {
                if let Ok(mut queue) = QUEUE.try_lock() {
                    queue.push(1);
                    return;
                }
                if Instant::now() > until {
                    GAVE_UP.store(true, Ordering::SeqCst);
                    return;
                }
                std::thread::sleep(MS);
            }
        }
    }
    let engine = leaked_unpinned(1);
    within(LIMIT, "the dropping thread", move || {
        let waker = Waker::from(Arc::new(Queued));
        let mut sleep = engine.sleep(MS);
        let queue = QUEUE.lock().expect("unpoisoned");
        assert!(poll(&mut sleep, &waker).is_pending());
        assert!(wait_for(&ENTERED, Duration::from_secs(20)), "never woken");
        // The task's thread, holding its queue, drops the sleep (e.g. cancels the task).
        let dropped = Instant::now();
        drop(sleep);
        let took = dropped.elapsed();
        drop(queue);
        assert!(
            !GAVE_UP.load(Ordering::SeqCst),
            "Sleep::drop waited {took:?} for a wake that waits for the dropping thread: \
             deadlock (broken only by the wake's own 3 s limit)"
        );
    });
}

/// Fixed (lost wake-up): a `Sleep` reset by a thread other than the one waiting on it
/// (an idle timeout shared behind a lock, pushed back by readers and awaited by a
/// watchdog task), between the fire's claim and its wake, defuses the wake: the waiting
/// task is never woken, and since its new timer is armed only by a poll that never comes,
/// it waits for ever. tokio's fire wakes the task whatever a later reset does. Both
/// orders of the reset and the wake within one run are tried; the manual engine makes it
/// exact.
#[test]
fn reset_from_another_task_between_claim_and_wake_loses_the_wake() {
    let (engine, clock) = leaked_manual(1);
    let mut lost = Vec::new();
    for order in 0..2 {
        let slot: Arc<Mutex<Option<Sleep<'static>>>> = Arc::new(Mutex::new(None));
        let deadline = engine.now() + 10 * MS;
        let (wakes, waker) = Wakes::waker();
        let reader = {
            let slot = Arc::clone(&slot);
            move || {
                // A read arrived: push the idle deadline back.
                if let Some(sleep) = slot.lock().expect("unpoisoned").as_mut() {
                    sleep.reset(engine.now() + 10 * MS);
                }
            }
        };
        let mut reader = Some(reader);
        if order == 0 {
            engine
                .schedule_at(deadline, reader.take().unwrap())
                .unwrap();
        }
        let mut sleep = engine.sleep_until(deadline);
        assert!(poll(&mut sleep, &waker).is_pending());
        *slot.lock().unwrap() = Some(sleep);
        if let Some(reader) = reader {
            engine.schedule_at(deadline, reader).unwrap();
        }
        clock.advance(10 * MS);
        engine.turn();
        for _ in 0..50 {
            clock.advance(MS);
            engine.turn();
        }
        // 60 ms on: both the first deadline and the pushed-back one (20 ms) have passed.
        if wakes.count() == 0 {
            lost.push(order);
        }
        slot.lock().unwrap().take();
    }
    assert!(
        lost.is_empty(),
        "orders {lost:?}: the waiting task was never woken, 50 ms after its pushed-back \
         deadline"
    );
}

/// Fixed (early ticks, busy loop): after its engine shuts down, an `Interval` ticks at
/// once on every poll, each tick returning a deadline still in the future: `loop {
/// interval.tick().await; .. }` becomes a hot loop of early ticks. The `Interval` docs say
/// nothing of shutdown (only `Sleep`'s do); tokio's interval never ticks early.
#[test]
fn an_interval_after_shutdown_ticks_early_for_ever() {
    let (engine, _clock) = manual(1);
    let waker = Waker::noop();
    let start = engine.now();
    let mut interval = engine.interval(Duration::from_secs(10));
    assert_eq!(
        interval.poll_tick(&mut Context::from_waker(waker)),
        Poll::Ready(start)
    );
    assert!(
        interval
            .poll_tick(&mut Context::from_waker(waker))
            .is_pending()
    );
    engine.shutdown(PendingTimers::Drop);
    let mut early = Vec::new();
    for _ in 0..5 {
        if let Poll::Ready(due) = interval.poll_tick(&mut Context::from_waker(waker)) {
            if due > engine.now() {
                early.push(due - engine.now());
            }
        }
    }
    assert!(
        early.is_empty(),
        "ticks returned before their deadlines, at once, after shutdown: {early:?} early"
    );
}

/// Fixed: `Timeout`'s docs promised "never before" the deadline, yet a
/// shutdown completes it. Now documented: on an engine that has shut down (before or while
/// it waits) a `Timeout` yields `Err(Elapsed)` at once, as its `Sleep` completes.
#[test]
fn a_timeout_on_a_shut_down_engine_elapses_at_once_as_documented() {
    let (engine, _clock) = manual(1);
    let waker = Waker::noop();
    let mut waiting = engine.timeout(Duration::from_secs(30), std::future::pending::<()>());
    assert!(poll(&mut waiting, waker).is_pending());
    engine.shutdown(PendingTimers::Drop);
    assert_eq!(
        poll(&mut waiting, waker),
        Poll::Ready(Err(corewheel::Elapsed))
    );
    let mut late_comer = engine.timeout(Duration::from_secs(30), std::future::pending::<()>());
    assert_eq!(
        poll(&mut late_comer, waker),
        Poll::Ready(Err(corewheel::Elapsed))
    );
}

/// Fixed (deadlock, two workers): two tasks woken inline by their wakers (an executor
/// that runs a task in `wake`), each cancelling the other's sleep, due together on two
/// shards: each worker's drop waits for the other worker's wake, which is waiting in its
/// own drop. Run in a child process, as the two workers never come back.
#[test]
fn cross_dropping_inline_wakes_on_two_workers_deadlock() {
    let status = run_child("cross_dropping_child", Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "two sleeps dropped from inside each other's wakes on two workers: {}",
        describe(status)
    );
}

/// The child of `cross_dropping_inline_wakes_on_two_workers_deadlock`.
#[test]
#[ignore = "run by cross_dropping_inline_wakes_on_two_workers_deadlock in a child process"]
fn cross_dropping_child() {
    if std::env::var_os("CHILD_PROCESS_TEST").is_none() {
        return;
    }
    static SLOTS: [Mutex<Option<Sleep<'static>>>; 2] = [Mutex::new(None), Mutex::new(None)];
    static ENTERED: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];
    static IN_WAKE: AtomicUsize = AtomicUsize::new(0);
    struct Inline(usize);
    impl Wake for Inline {
        fn wake(self: Arc<Self>) {
            let me = self.0;
            IN_WAKE.fetch_add(1, Ordering::SeqCst);
            ENTERED[me].store(true, Ordering::SeqCst);
            // The task runs inline; give the other wake a moment to begin too.
            wait_for(&ENTERED[1 - me], Duration::from_millis(500));
            let other = SLOTS[1 - me].lock().unwrap().take();
            drop(other);
            SLOTS[me].lock().unwrap().take();
            IN_WAKE.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let engine = leaked_unpinned(2);
    for round in 0..20 {
        for e in &ENTERED {
            e.store(false, Ordering::SeqCst);
        }
        let deadline = Instant::now() + 20 * MS;
        // Armed from two new threads, which take different home shards.
        let arms: Vec<_> = (0..2)
            .map(|i| {
                std::thread::spawn(move || {
                    let waker = Waker::from(Arc::new(Inline(i)));
                    let mut sleep = engine.sleep_until(deadline);
                    // A thread that starts after the deadline (a loaded machine) finds
                    // its sleep complete at this poll: nothing to race in that round.
                    if poll(&mut sleep, &waker).is_pending() {
                        *SLOTS[i].lock().unwrap() = Some(sleep);
                    }
                })
            })
            .collect();
        for arm in arms {
            arm.join().unwrap();
        }
        let until = Instant::now() + Duration::from_secs(20);
        while SLOTS.iter().any(|s| s.lock().unwrap().is_some())
            || IN_WAKE.load(Ordering::SeqCst) > 0
        {
            if Instant::now() > until {
                // Exit status 3: wakes stuck in each other's drops.
                eprintln!(
                    "round {round}: {} wakes stuck",
                    IN_WAKE.load(Ordering::SeqCst)
                );
                std::process::exit(3);
            }
            std::thread::sleep(MS);
        }
    }
}

/// Fixed (self-deadlock of a worker): `Sleep` records the identity of `cx.waker()`, but
/// the node holds `cx.waker().clone()`, and a clone may carry another data pointer (a
/// waker that boxes its state on clone is within `RawWakerVTable`'s contract). A wake
/// that runs its task inline, which drops the `Sleep`, then fails `is_under_way_here`
/// (it compares the `Sleep`'s recorded pointer with the clone's) and spins for ever on the
/// worker waiting for its own wake. Run in a child process.
#[test]
fn inline_wake_of_a_clone_with_another_data_pointer_deadlocks_its_worker() {
    let status = run_child("boxed_clone_child", Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| s.success()),
        "a task run inline by its wake dropped its Sleep: {}",
        describe(status)
    );
}

/// The child of `inline_wake_of_a_clone_with_another_data_pointer_deadlocks_its_worker`.
#[test]
#[ignore = "run by inline_wake_of_a_clone_with_another_data_pointer_deadlocks_its_worker"]
fn boxed_clone_child() {
    if std::env::var_os("CHILD_PROCESS_TEST").is_none() {
        return;
    }
    static SLOT: Mutex<Option<Sleep<'static>>> = Mutex::new(None);
    static DONE: AtomicBool = AtomicBool::new(false);
    /// Each waker value is its own box (so each clone has a new data pointer).
    #[allow(dead_code)]
    struct Boxed(u64);
    fn raw() -> RawWaker {
        RawWaker::new(Box::into_raw(Box::new(Boxed(7))).cast(), &VTABLE)
    }
    unsafe fn clone(_: *const ()) -> RawWaker {
        raw()
    }
    unsafe fn wake(data: *const ()) {
        // SAFETY: `data` is a box of this vtable.
        unsafe {
            wake_by_ref(data);
            drop_waker(data);
        }
    }
    unsafe fn wake_by_ref(_: *const ()) {
        // The executor runs the task inline: it finishes, dropping its sleep.
        let sleep = SLOT.lock().unwrap().take();
        drop(sleep);
        DONE.store(true, Ordering::SeqCst);
    }
    unsafe fn drop_waker(data: *const ()) {
        // SAFETY: `data` is a box of this vtable, dropped once.
        drop(unsafe { Box::from_raw(data.cast_mut().cast::<Boxed>()) });
    }
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake_by_ref, drop_waker);
    let engine = leaked_unpinned(1);
    // SAFETY: as above.
    let waker = unsafe { Waker::from_raw(raw()) };
    let mut sleep = engine.sleep(MS);
    assert!(poll(&mut sleep, &waker).is_pending());
    *SLOT.lock().unwrap() = Some(sleep);
    if !wait_for(&DONE, Duration::from_secs(15)) {
        // Exit status 3: the worker is stuck in the drop, waiting for its own wake.
        std::process::exit(3);
    }
}

// ---------------------------------------------------------------------------------------
// Attacks that held
// ---------------------------------------------------------------------------------------

/// The documented size and auto traits.
#[test]
fn sleep_is_56_bytes_unpin_send_and_sync() {
    fn traits<T: Unpin + Send + Sync>() {}
    traits::<Sleep<'static>>();
    traits::<Interval<'static>>();
    traits::<Timeout<'static, std::future::Ready<()>>>();
    if cfg!(target_pointer_width = "64") {
        assert_eq!(size_of::<Sleep<'static>>(), 56);
    }
}

/// Bad input never panics: the ends of `Duration` and `Instant`, zero and huge periods,
/// intervals at the end of time, deadlines in the past, resets to all of them.
#[test]
fn bad_input_never_panics_and_far_deadlines_stay_pending() {
    let (engine, clock) = manual(2);
    let (wakes, waker) = Wakes::waker();
    let now = engine.now();
    let end = end_of_instant(now);
    let past = now.checked_sub(Duration::from_secs(3600)).unwrap_or(now);

    let mut forever = engine.sleep(Duration::MAX);
    let mut at_end = engine.sleep_until(end);
    let mut in_past = engine.sleep_until(past);
    let mut timeout_max = engine.timeout(Duration::MAX, std::future::pending::<()>());
    let mut zero = engine.interval(Duration::ZERO);
    let mut huge = engine.interval(Duration::MAX);
    let mut ends = engine.interval_at(end, Duration::MAX);
    let mut ends_zero = engine.interval_at(end, Duration::ZERO);
    let mut skip = engine.interval_at(past, Duration::from_nanos(1));
    skip.set_missed_tick_behavior(MissedTicks::Skip);
    let mut delay = engine.interval_at(past, Duration::MAX);
    delay.set_missed_tick_behavior(MissedTicks::Delay);
    let cx = &mut Context::from_waker(&waker);

    assert!(poll(&mut forever, &waker).is_pending());
    assert!(poll(&mut at_end, &waker).is_pending());
    assert!(
        poll(&mut in_past, &waker).is_ready(),
        "a past deadline completes at its first poll"
    );
    assert!(poll(&mut timeout_max, &waker).is_pending());
    assert_eq!(zero.period(), engine.tick());
    assert!(zero.poll_tick(cx).is_ready(), "first tick at once");
    assert!(huge.poll_tick(cx).is_ready(), "first tick at once");
    assert!(
        huge.poll_tick(cx).is_pending(),
        "the next is past the end of Instant"
    );
    assert!(ends.poll_tick(cx).is_pending());
    assert!(ends_zero.poll_tick(cx).is_pending());
    assert!(skip.poll_tick(cx).is_ready());
    assert!(delay.poll_tick(cx).is_ready());
    assert!(delay.poll_tick(cx).is_pending());

    for step in [MS, Duration::from_secs(86_400 * 365 * 100)] {
        clock.advance(step);
        engine.turn();
        assert!(poll(&mut in_past, &waker).is_ready());
        assert!(poll(&mut forever, &waker).is_pending());
        assert!(poll(&mut at_end, &waker).is_pending());
        assert!(poll(&mut timeout_max, &waker).is_pending());
        assert!(huge.poll_tick(cx).is_pending());
        assert!(ends.poll_tick(cx).is_pending());
        assert!(ends_zero.poll_tick(cx).is_pending());
        let _ = zero.poll_tick(cx);
        let _ = skip.poll_tick(cx);
    }
    // Resets to the ends.
    forever.reset(end);
    at_end.reset(past);
    in_past.reset(end);
    zero.reset_at(end);
    zero.reset_after(Duration::MAX);
    huge.reset_immediately();
    // The manual clock sits on a tick boundary, so a reset to now has been reached and
    // completes at the next poll (off a boundary it waits for the tick, as tokio rounds up).
    assert!(huge.poll_tick(cx).is_ready());
    assert!(huge.poll_tick(cx).is_pending());
    clock.advance(MS);
    engine.turn();
    assert!(poll(&mut at_end, &waker).is_ready());
    assert!(poll(&mut forever, &waker).is_pending());
    assert!(poll(&mut in_past, &waker).is_pending());
    assert!(zero.poll_tick(cx).is_pending());
    let _ = wakes.count();
    drop((
        forever,
        at_end,
        in_past,
        timeout_max,
        zero,
        huge,
        ends,
        ends_zero,
        skip,
        delay,
    ));
    engine.shutdown(PendingTimers::Drop);
    assert_eq!(engine.nodes_in_use(), 0);
    assert_eq!(Arc::strong_count(&wakes), 2, "every clone released");
}

/// A wake that panics is contained; the sleep completes on its next poll, its drop
/// returns, and the node goes back.
#[test]
fn a_panicking_wake_is_contained() {
    struct Panics(AtomicUsize);
    impl Wake for Panics {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
            panic!("a wake that panics");
        }
    }
    let engine = leaked_unpinned(1);
    within(LIMIT, "panicking wakes", move || {
        let panics = Arc::new(Panics(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&panics));
        for _ in 0..20 {
            let before = panics.0.load(Ordering::SeqCst);
            let mut sleep = engine.sleep(MS);
            assert!(poll(&mut sleep, &waker).is_pending());
            let until = Instant::now() + Duration::from_secs(20);
            while panics.0.load(Ordering::SeqCst) == before {
                assert!(Instant::now() < until, "never woken");
                std::thread::sleep(MS);
            }
            while poll(&mut sleep, &waker).is_pending() {
                assert!(Instant::now() < until, "never completed");
                std::thread::yield_now();
            }
            drop(sleep);
        }
        // A run's counts are added when the run ends, after its wakes: the last one may
        // still be settling when its wake has been seen.
        let until = Instant::now() + Duration::from_secs(20);
        while engine.stats().total.panicked < 20 {
            assert!(Instant::now() < until, "panics not counted");
            std::thread::sleep(MS);
        }
        drop(waker);
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0);
        assert_eq!(Arc::strong_count(&panics), 1);
    });
}

/// A waker whose `wake` runs its task inline on the worker, which polls its `Sleep`
/// (ready), drops it, and sleeps again from the worker thread: no deadlock, no early
/// completion, and everything goes back.
#[test]
fn an_inline_wake_that_drops_and_rearms_its_sleep_on_the_worker() {
    static SLOT: Mutex<Option<Sleep<'static>>> = Mutex::new(None);
    static ROUNDS: AtomicUsize = AtomicUsize::new(0);
    static EARLY: AtomicBool = AtomicBool::new(false);
    struct Inline;
    impl Wake for Inline {
        fn wake(self: Arc<Self>) {
            let waker = Waker::from(Arc::clone(&self));
            let mut slot = SLOT.lock().unwrap();
            let Some(mut sleep) = slot.take() else { return };
            match poll(&mut sleep, &waker) {
                Poll::Ready(()) => {
                    if Instant::now() < sleep.deadline() {
                        EARLY.store(true, Ordering::SeqCst);
                    }
                    let engine = sleep_engine();
                    drop(sleep);
                    if ROUNDS.fetch_add(1, Ordering::SeqCst) < 200 {
                        // Alternate: a new sleep, or an old one reset (in place or not).
                        let mut next = engine.sleep(Duration::from_micros(300));
                        assert!(poll(&mut next, &waker).is_pending());
                        next.reset(Instant::now() + Duration::from_micros(500));
                        *slot = Some(next);
                    }
                }
                Poll::Pending => *slot = Some(sleep),
            }
        }
    }
    static ENGINE: std::sync::OnceLock<&'static TimerEngine> = std::sync::OnceLock::new();
    fn sleep_engine() -> &'static TimerEngine {
        ENGINE.get().unwrap()
    }
    let engine = *ENGINE.get_or_init(|| leaked_unpinned(2));
    within(LIMIT, "inline wakes", move || {
        let waker = Waker::from(Arc::new(Inline));
        let mut sleep = engine.sleep(MS);
        assert!(poll(&mut sleep, &waker).is_pending());
        *SLOT.lock().unwrap() = Some(sleep);
        let until = Instant::now() + Duration::from_secs(40);
        while ROUNDS.load(Ordering::SeqCst) <= 200 {
            assert!(
                Instant::now() < until,
                "lost: {} rounds",
                ROUNDS.load(Ordering::SeqCst)
            );
            std::thread::sleep(MS);
        }
        assert!(!EARLY.load(Ordering::SeqCst), "completed early");
        assert!(SLOT.lock().unwrap().is_none());
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0);
    });
}

/// Sleeps dropped from inside engine callbacks on the workers, as their timers fire on
/// the same or the other worker: no deadlock, and no sleep woken twice.
#[test]
fn sleeps_dropped_inside_engine_callbacks_as_they_fire() {
    struct Watched {
        dropped: AtomicBool,
        wakes: AtomicUsize,
    }
    impl Wake for Watched {
        fn wake(self: Arc<Self>) {
            std::thread::sleep(Duration::from_micros(50));
            self.wakes.fetch_add(1, Ordering::SeqCst);
        }
    }
    let engine = leaked_unpinned(2);
    within(LIMIT, "callbacks dropping sleeps", move || {
        let done = Arc::new(AtomicUsize::new(0));
        let mut watched = Vec::new();
        for i in 0..400_u64 {
            let w = Arc::new(Watched {
                dropped: AtomicBool::new(false),
                wakes: AtomicUsize::new(0),
            });
            let waker = Waker::from(Arc::clone(&w));
            let deadline = Instant::now() + Duration::from_micros(200 + i % 7 * 150);
            let mut sleep = engine.sleep_until(deadline);
            assert!(poll(&mut sleep, &waker).is_pending());
            let (w2, done2) = (Arc::clone(&w), Arc::clone(&done));
            let mut sleep = Some(sleep);
            engine
                .schedule_at(deadline, move || {
                    drop(sleep.take());
                    w2.dropped.store(true, Ordering::SeqCst);
                    done2.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
            watched.push(w);
            if i % 50 == 0 {
                std::thread::sleep(MS);
            }
        }
        let until = Instant::now() + Duration::from_secs(40);
        while done.load(Ordering::SeqCst) < 400 {
            assert!(Instant::now() < until, "callbacks never ran");
            std::thread::sleep(MS);
        }
        assert!(watched.iter().all(|w| w.dropped.load(Ordering::SeqCst)));
        assert!(
            !watched.iter().any(|w| w.wakes.load(Ordering::SeqCst) > 1),
            "a sleep was woken twice"
        );
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0);
        assert!(watched.iter().all(|w| Arc::strong_count(w) == 1));
    });
}

/// A waker whose clone and drop call into the engine (a nested turn, a new sleep armed,
/// polled and dropped), on a hand-driven engine where the drop runs inside the turn that
/// frees the node, with the wheel held.
#[test]
fn a_waker_whose_clone_and_drop_call_into_the_engine() {
    struct Hook {
        engine: &'static TimerEngine,
        depth: AtomicUsize,
    }
    impl Hook {
        fn reenter(&self) {
            if self.depth.fetch_add(1, Ordering::SeqCst) == 0 {
                let _ = self.engine.turn();
                let mut inner = self.engine.sleep(MS);
                let _ = poll(&mut inner, Waker::noop());
                inner.reset(self.engine.now() + 2 * MS);
                drop(inner);
            }
            self.depth.fetch_sub(1, Ordering::SeqCst);
        }
    }
    fn raw(hook: *const Hook) -> RawWaker {
        RawWaker::new(hook.cast(), &VTABLE)
    }
    unsafe fn clone(data: *const ()) -> RawWaker {
        let hook = data.cast::<Hook>();
        // SAFETY: `data` came from `Arc::into_raw`.
        unsafe {
            Arc::increment_strong_count(hook);
            (*hook).reenter();
        }
        raw(hook)
    }
    unsafe fn wake(data: *const ()) {
        // SAFETY: as above; this consumes one count.
        unsafe {
            wake_by_ref(data);
            drop_waker(data);
        }
    }
    unsafe fn wake_by_ref(data: *const ()) {
        // SAFETY: as above.
        unsafe { (*data.cast::<Hook>()).reenter() };
    }
    unsafe fn drop_waker(data: *const ()) {
        let hook = data.cast::<Hook>();
        // SAFETY: as above.
        unsafe {
            (*hook).reenter();
            Arc::decrement_strong_count(hook);
        }
    }
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake_by_ref, drop_waker);
    let (engine, clock) = leaked_manual(2);
    let hook = Arc::new(Hook {
        engine,
        depth: AtomicUsize::new(0),
    });
    within(LIMIT, "re-entrant wakers", move || {
        // SAFETY: the vtable matches an `Arc<Hook>` pointer.
        let waker = unsafe { Waker::from_raw(raw(Arc::into_raw(Arc::clone(&hook)))) };
        let other = unsafe { Waker::from_raw(raw(Arc::into_raw(Arc::clone(&hook)))) };
        for i in 0..100_u32 {
            let mut sleep = engine.sleep(MS * (i % 3));
            assert!(poll(&mut sleep, &waker).is_pending());
            assert!(poll(&mut sleep, &other).is_pending(), "waker replaced");
            if i % 4 == 0 {
                drop(sleep);
                clock.advance(MS);
                engine.turn();
                continue;
            }
            sleep.reset(engine.now() + MS * (i % 5));
            clock.advance(MS * 5);
            engine.turn();
            assert!(poll(&mut sleep, &waker).is_ready());
        }
        drop((waker, other));
        for _ in 0..5 {
            clock.advance(MS);
            engine.turn();
        }
        engine.shutdown(PendingTimers::Run);
        assert_eq!(engine.nodes_in_use(), 0);
        assert_eq!(Arc::strong_count(&hook), 1, "every waker clone released");
    });
}

/// Wakers of dropped, reset, replaced, fired and shut-down sleeps are all released; every
/// node goes back.
#[test]
fn every_waker_clone_is_released_and_every_node_returns() {
    let (engine, clock) = manual(2);
    let wakers: Vec<(Arc<Wakes>, Waker)> = (0..4).map(|_| Wakes::waker()).collect();
    let mut kept = Vec::new();
    for i in 0..400_usize {
        let (a, b) = (&wakers[i % 4].1, &wakers[(i + 1) % 4].1);
        let mut sleep = engine.sleep(MS * (i as u32 % 7));
        assert!(poll(&mut sleep, a).is_pending());
        match i % 6 {
            0 => drop(sleep),
            1 => {
                let _ = poll(&mut sleep, b);
                sleep.reset(engine.now() + 3 * MS);
                kept.push(sleep);
            }
            2 => {
                let mut t = engine.timeout(MS * (i as u32 % 4), std::future::pending::<()>());
                let _ = poll(&mut t, b);
                kept.push(sleep);
                drop(t);
            }
            3 => {
                let mut iv = engine.interval(MS * (i as u32 % 3));
                let cx = &mut Context::from_waker(b);
                let _ = iv.poll_tick(cx);
                let _ = iv.poll_tick(cx);
                drop(iv);
                kept.push(sleep);
            }
            4 => {
                sleep.reset(engine.now() + Duration::from_secs(3600));
                kept.push(sleep);
            }
            _ => kept.push(sleep),
        }
        if i % 10 == 0 {
            clock.advance(MS);
            engine.turn();
            kept.retain_mut(|s| poll(s, a).is_pending());
        }
    }
    for _ in 0..10 {
        clock.advance(MS);
        engine.turn();
    }
    let report = engine.shutdown(PendingTimers::Drop);
    assert!(report.ran > 0, "pending sleeps are woken at shutdown");
    for sleep in &mut kept {
        assert!(
            poll(sleep, &wakers[0].1).is_ready(),
            "completed by shutdown"
        );
    }
    drop(kept);
    assert_eq!(engine.nodes_in_use(), 0);
    for (wakes, _) in &wakers {
        assert_eq!(
            Arc::strong_count(wakes),
            2,
            "a waker clone was never released"
        );
    }
}

/// The pool full: a sleep neither completes nor leaks its waker, and arms once room comes.
#[test]
fn a_full_pool_neither_completes_a_sleep_early_nor_leaks() {
    let clock = corewheel::ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(1)
        .capacity(1024)
        .manual_clock(clock.clone())
        .build()
        .unwrap();
    let mut handles = Vec::new();
    while let Ok(handle) = engine.schedule(Duration::from_secs(60), || {}) {
        handles.push(handle);
    }
    let (wakes, waker) = Wakes::waker();
    let mut sleep = engine.sleep(Duration::from_secs(1));
    for _ in 0..3 {
        assert!(poll(&mut sleep, &waker).is_pending());
    }
    assert_eq!(wakes.count(), 3, "woken to poll again");
    assert_eq!(Arc::strong_count(&wakes), 2, "no clone kept");
    for handle in handles.drain(..) {
        engine.cancel(handle);
    }
    // Cancelled nodes go back to the pool within a few ticks.
    let mut turns = 0;
    loop {
        clock.advance(MS);
        engine.turn();
        let before = wakes.count();
        assert!(poll(&mut sleep, &waker).is_pending(), "never early");
        if wakes.count() == before {
            break;
        }
        turns += 1;
        assert!(turns < 500, "the pool never had room again");
    }
    eprintln!("armed after {turns} more ticks");
    while engine.now() < sleep.deadline() {
        assert!(poll(&mut sleep, &waker).is_pending(), "never early");
        clock.advance(MS);
        engine.turn();
    }
    clock.advance(MS);
    engine.turn();
    assert!(poll(&mut sleep, &waker).is_ready());
    drop(sleep);
    engine.shutdown(PendingTimers::Drop);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Real clock, several threads, `futures::executor::block_on`: sleeps, resets (later and
/// earlier), timeouts and interval ticks, each never early and never lost.
#[test]
fn real_clock_sleeps_resets_timeouts_and_ticks_are_never_early_or_lost() {
    let engine = leaked_unpinned(2);
    within(LIMIT, "real-clock workers", move || {
        let threads: Vec<_> = (0..4_u64)
            .map(|t| {
                std::thread::spawn(move || {
                    futures::executor::block_on(async move {
                        for i in 0..150_u64 {
                            let mut sleep =
                                engine.sleep(Duration::from_micros((i * 53 + t) % 3000));
                            if i % 3 == 0 {
                                // Polled, then pushed back, then brought forward.
                                let _ = poll_once(&mut sleep).await;
                                sleep.reset(Instant::now() + Duration::from_micros(2500));
                                let _ = poll_once(&mut sleep).await;
                                sleep.reset(Instant::now() + Duration::from_micros(700));
                            }
                            let deadline = sleep.deadline();
                            (&mut sleep).await;
                            assert!(Instant::now() >= deadline, "sleep completed early");
                            assert!(sleep.is_elapsed());

                            let deadline = Instant::now() + Duration::from_micros(i % 2000);
                            let out = engine
                                .timeout_at(deadline, std::future::pending::<()>())
                                .await;
                            assert_eq!(out, Err(Elapsed));
                            assert!(Instant::now() >= deadline, "timeout elapsed early");
                        }
                        let mut interval = engine.interval(Duration::from_micros(700));
                        interval.set_missed_tick_behavior(match t % 3 {
                            0 => MissedTicks::Burst,
                            1 => MissedTicks::Delay,
                            _ => MissedTicks::Skip,
                        });
                        let mut last = None;
                        for _ in 0..100 {
                            let due = interval.tick().await;
                            assert!(Instant::now() >= due, "tick early");
                            if let Some(last) = last {
                                assert!(due > last, "ticks go forward");
                            }
                            last = Some(due);
                        }
                    });
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("a worker thread failed");
        }
    });
}

/// Use after shutdown, from a `'static` (leaked) engine: new sleeps complete at once (as
/// documented), drops of old ones return, nothing panics.
#[test]
fn sleeps_on_a_shut_down_static_engine() {
    let engine = leaked_unpinned(2);
    within(LIMIT, "use after shutdown", move || {
        let (wakes, waker) = Wakes::waker();
        let mut pending: Vec<_> = (0..100).map(|i| engine.sleep(MS * (i + 50))).collect();
        for s in &mut pending {
            assert!(poll(s, &waker).is_pending());
        }
        let handle = std::thread::spawn(move || engine.shutdown(PendingTimers::Drop));
        let _ = handle.join();
        for s in &mut pending {
            assert!(
                poll(s, &waker).is_ready(),
                "woken and completed at shutdown"
            );
        }
        assert!(wakes.count() >= 100);
        let mut late = engine.sleep(Duration::from_secs(5));
        assert!(poll(&mut late, &waker).is_ready());
        late.reset(engine.now() + Duration::from_secs(5));
        let _ = poll(&mut late, &waker);
        drop(pending);
        drop(late);
        assert_eq!(engine.nodes_in_use(), 0);
        drop(waker);
        assert_eq!(Arc::strong_count(&wakes), 1);
    });
}

/// A sleep made with `Duration::MAX` (never), polled, then reset to a real deadline.
#[test]
fn a_never_sleep_reset_to_a_real_deadline_completes() {
    for turns_before in [0, 1, 3] {
        let (engine, clock) = manual(1);
        let (wakes, waker) = Wakes::waker();
        let mut sleep = engine.sleep(Duration::MAX);
        assert!(poll(&mut sleep, &waker).is_pending());
        for _ in 0..turns_before {
            clock.advance(MS);
            engine.turn();
        }
        sleep.reset(engine.now() + 2 * MS);
        let mut done_after = None;
        for step in 1..=50 {
            clock.advance(MS);
            engine.turn();
            if poll(&mut sleep, &waker).is_ready() {
                done_after = Some(step);
                break;
            }
        }
        assert_eq!(
            done_after,
            Some(2),
            "turns before the reset: {turns_before}; wakes {}",
            wakes.count()
        );
    }
}

/// The same with `sleep_until` of the end of `Instant` and with an interval whose next tick
/// is past the end of time, reset to now.
#[test]
fn an_interval_past_the_end_of_time_reset_immediately_ticks() {
    let (engine, clock) = manual(1);
    let waker = Waker::noop();
    let cx = &mut Context::from_waker(waker);
    let mut interval = engine.interval(Duration::MAX);
    assert!(interval.poll_tick(cx).is_ready());
    assert!(interval.poll_tick(cx).is_pending());
    clock.advance(MS);
    engine.turn();
    interval.reset_immediately();
    let mut ticked = None;
    for step in 0..50 {
        if interval.poll_tick(cx).is_ready() {
            ticked = Some(step);
            break;
        }
        clock.advance(MS);
        engine.turn();
    }
    assert!(
        ticked.is_some(),
        "reset_immediately never ticked (50 ms of turns)"
    );
}

/// FINDING, open (low, engine-level, pre-existing): once a manual clock is more than 2^64 ns
/// (584 years) past the engine's origin, nothing armed afterwards ever fires, sleeps
/// included (a plain `schedule` shows the same: 584 years fires, 585 does not), although
/// the docs give the engine's range as 584 million years at 1 ms. Only a `ManualClock` can
/// get there.
#[test]
#[ignore = "open: the engine's deadlines are nanoseconds since its origin, so a manual clock 2^64 ns (584 years) on fires nothing; only a ManualClock can get there"]
fn a_sleep_after_the_manual_clock_jumps_far_ahead() {
    for jump_days in [1_u64, 365, 365 * 100, 365 * 1000] {
        let (engine, clock) = manual(1);
        let waker = Waker::noop();
        let mut early = engine.sleep(MS);
        assert!(poll(&mut early, waker).is_pending());
        clock.advance(Duration::from_secs(86_400 * jump_days));
        engine.turn();
        assert!(
            poll(&mut early, waker).is_ready(),
            "jump {jump_days} d: the old sleep"
        );
        let mut sleep = engine.sleep(2 * MS);
        assert!(poll(&mut sleep, waker).is_pending());
        let mut done = None;
        for step in 1..=20 {
            clock.advance(MS);
            engine.turn();
            if poll(&mut sleep, waker).is_ready() {
                done = Some(step);
                break;
            }
        }
        assert_eq!(done, Some(2), "jump of {jump_days} days");
    }
}

/// On an engine with running workers and the real clock, a thousand sleeps and timeouts
/// until instants already past complete at their first poll: none goes through a worker,
/// whatever the workers are doing meanwhile.
#[test]
fn past_deadlines_on_a_running_engine_complete_at_the_first_poll() {
    let engine = TimerEngine::builder().workers(2).build().unwrap();
    let (wakes, waker) = Wakes::waker();
    for round in 0..1_000u32 {
        let past = Instant::now() - Duration::from_millis(1 + u64::from(round % 50));
        let mut sleep = engine.sleep_until(past);
        assert!(poll(&mut sleep, &waker).is_ready(), "round {round}");
        let mut timeout = engine.timeout_at(past, std::future::pending::<()>());
        assert!(poll(&mut timeout, &waker).is_ready(), "round {round}");
    }
    assert_eq!(wakes.count(), 0);
    assert_eq!(engine.nodes_in_use(), 0, "no timer was armed");
}

/// Attacks on the past-deadline fast path: a deadline given as an instant that has
/// passed (`sleep_until`, `timeout_at`, `Sleep::reset`, `Interval::reset_*`) completes at the
/// next poll without a timer. What must hold: never early at tick granularity, ready at the
/// first poll once reached, no timer leaked, no spurious completion after a later reset,
/// `Interval`'s missed-tick policies, `HyperTimer::reset`, and shutdown's semantics.
mod past_deadlines {
    use super::*;
    use crate::support::{Rng, ms};
    use std::sync::mpsc;

    const NS: Duration = Duration::from_nanos(1);

    /// `deadline` rounded up to the tick grid that starts at `origin` (a deadline at or
    /// before the origin is due at the origin): the earliest instant it may complete.
    fn rounded_up(origin: Instant, tick: Duration, deadline: Instant) -> Instant {
        let Some(after) = deadline.checked_duration_since(origin) else {
            return origin;
        };
        let tick = tick.as_nanos();
        let ticks = after.as_nanos().div_ceil(tick);
        origin + Duration::from_nanos(u64::try_from(ticks * tick).unwrap())
    }

    /// A lower bound on `rounded_up(origin, tick, deadline)` when the origin is only known
    /// to lie in `from..=to` (a real-clock engine's origin is its build instant).
    fn rounded_up_at_least(
        from: Instant,
        to: Instant,
        tick: Duration,
        deadline: Instant,
    ) -> Instant {
        let tick_ns = tick.as_nanos() as i128;
        let signed = |at: Instant| -> i128 {
            match at.checked_duration_since(from) {
                Some(after) => after.as_nanos() as i128,
                None => -(from.duration_since(at).as_nanos() as i128),
            }
        };
        // (origin - deadline) mod tick grows with the origin until it wraps to 0.
        let least = (-signed(deadline)).rem_euclid(tick_ns);
        let width = signed(to);
        let extra = if least + width >= tick_ns { 0 } else { least };
        deadline + Duration::from_nanos(u64::try_from(extra).unwrap())
    }

    /// A waker that unparks the thread that made it.
    fn unparker() -> Waker {
        struct Unpark(std::thread::Thread);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        Waker::from(Arc::new(Unpark(std::thread::current())))
    }

    /// Deadlines 1 ns before, at and 1 ns after tick boundaries (and before the origin),
    /// made and first polled with the manual clock 1 ns before, at and 1 ns after other
    /// boundaries: the first poll completes exactly when the clock has reached the deadline
    /// rounded up to the tick; those that arm complete after the turn at that instant, never
    /// before it.
    #[test]
    fn past_deadline_one_nanosecond_either_side_of_a_tick_boundary_completes_exactly_when_reached()
    {
        let (engine, clock) = manual(1);
        let origin = engine.now();
        let tick = engine.tick();
        let (_wakes, waker) = Wakes::waker();
        let mut armed: Vec<(Sleep<'_>, Instant, Instant)> = Vec::new();
        let mut positions = Vec::new();
        for k in 1..=5u32 {
            positions.extend([k * tick - NS, k * tick, k * tick + NS, k * tick + tick / 2]);
        }
        let mut completed_at_once = 0;
        for position in positions {
            clock.advance_to(origin + position);
            engine.turn();
            let now = engine.now();
            armed.retain_mut(|(sleep, deadline, rounded)| {
                let ready = poll(sleep, &waker).is_ready();
                assert!(
                    !ready || now >= *rounded,
                    "early: {deadline:?} done at {now:?}"
                );
                assert!(
                    ready || now < *rounded,
                    "turned at {now:?} past {rounded:?}, still pending"
                );
                !ready
            });
            for k in 0..=6u32 {
                for offset in [-1i64, 0, 1] {
                    let boundary = origin + k * tick;
                    let deadline = match offset {
                        -1 => boundary - NS,
                        0 => boundary,
                        _ => boundary + NS,
                    };
                    let rounded = rounded_up(origin, tick, deadline);
                    let mut sleep = engine.sleep_until(deadline);
                    let ready = poll(&mut sleep, &waker).is_ready();
                    assert_eq!(
                        ready,
                        now >= rounded,
                        "deadline origin+{k} ticks{offset:+} ns, clock at origin+{position:?}"
                    );
                    assert_eq!(sleep.is_elapsed(), ready);
                    if ready {
                        completed_at_once += 1;
                    } else {
                        armed.push((sleep, deadline, rounded));
                    }
                }
            }
        }
        assert!(completed_at_once > 0);
        clock.advance_to(origin + 8 * tick);
        engine.turn();
        for (mut sleep, ..) in armed {
            assert!(poll(&mut sleep, &waker).is_ready(), "armed, due, turned");
        }
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0);
    }

    /// Random resets (past, earlier, later, within the same tick) interleaved with polls,
    /// nanosecond clock steps and turns. A poll never completes before the current
    /// deadline rounded up; the first poll after a reset completes exactly when that is
    /// reached; `is_elapsed` agrees with the last poll; and every sleep still completes
    /// once its deadline comes, with no node or waker clone left behind.
    #[test]
    fn reset_storm_past_earlier_later_interleaved_with_polls_and_turns_never_early_nothing_leaked()
    {
        let (engine, clock) = manual(1);
        let origin = engine.now();
        let tick = engine.tick();
        let (wakes, waker) = Wakes::waker();
        let mut rng = Rng(0x0bd0_c557);
        for round in 0..300u32 {
            let mut deadline = engine.now() + Duration::from_nanos(rng.range(0, 4_000_000));
            let mut sleep = engine.sleep_until(deadline);
            let mut fresh = true;
            for step in 0..60u32 {
                let now = engine.now();
                match rng.below(7) {
                    0 => {
                        deadline = now - Duration::from_nanos(rng.range(0, 3_000_000));
                        sleep.reset(deadline);
                        fresh = true;
                    }
                    1 => {
                        deadline = now + Duration::from_nanos(rng.range(0, 3_000_000));
                        sleep.reset(deadline);
                        fresh = true;
                    }
                    2 => clock.advance(Duration::from_nanos(rng.range(1, 1_500_000))),
                    3 => {
                        engine.turn();
                    }
                    _ => {
                        let ready = poll(&mut sleep, &waker).is_ready();
                        let rounded = rounded_up(origin, tick, deadline);
                        let at = format!("round {round} step {step}: now {now:?}, due {rounded:?}");
                        assert!(!ready || now >= rounded, "early: {at}");
                        if fresh {
                            assert_eq!(ready, now >= rounded, "first poll after a reset: {at}");
                        }
                        assert_eq!(sleep.is_elapsed(), ready, "{at}");
                        fresh = false;
                    }
                }
            }
            let rounded = rounded_up(origin, tick, deadline);
            if engine.now() < rounded {
                clock.advance_to(rounded);
            }
            let mut done = false;
            for _ in 0..3 {
                engine.turn();
                if poll(&mut sleep, &waker).is_ready() {
                    done = true;
                    break;
                }
            }
            assert!(done, "round {round}: due, turned, polled, still pending");
        }
        support::run_for(&engine, &clock, 10);
        assert_eq!(
            engine.nodes_in_use(),
            0,
            "nodes still held after the sleeps went"
        );
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0);
        assert_eq!(Arc::strong_count(&wakes), 2, "a waker clone left in a node");
    }

    /// A reset to a later deadline after a past one completed, and after the timer left
    /// at an older deadline fires: never a spurious completion, and the later deadline
    /// still comes.
    #[test]
    fn reset_to_later_after_a_past_completion_or_an_old_timer_firing_is_not_complete() {
        let (engine, clock) = manual(1);
        let (wakes, waker) = Wakes::waker();
        let mut sleep = engine.sleep_until(engine.now() - ms(3));
        assert!(poll(&mut sleep, &waker).is_ready());
        sleep.reset(engine.now() + ms(5));
        assert!(!sleep.is_elapsed(), "a reset to later undoes completion");
        assert!(poll(&mut sleep, &waker).is_pending());
        support::run_for(&engine, &clock, 4);
        assert!(poll(&mut sleep, &waker).is_pending());
        support::run_for(&engine, &clock, 1);
        assert!(poll(&mut sleep, &waker).is_ready());

        // Armed at +2 ms, reset to +10 ms: the old timer fires at +2 ms (one spurious wake),
        // and the poll it brings arms the new deadline rather than completing.
        let mut sleep = engine.sleep_until(engine.now() + ms(2));
        assert!(poll(&mut sleep, &waker).is_pending());
        sleep.reset(engine.now() + ms(10));
        let before = wakes.count();
        support::run_for(&engine, &clock, 2);
        assert_eq!(wakes.count(), before + 1, "the old timer's wake");
        assert!(!sleep.is_elapsed());
        assert!(poll(&mut sleep, &waker).is_pending());
        support::run_for(&engine, &clock, 7);
        assert!(poll(&mut sleep, &waker).is_pending());
        support::run_for(&engine, &clock, 1);
        assert!(poll(&mut sleep, &waker).is_ready());

        // Armed at +2 ms; the clock passes +8 ms with no turn (the timer has not fired);
        // a reset to +6 ms (later than the timer, but past) completes at the next poll and
        // retires the unfired timer.
        let start = engine.now();
        let mut sleep = engine.sleep_until(start + ms(2));
        assert!(poll(&mut sleep, &waker).is_pending());
        clock.advance(ms(8));
        sleep.reset(start + ms(6));
        let before = wakes.count();
        assert!(poll(&mut sleep, &waker).is_ready());
        drop(sleep);
        support::run_for(&engine, &clock, 5);
        assert_eq!(
            wakes.count(),
            before,
            "the retired timer still woke the task"
        );

        // Far (never) to past, and past to never.
        let mut sleep = engine.sleep(Duration::MAX);
        assert!(poll(&mut sleep, &waker).is_pending());
        sleep.reset(engine.now() - ms(1));
        assert!(poll(&mut sleep, &waker).is_ready());
        let mut sleep = engine.sleep_until(engine.now() - ms(1));
        sleep.reset(end_of_instant(engine.now()));
        assert!(poll(&mut sleep, &waker).is_pending());
        support::run_for(&engine, &clock, 3);
        assert!(poll(&mut sleep, &waker).is_pending());
        drop(sleep);
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0);
        assert_eq!(Arc::strong_count(&wakes), 2);
    }

    /// Twenty thousand sleeps armed and then reset to the past before (or after) their
    /// timer fires: each completes at the poll after the reset, and the retired timers all
    /// go back: the nodes in use stay bounded while it runs and none is left at the end.
    #[test]
    fn arm_then_reset_to_past_churn_retires_every_timer() {
        let (engine, clock) = manual(1);
        let (wakes, waker) = Wakes::waker();
        let mut rng = Rng(99);
        let mut most = 0;
        for round in 0..20_000u32 {
            let mut sleep = engine.sleep_until(engine.now() + ms(rng.range(1, 4)));
            assert!(poll(&mut sleep, &waker).is_pending());
            if rng.percent(30) {
                clock.advance(ms(rng.range(0, 5)));
                engine.turn();
            }
            sleep.reset(engine.now() - ms(rng.range(0, 3)));
            if rng.percent(20) {
                engine.turn();
            }
            assert!(poll(&mut sleep, &waker).is_ready(), "round {round}");
            let woken = wakes.count();
            drop(sleep);
            if round % 64 == 0 {
                clock.advance(ms(5));
                engine.turn();
                most = most.max(engine.nodes_in_use());
                assert_eq!(wakes.count(), woken, "round {round}: a retired timer woke");
            }
        }
        assert!(
            most < 1_000,
            "{most} nodes in use at once: retired timers pile up"
        );
        support::run_for(&engine, &clock, 10);
        assert_eq!(
            engine.nodes_in_use(),
            0,
            "nodes still held after the sleeps went"
        );
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0);
        assert_eq!(Arc::strong_count(&wakes), 2);
    }

    /// On a two-worker real-clock engine, a sleep armed about a millisecond ahead is reset
    /// to a past instant just as its deadline comes, so that the reset (a move of the
    /// timer) and the retiring poll race the worker firing it. The poll completes at once
    /// every time, and nothing is left: no node, no waker clone.
    #[test]
    fn reset_to_the_past_while_a_worker_fires_the_timer_completes_at_once_and_leaks_nothing() {
        let engine = leaked_unpinned(2);
        within(LIMIT, "reset to past racing the fire", move || {
            let (wakes, waker) = Wakes::waker();
            let mut rng = Rng(5);
            for round in 0..2_000u32 {
                let deadline = Instant::now() + Duration::from_micros(rng.range(300, 1_300));
                let mut sleep = engine.sleep_until(deadline);
                let _ = poll(&mut sleep, &waker);
                let aim = deadline - Duration::from_micros(150)
                    + Duration::from_micros(rng.range(0, 400));
                while Instant::now() < aim {
                    std::hint::spin_loop();
                }
                // At least a tick back, so that rounded up it is still past.
                let past = Instant::now() - MS - Duration::from_micros(rng.range(0, 2_000));
                sleep.reset(past);
                assert!(poll(&mut sleep, &waker).is_ready(), "round {round}");
                assert!(sleep.is_elapsed());
                if rng.percent(50) {
                    // A later deadline after all: pending again, and not early.
                    let later = Instant::now() + Duration::from_micros(rng.range(0, 500));
                    sleep.reset(later);
                    let until = Instant::now() + Duration::from_secs(20);
                    while poll(&mut sleep, &waker).is_pending() {
                        assert!(Instant::now() < until, "round {round}: never completed");
                        std::thread::yield_now();
                    }
                    assert!(Instant::now() >= later, "round {round}: early");
                }
            }
            engine.shutdown(PendingTimers::Drop);
            assert_eq!(engine.nodes_in_use(), 0);
            assert_eq!(Arc::strong_count(&wakes), 2, "a waker clone left in a node");
        });
    }

    /// Three threads on a real-clock engine with two workers make sleeps until instants
    /// from 3 ms past to 3 ms ahead, poll them once and pass them round a ring; the next
    /// thread resets each to another such instant, drops it (a cancel) or waits for it
    /// with its own waker (a waker replaced on another thread). Every completion is at or
    /// after the deadline rounded up to the tick (bounded from the build instants, as the
    /// origin is not exposed), a first poll of a deadline a tick or more past always
    /// completes, no wake is lost (waiting parks without a timeout), and nothing is left.
    #[test]
    fn threads_passing_past_and_near_deadlines_round_a_ring_never_early_nothing_lost() {
        let built_from = Instant::now();
        let engine = TimerEngine::builder()
            .workers(2)
            .pin_workers(false)
            .build()
            .unwrap();
        let built_to = Instant::now();
        let engine: &'static TimerEngine = Box::leak(Box::new(engine));
        let tick = engine.tick();
        let checked = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&checked);
        within(
            Duration::from_secs(120),
            "ring of past deadlines",
            move || {
                const THREADS: usize = 3;
                let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS)
                    .map(|_| mpsc::channel::<(Sleep<'static>, Instant)>())
                    .unzip();
                let mut senders: Vec<Option<_>> = senders.into_iter().map(Some).collect();
                let mut threads = Vec::new();
                for (me, receiver) in receivers.into_iter().enumerate() {
                    let next = senders[(me + 1) % THREADS].take().unwrap();
                    let checked = Arc::clone(&counted);
                    threads.push(std::thread::spawn(move || {
                        let waker = unparker();
                        let mut rng = Rng(1 + me as u64);
                        let when = |rng: &mut Rng| -> Instant {
                            let offset = Duration::from_nanos(rng.range(0, 3_000_000));
                            if rng.percent(50) {
                                Instant::now() - offset
                            } else {
                                Instant::now() + offset
                            }
                        };
                        let check = |ready: bool, deadline: Instant, fresh_from: Instant| {
                            let now = Instant::now();
                            let least = rounded_up_at_least(built_from, built_to, tick, deadline);
                            assert!(!ready || now >= least, "early: due {least:?}, done {now:?}");
                            // Made or reset at `fresh_from`, a tick or more after the deadline
                            // (so past it rounded up, whatever the origin): its first poll must
                            // complete.
                            if fresh_from >= deadline + tick {
                                assert!(ready, "a deadline a tick past did not complete at once");
                            }
                            checked.fetch_add(1, Ordering::Relaxed);
                        };
                        let wait = |sleep: &mut Sleep<'static>, deadline: Instant| {
                            while poll(sleep, &waker).is_pending() {
                                std::thread::park();
                            }
                            let now = Instant::now();
                            let least = rounded_up_at_least(built_from, built_to, tick, deadline);
                            assert!(now >= least, "early after a wait");
                            assert!(poll(sleep, &waker).is_ready(), "completed, then not");
                        };
                        let act =
                            |rng: &mut Rng, mut sleep: Sleep<'static>, deadline: Instant| match rng
                                .below(4)
                            {
                                0 => drop(sleep),
                                1 => wait(&mut sleep, deadline),
                                _ => {
                                    let deadline = when(rng);
                                    let at = Instant::now();
                                    sleep.reset(deadline);
                                    let ready = poll(&mut sleep, &waker).is_ready();
                                    check(ready, deadline, at);
                                    if rng.percent(50) {
                                        wait(&mut sleep, deadline);
                                    }
                                }
                            };
                        for _ in 0..400 {
                            let deadline = when(&mut rng);
                            let at = Instant::now();
                            let mut sleep = engine.sleep_until(deadline);
                            let ready = poll(&mut sleep, &waker).is_ready();
                            check(ready, deadline, at);
                            let _ = next.send((sleep, deadline));
                            while let Ok((sleep, deadline)) = receiver.try_recv() {
                                act(&mut rng, sleep, deadline);
                            }
                        }
                        drop(next);
                        while let Ok((sleep, deadline)) = receiver.recv() {
                            act(&mut rng, sleep, deadline);
                        }
                    }));
                }
                for thread in threads {
                    thread.join().unwrap();
                }
                engine.shutdown(PendingTimers::Drop);
                assert_eq!(engine.nodes_in_use(), 0);
            },
        );
        assert!(checked.load(Ordering::Relaxed) >= 1_200);
    }

    /// `reset_immediately` and `reset_at` into the past, many times over, on an armed and
    /// an unarmed `Interval`, with turns in between or not: each completes at the next poll
    /// with the deadline asked for, and the ticks after follow the missed-tick policy
    /// exactly as tokio's (Burst: deadline + period; Delay: now + period; Skip: the next
    /// multiple of the period after now).
    #[test]
    fn interval_reset_immediately_and_reset_at_past_storms_keep_missed_tick_policies() {
        let (engine, clock) = manual(1);
        let (_wakes, waker) = Wakes::waker();
        let cx = &mut Context::from_waker(&waker);
        let period = ms(10);
        let mut rng = Rng(3);
        for policy in [MissedTicks::Burst, MissedTicks::Delay, MissedTicks::Skip] {
            let mut interval = engine.interval(period);
            interval.set_missed_tick_behavior(policy);
            assert_eq!(interval.poll_tick(cx), Poll::Ready(engine.now()));
            for round in 0..100u32 {
                let armed = rng.percent(50);
                if armed {
                    assert!(interval.poll_tick(cx).is_pending(), "{policy:?} {round}");
                }
                clock.advance(ms(rng.range(0, 3)));
                if rng.percent(50) {
                    engine.turn();
                }
                let now = engine.now();
                if rng.percent(50) {
                    interval.reset_immediately();
                    if rng.percent(50) {
                        engine.turn();
                    }
                    assert_eq!(
                        interval.poll_tick(cx),
                        Poll::Ready(now),
                        "{policy:?} {round}"
                    );
                    assert!(interval.poll_tick(cx).is_pending());
                    continue;
                }
                let late = ms(rng.range(0, 40));
                let due = now - late;
                interval.reset_at(due);
                if rng.percent(50) {
                    engine.turn();
                }
                assert_eq!(
                    interval.poll_tick(cx),
                    Poll::Ready(due),
                    "{policy:?} {round}"
                );
                let mut expected = Vec::new();
                let missed = late > ms(5);
                let mut next = match (missed, policy) {
                    (false, _) | (true, MissedTicks::Burst) => due + period,
                    (true, MissedTicks::Delay) => now + period,
                    (true, MissedTicks::Skip) => {
                        let into = (late.as_nanos() % period.as_nanos()) as u64;
                        now + period - Duration::from_nanos(into)
                    }
                };
                // Burst catches up at once, one tick a poll.
                while next <= now {
                    expected.push(next);
                    next += period;
                }
                for at in expected {
                    assert_eq!(
                        interval.poll_tick(cx),
                        Poll::Ready(at),
                        "{policy:?} {round}"
                    );
                }
                assert!(interval.poll_tick(cx).is_pending(), "{policy:?} {round}");
                clock.advance_to(next - NS);
                engine.turn();
                assert!(
                    interval.poll_tick(cx).is_pending(),
                    "{policy:?} {round}: early"
                );
                clock.advance_to(next);
                engine.turn();
                assert_eq!(
                    interval.poll_tick(cx),
                    Poll::Ready(next),
                    "{policy:?} {round}"
                );
            }
        }
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0);
    }

    /// A deadline reset to the current instant (or just before it) while the manual clock
    /// is inside a tick: rounded up, it is the next tick boundary, so an armed interval's
    /// tick waits for it (never early by the tick rule), while an unarmed one, reading the
    /// instants, ticks at once. Both then carry on a period after the instant asked for.
    #[test]
    fn interval_reset_to_now_inside_a_tick_armed_waits_for_the_boundary_unarmed_does_not() {
        let (engine, clock) = manual(1);
        let (_wakes, waker) = Wakes::waker();
        let cx = &mut Context::from_waker(&waker);
        let period = ms(10);
        let mut armed = engine.interval(period);
        let mut unarmed = engine.interval(period);
        let start = engine.now();
        assert_eq!(armed.poll_tick(cx), Poll::Ready(start));
        assert_eq!(unarmed.poll_tick(cx), Poll::Ready(start));
        assert!(armed.poll_tick(cx).is_pending());
        clock.advance(ms(2) + MS / 2);
        let now = engine.now();
        armed.reset_immediately();
        unarmed.reset_immediately();
        assert_eq!(unarmed.poll_tick(cx), Poll::Ready(now), "unarmed: at once");
        // Armed: the timer moves to the boundary (2.5 ms rounds up to 3 ms) and the tick
        // waits for it, though `now` is the deadline asked for.
        assert!(
            armed.poll_tick(cx).is_pending(),
            "armed: rounded up to the boundary"
        );
        engine.turn();
        assert!(armed.poll_tick(cx).is_pending(), "before the boundary");
        clock.advance(MS / 2 - NS);
        engine.turn();
        assert!(armed.poll_tick(cx).is_pending(), "1 ns before the boundary");
        clock.advance(NS);
        engine.turn();
        assert_eq!(armed.poll_tick(cx), Poll::Ready(now), "at the boundary");
        // The next tick, a period after the instant asked for, is inside a tick again:
        // the armed interval waits for the boundary, the unarmed one does not.
        clock.advance_to(now + period);
        engine.turn();
        assert!(armed.poll_tick(cx).is_pending(), "armed: rounded up again");
        assert_eq!(unarmed.poll_tick(cx), Poll::Ready(now + period));
        clock.advance(MS / 2);
        engine.turn();
        assert_eq!(armed.poll_tick(cx), Poll::Ready(now + period));
        drop((armed, unarmed));
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0);
    }

    /// `timeout_at` a past instant around a future that is ready at once yields the
    /// future's output, not `Elapsed` (the future is polled first), as tokio's does; around
    /// one that is pending it elapses at the first poll; neither arms a timer. Checked side
    /// by side with tokio's `timeout_at`.
    #[test]
    fn timeout_at_past_around_a_ready_future_yields_its_output_as_tokio_does() {
        let (engine, _clock) = manual(1);
        let (wakes, waker) = Wakes::waker();
        let past = engine.now() - ms(5);
        let mut ready = engine.timeout_at(past, std::future::ready(7));
        assert_eq!(poll(&mut ready, &waker), Poll::Ready(Ok(7)));
        let mut pending = engine.timeout_at(past, std::future::pending::<u8>());
        assert_eq!(poll(&mut pending, &waker), Poll::Ready(Err(Elapsed)));
        // Ready on its second poll: the first poll of the timeout elapses.
        let mut polls = 0;
        let second = std::future::poll_fn(move |_| {
            polls += 1;
            if polls >= 2 {
                Poll::Ready(1)
            } else {
                Poll::Pending
            }
        });
        let mut second = Box::pin(engine.timeout_at(past, second));
        assert_eq!(
            second.as_mut().poll(&mut Context::from_waker(&waker)),
            Poll::Ready(Err(Elapsed))
        );
        assert_eq!(engine.nodes_in_use(), 0, "no timer for a past deadline");
        assert_eq!(wakes.count(), 0);

        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let (ready, pending, second) = runtime.block_on(async {
            let past = tokio::time::Instant::now() - Duration::from_millis(5);
            let ready = tokio::time::timeout_at(past, std::future::ready(7)).await;
            let pending = tokio::time::timeout_at(past, std::future::pending::<u8>()).await;
            let mut polls = 0;
            let second = std::future::poll_fn(move |_| {
                polls += 1;
                if polls >= 2 {
                    Poll::Ready(1)
                } else {
                    Poll::Pending
                }
            });
            let second = tokio::time::timeout_at(past, second).await;
            (ready.ok(), pending.ok(), second.ok())
        });
        assert_eq!(
            (ready, pending, second),
            (Some(7), None, None),
            "tokio agrees"
        );
    }

    /// On an engine already shut down: `sleep_until` a past or a future instant, `sleep`,
    /// and a sleep reset to the past or to later after the shutdown all complete at their
    /// next poll; `timeout_at` a past instant still yields a ready future's output, and
    /// elapses around a pending one; an `Interval`, even one reset to the past, stays
    /// pending (documented). Nothing is armed.
    #[test]
    fn shut_down_engine_then_past_and_future_deadlines_keep_shutdown_semantics() {
        let (engine, clock) = manual(1);
        let (_wakes, waker) = Wakes::waker();
        let cx = &mut Context::from_waker(&waker);
        let mut armed_before = engine.sleep_until(engine.now() + ms(50));
        assert!(poll(&mut armed_before, &waker).is_pending());
        let mut interval = engine.interval(ms(10));
        assert!(interval.poll_tick(cx).is_ready());
        assert!(interval.poll_tick(cx).is_pending());
        engine.shutdown(PendingTimers::Drop);
        let now = engine.now();
        assert!(poll(&mut engine.sleep_until(now - ms(5)), &waker).is_ready());
        assert!(poll(&mut engine.sleep_until(now + ms(5)), &waker).is_ready());
        assert!(poll(&mut engine.sleep(ms(5)), &waker).is_ready());
        armed_before.reset(now + ms(100));
        assert!(
            poll(&mut armed_before, &waker).is_ready(),
            "reset later after shutdown"
        );
        armed_before.reset(now - ms(100));
        assert!(
            poll(&mut armed_before, &waker).is_ready(),
            "reset past after shutdown"
        );
        let mut fresh = engine.sleep_until(now + ms(5));
        fresh.reset(now - ms(1));
        assert!(poll(&mut fresh, &waker).is_ready());
        assert_eq!(
            poll(
                &mut engine.timeout_at(now - ms(1), std::future::ready(3)),
                &waker
            ),
            Poll::Ready(Ok(3))
        );
        assert_eq!(
            poll(
                &mut engine.timeout_at(now - ms(1), std::future::pending::<()>()),
                &waker
            ),
            Poll::Ready(Err(Elapsed))
        );
        assert_eq!(
            poll(
                &mut engine.timeout_at(now + ms(1), std::future::pending::<()>()),
                &waker
            ),
            Poll::Ready(Err(Elapsed))
        );
        interval.reset_at(now - ms(30));
        assert!(
            interval.poll_tick(cx).is_pending(),
            "no tick after shutdown"
        );
        interval.reset_immediately();
        assert!(
            interval.poll_tick(cx).is_pending(),
            "no tick after shutdown"
        );
        let mut late = engine.interval_at(now - ms(30), ms(10));
        assert!(late.poll_tick(cx).is_pending(), "no tick after shutdown");
        clock.advance(ms(100));
        engine.turn();
        assert!(interval.poll_tick(cx).is_pending());
        drop((armed_before, fresh, interval, late));
        assert_eq!(engine.nodes_in_use(), 0);
    }

    /// `HyperTimer::reset` on a sleep it made: to the past completes at the next poll
    /// (whether or not the sleep was armed), to later afterwards is pending until the new
    /// deadline, and a past `sleep_until` completes at once.
    #[test]
    fn hyper_timer_reset_to_past_and_back_to_later() {
        use hyper::rt::Timer;
        let (engine, clock) = leaked_manual(1);
        let timer = corewheel::HyperTimer::new(engine);
        let (_wakes, waker) = Wakes::waker();
        let cx = &mut Context::from_waker(&waker);
        let mut sleep = timer.sleep_until(engine.now() + ms(50));
        assert!(sleep.as_mut().poll(cx).is_pending());
        timer.reset(&mut sleep, engine.now() - ms(2));
        assert!(
            sleep.as_mut().poll(cx).is_ready(),
            "armed, reset to the past"
        );
        timer.reset(&mut sleep, engine.now() + ms(3));
        assert!(
            sleep.as_mut().poll(cx).is_pending(),
            "reset to later after completing"
        );
        support::run_for(engine, &clock, 2);
        assert!(sleep.as_mut().poll(cx).is_pending(), "early");
        support::run_for(engine, &clock, 1);
        assert!(sleep.as_mut().poll(cx).is_ready());
        let mut unpolled = timer.sleep_until(engine.now() + ms(50));
        timer.reset(&mut unpolled, engine.now() - ms(2));
        assert!(
            unpolled.as_mut().poll(cx).is_ready(),
            "unarmed, reset to the past"
        );
        let mut past = timer.sleep_until(engine.now() - ms(1));
        assert!(past.as_mut().poll(cx).is_ready());
        drop((sleep, unpolled, past));
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0);
    }
    /// Sleeps whose timers fired unpolled (their handles stale once the nodes go back
    /// and are reused by other sleeps), then reset to an earlier (past) or later deadline
    /// and polled: the move and the retire they bring name stale handles, and must not
    /// cancel, move or complete the sleeps now on those nodes.
    #[test]
    fn reset_to_past_with_a_stale_handle_leaves_the_sleep_on_the_reused_node_alone() {
        let (engine, clock) = manual(1);
        let (wakes, waker) = Wakes::waker();
        let (other_wakes, other) = Wakes::waker();
        let start = engine.now();
        let mut old: Vec<Sleep<'_>> = (0..64).map(|_| engine.sleep_until(start + MS)).collect();
        for sleep in &mut old {
            assert!(poll(sleep, &waker).is_pending());
        }
        support::run_for(&engine, &clock, 3);
        assert_eq!(wakes.count(), 64);
        let mut new: Vec<Sleep<'_>> = (0..64).map(|_| engine.sleep(ms(5))).collect();
        for sleep in &mut new {
            assert!(poll(sleep, &other).is_pending());
        }
        let now = engine.now();
        for (i, sleep) in old.iter_mut().enumerate() {
            if i % 2 == 0 {
                sleep.reset(now - ms(2)); // later than +1 ms, and past
                sleep.reset(start - ms(1)); // earlier: moves the (stale) timer
                assert!(poll(sleep, &waker).is_ready(), "{i}: past");
            } else {
                sleep.reset(now + ms(2)); // later, ahead: a new timer
                assert!(poll(sleep, &waker).is_pending(), "{i}: ahead");
            }
        }
        for sleep in &mut new {
            assert!(
                poll(sleep, &other).is_pending(),
                "a reused node's sleep completed"
            );
        }
        support::run_for(&engine, &clock, 2);
        for (i, sleep) in old.iter_mut().enumerate() {
            assert!(poll(sleep, &waker).is_ready(), "{i}");
        }
        support::run_for(&engine, &clock, 2);
        assert!(
            new.iter_mut().all(|sleep| poll(sleep, &other).is_pending()),
            "early"
        );
        support::run_for(&engine, &clock, 1);
        assert_eq!(
            other_wakes.count(),
            64,
            "a reused node's sleep was cancelled"
        );
        assert!(new.iter_mut().all(|sleep| poll(sleep, &other).is_ready()));
        drop((old, new));
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0);
    }

    /// Far-past deadlines (long before the engine's origin, and `Instant`s as early as
    /// the platform allows) complete at the first poll, from `sleep_until`, `reset`,
    /// `timeout_at` and `interval_at`, without overflow or a timer.
    #[test]
    fn far_past_deadlines_before_the_origin_complete_at_the_first_poll() {
        let (engine, _clock) = manual(1);
        let (_wakes, waker) = Wakes::waker();
        let now = engine.now();
        let mut pasts = vec![now - NS, now - MS];
        for back in [1u64, 3_600, 86_400 * 365, u64::MAX / 4] {
            if let Some(past) = now.checked_sub(Duration::from_secs(back)) {
                pasts.push(past);
            }
        }
        let mut earliest = now;
        let mut step = Duration::from_secs(1 << 62);
        while step > Duration::ZERO {
            match earliest.checked_sub(step) {
                Some(before) => earliest = before,
                None => step /= 2,
            }
        }
        pasts.push(earliest);
        for past in pasts {
            assert!(
                poll(&mut engine.sleep_until(past), &waker).is_ready(),
                "{past:?}"
            );
            let mut sleep = engine.sleep(ms(10));
            assert!(poll(&mut sleep, &waker).is_pending());
            sleep.reset(past);
            assert!(poll(&mut sleep, &waker).is_ready(), "reset to {past:?}");
            assert_eq!(
                poll(
                    &mut engine.timeout_at(past, std::future::pending::<()>()),
                    &waker
                ),
                Poll::Ready(Err(Elapsed))
            );
            let mut interval = engine.interval_at(past, Duration::from_secs(u64::MAX / 2));
            let cx = &mut Context::from_waker(&waker);
            let tick = interval.poll_tick(cx);
            assert!(tick.is_ready(), "interval_at {past:?}");
            // Within 292 years of the origin the tick is the start asked for; beyond, see
            // `interval_at_more_than_292_years_back_ticks_at_another_instant`.
            if now.duration_since(past) < Duration::from_secs(292 * 365 * 86_400) {
                assert_eq!(tick, Poll::Ready(past));
            }
        }
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0);
    }

    /// An open fault, older than the past-deadline fast path (a `Sleep` keeps its deadline
    /// as signed nanoseconds since the origin): `interval_at(start)` with a start more than 292 years before the engine's origin (an
    /// `Instant` a caller can make with `checked_sub`) returns a first tick at another
    /// instant, the start saturated to about origin - 292 years, where `Interval`'s docs
    /// promise "the instants `tick` returns are the exact ones" and tokio returns `start`.
    /// Harmless in practice (the tick still comes at once, never early); reported, not
    /// fixed here.
    #[test]
    #[ignore = "fault (minor, pre-existing): interval_at(start > 292 y before the origin) ticks at a saturated instant, not start"]
    fn interval_at_more_than_292_years_back_ticks_at_another_instant() {
        let (engine, _clock) = manual(1);
        let (_wakes, waker) = Wakes::waker();
        let cx = &mut Context::from_waker(&waker);
        let Some(start) = engine
            .now()
            .checked_sub(Duration::from_secs(300 * 365 * 86_400))
        else {
            return; // this platform's `Instant` does not reach that far back
        };
        let mut interval = engine.interval_at(start, ms(10));
        assert_eq!(interval.poll_tick(cx), Poll::Ready(start));
    }

    /// Two threads on a real-clock engine, each 20 000 times: a deadline a tick back
    /// completes at its first poll (the cycle-counter bound must not hold it back), one a
    /// tick ahead does not (never early), and one at the current instant completes only
    /// if the clock has passed it.
    #[test]
    fn real_clock_deadlines_a_tick_either_side_of_now_at_the_first_poll() {
        let engine = leaked_unpinned(2);
        within(LIMIT, "a tick either side of now", move || {
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    std::thread::spawn(move || {
                        let (_wakes, waker) = Wakes::waker();
                        let tick = engine.tick();
                        for round in 0..20_000u32 {
                            let past = Instant::now() - tick;
                            let mut sleep = engine.sleep_until(past);
                            assert!(poll(&mut sleep, &waker).is_ready(), "{round}: a tick back");
                            let ahead = Instant::now() + tick;
                            let mut sleep = engine.sleep_until(ahead);
                            let ready = poll(&mut sleep, &waker).is_ready();
                            assert!(!ready || Instant::now() >= ahead, "{round}: early");
                            let at = Instant::now();
                            let mut sleep = engine.sleep_until(at);
                            let ready = poll(&mut sleep, &waker).is_ready();
                            assert!(!ready || Instant::now() >= at, "{round}: early");
                        }
                    })
                })
                .collect();
            for thread in threads {
                thread.join().unwrap();
            }
            engine.shutdown(PendingTimers::Drop);
            assert_eq!(engine.nodes_in_use(), 0);
        });
    }

    /// Lanes now always hold pending timers back, and workers no longer sleep close: a
    /// thread that arms a sleep (near, behind a far one, or moved earlier by a reset, to
    /// the future or to the past, without polling after the reset) and then blocks must
    /// still be woken by the worker, never before the deadline rounded up.
    #[test]
    fn a_thread_that_arms_or_resets_earlier_then_blocks_is_still_woken_never_early() {
        let built_from = Instant::now();
        let engine = TimerEngine::builder()
            .workers(2)
            .pin_workers(false)
            .build()
            .unwrap();
        let built_to = Instant::now();
        let engine: &'static TimerEngine = Box::leak(Box::new(engine));
        let tick = engine.tick();
        within(LIMIT, "woken while blocked", move || {
            for round in 0..60u32 {
                let (woke, woken) = mpsc::channel::<Instant>();
                let (release, released) = mpsc::channel::<()>();
                let case = round % 4;
                let armer = std::thread::spawn(move || {
                    struct Tell(Mutex<mpsc::Sender<Instant>>);
                    impl Wake for Tell {
                        fn wake(self: Arc<Self>) {
                            let _ = self.0.lock().unwrap().send(Instant::now());
                        }
                    }
                    let waker = Waker::from(Arc::new(Tell(Mutex::new(woke))));
                    let mut far = engine.sleep(Duration::from_secs(30));
                    let now = Instant::now();
                    let (mut sleep, deadline) = match case {
                        0 => (engine.sleep_until(now + ms(3)), now + ms(3)),
                        1 => {
                            assert!(poll(&mut far, &waker).is_pending());
                            (engine.sleep_until(now + ms(3)), now + ms(3))
                        }
                        _ => (engine.sleep_until(now + ms(500)), now + ms(500)),
                    };
                    if poll(&mut sleep, &waker).is_ready() {
                        // Preempted past a 3 ms deadline before the first poll: complete
                        // at that poll, as it must be; nothing to block on this round.
                        waker.wake_by_ref();
                        let _ = released.recv();
                        return None;
                    }
                    let deadline = match case {
                        2 => {
                            let earlier = Instant::now() + ms(3);
                            sleep.reset(earlier);
                            earlier
                        }
                        3 => {
                            let past = Instant::now() - ms(2);
                            sleep.reset(past);
                            past
                        }
                        _ => deadline,
                    };
                    // Blocked: no poll, no push, until told.
                    let _ = released.recv();
                    drop((sleep, far));
                    Some(deadline)
                });
                let at = woken
                    .recv_timeout(Duration::from_secs(20))
                    .unwrap_or_else(|_| panic!("round {round} case {case}: never woken"));
                let _ = release.send(());
                let Some(deadline) = armer.join().unwrap() else {
                    continue;
                };
                let least = rounded_up_at_least(built_from, built_to, tick, deadline);
                assert!(at >= least, "round {round} case {case}: woken early");
            }
            engine.shutdown(PendingTimers::Drop);
            assert_eq!(engine.nodes_in_use(), 0);
        });
    }

    /// On a real-clock engine with two workers, an `Interval` under a storm of
    /// `reset_immediately`, `reset_at` a past instant and `reset_after`, each followed by
    /// a wait for the tick (parking, no timeout: a lost wake hangs): every tick returns
    /// the instant asked for (or the policy's next one after it), and never before the
    /// clock has reached it.
    #[test]
    fn real_clock_interval_reset_storm_ticks_at_the_instants_asked_for_never_early() {
        let engine = leaked_unpinned(2);
        within(LIMIT, "interval reset storm", move || {
            let waker = unparker();
            let cx = &mut Context::from_waker(&waker);
            let mut rng = Rng(11);
            for policy in [MissedTicks::Burst, MissedTicks::Delay, MissedTicks::Skip] {
                let mut interval = engine.interval(ms(2));
                interval.set_missed_tick_behavior(policy);
                for round in 0..150u32 {
                    if rng.percent(50) {
                        // Armed, perhaps about to fire on a worker.
                        let _ = interval.poll_tick(cx);
                        if rng.percent(50) {
                            std::thread::sleep(Duration::from_micros(rng.range(0, 2_500)));
                        }
                    }
                    let asked = match rng.below(3) {
                        0 => {
                            let now = Instant::now();
                            interval.reset_immediately();
                            // reset_immediately reads the engine's clock after `now`.
                            (now, false)
                        }
                        1 => {
                            let past = Instant::now() - Duration::from_micros(rng.range(0, 10_000));
                            interval.reset_at(past);
                            (past, true)
                        }
                        _ => {
                            let now = Instant::now();
                            interval.reset_after(Duration::from_micros(rng.range(0, 3_000)));
                            (now, false)
                        }
                    };
                    let tick = loop {
                        match interval.poll_tick(cx) {
                            Poll::Ready(at) => break at,
                            Poll::Pending => std::thread::park(),
                        }
                    };
                    let now = Instant::now();
                    assert!(tick <= now, "{policy:?} {round}: ticked before its instant");
                    match asked {
                        (past, true) => assert_eq!(tick, past, "{policy:?} {round}"),
                        (from, false) => assert!(tick >= from, "{policy:?} {round}"),
                    }
                }
            }
            engine.shutdown(PendingTimers::Drop);
            assert_eq!(engine.nodes_in_use(), 0);
        });
    }

    /// A shutdown lands while two threads make, reset (past, earlier, later) and wait for
    /// sleeps on a real-clock engine: every sleep still completes (waits park with no
    /// timeout, so a sleep left pending hangs), none before its deadline unless the
    /// shutdown has begun, and once the threads are done and a second shutdown has swept
    /// up, no node is held.
    #[test]
    fn shutdown_during_a_storm_of_past_and_future_resets_completes_every_sleep() {
        let engine = leaked_unpinned(2);
        let shutting = Arc::new(AtomicBool::new(false));
        within(LIMIT, "shutdown during a reset storm", move || {
            let threads: Vec<_> = (0..2u64)
                .map(|me| {
                    let shutting = Arc::clone(&shutting);
                    std::thread::spawn(move || {
                        let waker = unparker();
                        let mut rng = Rng(40 + me);
                        let offset = |rng: &mut Rng| Duration::from_micros(rng.range(0, 2_000));
                        for round in 0..3_000u32 {
                            let mut deadline = if rng.percent(50) {
                                Instant::now() - offset(&mut rng)
                            } else {
                                Instant::now() + offset(&mut rng)
                            };
                            let mut sleep = engine.sleep_until(deadline);
                            if poll(&mut sleep, &waker).is_pending() && rng.percent(70) {
                                deadline = if rng.percent(50) {
                                    Instant::now() - offset(&mut rng) - MS
                                } else {
                                    Instant::now() + offset(&mut rng)
                                };
                                sleep.reset(deadline);
                            }
                            if rng.percent(20) {
                                continue; // dropped: a cancel
                            }
                            while poll(&mut sleep, &waker).is_pending() {
                                std::thread::park();
                            }
                            if Instant::now() < deadline {
                                assert!(
                                    shutting.load(Ordering::SeqCst),
                                    "thread {me} round {round}: early, with no shutdown"
                                );
                            }
                        }
                    })
                })
                .collect();
            std::thread::sleep(ms(30));
            shutting.store(true, Ordering::SeqCst);
            engine.shutdown(PendingTimers::Drop);
            for thread in threads {
                thread.join().unwrap();
            }
            engine.shutdown(PendingTimers::Drop);
            assert_eq!(engine.nodes_in_use(), 0, "nodes held after the shutdown");
        });
    }
}
