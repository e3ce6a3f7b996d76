//! A shard's pool of timer nodes: fixed-address chunks that are never freed while the
//! engine lives, and a lock-free stack of free batches shared by every thread.
//!
//! Nodes move in batches so that the shared stack sees one compare-and-swap per batch, not
//! per timer: the worker gives back the nodes it frees a batch at a time, and each thread
//! takes a batch into its own magazine and arms timers from there without touching shared
//! memory. Because chunks stay put until the engine is dropped, any thread may look up a
//! node by index at any time, stale handles included; the generation in the node's state
//! word, not the memory's lifetime, is what makes a stale handle harmless.

use std::ptr::NonNull;

use crate::list::Links;
use crate::node::Location;
use crate::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use crate::timer_node::TimerNode;

/// Nodes per chunk: one allocation per this many timers of peak demand.
#[cfg(not(loom))]
pub(crate) const CHUNK_NODES: usize = 1024;
#[cfg(loom)]
pub(crate) const CHUNK_NODES: usize = 4;
const CHUNK_SHIFT: u32 = CHUNK_NODES.trailing_zeros();

/// Chunks one pool can have: with 1024-node chunks, about 16.7 million timers per shard.
#[cfg(not(loom))]
pub(crate) const MAX_CHUNKS: usize = 16 * 1024;
#[cfg(loom)]
pub(crate) const MAX_CHUNKS: usize = 2;

/// Nodes per batch on the shared free stack.
pub(crate) const BATCH: u32 = 64;

/// A shard's nodes as its wheel sees them: the owner's view, for filing nodes by index.
pub(crate) struct FiledNodes<'a>(pub(crate) &'a Pool);

impl FiledNodes<'_> {
    #[inline]
    fn node(&self, index: u32) -> &TimerNode {
        // Every index the wheel holds is one the owner filed from this pool, whose chunks
        // never go away; a miss would be a bug in the wheel, not something a user causes.
        match self.0.node(index) {
            Some(node) => node,
            None => unreachable!("a wheel index outside its pool"),
        }
    }
}

impl Links for FiledNodes<'_> {
    #[inline]
    fn deadline(&self, index: u32) -> u64 {
        self.node(index).deadline()
    }

    #[inline]
    fn links(&self, index: u32) -> (Location, u32, u32) {
        // SAFETY: the wheel is the owner's, and only the owner touches a filed node's held
        // parts (see `TimerNode::with_held`).
        unsafe { self.node(index).with_held(|held| held.links()) }
    }

    #[inline]
    fn set_prev(&mut self, index: u32, prev: u32) {
        // SAFETY: as in `links`.
        unsafe { self.node(index).with_held(|held| held.set_prev(prev)) }
    }

    #[inline]
    fn set_next(&mut self, index: u32, next: u32) {
        // SAFETY: as in `links`.
        unsafe { self.node(index).with_held(|held| held.set_next(next)) }
    }

    #[inline]
    fn set_links(&mut self, index: u32, location: Location, prev: u32, next: u32) {
        // SAFETY: as in `links`.
        unsafe {
            self.node(index)
                .with_held(|held| held.set_links(location, prev, next))
        }
    }
}

/// The shard's pool.
pub(crate) struct Pool {
    /// Chunk `c` holds nodes `c * CHUNK_NODES ..`; null until allocated.
    directory: Box<[AtomicPtr<TimerNode>]>,
    /// Chunks claimed so far (some may still be being allocated).
    claimed: AtomicU64,
    /// The free stack's head: `tag (32) | first node's index + 1 (32)`, 0 when empty. The
    /// tag changes on every push and pop, so a pop that read a head which was then popped
    /// and pushed again fails its swap instead of corrupting the stack (the ABA problem).
    free: AtomicU64,
}

/// A chain of free nodes held by one thread: a producer's magazine, or the worker's batch of
/// freshly freed nodes on its way back to the stack.
pub(crate) struct Magazine {
    first: Option<NonNull<TimerNode>>,
    len: u32,
}

// SAFETY: a magazine's nodes belong to its holder alone; moving the holder between threads
// (a thread-local destructor, a worker handing back at shutdown) moves the ownership too.
unsafe impl Send for Magazine {}

impl Magazine {
    pub(crate) const EMPTY: Self = Self {
        first: None,
        len: 0,
    };

