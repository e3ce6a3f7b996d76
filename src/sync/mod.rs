//! The lock-free building blocks the engine is made of, and the one place that chooses
//! between `std` and loom primitives.
//!
//! - [`mpsc`]: the intrusive multi-producer single-consumer queue that carries timers and
//!   messages into a shard's owner;
//! - [`timer_state`]: the one word per pooled timer that decides every race between a
//!   cancel, a reset, the owner firing it and the pool taking it back;
//! - [`run_queue`]: the ring of claimed timers that the owner and idle workers take runs
//!   from;
//! - `grace` (with the `keyed` feature): read sections and frees deferred past them
//!   (crossbeam-epoch's, or a loom model of it).
//!
//! This layer knows nothing of wheels, shards or callbacks: each piece is generic over the
//! nodes it links, or works on plain words, so that its loom model checks it alone.
//!
//! Every atomic, `Arc`, lock and shared cell in corewheel comes from this module, so that
//! building with `RUSTFLAGS="--cfg loom"` swaps them all for loom's model-checked versions
//! and the models in `loom-tests/` explore the real code rather than a copy of it. The few
//! std primitives that loom must not replace are named in [`unmodelled`]. What is left
//! outside: thread-local cells (`std::cell`, with loom's `thread_local!` under loom), the
//! weak engine reference a thread's context holds (loom has no `Weak`; see `context`), and
//! the channel `build` uses once to hear that each worker has started.

#[cfg(feature = "keyed")]
pub(crate) mod grace;
pub(crate) mod mpsc;
pub(crate) mod run_queue;
pub(crate) mod timer_state;

#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex};

/// std primitives that stay std's under loom too. They guard nothing the models race: an
/// engine's list of worker threads and the start of its shutdown (taken by the thread that
/// builds or shuts the engine down, never on a timer's path), the process-wide count of
/// engines, which only numbers them so that a handle from one is stale in another, the
/// process-wide counter of keyed-timer token blocks, which only makes tokens unique, a
/// keyed timers' handler (loom has no `Weak`: a fire upgrades a weak reference to it, and
/// the models race that fire against the drop through the map and the anchor), and
/// values set once before any timer exists (a worker's thread handle, the cycle counter's
/// calibration).
pub(crate) mod unmodelled {
    #[cfg(feature = "keyed")]
    pub(crate) use std::sync::atomic::AtomicU64;
    pub(crate) use std::sync::atomic::{AtomicU32, Ordering};
    #[cfg(feature = "keyed")]
    pub(crate) use std::sync::{Arc, Weak};
    pub(crate) use std::sync::{Mutex, OnceLock};
}

/// Atomics: loom's under `--cfg loom`, std's otherwise.
pub(crate) mod atomic {
    #[cfg(loom)]
    pub(crate) use loom::sync::atomic::{
        AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, Ordering, fence,
    };
    #[cfg(not(loom))]
    pub(crate) use std::sync::atomic::{
        AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, Ordering, fence,
    };

    /// Replaces `word`'s value `v` with `f(v)` in one atomic step, retrying on a race, and
    /// returns the value replaced: `fetch_update` with an `f` that always gives a value,
    /// written out because newer toolchains rename that method and warn about the old name.
    /// `set` orders the store of a successful swap, `fetch` every load.
    #[inline]
    pub(crate) fn update(
        word: &AtomicU64,
        set: Ordering,
        fetch: Ordering,
        mut f: impl FnMut(u64) -> u64,
    ) -> u64 {
        let mut current = word.load(fetch);
        loop {
            match word.compare_exchange_weak(current, f(current), set, fetch) {
                Ok(previous) => return previous,
                Err(actual) => current = actual,
            }
        }
    }
}

/// Waits for another thread that holds a short critical section: calls `ready` until it
/// returns a value, spinning at first, then yielding so that a preempted holder can run.
/// Under loom every wait yields, which is what lets the model explore the holder making
/// progress. With [`wait_until`], the crate's only spin-wait loops.
#[inline]
pub(crate) fn spin_until<R>(mut ready: impl FnMut() -> Option<R>) -> R {
    let mut attempt = 0_u32;
    loop {
        if let Some(value) = ready() {
            return value;
        }
        attempt = attempt.saturating_add(1);
        spin_or_yield(attempt);
    }
}

/// Waits for another thread that may be running a callback, which can block for as long
/// as it likes: as [`spin_until`] at first, then sleeping for a pause that doubles up to
/// about a millisecond, so that a long wait costs a thousand wake-ups a second rather than
/// a core.
pub(crate) fn wait_until<R>(mut ready: impl FnMut() -> Option<R>) -> R {
    /// Attempts spent spinning and yielding before the pauses begin.
    #[cfg(not(loom))]
    const BEFORE_SLEEPING: u32 = 128;
    let mut attempt = 0_u32;
    loop {
        if let Some(value) = ready() {
            return value;
        }
        attempt = attempt.saturating_add(1);
        #[cfg(not(loom))]
        if attempt > BEFORE_SLEEPING {
            let doublings = (attempt - BEFORE_SLEEPING).min(10);
            std::thread::sleep(std::time::Duration::from_micros(1 << doublings));
            continue;
        }
        spin_or_yield(attempt);
    }
}

/// Lets other threads run, for a wait that one of them ends within moments.
pub(crate) fn yield_now() {
    spin_or_yield(u32::MAX);
}

/// One step of [`spin_until`]'s wait.
#[inline]
fn spin_or_yield(attempt: u32) {
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
