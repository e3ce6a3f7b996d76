//! Out-of-range options should be typed errors, not panics. Kept in its
//! own test binary: an absurd allocation can abort the process.

use corewheel_durable::{DurableTimers, Error, MAX_EXPECTED_PENDING, Options};

#[test]
fn hostile_absurd_expected_pending_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let r = std::panic::catch_unwind(|| {
        DurableTimers::open(dir.path(), Options::default().expected_pending(usize::MAX)).map(drop)
    });
    assert!(r.is_ok(), "open panicked on expected_pending(usize::MAX)");
    assert!(matches!(r.unwrap(), Err(Error::BadOptions(_))));
    // The limit itself is accepted.
    let r = DurableTimers::open(
        dir.path(),
        Options::default().expected_pending(MAX_EXPECTED_PENDING),
    );
    assert!(r.is_ok(), "{:?}", r.err());
}
