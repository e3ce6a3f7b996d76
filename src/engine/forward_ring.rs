//! A lane's forward ring: the node indices a producer forwards to its shard's owner, in an array
//! rather than a chain, so the owner's cache misses overlap. One producer (the lane's thread)
//! publishes whole batches with their need; one consumer at a time (the wheel's holder) takes them.
//! A batch that does not fit goes on the inbox, so a producer never waits.

use crossbeam_utils::CachePadded;

use crate::sync::UnsafeCell;
use crate::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use crate::tuning::RING_WAKE_AT as WAKE_AT;
pub(crate) use crate::tuning::{CHUNK, RING};

pub(crate) struct ForwardRing {
    /// Entries published; written by the producer.
    tail: CachePadded<AtomicU64>,
    /// Entries taken; written by the consumer.
    head: CachePadded<AtomicU64>,
    /// The earliest need of the entries not yet taken; producer only.
    need: AtomicU64,
    /// The slots, until the engine's last turn releases them.
    slots: UnsafeCell<Option<Box<[AtomicU32]>>>,
}

// SAFETY: `slots` is written only by `release`, once nothing publishes or takes entries any more;
// the rest is atomic.
unsafe impl Sync for ForwardRing {}

impl ForwardRing {
    pub(crate) fn new() -> Self {
        Self {
            tail: CachePadded::new(AtomicU64::new(0)),
            head: CachePadded::new(AtomicU64::new(0)),
            need: AtomicU64::new(u64::MAX),
            slots: UnsafeCell::new(Some((0..RING).map(|_| AtomicU32::new(0)).collect())),
        }
    }

    /// Publishes `indices`, needed by tick `need`, or nothing (`None`) if they do not all fit.
    /// Returns the ring's need: at most the next tick from [`WAKE_AT`] entries, `now` from twice
    /// that, so the consumer empties it before it fills.
    ///
    /// # Safety
    /// Only the lane's producer thread may call this.
    pub(crate) unsafe fn publish(&self, indices: &[u32], need: u64, now: u64) -> Option<u64> {
        // Acquire: pairs with `take`'s Release: slots behind `head` are free.
        let head = self.head.load(Ordering::Acquire);
        let tail = self.tail.load(Ordering::Relaxed);
        let count = indices.len() as u64;
        let used = tail - head;
        if count == 0 || RING as u64 - used < count {
            return None;
        }
        // SAFETY: forwarded from the caller.
        let slots = unsafe { self.producer_slots() }?;
        for (offset, &index) in (tail..).zip(indices) {
            slots[(offset % RING as u64) as usize].store(index, Ordering::Relaxed);
        }
        let mut need = if used == 0 {
            need
        } else {
            self.need.load(Ordering::Relaxed).min(need)
        };
        let filled = used + count;
        if filled >= 2 * WAKE_AT {
            need = need.min(now);
        } else if filled >= WAKE_AT {
            need = need.min(now.saturating_add(1));
        }
        // SeqCst, need before tail: a consumer that sees the entries sees a need covering them;
        // with the caller's `wake_for`, the wake handshake.
        self.need.store(need, Ordering::SeqCst);
        self.tail.store(tail + count, Ordering::SeqCst);
        Some(need)
    }

    /// The slots, unless the ring has been released.
    ///
    /// # Safety
    /// Only the lane's producer thread may call this.
    unsafe fn producer_slots(&self) -> Option<&[AtomicU32]> {
        let slots = self.slots.with(|cell| {
            // SAFETY: only `release` writes the cell, after the last publish.
            unsafe { &*cell }.as_deref().map(std::ptr::from_ref)
        })?;
        // SAFETY: the allocation lives until `release`, which no publish outlives.
        Some(unsafe { &*slots })
    }

    /// Frees the slots for good: a thread that outlives its engine keeps only the lane.
    ///
    /// # Safety
    /// The caller is the consumer, the ring is empty, and no publish can follow.
    pub(crate) unsafe fn release(&self) {
        self.slots.with_mut(|cell| {
            // SAFETY: no producer touches the cell any more, and the consumer reads it only for
            // entries.
            unsafe { *cell = None };
        });
    }

    /// The tick by which the consumer must take the ring, or `None` when it is empty.
    pub(crate) fn need(&self) -> Option<u64> {
        let tail = self.tail.load(Ordering::SeqCst);
        if self.head.load(Ordering::Acquire) == tail {
            return None;
        }
        Some(self.need.load(Ordering::SeqCst))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.tail.load(Ordering::Acquire) == self.head.load(Ordering::Acquire)
    }

