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

    pub(crate) const fn is_empty(&self) -> bool {
        self.head == NIL
    }

    /// Appends `index`, so that timers filed into one slot leave it in the order they came.
    pub(crate) fn push_back<T>(&mut self, slab: &mut Slab<Node<T>>, index: u32) {
        let old_tail = self.tail;
        {
            let node = slab.at_mut(index);
            node.prev = old_tail;
            node.next = NIL;
        }
        if old_tail == NIL {
            self.head = index;
        } else {
            slab.at_mut(old_tail).next = index;
        }
        self.tail = index;
    }

    /// Removes `index`, which must be on this list.
    pub(crate) fn unlink<T>(&mut self, slab: &mut Slab<Node<T>>, index: u32) {
        let (prev, next) = {
            let node = slab.at(index);
            (node.prev, node.next)
        };
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

    /// Removes and returns the first index.
    pub(crate) fn pop_front<T>(&mut self, slab: &mut Slab<Node<T>>) -> Option<u32> {
        let head = self.head;
        if head == NIL {
            return None;
        }
        self.unlink(slab, head);
        Some(head)
    }

    /// Empties the list and returns what it held, for moving a whole slot at once.
    pub(crate) fn take(&mut self) -> Self {
        std::mem::replace(self, Self::EMPTY)
    }
}
