//! One pooled timer, the node a handle names.

use std::ptr::NonNull;

use crate::engine::callback::Callback;
use crate::sync::UnsafeCell;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::mpsc::{Link, Linked};
use crate::sync::timer_state::{Phase, TimerState};
use crate::wheel::location::{Location, NIL};

/// A timer node: `#[repr(C)]` with the link first, so a link pointer is a node pointer, in one
/// 64-byte line.
#[repr(C, align(64))]
pub(crate) struct TimerNode {
    link: Link,
    /// Generation, phase and flags.
    pub(crate) state: TimerState,
    /// The deadline tick (writers: ground rule 2).
    pub(crate) deadline: AtomicU64,
    /// Touched only by the node's holder (ground rule 2).
    links: UnsafeCell<Links>,
    /// The holder's, or a waker timer's `Sleep` under the reset lock (ground rule 2).
    callback: UnsafeCell<Callback>,
}

/// A node's place on its wheel list, or its transit mark.
pub(crate) struct Links {
    /// The node's neighbours while `FILED`, in the low [`INDEX_BITS`]; the high bits hold the
    /// list's location.
    prev: u32,
    next: u32,
}

/// Bits of a node index in a packed link: a pool holds fewer than 2^26 nodes.
pub(crate) const INDEX_BITS: u32 = 26;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;

/// `Links::next` of a node in transit that has outlived one lane claim.
const OUTLIVED_CLAIM: u32 = u32::MAX - 1;

impl Links {
    /// Marks a node just armed as not yet having outlived a lane claim.
    #[inline]
    pub(crate) fn start_transit(&mut self) {
        self.next = 0;
    }

    /// Whether a node in transit had outlived a lane claim before; marks it so now.
    #[inline]
    pub(crate) fn outlive_claim(&mut self) -> bool {
        std::mem::replace(&mut self.next, OUTLIVED_CLAIM) == OUTLIVED_CLAIM
    }

    #[inline]
    fn unpack(raw: u32) -> u32 {
        match raw & INDEX_MASK {
            INDEX_MASK => NIL,
            index => index,
        }
    }

    #[inline]
    fn pack(index: u32, location_half: u32) -> u32 {
        (location_half << INDEX_BITS) | (index & INDEX_MASK)
    }

    /// The list the node is on, and its neighbours there.
    #[inline]
    pub(crate) fn links(&self) -> (Location, u32, u32) {
        let compact = ((self.prev >> INDEX_BITS) << 6) | (self.next >> INDEX_BITS);
        (
            Location::from_compact(compact as u16),
            Self::unpack(self.prev),
            Self::unpack(self.next),
        )
    }

    #[inline]
    pub(crate) fn set_prev(&mut self, prev: u32) {
        self.prev = Self::pack(prev, self.prev >> INDEX_BITS);
    }

    #[inline]
    pub(crate) fn set_next(&mut self, next: u32) {
        self.next = Self::pack(next, self.next >> INDEX_BITS);
    }

    #[inline]
    pub(crate) fn set_links(&mut self, location: Location, prev: u32, next: u32) {
        let compact = u32::from(location.compact());
        self.prev = Self::pack(prev, compact >> 6);
        self.next = Self::pack(next, compact & 0x3F);
    }
}

impl TimerNode {
    pub(crate) fn new() -> Self {
        Self {
            link: Link::new(),
            state: TimerState::new(),
            deadline: AtomicU64::new(0),
            links: UnsafeCell::new(Links {
                prev: INDEX_MASK,
                next: INDEX_MASK,
            }),
            callback: UnsafeCell::new(Callback::EMPTY),
        }
    }

    /// Runs `f` on the node's links.
    ///
    /// # Safety
    /// The caller holds the node (ground rule 2 in [`engine`](crate::engine)).
    #[inline]
    pub(crate) unsafe fn with_links<R>(&self, f: impl FnOnce(&mut Links) -> R) -> R {
        // SAFETY: the caller's hold makes this the only reference.
        self.links.with_mut(|links| f(unsafe { &mut *links }))
    }

