//! A type-erased timer callback stored in the pooled node: captures up to [`INLINE_BYTES`] (a
//! repeating timer's third word holds its period: [`INLINE_REPEATING_BYTES`]), at most
//! word-aligned, live in the node; larger ones are boxed.

use std::mem::{MaybeUninit, align_of, size_of};
use std::ptr::NonNull;
use std::task::Waker;

use crate::engine::periodic::Period;

/// The captures a callback may have and be stored without an allocation: three words.
pub const INLINE_BYTES: usize = 3 * size_of::<usize>();

/// The captures a repeating callback may have and be stored without an allocation: two words.
pub const INLINE_REPEATING_BYTES: usize = 2 * size_of::<usize>();

#[repr(C)]
struct Storage([MaybeUninit<usize>; 3]);

#[derive(Clone, Copy)]
enum Action {
    /// Whether `Call` consumes the closure; touches nothing.
    Consumes,
    /// Whether dropping the closure runs code of its own; touches nothing.
    DropsAnything,
    Call,
    Drop,
}

/// Runs or drops the closure in `storage`; answers `Consumes` or `DropsAnything`.
type Shim = unsafe fn(NonNull<Storage>, Action) -> bool;

/// A callback slot: empty, or holding one closure.
pub(crate) struct Callback {
    storage: Storage,
    shim: Option<Shim>,
}

const fn fits_inline<F>(bytes: usize) -> bool {
    size_of::<F>() <= bytes && align_of::<F>() <= align_of::<Storage>()
}

impl Callback {
    pub(crate) const EMPTY: Self = Self {
        storage: Storage([MaybeUninit::uninit(); 3]),
        shim: None,
    };

    /// Whether a closure of type `F` would be stored without an allocation.
    #[cfg(test)]
    pub(crate) const fn is_inline<F>() -> bool {
        fits_inline::<F>(INLINE_BYTES)
    }

