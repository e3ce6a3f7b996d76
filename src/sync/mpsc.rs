//! An intrusive, lock-free multi-producer single-consumer queue (Vyukov's design).
//!
//! Intrusive, so a pooled timer node is linked in place and nothing is allocated per
//! message. A producer may push a chain it linked privately with one `swap` on the shared
//! tail, writing the shared line once per batch rather than once per timer.
//!
//! Producers never wait. A node swapped in but not yet linked makes `pop` report
//! [`Pop::Inconsistent`], and the consumer tries again later rather than spinning.

use std::ptr::{self, NonNull};

use crate::sync::UnsafeCell;
use crate::sync::atomic::{AtomicPtr, Ordering};

/// The link an intrusive node embeds.
pub struct Link {
    pub(crate) next: AtomicPtr<Link>,
}

impl Link {
    /// A link not on any queue.
    pub fn new() -> Self {
        Self {
            next: AtomicPtr::new(ptr::null_mut()),
        }
    }
}

impl Default for Link {
    fn default() -> Self {
        Self::new()
    }
}

/// A node type that embeds a [`Link`].
///
/// # Safety
/// `link` must project the embedded `Link` from `node`'s pointer (a reference's provenance
/// would cover the link alone), and `from_link` must map it back to the node.
pub unsafe trait Linked {
    /// The link embedded in `node`.
    ///
    /// # Safety
    /// `node` must point at a live node of this type.
    unsafe fn link(node: NonNull<Self>) -> NonNull<Link>;

    /// The node that embeds `link`.
    ///
    /// # Safety
    /// `link` must point at the `Link` of a live node of this type.
    unsafe fn from_link(link: NonNull<Link>) -> NonNull<Self>;
}

/// What [`Queue::pop`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Pop<N> {
    /// The oldest node pushed, now owned by the consumer again.
    Node(NonNull<N>),
    /// Nothing is queued.
    Empty,
    /// A producer is between its `swap` and its link: try again later.
    Inconsistent,
}

/// The queue. See the module documentation.
pub struct Queue<N: Linked> {
    /// Where producers append: the most recently pushed link.
    tail: AtomicPtr<Link>,
    /// Where the consumer takes from; only the consumer touches it.
    head: UnsafeCell<*mut Link>,
    /// A placeholder that keeps the list non-empty. A raw pointer, not a `Box`: moving a
    /// `Box` asserts unique access, invalidating the list's pointers to the stub.
    stub: NonNull<Link>,
    _nodes: std::marker::PhantomData<NonNull<N>>,
}

// SAFETY: nodes move between threads, hence `N: Send`; producer-side state is atomic, and
// the consumer-only `head` is touched only through `unsafe` single-consumer methods.
unsafe impl<N: Linked + Send> Send for Queue<N> {}
// SAFETY: as above.
unsafe impl<N: Linked + Send> Sync for Queue<N> {}

impl<N: Linked> Queue<N> {
    /// An empty queue.
    pub fn new() -> Self {
        let stub = NonNull::from(Box::leak(Box::new(Link::new())));
        Self {
            tail: AtomicPtr::new(stub.as_ptr()),
            head: UnsafeCell::new(stub.as_ptr()),
            stub,
            _nodes: std::marker::PhantomData,
        }
    }

    fn stub_ptr(&self) -> *mut Link {
        self.stub.as_ptr()
    }

    /// Appends one node.
    ///
    /// # Safety
    /// `node` must be live, on no queue, and stay live and unmoved until popped.
    pub unsafe fn push(&self, node: NonNull<N>) {
        // SAFETY: forwarded from the caller: one live, unqueued node is a chain of one.
        unsafe { self.push_chain(node, node) }
    }

    /// Appends a chain `first` to `last` linked with [`link_after`], in one atomic step.
    ///
    /// # Safety
    /// As for [`push`](Self::push), for every node, linked first to last.
    pub unsafe fn push_chain(&self, first: NonNull<N>, last: NonNull<N>) {
        // SAFETY: forwarded from the caller.
        let (first, last) = unsafe { (N::link(first).as_ptr(), N::link(last).as_ptr()) };
        // SAFETY: `last` is live and private to this thread until the swap below.
        unsafe { (*last).next.store(ptr::null_mut(), Ordering::Relaxed) };
        // AcqRel: Release publishes the chain to whoever swaps next or pops; Acquire orders
        // our write to `previous.next` after the previous producer's initialisation of it.
        let previous = self.tail.swap(last, Ordering::AcqRel);
        // SAFETY: `previous` was the queue's tail: the stub or a node that stays live until
        // popped, and it cannot be popped before this store makes it reachable past itself.
        unsafe { (*previous).next.store(first, Ordering::Release) };
    }

