//! A generation-checked slab in fixed-size chunks, which gives whole chunks back once empty.
//!
//! Why chunks: a single growable `Vec` keeps its high-water mark forever, so a burst of a
//! million timers that are then cancelled would pin their memory for the life of the wheel
//! (the failure Netty #2541 and tokio #8252 describe). Here every chunk keeps its own free list
//! and a count of live entries; the moment a chunk's last entry is removed, the chunk is freed
//! back to the allocator, except for a few empty chunks kept as spares so that a workload
//! oscillating around a chunk boundary does not allocate and free on every operation.
//!
//! Why generations: an index alone would let a stale key reach whatever timer reuses the
//! slot. Each entry's generation moves on when it is removed, and a chunk slot that is freed
//! and reused later starts above every generation it ever issued.

use std::mem::size_of;

/// Entries per chunk. A power of two so that index to (chunk, offset) is a shift and a mask.
/// Smaller under Miri, which interprets every entry a chunk initialises.
#[cfg(not(miri))]
pub(crate) const CHUNK_LEN: usize = 1024;
#[cfg(miri)]
pub(crate) const CHUNK_LEN: usize = 256;
const CHUNK_SHIFT: u32 = CHUNK_LEN.trailing_zeros();
const OFFSET_MASK: u32 = CHUNK_LEN as u32 - 1;
/// The largest chunk count whose indices stay below `u32::MAX`, which callers use as "none".
const MAX_CHUNKS: usize = (u32::MAX as usize) >> CHUNK_SHIFT;
const NIL: u32 = u32::MAX;
/// A generation that reaches this value is never issued again; its entry is retired.
const RETIRED: u32 = u32::MAX;

struct Entry<V> {
    value: Option<V>,
    generation: u32,
    next_free: u32,
}

struct Chunk<V> {
    /// `None` once the chunk has been freed; the slot itself stays to remember its generation
    /// floor.
    entries: Option<Box<[Entry<V>; CHUNK_LEN]>>,
    free_head: u32,
    /// Entries holding a value.
    live: u32,
    /// Above every generation an entry of this chunk slot has handed out.
    generation_floor: u32,
    prev_partial: u32,
    next_partial: u32,
}

impl<V> Chunk<V> {
    fn released() -> Self {
        Self {
            entries: None,
            free_head: NIL,
            live: 0,
            generation_floor: 0,
            prev_partial: NIL,
            next_partial: NIL,
        }
    }
}

/// Where a value lives, and which generation of that entry it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlabKey {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

/// A chunked, generation-checked slab. See the module documentation.
pub(crate) struct Slab<V> {
    chunks: Vec<Chunk<V>>,
    /// Head of a doubly-linked list (through the chunks) of allocated chunks with a free
    /// entry. Insertion takes from its head, so it is O(1) whatever the occupancy.
    partial_head: u32,
    /// Chunk slots whose memory has been freed and can be allocated again.
    released: Vec<u32>,
    /// Chunks whose memory is allocated.
    allocated_chunks: usize,
    empty_chunks: usize,
    spare_chunks: usize,
    len: usize,
}

