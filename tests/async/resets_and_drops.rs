//! Resets and drops of the async layer: the same-tick reset shortcut (`Sleep::reset_to`), a
//! reset that forgets a fired timer instead of defusing its wake, `Sleep` deadlines from the
//! thread's cycle-counter anchor (`EngineShared::instant_after`), an `Interval` that stays
//! pending after shutdown, and drops that never wait.
//!
//! Real-clock tests assert only what holds on a loaded 2-core machine: never early, nothing
//! lost, nothing leaked, with generous time limits.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crate::support::leaked_unpinned_tick as leaked_real;
use crate::support::{Wakes, manual, poll, within};
use corewheel::{ManualClock, MissedTicks, PendingTimers, Sleep, TimerEngine};

const MS: Duration = Duration::from_millis(1);
const US: Duration = Duration::from_micros(1);
const LIMIT: Duration = Duration::from_secs(60);

/// Wakes a parked thread, counting its wakes.
struct Unpark(Thread, AtomicUsize);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0.unpark();
    }
}

fn leaked_manual_tick(tick: Duration) -> (&'static TimerEngine, ManualClock) {
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(1)
        .tick(tick)
        .manual_clock(clock.clone())
        .build()
        .unwrap();
    (Box::leak(Box::new(engine)), clock)
}

/// Whether a `Sleep` that says it completed is at or past its deadline.
fn honest(sleep: &Sleep<'_>, now: Instant) -> bool {
    !sleep.is_elapsed() || now >= sleep.deadline()
}

// ---------------------------------------------------------------- (1) early completion

/// The same-tick shortcut on a fired (claimed, not yet polled) and on a completed (polled
/// Ready) `Sleep`, on a coarse 10 ms tick where a later deadline in the same tick is easy:
/// every reset target in the fired tick, before and after the fire's poll, with
/// `is_elapsed` and poll checked against the clock after each.
#[test]
fn same_tick_resets_of_a_fired_sleep_never_complete_early() {
    let (engine, clock) = leaked_manual_tick(10 * MS);
    let (_, waker) = Wakes::waker();
    for polled_ready in [false, true] {
        for offset_us in [0u64, 1, 999, 4_000, 9_000, 9_999, 10_000, 10_001, 25_000] {
            let start = engine.now();
            let mut sleep = engine.sleep_until(start + 3 * MS);
            assert!(poll(&mut sleep, &waker).is_pending());
            clock.advance(10 * MS);
            engine.turn();
            assert!(sleep.is_elapsed());
            if polled_ready {
                assert!(poll(&mut sleep, &waker).is_ready());
            }
            let target = start + Duration::from_micros(offset_us);
            sleep.reset(target);
            let now = engine.now();
            assert!(
                honest(&sleep, now),
                "reset to +{offset_us}us: is_elapsed with now {:?} before deadline",
                sleep.deadline() - now
            );
            let ready = poll(&mut sleep, &waker).is_ready();
            assert!(
                !ready || engine.now() >= sleep.deadline(),
                "reset to +{offset_us}us (polled_ready {polled_ready}): Ready before the deadline"
            );
            // Whatever happened, it completes once its deadline is past, and only then.
            for _ in 0..5 {
                if poll(&mut sleep, &waker).is_ready() {
                    break;
                }
                clock.advance(10 * MS);
                engine.turn();
            }
            assert!(
                poll(&mut sleep, &waker).is_ready(),
                "+{offset_us}us never came"
            );
            assert!(engine.now() >= sleep.deadline());
        }
    }
    assert_eq!(engine.nodes_in_use(), 0);
}

/// A pending `Sleep` reset to a later deadline in the same tick, then to an earlier one in
/// the same tick, then the clock is stepped by 1 ms: it must not complete before any
/// deadline it holds, and must complete by the tick's end.
#[test]
fn same_tick_resets_of_a_pending_sleep_are_neither_early_nor_lost() {
    let (engine, clock) = leaked_manual_tick(10 * MS);
    let (wakes, waker) = Wakes::waker();
    let start = engine.now();
    let mut sleep = engine.sleep_until(start + 2 * MS);
    assert!(poll(&mut sleep, &waker).is_pending());
    sleep.reset(start + 9 * MS);
    sleep.reset(start + 5 * MS);
    sleep.reset(start + 10 * MS);
    for _ in 0..10 {
        clock.advance(MS);
        engine.turn();
        let ready = poll(&mut sleep, &waker).is_ready();
        assert!(!ready || engine.now() >= sleep.deadline(), "early");
        assert!(honest(&sleep, engine.now()));
    }
    assert!(poll(&mut sleep, &waker).is_ready(), "lost");
    assert!(
        wakes.0.load(Ordering::SeqCst) >= 1,
        "completed without a wake"
    );
}

