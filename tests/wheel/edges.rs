//! The wheel's edge cases, one test each, all on a virtual clock.

use std::time::{Duration, Instant};

use corewheel::{Clock, GeometryError, ManualClock, TimerKey, Wheel};

use crate::support::ms;

fn new_wheel<T>() -> (Wheel<T>, ManualClock) {
    let clock = ManualClock::new();
    (Wheel::new(ms(1), clock.now()), clock)
}

#[test]
fn zero_delay_fires_on_the_next_poll() {
    let (mut wheel, clock) = new_wheel();
    wheel.insert(clock.now(), "now");
    assert_eq!(wheel.next_deadline(), Some(clock.now()));
    assert_eq!(wheel.poll_expired(clock.now()), Some("now"));
}

#[test]
fn deadline_in_the_past_fires_on_the_next_poll() {
    let (mut wheel, clock) = new_wheel();
    clock.advance(Duration::from_secs(10));
    assert_eq!(wheel.poll_expired(clock.now()), None);
    wheel.insert(clock.now() - Duration::from_secs(3), "three seconds ago");
    assert_eq!(wheel.poll_expired(clock.now()), Some("three seconds ago"));
}

#[test]
fn deadline_before_the_origin_fires_on_the_next_poll() {
    let (mut wheel, clock) = new_wheel();
    let before_origin = clock
        .now()
        .checked_sub(Duration::from_secs(1))
        .expect("the test's origin is a real instant");
    wheel.insert(before_origin, "before origin");
    assert_eq!(wheel.poll_expired(clock.now()), Some("before origin"));
}

#[test]
fn a_deadline_between_ticks_rounds_up_and_never_fires_early() {
    let (mut wheel, clock) = new_wheel();
    let deadline = clock.now() + Duration::from_micros(1500);
    wheel.insert(deadline, "1.5 ms");
    clock.advance(Duration::from_micros(1499));
    assert_eq!(wheel.poll_expired(clock.now()), None);
    clock.advance(Duration::from_micros(1));
    // Due now, but the wheel only knows whole ticks: it fires at 2 ms, within one tick.
    assert_eq!(wheel.poll_expired(clock.now()), None);
    clock.advance(Duration::from_micros(500));
    assert!(clock.now() <= deadline + ms(1));
    assert_eq!(wheel.poll_expired(clock.now()), Some("1.5 ms"));
}

#[test]
fn a_clock_that_goes_backwards_is_clamped() {
    let (mut wheel, clock) = new_wheel();
    let t0 = clock.now();
    wheel.insert(t0 + ms(50), "later");
    assert_eq!(wheel.poll_expired(t0 + ms(40)), None);
    // A poll from the past is treated as 40 ms, not as time running backwards.
    assert_eq!(wheel.poll_expired(t0 + ms(5)), None);
    assert_eq!(wheel.poll_expired(t0), None);
    assert_eq!(wheel.poll_expired(t0 + ms(50)), Some("later"));
}

#[test]
fn a_deadline_years_out_waits_in_overflow_and_fires_exactly() {
    let (mut wheel, clock) = new_wheel();
    let five_years = Duration::from_secs(5 * 365 * 24 * 3600) + ms(7);
    let deadline = clock.now() + five_years;
    let key = wheel.insert(deadline, "five years");
    assert_eq!(wheel.deadline(key), Some(deadline));
    assert_eq!(wheel.next_deadline(), Some(deadline));
    // Walk there in uneven strides, polling on the way like an event loop would.
    while clock.now() + Duration::from_secs(40_000_000) < deadline {
        clock.advance(Duration::from_secs(40_000_000));
        assert_eq!(wheel.poll_expired(clock.now()), None);
    }
    clock.advance_to(deadline - Duration::from_nanos(1));
    assert_eq!(wheel.poll_expired(clock.now()), None);
    assert_eq!(wheel.next_deadline(), Some(deadline));
    clock.advance(Duration::from_nanos(1));
    assert_eq!(wheel.poll_expired(clock.now()), Some("five years"));
}

/// `Instant + Duration::MAX` does not exist; the latest instant the platform can represent
/// is what a caller who saturates gets.
fn latest_representable(from: Instant) -> Instant {
    let (mut fits, mut overflows) = (Duration::ZERO, Duration::MAX);
    while overflows - fits > Duration::from_nanos(1) {
        let mid = fits + (overflows - fits) / 2;
        if from.checked_add(mid).is_some() {
            fits = mid;
        } else {
            overflows = mid;
        }
    }
    from + fits
}

#[test]
fn a_saturated_deadline_does_not_panic_and_never_fires_early() {
    let (mut wheel, clock) = new_wheel();
    let forever = latest_representable(clock.now());
    let key = wheel.insert(forever, "forever");
    wheel.insert(clock.now() + ms(1), "soon");
    clock.advance(ms(1));
    assert_eq!(wheel.poll_expired(clock.now()), Some("soon"));
    // Nothing will ever fire by itself, so there is no instant to sleep until.
    assert_eq!(wheel.len(), 1);
    assert_eq!(wheel.next_deadline(), None);
    // Beyond 2^64 ticks the deadline is clamped to a tick time never reaches, so even a
    // poll at the latest representable instant does not fire it early.
    assert_eq!(wheel.poll_expired(forever), None);
    assert!(wheel.contains(key));
    assert!(wheel.reset(key, forever));
    assert_eq!(wheel.cancel(key), Some("forever"));
    assert!(wheel.is_empty());
}

