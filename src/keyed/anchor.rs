//! Anchors: how a keyed timer's callback finds the state its
//! [`KeyedTimers`](crate::KeyedTimers) shares with it, without a reference count.
//!
//! A reference-counted pointer in each callback would cost every new key's timer an
//! increment and a decrement on one cache line that every arming thread shares. Instead
//! the state is published in a slot of a process-wide table, and a callback carries only
//! the slot's index. A fire looks the slot up inside a [`grace::read`] section; the owner,
//! when dropped, empties the slot and [`grace::retire`]s the state, which is freed once no
//! section that could have loaded it is still open. So arming and cancelling touch nothing
//! shared, and a fire reads two shared words that change only when a `KeyedTimers` is made
//! or dropped. The free may come late, on any thread, inside any section, so the state must
//! hold nothing whose drop runs a user's code (`KeyedTimers` keeps its handler out of it).
//!
//! A slot is reused once its owner is gone, so a late callback may find another owner's
//! state there. The state starts with its type's `TypeId`, so a callback only ever sees
//! state of its own type; and a keyed timer's fire acts only on a map slot that holds its
//! own process-unique token ([`token`](crate::keyed::token)), which another owner's map
//! never holds. A late fire is then a lookup that finds nothing.
//!
//! The table grows in chunks, each twice the size of the one before, which are never
//! freed: it holds as many slots as there have ever been `KeyedTimers` alive at once, one
//! pointer each.

use std::any::TypeId;
use std::ptr::{NonNull, null_mut};

use crate::sync::atomic::{AtomicPtr, Ordering::SeqCst};
use crate::sync::{Mutex, grace};

/// Slots in the first chunk; chunk `k` holds `FIRST_CHUNK << k`.
const FIRST_CHUNK: usize = 32;

/// Chunks: enough for `FIRST_CHUNK * (2^CHUNKS - 1)` slots, more than the address space
/// could hold states for.
const CHUNKS: usize = usize::BITS as usize - 6;

/// The process-wide table of slots.
struct Table {
    /// Chunk `k`'s first slot, or null until a slot in it is first needed.
    chunks: [AtomicPtr<AtomicPtr<()>>; CHUNKS],
    free: Mutex<FreeSlots>,
}

/// The slots no owner holds.
#[derive(Default)]
struct FreeSlots {
    /// Slots from this index on have never been used.
    unused_from: usize,
    /// Slots whose owners have been dropped.
    returned: Vec<usize>,
}

/// What a slot points to: the owner's state, after its type's identity. `repr(C)` puts
/// `type_id` first whatever `T` is, so a reader can check it before it knows `T`.
#[repr(C)]
struct Published<T> {
    type_id: TypeId,
    state: T,
}

impl Table {
    fn new() -> Self {
        Self {
            chunks: std::array::from_fn(|_| AtomicPtr::new(null_mut())),
            free: Mutex::new(FreeSlots::default()),
        }
    }

    /// The chunk and the offset in it of slot `index`.
    fn locate(index: usize) -> (usize, usize) {
        let in_units = index / FIRST_CHUNK + 1;
        let chunk = (usize::BITS - 1 - in_units.leading_zeros()) as usize;
        (chunk, index - FIRST_CHUNK * ((1 << chunk) - 1))
    }

    /// Slot `index`, if its chunk has been made (always, for an index an anchor holds).
    fn slot(&self, index: usize) -> Option<&AtomicPtr<()>> {
        let (chunk, offset) = Self::locate(index);
        let first = self.chunks.get(chunk)?.load(SeqCst);
        // SAFETY: a non-null chunk pointer is the start of a leaked boxed slice of
        // `FIRST_CHUNK << chunk` slots, published once and freed only with the table;
        // `locate` gives an offset below that length.
        (!first.is_null()).then(|| unsafe { &*first.add(offset) })
    }

    /// Takes a slot no owner holds, making its chunk if it is the chunk's first use.
    fn take_slot(&self) -> usize {
        let mut free = self
            .free
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(index) = free.returned.pop() {
            return index;
        }
        let index = free.unused_from;
        free.unused_from += 1;
        let (chunk, offset) = Self::locate(index);
        if offset == 0 {
            let slots: Box<[AtomicPtr<()>]> = (0..FIRST_CHUNK << chunk)
                .map(|_| AtomicPtr::new(null_mut()))
                .collect();
            // Every chunk below `CHUNKS` exists before the indices run past
            // `usize::MAX`, which no process reaches: each slot in use holds a live state.
            if let Some(place) = self.chunks.get(chunk) {
                place.store(Box::into_raw(slots).cast::<AtomicPtr<()>>(), SeqCst);
            }
        }
        index
    }