    /// Removes the oldest node.
    ///
    /// # Safety
    /// Only one thread at a time may call `pop` (the single consumer).
    pub unsafe fn pop(&self) -> Pop<N> {
        self.head.with_mut(|head_cell| {
            // SAFETY: the caller is the single consumer, the only one touching `head`.
            let head_cell = unsafe { &mut *head_cell };
            let stub = self.stub_ptr();
            let mut head = *head_cell;
            // SAFETY: `head` is the stub or a node the queue owns, live until popped.
            let mut next = unsafe { (*head).next.load(Ordering::Acquire) };
            if head == stub {
                if next.is_null() {
                    return Pop::Empty;
                }
                *head_cell = next;
                head = next;
                // SAFETY: `next` was published by a producer's Release store and is live.
                next = unsafe { (*head).next.load(Ordering::Acquire) };
            }
            if !next.is_null() {
                *head_cell = next;
                return Pop::Node(self.node_of(head));
            }
            // `head` is the last reachable node: put the stub back behind it so it can be
            // handed out, unless a producer has swapped in more.
            if head != self.tail.load(Ordering::Acquire) {
                return Pop::Inconsistent;
            }
            // SAFETY: the stub is the queue's own and is on no list at this point.
            unsafe { self.push_link(stub) };
            // SAFETY: as above, `head` is live.
            next = unsafe { (*head).next.load(Ordering::Acquire) };
            if next.is_null() {
                // A producer swapped in after our tail check and has not linked yet.
                return Pop::Inconsistent;
            }
            *head_cell = next;
            Pop::Node(self.node_of(head))
        })
    }

    /// Whether nothing is queued, as the consumer sees it.
    ///
    /// # Safety
    /// Only the single consumer may call this, as for [`Queue::pop`].
    pub unsafe fn is_empty(&self) -> bool {
        self.head.with(|head_cell| {
            // SAFETY: the single consumer is the only one touching `head`.
            let head = unsafe { *head_cell };
            // SAFETY: `head` is the stub or a live queued node.
            head == self.stub_ptr() && unsafe { (*head).next.load(Ordering::Acquire) }.is_null()
        })
    }

    /// Whether anything is queued or being queued, including a producer between its swap
    /// and its link. SeqCst, for the wake-up handshake built on it.
    ///
    /// # Safety
    /// Only the single consumer may call this, as for [`Queue::pop`].
    pub unsafe fn has_pending(&self) -> bool {
        // SAFETY: forwarded from the caller.
        !unsafe { self.is_empty() } || self.tail.load(Ordering::SeqCst) != self.stub_ptr()
    }

    fn node_of(&self, link: *mut Link) -> NonNull<N> {
        debug_assert!(link != self.stub_ptr(), "the stub is never handed out");
        // SAFETY: every non-stub link was pushed as a live `N`'s, and it came from a
        // non-null `next` or the head.
        unsafe { N::from_link(NonNull::new_unchecked(link)) }
    }

    /// Appends a bare link (the stub).
    ///
    /// # Safety
    /// `link` must be live and on no queue.
    unsafe fn push_link(&self, link: *mut Link) {
        // SAFETY: forwarded from the caller.
        unsafe { (*link).next.store(ptr::null_mut(), Ordering::Relaxed) };
        let previous = self.tail.swap(link, Ordering::AcqRel);
        // SAFETY: as in `push_chain`.
        unsafe { (*previous).next.store(link, Ordering::Release) };
    }
}

impl<N: Linked> Drop for Queue<N> {
    /// Frees the stub; nodes still queued belong to whoever pushed them (a pool).
    fn drop(&mut self) {
        // SAFETY: `stub` came from `Box::leak` in `new`, and `&mut self` excludes all users.
        drop(unsafe { Box::from_raw(self.stub.as_ptr()) });
    }
}

impl<N: Linked> Default for Queue<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// Links `next` after `node` in a chain built privately for [`Queue::push_chain`].
///
/// # Safety
/// Both nodes must be live and on no queue, and no other thread may be reading their links.
pub unsafe fn link_after<N: Linked>(node: NonNull<N>, next: NonNull<N>) {
    // SAFETY: the caller guarantees both are live and private to this thread.
    unsafe {
        let next = N::link(next).as_ptr();
        (*N::link(node).as_ptr())
            .next
            .store(next, Ordering::Relaxed);
    }
}