    /// Takes one node, if any.
    #[inline]
    pub(crate) fn take(&mut self) -> Option<NonNull<TimerNode>> {
        let node = self.first?;
        // SAFETY: nodes on a magazine are live (pools never free chunks while in use) and
        // held by this magazine alone.
        self.first = unsafe { node.as_ref() }.next_in_chain();
        self.len = self.len.saturating_sub(1);
        Some(node)
    }

    /// Adds a free node the caller holds exclusively.
    #[inline]
    pub(crate) fn put(&mut self, node: NonNull<TimerNode>) {
        // SAFETY: the caller holds `node`, which is live.
        unsafe { node.as_ref() }.set_next_in_chain(self.first);
        self.first = Some(node);
        self.len += 1;
    }

    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    /// Hands every node to `pool` as one batch.
    pub(crate) fn give_back(&mut self, pool: &Pool) {
        if let Some(first) = self.first.take() {
            pool.push_batch(first);
        }
        self.len = 0;
    }

    /// Refills an empty magazine with a batch from the pool, or a new chunk. `false` when
    /// the pool is at its size limit and has nothing free.
    pub(crate) fn refill(&mut self, pool: &Pool) -> bool {
        debug_assert!(self.first.is_none());
        match pool.pop_batch().or_else(|| pool.grow()) {
            Some(first) => {
                self.first = Some(first);
                self.len = BATCH;
                true
            }
            None => false,
        }
    }
}

impl Pool {
    pub(crate) fn new() -> Self {
        Self {
            directory: (0..MAX_CHUNKS)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            claimed: AtomicU64::new(0),
            free: AtomicU64::new(0),
        }
    }

    /// The node at `index`, if its chunk exists. Any thread, any time.
    #[inline]
    pub(crate) fn node(&self, index: u32) -> Option<&TimerNode> {
        let chunk = self.directory.get((index >> CHUNK_SHIFT) as usize)?;
        let first = chunk.load(Ordering::Acquire);
        if first.is_null() {
            return None;
        }
        // SAFETY: a published chunk holds CHUNK_NODES live nodes until the pool is dropped,
        // and the offset is below CHUNK_NODES.
        Some(unsafe { &*first.add(index as usize & (CHUNK_NODES - 1)) })
    }

    /// Pushes a chain of free nodes (linked through their chain links) as one batch.
    pub(crate) fn push_batch(&self, first: NonNull<TimerNode>) {
        // SAFETY: the caller gives up the chain; `first` is live.
        let first_node = unsafe { first.as_ref() };
        let mut head = self.free.load(Ordering::Acquire);
        loop {
            // The batch below this one is remembered in the first node's deadline field,
            // which a free node does not otherwise use.
            first_node
                .deadline
                .store(head & 0xFFFF_FFFF, Ordering::Relaxed);
            let tag = (head >> 32).wrapping_add(1) & 0xFFFF_FFFF;
            let next = (tag << 32) | (u64::from(first_node.index) + 1);
            match self
                .free
                .compare_exchange_weak(head, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => head = actual,
            }
        }
    }

    /// Pops one batch: the first node of a chain.
    pub(crate) fn pop_batch(&self) -> Option<NonNull<TimerNode>> {
        let mut head = self.free.load(Ordering::Acquire);
        loop {
            let index = (head & 0xFFFF_FFFF).checked_sub(1)?;
            let first = self.node(index as u32)?;
            // May be garbage if another thread popped this batch meanwhile, but then the tag
            // has moved on and the swap below fails.
            let below = first.deadline.load(Ordering::Relaxed) & 0xFFFF_FFFF;
            let tag = (head >> 32).wrapping_add(1) & 0xFFFF_FFFF;
            match self.free.compare_exchange_weak(
                head,
                (tag << 32) | below,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(NonNull::from(first)),
                Err(actual) => head = actual,
            }
        }
    }