#[test]
fn a_deadline_at_the_end_of_the_tick_range_fires_exactly() {
    // With a 1 us tick the range ends after about 584,000 years; just inside it, a timer
    // still fires exactly.
    let origin = Instant::now();
    let mut wheel = Wheel::new(Duration::from_micros(1), origin);
    let deadline = origin + Duration::from_micros(u64::MAX - 10);
    wheel.insert(deadline, "end of range");
    assert_eq!(
        wheel.poll_expired(deadline - Duration::from_micros(1)),
        None
    );
    assert_eq!(wheel.poll_expired(deadline), Some("end of range"));
}

#[test]
fn virtual_time_past_2_pow_36_ticks_loses_nothing_and_fires_nothing_early() {
    // tokio's wheel panicked after about 2^36 ms of uptime (#8334); run well past that.
    let (mut wheel, clock) = new_wheel();
    let origin = clock.now();
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    let mut next_random = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut pending = std::collections::HashMap::new();
    let mut fired = 0_u64;
    let mut fired_past_2_pow_36 = 0_u64;
    let mut id = 0_u64;
    let end = 1_u64 << 38;
    while clock.now() - origin < ms(end) {
        for _ in 0..50 {
            // Log-uniform delays from sub-tick to 2^40 ticks, so some overflow the
            // 2^36-tick span.
            let delay = ms(next_random() >> (24 + next_random() % 40))
                + Duration::from_nanos(next_random() % 1_000_000);
            let deadline = clock.now() + delay;
            wheel.insert(deadline, id);
            pending.insert(id, deadline);
            id += 1;
        }
        // Log-uniform strides up to 2^32 ticks: about a thousand of them reach 2^38.
        clock.advance(
            ms(next_random() >> (32 + next_random() % 32))
                + Duration::from_nanos(next_random() % 1_000_000),
        );
        let now = clock.now();
        while let Some(done) = wheel.poll_expired(now) {
            let deadline = pending.remove(&done).expect("fired once");
            assert!(deadline <= now, "fired early");
            fired += 1;
            if deadline - origin > ms(1 << 36) {
                fired_past_2_pow_36 += 1;
            }
        }
        assert!(
            pending.values().all(|&d| d + ms(1) > now),
            "a timer is overdue"
        );
    }
    let far = clock.now() + ms(1 << 41);
    while let Some(done) = wheel.poll_expired(far) {
        pending.remove(&done).expect("fired once");
        fired += 1;
    }
    assert!(pending.is_empty());
    assert_eq!(fired, id);
    assert!(
        fired_past_2_pow_36 > 1000,
        "only {fired_past_2_pow_36} timers were due past 2^36 ticks"
    );
}

#[test]
fn a_stale_key_never_touches_the_timer_that_reused_its_slot() {
    let (mut wheel, clock) = new_wheel();
    let old = wheel.insert(clock.now() + ms(1), "old");
    clock.advance(ms(1));
    assert_eq!(wheel.poll_expired(clock.now()), Some("old"));
    let new = wheel.insert(clock.now() + ms(10), "new");
    assert_eq!(wheel.cancel(old), None);
    assert!(!wheel.reset(old, clock.now()));
    assert_eq!(wheel.deadline(old), None);
    assert!(wheel.contains(new));
    assert_eq!(wheel.deadline(new), Some(clock.now() + ms(10)));
}

#[test]
fn double_cancel_returns_none_the_second_time() {
    let (mut wheel, clock) = new_wheel();
    let key = wheel.insert(clock.now() + ms(5), 5);
    assert_eq!(wheel.cancel(key), Some(5));
    assert_eq!(wheel.cancel(key), None);
    assert!(wheel.is_empty());
}

#[test]
fn reset_of_a_fired_timer_returns_false() {
    let (mut wheel, clock) = new_wheel();
    let key = wheel.insert(clock.now(), ());
    assert_eq!(wheel.poll_expired(clock.now()), Some(()));
    assert!(!wheel.reset(key, clock.now() + ms(5)));
    assert_eq!(wheel.poll_expired(clock.now() + ms(5)), None);
}

#[test]
fn a_key_made_up_from_raw_bits_is_just_stale() {
    let (mut wheel, clock) = new_wheel();
    wheel.insert(clock.now() + ms(5), 1);
    // Raw 0 is the real key of the first timer (index 0, generation 0); these are not.
    for raw in [1, u64::MAX, 1 << 32, 0xDEAD_BEEF_0000_0000] {
        let key = TimerKey::from_raw(raw);
        assert_eq!(wheel.cancel(key), None);
        assert!(!wheel.reset(key, clock.now()));
    }
    assert_eq!(wheel.len(), 1);
}

