//! The one place that chooses between `std` and loom primitives.
//!
//! Every atomic, `Arc` and interior-mutable cell in corewheel comes from here, so that
//! building with `RUSTFLAGS="--cfg loom"` swaps them all for loom's model-checked versions
//! and the models in `loom-tests/` explore the real code rather than a copy of it.

#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex};

/// Atomics: loom's under `--cfg loom`, std's otherwise.
pub(crate) mod atomic {
    #[cfg(loom)]
    pub(crate) use loom::sync::atomic::{
        AtomicBool, AtomicPtr, AtomicU8, AtomicU64, Ordering, fence,
    };
    #[cfg(not(loom))]
    pub(crate) use std::sync::atomic::{
        AtomicBool, AtomicPtr, AtomicU8, AtomicU64, Ordering, fence,
    };
}

/// One step of waiting for another thread that holds a short critical section: spins at
/// first, then yields so that a preempted holder can run. Under loom, always yields, which
/// is what lets the model explore the holder making progress.
#[inline]
pub(crate) fn spin_or_yield(attempt: u32) {
    #[cfg(loom)]
    {
        let _ = attempt;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        if attempt < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
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
