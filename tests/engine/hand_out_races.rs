//! Hand-outs (`engine::hand_out`) under attack: bursts big enough that the owner hands its
//! due lists out, with cancels and resets racing the walkers, callbacks that cancel, reset
//! and schedule timers of the burst, waker timers, shutdown and drop from inside walked
//! callbacks, stuck owners, many workers, repeating timers and panics. Asserts only what
//! holds on a loaded 2-core machine: never early, exactly once, nothing lost, no hang (a
//! time limit), every node back.

use crate::support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

use crate::support::fire_book::{Book, arm, nanos};
use crate::support::stuck::{Gate, OpenOnDrop, home_of, worker_index};
use crate::support::{Live, Rng, eventually, ms, unpinned_balancing, within};
use corewheel::{MissedTicks, PendingTimers, ScheduleError, TimerEngine, TimerHandle};

/// How long a test may take before it counts as hung.
const LIMIT: Duration = Duration::from_secs(90);

/// Waits until `done`, failing with `what` after `limit`.
fn wait_for(
    limit: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
    detail: impl Fn() -> String,
) {
    let until = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < until, "{what}: {}", detail());
        std::thread::sleep(ms(2));
    }
}

fn sleep_until(t: Instant) {
    std::thread::sleep(t.saturating_duration_since(Instant::now()));
}

/// Stats agree with what ran ([`support::assert_one_shot_stats`]), and with what was
/// scheduled.
fn stats_agree(engine: &TimerEngine, runs: u64, scheduled: u64) {
    let stats = support::assert_one_shot_stats(engine, runs);
    assert_eq!(stats.total.scheduled, scheduled, "{stats:?}");
    eprintln!(
        "claimed elsewhere {} (hand-outs walked by helpers), stolen {}",
        stats.total.claimed_elsewhere, stats.total.stolen
    );
}

/// [`stats_agree`], then a shutdown that finds nothing pending and leaves every node back.
fn agree_and_shut_down(engine: &TimerEngine, runs: u64, scheduled: u64) {
    stats_agree(engine, runs, scheduled);
    let report = engine.shutdown(PendingTimers::Drop);
    assert_eq!(report.dropped, 0, "{report:?}");
    assert_eq!(engine.nodes_in_use(), 0, "every node back");
}

// ---------------------------------------------------------------------------------------
// 1. Cancels and resets from other threads racing the walkers.
// ---------------------------------------------------------------------------------------

/// Two threads race a 60,000-timer burst (on 2, 8 and 16 workers) from just before it comes due:
/// cancels, resets a little later, resets far later (coarser levels, sent back by a
/// walker and filed again), resets earlier (to now: messages that wait while lists are
/// out), two resets in a row, a reset then a cancel. Each thread owns its timers, so the
/// last reset it saw accepted is the deadline. Exactly once, never early, no cancelled
/// timer runs, stats agree, every node back.
#[test]
fn cancels_and_resets_from_two_threads_race_the_walkers() {
    for workers in [2, 8, 16] {
        cancels_and_resets_race_the_walkers_on(workers);
    }
}

fn cancels_and_resets_race_the_walkers_on(workers: usize) {
    within(LIMIT, "cancels and resets racing walkers", move || {
        const N: usize = 60_000;
        let engine = Arc::new(unpinned_balancing(workers, true, Some(8)));
        let book = Book::new(N);
        let first = book.origin + ms(150);
        let (deadlines, handles) = arm(&engine, &book, (first, ms(3)), 0xA11CE);
        let handles = Arc::new(handles);
        let outcomes: Vec<(usize, u64, bool)> = std::thread::scope(|scope| {
            let racers: Vec<_> = (0..2)
                .map(|racer| {
                    let (engine, handles, book, deadlines) = (&engine, &handles, &book, &deadlines);
                    scope.spawn(move || {
                        let mut rng = Rng(0xBEEF + racer as u64);
                        sleep_until(first - ms(1));
                        let mut out = Vec::with_capacity(N / 2);
                        for id in (racer..N).step_by(2) {
                            let handle = handles[id];
                            let (mut deadline, mut cancelled) = (deadlines[id], false);
                            let reset = |at: Instant, deadline: &mut u64| {
                                if engine.reset_at(handle, at) {
                                    *deadline = book.ns(at);
                                }
                            };
                            match rng.below(8) {
                                0 => cancelled = engine.cancel(handle),
                                1 => reset(
                                    Instant::now() + Duration::from_micros(rng.below(5_000)),
                                    &mut deadline,
                                ),
                                2 => reset(Instant::now() + ms(rng.range(300, 700)), &mut deadline),
                                3 => reset(Instant::now(), &mut deadline),
                                4 => {
                                    reset(Instant::now() + ms(400), &mut deadline);
                                    reset(Instant::now() + ms(1), &mut deadline);
                                }
                                5 => {
                                    reset(Instant::now() + ms(2), &mut deadline);
                                    cancelled = engine.cancel(handle);
                                }
                                _ => {}
                            }
                            out.push((id, deadline, cancelled));
                        }
                        out
                    })
                })
                .collect();
            racers
                .into_iter()
                .flat_map(|racer| racer.join().expect("racer"))
                .collect()
        });
        let mut final_deadlines = deadlines.clone();
        let mut cancelled = vec![false; N];
        for (id, deadline, c) in outcomes {
            final_deadlines[id] = deadline;
            cancelled[id] = c;
        }
        let expected = cancelled.iter().filter(|c| !**c).count();
        wait_for(
            Duration::from_secs(60),
            "timers lost",
            || book.total() >= expected && engine.stats().total.pending == 0,
            || {
                format!(
                    "{} of {expected} ran, {:?}",
                    book.total(),
                    engine.stats().total
                )
            },
        );
        std::thread::sleep(ms(20));
        assert_eq!(book.check(&final_deadlines, &cancelled, false), expected);
        agree_and_shut_down(&engine, expected as u64, N as u64);
    });
}