impl<V> Slab<V> {
    /// A slab that keeps memory for at least `capacity` values once it has been allocated,
    /// and allocates that much now.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let chunks_wanted = capacity.div_ceil(CHUNK_LEN).min(MAX_CHUNKS);
        let mut slab = Self {
            chunks: Vec::with_capacity(chunks_wanted),
            partial_head: NIL,
            released: Vec::new(),
            allocated_chunks: 0,
            empty_chunks: 0,
            spare_chunks: chunks_wanted.max(1),
            len: 0,
        };
        for _ in 0..chunks_wanted {
            if slab.grow().is_none() {
                break;
            }
        }
        slab
    }

    /// Values currently stored.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Stores `value`, or gives it back when all four billion indices are in use.
    #[inline]
    pub(crate) fn insert(&mut self, value: V) -> Result<SlabKey, V> {
        let chunk_index = match self.partial_head {
            NIL => match self.grow() {
                Some(c) => c,
                None => return Err(value),
            },
            c => c,
        };
        let chunk = &mut self.chunks[chunk_index as usize];
        let Some(entries) = chunk.entries.as_deref_mut() else {
            // A chunk on the partial list always has its memory; refusing is safer than
            // indexing into nothing if that were ever broken.
            return Err(value);
        };
        let offset = chunk.free_head;
        let entry = &mut entries[offset as usize];
        chunk.free_head = entry.next_free;
        entry.value = Some(value);
        let generation = entry.generation;
        if chunk.live == 0 {
            self.empty_chunks -= 1;
        }
        chunk.live += 1;
        if chunk.free_head == NIL {
            self.unlink_partial(chunk_index);
        }
        self.len += 1;
        Ok(SlabKey {
            index: (chunk_index << CHUNK_SHIFT) | offset,
            generation,
        })
    }

    /// The value under `key`, if `key` is still current.
    #[inline]
    pub(crate) fn get(&self, key: SlabKey) -> Option<&V> {
        let entry = self.entry(key.index)?;
        if entry.generation == key.generation {
            entry.value.as_ref()
        } else {
            None
        }
    }

    /// The value under `key`, if `key` is still current.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: SlabKey) -> Option<&mut V> {
        let entry = self.entry_mut(key.index)?;
        if entry.generation == key.generation {
            entry.value.as_mut()
        } else {
            None
        }
    }

    /// The value at `index`, whatever its generation. For links between live values, which
    /// are always current.
    ///
    /// # Panics
    /// If nothing is stored at `index`: that would be a broken link inside corewheel, never
    /// something a caller can cause.
    #[inline]
    pub(crate) fn at(&self, index: u32) -> &V {
        match self.entry(index).and_then(|e| e.value.as_ref()) {
            Some(value) => value,
            None => unreachable!("slab index {index} is linked but holds no value"),
        }
    }

    /// The value at `index`, whatever its generation. See [`Slab::at`].
    #[inline]
    pub(crate) fn at_mut(&mut self, index: u32) -> &mut V {
        match self.entry_mut(index).and_then(|e| e.value.as_mut()) {
            Some(value) => value,
            None => unreachable!("slab index {index} is linked but holds no value"),
        }
    }

    /// Removes and returns the value under `key`, if `key` is still current. Frees the
    /// value's chunk if it was the chunk's last and enough spares are kept already.
    #[inline]
    pub(crate) fn remove(&mut self, key: SlabKey) -> Option<V> {
        let chunk_index = key.index >> CHUNK_SHIFT;
        let offset = key.index & OFFSET_MASK;
        let chunk = self.chunks.get_mut(chunk_index as usize)?;
        let entry = &mut chunk.entries.as_deref_mut()?[offset as usize];
        if entry.generation != key.generation {
            return None;
        }
        let value = entry.value.take()?;
        entry.generation += 1;
        chunk.generation_floor = chunk.generation_floor.max(entry.generation);
        // An entry whose generation is used up never goes back on the free list, so no key
        // can ever see a generation wrap; it still stops counting as live, so it cannot pin
        // its chunk.
        let retired = entry.generation == RETIRED;
        let was_full = chunk.free_head == NIL;
        if !retired {
            entry.next_free = chunk.free_head;
            chunk.free_head = offset;
        }
        chunk.live -= 1;
        let now_empty = chunk.live == 0;
        // A chunk slot with an exhausted generation is never handed out again, so there is
        // no point keeping its memory as a spare.
        let exhausted = chunk.generation_floor == RETIRED;
        self.len -= 1;
        if was_full && !retired {
            self.push_partial(chunk_index);
        }
        if now_empty {
            self.empty_chunks += 1;
            if self.empty_chunks > self.spare_chunks || exhausted {
                self.release(chunk_index);
            }
        }
        Some(value)
    }

    /// Removes and returns whatever value is at `index`. For values the caller holds a
    /// link to, rather than a key.
    #[inline]
    pub(crate) fn remove_at(&mut self, index: u32) -> Option<V> {
        let generation = self.entry(index)?.generation;
        self.remove(SlabKey { index, generation })
    }

    /// Frees every chunk that holds no value, spares included.
    pub(crate) fn shrink_to_fit(&mut self) {
        for chunk_index in 0..self.chunks.len() {
            let chunk = &self.chunks[chunk_index];
            if chunk.entries.is_some() && chunk.live == 0 {
                self.release(chunk_index as u32);
            }
        }
        self.released.shrink_to_fit();
    }

    /// Bytes of memory the slab holds from the allocator, chunks and bookkeeping.
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.allocated_chunks * CHUNK_LEN * size_of::<Entry<V>>()
            + self.chunks.capacity() * size_of::<Chunk<V>>()
            + self.released.capacity() * size_of::<u32>()
    }

    /// Bytes one stored value costs the slab, including its own size.
    pub(crate) const fn bytes_per_entry() -> usize {
        size_of::<Entry<V>>()
    }

    // The offset is masked below CHUNK_LEN, so indexing the fixed-size array needs no
    // bounds check at run time.
    #[inline]
    fn entry(&self, index: u32) -> Option<&Entry<V>> {
        let chunk = self.chunks.get((index >> CHUNK_SHIFT) as usize)?;
        Some(&chunk.entries.as_deref()?[(index & OFFSET_MASK) as usize])
    }

    #[inline]
    fn entry_mut(&mut self, index: u32) -> Option<&mut Entry<V>> {
        let chunk = self.chunks.get_mut((index >> CHUNK_SHIFT) as usize)?;
        Some(&mut chunk.entries.as_deref_mut()?[(index & OFFSET_MASK) as usize])
    }

    /// Gives a chunk memory (reusing a freed chunk slot if there is one) and puts it on the
    /// partial list. `None` when the index space is used up.
    fn grow(&mut self) -> Option<u32> {
        let chunk_index = match self.released.pop() {
            Some(c) => c,
            None if self.chunks.len() < MAX_CHUNKS => {
                self.chunks.push(Chunk::released());
                (self.chunks.len() - 1) as u32
            }
            None => return None,
        };
        let chunk = &mut self.chunks[chunk_index as usize];
        let generation = chunk.generation_floor;
        let entries: Box<[Entry<V>]> = (0..CHUNK_LEN as u32)
            .map(|offset| Entry {
                value: None,
                generation,
                next_free: if offset + 1 < CHUNK_LEN as u32 {
                    offset + 1
                } else {
                    NIL
                },
            })
            .collect();
        // Built on the heap as a slice (an array this size could overflow the stack), then
        // typed as an array; the lengths match by construction.
        chunk.entries = Some(entries.try_into().ok()?);
        chunk.free_head = 0;
        chunk.live = 0;
        self.allocated_chunks += 1;
        self.empty_chunks += 1;
        self.push_partial(chunk_index);
        Some(chunk_index)
    }

    fn release(&mut self, chunk_index: u32) {
        self.unlink_partial(chunk_index);
        let chunk = &mut self.chunks[chunk_index as usize];
        chunk.entries = None;
        chunk.free_head = NIL;
        self.allocated_chunks -= 1;
        self.empty_chunks -= 1;
        // A chunk slot whose generations are used up is never handed out again.
        if chunk.generation_floor < RETIRED {
            self.released.push(chunk_index);
        }
    }

    #[inline]
    fn push_partial(&mut self, chunk_index: u32) {
        let old_head = self.partial_head;
        let chunk = &mut self.chunks[chunk_index as usize];
        chunk.prev_partial = NIL;
        chunk.next_partial = old_head;
        if old_head != NIL {
            self.chunks[old_head as usize].prev_partial = chunk_index;
        }
        self.partial_head = chunk_index;
    }

    #[inline]
    fn unlink_partial(&mut self, chunk_index: u32) {
        let (prev, next) = {
            let chunk = &mut self.chunks[chunk_index as usize];
            let links = (chunk.prev_partial, chunk.next_partial);
            chunk.prev_partial = NIL;
            chunk.next_partial = NIL;
            links
        };
        if prev == NIL {
            if self.partial_head == chunk_index {
                self.partial_head = next;
            }
        } else {
            self.chunks[prev as usize].next_partial = next;
        }
        if next != NIL {
            self.chunks[next as usize].prev_partial = prev;
        }
    }

    #[cfg(test)]
    fn force_generation(&mut self, key: SlabKey, generation: u32) {
        if let Some(entry) = self.entry_mut(key.index) {
            entry.generation = generation;
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove_round_trip() {
        let mut slab = Slab::with_capacity(0);
        let a = slab.insert("a").unwrap();
        let b = slab.insert("b").unwrap();
        assert_eq!(slab.get(a), Some(&"a"));
        assert_eq!(slab.get(b), Some(&"b"));
        assert_eq!(slab.len(), 2);
        assert_eq!(slab.remove(a), Some("a"));
        assert_eq!(slab.get(a), None);
        assert_eq!(slab.remove(a), None, "double remove is refused");
        assert_eq!(slab.len(), 1);
    }

    #[test]
    fn stale_key_never_reaches_the_reused_entry() {
        let mut slab = Slab::with_capacity(0);
        let old = slab.insert(1).unwrap();
        slab.remove(old);
        let new = slab.insert(2).unwrap();
        assert_eq!(new.index, old.index, "LIFO free list reuses the entry");
        assert_ne!(new.generation, old.generation);
        assert_eq!(slab.get(old), None);
        assert_eq!(slab.get_mut(old), None);
        assert_eq!(slab.remove(old), None);
        assert_eq!(slab.get(new), Some(&2));
    }

    #[test]
    fn keys_from_a_freed_chunk_stay_stale_after_it_is_reused() {
        let mut slab = Slab::with_capacity(0);
        let first: Vec<_> = (0..CHUNK_LEN * 3)
            .map(|i| slab.insert(i).unwrap())
            .collect();
        for &key in &first {
            slab.remove(key);
        }
        assert_eq!(slab.allocated_chunks, 1, "all but one spare chunk freed");
        let second: Vec<_> = (0..CHUNK_LEN * 3)
            .map(|i| slab.insert(i).unwrap())
            .collect();
        for &old in &first {
            assert_eq!(slab.get(old), None);
        }
        for (i, &key) in second.iter().enumerate() {
            assert_eq!(slab.get(key), Some(&i));
        }
    }

    #[test]
    fn empty_chunks_are_freed_beyond_the_spare() {
        let mut slab = Slab::with_capacity(0);
        let keys: Vec<_> = (0..CHUNK_LEN * 8)
            .map(|i| slab.insert(i).unwrap())
            .collect();
        let full = slab.allocated_bytes();
        assert_eq!(slab.allocated_chunks, 8);
        for &key in &keys {
            slab.remove(key);
        }
        assert_eq!(slab.allocated_chunks, 1);
        assert!(slab.allocated_bytes() * 4 < full);
        slab.shrink_to_fit();
        assert_eq!(slab.allocated_chunks, 0);
        let again = slab.insert(7).unwrap();
        assert_eq!(slab.get(again), Some(&7));
    }

    #[test]
    fn capacity_hint_is_kept_as_spares() {
        let mut slab = Slab::with_capacity(3 * CHUNK_LEN);
        assert_eq!(slab.allocated_chunks, 3);
        let keys: Vec<_> = (0..CHUNK_LEN * 5)
            .map(|i| slab.insert(i).unwrap())
            .collect();
        for &key in &keys {
            slab.remove(key);
        }
        assert_eq!(slab.allocated_chunks, 3);
    }

    #[test]
    fn boundary_oscillation_keeps_the_spare_chunk() {
        let mut slab = Slab::with_capacity(0);
        let keys: Vec<_> = (0..CHUNK_LEN).map(|i| slab.insert(i).unwrap()).collect();
        for _ in 0..100 {
            let extra = slab.insert(0).unwrap();
            assert_eq!(slab.allocated_chunks, 2);
            slab.remove(extra);
            assert_eq!(slab.allocated_chunks, 2, "the spare survives");
        }
        drop(keys);
    }

    #[test]
    fn an_entry_whose_generation_is_used_up_is_retired() {
        let mut slab = Slab::with_capacity(0);
        let key = slab.insert(1).unwrap();
        slab.force_generation(key, RETIRED - 1);
        let key = SlabKey {
            index: key.index,
            generation: RETIRED - 1,
        };
        assert_eq!(slab.remove(key), Some(1));
        assert_eq!(
            slab.allocated_chunks, 0,
            "a retired entry does not pin its chunk"
        );
        let next = slab.insert(2).unwrap();
        assert_ne!(next.index, key.index, "the retired entry is not reused");
        assert_eq!(
            slab.get(SlabKey {
                index: key.index,
                generation: RETIRED
            }),
            None
        );
    }

    #[test]
    fn garbage_keys_are_refused() {
        let mut slab: Slab<u8> = Slab::with_capacity(0);
        let bogus = SlabKey {
            index: u32::MAX - 1,
            generation: 0,
        };
        assert_eq!(slab.get(bogus), None);
        assert_eq!(slab.remove(bogus), None);
    }

    #[test]
    fn values_still_stored_are_dropped_with_the_slab() {
        use std::rc::Rc;
        let witness = Rc::new(());
        let mut slab = Slab::with_capacity(0);
        for _ in 0..(CHUNK_LEN + 5) {
            slab.insert(Rc::clone(&witness)).unwrap();
        }
        drop(slab);
        assert_eq!(Rc::strong_count(&witness), 1);
    }
}
