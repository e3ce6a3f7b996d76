//! A shard's pool of timer nodes: one region reserved up front and carved a chunk at a time (so
//! resident memory follows the peak number of timers), and a bitmap of free nodes shared by every
//! thread. A node's index is its offset in the region.
//!
//! A thread takes free nodes a bitmap word at a time; freeing sets bits again, one atomic OR per
//! word. Words are taken in turn from a shared cursor, reusing the region like a ring, so timers
//! armed in turn get neighbouring nodes and later walks go forwards through memory.

use std::ptr::NonNull;

use crossbeam_utils::CachePadded;

use crate::engine::timer_node::TimerNode;
use crate::sync::atomic::{AtomicU64, Ordering};
pub(crate) use crate::tuning::{CHUNK_NODES, DEFAULT_CAPACITY};
use crate::tuning::{LOOK_WORDS, PLENTY_FREE, SPARE_SHARE};
use crate::wheel::list::Links;
use crate::wheel::location::Location;

/// The most nodes a pool can hold: a packed wheel link's indices, less the one for "none".
pub(crate) const MAX_CAPACITY: usize =
    ((1 << crate::engine::timer_node::INDEX_BITS) - 1) / CHUNK_NODES * CHUNK_NODES;

/// Nodes per word of the free bitmap: the most a refill takes at once.
pub(crate) const BATCH: u32 = u64::BITS;

/// A shard's nodes as its wheel sees them, by index.
pub(crate) struct FiledNodes<'a>(pub(crate) &'a Pool);