/// Every timer of a burst is pushed back far before it is due (a lazy reset: it stays in
/// its old slot), half of them to coarser levels: the walkers find them not due and send
/// them all back, and the owner files them again. A burst of timers that are all sent
/// back. Each fires once at or after its new deadline.
#[test]
fn a_burst_pushed_back_entirely_is_sent_back_and_filed_again() {
    within(LIMIT, "a burst all pushed back", || {
        const N: usize = 30_000;
        let engine = unpinned_balancing(4, true, Some(8));
        let book = Book::new(N);
        let first = book.origin + ms(250);
        let (mut deadlines, handles) = arm(&engine, &book, (first, ms(2)), 0xFA12);
        let mut rng = Rng(7);
        // A control group that is not pushed back keeps the slot a burst.
        let control = Book::new(20_000);
        let (control_deadlines, _) = arm(&engine, &control, (first, ms(2)), 0xC0);
        for id in 0..N {
            let at = first
                + if id % 2 == 0 {
                    ms(rng.range(100, 160))
                } else {
                    ms(rng.range(300, 900))
                };
            // On a loaded machine the burst may already be under way: then the reset
            // fails and the timer keeps its deadline.
            if engine.reset_at(handles[id], at) {
                deadlines[id] = book.ns(at);
            }
        }
        wait_for(
            Duration::from_secs(60),
            "pushed-back timers lost",
            || book.total() >= N && control.total() >= 20_000,
            || format!("{} / {} ran", book.total(), control.total()),
        );
        std::thread::sleep(ms(20));
        assert_eq!(book.check(&deadlines, &vec![false; N], false), N);
        assert_eq!(
            control.check(&control_deadlines, &vec![false; 20_000], false),
            20_000
        );
        agree_and_shut_down(&engine, (N + 20_000) as u64, (N + 20_000) as u64);
    });
}

// ---------------------------------------------------------------------------------------
// 2. Callbacks that touch the burst.
// ---------------------------------------------------------------------------------------

/// Callbacks of the burst cancel other timers of it and reset others later, from walker
/// threads and the owner alike. A timer whose cancel returned `true` never runs; the rest
/// run once, and a timer whose reset returned `true` runs no earlier than the new
/// deadline. Each timer has one canceller and one resetter, so outcomes are well defined.
#[test]
fn callbacks_cancel_and_reset_other_timers_of_the_burst() {
    within(LIMIT, "callbacks cancelling the burst", || {
        const N: usize = 40_000;
        let engine = Arc::new(unpinned_balancing(6, true, Some(8)));
        let book = Book::new(N);
        let first = book.origin + ms(150);
        let handles: Arc<OnceLock<Vec<TimerHandle>>> = Arc::default();
        let cancelled: Arc<Vec<AtomicBool>> =
            Arc::new((0..N).map(|_| AtomicBool::new(false)).collect());
        let reset_to: Arc<Vec<AtomicU64>> = Arc::new((0..N).map(|_| AtomicU64::new(0)).collect());
        let weak: Weak<TimerEngine> = Arc::downgrade(&engine);
        let mut rng = Rng(0xCA11);
        let mut deadlines = Vec::with_capacity(N);
        let list: Vec<TimerHandle> = (0..N)
            .map(|id| {
                let deadline = first + Duration::from_nanos(rng.below(3_000_000));
                deadlines.push(book.ns(deadline));
                let (book, handles, cancelled, reset_to, weak) = (
                    Arc::clone(&book),
                    Arc::clone(&handles),
                    Arc::clone(&cancelled),
                    Arc::clone(&reset_to),
                    weak.clone(),
                );
                engine
                    .schedule_at(deadline, move || {
                        book.hit(id);
                        let Some(engine) = weak.upgrade() else { return };
                        let handles = handles.get().expect("set before the burst");
                        match id % 3 {
                            0 => {
                                let target = (id * 7 + 3) % N;
                                if engine.cancel(handles[target]) {
                                    cancelled[target].store(true, Ordering::SeqCst);
                                }
                            }
                            1 => {
                                let target = (id * 13 + 5) % N;
                                let at = Instant::now() + ms(20);
                                if engine.reset_at(handles[target], at) {
                                    reset_to[target].store(book.ns(at), Ordering::SeqCst);
                                }
                            }
                            _ => {}
                        }
                    })
                    .expect("scheduled")
            })
            .collect();
        handles.set(list).expect("once");
        wait_for(
            Duration::from_secs(60),
            "timers lost",
            || {
                Instant::now() > first + ms(40) && {
                    let stats = engine.stats().total;
                    stats.pending == 0
                }
            },
            || format!("{} ran, {:?}", book.total(), engine.stats().total),
        );
        std::thread::sleep(ms(20));
        let cancelled: Vec<bool> = cancelled.iter().map(|c| c.load(Ordering::SeqCst)).collect();
        let deadlines: Vec<u64> = (0..N)
            .map(|id| deadlines[id].max(reset_to[id].load(Ordering::SeqCst)))
            .collect();
        let expected = cancelled.iter().filter(|c| !**c).count();
        assert_eq!(book.check(&deadlines, &cancelled, false), expected);
        agree_and_shut_down(&engine, expected as u64, N as u64);
    });
}

/// A quarter of the burst's callbacks schedule a timer due at once and another a tick
/// later (from walker threads: onto their own shards; from the owner: onto the shard whose
/// lists are out, where they wait on its lane), and a thread streams zero-delay timers at
/// the bursting shard while its lists are out. None is lost, none early, none twice.
#[test]
fn timers_armed_during_the_walk_are_neither_lost_nor_early() {
    within(LIMIT, "timers armed during the walk", || {
        const N: usize = 40_000;
        const CHILDREN: usize = N / 2;
        const STREAM: usize = 20_000;
        let engine = Arc::new(unpinned_balancing(4, true, Some(8)));
        let book = Book::new(N);
        let children = Book::new(CHILDREN);
        let child_deadline: Arc<Vec<AtomicU64>> =
            Arc::new((0..CHILDREN).map(|_| AtomicU64::new(u64::MAX)).collect());
        let first = book.origin + ms(150);
        let weak = Arc::downgrade(&engine);
        let mut rng = Rng(0x5C4E);
        let mut deadlines = Vec::with_capacity(N);
        for id in 0..N {
            let deadline = first + Duration::from_nanos(rng.below(4_000_000));
            deadlines.push(book.ns(deadline));
            let (book, children, child_deadline, weak) = (
                Arc::clone(&book),
                Arc::clone(&children),
                Arc::clone(&child_deadline),
                weak.clone(),
            );
            engine
                .schedule_at(deadline, move || {
                    book.hit(id);
                    if id % 4 != 0 {
                        return;
                    }
                    let Some(engine) = weak.upgrade() else { return };
                    for (k, delay) in [Duration::ZERO, ms(1)].into_iter().enumerate() {
                        let child = id / 2 + k;
                        let at = Instant::now() + delay;
                        child_deadline[child].store(children.ns(at), Ordering::SeqCst);
                        let children = Arc::clone(&children);
                        engine
                            .schedule_at(at, move || children.hit(child))
                            .expect("scheduled from a callback");
                    }
                })
                .expect("scheduled");
        }
        // The stream, from this thread: onto the bursting shard.
        let stream = Book::new(STREAM);
        let mut stream_deadlines = Vec::with_capacity(STREAM);
        sleep_until(first);
        for id in 0..STREAM {
            let at = Instant::now();
            stream_deadlines.push(stream.ns(at));
            let stream = Arc::clone(&stream);
            engine
                .schedule_at(at, move || stream.hit(id))
                .expect("scheduled");
            if id % 64 == 0 {
                std::thread::yield_now();
            }
        }
        wait_for(
            Duration::from_secs(60),
            "timers lost",
            || book.total() >= N && children.total() >= CHILDREN && stream.total() >= STREAM,
            || {
                format!(
                    "burst {}/{N}, children {}/{CHILDREN}, stream {}/{STREAM}, {:?}",
                    book.total(),
                    children.total(),
                    stream.total(),
                    engine.stats().total
                )
            },
        );
        std::thread::sleep(ms(20));
        assert_eq!(book.check(&deadlines, &vec![false; N], false), N);
        let child_deadlines: Vec<u64> = child_deadline
            .iter()
            .map(|d| d.load(Ordering::SeqCst))
            .collect();
        assert_eq!(
            children.check(&child_deadlines, &vec![false; CHILDREN], false),
            CHILDREN
        );
        assert_eq!(
            stream.check(&stream_deadlines, &vec![false; STREAM], false),
            STREAM
        );
        let total = (N + CHILDREN + STREAM) as u64;
        agree_and_shut_down(&engine, total, total);
    });
}