    fn give_back(&self, index: usize) {
        let mut free = self
            .free
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        free.returned.push(index);
    }
}

impl Drop for Table {
    /// Frees the chunks. The process-wide table is never dropped; under loom, each model's
    /// run makes and drops its own.
    fn drop(&mut self) {
        for (chunk, place) in self.chunks.iter().enumerate() {
            let first = place.load(SeqCst);
            if !first.is_null() {
                let slots = std::ptr::slice_from_raw_parts_mut(first, FIRST_CHUNK << chunk);
                // SAFETY: `first` came from `Box::into_raw` of a boxed slice of exactly this
                // length, and with `&mut self` no reader holds a slot.
                drop(unsafe { Box::from_raw(slots) });
            }
        }
    }
}

#[cfg(not(loom))]
fn table() -> &'static Table {
    static TABLE: crate::sync::unmodelled::OnceLock<Table> =
        crate::sync::unmodelled::OnceLock::new();
    TABLE.get_or_init(Table::new)
}

#[cfg(loom)]
fn table() -> &'static Table {
    loom::lazy_static! {
        static ref TABLE: Table = Table::new();
    }
    &TABLE
}

/// State published in a slot of the table, owned as a `Box` is: dropping the anchor
/// empties the slot and frees the state once no callback can be reading it.
///
/// Only [`new`](Self::new) asks for `T: Send + Sync + 'static`, so that an owner with
/// looser bounds of its own can hold one; every anchor that exists was made by it.
pub(crate) struct Anchor<T> {
    index: usize,
    published: NonNull<Published<T>>,
}

// SAFETY: an `Anchor` owns its state as a `Box` would, and callbacks on other threads read
// it through shared references, so sending or sharing the anchor needs `T: Send + Sync`.
unsafe impl<T: Send + Sync + 'static> Send for Anchor<T> {}
// SAFETY: as for `Send`: the anchor only hands out `&T`.
unsafe impl<T: Send + Sync + 'static> Sync for Anchor<T> {}

impl<T: Send + Sync + 'static> Anchor<T> {
    /// Publishes `state` in a free slot.
    pub(crate) fn new(state: T) -> Self {
        let published = Box::new(Published {
            type_id: TypeId::of::<T>(),
            state,
        });
        let published = NonNull::from(Box::leak(published));
        let table = table();
        let index = table.take_slot();
        if let Some(slot) = table.slot(index) {
            slot.store(published.as_ptr().cast(), SeqCst);
        }
        Self { index, published }
    }

    /// The slot's index: what a callback carries to find the state with [`with`].
    pub(crate) fn index(&self) -> usize {
        self.index
    }
}

impl<T> std::ops::Deref for Anchor<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the anchor owns the published state until its drop, which is the only
        // place that retires it.
        unsafe { &self.published.as_ref().state }
    }
}

impl<T> Drop for Anchor<T> {
    fn drop(&mut self) {
        let table = table();
        if let Some(slot) = table.slot(self.index) {
            // A swap rather than a store: loom models the handshake with `read_slot` only
            // through read-modify-writes.
            slot.swap(null_mut(), SeqCst);
        }
        table.give_back(self.index);
        // SAFETY: the state came from `Box::leak`, the slot no longer points to it (the
        // swap above is `SeqCst`, as the model of `retire` needs), this drop is its
        // only owner's, and `new` made it of a `Send + 'static` type.
        unsafe { grace::retire(self.published.as_ptr()) };
    }
}

/// A slot's pointer, read in a read section. The section's start and the owner's taking
/// the pointer out are a store-then-load handshake on both sides, which needs `SeqCst`;
/// loom does not model `SeqCst` loads (tokio-rs/loom#180) and would let this read an old
/// pointer, so under loom it is a read-modify-write, which always reads the latest.
#[inline]
fn read_slot(slot: &AtomicPtr<()>) -> *mut () {
    #[cfg(loom)]
    {
        slot.compare_exchange(null_mut(), null_mut(), SeqCst, SeqCst)
            .unwrap_or_else(|current| current)
    }
    #[cfg(not(loom))]
    {
        slot.load(SeqCst)
    }
}