/// Resets after shutdown: a fired-at-shutdown `Sleep` reset into the same tick, to a
/// later tick, and to never; an unpolled one reset. Nothing panics or hangs, and nothing
/// is left in the pool.
#[test]
fn resets_after_shutdown_neither_panic_nor_hang() {
    within(LIMIT, "resets after shutdown", || {
        let (engine, _clock) = leaked_manual_tick(10 * MS);
        let (_, waker) = Wakes::waker();
        let start = engine.now();
        let mut a = engine.sleep_until(start + 50 * MS);
        let mut b = engine.sleep_until(start + 50 * MS);
        let mut c = engine.sleep(Duration::MAX);
        let mut d = engine.sleep_until(start + 50 * MS);
        for s in [&mut a, &mut b, &mut c] {
            assert!(poll(s, &waker).is_pending());
        }
        engine.shutdown(PendingTimers::Drop);
        a.reset(start + 55 * MS); // same tick
        b.reset(start + 500 * MS);
        c.reset(start + 500 * MS);
        d.reset(start + 500 * MS);
        let mut e = engine.sleep(Duration::MAX);
        for s in [&mut a, &mut b, &mut c, &mut d, &mut e] {
            let _ = poll(s, &waker);
            s.reset(start);
            let _ = poll(s, &waker);
            let _ = s.is_elapsed();
        }
        drop((a, b, c, d, e));
        assert_eq!(engine.nodes_in_use(), 0);
    });
}