// ---------------------------------------------------------------------------------------
// 3. Waker timers.
// ---------------------------------------------------------------------------------------

/// A waker that records its wakes and the first one's time.
struct Recorder {
    origin: Instant,
    wakes: AtomicU32,
    first: AtomicU64,
}

impl Wake for Recorder {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let _ = self.first.compare_exchange(
            u64::MAX,
            nanos(self.origin.elapsed()),
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }
}

/// A waker of its own (another identity) that wakes a [`Recorder`].
struct Forward(Arc<Recorder>);

impl Wake for Forward {
    fn wake(self: Arc<Self>) {
        self.0.wake_by_ref();
    }
}

/// 30,000 `Sleep`s due together on one shard, polled once each: a burst of waker timers.
/// As it comes due, a quarter are dropped, a quarter reset later, a tenth reset to now
/// (earlier) and a fifth polled again with new wakers, racing the walkers. Every `Sleep` kept completes, none before its deadline
/// (its first wake included, for those not reset later), and every node comes back.
#[test]
fn a_burst_of_sleeps_dropped_and_reset_while_walked() {
    within(LIMIT, "a burst of sleeps", || {
        const N: usize = 30_000;
        let engine = unpinned_balancing(4, true, Some(8));
        let origin = Instant::now();
        let first = origin + ms(150);
        let mut rng = Rng(0x51EE);
        struct Entry<'e> {
            sleep: Option<corewheel::Sleep<'e>>,
            recorder: Arc<Recorder>,
            waker: Waker,
            deadline: Instant,
            later: bool,
            seen_wakes: u32,
            done_at: Option<Instant>,
        }
        let mut entries: Vec<Entry<'_>> = (0..N)
            .map(|_| {
                let deadline = first + Duration::from_nanos(rng.below(3_000_000));
                let recorder = Arc::new(Recorder {
                    origin,
                    wakes: AtomicU32::new(0),
                    first: AtomicU64::new(u64::MAX),
                });
                let waker = Waker::from(Arc::clone(&recorder));
                let mut sleep = engine.sleep_until(deadline);
                let polled = Pin::new(&mut sleep).poll(&mut Context::from_waker(&waker));
                // A thread preempted past `first` while arming finds deadlines already
                // passed: those complete at this poll.
                let done_at = polled.is_ready().then(Instant::now);
                Entry {
                    sleep: Some(sleep),
                    recorder,
                    waker,
                    deadline,
                    later: false,
                    seen_wakes: 0,
                    done_at,
                }
            })
            .collect();
        sleep_until(first);
        for entry in entries.iter_mut().filter(|entry| entry.done_at.is_none()) {
            match rng.below(20) {
                0..=4 => entry.sleep = None,
                5..=9 => {
                    let at = Instant::now() + ms(rng.range(5, 40));
                    if let Some(sleep) = entry.sleep.as_mut() {
                        sleep.reset(at);
                        entry.deadline = at;
                        entry.later = true;
                        let cx = &mut Context::from_waker(&entry.waker);
                        if Pin::new(sleep).poll(cx).is_ready() {
                            entry.done_at = Some(Instant::now());
                        }
                    }
                }
                12..=15 => {
                    // Polled with new wakers while walked: each poll locks the timer to
                    // replace its waker, and a walker that meets it locked sends it back.
                    if let Some(sleep) = entry.sleep.as_mut() {
                        for _ in 0..3 {
                            let waker = Waker::from(Arc::new(Forward(Arc::clone(&entry.recorder))));
                            let cx = &mut Context::from_waker(&waker);
                            if Pin::new(&mut *sleep).poll(cx).is_ready() {
                                entry.done_at = Some(Instant::now());
                                break;
                            }
                            entry.waker = waker;
                        }
                    }
                }
                10 | 11 => {
                    let at = Instant::now();
                    if let Some(sleep) = entry.sleep.as_mut() {
                        if at < entry.deadline {
                            sleep.reset(at);
                            entry.deadline = at;
                        }
                        let cx = &mut Context::from_waker(&entry.waker);
                        if Pin::new(sleep).poll(cx).is_ready() {
                            entry.done_at = Some(Instant::now());
                        }
                    }
                }
                _ => {}
            }
        }
        // A small executor: poll a kept `Sleep` again whenever it was woken.
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let mut left = 0;
            for entry in entries.iter_mut() {
                let Some(sleep) = entry.sleep.as_mut() else {
                    continue;
                };
                if entry.done_at.is_some() {
                    continue;
                }
                let wakes = entry.recorder.wakes.load(Ordering::SeqCst);
                if wakes != entry.seen_wakes {
                    entry.seen_wakes = wakes;
                    let cx = &mut Context::from_waker(&entry.waker);
                    if Pin::new(sleep).poll(cx).is_ready() {
                        entry.done_at = Some(Instant::now());
                        continue;
                    }
                }
                left += 1;
            }
            if left == 0 {
                break;
            }
            assert!(Instant::now() < until, "{left} sleeps never completed");
            std::thread::sleep(ms(2));
        }
        for (id, entry) in entries.iter().enumerate() {
            let Some(done) = entry.done_at else { continue };
            assert!(
                done >= entry.deadline,
                "sleep {id} completed {:?} early",
                entry.deadline - done
            );
            if !entry.later {
                let woke = entry.recorder.first.load(Ordering::SeqCst);
                if woke != u64::MAX {
                    let due = nanos(entry.deadline - origin);
                    assert!(woke >= due, "sleep {id} woken {} ns early", due - woke);
                }
            }
        }
        drop(entries);
        engine.shutdown(PendingTimers::Drop);
        assert!(
            eventually(Duration::from_secs(5), || engine.nodes_in_use() == 0),
            "every node back: {} in use",
            engine.nodes_in_use()
        );
    });
}

