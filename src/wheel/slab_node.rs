//! One timer as the wheel stores it in its slab: deadline, list links, where it is filed, and
//! the caller's value.

use crate::wheel::list::Links;
use crate::wheel::location::Location;
use crate::wheel::slab::Slab;

/// A timer inside the wheel.
pub(crate) struct Node<T> {
    /// The deadline in ticks since the wheel's origin, rounded up.
    pub(crate) deadline: u64,
    pub(crate) prev: u32,
    pub(crate) next: u32,
    pub(crate) location: Location,
    pub(crate) value: T,
}

impl<T> Links for Slab<Node<T>> {
    #[inline]
    fn deadline(&self, index: u32) -> u64 {
        self.at(index).deadline
    }

    #[inline]
    fn links(&self, index: u32) -> (Location, u32, u32) {
        let node = self.at(index);
        (node.location, node.prev, node.next)
    }

    #[inline]
    fn set_prev(&mut self, index: u32, prev: u32) {
        self.at_mut(index).prev = prev;
    }

    #[inline]
    fn set_next(&mut self, index: u32, next: u32) {
        self.at_mut(index).next = next;
    }

    #[inline]
    fn set_links(&mut self, index: u32, location: Location, prev: u32, next: u32) {
        let node = self.at_mut(index);
        node.location = location;
        node.prev = prev;
        node.next = next;
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn option_of_a_node_needs_no_tag() {
        use std::mem::size_of;
        assert_eq!(size_of::<Option<Node<u64>>>(), size_of::<Node<u64>>());
    }
}
