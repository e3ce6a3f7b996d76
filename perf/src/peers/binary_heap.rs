//! The naive baseline: `std::collections::BinaryHeap` with lazy cancellation.
//!
//! Cancelling or resetting a timer leaves its heap entry in place as a tombstone (the slot's generation moves on, so
//! the entry no longer matches). Tombstones are dropped when they reach the top, and the heap is rebuilt without them
//! once they outnumber live timers: without that rebuild a heap that is never popped, as in arm-cancel, would grow
//! without bound, which no real user would ship. The rebuild keeps the vector's capacity, so the memory is never
//! returned.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::mem::size_of;
use std::time::Instant;

use super::{PolledQueue, TimerQueue};

/// Tombstones below this many are left alone: rebuilding a small heap often costs more than it saves.
const MIN_TOMBSTONES_TO_REBUILD: usize = 1024;

/// The heap, the slot table its entries point into, the free slots, and the live count.
pub struct TombstoneHeap<T> {
    heap: BinaryHeap<Reverse<Entry>>,
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    live: usize,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    deadline: Instant,
    slot: u32,
    generation: u32,
}

struct Slot<T> {
    /// Moves on whenever the slot's timer is cancelled, reset or fired, which turns every heap entry minted before
    /// into a tombstone.
    generation: u32,
    value: Option<T>,
}

/// Names one timer: its slot and the generation its live heap entry carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapKey {
    slot: u32,
    generation: u32,
}

impl<T> Default for TombstoneHeap<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> TombstoneHeap<T> {
    /// An empty heap.
    pub fn new() -> Self {
        Self {
            heap: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }

    /// Arms a timer for `deadline` holding `value`.
    pub fn insert(&mut self, deadline: Instant, value: T) -> HeapKey {
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize].value = Some(value);
                slot
            }
            None => {
                let slot = u32::try_from(self.slots.len()).expect("more than 2^32 heap timers");
                self.slots.push(Slot {
                    generation: 0,
                    value: Some(value),
                });
                slot
            }
        };
        let generation = self.slots[slot as usize].generation;
        self.heap.push(Reverse(Entry {
            deadline,
            slot,
            generation,
        }));
        self.live += 1;
        HeapKey { slot, generation }
    }

    /// Tombstones the timer's entry and returns its value, or `None` if it is not pending.
    pub fn cancel(&mut self, key: HeapKey) -> Option<T> {
        let slot = self.slots.get_mut(key.slot as usize)?;
        if slot.generation != key.generation {
            return None;
        }
        let value = slot.value.take()?;
        // Wrapping is harmless here: a slot would need 2^32 reuses while one of its old entries still sat in the heap
        // for a tombstone to come back to life.
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(key.slot);
        self.live -= 1;
        self.rebuild_if_mostly_tombstones();
        Some(value)
    }

    /// Whether `key` names a pending timer.
    pub fn contains(&self, key: HeapKey) -> bool {
        self.slots
            .get(key.slot as usize)
            .is_some_and(|slot| slot.generation == key.generation && slot.value.is_some())
    }

    /// Tombstones the timer's entry and pushes a new one; the returned key names it.
    pub fn reset(&mut self, key: HeapKey, deadline: Instant) -> Option<HeapKey> {
        let slot = self.slots.get_mut(key.slot as usize)?;
        if slot.generation != key.generation || slot.value.is_none() {
            return None;
        }
        slot.generation = slot.generation.wrapping_add(1);
        let generation = slot.generation;
        self.heap.push(Reverse(Entry {
            deadline,
            slot: key.slot,
            generation,
        }));
        self.rebuild_if_mostly_tombstones();
        Some(HeapKey {
            slot: key.slot,
            generation,
        })
    }

    /// The earliest live deadline, dropping tombstones that have reached the top.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        self.drop_tombstones_at_top();
        self.heap.peek().map(|Reverse(entry)| entry.deadline)
    }

    /// The value of a timer due at `now`, or `None` once nothing is due.
    pub fn pop_expired(&mut self, now: Instant) -> Option<T> {
        self.drop_tombstones_at_top();
        if self.heap.peek()?.0.deadline > now {
            return None;
        }
        let Reverse(entry) = self.heap.pop()?;
        let slot = &mut self.slots[entry.slot as usize];
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(entry.slot);
        self.live -= 1;
        slot.value.take()
    }

    fn is_live(slots: &[Slot<T>], entry: &Entry) -> bool {
        slots[entry.slot as usize].generation == entry.generation
    }

    fn drop_tombstones_at_top(&mut self) {
        while let Some(Reverse(top)) = self.heap.peek() {
            if Self::is_live(&self.slots, top) {
                break;
            }
            self.heap.pop();
        }
    }

    fn rebuild_if_mostly_tombstones(&mut self) {
        let tombstones = self.heap.len() - self.live;
        if tombstones > self.live && tombstones > MIN_TOMBSTONES_TO_REBUILD {
            let slots = &self.slots;
            self.heap
                .retain(|Reverse(entry)| Self::is_live(slots, entry));
        }
    }

    /// Bytes of the heap's, slot table's and free list's buffers.
    pub fn allocated_bytes(&self) -> usize {
        self.heap.capacity() * size_of::<Reverse<Entry>>()
            + self.slots.capacity() * size_of::<Slot<T>>()
            + self.free.capacity() * size_of::<u32>()
    }
}