    /// Stores a one-shot callback. The slot must be empty.
    pub(crate) fn set_once<F: FnOnce() + Send + 'static>(&mut self, f: F) {
        self.store(f, INLINE_BYTES, (once_inline::<F>, once_boxed::<F>));
    }

    /// Stores `f` in place if it fits in `bytes`, else boxed.
    #[inline]
    fn store<F>(&mut self, f: F, bytes: usize, (inline, boxed): (Shim, Shim)) {
        debug_assert!(self.shim.is_none());
        let slot = self.storage.0.as_mut_ptr();
        if fits_inline::<F>(bytes) {
            // SAFETY: `fits_inline` checked size and alignment; the slot is empty.
            unsafe { slot.cast::<F>().write(f) };
            self.shim = Some(inline);
        } else {
            // SAFETY: a pointer fits in the storage's first word, and the slot is empty.
            unsafe { slot.cast::<*mut F>().write(Box::into_raw(Box::new(f))) };
            self.shim = Some(boxed);
        }
    }

    /// Stores a future's waker, to be woken once. The slot must be empty.
    pub(crate) fn set_waker(&mut self, waker: Waker) {
        const { assert!(fits_inline::<Waker>(INLINE_BYTES)) };
        debug_assert!(self.shim.is_none());
        // SAFETY: a waker fits (checked above at compile time), and the slot is empty.
        unsafe { self.storage.0.as_mut_ptr().cast::<Waker>().write(waker) };
        self.shim = Some(wake_once);
    }

    /// The waker [`set_waker`](Self::set_waker) stored, to replace it in place.
    ///
    /// # Safety
    /// The slot must hold a waker stored by `set_waker` and not yet run or dropped.
    pub(crate) unsafe fn waker_mut(&mut self) -> &mut Waker {
        debug_assert!(self.shim.is_some());
        // SAFETY: the caller guarantees a live waker there; the borrow covers the result.
        unsafe { &mut *self.storage.0.as_mut_ptr().cast::<Waker>() }
    }

    /// Stores a repeating callback and its period. The slot must be empty.
    pub(crate) fn set_repeating<F: FnMut() + Send + 'static>(&mut self, f: F, period: Period) {
        debug_assert!(self.shim.is_none());
        self.storage.0[2] = MaybeUninit::new(period.to_word() as usize);
        let shims: (Shim, Shim) = (repeating_inline::<F>, repeating_boxed::<F>);
        self.store(f, INLINE_REPEATING_BYTES, shims);
    }

    /// Runs the callback; a one-shot one is consumed, even if it panics.
    pub(crate) fn call(&mut self) {
        let Some(shim) = self.shim else { return };
        let storage = NonNull::from(&mut self.storage);
        // SAFETY: `Consumes` reads nothing from the storage.
        if unsafe { shim(storage, Action::Consumes) } {
            // Cleared first: if the closure panics it has already been moved out.
            self.shim = None;
        }
        // SAFETY: `shim` was set with the closure it expects; the slot is borrowed mutably.
        unsafe { shim(storage, Action::Call) };
    }

    /// Drops the callback unrun, emptying the slot; returns whether a capture's `Drop` panicked
    /// (caught).
    pub(crate) fn clear(&mut self) -> bool {
        let Some(shim) = self.shim.take() else {
            return false;
        };
        let storage = NonNull::from(&mut self.storage);
        // SAFETY: `shim` matches the closure, dropped once as the slot was emptied above.
        crate::engine::panics::contain(|| unsafe {
            shim(storage, Action::Drop);
        })
    }

    /// Whether dropping the callback would run user code (a capture's or a waker's `Drop`), which
    /// may block.
    pub(crate) fn drops_anything(&self) -> bool {
        let Some(shim) = self.shim else {
            return false;
        };
        let storage = NonNull::from(&self.storage);
        // SAFETY: `DropsAnything` reads nothing from the storage.
        unsafe { shim(storage, Action::DropsAnything) }
    }

    /// The period of a repeating callback; [`Period::ONE_SHOT`] for a one-shot or empty slot.
    pub(crate) fn period(&self) -> Period {
        let Some(shim) = self.shim else {
            return Period::ONE_SHOT;
        };
        let storage = NonNull::from(&self.storage);
        // SAFETY: `Consumes` reads nothing from the storage.
        if unsafe { shim(storage, Action::Consumes) } {
            return Period::ONE_SHOT;
        }
        // SAFETY: a repeating slot's third word was initialised by `set_repeating`.
        let word = unsafe { self.storage.0[2].assume_init() };
        Period::from_word(word as u64)
    }

    /// Whether the slot holds a callback.
    #[cfg(test)]
    pub(crate) fn is_set(&self) -> bool {
        self.shim.is_some()
    }
}

impl Drop for Callback {
    fn drop(&mut self) {
        let _ = self.clear();
    }
}

/// A one-shot shim's answer to `action`; `take` moves the closure out, for `Call` or `Drop`.
fn once<C: FnOnce()>(action: Action, drops_anything: bool, take: impl FnOnce() -> C) -> bool {
    match action {
        Action::Consumes => true,
        Action::DropsAnything => drops_anything,
        Action::Call => {
            take()();
            false
        }
        Action::Drop => {
            drop(take());
            false
        }
    }
}

/// # Safety
/// `storage` holds an `F` written by `set_once`.
unsafe fn once_inline<F: FnOnce()>(storage: NonNull<Storage>, action: Action) -> bool {
    // SAFETY: the caller guarantees an initialised `F`; `once` reads it out at most once.
    once(action, std::mem::needs_drop::<F>(), || unsafe {
        storage.cast::<F>().read()
    })
}

/// # Safety
/// `storage` holds a `*mut F` from `Box::into_raw`, written by `set_once`.
unsafe fn once_boxed<F: FnOnce()>(storage: NonNull<Storage>, action: Action) -> bool {
    // SAFETY: the caller guarantees a pointer from `Box::into_raw`; `once` reclaims it at
    // most once. Freeing the box itself runs no user code.
    once(action, std::mem::needs_drop::<F>(), || unsafe {
        Box::from_raw(storage.cast::<*mut F>().read())
    })
}