    /// Allocates a chunk, keeps its first batch for the caller and pushes the rest. `None`
    /// when the pool already has [`MAX_CHUNKS`] chunks.
    fn grow(&self) -> Option<NonNull<TimerNode>> {
        let chunk = self.claimed.fetch_add(1, Ordering::AcqRel) as usize;
        if chunk >= MAX_CHUNKS {
            self.claimed.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let base = (chunk * CHUNK_NODES) as u32;
        let nodes: Box<[TimerNode]> = (0..CHUNK_NODES as u32)
            .map(|offset| TimerNode::new(base + offset))
            .collect();
        let first = Box::into_raw(nodes).cast::<TimerNode>();
        self.directory[chunk].store(first, Ordering::Release);
        // Chain the chunk into batches; no handle names these nodes yet.
        let mut kept = None;
        for start in (0..CHUNK_NODES).step_by(BATCH as usize) {
            let end = (start + BATCH as usize).min(CHUNK_NODES);
            for offset in start..end {
                // SAFETY: `offset` is inside the chunk just allocated, which no other thread
                // can see yet.
                let node = unsafe { &*first.add(offset) };
                let next = (offset + 1 < end)
                    // SAFETY: as above, `offset + 1` is inside the chunk.
                    .then(|| unsafe { NonNull::new_unchecked(first.add(offset + 1)) });
                node.set_next_in_chain(next);
            }
            // SAFETY: `start` is inside the chunk.
            let batch = unsafe { NonNull::new_unchecked(first.add(start)) };
            if kept.is_none() {
                kept = Some(batch);
            } else {
                self.push_batch(batch);
            }
        }
        kept
    }

    /// Chunks allocated so far.
    pub(crate) fn chunks(&self) -> usize {
        self.directory
            .iter()
            .take_while(|chunk| !chunk.load(Ordering::Acquire).is_null())
            .count()
    }

    /// Nodes that hold a timer (not free), counted by walking every node: a diagnostic for
    /// tests and shutdown reports, not for the hot path.
    pub(crate) fn nodes_in_use(&self) -> usize {
        let mut in_use = 0;
        for chunk in 0..self.chunks() {
            for offset in 0..CHUNK_NODES {
                let index = (chunk * CHUNK_NODES + offset) as u32;
                if let Some(node) = self.node(index)
                    && node.state.observe().phase() != crate::timer_state::Phase::Free
                {
                    in_use += 1;
                }
            }
        }
        in_use
    }

    /// Bytes of node memory allocated.
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.chunks() * CHUNK_NODES * size_of::<TimerNode>()
            + self.directory.len() * size_of::<AtomicPtr<TimerNode>>()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for chunk in self.directory.iter() {
            let first = chunk.load(Ordering::Acquire);
            if !first.is_null() {
                let slice = std::ptr::slice_from_raw_parts_mut(first, CHUNK_NODES);
                // SAFETY: `first` came from `Box::into_raw` of a CHUNK_NODES-long boxed slice
                // in `grow`, and with `&mut self` no thread can still reach its nodes.
                // Dropping it drops any callback a node still holds.
                drop(unsafe { Box::from_raw(slice) });
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn batches_come_back_in_any_order_and_nodes_are_distinct() {
        let pool = Pool::new();
        let mut magazine = Magazine::EMPTY;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..3 * CHUNK_NODES {
            if magazine.len() == 0 && magazine.first.is_none() {
                assert!(magazine.refill(&pool));
            }
            let node = magazine.take().unwrap_or_else(|| {
                assert!(magazine.refill(&pool));
                magazine.take().expect("a refilled magazine has a node")
            });
            // SAFETY: taken from the pool, live.
            assert!(seen.insert(unsafe { node.as_ref() }.index));
        }
        assert_eq!(pool.chunks(), 3);
        assert_eq!(pool.nodes_in_use(), 0, "free nodes are not in use");
    }

    #[test]
    fn given_back_batches_are_reused_before_growing() {
        let pool = Pool::new();
        let mut magazine = Magazine::EMPTY;
        assert!(magazine.refill(&pool));
        let mut held = Magazine::EMPTY;
        while let Some(node) = magazine.take() {
            held.put(node);
        }
        held.give_back(&pool);
        for _ in 0..CHUNK_NODES / BATCH as usize {
            assert!(magazine.refill(&pool));
            while magazine.take().is_some() {}
        }
        assert_eq!(pool.chunks(), 1, "every batch of the first chunk came back");
    }

    #[test]
    fn lookups_outside_the_pool_are_none() {
        let pool = Pool::new();
        assert!(pool.node(0).is_none());
        assert!(pool.node(u32::MAX).is_none());
        let mut magazine = Magazine::EMPTY;
        assert!(magazine.refill(&pool));
        assert!(pool.node(0).is_some());
        assert!(pool.node(CHUNK_NODES as u32).is_none());
    }
}
