//! An intrusive doubly-linked list threaded through a wheel's timers by index.
//!
//! Indices instead of pointers keep a link at 4 bytes and let a slab move or free chunks
//! without fixing up pointers; doubly-linked so that cancel unlinks in O(1).

use crate::wheel::location::{Location, NIL};

/// Where a wheel's timers keep their deadlines and links, addressed by index: a slab of
/// nodes for [`Wheel`](crate::Wheel), a shard's node pool for the engine.
pub(crate) trait Links {
    /// The tick the timer is due at.
    fn deadline(&self, index: u32) -> u64;
    /// The list the timer is on, and its neighbours there.
    fn links(&self, index: u32) -> (Location, u32, u32);
    fn set_prev(&mut self, index: u32, prev: u32);
    fn set_next(&mut self, index: u32, next: u32);
    /// Records that the timer is on the list at `location`, between `prev` and `next`.
    fn set_links(&mut self, index: u32, location: Location, prev: u32, next: u32);
    /// Hints that the timer will be touched soon (a wheel walking a list asks for the node
    /// after next while it works on the current one). Does nothing unless overridden.
    #[inline]
    fn prefetch(&self, index: u32) {
        let _ = index;
    }
}

/// Head, tail and length of one list. The links live in the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct List {
    head: u32,
    tail: u32,
    /// How many nodes are on it: what moving the list ahead of time has left to do.
    len: u32,
}

impl List {
    pub(crate) const EMPTY: Self = Self {
        head: NIL,
        tail: NIL,
        len: 0,
    };

    #[inline]
    pub(crate) const fn is_empty(&self) -> bool {
        self.head == NIL
    }

    /// How many nodes are on the list.
    #[inline]
    pub(crate) const fn len(&self) -> u32 {
        self.len
    }

    /// The last index, or `NIL`. A node about to be appended is created with this as its
    /// `prev`, so that [`List::link_back`] need not touch it again.
    #[inline]
    pub(crate) const fn tail(&self) -> u32 {
        self.tail
    }

    /// Appends `index`, whose node already has `prev == self.tail()` and `next == NIL`:
    /// appending to the end keeps timers filed into one slot in the order they came.
    #[inline]
    pub(crate) fn link_back<N: Links>(&mut self, nodes: &mut N, index: u32) {
        if self.tail == NIL {
            self.head = index;
        } else {
            nodes.set_next(self.tail, index);
        }
        self.tail = index;
        // A list holds at most one node per index, and indices are `u32`s below `NIL`.
        self.len += 1;
    }

    /// Removes `index`, which must be on this list.
    #[inline]
    pub(crate) fn unlink<N: Links>(&mut self, nodes: &mut N, index: u32) {
        let (_, prev, next) = nodes.links(index);
        self.unlink_between(nodes, prev, next);
    }

    /// Closes the gap a node with links `prev` and `next` leaves, for a node that has
    /// already been read or removed.
    #[inline]
    pub(crate) fn unlink_between<N: Links>(&mut self, nodes: &mut N, prev: u32, next: u32) {
        if prev == NIL {
            self.head = next;
        } else {
            nodes.set_next(prev, next);
        }
        if next == NIL {
            self.tail = prev;
        } else {
            nodes.set_prev(next, prev);
        }
        self.len -= 1;
    }

    /// The first index, or `NIL`.
    #[inline]
    pub(crate) const fn head(&self) -> u32 {
        self.head
    }

    /// Removes and returns the first index.
    #[inline]
    pub(crate) fn pop_front<N: Links>(&mut self, nodes: &mut N) -> Option<u32> {
        let head = self.head;
        if head == NIL {
            return None;
        }
        self.unlink(nodes, head);
        Some(head)
    }

    /// Empties the list and returns what it held, for moving a whole slot at once.
    #[inline]
    pub(crate) fn take(&mut self) -> Self {
        std::mem::replace(self, Self::EMPTY)
    }
}
