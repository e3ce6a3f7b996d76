//! An intrusive doubly-linked list threaded through the slab's nodes by index.
//!
//! Indices instead of pointers keep a link at 4 bytes and let the slab move or free chunks
//! without fixing up pointers; doubly-linked so that cancel unlinks in O(1).

use crate::node::{NIL, Node};
use crate::slab::Slab;

/// Head and tail of one list. The links live in the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct List {
    head: u32,
    tail: u32,
}

impl List {
    pub(crate) const EMPTY: Self = Self {
        head: NIL,
        tail: NIL,
    };

    #[inline]
    pub(crate) const fn is_empty(&self) -> bool {
        self.head == NIL
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
    pub(crate) fn link_back<T>(&mut self, slab: &mut Slab<Node<T>>, index: u32) {
        if self.tail == NIL {
            self.head = index;
        } else {
            slab.at_mut(self.tail).next = index;
        }
        self.tail = index;
    }

    /// Removes `index`, which must be on this list.
    #[inline]
    pub(crate) fn unlink<T>(&mut self, slab: &mut Slab<Node<T>>, index: u32) {
        let node = slab.at(index);
        let (prev, next) = (node.prev, node.next);
        self.unlink_between(slab, prev, next);
    }

    /// Closes the gap a node with links `prev` and `next` leaves, for a node that has
    /// already been read or removed.
    #[inline]
    pub(crate) fn unlink_between<T>(&mut self, slab: &mut Slab<Node<T>>, prev: u32, next: u32) {
        if prev == NIL {
            self.head = next;
        } else {
            slab.at_mut(prev).next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            slab.at_mut(next).prev = prev;
        }
    }

    /// The first index, or `NIL`.
    #[inline]
    pub(crate) const fn head(&self) -> u32 {
        self.head
    }

    /// Removes and returns the first index.
    #[inline]
    pub(crate) fn pop_front<T>(&mut self, slab: &mut Slab<Node<T>>) -> Option<u32> {
        let head = self.head;
        if head == NIL {
            return None;
        }
        self.unlink(slab, head);
        Some(head)
    }

    /// Empties the list and returns what it held, for moving a whole slot at once.
    #[inline]
    pub(crate) fn take(&mut self) -> Self {
        std::mem::replace(self, Self::EMPTY)
    }
}