/// # Safety
/// `storage` holds a `Waker` written by `set_waker`.
unsafe fn wake_once(storage: NonNull<Storage>, action: Action) -> bool {
    once(action, true, || {
        // SAFETY: the caller guarantees an initialised waker; `once` reads it out at most once.
        let waker = unsafe { storage.cast::<Waker>().read() };
        move || waker.wake()
    })
}

/// # Safety
/// `storage` holds an `F` written by `set_repeating`.
unsafe fn repeating_inline<F: FnMut()>(storage: NonNull<Storage>, action: Action) -> bool {
    let f = storage.cast::<F>();
    match action {
        Action::Consumes => {}
        Action::DropsAnything => return std::mem::needs_drop::<F>(),
        // SAFETY: the caller guarantees a live `F`, borrowed mutably for the call only.
        Action::Call => unsafe { (*f.as_ptr())() },
        // SAFETY: the caller empties the slot before asking for the drop, so it happens once.
        Action::Drop => unsafe { f.as_ptr().drop_in_place() },
    }
    false
}

/// # Safety
/// `storage` holds a `*mut F` from `Box::into_raw`, written by `set_repeating`.
unsafe fn repeating_boxed<F: FnMut()>(storage: NonNull<Storage>, action: Action) -> bool {
    if let Action::DropsAnything = action {
        return std::mem::needs_drop::<F>();
    }
    // SAFETY: the caller guarantees the pointer came from `Box::into_raw` and is live.
    let f = unsafe { storage.cast::<*mut F>().read() };
    match action {
        Action::Consumes | Action::DropsAnything => {}
        // SAFETY: the box is live until `Drop`, and borrowed mutably for the call only.
        Action::Call => unsafe { (*f)() },
        // SAFETY: `Drop` comes once, after which the slot is empty.
        Action::Drop => drop(unsafe { Box::from_raw(f) }),
    }
    false
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const PERIOD: Period = Period {
        ticks: 1234,
        missed: crate::MissedTicks::Delay,
    };

    #[test]
    fn three_words_are_inline_and_four_are_boxed() {
        assert!(Callback::is_inline::<[usize; 3]>());
        assert!(!Callback::is_inline::<[usize; 4]>());
        assert!(Callback::is_inline::<std::task::Waker>());
        assert!(!Callback::is_inline::<u128>() || align_of::<u128>() <= align_of::<usize>());
    }

    #[test]
    fn a_callback_says_whether_its_drop_runs_code() {
        let shared = Arc::new(AtomicUsize::new(0));
        let mut slots: Vec<(Callback, bool)> = Vec::new();
        let mut once = |f: Box<dyn FnOnce(&mut Callback)>, drops: bool| {
            let mut slot = Callback::EMPTY;
            f(&mut slot);
            slots.push((slot, drops));
        };
        let (a, b, c) = (
            Arc::clone(&shared),
            Arc::clone(&shared),
            Arc::clone(&shared),
        );
        once(Box::new(|slot| slot.set_once(|| {})), false);
        once(Box::new(|slot| slot.set_once(move || drop(a))), true);
        let big = [3_u64; 8];
        once(
            Box::new(move |slot| slot.set_once(move || assert_eq!(big[7], 3))),
            false,
        );
        once(
            Box::new(move |slot| {
                slot.set_once(move || assert_eq!(big[7], b.load(Ordering::Relaxed) as u64 + 3))
            }),
            true,
        );
        once(Box::new(|slot| slot.set_repeating(|| {}, PERIOD)), false);
        once(
            Box::new(move |slot| slot.set_repeating(move || assert_eq!(big[0], 3), PERIOD)),
            false,
        );
        once(
            Box::new(move |slot| slot.set_repeating(move || drop(Arc::clone(&c)), PERIOD)),
            true,
        );
        once(
            Box::new(|slot| slot.set_waker(std::task::Waker::noop().clone())),
            true,
        );
        assert!(!Callback::EMPTY.drops_anything());
        for (index, (slot, drops)) in slots.iter_mut().enumerate() {
            assert_eq!(slot.drops_anything(), *drops, "slot {index}");
            assert!(!slot.clear(), "slot {index}: no panic");
            assert!(!slot.drops_anything(), "slot {index}: empty now");
        }
        assert_eq!(Arc::strong_count(&shared), 1, "every capture was dropped");
    }

    #[test]
    fn one_shot_callbacks_run_once_inline_and_boxed() {
        let runs = Arc::new(AtomicUsize::new(0));
        for big in [false, true] {
            let mut slot = Callback::EMPTY;
            let counter = Arc::clone(&runs);
            let padding = [7_u64; 4];
            if big {
                slot.set_once(move || {
                    assert_eq!(padding[3], 7);
                    counter.fetch_add(1, Ordering::Relaxed);
                });
            } else {
                slot.set_once(move || {
                    counter.fetch_add(1, Ordering::Relaxed);
                });
            }
            assert_eq!(slot.period(), Period::ONE_SHOT);
            slot.call();
            assert!(!slot.is_set());
            slot.call();
        }
        assert_eq!(runs.load(Ordering::Relaxed), 2);
        assert_eq!(Arc::strong_count(&runs), 1, "every capture was dropped");
    }

    #[test]
    fn repeating_callbacks_keep_their_state_and_drop_once() {
        let runs = Arc::new(AtomicUsize::new(0));
        for big in [false, true] {
            let mut slot = Callback::EMPTY;
            let counter = Arc::clone(&runs);
            let mut calls = 0_u64;
            let padding = [1_u64; 4];
            if big {
                slot.set_repeating(
                    move || {
                        calls += padding[0];
                        counter.store(calls as usize, Ordering::Relaxed);
                    },
                    PERIOD,
                );
            } else {
                slot.set_repeating(
                    move || {
                        calls += 1;
                        counter.store(calls as usize, Ordering::Relaxed);
                    },
                    PERIOD,
                );
            }
            slot.call();
            slot.call();
            assert!(slot.is_set());
            assert_eq!(slot.period(), PERIOD, "the period survives the calls");
            assert_eq!(runs.load(Ordering::Relaxed), 2);
            slot.clear();
            assert!(!slot.is_set());
        }
        assert_eq!(Arc::strong_count(&runs), 1);
    }

    #[test]
    fn a_waker_is_woken_once_or_dropped_unwoken_and_can_be_replaced() {
        struct Count(AtomicUsize);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let first = Arc::new(Count(AtomicUsize::new(0)));
        let second = Arc::new(Count(AtomicUsize::new(0)));
        let mut slot = Callback::EMPTY;
        slot.set_waker(Waker::from(Arc::clone(&first)));
        // SAFETY: the slot holds the waker just stored.
        let old = std::mem::replace(
            unsafe { slot.waker_mut() },
            Waker::from(Arc::clone(&second)),
        );
        drop(old);
        slot.call();
        slot.call();
        assert_eq!(first.0.load(Ordering::Relaxed), 0);
        assert_eq!(second.0.load(Ordering::Relaxed), 1);
        slot.set_waker(Waker::from(Arc::clone(&first)));
        slot.clear();
        assert_eq!(
            first.0.load(Ordering::Relaxed),
            0,
            "a dropped waker is not woken"
        );
        assert_eq!(Arc::strong_count(&first), 1);
        assert_eq!(Arc::strong_count(&second), 1);
    }

    #[test]
    fn a_dropped_slot_drops_its_closure_unrun() {
        let witness = Arc::new(());
        let mut slot = Callback::EMPTY;
        let held = Arc::clone(&witness);
        slot.set_once(move || drop(held));
        drop(slot);
        assert_eq!(Arc::strong_count(&witness), 1);
    }

    #[test]
    fn a_panicking_one_shot_is_consumed() {
        let witness = Arc::new(());
        let mut slot = Callback::EMPTY;
        let held = Arc::clone(&witness);
        slot.set_once(move || {
            let _keep = held;
            panic!("callback failure");
        });
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| slot.call()));
        assert!(outcome.is_err());
        assert!(!slot.is_set());
        assert_eq!(Arc::strong_count(&witness), 1);
    }
}