// ---------------------------------------------------------------------------------------
// 4. Shutdown and drop from inside walked callbacks, and racing the walk.
// ---------------------------------------------------------------------------------------

/// A callback in the middle of the burst shuts the engine down (it runs on a walker or the
/// owner, whichever claimed it), in both modes; a thread waits with a second shutdown. Each
/// timer ran at most once, ran or was reported by the shutdown (never both, none lost), and
/// every capture and node comes back.
#[test]
fn a_shutdown_from_inside_a_walked_callback_settles_each_timer_once() {
    for (round, pending) in [
        PendingTimers::Drop,
        PendingTimers::Run,
        PendingTimers::Drop,
        PendingTimers::Run,
    ]
    .into_iter()
    .enumerate()
    {
        within(LIMIT, "a shutdown from a walked callback", move || {
            const N: usize = 40_000;
            let engine = Arc::new(unpinned_balancing(3 + round, true, Some(8)));
            let book = Book::new(N);
            let live = Live::default();
            let first = book.origin + ms(150);
            let weak = Arc::downgrade(&engine);
            let mut rng = Rng(0x5D + round as u64);
            let shutter = 1 + rng.below(N as u64 - 1) as usize;
            let mut deadlines = Vec::with_capacity(N);
            // On a loaded machine the shutter may come due while the loop still schedules:
            // the engine then refuses the rest with `Shutdown`, and those never ran.
            let mut refused = vec![false; N];
            for (id, refused) in refused.iter_mut().enumerate() {
                let deadline = first + Duration::from_nanos(rng.below(3_000_000));
                deadlines.push(book.ns(deadline));
                let (book, witness, weak) = (Arc::clone(&book), live.witness(), weak.clone());
                let scheduled = engine.schedule_at(deadline, move || {
                    let _witness = witness;
                    book.hit(id);
                    if id == shutter
                        && let Some(engine) = weak.upgrade()
                    {
                        engine.shutdown(pending);
                    }
                });
                match scheduled {
                    Ok(_) => {}
                    Err(ScheduleError::Shutdown) => *refused = true,
                    Err(error) => panic!("timer {id}: {error:?}"),
                }
            }
            let refused_count = refused.iter().filter(|&&r| r).count() as u64;
            drop(weak);
            sleep_until(first);
            wait_for(
                Duration::from_secs(60),
                "the shutting callback never ran",
                || book.fires[shutter].load(Ordering::SeqCst) == 1,
                || format!("{:?}", engine.stats().total),
            );
            let report = engine.shutdown(pending);
            let ran = book.total() as u64;
            match pending {
                PendingTimers::Drop => {
                    // Early runs are allowed for a shutdown's own runs only (Run mode).
                    let ran_checked = book.check(&deadlines, &vec![false; N], true) as u64;
                    assert_eq!(ran_checked, ran);
                    assert_eq!(
                        ran + report.dropped + refused_count,
                        N as u64,
                        "ran {ran}, refused {refused_count}, {report:?}"
                    );
                    assert_eq!(report.ran, 0);
                }
                PendingTimers::Run => {
                    for (id, &refused) in refused.iter().enumerate() {
                        let expected = u64::from(!refused);
                        let fires = book.fires[id].load(Ordering::SeqCst) as u64;
                        assert_eq!(fires, expected, "timer {id}");
                    }
                    assert_eq!(ran, N as u64 - refused_count);
                    let stats = engine.stats().total;
                    assert_eq!(stats.fired, N as u64 - refused_count, "{stats:?}");
                }
            }
            assert_eq!(engine.stats().total.pending, 0);
            support::assert_all_given_back(&engine, &live);
        });
    }
}

/// A callback in the middle of the burst drops the engine (its last handle), from a
/// walker or the owner. Each timer ran at most once, never early, and every capture is
/// dropped (ran or dropped by the shutdown) within the limit: nothing hangs or leaks.
#[test]
fn the_engine_dropped_from_inside_a_walked_callback() {
    for round in 0..3_u64 {
        within(
            LIMIT,
            "an engine dropped from a walked callback",
            move || {
                const N: usize = 40_000;
                let slot: Arc<Mutex<Option<TimerEngine>>> = Arc::new(Mutex::new(Some(
                    unpinned_balancing(3 + round as usize, true, Some(8)),
                )));
                let book = Book::new(N);
                let live = Live::default();
                let first = book.origin + ms(150);
                let mut rng = Rng(0xD0 + round);
                let dropper = rng.below(N as u64) as usize;
                let mut deadlines = Vec::with_capacity(N);
                {
                    let guard = slot.lock().unwrap();
                    let engine = guard.as_ref().unwrap();
                    for id in 0..N {
                        let deadline = first + Duration::from_nanos(rng.below(3_000_000));
                        deadlines.push(book.ns(deadline));
                        let (book, witness, slot) =
                            (Arc::clone(&book), live.witness(), Arc::clone(&slot));
                        engine
                            .schedule_at(deadline, move || {
                                let _witness = witness;
                                book.hit(id);
                                if id == dropper {
                                    let engine = slot.lock().unwrap().take();
                                    drop(engine);
                                }
                            })
                            .expect("scheduled");
                    }
                }
                wait_for(
                    Duration::from_secs(60),
                    "captures never dropped",
                    || live.count() == 0,
                    || format!("{} captures left, {} ran", live.count(), book.total()),
                );
                assert!(slot.lock().unwrap().is_none(), "the dropper ran");
                book.check(&deadlines, &vec![false; N], true);
            },
        );
    }
}

/// Small bursts shut down at varied moments in both modes, many rounds: hunting a rare
/// hang or a double settle between the last turn taking lists back and walkers.
#[test]
fn many_small_bursts_shut_down_at_varied_moments() {
    within(LIMIT, "small bursts shut down mid-walk", || {
        let mut rng = Rng(0x5AD);
        for round in 0..24_u64 {
            const N: usize = 6_000;
            let pending = if round % 2 == 0 {
                PendingTimers::Drop
            } else {
                PendingTimers::Run
            };
            let engine =
                unpinned_balancing(2 + (round % 5) as usize, true, Some(1 + (round % 3) as u32));
            let book = Book::new(N);
            let live = Live::default();
            let first = book.origin + ms(40);
            let mut deadlines = Vec::with_capacity(N);
            for id in 0..N {
                let deadline = first + Duration::from_nanos(rng.below(1_000_000));
                deadlines.push(book.ns(deadline));
                let (book, witness) = (Arc::clone(&book), live.witness());
                engine
                    .schedule_at(deadline, move || {
                        let _witness = witness;
                        book.hit(id);
                    })
                    .expect("scheduled");
            }
            sleep_until(first + Duration::from_micros(rng.below(1_500)));
            let report = engine.shutdown(pending);
            let ran = book.total() as u64;
            match pending {
                PendingTimers::Drop => {
                    assert_eq!(book.check(&deadlines, &vec![false; N], true) as u64, ran);
                    assert_eq!(ran + report.dropped, N as u64, "round {round}: {report:?}");
                }
                PendingTimers::Run => {
                    assert_eq!(ran, N as u64, "round {round}: {report:?}");
                    assert!((0..N).all(|id| book.fires[id].load(Ordering::SeqCst) == 1));
                }
            }
            support::assert_all_given_back(&engine, &live);
        }
    });
}

