//! The naive baseline: `std::collections::BinaryHeap` with lazy cancellation. Cancelling or resetting a timer leaves
//! its entry in place as a tombstone (the slot's generation moves on, so the entry no longer matches). Tombstones are
//! dropped when they reach the top, and the heap is rebuilt without them once they outnumber live timers: without
//! that a heap that is never popped, as in arm-cancel, would grow without bound. The rebuild keeps the capacity.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::mem::size_of;
use std::time::Instant;

use super::{PolledQueue, TimerQueue};

/// Tombstones below this many are left alone: rebuilding a small heap often costs more than it saves.
const MIN_TOMBSTONES_TO_REBUILD: usize = 1024;

/// An entry: its deadline, its slot and the slot's generation when it was pushed.
type Entry = Reverse<(Instant, u32, u32)>;

/// The heap, the slot table its entries point into (each slot's generation and value), the free slots, and the live
/// count. A slot's generation moves on whenever its timer is cancelled, reset or fired.
pub struct TombstoneHeap<T> {
    heap: BinaryHeap<Entry>,
    slots: Vec<(u32, Option<T>)>,
    free: Vec<u32>,
    live: usize,
}

/// Names one timer: its slot and the generation its live entry carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapKey(u32, u32);

impl<T> Default for TombstoneHeap<T> {
    fn default() -> Self {
        let (heap, slots, free) = (BinaryHeap::new(), Vec::new(), Vec::new());
        Self {
            heap,
            slots,
            free,
            live: 0,
        }
    }
}

impl<T> TombstoneHeap<T> {
    /// The slot `key` names, if its timer is pending.
    fn pending(&mut self, key: HeapKey) -> Option<&mut (u32, Option<T>)> {
        let slot = self.slots.get_mut(key.0 as usize)?;
        (slot.0 == key.1 && slot.1.is_some()).then_some(slot)
    }

    pub fn contains(&self, key: HeapKey) -> bool {
        let slot = self.slots.get(key.0 as usize);
        slot.is_some_and(|slot| slot.0 == key.1 && slot.1.is_some())
    }

    /// Tombstones the timer's entry and pushes a new one; the returned key names it.
    pub fn reset(&mut self, key: HeapKey, deadline: Instant) -> Option<HeapKey> {
        let slot = self.pending(key)?;
        slot.0 = slot.0.wrapping_add(1);
        let generation = slot.0;
        self.heap.push(Reverse((deadline, key.0, generation)));
        self.rebuild_if_mostly_tombstones();
        Some(HeapKey(key.0, generation))
    }

    fn rebuild_if_mostly_tombstones(&mut self) {
        let tombstones = self.heap.len() - self.live;
        if tombstones > self.live && tombstones > MIN_TOMBSTONES_TO_REBUILD {
            let slots = &self.slots;
            self.heap
                .retain(|Reverse((_, slot, generation))| slots[*slot as usize].0 == *generation);
        }
    }
}

impl<T> PolledQueue<T> for TombstoneHeap<T> {
    /// The earliest live deadline, dropping tombstones that have reached the top.
    fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(&Reverse((deadline, slot, generation))) = self.heap.peek() {
            if self.slots[slot as usize].0 == generation {
                return Some(deadline);
            }
            self.heap.pop();
        }
        None
    }

    /// The value of a timer due at `now`, or `None` once nothing is due.
    fn pop_expired(&mut self, now: Instant) -> Option<T> {
        if self.next_deadline()? > now {
            return None;
        }
        let Reverse((_, slot, _)) = self.heap.pop()?;
        let entry = &mut self.slots[slot as usize];
        entry.0 = entry.0.wrapping_add(1);
        self.free.push(slot);
        self.live -= 1;
        entry.1.take()
    }
}

impl<T> TimerQueue<T> for TombstoneHeap<T> {
    type Key = HeapKey;

    #[inline]
    fn arm(&mut self, deadline: Instant, value: T) -> HeapKey {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push((0, None));
                u32::try_from(self.slots.len() - 1).expect("more than 2^32 heap timers")
            }
        };
        let entry = &mut self.slots[slot as usize];
        entry.1 = Some(value);
        self.heap.push(Reverse((deadline, slot, entry.0)));
        self.live += 1;
        HeapKey(slot, entry.0)
    }

    /// Tombstones the timer's entry and returns its value, or `None` if it is not pending.
    #[inline]
    fn cancel(&mut self, key: HeapKey) -> Option<T> {
        let slot = self.pending(key)?;
        // Wrapping is harmless: a slot would need 2^32 reuses while one of its old entries still sat in the heap.
        slot.0 = slot.0.wrapping_add(1);
        let value = slot.1.take();
        self.free.push(key.0);
        self.live -= 1;
        self.rebuild_if_mostly_tombstones();
        value
    }

    #[inline]
    fn reset(&mut self, key: HeapKey, deadline: Instant) -> HeapKey {
        let moved = TombstoneHeap::reset(self, key, deadline);
        debug_assert!(moved.is_some(), "the harness reset a stale key");
        moved.unwrap_or(key)
    }

    /// Bytes of the heap's, slot table's and free list's buffers.
    fn accounted_bytes(&self) -> Option<usize> {
        let heap = self.heap.capacity() * size_of::<Entry>();
        let slots = self.slots.capacity() * size_of::<(u32, Option<T>)>();
        Some(heap + slots + self.free.capacity() * size_of::<u32>())
    }
}

#[cfg(test)]
mod tests {
    use super::TombstoneHeap;
    use crate::peers::{PolledQueue, TimerQueue};
    use std::time::{Duration, Instant};

    #[test]
    fn fires_in_deadline_order_and_skips_cancelled_and_reset_entries() {
        let (t0, ms, mut heap) = (
            Instant::now(),
            Duration::from_millis,
            TombstoneHeap::default(),
        );
        let (a, b) = (heap.arm(t0 + ms(3), "a"), heap.arm(t0 + ms(1), "b"));
        heap.arm(t0 + ms(2), "c");
        assert_eq!((heap.cancel(b), heap.cancel(b)), (Some("b"), None));
        let a = heap.reset(a, t0 + ms(5)).expect("a is live");
        assert_eq!(heap.next_deadline(), Some(t0 + ms(2)));
        let popped = (heap.pop_expired(t0 + ms(4)), heap.pop_expired(t0 + ms(4)));
        assert_eq!(popped, (Some("c"), None));
        let last = (
            heap.pop_expired(t0 + ms(5)),
            heap.cancel(a),
            heap.next_deadline(),
        );
        assert_eq!(last, (Some("a"), None, None));
    }

    #[test]
    fn rebuild_keeps_live_timers() {
        let (t0, mut heap) = (Instant::now(), TombstoneHeap::default());
        let keys: Vec<_> = (0..10_000u64)
            .map(|i| heap.arm(t0 + Duration::from_nanos(i), i))
            .collect();
        assert!(keys[..9_000].iter().all(|&key| heap.cancel(key).is_some()));
        assert!(heap.heap.len() < 10_000, "the tombstones were rebuilt away");
        let fired: Vec<u64> =
            std::iter::from_fn(|| heap.pop_expired(t0 + Duration::from_secs(1))).collect();
        assert_eq!(fired, (9_000..10_000).collect::<Vec<_>>());
    }
}
