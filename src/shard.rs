//! What every thread shares about one shard: its node pool, its inbox, the lanes threads
//! have opened into it, and the handshake that wakes its worker.

use std::ptr::NonNull;
use std::sync::OnceLock;

use crossbeam_utils::CachePadded;

use crate::lane::Lane;
use crate::mpsc::Queue;
use crate::pool::Pool;
use crate::shard_counters::ShardCounters;
use crate::sync::atomic::{AtomicU64, Ordering, fence};
use crate::sync::{Arc, Mutex};
use crate::timer_node::TimerNode;

/// `wake_at` while the worker is awake: no producer needs to wake it.
pub(crate) const AWAKE: u64 = 0;

/// One shard, as seen from any thread.
pub(crate) struct Shard {
    pub(crate) pool: Pool,
    /// Batches forwarded from lanes, and single nodes from threads without a lane.
    pub(crate) inbox: Queue<TimerNode>,
    /// Every open lane into this shard; the worker keeps its own copy, refreshed when
    /// `lanes_version` moves.
    pub(crate) lanes: Mutex<Vec<Arc<Lane>>>,
    pub(crate) lanes_version: AtomicU64,
    /// The tick the worker plans to wake at, or [`AWAKE`].
    wake_at: CachePadded<AtomicU64>,
    /// The earliest tick by which the worker must take every lane, lowered by a reset that
    /// brings forward a timer still in transit (the lane it sits on does not know).
    urgent: CachePadded<AtomicU64>,
    /// The worker thread, once it runs (engines driven by hand have none).
    pub(crate) thread: OnceLock<std::thread::Thread>,
    pub(crate) counters: ShardCounters,
}

impl Shard {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            pool: Pool::with_capacity(capacity),
            inbox: Queue::new(),
            lanes: Mutex::new(Vec::new()),
            lanes_version: AtomicU64::new(0),
            wake_at: CachePadded::new(AtomicU64::new(AWAKE)),
            urgent: CachePadded::new(AtomicU64::new(u64::MAX)),
            thread: OnceLock::new(),
            counters: ShardCounters::default(),
        }
    }

    /// Opens a lane into this shard for the calling thread.
    pub(crate) fn open_lane(&self) -> Arc<Lane> {
        let lane = Arc::new(Lane::new());
        self.lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(Arc::clone(&lane));
        self.lanes_version.fetch_add(1, Ordering::AcqRel);
        lane
    }

    /// Tells the worker a lane was closed, so that it drops the lane once empty.
    pub(crate) fn lane_closed(&self) {
        self.lanes_version.fetch_add(1, Ordering::AcqRel);
        self.wake_for(0);
    }

    /// Wakes the worker if it plans to sleep past `need` (a tick). The fence pairs with the
    /// worker's between storing `wake_at` and looking for work: either the worker sees what
    /// the caller published before this call, or the caller sees the worker's plan.
    #[inline]
    pub(crate) fn wake_for(&self, need: u64) {
        fence(Ordering::SeqCst);
        if need < self.wake_at.load(Ordering::SeqCst)
            && self.wake_at.swap(AWAKE, Ordering::SeqCst) != AWAKE
            && let Some(thread) = self.thread.get()
        {
            thread.unpark();
        }
    }

    /// Lowers the tick by which the worker must take every lane, and wakes it for that.
    pub(crate) fn make_urgent(&self, need: u64) {
        self.urgent.fetch_min(need, Ordering::SeqCst);
        self.wake_for(need);
    }

    /// The worker takes the urgent tick if it has come (`<= now`), leaving a later one.
    pub(crate) fn take_urgent(&self, now: u64) -> bool {
        let urgent = self.urgent.swap(u64::MAX, Ordering::SeqCst);
        if urgent > now {
            if urgent != u64::MAX {
                self.urgent.fetch_min(urgent, Ordering::SeqCst);
            }
            return false;
        }
        true
    }

    /// The urgent tick, if any.
    pub(crate) fn urgent(&self) -> u64 {
        self.urgent.load(Ordering::SeqCst)
    }

    /// The worker publishes when it means to wake next ([`AWAKE`] once it is up).
    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    pub(crate) fn plan_wake(&self, tick: u64) {
        self.wake_at.store(tick, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Pushes a node that has no lane to travel on (its thread has no context any more).
    ///
    /// # Safety
    /// `node` must be live, held by the caller, and marked in transit.
    pub(crate) unsafe fn send_direct(&self, node: NonNull<TimerNode>, need: u64) {
        // SAFETY: forwarded from the caller.
        unsafe { self.inbox.push(node) };
        self.wake_for(need);
    }
}