impl<T> PolledQueue<T> for TombstoneHeap<T> {
    fn next_deadline(&mut self) -> Option<Instant> {
        TombstoneHeap::next_deadline(self)
    }

    fn pop_expired(&mut self, now: Instant) -> Option<T> {
        TombstoneHeap::pop_expired(self, now)
    }
}

impl<T> TimerQueue<T> for TombstoneHeap<T> {
    type Key = HeapKey;

    #[inline]
    fn arm(&mut self, deadline: Instant, value: T) -> HeapKey {
        self.insert(deadline, value)
    }

    #[inline]
    fn cancel(&mut self, key: HeapKey) -> Option<T> {
        TombstoneHeap::cancel(self, key)
    }

    #[inline]
    fn reset(&mut self, key: HeapKey, deadline: Instant) -> HeapKey {
        let moved = TombstoneHeap::reset(self, key, deadline);
        debug_assert!(moved.is_some(), "the harness reset a stale key");
        moved.unwrap_or(key)
    }

    fn accounted_bytes(&self) -> Option<usize> {
        Some(self.allocated_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::TombstoneHeap;
    use std::time::{Duration, Instant};

    #[test]
    fn fires_in_deadline_order_and_skips_cancelled_and_reset_entries() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut heap = TombstoneHeap::new();
        let (a, b, _) = (
            heap.insert(t0 + ms(3), "a"),
            heap.insert(t0 + ms(1), "b"),
            heap.insert(t0 + ms(2), "c"),
        );
        assert_eq!((heap.cancel(b), heap.cancel(b)), (Some("b"), None));
        let a = heap.reset(a, t0 + ms(5)).expect("a is live");
        assert_eq!(heap.next_deadline(), Some(t0 + ms(2)));
        assert_eq!(
            (heap.pop_expired(t0 + ms(4)), heap.pop_expired(t0 + ms(4))),
            (Some("c"), None)
        );
        assert_eq!(
            (
                heap.pop_expired(t0 + ms(5)),
                heap.cancel(a),
                heap.next_deadline()
            ),
            (Some("a"), None, None)
        );
    }

    #[test]
    fn rebuild_keeps_live_timers() {
        let t0 = Instant::now();
        let mut heap = TombstoneHeap::new();
        let keys: Vec<_> = (0..10_000u64)
            .map(|i| heap.insert(t0 + Duration::from_nanos(i), i))
            .collect();
        assert!(keys[..9_000].iter().all(|&key| heap.cancel(key).is_some()));
        assert!(heap.heap.len() < 10_000, "the tombstones were rebuilt away");
        let fired: Vec<u64> =
            std::iter::from_fn(|| heap.pop_expired(t0 + Duration::from_secs(1))).collect();
        assert_eq!(fired, (9_000..10_000).collect::<Vec<_>>());
    }
}