/// Runs `f` on the state of type `T` published at slot `index`, inside a read section,
/// and returns what it returned; `Err(f)`, without running it, if the slot holds nothing
/// or another type's state (its owner is gone). `f` comes back rather than being dropped
/// here, so that what it holds (a key of the user's) is dropped outside the section.
pub(crate) fn with<T: Send + Sync + 'static, R, F: FnOnce(&T) -> R>(
    index: usize,
    f: F,
) -> Result<R, F> {
    grace::read(|| {
        let Some(slot) = table().slot(index) else {
            return Err(f);
        };
        let published = read_slot(slot);
        if published.is_null() {
            return Err(f);
        }
        // SAFETY: a non-null slot points to a `Published<_>` that is freed only by
        // `retire`, after every read section that could have loaded it, this one included,
        // has ended; `repr(C)` puts its `TypeId` first whatever its type.
        let type_id = unsafe { *published.cast::<TypeId>() };
        if type_id != TypeId::of::<T>() {
            return Err(f);
        }
        // SAFETY: as above, and the `TypeId` says the state is a `T`.
        let state = unsafe { &(*published.cast::<Published<T>>()).state };
        let result = f(state);
        #[cfg(loom)]
        grace::assert_not_retired(published.cast_const());
        Ok(result)
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{Anchor, Table, with};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn slots_map_onto_doubling_chunks() {
        assert_eq!(Table::locate(0), (0, 0));
        assert_eq!(Table::locate(31), (0, 31));
        assert_eq!(Table::locate(32), (1, 0));
        assert_eq!(Table::locate(95), (1, 63));
        assert_eq!(Table::locate(96), (2, 0));
        assert_eq!(Table::locate(223), (2, 127));
        assert_eq!(Table::locate(224), (3, 0));
    }

    #[test]
    fn a_callback_finds_its_state_until_the_owner_drops_it() {
        let anchor = Anchor::new(7_u32);
        let index = anchor.index();
        assert_eq!(with(index, |state: &u32| *state).ok(), Some(7));
        assert_eq!(*anchor, 7);
        drop(anchor);
        assert!(with(index, |state: &u32| *state).is_err());
    }

    #[test]
    fn a_reused_slot_never_shows_another_types_state() {
        // Slots are reused from a process-wide list, which other tests share, so several
        // are made until one lands on the old index.
        let index = Anchor::new(1_u64).index();
        let mut held = Vec::new();
        for _ in 0..64 {
            let other = Anchor::new(String::from("other"));
            if other.index() == index {
                assert!(with(index, |state: &u64| *state).is_err());
                assert_eq!(with(index, |state: &String| state.len()).ok(), Some(5));
            }
            held.push(other);
        }
    }

    /// An owner dropped inside a read section (a fire whose key's drop drops a
    /// `KeyedTimers`) must not wait for itself: the free waits for the section's end.
    #[test]
    fn an_anchor_dropped_inside_a_read_section_is_freed_without_a_hang() {
        let drops = Arc::new(AtomicUsize::new(0));
        let outer = Anchor::new(1_u8);
        let inner = Anchor::new(Counted(Arc::clone(&drops)));
        let inner_index = inner.index();
        let mut inner = Some(inner);
        let seen = with(outer.index(), |_: &u8| drop(inner.take()));
        assert!(seen.is_ok());
        assert!(
            with(inner_index, |_: &Counted| ()).is_err(),
            "gone from its slot"
        );
        assert_freed_once(&drops);
    }

    /// Asserts that the state was dropped once. A free is deferred while a section is open
    /// somewhere (another test's thread may hold one, and be descheduled inside it on a
    /// loaded machine); later sections on this thread move the epoch on until it runs, so
    /// this waits for that by time, generously, not by a count of tries. (Under Miri the
    /// model's `retire` waits for the readers, so the state is gone already.)
    fn assert_freed_once(drops: &AtomicUsize) {
        #[cfg(not(miri))]
        {
            let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while drops.load(Ordering::SeqCst) != 1 && std::time::Instant::now() < give_up {
                crossbeam_epoch::pin().flush();
                std::thread::yield_now();
            }
        }
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    /// Counts its drops.
    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_state_is_dropped_once_no_reader_is_left() {
        let drops = Arc::new(AtomicUsize::new(0));
        let anchor = Anchor::new(Counted(Arc::clone(&drops)));
        let index = anchor.index();
        let readers: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    for _ in 0..if cfg!(miri) { 20 } else { 200 } {
                        let _ = with(index, |state: &Counted| state.0.load(Ordering::SeqCst));
                    }
                })
            })
            .collect();
        drop(anchor);
        for reader in readers {
            reader.join().unwrap();
        }
        assert_freed_once(&drops);
    }
}