    /// Runs `f` on the node's callback.
    ///
    /// # Safety
    /// The caller holds the node, or is its `Sleep` under the reset lock (ground rule 2).
    #[inline]
    pub(crate) unsafe fn with_callback<R>(&self, f: impl FnOnce(&mut Callback) -> R) -> R {
        // SAFETY: the caller's hold makes this the only reference.
        self.callback
            .with_mut(|callback| f(unsafe { &mut *callback }))
    }

    #[inline]
    pub(crate) fn deadline(&self) -> u64 {
        self.deadline.load(Ordering::Acquire)
    }

    /// The next node on whatever chain this node is on.
    #[inline]
    pub(crate) fn next_in_chain(&self) -> Option<NonNull<TimerNode>> {
        NonNull::new(self.link.next.load(Ordering::Acquire)).map(NonNull::cast)
    }

    /// Asks the CPU to bring `node`'s line into this core's cache for writing.
    #[inline]
    pub(crate) fn prefetch_for_write(node: NonNull<TimerNode>) {
        #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
        // Newer Rust declares `_mm_prefetch` safe; the block keeps older compilers building.
        #[allow(unused_unsafe)]
        // SAFETY: a prefetch never faults, whatever the address, and changes only timing.
        unsafe {
            use core::arch::x86_64::{_MM_HINT_ET0, _mm_prefetch};
            _mm_prefetch::<_MM_HINT_ET0>(node.as_ptr().cast::<i8>());
        }
        #[cfg(not(all(target_arch = "x86_64", not(miri), not(loom))))]
        let _ = node;
    }

    #[inline]
    pub(crate) fn set_next_in_chain(&self, next: Option<NonNull<TimerNode>>) {
        let next = next.map_or(std::ptr::null_mut(), |n| n.cast::<Link>().as_ptr());
        self.link.next.store(next, Ordering::Release);
    }
}

// SAFETY: `link` is the first field of a `#[repr(C)]` struct.
unsafe impl Linked for TimerNode {
    unsafe fn link(node: NonNull<Self>) -> NonNull<Link> {
        // SAFETY: `node` is live (caller's contract) and the link is at offset 0.
        unsafe { NonNull::new_unchecked(&raw mut (*node.as_ptr()).link) }
    }

    unsafe fn from_link(link: NonNull<Link>) -> NonNull<Self> {
        link.cast()
    }
}

/// What becomes of a due timer taken off a list.
pub(crate) enum Claim {
    /// Moved to firing: the taker holds it, to run.
    Fired,
    /// Cancelled, left to its cancel's message, which frees it.
    Cancelled,
    /// Not yet: to be filed again at this tick.
    Refile(u64),
}

impl TimerNode {
    /// Claims a filed timer just taken off a due list, as due by `now_tick` (the wheel's holder and
    /// walkers alike).
    pub(crate) fn claim(&self, now_tick: u64) -> Claim {
        loop {
            let seen = self.state.observe();
            match seen.phase() {
                Phase::Cancelled => {
                    self.state.keep_filed();
                    return Claim::Cancelled;
                }
                // A reset is mid-write: look again next tick.
                Phase::Pending if seen.is_locked() => return Claim::Refile(now_tick + 1),
                Phase::Pending => {
                    let deadline = self.deadline();
                    if deadline > now_tick {
                        return Claim::Refile(deadline);
                    }
                    if self.state.try_fire(seen) {
                        return Claim::Fired;
                    }
                }
                phase => {
                    debug_assert!(false, "a {phase:?} timer in the wheel");
                    return Claim::Cancelled;
                }
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    #[test]
    fn a_node_is_one_cache_line() {
        if cfg!(target_pointer_width = "64") {
            assert_eq!(size_of::<super::TimerNode>(), 64);
            assert_eq!(align_of::<super::TimerNode>(), 64);
        }
    }
}
