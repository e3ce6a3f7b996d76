//! The one place that chooses between `std` and loom primitives.
//!
//! Every atomic, `Arc` and interior-mutable cell in corewheel comes from here, so that
//! building with `RUSTFLAGS="--cfg loom"` swaps them all for loom's model-checked versions
//! and the models in `loom-tests/` explore the real code rather than a copy of it.

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(not(loom))]
pub(crate) use std::sync::Arc;

/// Atomics: loom's under `--cfg loom`, std's otherwise.
pub(crate) mod atomic {
    #[cfg(loom)]
    pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
    #[cfg(not(loom))]
    pub(crate) use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
}

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// `std`'s `UnsafeCell` behind loom's closure-based API.
///
/// loom can only check accesses it sees, so its cell hands out raw pointers inside closures;
/// giving the std build the same shape lets the lock-free modules compile unchanged under
/// both.
#[cfg(not(loom))]
#[derive(Debug, Default)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> Self {
        Self(std::cell::UnsafeCell::new(value))
    }

    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::UnsafeCell;

    #[test]
    fn cell_reads_what_was_written() {
        let cell = UnsafeCell::new(1_u32);
        // SAFETY: `cell` is local to this test and no other reference to its contents
        // exists while the pointer is written through.
        cell.with_mut(|p| unsafe { *p = 7 });
        // SAFETY: the write above has finished and nothing else holds the cell.
        assert_eq!(cell.with(|p| unsafe { *p }), 7);
    }
}
