//! Hostile review: out-of-range options should be typed errors, not panics. Kept in its
//! own test binary: an absurd allocation can abort the process.

use corewheel_durable::{DurableTimers, Options};

#[test]
#[ignore = "fault: expected_pending(usize::MAX) panics in open (multiply overflow in the Bloom sizing) instead of Error::BadOptions"]
fn hostile_absurd_expected_pending_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let r = std::panic::catch_unwind(|| {
        DurableTimers::open(dir.path(), Options::default().expected_pending(usize::MAX)).map(drop)
    });
    assert!(r.is_ok(), "open panicked on expected_pending(usize::MAX)");
}