// ---------------------------------------------------------------------------------------
// 5. Stuck owners, many due slots, many workers, stealing off.
// ---------------------------------------------------------------------------------------

/// The owner blocks for 300 ms in its first callback of the burst (rescue after 2 ticks),
/// while its lists are out; meanwhile this thread arms a second wave on the same shard.
/// Everything runs once, never early, and within the limit.
#[test]
fn an_owner_stuck_with_its_lists_out_is_rescued() {
    within(LIMIT, "a stuck owner with lists out", || {
        const N: usize = 40_000;
        const WAVE: usize = 5_000;
        let engine = unpinned_balancing(4, true, Some(2));
        let home = home_of(&engine);
        let book = Book::new(N);
        let blocked = Arc::new(AtomicBool::new(false));
        let first = book.origin + ms(150);
        let mut rng = Rng(0x57C);
        let mut deadlines = Vec::with_capacity(N);
        for id in 0..N {
            let deadline = first + Duration::from_nanos(rng.below(3_000_000));
            deadlines.push(book.ns(deadline));
            let (book, blocked) = (Arc::clone(&book), Arc::clone(&blocked));
            engine
                .schedule_at(deadline, move || {
                    book.hit(id);
                    if worker_index() == Some(home) && !blocked.swap(true, Ordering::SeqCst) {
                        std::thread::sleep(ms(300));
                    }
                })
                .expect("scheduled");
        }
        // The owner runs the first run of its queue itself, so this comes true unless
        // everything was run elsewhere first.
        let _ = eventually(Duration::from_secs(30), || {
            blocked.load(Ordering::SeqCst) || book.total() >= N
        });
        let wave = Book::new(WAVE);
        let (wave_deadlines, _) = arm(&engine, &wave, (Instant::now() + ms(5), ms(3)), 0x3A);
        wait_for(
            Duration::from_secs(60),
            "timers lost",
            || book.total() >= N && wave.total() >= WAVE,
            || {
                format!(
                    "burst {}, wave {}, {:?}",
                    book.total(),
                    wave.total(),
                    engine.stats().total
                )
            },
        );
        std::thread::sleep(ms(20));
        assert_eq!(book.check(&deadlines, &vec![false; N], false), N);
        assert_eq!(wave.check(&wave_deadlines, &vec![false; WAVE], false), WAVE);
        // `home_of`'s probe counts as scheduled (and cancelled).
        agree_and_shut_down(&engine, (N + WAVE) as u64, (N + WAVE) as u64 + 1);
    });
}

/// The owner is held in a callback for 80 ms while 60 ticks' worth of a burst come due
/// behind it (rescue off, and on at one tick): when it looks again, far more than eight
/// finest slots are due at once, more than 64 lists, handed out eight slots at a time (by
/// the owner, or by stand-ins). Exactly once, never early.
#[test]
fn a_burst_over_many_due_slots_after_the_owner_was_held() {
    for rescue in [None, Some(1)] {
        within(LIMIT, "a burst over many slots", move || {
            const N: usize = 60_000;
            let engine = unpinned_balancing(3, true, rescue);
            let home = home_of(&engine);
            let book = Book::new(N);
            let origin = book.origin;
            let held = Arc::new(AtomicBool::new(false));
            {
                let held = Arc::clone(&held);
                engine
                    .schedule_at(origin + ms(100), move || {
                        held.store(true, Ordering::SeqCst);
                        if worker_index() == Some(home) {
                            std::thread::sleep(ms(80));
                        }
                    })
                    .expect("scheduled");
            }
            let (deadlines, _) = arm(&engine, &book, (origin + ms(102), ms(60)), 0x60);
            wait_for(
                Duration::from_secs(60),
                "timers lost",
                || book.total() >= N,
                || format!("{} of {N}, {:?}", book.total(), engine.stats().total),
            );
            std::thread::sleep(ms(20));
            assert_eq!(book.check(&deadlines, &vec![false; N], false), N);
            // The blocker, and `home_of`'s probe (scheduled and cancelled).
            agree_and_shut_down(&engine, N as u64 + 1, N as u64 + 2);
        });
    }
}

