//! A shard's pool of timer nodes: one region of address space reserved up front, carved
//! into nodes a chunk at a time as demand grows, and a lock-free stack of free batches
//! shared by every thread.
//!
//! Nodes move in batches so that the shared stack sees one compare-and-swap per batch, not
//! per timer: the worker gives back the nodes it frees a batch at a time, and each thread
//! takes a batch into its own magazine and arms timers from there without touching shared
//! memory. Nodes never move and are not freed while the engine lives, so any thread may
//! look up a node by index at any time, stale handles included; the generation in the
//! node's state word, not the memory's lifetime, is what makes a stale handle harmless.
//!
//! The region is one allocation of `capacity` nodes. The allocator maps so large a block
//! straight from the operating system, which backs a page with memory only when it is first
//! written; a chunk is written when it is carved, so resident memory follows the peak number
//! of timers, not the capacity. A node's index is its offset in the region, so a node does
//! not need to carry it.
//!
//! Who may touch what, and when: the ground rules in [`engine`](crate::engine).

use std::ptr::NonNull;

use crate::engine::timer_node::TimerNode;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::wheel::list::Links;
use crate::wheel::location::Location;

/// Nodes carved from the region at a time.
#[cfg(not(loom))]
pub(crate) const CHUNK_NODES: usize = 1024;
#[cfg(loom)]
pub(crate) const CHUNK_NODES: usize = 4;

/// The most nodes a pool can hold: a packed wheel link names 2^26 - 1 indices, the last of
/// which means "none".
pub(crate) const MAX_CAPACITY: usize =
    ((1 << crate::engine::timer_node::INDEX_BITS) - 1) / CHUNK_NODES * CHUNK_NODES;

/// Nodes a pool holds unless the engine's builder says otherwise: about four million
/// timers per shard, 256 MiB of address space, resident only as far as it is used.
#[cfg(not(any(loom, miri)))]
pub(crate) const DEFAULT_CAPACITY: usize = 4 << 20;
#[cfg(all(miri, not(loom)))]
pub(crate) const DEFAULT_CAPACITY: usize = 8 * CHUNK_NODES;
#[cfg(loom)]
pub(crate) const DEFAULT_CAPACITY: usize = 2 * CHUNK_NODES;

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
        // SAFETY: only the thread holding the shard's wheel touches a filed node's held
        // parts (see `TimerNode::with_links`), and the wheel's methods run on that thread.
        unsafe { self.node(index).with_links(|links| links.links()) }
    }

    #[inline]
    fn prefetch(&self, index: u32) {
        if let Some(node) = self.0.node(index) {
            TimerNode::prefetch_for_write(NonNull::from(node));
        }
    }

    #[inline]
    fn set_prev(&mut self, index: u32, prev: u32) {
        // SAFETY: as in `links`.
        unsafe { self.node(index).with_links(|links| links.set_prev(prev)) }
    }

    #[inline]
    fn set_next(&mut self, index: u32, next: u32) {
        // SAFETY: as in `links`.
        unsafe { self.node(index).with_links(|links| links.set_next(next)) }
    }

    #[inline]
    fn set_links(&mut self, index: u32, location: Location, prev: u32, next: u32) {
        // SAFETY: as in `links`.
        unsafe {
            self.node(index)
                .with_links(|links| links.set_links(location, prev, next))
        }
    }
}

/// The shard's pool.
pub(crate) struct Pool {
    /// `capacity` node slots; the first `ready` hold initialised nodes.
    region: NonNull<TimerNode>,
    capacity: usize,
    /// Chunks claimed so far (some may still be being initialised).
    claimed: AtomicU64,
    /// Nodes initialised: always a whole number of chunks, published in order.
    ready: AtomicU64,
    /// The free stack's head: `tag (32) | first node's index + 1 (32)`, 0 when empty. The
    /// tag changes on every push and pop, so a pop that read a head which was then popped
    /// and pushed again fails its swap instead of corrupting the stack (the ABA problem).
    free: AtomicU64,
}

// SAFETY: the region's nodes are shared only through their atomics and through the holder
// discipline of `TimerNode::with_links`; the pool's own bookkeeping is atomic.
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

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
        if let Some(next) = self.first {
            // The next node is often one another core freed last: start moving its line
            // here now, so that the next take finds it rather than waiting a whole miss.
            TimerNode::prefetch_for_write(next);
        }
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

    /// Hands every node to `pool`, in batches of at most [`BATCH`], so that whoever pops
    /// one knows how many it got at most.
    pub(crate) fn give_back(&mut self, pool: &Pool) {
        let mut rest = self.first.take();
        while let Some(first) = rest {
            let mut last = first;
            for _ in 1..BATCH {
                // SAFETY: nodes on a magazine are live and held by this magazine alone.
                match unsafe { last.as_ref() }.next_in_chain() {
                    Some(next) => last = next,
                    None => break,
                }
            }
            // SAFETY: as above.
            let last_ref = unsafe { last.as_ref() };
            rest = last_ref.next_in_chain();
            last_ref.set_next_in_chain(None);
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
                // Batches hold at most this many (`give_back` cuts them so).
                self.len = BATCH;
                true
            }
            None => false,
        }
    }
}

