//! User code on the engine's threads (callbacks, captures' destructors) must not unwind
//! through its bookkeeping or end a worker: panics are caught here, for the stats.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `f`, catching a panic; `true` if it panicked. The payload is dropped under a guard
/// too, as its own `Drop` may panic.
pub(crate) fn contain(f: impl FnOnce()) -> bool {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(()) => false,
        Err(payload) => {
            drop_payload(payload);
            true
        }
    }
}

/// Drops a caught panic's payload, and each nested one its drop panics with, up to a chain
/// whose last is leaked: a few bytes, rather than panicking without end.
fn drop_payload(payload: Box<dyn Any + Send>) {
    /// Payloads dropped in a chain before the next one is leaked.
    const CHAIN: usize = 8;
    let mut payload = payload;
    for _ in 0..CHAIN {
        match catch_unwind(AssertUnwindSafe(move || drop(payload))) {
            Ok(()) => return,
            Err(nested) => payload = nested,
        }
    }
    std::mem::forget(payload);
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::contain;

    /// A panic payload whose `Drop` panics.
    struct Bomb;

    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("a panic payload's drop");
        }
    }

    #[test]
    fn a_payload_whose_drop_panics_is_contained() {
        assert!(contain(|| std::panic::panic_any(Bomb)));
        assert!(contain(|| panic!("plain")));
        assert!(!contain(|| {}));
    }
}