/// Sixteen workers on two cores, three bursts on three shards at once (from three threads),
/// with a callback in a hundred panicking and repeating timers among them; then stealing
/// off with the same load (nothing handed out). Exactly once, never early (repeating runs
/// included), panics counted, every node back.
#[test]
fn many_workers_several_bursting_shards_panics_and_stealing_off() {
    support::quiet_panics_marked("hostile-hand-out");
    for (workers, stealing) in [(16, true), (12, true), (8, false)] {
        within(LIMIT, "many workers", move || {
            const N: usize = 20_000;
            const THREADS: usize = 3;
            let engine = Arc::new(unpinned_balancing(workers, stealing, Some(8)));
            let origin = Instant::now();
            let first = origin + ms(200);
            // Repeating timers, armed by the first bursting thread, first due inside its
            // burst.
            const REPEATING: usize = 300;
            let period = ms(3);
            let runs: Arc<Vec<Mutex<Vec<u64>>>> =
                Arc::new((0..REPEATING).map(|_| Mutex::new(Vec::new())).collect());
            type Out = (Arc<Book>, Vec<u64>, Vec<(TimerHandle, (u64, u64, usize))>);
            let results: Vec<Out> = std::thread::scope(|scope| {
                let threads: Vec<_> = (0..THREADS)
                    .map(|t| {
                        let (engine, runs) = (&engine, &runs);
                        scope.spawn(move || {
                            let book = Book::new(N);
                            let mut rng = Rng(0x16 + t as u64);
                            let mut deadlines = Vec::with_capacity(N);
                            for id in 0..N {
                                let deadline = first + Duration::from_nanos(rng.below(3_000_000));
                                deadlines.push(book.ns(deadline));
                                let book = Arc::clone(&book);
                                engine
                                    .schedule_at(deadline, move || {
                                        book.hit(id);
                                        if id % 100 == 37 {
                                            panic!("hostile-hand-out");
                                        }
                                    })
                                    .expect("scheduled");
                            }
                            let mut repeating = Vec::new();
                            for id in (0..REPEATING).filter(|_| t == 0) {
                                let runs_of = Arc::clone(runs);
                                let missed =
                                    [MissedTicks::Skip, MissedTicks::Burst, MissedTicks::Delay]
                                        [id % 3];
                                let armed = Instant::now();
                                let handle = engine
                                    .schedule_repeating_with(period, missed, move || {
                                        runs_of[id].lock().unwrap().push(nanos(origin.elapsed()));
                                    })
                                    .expect("scheduled");
                                let start = first + Duration::from_micros((id as u64 * 11) % 3_000);
                                // Fails only if it ran already (a preempted thread): then
                                // its first run was due a period after it was armed.
                                let start = if engine.reset_at(handle, start) {
                                    start
                                } else {
                                    armed + period
                                };
                                // Runs recorded by now came before the reset (a thread
                                // preempted for a period): due from `armed` on.
                                let early_runs = runs[id].lock().unwrap().len();
                                repeating.push((
                                    handle,
                                    (nanos(start - origin), nanos(armed - origin), early_runs),
                                ));
                            }
                            (book, deadlines, repeating)
                        })
                    })
                    .collect();
                threads.into_iter().map(|t| t.join().unwrap()).collect()
            });
            let (handles, starts): (Vec<TimerHandle>, Vec<(u64, u64, usize)>) =
                results.iter().flat_map(|r| r.2.iter().copied()).unzip();
            wait_for(
                Duration::from_secs(60),
                "timers lost",
                || results.iter().all(|(book, _, _)| book.total() >= N),
                || {
                    let totals: Vec<usize> = results.iter().map(|(b, _, _)| b.total()).collect();
                    format!("{totals:?} of {N}, {:?}", engine.stats().total)
                },
            );
            std::thread::sleep(ms(30));
            for handle in handles {
                assert!(engine.cancel(handle), "a repeating timer was still pending");
            }
            std::thread::sleep(ms(10));
            for (book, deadlines, _) in &results {
                assert_eq!(book.check(deadlines, &vec![false; N], false), N);
            }
            for id in 0..REPEATING {
                let runs = runs[id].lock().unwrap();
                assert!(!runs.is_empty(), "repeating timer {id} never ran");
                let (start, armed, early_runs) = starts[id];
                for (k, &at) in runs.iter().enumerate() {
                    let earliest = match k.checked_sub(early_runs) {
                        Some(k) => start + k as u64 * nanos(period),
                        None => armed + (k as u64 + 1) * nanos(period),
                    };
                    assert!(
                        at >= earliest,
                        "repeating timer {id} run {k} at {at} ns, before {earliest}"
                    );
                }
            }
            let stats = engine.stats().total;
            let repeats: u64 = runs.iter().map(|r| r.lock().unwrap().len() as u64).sum();
            assert_eq!(stats.fired, (THREADS * N) as u64 + repeats, "{stats:?}");
            assert_eq!(stats.panicked, (THREADS * N / 100) as u64, "{stats:?}");
            assert_eq!(stats.pending, 0, "{stats:?}");
            engine.shutdown(PendingTimers::Drop);
            assert_eq!(engine.nodes_in_use(), 0);
        });
    }
}

// ---------------------------------------------------------------------------------------
// 6. A slow callback and what it holds up.
// ---------------------------------------------------------------------------------------

/// The documented bound (`EngineBuilder::rescue_after`, README "Expiry balancing"): only
/// "timers due at the same tick as a slow callback and claimed in the same run (at most
/// 32)" wait for it. A burst of 20,000 timers due at one tick on 3 workers with rescue on;
/// the first callback that runs on a worker other than the owner blocks until the end.
/// Every other timer should run while it blocks, but for at most 31.
#[test]
fn a_blocked_walker_holds_up_no_more_than_a_run() {
    within(LIMIT, "a blocked walker", || {
        const N: usize = 20_000;
        let engine = unpinned_balancing(3, true, Some(2));
        let home = home_of(&engine);
        let book = Book::new(N);
        let gate = Gate::default();
        let _open = OpenOnDrop(gate.clone());
        let blocker = Arc::new(AtomicBool::new(false));
        let at = Instant::now() + ms(150);
        let deadlines = vec![book.ns(at); N];
        for id in 0..N {
            let (book, blocker, gate) = (Arc::clone(&book), Arc::clone(&blocker), gate.clone());
            engine
                .schedule_at(at, move || {
                    book.hit(id);
                    let me = worker_index();
                    if me.is_some() && me != Some(home) && !blocker.swap(true, Ordering::SeqCst) {
                        gate.wait();
                    }
                })
                .expect("scheduled");
        }
        let someone_blocked = eventually(Duration::from_secs(30), || {
            blocker.load(Ordering::SeqCst) || book.total() >= N
        }) && blocker.load(Ordering::SeqCst);
        // Let everything that can run do so.
        let _ = eventually(Duration::from_secs(10), || book.total() >= N - 31);
        let held = N - book.total();
        eprintln!(
            "blocked: {someone_blocked}, held {held}, {:?}",
            engine.stats().total
        );
        gate.open();
        wait_for(
            Duration::from_secs(30),
            "timers lost",
            || book.total() >= N,
            || format!("{} of {N}", book.total()),
        );
        assert_eq!(book.check(&deadlines, &vec![false; N], false), N);
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0);
        assert!(
            !someone_blocked || held <= 31,
            "{held} timers waited for one blocked callback (documented: at most 31 others, \
             claimed with it in one run of 32)"
        );
    });
}

/// The owner blocks (until a gate opens) in a callback it runs well into its burst's walk,
/// with rescue after 2 ticks. Its lists are walked to the end by the helpers; a stand-in
/// must then take them back to receive anything more. A second wave armed on the same
/// shard meanwhile must run in full while the owner is still blocked ("another worker
/// claims and runs its due timers until it is back"), and everything runs once, never
/// early.
#[test]
fn a_stand_in_takes_back_lists_from_an_owner_blocked_in_its_walk() {
    within(LIMIT, "an owner blocked in its walk", || {
        const N: usize = 30_000;
        const WAVE: usize = 3_000;
        let engine = unpinned_balancing(3, true, Some(2));
        let home = home_of(&engine);
        let book = Book::new(N);
        let gate = Gate::default();
        let _open = OpenOnDrop(gate.clone());
        let blocked = Arc::new(AtomicBool::new(false));
        let at = Instant::now() + ms(150);
        let deadlines = vec![book.ns(at); N];
        for id in 0..N {
            let (book, blocked, gate) = (Arc::clone(&book), Arc::clone(&blocked), gate.clone());
            engine
                .schedule_at(at, move || {
                    book.hit(id);
                    if worker_index() == Some(home)
                        && book.total() >= 4_000
                        && !blocked.swap(true, Ordering::SeqCst)
                    {
                        gate.wait();
                    }
                })
                .expect("scheduled");
        }
        let owner_blocked = eventually(Duration::from_secs(30), || {
            blocked.load(Ordering::SeqCst) || book.total() >= N
        }) && blocked.load(Ordering::SeqCst);
        let wave = Book::new(WAVE);
        let (wave_deadlines, _) = arm(&engine, &wave, (Instant::now() + ms(5), ms(3)), 0x3B);
        let wave_ran_while_blocked = eventually(Duration::from_secs(20), || wave.total() >= WAVE);
        let ran_while_blocked = book.total();
        gate.open();
        wait_for(
            Duration::from_secs(30),
            "timers lost",
            || book.total() >= N && wave.total() >= WAVE,
            || format!("burst {}, wave {}", book.total(), wave.total()),
        );
        std::thread::sleep(ms(20));
        assert_eq!(book.check(&deadlines, &vec![false; N], false), N);
        assert_eq!(wave.check(&wave_deadlines, &vec![false; WAVE], false), WAVE);
        // `home_of`'s probe counts as scheduled (and cancelled).
        agree_and_shut_down(&engine, (N + WAVE) as u64, (N + WAVE) as u64 + 1);
        if owner_blocked {
            assert!(
                wave_ran_while_blocked,
                "the wave did not run while the owner was blocked (burst ran {ran_while_blocked})"
            );
        } else {
            eprintln!("the owner never ran a callback after 4,000: nothing blocked");
        }
    });
}

