//! `Sleep`, `Timeout` and `Interval` on a manual clock: every step is a turn the test
//! takes, so each assertion is exact (never early, woken once, waker replaced, dropped
//! sleeps wake nobody), and bad input is tried for panics.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::support::{Wakes, manual, poll};
use corewheel::{Elapsed, ManualClock, MissedTicks, PendingTimers, Sleep, TimerEngine};

const MS: Duration = Duration::from_millis(1);

#[test]
fn a_sleep_completes_at_its_deadline_and_not_a_tick_before() {
    let (engine, clock) = manual(2);
    let (wakes, waker) = Wakes::waker();
    let mut sleep = engine.sleep(Duration::from_millis(10));
    assert!(poll(&mut sleep, &waker).is_pending());
    for _ in 0..9 {
        clock.advance(MS);
        engine.turn();
        assert_eq!(wakes.count(), 0, "never early");
        assert!(!sleep.is_elapsed());
        assert!(poll(&mut sleep, &waker).is_pending());
    }
    clock.advance(MS);
    engine.turn();
    assert_eq!(wakes.count(), 1, "woken once at the deadline");
    assert!(sleep.is_elapsed());
    assert_eq!(poll(&mut sleep, &waker), Poll::Ready(()));
    assert_eq!(
        poll(&mut sleep, &waker),
        Poll::Ready(()),
        "ready stays ready"
    );
    drop(sleep);
    assert_eq!(engine.nodes_in_use(), 0);
}

#[test]
fn a_new_waker_replaces_the_old_one_in_the_node() {
    let (engine, clock) = manual(1);
    let (first, first_waker) = Wakes::waker();
    let (second, second_waker) = Wakes::waker();
    let mut sleep = engine.sleep(Duration::from_millis(5));
    assert!(poll(&mut sleep, &first_waker).is_pending());
    assert!(poll(&mut sleep, &first_waker).is_pending());
    assert!(poll(&mut sleep, &second_waker).is_pending());
    assert_eq!(
        Arc::strong_count(&first),
        2,
        "the node let the first waker go"
    );
    clock.advance(Duration::from_millis(5));
    engine.turn();
    assert_eq!((first.count(), second.count()), (0, 1));
    assert_eq!(poll(&mut sleep, &first_waker), Poll::Ready(()));
    drop(sleep);
    assert_eq!(
        Arc::strong_count(&second),
        2,
        "the fired node let its waker go"
    );
}

#[test]
fn a_sleep_dropped_before_its_deadline_wakes_nobody_and_frees_its_node() {
    let (engine, clock) = manual(1);
    let (wakes, waker) = Wakes::waker();
    let mut sleep = engine.sleep(Duration::from_millis(5));
    assert!(poll(&mut sleep, &waker).is_pending());
    assert_eq!(engine.nodes_in_use(), 1);
    drop(sleep);
    clock.advance(Duration::from_millis(10));
    engine.turn();
    assert_eq!(wakes.count(), 0);
    assert_eq!(engine.nodes_in_use(), 0);
    assert_eq!(Arc::strong_count(&wakes), 2, "the waker clone was dropped");
    assert_eq!(engine.stats().total.cancelled, 1);
}

#[test]
fn a_sleep_never_polled_arms_nothing() {
    let (engine, _clock) = manual(1);
    let sleep = engine.sleep(Duration::from_millis(5));
    assert!(!sleep.is_elapsed());
    drop(sleep);
    assert_eq!(engine.stats().total.scheduled, 0);
}

