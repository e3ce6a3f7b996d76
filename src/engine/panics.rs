//! User code on the engine's own threads: callbacks, and the destructors of what they
//! captured. A panic there must not unwind through the engine's bookkeeping or end a worker
//! thread, so it is caught here and reported as a `bool` for the stats to count.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `f`, catching a panic; `true` if it panicked. The panic's payload is dropped under
/// the same guard: a payload whose own `Drop` panics (`panic_any` with such a value) would
/// otherwise unwind out of the catch.
pub(crate) fn contain(f: impl FnOnce()) -> bool {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(()) => false,
        Err(payload) => {
            drop_payload(payload);
            true
        }
    }
}

/// Drops a caught panic's payload. If that drop panics too, that panic's payload is
/// dropped the same way, and so on; only a payload at the end of a long chain of payloads
/// whose drops all panic is leaked, since dropping it could panic again without end, and a
/// few bytes are a fair price for a worker that goes on.
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
