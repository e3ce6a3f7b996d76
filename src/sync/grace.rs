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
//! zero before it frees. That is a stricter grace period (it waits for every reader, not
//! only those that began before the taking-out) with the same guarantee, so the loom
//! models check the protocol that uses it, and Miri the unsafe code around it.

/// Runs `f` in a read-side critical section. Sections may nest; a long one delays every
/// deferred free in the process (crossbeam-epoch's collector is process-wide), so `f`
/// should not block.
#[cfg(not(any(loom, miri)))]
pub(crate) fn read<R>(f: impl FnOnce() -> R) -> R {
    let _section = crossbeam_epoch::pin();
    f()
}

/// Frees `value` once every [`read`] section that began before this call has ended: at
/// once if no other thread is in one (this call tries to move the epoch on a few times),
/// otherwise on a later section's end somewhere in the process. The free may run on any
/// thread.
///
/// # Safety
///
/// `value` must come from `Box::into_raw`, must no longer be reachable from any shared
/// place a reader could load it from, and nothing else may free it. Its `T` must be
/// fit to drop on any thread at any later time (`Send`, owning no borrow).
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
    // which a section pinned in an older epoch (this thread's own, too) holds back, so
    // each try is a fresh section: with no other section open, the free runs here.
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

/// Runs `f` in a read-side critical section (the model: a shared count of readers).
#[cfg(any(loom, miri))]
pub(crate) fn read<R>(f: impl FnOnce() -> R) -> R {
    use crate::sync::atomic::Ordering::SeqCst;
    /// Leaves the section even if `f` unwinds.
    struct Section;
    impl Drop for Section {
        fn drop(&mut self) {
            READERS.fetch_sub(1, SeqCst);
        }
    }
    READERS.fetch_add(1, SeqCst);
    let _section = Section;
    f()
}

/// Frees `value` once no read section is open (the model).
///
/// # Safety
///
/// As for the crossbeam-epoch build: `value` must come from `Box::into_raw`, must no longer
/// be reachable from any shared place, and nothing else may free it. The pointer must have
/// been taken out with a `SeqCst` store, so that a reader that misses that store is one
/// this wait sees.
#[cfg(any(loom, miri))]
pub(crate) unsafe fn retire<T>(value: *mut T) {
    use crate::sync::atomic::Ordering::SeqCst;
    super::spin_until(|| (READERS.load(SeqCst) == 0).then_some(()));
    // SAFETY: no section is open, and a section opened from now on cannot load `value`,
    // which the caller took out of every shared place before this call.
    drop(unsafe { Box::from_raw(value) });
}