#[test]
fn reset_moves_a_pending_sleep_both_ways_and_rearms_a_fired_one() {
    let (engine, clock) = manual(1);
    let (wakes, waker) = Wakes::waker();
    let start = engine.now();
    let mut sleep = engine.sleep(Duration::from_millis(10));
    assert!(poll(&mut sleep, &waker).is_pending());
    sleep.reset(start + Duration::from_millis(20));
    assert_eq!(sleep.deadline(), start + Duration::from_millis(20));
    clock.advance(Duration::from_millis(19));
    engine.turn();
    assert_eq!(
        wakes.count(),
        1,
        "pushed back: the timer left at 10 wakes the task once, to arm the new deadline"
    );
    assert!(!sleep.is_elapsed(), "not complete at 19");
    assert!(poll(&mut sleep, &waker).is_pending(), "not complete at 19");
    engine.turn();
    assert_eq!(wakes.count(), 1, "the timer armed for 20 waits");
    sleep.reset(start + Duration::from_millis(19));
    engine.turn();
    assert_eq!(
        wakes.count(),
        2,
        "brought forward to now: fires on the next turn"
    );
    assert_eq!(poll(&mut sleep, &waker), Poll::Ready(()));
    sleep.reset(start + Duration::from_millis(15));
    assert!(sleep.is_elapsed(), "an earlier deadline has passed too");
    assert_eq!(poll(&mut sleep, &waker), Poll::Ready(()));

    // Reset after it fired: pending again, and the next poll arms a new timer.
    sleep.reset(engine.now() + Duration::from_millis(5));
    assert!(!sleep.is_elapsed());
    assert!(poll(&mut sleep, &waker).is_pending());
    clock.advance(Duration::from_millis(4));
    engine.turn();
    assert_eq!(wakes.count(), 2);
    clock.advance(MS);
    engine.turn();
    assert_eq!(wakes.count(), 3);
    assert_eq!(poll(&mut sleep, &waker), Poll::Ready(()));
    drop(sleep);
    assert_eq!(engine.nodes_in_use(), 0);
}

#[test]
fn an_idle_timeout_pushed_back_on_every_read_fires_only_when_reads_stop() {
    let (engine, clock) = manual(1);
    let (wakes, waker) = Wakes::waker();
    let idle = Duration::from_millis(30);
    let mut sleep = engine.sleep(idle);
    assert!(poll(&mut sleep, &waker).is_pending());
    let reads = 100;
    for _ in 0..reads {
        clock.advance(Duration::from_millis(10));
        engine.turn();
        sleep.reset(engine.now() + idle);
        assert!(poll(&mut sleep, &waker).is_pending());
    }
    // Each timer fires at a deadline that later reads moved on from, and its wake arms
    // the next: one per idle period, where a timer moved on every read would wake none.
    let spurious = wakes.count();
    assert_eq!(
        engine.stats().total.reset,
        0,
        "a later deadline moves no timer in the engine"
    );
    assert!(
        (1..=reads / 3).contains(&spurious),
        "{spurious} wakes over {reads} reads 10 ms apart with a 30 ms idle timeout"
    );
    let last_read = engine.now();
    while poll(&mut sleep, &waker).is_pending() {
        clock.advance(MS);
        engine.turn();
    }
    assert_eq!(
        engine.now() - last_read,
        idle,
        "fired exactly when idle that long"
    );
    assert!(sleep.is_elapsed());
    assert!(wakes.count() <= spurious + 2);
    drop(sleep);
    assert_eq!(engine.nodes_in_use(), 0);
}

#[test]
fn resets_within_one_tick_change_nothing_in_the_engine_and_are_never_early() {
    let (engine, clock) = manual(1);
    let (wakes, waker) = Wakes::waker();
    let start = engine.now();
    let mut sleep = engine.sleep_until(start + Duration::from_millis(10));
    assert!(poll(&mut sleep, &waker).is_pending());
    for micros in [9_001, 9_500, 10_000, 9_999] {
        sleep.reset(start + Duration::from_micros(micros));
        assert_eq!(sleep.deadline(), start + Duration::from_micros(micros));
    }
    assert_eq!(
        engine.stats().total.reset,
        0,
        "all within the tick ending at 10 ms"
    );
    clock.advance(Duration::from_millis(9));
    engine.turn();
    assert_eq!(wakes.count(), 0);
    clock.advance(MS);
    engine.turn();
    assert_eq!(wakes.count(), 1);
    assert_eq!(poll(&mut sleep, &waker), Poll::Ready(()));
    // Fired: a reset into the tick that has passed stays complete; a later one re-arms.
    sleep.reset(start + Duration::from_micros(9_800));
    assert_eq!(poll(&mut sleep, &waker), Poll::Ready(()));
    sleep.reset(start + Duration::from_micros(10_001));
    assert!(poll(&mut sleep, &waker).is_pending(), "never early");
    clock.advance(MS);
    engine.turn();
    assert_eq!(poll(&mut sleep, &waker), Poll::Ready(()));
}

