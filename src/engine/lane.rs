//! A lane: where one thread stages what it sends to one shard, so that a timer armed and
//! cancelled in quick succession never crosses to another core.
//!
//! Three lock-free stacks, each emptied whole with one swap: by the producer every
//! [`CLAIM_EVERY`] pushes (recycling what it cancelled, forwarding the rest on the
//! [`forward_ring`](crate::engine::forward_ring)), or by the worker once the stack's `need`
//! tick comes. Only the producer pushes.
//!
//! New timers go on the young stack; a claim keeps pending ones there one more claim, then
//! parks those not due soon on the current old generation. Every [`OLD_HORIZON`] ticks the
//! generations rotate and the producer takes back the one closed a whole horizon, so a
//! timer cancelled within one to two horizons is recycled by its own thread.

use std::ptr::NonNull;

use crossbeam_utils::CachePadded;

use crate::engine::forward_ring::ForwardRing;
use crate::engine::pool::Magazine;
use crate::engine::timer_node::TimerNode;
use crate::sync::UnsafeCell;
use crate::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use crate::sync::mpsc::{Link, Linked, link_after};
pub(crate) use crate::tuning::{CLAIM_EVERY, OLD_HORIZON};

/// A stack both sides empty whole, with the tick by which the worker must take it.
struct Staging {
    head: CachePadded<AtomicPtr<Link>>,
    /// Written by the producer only; meaningful while `head` is non-null.
    need: AtomicU64,
}

impl Staging {
    fn new() -> Self {
        Self {
            head: CachePadded::new(AtomicPtr::new(std::ptr::null_mut())),
            need: AtomicU64::new(u64::MAX),
        }
    }

    /// Pushes the chain `first..=last`, needed by `need`; a stack this starts is needed by
    /// `start()` at the latest. Returns the stack's need if this changed it, for the caller to
    /// wake the worker.
    ///
    /// # Safety
    /// Only the producer pushes; the chain's nodes are live, the caller's, on no other chain.
    unsafe fn push(
        &self,
        first: NonNull<TimerNode>,
        last: NonNull<TimerNode>,
        need: u64,
        start: impl FnOnce() -> u64,
    ) -> Option<u64> {
        // SAFETY: ground rule 2: the caller holds the nodes.
        let (first, last) = unsafe { (TimerNode::link(first).as_ptr(), TimerNode::link(last)) };
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // SAFETY: `last` is still private to this thread until the swap succeeds.
            unsafe { last.as_ref().next.store(head, Ordering::Relaxed) };
            // SeqCst: with the `need` store and the worker's `wake_at` store, the handshake
            // that keeps a sleeping worker from missing these nodes.
            match self
                .head
                .compare_exchange_weak(head, first, Ordering::SeqCst, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(actual) => head = actual,
            }
        }
        let was_empty = head.is_null();
        let published = self.need.load(Ordering::Relaxed);
        let need = if was_empty {
            need.min(start())
        } else {
            published.min(need)
        };
        (need != published || was_empty).then(|| {
            self.need.store(need, Ordering::SeqCst);
            need
        })
    }

    fn take(&self) -> Option<NonNull<TimerNode>> {
        NonNull::new(self.head.swap(std::ptr::null_mut(), Ordering::SeqCst)).map(NonNull::cast)
    }

    fn need(&self) -> Option<u64> {
        if self.head.load(Ordering::SeqCst).is_null() {
            return None;
        }
        Some(self.need.load(Ordering::SeqCst))
    }

    fn is_empty(&self) -> bool {
        self.head.load(Ordering::Acquire).is_null()
    }
}

/// One thread's lane into one shard.
pub(crate) struct Lane {
    young: Staging,
    old: [Staging; 2],
    /// Where the producer forwards timers to the owner, as indices.
    pub(crate) forward: ForwardRing,
    producer: UnsafeCell<ProducerSide>,
    /// Counts the producer keeps (single writer: load and store).
    pub(crate) scheduled: AtomicU64,
    pub(crate) cancelled: AtomicU64,
    pub(crate) reset: AtomicU64,
    /// Panics caught dropping the callbacks of timers this thread recycled.
    pub(crate) panicked: AtomicU64,
    /// The thread has exited; the worker drops the lane once it is empty.
    closed: AtomicBool,
    /// The producer holds nodes taken off this lane ([`Lane::enter`]).
    busy: AtomicBool,
}