/// `instant_after`: a `Sleep`'s deadline is never before `Instant::now()` taken before
/// `sleep()` plus the delay, on many threads (which may migrate between cores) and across
/// anchor refreshes; and the `Sleep` never completes before that either.
#[test]
fn sleep_deadline_is_never_before_now_plus_delay() {
    let engine = leaked_real(2, MS);
    let bad = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let bad = Arc::clone(&bad);
            std::thread::spawn(move || {
                for i in 0..200_000u64 {
                    let delay = Duration::from_nanos((i * 7919 + t) % 3_000_000);
                    let before = Instant::now();
                    let sleep = engine.sleep(delay);
                    if sleep.deadline() < before + delay {
                        bad.fetch_add(1, Ordering::SeqCst);
                    }
                    if i % 1000 == 0 {
                        std::thread::yield_now();
                    }
                    if i % 20_000 == 0 {
                        std::thread::sleep(Duration::from_micros(1500)); // past an anchor's life
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(
        bad.load(Ordering::SeqCst),
        0,
        "deadlines before now + delay"
    );
    // And completion: never before before + delay.
    within(LIMIT, "real sleeps", move || {
        futures::executor::block_on(async {
            for i in 0..200u32 {
                let delay = Duration::from_micros(u64::from(i % 7) * 300);
                let before = Instant::now();
                engine.sleep(delay).await;
                assert!(before.elapsed() >= delay, "sleep {i} completed early");
            }
        });
    });
}

// ---------------------------------------------------------------- (2) lost wake-ups

/// A task polls a shared `Sleep` on its own thread (parking between polls, no timeout);
/// another thread resets it, at random around its deadline, to deadlines in the same tick
/// and in others, earlier and later, and past ones, while the engine runs. After the
/// resetter's last reset the task must be woken and complete, at or after the deadline.
#[test]
fn resets_from_another_thread_around_the_fire_never_lose_the_wake() {
    let engine = leaked_real(2, MS);
    within(Duration::from_secs(120), "reset race", move || {
        for round in 0..300u64 {
            let sleep = Arc::new(Mutex::new(
                engine.sleep(Duration::from_micros(round % 2000)),
            ));
            let done = Arc::new(AtomicBool::new(false));
            let task = {
                let sleep = Arc::clone(&sleep);
                let done = Arc::clone(&done);
                std::thread::spawn(move || {
                    let waker = Waker::from(Arc::new(Unpark(
                        std::thread::current(),
                        AtomicUsize::new(0),
                    )));
                    loop {
                        {
                            let mut s = sleep.lock().unwrap();
                            if poll(&mut *s, &waker).is_ready() {
                                let now = Instant::now();
                                assert!(now >= s.deadline(), "round {round}: early");
                                break;
                            }
                        }
                        // No timeout: a lost wake hangs, and `within` reports it.
                        std::thread::park();
                    }
                    done.store(true, Ordering::SeqCst);
                })
            };
            let mut x = round.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for _ in 0..(round % 7) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                std::thread::sleep(Duration::from_micros(x % 1500));
                let mut s = sleep.lock().unwrap();
                let base = s.deadline();
                let target = match x % 5 {
                    0 => base + Duration::from_micros(x % 900), // often the same tick
                    1 => base + Duration::from_micros(1000 + x % 2000),
                    2 => Instant::now(),
                    3 => Instant::now() - MS,
                    _ => Instant::now() + Duration::from_micros(x % 3000),
                };
                s.reset(target);
            }
            task.join().unwrap();
            assert!(done.load(Ordering::SeqCst));
        }
        // Every Sleep is dropped; the pool drains within a few ticks.
        let until = Instant::now() + Duration::from_secs(5);
        while engine.nodes_in_use() != 0 && Instant::now() < until {
            std::thread::sleep(MS);
        }
        assert_eq!(engine.nodes_in_use(), 0, "nodes leaked");
    });
}

/// The task that resets is the task that polls: it polls (Pending), spins until the
/// deadline is past (the fire may be claimed or not), resets to a later deadline (same
/// tick or not), polls with a *different* waker, and parks. It must be woken.
#[test]
fn self_reset_after_the_fire_then_a_new_waker_is_woken() {
    let engine = leaked_real(2, MS);
    within(Duration::from_secs(120), "self reset", move || {
        for round in 0..500u64 {
            let mut sleep = engine.sleep(Duration::from_micros(200 + round % 800));
            let first = Waker::from(Arc::new(Unpark(
                std::thread::current(),
                AtomicUsize::new(0),
            )));
            assert!(poll(&mut sleep, &first).is_pending());
            let deadline = sleep.deadline();
            while Instant::now() < deadline + Duration::from_micros(round % 1200) {
                std::hint::spin_loop();
            }
            sleep.reset(deadline + Duration::from_micros(round * 37 % 1600));
            let second = Arc::new(Unpark(std::thread::current(), AtomicUsize::new(0)));
            let second_waker = Waker::from(Arc::clone(&second));
            loop {
                if poll(&mut sleep, &second_waker).is_ready() {
                    assert!(Instant::now() >= sleep.deadline(), "round {round}: early");
                    break;
                }
                std::thread::park();
            }
        }
    });
}

// ---------------------------------------------------------------- (3) Interval

/// A period shorter than the engine tick: `reset_to` of the next tick then always hits the
/// same-tick shortcut on a fired timer. Ticks must stay at or before now, consecutive, and
/// keep coming (no Pending without a wake), under every missed-tick policy.
#[test]
fn sub_tick_period_intervals_are_neither_early_nor_stuck() {
    for policy in [MissedTicks::Burst, MissedTicks::Delay, MissedTicks::Skip] {
        let (engine, clock) = leaked_manual_tick(10 * MS);
        let (wakes, waker) = Wakes::waker();
        let mut interval = engine.interval(Duration::from_micros(700));
        interval.set_missed_tick_behavior(policy);
        let mut last: Option<Instant> = None;
        let mut ticks = 0;
        for step in 0..200 {
            let before = wakes.0.load(Ordering::SeqCst);
            match Pin::new(&mut interval).poll_tick(&mut Context::from_waker(&waker)) {
                Poll::Ready(due) => {
                    assert!(due <= engine.now(), "{policy:?} step {step}: early tick");
                    if let Some(last) = last {
                        assert!(due > last, "{policy:?}: ticks went backwards");
                    }
                    last = Some(due);
                    ticks += 1;
                }
                Poll::Pending => {
                    // A Pending must be followed by a wake once the deadline's tick is past.
                    clock.advance(10 * MS);
                    engine.turn();
                    assert!(
                        wakes.0.load(Ordering::SeqCst) > before,
                        "{policy:?} step {step}: Pending, tick passed, no wake"
                    );
                }
            }
        }
        assert!(ticks > 50, "{policy:?}: only {ticks} ticks");
    }
}

/// Same, on a real clock driven by a real executor: a sub-tick interval keeps ticking.
#[test]
fn sub_tick_period_interval_keeps_ticking_on_a_real_clock() {
    let engine = leaked_real(1, MS);
    within(LIMIT, "sub-tick interval", move || {
        futures::executor::block_on(async {
            for policy in [MissedTicks::Burst, MissedTicks::Delay, MissedTicks::Skip] {
                let mut interval = engine.interval(Duration::from_micros(300));
                interval.set_missed_tick_behavior(policy);
                for _ in 0..300 {
                    let due = interval.tick().await;
                    assert!(Instant::now() >= due, "{policy:?}: early tick");
                }
            }
        });
    });
}

/// `reset_*` right around the fire: after the timer fires but before `poll_tick`, reset to
/// the same tick, a later tick, at once, and after; the next tick is never early and
/// always comes.
#[test]
fn interval_resets_between_the_fire_and_the_poll() {
    let (engine, clock) = leaked_manual_tick(MS);
    let (_, waker) = Wakes::waker();
    for variant in 0..4 {
        let mut interval = engine.interval(10 * MS);
        let cx = &mut Context::from_waker(&waker);
        assert!(
            interval.poll_tick(cx).is_ready(),
            "the first tick is at once"
        );
        assert!(interval.poll_tick(cx).is_pending());
        clock.advance(10 * MS);
        engine.turn(); // fired, not polled
        match variant {
            0 => interval.reset_at(engine.now()), // same tick as the fire
            1 => interval.reset(),
            2 => interval.reset_immediately(),
            _ => interval.reset_after(MS / 2),
        }
        let mut got = None;
        for _ in 0..30 {
            if let Poll::Ready(due) = interval.poll_tick(cx) {
                assert!(due <= engine.now(), "variant {variant}: early");
                got = Some(due);
                break;
            }
            clock.advance(MS);
            engine.turn();
        }
        assert!(got.is_some(), "variant {variant}: the tick never came");
    }
    assert!(engine.nodes_in_use() <= 4);
}

/// After shutdown an Interval stays pending (never Ready early, never panics), whatever
/// reset is done to it, and polling it does not spin (no self-wake storm).
#[test]
fn interval_after_shutdown_stays_pending_without_spinning() {
    let (engine, _clock) = leaked_manual_tick(MS);
    let (wakes, waker) = Wakes::waker();
    let mut interval = engine.interval(10 * MS);
    let cx = &mut Context::from_waker(&waker);
    assert!(interval.poll_tick(cx).is_ready());
    assert!(interval.poll_tick(cx).is_pending());
    engine.shutdown(PendingTimers::Run);
    for i in 0..8 {
        match i % 4 {
            0 => interval.reset(),
            1 => interval.reset_immediately(),
            2 => interval.reset_after(Duration::MAX),
            _ => interval.reset_at(engine.now() + 5 * MS),
        }
        for _ in 0..3 {
            if let Poll::Ready(due) = interval.poll_tick(cx) {
                assert!(due <= engine.now(), "after shutdown: early tick");
            }
        }
    }
    assert!(
        wakes.0.load(Ordering::SeqCst) < 50,
        "wake storm after shutdown"
    );
    assert_eq!(engine.nodes_in_use(), 0);
}

// ---------------------------------------------------------------- (4) leaks and races

/// Many tasks each poll a `Sleep`; another thread resets them earlier and later while the
/// engine shuts down. Every task is woken (shutdown wakes waker timers), no reset or poll
/// panics, and afterwards every waker clone is released and no node is left in use.
#[test]
fn resets_racing_shutdown_lose_no_wake_and_leak_nothing() {
    within(Duration::from_secs(120), "reset vs shutdown", || {
        for round in 0..30u64 {
            let engine: &'static TimerEngine = leaked_real(2, MS);
            let wakers: Vec<_> = (0..64).map(|_| Wakes::waker()).collect();
            let sleeps: Vec<_> = (0..64)
                .map(|i| {
                    let mut s = engine.sleep(Duration::from_secs(10 + i));
                    assert!(poll(&mut s, &wakers[i as usize].1).is_pending());
                    Arc::new(Mutex::new(s))
                })
                .collect();
            let stop = Arc::new(AtomicBool::new(false));
            let resetter = {
                let sleeps = sleeps.clone();
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut k = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        for s in &sleeps {
                            let mut s = s.lock().unwrap();
                            k += 1;
                            let target = if k % 3 == 0 {
                                Instant::now() + Duration::from_secs(30)
                            } else {
                                Instant::now() + Duration::from_secs(5 + k % 3)
                            };
                            s.reset(target);
                        }
                    }
                })
            };
            std::thread::sleep(Duration::from_micros(200 * (round % 10)));
            engine.shutdown(if round % 2 == 0 {
                PendingTimers::Drop
            } else {
                PendingTimers::Run
            });
            stop.store(true, Ordering::SeqCst);
            resetter.join().unwrap();
            for (i, s) in sleeps.iter().enumerate() {
                let mut s = s.lock().unwrap();
                // Each was either woken by the shutdown, or was forgotten by a reset of a
                // fired timer (then its next poll completes on the shut-down engine).
                let woken = wakers[i].0.0.load(Ordering::SeqCst) > 0;
                let ready = poll(&mut *s, &wakers[i].1).is_ready();
                assert!(
                    woken || ready,
                    "round {round}: sleep {i} neither woken nor ready"
                );
                assert!(
                    ready,
                    "round {round}: sleep {i} pending on a shut-down engine"
                );
            }
            drop(sleeps);
            let until = Instant::now() + Duration::from_secs(5);
            while engine.nodes_in_use() != 0 && Instant::now() < until {
                std::thread::sleep(MS);
            }
            assert_eq!(engine.nodes_in_use(), 0, "round {round}: nodes left");
            for (i, (wakes, waker)) in wakers.iter().enumerate() {
                // Ours plus the one in `waker`: no clone left in the engine.
                assert_eq!(
                    Arc::strong_count(wakes),
                    2,
                    "round {round}: sleep {i}'s waker clone leaked"
                );
                let _ = waker;
            }
        }
    });
}