/// The owner is blocked (a gate) before a burst of 40,000 timers at one tick comes due;
/// stand-ins (rescue after one tick) claim it, and a stand-in's look hands the lists out
/// for the helpers to walk. A shutdown (both modes) lands while they are out; the owner
/// is released 50 ms later, and its last turn takes back whatever is left. Each timer ran
/// once or was reported by the shutdown, never early unless the shutdown ran it, every
/// capture and node back.
#[test]
fn a_shutdown_while_a_stand_ins_lists_are_out() {
    for (round, pending) in [PendingTimers::Drop, PendingTimers::Run, PendingTimers::Drop]
        .into_iter()
        .enumerate()
    {
        within(LIMIT, "a shutdown with a stand-in's lists out", move || {
            const N: usize = 40_000;
            let engine = Arc::new(unpinned_balancing(3 + round, true, Some(1)));
            let home = home_of(&engine);
            let gate = Gate::default();
            let _open = OpenOnDrop(gate.clone());
            let book = Book::new(N);
            let live = Live::default();
            let origin = book.origin;
            let owner_blocked = Arc::new(AtomicBool::new(false));
            {
                let (gate, owner_blocked) = (gate.clone(), Arc::clone(&owner_blocked));
                engine
                    .schedule_at(origin + ms(100), move || {
                        if worker_index() == Some(home) {
                            owner_blocked.store(true, Ordering::SeqCst);
                            gate.wait();
                        }
                    })
                    .expect("scheduled");
            }
            let at = origin + ms(140);
            let deadlines = vec![book.ns(at); N];
            for id in 0..N {
                let (book, witness) = (Arc::clone(&book), live.witness());
                engine
                    .schedule_at(at, move || {
                        let _witness = witness;
                        book.hit(id);
                    })
                    .expect("scheduled");
            }
            // Shut down as the burst is being walked.
            let _ = eventually(Duration::from_secs(20), || book.total() >= 2_000);
            let shutting = {
                let engine = Arc::clone(&engine);
                std::thread::spawn(move || engine.shutdown(pending))
            };
            std::thread::sleep(ms(50));
            gate.open();
            let report = shutting.join().expect("shutdown");
            let report2 = engine.shutdown(pending);
            assert_eq!(report, report2, "the first call waited for every worker");
            let ran = book.total() as u64;
            match pending {
                PendingTimers::Drop => {
                    assert_eq!(book.check(&deadlines, &vec![false; N], true) as u64, ran);
                    assert_eq!(ran + report.dropped, N as u64, "ran {ran}, {report:?}");
                }
                PendingTimers::Run => {
                    assert!((0..N).all(|id| book.fires[id].load(Ordering::SeqCst) == 1));
                }
            }
            let stats = engine.stats().total;
            assert_eq!(stats.pending, 0, "{stats:?}");
            eprintln!(
                "owner blocked {}, claimed elsewhere {}, rescued {}, {report:?}",
                owner_blocked.load(Ordering::SeqCst),
                stats.claimed_elsewhere,
                stats.rescued
            );
            support::assert_all_given_back(&engine, &live);
        });
    }
}

