//! Read-side critical sections, and frees deferred until every section that could still
//! see the freed value has ended: the grace period of read-copy-update.
//!
//! A reader that loads a pointer from a shared place inside [`read`] may use what it points
//! to until `read` returns. A writer that takes the pointer out of every shared place, then
//! passes it to [`retire`], gets it freed only once every `read` that began before the
//! taking-out has ended. No count is kept per use, so a reader touches no cache line that
//! other threads write.
//!
//! crossbeam-epoch does the work. Under loom, which cannot see crossbeam-epoch's atomics, and
//! under Miri, whose Stacked Borrows model crossbeam-epoch is known not to pass (crossbeam
//! checks it under Tree Borrows: crossbeam-rs/crossbeam#545, #996), a model stands in:
//! readers count themselves in one shared counter, and `retire` waits for it to fall to
//! zero before it frees (or, called inside one of its own thread's sections, leaves the
//! free to that section's end). That is a stricter grace period (it waits for every
//! reader, not only those that began before the taking-out) with the same guarantee, so
//! the loom models check the protocol that uses it, and Miri the unsafe code around it.
//! Only when the free runs differs: the model frees synchronously, crossbeam-epoch later
//! on some thread, which is why what is retired must run no code of the user's.

/// Runs `f` in a read-side critical section. Sections may nest; a long one delays every
/// deferred free in the process (crossbeam-epoch's collector is process-wide), so `f`
/// should not block.
#[cfg(not(any(loom, miri)))]
pub(crate) fn read<R>(f: impl FnOnce() -> R) -> R {
    let _section = crossbeam_epoch::pin();
    f()
}

/// Frees `value` once every [`read`] section that began before this call has ended: at
/// once if no thread is in one (this call tries to move the epoch on a few times),
/// otherwise whenever some thread later collects crossbeam-epoch's garbage (every so many
/// sections, anywhere in the process), which may be never. The free may run on any thread,
/// inside any section.
///
/// # Safety
///
/// `value` must come from `Box::into_raw`, must no longer be reachable from any shared
/// place a reader could load it from, and nothing else may free it. Its `T` must be
/// fit to drop on any thread at any later time (`Send`, owning no borrow), and its drop
/// should run no code a user gave: it would run at an arbitrary time, inside some
/// unrelated operation.
#[cfg(not(any(loom, miri)))]
pub(crate) unsafe fn retire<T>(value: *mut T) {
    let section = crossbeam_epoch::pin();
    // SAFETY: the caller guarantees `value` is a `Box` that no reader can load any more,
    // so the sections that may still hold it all began before this one was pinned, and
    // crossbeam-epoch runs the closure only after they have all ended.
    unsafe {
        section.defer_unchecked(move || {
            // SAFETY: the caller handed over sole ownership of a `Box::into_raw` pointer
            // to a value that may be dropped on this thread, now.
            drop(Box::from_raw(value));
        });
    }
    section.flush();
    drop(section);
    // A free is due two epoch advances after it was deferred. A flush tries one advance,
    // which any section pinned in an older epoch holds back (the deferring one would hold
    // back the second), so each try is a fresh section: with no other section open, the
    // free runs here.
    for _ in 0..3 {
        crossbeam_epoch::pin().flush();
    }
}

#[cfg(loom)]
loom::lazy_static! {
    /// How many read sections are open, model-wide.
    static ref READERS: loom::sync::atomic::AtomicUsize = loom::sync::atomic::AtomicUsize::new(0);
}

/// How many read sections are open, process-wide.
#[cfg(all(miri, not(loom)))]
static READERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A value whose free waits for the end of this thread's own read sections: a `retire`
/// made inside one, which could never see the readers fall to zero.
#[cfg(any(loom, miri))]
#[derive(Clone, Copy)]
struct Deferred {
    value: *mut (),
    free: unsafe fn(*mut ()),
}

#[cfg(loom)]
loom::thread_local! {
    /// This thread's open read sections, and what their end must free.
    static SECTIONS: std::cell::RefCell<(usize, Vec<Deferred>)> =
        std::cell::RefCell::new((0, Vec::new()));
}

#[cfg(all(miri, not(loom)))]
std::thread_local! {
    /// This thread's open read sections, and what their end must free.
    static SECTIONS: std::cell::RefCell<(usize, Vec<Deferred>)> =
        const { std::cell::RefCell::new((0, Vec::new())) };
}