impl Pool {
    /// A pool of [`DEFAULT_CAPACITY`] nodes.
    #[cfg(any(test, loom))]
    pub(crate) fn new() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }

    /// A pool of `capacity` nodes (rounded up to whole chunks, at most [`MAX_CAPACITY`]).
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity
            .clamp(CHUNK_NODES, MAX_CAPACITY)
            .div_ceil(CHUNK_NODES)
            * CHUNK_NODES;
        let layout = Self::layout(capacity);
        // SAFETY: the layout has a nonzero size (at least one chunk of nonzero-sized nodes).
        let region = unsafe { std::alloc::alloc(layout) }.cast::<TimerNode>();
        let Some(region) = NonNull::new(region) else {
            std::alloc::handle_alloc_error(layout)
        };
        Self {
            region,
            capacity,
            claimed: AtomicU64::new(0),
            ready: AtomicU64::new(0),
            free: AtomicU64::new(0),
        }
    }

    fn layout(capacity: usize) -> std::alloc::Layout {
        match std::alloc::Layout::array::<TimerNode>(capacity) {
            Ok(layout) => layout,
            // MAX_CAPACITY nodes of 64 bytes is 4 GiB, far below the size limit.
            Err(_) => unreachable!("a pool region larger than the address space"),
        }
    }

    /// The node at `index`, if it has been carved. Any thread, any time.
    #[inline]
    pub(crate) fn node(&self, index: u32) -> Option<&TimerNode> {
        if u64::from(index) >= self.ready.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: nodes below `ready` were initialised before `ready` was published (the
        // Acquire above pairs with its Release store), and live until the pool is dropped.
        Some(unsafe { self.region.add(index as usize).as_ref() })
    }

    /// The index of one of this pool's nodes: its offset in the region.
    #[inline]
    pub(crate) fn index_of(&self, node: NonNull<TimerNode>) -> u32 {
        // SAFETY: `node` points into this pool's region (every node handed out does), so
        // both pointers are derived from the same allocation and the offset is exact.
        let offset = unsafe { node.offset_from(self.region) };
        debug_assert!((0..self.capacity as isize).contains(&offset));
        offset as u32
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
            let next = (tag << 32) | (u64::from(self.index_of(first)) + 1);
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

    /// Carves a chunk from the region, keeps its first batch for the caller and pushes the
    /// rest. `None` when the region is used up.
    fn grow(&self) -> Option<NonNull<TimerNode>> {
        let chunk = self.claimed.fetch_add(1, Ordering::AcqRel) as usize;
        let start = chunk * CHUNK_NODES;
        if start >= self.capacity {
            self.claimed.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        // SAFETY: `start..start + CHUNK_NODES` is inside the region (capacity is a whole
        // number of chunks) and was claimed by this call alone; no handle names these
        // nodes yet, and `node` does not hand them out until `ready` covers them.
        let first = unsafe { self.region.add(start) };
        for offset in 0..CHUNK_NODES {
            // SAFETY: as above; writing initialises the slot without reading it.
            unsafe { first.add(offset).write(TimerNode::new()) };
        }
        // Chain the chunk into batches.
        let mut kept = None;
        for batch_start in (0..CHUNK_NODES).step_by(BATCH as usize) {
            let end = (batch_start + BATCH as usize).min(CHUNK_NODES);
            for offset in batch_start..end {
                // SAFETY: initialised just above, and still private to this call.
                let node = unsafe { first.add(offset).as_ref() };
                // SAFETY: `offset + 1 < end` keeps the pointer inside the chunk.
                let next = (offset + 1 < end).then(|| unsafe { first.add(offset + 1) });
                node.set_next_in_chain(next);
            }
            // SAFETY: `batch_start` is inside the chunk.
            let batch = unsafe { first.add(batch_start) };
            if kept.is_none() {
                kept = Some(batch);
            }
        }
        // Publish in chunk order, so that `ready` always covers initialised nodes only. A
        // chunk carved at the same time by another thread finishes within a few
        // microseconds; this wait happens once per chunk of growth, never on the hot path.
        crate::sync::spin_until(|| {
            (self.ready.load(Ordering::Acquire) == start as u64).then_some(())
        });
        self.ready
            .store((start + CHUNK_NODES) as u64, Ordering::Release);
        for batch_start in (BATCH as usize..CHUNK_NODES).step_by(BATCH as usize) {
            // SAFETY: inside the chunk, now published.
            self.push_batch(unsafe { first.add(batch_start) });
        }
        kept
    }

    /// Where the region begins (for the loom models' node names).
    #[cfg(loom)]
    pub(crate) fn region_start(&self) -> *const TimerNode {
        self.region.as_ptr()
    }

    /// Chunks carved so far.
    #[cfg(any(test, loom))]
    pub(crate) fn chunks(&self) -> usize {
        self.ready.load(Ordering::Acquire) as usize / CHUNK_NODES
    }

    /// Nodes that hold a timer (not free), counted by walking every node: a diagnostic for
    /// tests and shutdown reports, not for the hot path.
    #[cfg(any(test, loom, feature = "test-util"))]
    pub(crate) fn nodes_in_use(&self) -> usize {
        (0..self.ready.load(Ordering::Acquire) as u32)
            .filter_map(|index| self.node(index))
            .filter(|node| node.state.observe().phase() != crate::sync::timer_state::Phase::Free)
            .count()
    }

    /// Bytes of node memory carved (and so resident); the rest of the region is address
    /// space only.
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.ready.load(Ordering::Acquire) as usize * size_of::<TimerNode>()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let ready = self.ready.load(Ordering::Acquire) as usize;
        for index in 0..ready {
            // SAFETY: nodes below `ready` are initialised, and with `&mut self` no thread
            // can reach them any more. Dropping one drops any callback it still holds.
            unsafe { self.region.add(index).drop_in_place() };
        }
        // SAFETY: the region came from `alloc` with this layout in `with_capacity`.
        unsafe { std::alloc::dealloc(self.region.as_ptr().cast(), Self::layout(self.capacity)) };
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
            assert!(seen.insert(pool.index_of(node)));
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