#[test]
fn timeout_yields_the_output_in_time_and_elapsed_after() {
    let (engine, clock) = manual(1);
    let (_wakes, waker) = Wakes::waker();
    let mut ready = engine.timeout(Duration::from_millis(5), std::future::ready(7));
    assert_eq!(poll(&mut ready, &waker), Poll::Ready(Ok(7)));
    assert_eq!(
        engine.stats().total.scheduled,
        0,
        "a ready future arms no timer"
    );

    let (sender, receiver) = futures::channel::oneshot::channel::<u32>();
    let mut answered = engine.timeout(Duration::from_millis(5), receiver);
    assert!(poll(&mut answered, &waker).is_pending());
    clock.advance(Duration::from_millis(4));
    engine.turn();
    sender.send(9).expect("the receiver waits");
    assert_eq!(poll(&mut answered, &waker), Poll::Ready(Ok(Ok(9))));
    drop(answered);

    let mut stalled = engine.timeout(Duration::from_millis(5), std::future::pending::<()>());
    assert!(poll(&mut stalled, &waker).is_pending());
    clock.advance(Duration::from_millis(4));
    engine.turn();
    assert!(poll(&mut stalled, &waker).is_pending(), "never early");
    clock.advance(MS);
    engine.turn();
    assert_eq!(poll(&mut stalled, &waker), Poll::Ready(Err(Elapsed)));
    drop(stalled);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// Polls an interval's ticks over `steps` one-millisecond steps; returns the deadlines of
/// the ticks it got, as offsets from `start`, and when each came.
fn ticks_over(
    clock: &ManualClock,
    engine: &TimerEngine,
    interval: &mut corewheel::Interval<'_>,
    start: Instant,
    steps: u64,
    stall: impl Fn(u64) -> bool,
) -> Vec<(u64, u64)> {
    let (_wakes, waker) = Wakes::waker();
    let mut cx = Context::from_waker(&waker);
    let mut got = Vec::new();
    for _ in 0..steps {
        let now = (engine.now() - start).as_millis() as u64;
        if !stall(now) {
            while let Poll::Ready(due) = interval.poll_tick(&mut cx) {
                got.push(((due - start).as_millis() as u64, now));
            }
        }
        clock.advance(MS);
        engine.turn();
    }
    got
}

#[test]
fn interval_ticks_on_time_and_follows_each_missed_tick_policy() {
    let period = Duration::from_millis(10);
    // The task is away from 12 ms to 35 ms: it misses the ticks due at 20 and 30.
    let away = |now: u64| (12..35).contains(&now);
    let expected = [
        (
            MissedTicks::Burst,
            vec![(0, 0), (10, 10), (20, 35), (30, 35), (40, 40)],
        ),
        (
            MissedTicks::Delay,
            vec![(0, 0), (10, 10), (20, 35), (45, 45)],
        ),
        (
            MissedTicks::Skip,
            vec![(0, 0), (10, 10), (20, 35), (40, 40)],
        ),
    ];
    for (policy, ticks) in expected {
        let (engine, clock) = manual(1);
        let start = engine.now();
        let mut interval = engine.interval(period);
        interval.set_missed_tick_behavior(policy);
        assert_eq!(interval.missed_tick_behavior(), policy);
        let got = ticks_over(&clock, &engine, &mut interval, start, 48, away);
        assert_eq!(got, ticks, "{policy:?}");
    }
}

#[test]
fn interval_defaults_to_burst_and_reset_starts_a_period_from_now() {
    let (engine, clock) = manual(1);
    let start = engine.now();
    let mut interval =
        engine.interval_at(start + Duration::from_millis(3), Duration::from_millis(10));
    assert_eq!(interval.missed_tick_behavior(), MissedTicks::Burst);
    let got = ticks_over(&clock, &engine, &mut interval, start, 15, |_| false);
    assert_eq!(got, vec![(3, 3), (13, 13)]);
    interval.reset();
    let got = ticks_over(&clock, &engine, &mut interval, start, 30, |_| false);
    assert_eq!(
        got,
        vec![(25, 25), (35, 35)],
        "a period after the reset at 15"
    );
}

/// A deadline given as an instant that has passed completes at the first poll, with no
/// turn of the engine and no timer armed, as tokio's does: a request whose budget has run
/// out must not wait for a worker. A deadline not yet reached is never completed early.
#[test]
fn a_past_deadline_is_ready_at_its_first_poll_without_a_turn() {
    let (engine, clock) = manual(2);
    let (wakes, waker) = Wakes::waker();
    clock.advance(Duration::from_secs(5));
    engine.turn();
    let now = engine.now();
    let past = [now - Duration::from_secs(2), now - MS, now];
    for deadline in past {
        let mut sleep = engine.sleep_until(deadline);
        assert_eq!(poll(&mut sleep, &waker), Poll::Ready(()), "{deadline:?}");
        assert!(sleep.is_elapsed());
        let mut timeout = engine.timeout_at(deadline, std::future::pending::<()>());
        assert_eq!(poll(&mut timeout, &waker), Poll::Ready(Err(Elapsed)));
    }
    assert_eq!(engine.nodes_in_use(), 0, "no timer was armed");
    // A future deadline, even inside the current tick, is armed and waits for its tick.
    let mut soon = engine.sleep_until(now + Duration::from_micros(10));
    assert!(poll(&mut soon, &waker).is_pending(), "never early");
    // A pending sleep reset to a past instant completes at the next poll, and lets its
    // timer go rather than wake the task later.
    let mut idle = engine.sleep_until(now + Duration::from_secs(30));
    assert!(poll(&mut idle, &waker).is_pending());
    idle.reset(now - MS);
    assert_eq!(poll(&mut idle, &waker), Poll::Ready(()));
    // A reset to a later instant after completing waits again.
    idle.reset(now + Duration::from_secs(1));
    assert!(poll(&mut idle, &waker).is_pending());
    clock.advance(MS);
    engine.turn();
    assert!(poll(&mut soon, &waker).is_ready());
    clock.advance(Duration::from_secs(2));
    engine.turn();
    assert!(poll(&mut idle, &waker).is_ready());
    assert_eq!(
        wakes.count(),
        2,
        "one wake each for soon and idle, none for the reset"
    );
    drop((soon, idle));
    clock.advance(Duration::from_millis(64));
    engine.turn();
    assert_eq!(engine.nodes_in_use(), 0);
}

#[test]
fn bad_input_never_panics() {
    let (engine, clock) = manual(1);
    let (wakes, waker) = Wakes::waker();
    // Durations past the end of `Instant` and of the engine stay pending.
    let mut forever = engine.sleep(Duration::MAX);
    let mut far = engine.sleep_until(engine.now() + Duration::from_secs(u64::MAX / 4));
    assert!(poll(&mut forever, &waker).is_pending());
    assert!(poll(&mut far, &waker).is_pending());
    // A past deadline completes at its first poll.
    let before_start = engine.now() - Duration::from_secs(1);
    let mut past = engine.sleep_until(before_start);
    assert_eq!(past.deadline(), before_start, "read back exactly");
    let thirty_years = Duration::from_secs(30 * 365 * 86_400);
    for never in [&forever, &far] {
        assert_eq!(never.deadline(), engine.now() + thirty_years);
    }
    assert_eq!(poll(&mut past, &waker), Poll::Ready(()));
    clock.advance(Duration::from_secs(3600 * 24 * 365));
    engine.turn();
    assert!(poll(&mut forever, &waker).is_pending());
    assert!(poll(&mut far, &waker).is_pending());
    assert_eq!(wakes.count(), 0);
    // A zero period is one tick; an interval at the end of time never ticks again.
    let mut fast = engine.interval(Duration::ZERO);
    assert_eq!(fast.period(), engine.tick());
    let mut cx = Context::from_waker(&waker);
    assert!(fast.poll_tick(&mut cx).is_ready());
    let mut last = engine.interval_at(engine.now(), Duration::MAX);
    assert!(last.poll_tick(&mut cx).is_ready());
    assert!(last.poll_tick(&mut cx).is_pending());
    last.reset_after(Duration::MAX);
    assert!(last.poll_tick(&mut cx).is_pending());
    drop((forever, far, past, fast, last));
    // A cancel's message is taken within the idle lane horizon (32 ticks).
    clock.advance(Duration::from_millis(32));
    engine.turn();
    assert_eq!(
        engine.nodes_in_use(),
        0,
        "cancelled nodes are back after a turn"
    );
}

#[test]
fn shutdown_completes_pending_sleeps_in_either_mode_and_later_ones_at_once() {
    for mode in [PendingTimers::Drop, PendingTimers::Run] {
        let (engine, _clock) = manual(2);
        let (wakes, waker) = Wakes::waker();
        let mut sleeps: Vec<Sleep<'_>> = (1..=10)
            .map(|s| engine.sleep(Duration::from_secs(s)))
            .collect();
        for sleep in &mut sleeps {
            assert!(poll(sleep, &waker).is_pending());
        }
        engine.shutdown(mode);
        assert_eq!(wakes.count(), 10, "{mode:?}: every waiting task was woken");
        for sleep in &mut sleeps {
            assert_eq!(poll(sleep, &waker), Poll::Ready(()));
        }
        let mut late = engine.sleep(Duration::from_secs(1));
        assert_eq!(poll(&mut late, &waker), Poll::Ready(()));
        drop(sleeps);
        assert_eq!(engine.nodes_in_use(), 0);
    }
}

#[test]
fn a_sleep_is_small_send_sync_and_unpin() {
    fn traits<T: Send + Sync + Unpin + 'static>() {}
    traits::<Sleep<'static>>();
    traits::<corewheel::Timeout<'static, std::future::Ready<()>>>();
    traits::<corewheel::Interval<'static>>();
    if cfg!(target_pointer_width = "64") {
        assert_eq!(size_of::<Sleep<'static>>(), 56);
    }
}

#[test]
fn the_free_functions_run_on_the_default_engine() {
    let engine = corewheel::default_engine();
    assert!(std::ptr::eq(engine, corewheel::default_engine()));
    let start = Instant::now();
    futures::executor::block_on(async {
        corewheel::sleep(Duration::from_millis(20)).await;
        assert!(start.elapsed() >= Duration::from_millis(20), "never early");
        let late = corewheel::timeout(Duration::from_millis(5), std::future::pending::<()>());
        assert_eq!(late.await, Err(Elapsed));
        let in_time = corewheel::timeout_at(Instant::now() + Duration::from_secs(60), async { 1 });
        assert_eq!(in_time.await, Ok(1));
        corewheel::sleep_until(Instant::now() + MS).await;
        let mut ticks = corewheel::interval(MS);
        let first = ticks.tick().await;
        let second = ticks.tick().await;
        assert!(second >= first + MS);
        let mut at = corewheel::interval_at(Instant::now() + MS, MS);
        at.tick().await;
    });
}