/// Runs `f` in a read-side critical section (the model: a shared count of readers).
#[cfg(any(loom, miri))]
pub(crate) fn read<R>(f: impl FnOnce() -> R) -> R {
    use crate::sync::atomic::Ordering::SeqCst;
    /// Leaves the section even if `f` unwinds; the outermost one frees what `retire` left
    /// to it.
    struct Section;
    impl Drop for Section {
        fn drop(&mut self) {
            READERS.fetch_sub(1, SeqCst);
            let later = SECTIONS.with(|sections| {
                let mut sections = sections.borrow_mut();
                sections.0 -= 1;
                if sections.0 == 0 {
                    std::mem::take(&mut sections.1)
                } else {
                    Vec::new()
                }
            });
            for deferred in later {
                wait_for_readers();
                // SAFETY: `retire` left this value here under its own contract, and no
                // section is open now.
                unsafe { complete(deferred) };
            }
        }
    }
    SECTIONS.with(|sections| sections.borrow_mut().0 += 1);
    READERS.fetch_add(1, SeqCst);
    let _section = Section;
    f()
}

/// Waits until no read section is open anywhere (the model's grace period).
#[cfg(any(loom, miri))]
fn wait_for_readers() {
    use crate::sync::atomic::Ordering::SeqCst;
    // A read-modify-write, not a load: loom does not model `SeqCst` loads
    // (tokio-rs/loom#180), and this read closes a store-then-load handshake.
    super::spin_until(|| (READERS.fetch_add(0, SeqCst) == 0).then_some(()));
}

/// Frees `value` once no read section is open (the model). Called inside one of this
/// thread's own sections, it leaves the free to that section's end.
///
/// # Safety
///
/// As for the crossbeam-epoch build: `value` must come from `Box::into_raw`, must no longer
/// be reachable from any shared place, and nothing else may free it. The pointer must have
/// been taken out with a `SeqCst` read-modify-write (a swap), so that a reader that misses
/// it is one this wait sees, in loom's model too.
#[cfg(any(loom, miri))]
pub(crate) unsafe fn retire<T>(value: *mut T) {
    /// Frees a `Box<T>` given as an untyped pointer.
    unsafe fn free<T>(value: *mut ()) {
        // SAFETY: `value` is the `Box::into_raw` pointer `retire` was handed, of type `T`.
        drop(unsafe { Box::from_raw(value.cast::<T>()) });
    }
    let deferred = Deferred {
        value: value.cast(),
        free: free::<T>,
    };
    let inside = SECTIONS.with(|sections| {
        let mut sections = sections.borrow_mut();
        if sections.0 > 0 {
            sections.1.push(deferred);
            true
        } else {
            false
        }
    });
    if !inside {
        wait_for_readers();
        // SAFETY: no section is open, and a section opened from now on cannot load
        // `value`, which the caller took out of every shared place before this call.
        unsafe { complete(deferred) };
    }
}

/// The end of a retire, once its grace period is over: under Miri the free; under loom a
/// record of it, so that a reader can check that what it loaded was not retired under
/// it ([`assert_not_retired`]), with the free at the end of the model's run, so that no
/// address is reused within one.
///
/// # Safety
///
/// `deferred` is a retired value whose grace period is over, completed once.
#[cfg(any(loom, miri))]
unsafe fn complete(deferred: Deferred) {
    #[cfg(loom)]
    RETIRED
        .0
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push(deferred);
    #[cfg(not(loom))]
    // SAFETY: the caller's contract: the grace period is over, and this is the one free.
    unsafe {
        (deferred.free)(deferred.value)
    };
}

/// What the model's run has retired, freed when the run ends.
#[cfg(loom)]
struct Retired(loom::sync::Mutex<Vec<Deferred>>);

#[cfg(loom)]
// SAFETY: the pointers are only dereferenced to free them, once, in the drop, when the
// model's run is over; every retired value may be dropped on any thread (`retire`'s
// contract).
unsafe impl Send for Retired {}
#[cfg(loom)]
// SAFETY: as for `Send`; the list itself is behind a mutex.
unsafe impl Sync for Retired {}

#[cfg(loom)]
impl Drop for Retired {
    fn drop(&mut self) {
        let retired = self
            .0
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for deferred in retired.drain(..) {
            // SAFETY: completed retires, each recorded once, with the run over.
            unsafe { (deferred.free)(deferred.value) };
        }
    }
}

#[cfg(loom)]
loom::lazy_static! {
    static ref RETIRED: Retired = Retired(loom::sync::Mutex::new(Vec::new()));
}

/// Under loom, at the end of a read section's use of `value`: fails the model if `value`
/// was retired while the section held it.
#[cfg(loom)]
pub(crate) fn assert_not_retired(value: *const ()) {
    let retired = RETIRED
        .0
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    assert!(
        !retired
            .iter()
            .any(|deferred| deferred.value.cast_const() == value),
        "a value was freed while a read section held it"
    );
}
