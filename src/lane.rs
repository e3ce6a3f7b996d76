//! A lane: where one thread stages what it sends to one shard, so that a timer armed and
//! cancelled in quick succession never crosses to another core.
//!
//! The lane is a lock-free stack that both sides empty whole with one swap: the producer
//! thread (every [`CLAIM_EVERY`] pushes, to recycle the timers it has already cancelled and
//! forward the rest to the shard's inbox in one batch), and the shard's worker (when the
//! lane's earliest need comes due, so that a thread that arms a timer and then goes idle
//! still has it fire on time). Only the producer pushes, so pushes never contend with each
//! other, and the cache line stays in the producer's core between the worker's visits.
//!
//! The producer publishes `need`: the earliest tick at which the worker must have taken the
//! lane. The worker sleeps no later than that, and a push that lowers it below the worker's
//! planned wake-up wakes the worker.

use std::ptr::NonNull;

use crossbeam_utils::CachePadded;

use crate::mpsc::{Link, Linked};
use crate::pool::Magazine;
use crate::sync::UnsafeCell;
use crate::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use crate::timer_node::TimerNode;

/// Pushes after which the producer takes its lane back to recycle and forward.
pub(crate) const CLAIM_EVERY: u32 = 64;

/// One thread's lane into one shard.
pub(crate) struct Lane {
    head: CachePadded<AtomicPtr<Link>>,
    /// The earliest tick by which the worker must take the lane; written by the producer
    /// only. Meaningful while `head` is non-null.
    need: AtomicU64,
    producer: UnsafeCell<ProducerSide>,
    /// Counts the producer keeps (single writer, so plain load and store, no read-modify-
    /// write): timers scheduled, cancelled and reset through this lane's thread.
    pub(crate) scheduled: AtomicU64,
    pub(crate) cancelled: AtomicU64,
    pub(crate) reset: AtomicU64,
    /// The thread has exited; the worker drops the lane once it is empty.
    closed: AtomicBool,
}

/// State only the producer thread touches.
pub(crate) struct ProducerSide {
    /// Free nodes of this lane's shard, ready to arm.
    pub(crate) magazine: Magazine,
    pushes: u32,
    /// `need` as last published.
    need: u64,
}

/// A chain of nodes taken off a lane, first to last through their chain links.
pub(crate) struct Chain(Option<NonNull<TimerNode>>);

impl Iterator for Chain {
    type Item = NonNull<TimerNode>;

    fn next(&mut self) -> Option<NonNull<TimerNode>> {
        let node = self.0?;
        // SAFETY: a taken chain's nodes are live and held by the taker alone; the link is
        // read before the caller acts on the node (and may reuse the link).
        self.0 = unsafe { node.as_ref() }.next_in_chain();
        Some(node)
    }
}

impl Lane {
    pub(crate) fn new() -> Self {
        Self {
            head: CachePadded::new(AtomicPtr::new(std::ptr::null_mut())),
            need: AtomicU64::new(u64::MAX),
            producer: UnsafeCell::new(ProducerSide {
                magazine: Magazine::EMPTY,
                pushes: 0,
                need: u64::MAX,
            }),
            scheduled: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            reset: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        }
    }

    /// Runs `f` on the producer-only state.
    ///
    /// # Safety
    /// Only the lane's producer thread may call this, and not re-entrantly.
    pub(crate) unsafe fn with_producer<R>(&self, f: impl FnOnce(&mut ProducerSide) -> R) -> R {
        // SAFETY: the caller is the single producer, outside any other such call.
        self.producer.with_mut(|side| f(unsafe { &mut *side }))
    }

    /// Whether the producer should claim the lane back before its next push: it has pushed
    /// [`CLAIM_EVERY`] nodes since the last claim. Claiming before a push rather than after
    /// gives the latest timer the time until the next push to be cancelled locally.
    ///
    /// # Safety
    /// Only the producer thread may call this.
    #[inline]
    pub(crate) unsafe fn wants_claim(&self) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe { self.with_producer(|side| side.pushes >= CLAIM_EVERY) }
    }

    /// Pushes a node the caller holds and has marked in transit, that the worker must have
    /// by `need_tick` (`u64::MAX` for no deadline of its own). A push onto an empty lane
    /// starts a new staging, whose need is at most `fresh()`: the horizon by which the
    /// worker takes whatever the lane holds. Returns the lane's need if this push lowered
    /// it: the caller then checks whether the worker must be woken.
    ///
    /// # Safety
    /// Only the producer thread may push; `node` must be live and on no chain.
    pub(crate) unsafe fn push(
        &self,
        node: NonNull<TimerNode>,
        need_tick: u64,
        fresh: impl FnOnce() -> u64,
    ) -> Option<u64> {
        // SAFETY: the caller holds `node`.
        let link = unsafe { TimerNode::link(node) }.as_ptr();
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // SAFETY: `node` is still private to this thread until the swap succeeds.
            unsafe { (*link).next.store(head, Ordering::Relaxed) };
            // SeqCst: with the `need` store and the worker's `wake_at` store it forms the
            // handshake that keeps a sleeping worker from missing this node.
            match self
                .head
                .compare_exchange_weak(head, link, Ordering::SeqCst, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(actual) => head = actual,
            }
        }
        // SAFETY: the caller is the producer thread.
        unsafe {
            self.with_producer(|side| {
                side.pushes += 1;
                let need = if head.is_null() {
                    need_tick.min(fresh())
                } else {
                    side.need.min(need_tick)
                };
                (need != side.need || head.is_null()).then(|| {
                    side.need = need;
                    self.need.store(need, Ordering::SeqCst);
                    need
                })
            })
        }
    }

    /// Takes everything on the lane, as the producer reclaiming it.
    ///
    /// # Safety
    /// Only the producer thread may call this.
    pub(crate) unsafe fn claim(&self) -> Chain {
        // SAFETY: the caller is the producer thread.
        unsafe {
            self.with_producer(|side| {
                side.pushes = 0;
                side.need = u64::MAX;
            })
        };
        self.take()
    }

    /// Takes everything on the lane. Either side may; each node goes to exactly one taker.
    pub(crate) fn take(&self) -> Chain {
        let first = self.head.swap(std::ptr::null_mut(), Ordering::Acquire);
        Chain(NonNull::new(first).map(NonNull::cast))
    }

    /// The tick by which the worker must take this lane, or `None` when it is empty.
    pub(crate) fn need(&self) -> Option<u64> {
        if self.head.load(Ordering::SeqCst).is_null() {
            return None;
        }
        Some(self.need.load(Ordering::SeqCst))
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Closed by its thread and empty: the worker may forget it.
    pub(crate) fn is_finished(&self) -> bool {
        self.closed.load(Ordering::Acquire) && self.head.load(Ordering::Acquire).is_null()
    }

    /// Adds one to a producer-kept count.
    #[inline]
    pub(crate) fn count(counter: &AtomicU64) {
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

// SAFETY: the producer-only state is touched only by the producer thread (callers of the
// `unsafe` methods promise it); everything else is atomic.
unsafe impl Send for Lane {}
// SAFETY: as above.
unsafe impl Sync for Lane {}