/// A heap-allocated test node, shared by the unit tests and the loom models.
#[cfg(any(test, loom))]
pub mod testing {
    use std::ptr::NonNull;

    use super::{Link, Linked};

    /// A message carrying one value.
    #[repr(C)]
    pub struct Message {
        link: Link,
        /// What the message carries.
        pub value: usize,
    }

    // SAFETY: `link` projects the field from the node's own pointer, and since `link` is the
    // first field of a `repr(C)` struct, `from_link`'s cast maps it back to the message.
    unsafe impl Linked for Message {
        unsafe fn link(node: NonNull<Self>) -> NonNull<Link> {
            // SAFETY: `node` is live; projecting from its pointer keeps the whole provenance.
            unsafe { NonNull::new_unchecked(&raw mut (*node.as_ptr()).link) }
        }

        unsafe fn from_link(link: NonNull<Link>) -> NonNull<Self> {
            link.cast()
        }
    }

    /// A new message on the heap, owned by whoever pushes it until it is popped.
    pub fn message(value: usize) -> NonNull<Message> {
        NonNull::from(Box::leak(Box::new(Message {
            link: Link::new(),
            value,
        })))
    }

    /// Takes back a popped message and returns its value.
    ///
    /// # Safety
    /// `node` must come from [`message`] and no longer be on any queue.
    pub unsafe fn consume(node: NonNull<Message>) -> usize {
        // SAFETY: forwarded from the caller: `node` came from `Box::leak`.
        unsafe { Box::from_raw(node.as_ptr()) }.value
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::testing::{Message, consume, message};
    use super::*;
    use std::sync::Arc;

    /// Pops one message, waiting out producers caught mid-push, and frees it.
    fn pop_value(queue: &Queue<Message>) -> Option<usize> {
        loop {
            // SAFETY: each test has exactly one consumer thread.
            match unsafe { queue.pop() } {
                // SAFETY: a popped node is off the queue, and came from `message`.
                Pop::Node(node) => return Some(unsafe { consume(node) }),
                Pop::Empty => return None,
                Pop::Inconsistent => std::thread::yield_now(),
            }
        }
    }

    #[test]
    fn single_thread_fifo() {
        let queue = Queue::new();
        // SAFETY: the queue is empty, single consumer.
        assert!(unsafe { queue.is_empty() });
        assert_eq!(pop_value(&queue), None);
        for v in 0..5 {
            // SAFETY: fresh, live, unqueued nodes, freed only after they are popped.
            unsafe { queue.push(message(v)) };
        }
        // SAFETY: single consumer.
        assert!(!unsafe { queue.is_empty() });
        for v in 0..5 {
            assert_eq!(pop_value(&queue), Some(v));
        }
        assert_eq!(pop_value(&queue), None);
        // Across the state where the stub went back in behind a lone node.
        // SAFETY: as above.
        unsafe { queue.push(message(9)) };
        assert_eq!(pop_value(&queue), Some(9));
        assert_eq!(pop_value(&queue), None);
    }

    #[test]
    fn a_chain_arrives_whole_and_in_order() {
        let queue = Queue::new();
        let nodes: Vec<_> = (10..14).map(message).collect();
        for pair in nodes.windows(2) {
            // SAFETY: the nodes are live and private to this thread until pushed.
            unsafe { link_after(pair[0], pair[1]) };
        }
        // SAFETY: first to last are live, linked in order, and unqueued.
        unsafe {
            queue.push(message(1));
            queue.push_chain(nodes[0], nodes[3]);
            queue.push(message(2));
        }
        let got: Vec<_> = std::iter::from_fn(|| pop_value(&queue)).collect();
        assert_eq!(got, vec![1, 10, 11, 12, 13, 2]);
    }

    #[test]
    fn producers_on_threads_lose_nothing() {
        const PRODUCERS: usize = 2;
        const EACH: usize = 50;
        let queue = Arc::new(Queue::new());
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let queue = Arc::clone(&queue);
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        // SAFETY: fresh nodes; the consumer frees them after popping.
                        unsafe { queue.push(message(p * EACH + i)) };
                    }
                })
            })
            .collect();
        let mut last_seen = [None; PRODUCERS];
        let mut received = 0;
        while received < PRODUCERS * EACH {
            match pop_value(&queue) {
                Some(v) => {
                    let (p, i) = (v / EACH, v % EACH);
                    assert!(
                        last_seen[p].is_none_or(|last| last < i),
                        "per-producer order"
                    );
                    last_seen[p] = Some(i);
                    received += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        for producer in producers {
            producer.join().unwrap();
        }
        assert_eq!(pop_value(&queue), None);
    }
}