impl FiledNodes<'_> {
    #[inline]
    fn node(&self, index: u32) -> &TimerNode {
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
        // SAFETY: ground rule 2: a filed node's links are the wheel holder's, this thread.
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

pub(crate) struct Pool {
    /// `capacity` node slots; the first `ready` hold initialised nodes.
    region: NonNull<TimerNode>,
    capacity: usize,
    /// Chunks claimed so far (some perhaps still being initialised).
    claimed: AtomicU64,
    /// Nodes initialised: always a whole number of chunks, published in order.
    ready: AtomicU64,
    /// Chunks whose nodes are all kept or in the bitmap.
    settled: AtomicU64,
    free: FreeBits,
    /// The word the next refill looks at first.
    cursor: CachePadded<Hint>,
    /// Nodes carved (a hint).
    carved: Hint,
    /// About how many nodes the bitmap holds (it may lag, even below zero).
    free_count: CachePadded<Hint>,
}

/// Hints (the bitmap alone decides who holds a node), unmodelled by loom.
#[cfg(not(loom))]
type Hint = AtomicU64;
#[cfg(loom)]
type Hint = std::sync::atomic::AtomicU64;

// SAFETY: nodes are shared only through their atomics and ground rule 2; the rest is atomic.
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

/// One bit per node, set while it is free: whoever clears a bit (swapping the whole word) holds the
/// node.
struct FreeBits(Box<[AtomicU64]>);

impl FreeBits {
    /// Zeroed bits for `nodes` nodes, resident only as far as they are written.
    #[cfg(not(loom))]
    fn new(nodes: usize) -> Self {
        let words = nodes.div_ceil(BATCH as usize);
        let layout = match std::alloc::Layout::array::<AtomicU64>(words) {
            Ok(layout) => layout,
            Err(_) => unreachable!("a free bitmap larger than the address space"),
        };
        // SAFETY: the layout has a nonzero size (a pool has at least one chunk).
        let start = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<AtomicU64>();
        if start.is_null() {
            std::alloc::handle_alloc_error(layout)
        }
        let words = std::ptr::slice_from_raw_parts_mut(start, words);
        // SAFETY: allocated above with `[AtomicU64; words]`'s layout, as `Box` frees it; all-zero
        // bytes are a valid `AtomicU64`.
        Self(unsafe { Box::from_raw(words) })
    }

    /// Loom's atomics are not plain memory: build them one by one.
    #[cfg(loom)]
    fn new(nodes: usize) -> Self {
        let words = nodes.div_ceil(BATCH as usize);
        Self((0..words).map(|_| AtomicU64::new(0)).collect())
    }

    /// Takes every free node of `word`: their bits, if any.
    #[inline]
    fn take(&self, word: usize) -> Option<u64> {
        let bits = self.0.get(word)?;
        // A plain read first: an empty word costs no write to a shared line.
        if bits.load(Ordering::Relaxed) == 0 {
            return None;
        }
        // Acquire: pairs with `give`'s Release.
        let taken = bits.swap(0, Ordering::Acquire);
        (taken != 0).then_some(taken)
    }

    /// How many nodes of `word` are free, as last seen.
    #[inline]
    fn count(&self, word: usize) -> u32 {
        self.0
            .get(word)
            .map_or(0, |bits| bits.load(Ordering::Relaxed).count_ones())
    }

    /// Gives up the nodes of `word` whose bits are in `bits`.
    #[inline]
    fn give(&self, word: usize, bits: u64) {
        if let Some(word) = self.0.get(word) {
            let before = word.fetch_or(bits, Ordering::Release);
            debug_assert_eq!(before & bits, 0, "a node was given up twice");
        }
    }
}

/// Free nodes held by one thread: a bitmap word taken whole, and a chain of nodes put in one at a
/// time, handed out first (their lines are warm).
pub(crate) struct Magazine {
    first: Option<NonNull<TimerNode>>,
    chained: u32,
    /// The first node of the bits' word, and the word's index.
    base: Option<(NonNull<TimerNode>, usize)>,
    bits: u64,
}

// SAFETY: a magazine's nodes belong to its holder alone.
unsafe impl Send for Magazine {}

impl Magazine {
    pub(crate) const EMPTY: Self = Self {
        first: None,
        chained: 0,
        base: None,
        bits: 0,
    };

    #[inline]
    pub(crate) fn take(&mut self) -> Option<NonNull<TimerNode>> {
        if let Some(node) = self.first {
            // SAFETY: nodes on a magazine are live and held by this magazine alone.
            self.first = unsafe { node.as_ref() }.next_in_chain();
            self.chained -= 1;
            return Some(node);
        }
        let (base, _) = self.base?;
        if self.bits == 0 {
            return None;
        }
        let offset = self.bits.trailing_zeros() as usize;
        self.bits &= self.bits - 1;
        // SAFETY: a set bit of a word names a carved node of that word, which `base` starts.
        let node = unsafe { base.add(offset) };
        if self.bits != 0 {
            // SAFETY: as above.
            TimerNode::prefetch_for_write(unsafe { base.add(self.bits.trailing_zeros() as usize) });
        }
        Some(node)
    }

    /// Adds a free node the caller holds exclusively.
    #[inline]
    pub(crate) fn put(&mut self, node: NonNull<TimerNode>) {
        // SAFETY: the caller holds `node`, which is live.
        unsafe { node.as_ref() }.set_next_in_chain(self.first);
        self.first = Some(node);
        self.chained += 1;
    }

    pub(crate) fn len(&self) -> u32 {
        self.chained + self.bits.count_ones()
    }

    /// Gives every node back: one OR for the word, and one per run of chained nodes.
    pub(crate) fn give_back(&mut self, pool: &Pool) {
        let given = self.len();
        let mut run: Option<(usize, u64)> = None;
        let mut rest = self.first.take();
        while let Some(node) = rest {
            // SAFETY: as in `take`; the link is read before the node is given up.
            rest = unsafe { node.as_ref() }.next_in_chain();
            let index = pool.index_of(node) as usize;
            let (word, bit) = (index / BATCH as usize, 1_u64 << (index % BATCH as usize));
            run = match run {
                Some((same, bits)) if same == word => Some((word, bits | bit)),
                Some((other, bits)) => {
                    pool.free.give(other, bits);
                    Some((word, bit))
                }
                None => Some((word, bit)),
            };
        }
        if let Some((word, bits)) = run {
            pool.free.give(word, bits);
        }
        if let Some((_, word)) = self.base.take() {
            if self.bits != 0 {
                pool.free.give(word, self.bits);
            }
        }
        self.chained = 0;
        self.bits = 0;
        pool.counted_free(given, 0);
    }

    /// Refills an empty magazine with the free nodes of one word; `false` when the pool is full.
    pub(crate) fn refill(&mut self, pool: &Pool) -> bool {
        debug_assert!(self.first.is_none() && self.bits == 0);
        let taken = pool
            .take_next_word()
            .or_else(|| pool.grow())
            .or_else(|| pool.take_any_word());
        match taken {
            Some((word, bits)) => {
                self.base = Some((pool.word_start(word), word));
                self.bits = bits;
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
        // SAFETY: the layout has a nonzero size (at least one chunk).
        let region = unsafe { std::alloc::alloc(layout) }.cast::<TimerNode>();
        let Some(region) = NonNull::new(region) else {
            std::alloc::handle_alloc_error(layout)
        };
        Self {
            region,
            capacity,
            claimed: AtomicU64::new(0),
            ready: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            free: FreeBits::new(capacity),
            carved: Hint::new(0),
            cursor: CachePadded::new(Hint::new(0)),
            free_count: CachePadded::new(Hint::new(0)),
        }
    }

    fn layout(capacity: usize) -> std::alloc::Layout {
        match std::alloc::Layout::array::<TimerNode>(capacity) {
            Ok(layout) => layout,
            Err(_) => unreachable!("a pool region larger than the address space"),
        }
    }

    /// The node at `index`, if it has been carved. Any thread, any time.
    #[inline]
    pub(crate) fn node(&self, index: u32) -> Option<&TimerNode> {
        if u64::from(index) >= self.ready.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: nodes below `ready` were initialised before its Release store, and live as long
        // as the pool.
        Some(unsafe { self.region.add(index as usize).as_ref() })
    }

    /// The index of one of this pool's nodes: its offset in the region.
    #[inline]
    pub(crate) fn index_of(&self, node: NonNull<TimerNode>) -> u32 {
        // SAFETY: every node handed out points into this pool's region, one allocation.
        let offset = unsafe { node.offset_from(self.region) };
        debug_assert!((0..self.capacity as isize).contains(&offset));
        offset as u32
    }

    /// The first node of bitmap word `word`, carved or not.
    fn word_start(&self, word: usize) -> NonNull<TimerNode> {
        let index = word * BATCH as usize;
        debug_assert!(index < self.capacity);
        // SAFETY: the words cover the region, so a word's first node is inside it.
        unsafe { self.region.add(index) }
    }

    /// Bitmap words that cover carved nodes.
    fn carved_words(&self) -> usize {
        (self.ready.load(Ordering::Acquire) as usize).div_ceil(BATCH as usize)
    }

    /// The free nodes of the next word at least half free within [`LOOK_WORDS`]. With none: `None`
    /// (grow) while under a [`SPARE_SHARE`]th is free and the pool can grow; else the first thin
    /// word seen, or with [`PLENTY_FREE`] any word, so long-lived timers do not grow the pool on
    /// every lap.
    fn take_next_word(&self) -> Option<(usize, u64)> {
        let words = self.carved_words();
        if words == 0 {
            return None;
        }
        // Read once, so the look writes no shared line; the swap settles two refills picking one
        // word.
        let start = self.cursor.load(Ordering::Relaxed) as usize % words;
        let near = words.min(LOOK_WORDS);
        let mut thin = None;
        let mut word = start;
        for _ in 0..near {
            let here = word;
            word = if word + 1 == words { 0 } else { word + 1 };
            match self.free.count(here) {
                0 => continue,
                n if n < BATCH / 2 => {
                    thin.get_or_insert(here);
                    continue;
                }
                _ => {}
            }
            if let Some(bits) = self.take_word(here) {
                self.cursor.store(word as u64, Ordering::Relaxed);
                return Some((here, bits));
            }
        }
        let free = self.free_count();
        if free < self.carved.load(Ordering::Relaxed) / SPARE_SHARE && self.can_grow() {
            return None;
        }
        self.cursor.store(word as u64, Ordering::Relaxed);
        if let Some(bits) = thin.and_then(|word| self.take_word(word)) {
            return thin.map(|word| (word, bits));
        }
        if free < PLENTY_FREE {
            return None;
        }
        let (word, bits) = (near..words).find_map(|step| {
            let word = (start + step) % words;
            if self.free.count(word) == 0 {
                return None;
            }
            Some((word, self.take_word(word)?))
        })?;
        self.cursor
            .store(((word + 1) % words) as u64, Ordering::Relaxed);
        Some((word, bits))
    }

    /// Whether a chunk is left to carve (once `false`, final).
    fn can_grow(&self) -> bool {
        (self.carved.load(Ordering::Relaxed) as usize) < self.capacity
    }

    /// Takes the free nodes of `word`, and counts them out.
    fn take_word(&self, word: usize) -> Option<u64> {
        let bits = self.free.take(word)?;
        self.counted_free(0, bits.count_ones());
        Some(bits)
    }

    fn counted_free(&self, given: u32, taken: u32) {
        if given > 0 {
            self.free_count
                .fetch_add(u64::from(given), Ordering::Relaxed);
        }
        if taken > 0 {
            self.free_count
                .fetch_sub(u64::from(taken), Ordering::Relaxed);
        }
    }

    /// About how many nodes the bitmap holds (zero while the count lags below).
    fn free_count(&self) -> u64 {
        let count = self.free_count.load(Ordering::Relaxed);
        // Below zero: a refill counted out what a give-back has not yet counted in.
        if count > u64::MAX / 2 { 0 } else { count }
    }

    /// The free nodes of any word, for a full pool; waits for a chunk still being carved.
    fn take_any_word(&self) -> Option<(usize, u64)> {
        let chunks = (self.capacity / CHUNK_NODES) as u64;
        loop {
            let words = self.carved_words();
            if let Some(taken) = (0..words).find_map(|word| Some((word, self.take_word(word)?))) {
                return Some(taken);
            }
            if self.settled.load(Ordering::Acquire) >= chunks {
                return None;
            }
            crate::sync::spin_until(|| {
                (self.settled.load(Ordering::Acquire) >= chunks).then_some(())
            });
        }
    }

    /// Carves a chunk, keeping its first word for the caller; `None` when none is left.
    fn grow(&self) -> Option<(usize, u64)> {
        // No shared read-modify-write once at the limit.
        if !self.can_grow() {
            return None;
        }
        let chunk = self.claimed.fetch_add(1, Ordering::AcqRel) as usize;
        let start = chunk * CHUNK_NODES;
        if start >= self.capacity {
            self.claimed.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        // SAFETY: the chunk is inside the region, claimed by this call alone, and unreachable
        // through `node` until `ready` covers it.
        let first = unsafe { self.region.add(start) };
        for offset in 0..CHUNK_NODES {
            // SAFETY: as above; writing initialises the slot without reading it.
            unsafe { first.add(offset).write(TimerNode::new()) };
        }
        // In chunk order, so `ready` covers initialised nodes only.
        crate::sync::spin_until(|| {
            (self.ready.load(Ordering::Acquire) == start as u64).then_some(())
        });
        let end = start + CHUNK_NODES;
        self.ready.store(end as u64, Ordering::Release);
        self.carved.store(end as u64, Ordering::Relaxed);
        let batch = BATCH as usize;
        let mut words = (start / batch..end.div_ceil(batch)).map(|word| {
            let (low, high) = (start.max(word * batch), end.min(word * batch + batch));
            let bits = (low..high).fold(0_u64, |bits, index| bits | 1 << (index % batch));
            (word, bits)
        });
        let kept = words.next();
        for (word, bits) in words {
            self.free.give(word, bits);
            self.counted_free(bits.count_ones(), 0);
        }
        // After the gives: a refill that sees this chunk settled sees its bits.
        self.settled.fetch_add(1, Ordering::Release);
        if let Some((word, _)) = kept {
            self.cursor.store(word as u64 + 1, Ordering::Relaxed);
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

    /// Nodes that hold a timer, counted by walking every node (a diagnostic).
    #[cfg(any(test, loom, feature = "test-util"))]
    pub(crate) fn nodes_in_use(&self) -> usize {
        (0..self.ready.load(Ordering::Acquire) as u32)
            .filter_map(|index| self.node(index))
            .filter(|node| node.state.observe().phase() != crate::sync::timer_state::Phase::Free)
            .count()
    }

    /// Bytes of node memory carved (and so resident).
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.ready.load(Ordering::Acquire) as usize * size_of::<TimerNode>()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let ready = self.ready.load(Ordering::Acquire) as usize;
        for index in 0..ready {
            // SAFETY: nodes below `ready` are initialised, and `&mut self` excludes others.
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
        // One node into a third chunk.
        for _ in 0..2 * CHUNK_NODES + 1 {
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

    /// Takes `words` refills' worth of nodes, growing the pool as needed.
    fn take_words(pool: &Pool, words: usize) -> Vec<Vec<u32>> {
        (0..words)
            .map(|_| {
                let mut magazine = Magazine::EMPTY;
                assert!(magazine.refill(pool));
                std::iter::from_fn(|| magazine.take().map(|node| pool.index_of(node))).collect()
            })
            .collect()
    }

    /// Gives `indices` back, freed in the order given.
    fn give_back(pool: &Pool, indices: impl IntoIterator<Item = u32>) {
        let mut freed = Magazine::EMPTY;
        for index in indices {
            freed.put(NonNull::from(pool.node(index).expect("a carved node")));
        }
        freed.give_back(pool);
    }

    #[test]
    fn nodes_freed_in_any_order_come_back_in_address_order() {
        let pool = Pool::new();
        // The first chunk held, then freed scrambled (an odd multiplier permutes indices).
        let words = CHUNK_NODES / BATCH as usize;
        let held: Vec<u32> = take_words(&pool, words).into_iter().flatten().collect();
        assert_eq!(held.len(), CHUNK_NODES);
        let scrambled = held
            .iter()
            .map(|&index| index.wrapping_mul(2_654_435_761) % CHUNK_NODES as u32);
        give_back(&pool, scrambled);
        for word in take_words(&pool, words) {
            assert!(!word.is_empty());
            assert!(
                word.windows(2).all(|pair| pair[0] < pair[1]),
                "a refill hands its nodes out in address order: {word:?}"
            );
            let first_word = word[0] / BATCH;
            assert!(word.iter().all(|&index| index / BATCH == first_word));
        }
        assert_eq!(pool.chunks(), 1, "reused, not grown");
    }

    #[test]
    fn a_word_at_least_half_free_is_taken_before_a_thinner_one() {
        let pool = Pool::new();
        let words = take_words(&pool, CHUNK_NODES / BATCH as usize);
        assert_eq!(pool.chunks(), 1);
        let (thin, thick) = (&words[1], &words[words.len() - 1]);
        give_back(&pool, thin[..1].iter().copied());
        give_back(&pool, thick[..40].iter().copied());
        let taken = take_words(&pool, 1).remove(0);
        assert_eq!(taken, thick[..40].to_vec(), "the thicker word first");
        let taken = take_words(&pool, 1).remove(0);
        assert_eq!(
            taken[0], CHUNK_NODES as u32,
            "then, with less than an eighth of the pool free, a new chunk"
        );
        assert_eq!(pool.chunks(), 2);
    }

    #[test]
    fn a_thin_word_is_taken_once_an_eighth_of_the_pool_is_free() {
        let pool = Pool::new();
        let words = take_words(&pool, CHUNK_NODES / BATCH as usize);
        // 20 nodes of each of a few words: over an eighth of the pool, no word half free.
        let thin_words = CHUNK_NODES / 8 / 20 + 1;
        for word in &words[..thin_words] {
            give_back(&pool, word[..20].iter().copied());
        }
        let taken = take_words(&pool, 1).remove(0);
        assert_eq!(taken, words[0][..20].to_vec(), "the first thin word");
        assert_eq!(pool.chunks(), 1, "rather than growing");
    }

    #[test]
    fn a_full_pool_finds_a_free_node_beyond_its_usual_look_ahead() {
        let words = 2 * LOOK_WORDS;
        let pool = Pool::with_capacity(words * BATCH as usize);
        let held = take_words(&pool, words);
        let refills = |pool: &Pool| {
            let mut magazine = Magazine::EMPTY;
            magazine.refill(pool)
        };
        assert!(!refills(&pool), "all held, at its size limit");
        // Find the word the next refill's look starts at, and free a node past its look.
        let next = pool.cursor.load(Ordering::Relaxed) as usize % words;
        let far = held
            .iter()
            .find(|word| (word[0] / BATCH) as usize == (next + LOOK_WORDS + 1) % words)
            .map(|word| word[7])
            .expect("every word was taken");
        give_back(&pool, [far]);
        let taken = take_words(&pool, 1).remove(0);
        assert_eq!(taken, vec![far]);
        assert!(!refills(&pool), "nothing left to find");
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