#[test]
fn invalid_geometry_is_a_typed_error() {
    let origin = Instant::now();
    let build = |slots, levels, tick| {
        Wheel::builder()
            .slots_per_level(slots)
            .levels(levels)
            .tick(tick)
            .build::<()>(origin)
            .map(|_| ())
    };
    assert_eq!(build(64, 6, Duration::ZERO), Err(GeometryError::ZeroTick));
    assert_eq!(build(100, 6, ms(1)), Err(GeometryError::SlotsPerLevel(100)));
    assert_eq!(build(64, 0, ms(1)), Err(GeometryError::Levels(0)));
    assert_eq!(build(64, 11, ms(1)), Err(GeometryError::Levels(11)));
    assert_eq!(build(64, 10, ms(1)), Ok(()));
}

#[test]
fn a_zero_tick_given_to_new_is_clamped_to_one_nanosecond() {
    let origin = Instant::now();
    let mut wheel = Wheel::new(Duration::ZERO, origin);
    assert_eq!(wheel.tick(), Duration::from_nanos(1));
    wheel.insert(origin + Duration::from_nanos(3), 3);
    assert_eq!(wheel.poll_expired(origin + Duration::from_nanos(2)), None);
    assert_eq!(
        wheel.poll_expired(origin + Duration::from_nanos(3)),
        Some(3)
    );
}

#[test]
fn wheel_overhead_per_timer_is_at_most_64_bytes() {
    assert!(Wheel::<u64>::bytes_per_timer() - size_of::<u64>() <= 64);
    assert!(Wheel::<()>::bytes_per_timer() <= 64);
    assert!(Wheel::<String>::bytes_per_timer() - size_of::<String>() <= 64);
}

#[test]
fn a_poll_before_the_origin_fires_nothing() {
    let origin = Instant::now() + Duration::from_secs(10);
    let mut wheel = Wheel::new(ms(1), origin);
    wheel.insert(origin, "at the origin");
    wheel.insert(origin - Duration::from_secs(3), "before the origin");
    assert_eq!(wheel.poll_expired(origin - Duration::from_secs(5)), None);
    assert_eq!(wheel.poll_expired(origin - Duration::from_nanos(1)), None);
    let fired: Vec<_> = std::iter::from_fn(|| wheel.poll_expired(origin)).collect();
    assert_eq!(fired.len(), 2, "both are due at the origin");
}

#[test]
fn a_backwards_poll_after_a_partial_drain_uses_the_latest_time() {
    let (mut wheel, clock) = new_wheel();
    let t0 = clock.now();
    wheel.insert(t0 + ms(1), "a");
    wheel.insert(t0 + ms(5), "b");
    // The caller takes one timer at 5 ms and stops; a later poll from the past is still 5 ms.
    assert_eq!(wheel.poll_expired(t0 + ms(5)), Some("a"));
    assert_eq!(wheel.poll_expired(t0 + ms(2)), Some("b"));
}

#[test]
fn a_deadline_between_ticks_already_passed_fires_on_the_next_poll() {
    let (mut wheel, clock) = new_wheel();
    let t0 = clock.now();
    let polled = t0 + Duration::from_micros(10_500);
    assert_eq!(wheel.poll_expired(polled), None);
    // 10.2 ms rounds up to the 11 ms tick, but it has passed: it must not wait for 11 ms.
    let key = wheel.insert(t0 + Duration::from_micros(10_200), "passed");
    assert_eq!(wheel.poll_expired(polled), Some("passed"));
    let key2 = wheel.insert(t0 + ms(30), "pulled in");
    assert!(wheel.reset(key2, t0 + Duration::from_micros(10_300)));
    assert_eq!(wheel.poll_expired(polled), Some("pulled in"));
    assert!(!wheel.reset(key, t0));
}

#[test]
fn a_huge_level_count_is_a_typed_error_not_an_overflow() {
    for levels in [1 << 40, usize::MAX, 3_074_457_345_618_258_603] {
        let built = Wheel::builder()
            .slots_per_level(64)
            .levels(levels)
            .build::<()>(Instant::now());
        assert_eq!(built.map(|_| ()), Err(GeometryError::Levels(levels)));
    }
}

#[test]
fn next_deadline_stays_ahead_after_the_overflow_list_empties() {
    // A span of 16 ticks: the first timer waits on the overflow list and is cancelled there.
    let mut wheel = Wheel::builder()
        .slots_per_level(4)
        .levels(2)
        .build(Instant::now())
        .expect("valid geometry");
    let t0 = wheel.origin();
    let gone = wheel.insert(t0 + ms(20), "cancelled");
    assert_eq!(wheel.cancel(gone), Some("cancelled"));
    assert_eq!(wheel.poll_expired(t0 + ms(100)), None);
    wheel.insert(t0 + ms(1000), "later");
    assert_eq!(wheel.next_deadline(), Some(t0 + ms(1000)));
    assert_eq!(wheel.poll_expired(t0 + ms(999)), None);
    assert_eq!(wheel.poll_expired(t0 + ms(1000)), Some("later"));
}
