//! The manual clock is shared between a test and the code under test, which may read it from
//! other threads while the test advances it.
#![cfg(loom)]

use std::time::Duration;

use corewheel::{Clock, ManualClock};
use loom::thread;

/// Two threads advancing at once lose no time, and a reader never sees time go backwards.
#[test]
fn concurrent_advances_add_up_and_reads_are_monotonic() {
    loom::model(|| {
        let clock = ManualClock::new();
        let t0 = clock.now();
        let advancer = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance(Duration::from_millis(3)))
        };
        let reader = {
            let clock = clock.clone();
            thread::spawn(move || {
                let first = clock.now();
                let second = clock.now();
                assert!(second >= first, "time went backwards");
            })
        };
        clock.advance(Duration::from_millis(5));
        advancer.join().unwrap();
        reader.join().unwrap();
        assert_eq!(clock.now() - t0, Duration::from_millis(8));
    });
}

/// `advance_to` racing `advance` keeps the later of the two outcomes and never rewinds.
#[test]
fn advance_to_never_rewinds_a_concurrent_advance() {
    loom::model(|| {
        let clock = ManualClock::new();
        let t0 = clock.now();
        let jumper = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance_to(t0 + Duration::from_millis(4)))
        };
        clock.advance(Duration::from_millis(10));
        jumper.join().unwrap();
        let elapsed = clock.now() - t0;
        assert!(
            elapsed == Duration::from_millis(10) || elapsed == Duration::from_millis(14),
            "unexpected {elapsed:?}"
        );
    });
}