/// State only the producer thread touches.
pub(crate) struct ProducerSide {
    /// Free nodes of this lane's shard, ready to arm.
    pub(crate) magazine: Magazine,
    pushes: u32,
    /// Which old generation collects parked timers now.
    old_current: usize,
    /// When the current generation closes and the other is taken back.
    rotate_at: u64,
}

/// Nodes taken off a lane: up to three chains, one after another.
pub(crate) struct Chain([Option<NonNull<TimerNode>>; 3]);

impl Chain {
    fn one(first: Option<NonNull<TimerNode>>) -> Self {
        Self([first, None, None])
    }
}

impl Iterator for Chain {
    type Item = NonNull<TimerNode>;

    fn next(&mut self) -> Option<NonNull<TimerNode>> {
        let slot = self.0.iter_mut().find(|head| head.is_some())?;
        let node = (*slot)?;
        // SAFETY: a taken chain's nodes are the taker's (rule 2); read before it reuses them.
        *slot = unsafe { node.as_ref() }.next_in_chain();
        Some(node)
    }
}

/// Builds a chain of nodes this thread holds, remembering the earliest need among them.
#[derive(Default)]
pub(crate) struct ChainBuilder {
    ends: Option<(NonNull<TimerNode>, NonNull<TimerNode>)>,
    earliest: u64,
}

impl ChainBuilder {
    /// Appends a node the caller holds, on no chain, needed by tick `need`.
    pub(crate) fn push(&mut self, node: NonNull<TimerNode>, need: u64) {
        self.ends = Some(match self.ends {
            None => {
                self.earliest = need;
                (node, node)
            }
            Some((first, last)) => {
                // SAFETY: both are held by this thread and on no queue.
                unsafe { link_after(last, node) };
                self.earliest = self.earliest.min(need);
                (first, node)
            }
        });
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ends.is_none()
    }

    pub(crate) fn into_chain(self) -> Chain {
        if let Some((_, last)) = self.ends {
            // SAFETY: the caller holds every node of the chain.
            unsafe { last.as_ref() }.set_next_in_chain(None);
        }
        Chain::one(self.ends.map(|(first, _)| first))
    }

    /// The chain's first and last nodes and earliest need, unless it is empty.
    pub(crate) fn finish(self) -> Option<(NonNull<TimerNode>, NonNull<TimerNode>, u64)> {
        self.ends.map(|(first, last)| (first, last, self.earliest))
    }
}

