//! A shard's run queue: timers claimed for firing, waiting for a worker to run them, so a
//! burst is shared out at expiry time. A bounded ring of node indices with one producer at
//! a time (the wheel's holder, so handing the wheel over orders the appends) and any number
//! of consumers, each claiming a run with one compare-and-swap on the head: one shared
//! read-modify-write per run, not per timer.

use crossbeam_utils::CachePadded;

use crate::sync::atomic::{AtomicU64, Ordering};
pub(crate) use crate::tuning::MAX_RUN;
use crate::tuning::RUN_QUEUE as CAPACITY;

/// A run of claimed node indices, taken off the ring by one consumer.
pub(crate) struct Run {
    indices: [u32; MAX_RUN],
    len: usize,
}

impl Run {
    /// The node indices, in ring order.
    pub(crate) fn indices(&self) -> &[u32] {
        &self.indices[..self.len]
    }
}

/// The wheel's holder appending to the ring. It never reads the head again (consumers
/// write it: each read would miss), and publishes a run at a time, and when dropped.
pub(crate) struct Filler<'a> {
    queue: &'a RunQueue,
    tail: u64,
    /// The tail at which the ring would be full, as of the filler's start.
    end: u64,
    /// The tail consumers can see.
    published: u64,
}

impl Filler<'_> {
    /// Room left for appends.
    #[inline]
    pub(crate) fn room(&self) -> usize {
        (self.end - self.tail) as usize
    }

    /// Appends a claimed node's index: `false` (nothing appended) if there is no room.
    #[inline]
    pub(crate) fn push(&mut self, index: u32) -> bool {
        if self.tail == self.end {
            return false;
        }
        let slot = &self.queue.slots[(self.tail % CAPACITY as u64) as usize];
        // The filler's start saw the head past this slot's older lap: nobody claims it now.
        slot.store(u64::from(index), Ordering::Relaxed);
        self.tail += 1;
        if self.tail - self.published >= MAX_RUN as u64 {
            self.publish();
        }
        true
    }

    /// Publishes the slots, and their nodes' claims written before them (Release).
    fn publish(&mut self) {
        self.queue.tail.store(self.tail, Ordering::Release);
        self.published = self.tail;
    }
}

impl Drop for Filler<'_> {
    fn drop(&mut self) {
        if self.tail != self.published {
            self.publish();
        }
    }
}

pub(crate) struct RunQueue {
    /// The next entry to take. Consumers move it with a compare-and-swap.
    head: CachePadded<AtomicU64>,
    /// One past the last entry appended; stored only by the wheel's holder.
    tail: CachePadded<AtomicU64>,
    slots: Box<[AtomicU64]>,
}

impl RunQueue {
    pub(crate) fn new() -> Self {
        Self {
            head: CachePadded::new(AtomicU64::new(0)),
            tail: CachePadded::new(AtomicU64::new(0)),
            slots: (0..CAPACITY).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Entries waiting (a snapshot).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        let tail = self.tail.load(Ordering::Acquire);
        let head = self.head.load(Ordering::Acquire);
        tail.saturating_sub(head) as usize
    }

    /// Starts appending: only the wheel's holder calls this. Fills the room there is now.
    pub(crate) fn filler(&self) -> Filler<'_> {
        let tail = self.tail.load(Ordering::Relaxed);
        let head = self.head.load(Ordering::Acquire);
        Filler {
            queue: self,
            tail,
            end: head + CAPACITY as u64,
            published: tail,
        }
    }

    /// Claims up to `most` entries from the front (at least one if any wait, at most
    /// [`MAX_RUN`]). `None` if the ring is empty.
    pub(crate) fn take(&self, most: usize) -> Option<Run> {
        let most = most.clamp(1, MAX_RUN) as u64;
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let tail = self.tail.load(Ordering::Acquire);
            let len = tail.saturating_sub(head).min(most);
            if len == 0 {
                return None;
            }
            let mut run = Run {
                indices: [0; MAX_RUN],
                len: len as usize,
            };
            for (offset, entry) in run.indices[..len as usize].iter_mut().enumerate() {
                let slot = &self.slots[((head + offset as u64) % CAPACITY as u64) as usize];
                // An index of a later lap read here means the head moved: the swap fails.
                *entry = slot.load(Ordering::Relaxed) as u32;
            }
            match self
                .head
                .compare_exchange(head, head + len, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(run),
                Err(actual) => head = actual,
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn entries_come_out_once_in_order_across_laps() {
        let queue = RunQueue::new();
        let mut next_in = 0_u32;
        let mut next_out = 0_u32;
        for _ in 0..5 {
            let mut filler = queue.filler();
            while filler.room() > 0 {
                assert!(filler.push(next_in));
                next_in += 1;
            }
            assert!(!filler.push(u32::MAX), "a full ring refuses");
            drop(filler);
            while let Some(run) = queue.take(MAX_RUN / 2 + 1) {
                for &index in run.indices() {
                    assert_eq!(index, next_out);
                    next_out += 1;
                }
            }
            assert_eq!(queue.len(), 0);
        }
        assert_eq!(next_in, next_out);
    }

    #[test]
    fn concurrent_consumers_split_the_entries_without_overlap() {
        use std::sync::atomic::AtomicBool;
        let queue = RunQueue::new();
        let done = AtomicBool::new(false);
        let total = if cfg!(miri) { 200 } else { 20_000 };
        let mut all: Vec<u32> = std::thread::scope(|scope| {
            let consumers: Vec<_> = (0..3)
                .map(|_| {
                    scope.spawn(|| {
                        let mut mine = Vec::new();
                        loop {
                            // Read before taking, so an empty take after it means done.
                            let finished = done.load(Ordering::Acquire);
                            match queue.take(MAX_RUN) {
                                Some(run) => mine.extend_from_slice(run.indices()),
                                None if finished => return mine,
                                None => std::thread::yield_now(),
                            }
                        }
                    })
                })
                .collect();
            let mut next = 0;
            while next < total {
                let mut filler = queue.filler();
                while next < total && filler.push(next) {
                    next += 1;
                }
                drop(filler);
                std::thread::yield_now();
            }
            done.store(true, Ordering::Release);
            consumers
                .into_iter()
                .flat_map(|c| c.join().unwrap())
                .collect()
        });
        all.sort_unstable();
        assert_eq!(all, (0..total).collect::<Vec<_>>());
        assert_eq!(queue.len(), 0);
    }
}