    /// Takes up to [`CHUNK`] published indices, oldest first, into `out`; returns how many.
    ///
    /// # Safety
    /// Only one consumer at a time: the wheel's holder (ground rule 1).
    pub(crate) unsafe fn take(&self, out: &mut [u32; CHUNK]) -> usize {
        // Acquire: pairs with the producer's `tail` store.
        let tail = self.tail.load(Ordering::Acquire);
        let head = self.head.load(Ordering::Relaxed);
        let taken = ((tail - head) as usize).min(CHUNK);
        if taken == 0 {
            return 0;
        }
        self.slots.with(|slots| {
            // SAFETY: `release` runs only once the ring is empty for good.
            if let Some(slots) = unsafe { &*slots } {
                for (offset, slot) in (head..).zip(&mut out[..taken]) {
                    *slot = slots[(offset % RING as u64) as usize].load(Ordering::Relaxed);
                }
            }
        });
        // Release: the slots are read, free for the producer.
        self.head.store(head + taken as u64, Ordering::Release);
        taken
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{CHUNK, ForwardRing, RING, WAKE_AT};

    /// Everything published, taken a chunk at a time.
    fn taken(ring: &ForwardRing) -> Vec<u32> {
        let mut all = Vec::new();
        let mut out = [0; CHUNK];
        loop {
            // SAFETY: this test is the only consumer.
            let n = unsafe { ring.take(&mut out) };
            if n == 0 {
                return all;
            }
            assert!(n <= CHUNK);
            all.extend_from_slice(&out[..n]);
        }
    }

    /// Publishes `indices` in chunks, as a reclaim does; the needs the ring reports.
    fn publish_all(ring: &ForwardRing, indices: &[u32], need: u64, now: u64) -> Vec<u64> {
        indices
            .chunks(CHUNK)
            // SAFETY: this test is the only producer.
            .map(|chunk| unsafe { ring.publish(chunk, need, now) }.expect("room"))
            .collect()
    }

    #[test]
    fn batches_come_out_in_order_with_the_earliest_need_and_wrap_around() {
        let ring = ForwardRing::new();
        assert_eq!(ring.need(), None);
        assert!(ring.is_empty());
        let below_wake = WAKE_AT as u32 - 1;
        // Enough laps (of a quarter ring each) to wrap the ring around.
        for lap in 0..if cfg!(miri) { 5 } else { 7_u32 } {
            let first: Vec<u32> = (0..below_wake / 2).map(|i| lap * 10_000 + i).collect();
            let second: Vec<u32> = (first.len() as u32..below_wake)
                .map(|i| lap * 20_000 + i)
                .collect();
            let needs = publish_all(&ring, &first, 40, 0);
            assert!(needs.iter().all(|&need| need == 40), "{needs:?}");
            assert_eq!(ring.need(), Some(40));
            let needs = publish_all(&ring, &second, 70, 0);
            assert!(
                needs.iter().all(|&need| need == 40),
                "the earlier need stays"
            );
            // SAFETY: this test is the only producer.
            let need = unsafe { ring.publish(&[7], 90, 5) };
            assert_eq!(need, Some(6), "a quarter full: needed by the next tick");
            let mut expected = first.clone();
            expected.extend(&second);
            expected.push(7);
            assert_eq!(taken(&ring), expected);
            assert_eq!(ring.need(), None);
            assert!(ring.is_empty());
        }
    }

    #[test]
    fn a_quarter_full_ring_is_needed_by_the_next_tick_and_a_half_full_one_now() {
        let ring = ForwardRing::new();
        let quarter: Vec<u32> = (0..WAKE_AT as u32).collect();
        assert_eq!(publish_all(&ring, &quarter, 50, 10).last(), Some(&11));
        let more: Vec<u32> = (0..WAKE_AT as u32 - 1).collect();
        assert_eq!(publish_all(&ring, &more, 50, 10).last(), Some(&11));
        // SAFETY: this test is the only producer.
        unsafe { assert_eq!(ring.publish(&[1], 50, 10), Some(10), "half full: now") };
        taken(&ring);
        // SAFETY: this test is the only producer.
        unsafe { assert_eq!(ring.publish(&[1], 50, 10), Some(50), "empty again") };
    }

    #[test]
    fn a_batch_that_does_not_fit_is_refused_whole() {
        let ring = ForwardRing::new();
        let most: Vec<u32> = (0..RING as u32 - 2).collect();
        publish_all(&ring, &most, 50, 3);
        // SAFETY: this test is the only producer.
        unsafe {
            assert_eq!(ring.publish(&[1, 2, 3], 50, 3), None, "one short of room");
            assert_eq!(
                ring.publish(&[1, 2], 50, 4),
                Some(3),
                "exactly the room left"
            );
            assert_eq!(ring.publish(&[9], 1, 4), None, "full");
            assert_eq!(ring.publish(&[], 1, 4), None, "nothing to publish");
        }
        let all = taken(&ring);
        assert_eq!(all.len(), RING);
        assert_eq!(&all[RING - 2..], &[1, 2]);
        // SAFETY: this test is the only producer.
        unsafe { assert_eq!(ring.publish(&[4], 50, 9), Some(50), "a fresh need") };
        assert_eq!(ring.need(), Some(50));
    }
}