impl Lane {
    pub(crate) fn new() -> Self {
        Self {
            young: Staging::new(),
            old: [Staging::new(), Staging::new()],
            forward: ForwardRing::new(),
            producer: UnsafeCell::new(ProducerSide {
                magazine: Magazine::EMPTY,
                pushes: 0,
                old_current: 0,
                rotate_at: 0,
            }),
            scheduled: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            reset: AtomicU64::new(0),
            panicked: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            busy: AtomicBool::new(false),
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

    /// Whether [`CLAIM_EVERY`] pushes have passed since the last claim (checked before a push, so
    /// the latest timer can still be cancelled locally).
    ///
    /// # Safety
    /// Only the producer thread may call this.
    #[inline]
    pub(crate) unsafe fn wants_claim(&self) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe { self.with_producer(|side| side.pushes >= CLAIM_EVERY) }
    }

    /// Pushes a node the caller holds, needed by `need_tick` (`u64::MAX`: none), as
    /// [`Staging::push`] with `fresh` as `start`.
    ///
    /// # Safety
    /// Only the producer thread may push; `node` must be live and on no chain.
    pub(crate) unsafe fn push(
        &self,
        node: NonNull<TimerNode>,
        need_tick: u64,
        fresh: impl FnOnce() -> u64,
    ) -> Option<u64> {
        // SAFETY: forwarded from the caller.
        unsafe { self.with_producer(|side| side.pushes += 1) };
        // SAFETY: forwarded from the caller.
        unsafe { self.requeue(node, node, need_tick, fresh) }
    }

    /// Pushes a chain back onto the young stack, not counted towards the next claim.
    ///
    /// # Safety
    /// Only the producer calls this; the chain is live, the caller's, on no other chain.
    pub(crate) unsafe fn requeue(
        &self,
        first: NonNull<TimerNode>,
        last: NonNull<TimerNode>,
        need_tick: u64,
        fresh: impl FnOnce() -> u64,
    ) -> Option<u64> {
        // SAFETY: forwarded from the caller.
        unsafe { self.young.push(first, last, need_tick, fresh) }
    }

    /// Takes the young stack, as the producer reclaiming it.
    ///
    /// # Safety
    /// Only the producer thread may call this.
    pub(crate) unsafe fn claim(&self) -> Chain {
        // SAFETY: the caller is the producer thread.
        unsafe { self.with_producer(|side| side.pushes = 0) };
        Chain::one(self.young.take())
    }

    /// Moves a chain of pending timers, due no sooner than `earliest`, onto the current old
    /// generation, needed by `quiet` at the latest.
    ///
    /// # Safety
    /// As for [`requeue`](Self::requeue).
    pub(crate) unsafe fn park(
        &self,
        first: NonNull<TimerNode>,
        last: NonNull<TimerNode>,
        earliest: u64,
        quiet: u64,
    ) -> Option<u64> {
        // SAFETY: the caller is the producer thread.
        let current = unsafe { self.with_producer(|side| side.old_current) };
        // SAFETY: forwarded from the caller.
        unsafe { self.old[current].push(first, last, earliest, || quiet) }
    }

    /// Every [`OLD_HORIZON`] ticks: closes the current old generation, takes back the other.
    ///
    /// # Safety
    /// Only the producer thread may call this.
    pub(crate) unsafe fn claim_old_if_due(&self, now: u64) -> Chain {
        // SAFETY: the caller is the producer thread.
        let aged = unsafe {
            self.with_producer(|side| {
                if now < side.rotate_at {
                    return None;
                }
                side.old_current = 1 - side.old_current;
                side.rotate_at = now.saturating_add(OLD_HORIZON);
                Some(side.old_current)
            })
        };
        Chain::one(aged.and_then(|aged| self.old[aged].take()))
    }

    /// Takes everything on the lane: the worker, or the producer closing it.
    pub(crate) fn take(&self) -> Chain {
        Chain([self.young.take(), self.old[0].take(), self.old[1].take()])
    }

    /// The worker's take: only the stacks whose need has come (all with `all`): parked timers must
    /// not reach the wheel before their thread could cancel them. A stale need makes a take early
    /// (harmless) or late (covered by the push's handshake).
    pub(crate) fn take_due(&self, now: u64, all: bool) -> Chain {
        if all {
            return self.take();
        }
        let due = |staging: &Staging| {
            staging
                .need()
                .is_some_and(|need| need <= now)
                .then(|| staging.take())
                .flatten()
        };
        Chain([due(&self.young), due(&self.old[0]), due(&self.old[1])])
    }

    /// The tick by which the worker must take this lane, if any.
    pub(crate) fn need(&self) -> Option<u64> {
        [
            self.young.need(),
            self.old[0].need(),
            self.old[1].need(),
            self.forward.need(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The producer is about to take nodes off the lane; `false` when shutting down (the nodes stay
    /// for the last turn). Pairs with the shutdown's flag store and the last turn's fenced wait for
    /// no lane busy.
    pub(crate) fn enter(&self, shutdown: &AtomicBool) -> bool {
        self.busy.store(true, Ordering::SeqCst);
        crate::sync::atomic::fence(Ordering::SeqCst);
        if shutdown.load(Ordering::SeqCst) {
            self.busy.store(false, Ordering::Release);
            return false;
        }
        true
    }

    /// The producer has put back every node it took.
    pub(crate) fn leave(&self) {
        self.busy.store(false, Ordering::Release);
    }

    pub(crate) fn is_busy(&self) -> bool {
        self.busy.load(Ordering::SeqCst)
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Closed by its thread and empty: the worker may forget it.
    pub(crate) fn is_finished(&self) -> bool {
        self.closed.load(Ordering::Acquire)
            && self.young.is_empty()
            && self.old.iter().all(Staging::is_empty)
            && self.forward.is_empty()
    }

    #[inline]
    pub(crate) fn count(counter: &AtomicU64) {
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

// SAFETY: ground rule 3: only the producer thread touches the producer-only state; the rest is
// atomic.
unsafe impl Send for Lane {}
// SAFETY: as above.
unsafe impl Sync for Lane {}