/// Back-to-back bursts (3,000 timers due every tick for 150 ticks, on one shard, 16
/// workers) keep lists out most of the time, while another thread cancels a third of them
/// as they come due and arms zero-delay timers on the same shard: those wait on the lanes
/// whenever lists are out. Nothing is lost or starved (all run within the limit), nothing
/// early, nothing twice.
#[test]
fn back_to_back_bursts_with_a_cancel_storm_and_arrivals() {
    within(LIMIT, "back-to-back bursts", || {
        const PER_TICK: usize = 3_000;
        const TICKS: usize = 150;
        const N: usize = PER_TICK * TICKS;
        const ARRIVALS: usize = 5_000;
        let engine = Arc::new(unpinned_balancing(16, true, Some(8)));
        let book = Book::new(N);
        let first = book.origin + ms(250);
        let mut deadlines = Vec::with_capacity(N);
        let mut handles = Vec::with_capacity(N);
        for id in 0..N {
            let deadline =
                first + ms((id / PER_TICK) as u64) + Duration::from_micros(id as u64 % 997);
            deadlines.push(book.ns(deadline));
            let book = Arc::clone(&book);
            handles.push(
                engine
                    .schedule_at(deadline, move || book.hit(id))
                    .expect("scheduled"),
            );
        }
        let arrivals = Book::new(ARRIVALS);
        let (cancelled, arrival_deadlines) = std::thread::scope(|scope| {
            let canceller = scope.spawn(|| {
                let mut cancelled = vec![false; N];
                sleep_until(first);
                for id in (0..N).step_by(3) {
                    cancelled[id] = engine.cancel(handles[id]);
                }
                cancelled
            });
            // Arrivals from this thread: onto the bursting shard.
            sleep_until(first);
            let mut arrival_deadlines = Vec::with_capacity(ARRIVALS);
            for id in 0..ARRIVALS {
                let at = Instant::now();
                arrival_deadlines.push(arrivals.ns(at));
                let arrivals = Arc::clone(&arrivals);
                engine
                    .schedule_at(at, move || arrivals.hit(id))
                    .expect("scheduled");
                if id % 32 == 0 {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
            (canceller.join().unwrap(), arrival_deadlines)
        });
        let expected = cancelled.iter().filter(|c| !**c).count();
        wait_for(
            Duration::from_secs(70),
            "timers lost or starved",
            || book.total() >= expected && arrivals.total() >= ARRIVALS,
            || {
                format!(
                    "{} of {expected}, arrivals {} of {ARRIVALS}, {:?}",
                    book.total(),
                    arrivals.total(),
                    engine.stats().total
                )
            },
        );
        std::thread::sleep(ms(20));
        assert_eq!(book.check(&deadlines, &cancelled, false), expected);
        assert_eq!(
            arrivals.check(&arrival_deadlines, &vec![false; ARRIVALS], false),
            ARRIVALS
        );
        agree_and_shut_down(&engine, (expected + ARRIVALS) as u64, (N + ARRIVALS) as u64);
    });
}

/// Two threads reset every timer of a 40,000-timer burst again and again as it is walked,
/// alternating between its own deadline and a millisecond earlier (a message): each reset
/// locks the timer for a moment, and a walker that meets it locked sends it back, to be
/// filed as due and judged again. The last reset that returned `true` is the deadline:
/// each timer runs once, never before it.
#[test]
fn timers_reset_over_and_over_while_walked() {
    within(LIMIT, "resets over and over", || {
        const N: usize = 40_000;
        let engine = Arc::new(unpinned_balancing(4, true, Some(8)));
        let book = Book::new(N);
        let first = book.origin + ms(150);
        let (deadlines, handles) = arm(&engine, &book, (first, ms(2)), 0x7E5E7);
        let outcomes: Vec<(usize, u64)> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..2)
                .map(|t| {
                    let (engine, handles, book, deadlines) = (&engine, &handles, &book, &deadlines);
                    scope.spawn(move || {
                        let mut last: Vec<u64> =
                            (t..N).step_by(2).map(|id| deadlines[id]).collect();
                        sleep_until(first - ms(1));
                        let until = Instant::now() + ms(150);
                        let mut pass = 0_u64;
                        while Instant::now() < until && book.total() < N {
                            for (k, id) in (t..N).step_by(2).enumerate() {
                                let at = book.origin + Duration::from_nanos(deadlines[id])
                                    - if (pass + k as u64) % 2 == 0 {
                                        ms(0)
                                    } else {
                                        ms(1)
                                    };
                                if engine.reset_at(handles[id], at) {
                                    last[k] = book.ns(at);
                                }
                            }
                            pass += 1;
                        }
                        (t..N).step_by(2).zip(last).collect::<Vec<_>>()
                    })
                })
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().expect("resetter"))
                .collect()
        });
        let mut final_deadlines = deadlines.clone();
        for (id, deadline) in outcomes {
            final_deadlines[id] = deadline;
        }
        wait_for(
            Duration::from_secs(60),
            "timers lost",
            || book.total() >= N,
            || format!("{} of {N}, {:?}", book.total(), engine.stats().total),
        );
        std::thread::sleep(ms(20));
        assert_eq!(book.check(&final_deadlines, &vec![false; N], false), N);
        agree_and_shut_down(&engine, N as u64, N as u64);
    });
}

/// A small pool (4,096 nodes a shard) and a burst of 3,500 timers at one tick whose
/// callbacks cancel each other's neighbours and schedule new timers: cancelled nodes wait
/// for their messages while lists are out, so schedules may fail for want of nodes, but
/// nothing hangs, nothing runs twice or early, and every node comes back.
#[test]
fn a_tight_pool_under_a_walked_burst() {
    within(LIMIT, "a tight pool", || {
        const N: usize = 3_500;
        let engine = Arc::new(
            TimerEngine::builder()
                .workers(3)
                .pin_workers(false)
                .capacity(4_096)
                .build()
                .expect("workers start"),
        );
        let book = Book::new(N);
        let children = Book::new(N);
        let child_deadline: Arc<Vec<AtomicU64>> =
            Arc::new((0..N).map(|_| AtomicU64::new(u64::MAX)).collect());
        let scheduled_children = Arc::new(AtomicUsize::new(0));
        let handles: Arc<OnceLock<Vec<TimerHandle>>> = Arc::default();
        let cancelled: Arc<Vec<AtomicBool>> =
            Arc::new((0..N).map(|_| AtomicBool::new(false)).collect());
        let weak = Arc::downgrade(&engine);
        let at = book.origin + ms(120);
        let list: Vec<TimerHandle> =
            (0..N)
                .map(|id| {
                    let (
                        book,
                        children,
                        child_deadline,
                        scheduled_children,
                        handles,
                        cancelled,
                        weak,
                    ) = (
                        Arc::clone(&book),
                        Arc::clone(&children),
                        Arc::clone(&child_deadline),
                        Arc::clone(&scheduled_children),
                        Arc::clone(&handles),
                        Arc::clone(&cancelled),
                        weak.clone(),
                    );
                    engine
                        .schedule_at(at, move || {
                            book.hit(id);
                            let Some(engine) = weak.upgrade() else { return };
                            if id % 2 == 0 {
                                let target = (id + 1) % N;
                                if engine.cancel(handles.get().unwrap()[target]) {
                                    cancelled[target].store(true, Ordering::SeqCst);
                                }
                            }
                            let due = Instant::now();
                            child_deadline[id].store(children.ns(due), Ordering::SeqCst);
                            let children2 = Arc::clone(&children);
                            if engine.schedule_at(due, move || children2.hit(id)).is_ok() {
                                scheduled_children.fetch_add(1, Ordering::SeqCst);
                            } else {
                                child_deadline[id].store(u64::MAX, Ordering::SeqCst);
                            }
                        })
                        .expect("scheduled")
                })
                .collect();
        handles.set(list).expect("once");
        wait_for(
            Duration::from_secs(30),
            "timers lost",
            || {
                Instant::now() > at + ms(20)
                    && engine.stats().total.pending == 0
                    && children.total() >= scheduled_children.load(Ordering::SeqCst)
            },
            || format!("{} ran, {:?}", book.total(), engine.stats().total),
        );
        std::thread::sleep(ms(20));
        let cancelled: Vec<bool> = cancelled.iter().map(|c| c.load(Ordering::SeqCst)).collect();
        let expected = cancelled.iter().filter(|c| !**c).count();
        assert_eq!(
            book.check(&vec![book.ns(at); N], &cancelled, false),
            expected
        );
        let child_deadlines: Vec<u64> = child_deadline
            .iter()
            .map(|d| d.load(Ordering::SeqCst))
            .collect();
        let not_scheduled: Vec<bool> = child_deadlines.iter().map(|&d| d == u64::MAX).collect();
        let ran_children = children.check(&child_deadlines, &not_scheduled, true);
        assert_eq!(ran_children, scheduled_children.load(Ordering::SeqCst));
        eprintln!(
            "tight pool: {expected} ran, {ran_children} children of {N}, {:?}",
            engine.stats().total
        );
        engine.shutdown(PendingTimers::Drop);
        assert!(eventually(Duration::from_secs(5), || engine.nodes_in_use() == 0));
    });
}