/// Waker clones under repeated resets across the fire and re-polls with alternating
/// wakers, on a manual clock: once all is dropped and the engine turned, no clone is held.
#[test]
fn reset_and_rewaker_churn_releases_every_waker_clone() {
    let (engine, clock) = manual(1);
    let (a, wa) = Wakes::waker();
    let (b, wb) = Wakes::waker();
    {
        let mut sleeps: Vec<_> = (0..32).map(|i| engine.sleep((i % 5 + 1) * MS)).collect();
        for step in 0..200u32 {
            for (i, s) in sleeps.iter_mut().enumerate() {
                let w = if (step as usize + i) % 2 == 0 {
                    &wa
                } else {
                    &wb
                };
                let _ = poll(s, w);
                if (step as usize + i) % 3 == 0 {
                    let d = s.deadline();
                    s.reset(d + Duration::from_micros(u64::from(step % 3) * 400));
                }
                assert!(
                    honest(s, engine.now()),
                    "step {step}: elapsed before deadline"
                );
            }
            clock.advance(MS);
            engine.turn();
        }
    }
    for _ in 0..10 {
        clock.advance(MS);
        engine.turn();
    }
    assert_eq!(engine.nodes_in_use(), 0);
    assert_eq!(Arc::strong_count(&a), 2, "waker a clones leaked");
    assert_eq!(Arc::strong_count(&b), 2, "waker b clones leaked");
}

/// A `Sleep` that moves between threads (a work-stealing executor does this): created on
/// one thread, its deadline taken from that thread's anchor, polled and reset on others.
#[test]
fn a_sleep_moved_between_threads_is_never_early() {
    let engine = leaked_real(2, MS);
    within(LIMIT, "moved sleeps", move || {
        for i in 0..200u64 {
            let before = Instant::now();
            let delay = Duration::from_micros(i % 1500);
            let sleep = engine.sleep(delay);
            assert!(sleep.deadline() >= before + delay);
            let h = std::thread::spawn(move || {
                futures::executor::block_on(sleep);
                Instant::now()
            });
            let end = h.join().unwrap();
            assert!(end >= before + delay, "moved sleep {i} early");
        }
    });
    let _ = US;
}
