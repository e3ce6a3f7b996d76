//! What every thread shares about one shard but its held wheel ([`shard`](crate::engine::shard)):
//! the pool, the inbox, the lanes, the worker's wake handshake, the run queue, and what the owner
//! tells would-be stand-ins.

use crossbeam_utils::CachePadded;
use std::ptr::NonNull;
use std::task::Waker;

use crate::engine::counters::ShardCounters;
use crate::engine::due_lists::{DueLists, WALK_BATCH, WALK_LISTS};
use crate::engine::lane::Lane;
use crate::engine::pool::Pool;
use crate::engine::timer_node::TimerNode;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use crate::sync::mpsc::Queue;
use crate::sync::run_queue::RunQueue;
use crate::sync::unmodelled::OnceLock;
use crate::sync::{Arc, Mutex};

/// `wake_at` while the worker is awake: no producer needs to wake it.
pub(crate) const AWAKE: u64 = 0;

/// `last_run` of an owner that has not run a timer yet.
const NEVER_RAN: u64 = u64::MAX;

/// Everything of one shard but its held wheel.
pub(crate) struct ShardState {
    pub(crate) pool: Pool,
    /// Batches forwarded from lanes, and single nodes from threads without a lane.
    pub(crate) inbox: Queue<TimerNode>,
    /// Every open lane into this shard; the worker's copy is refreshed when `lanes_version` moves.
    pub(crate) lanes: Mutex<Vec<Arc<Lane>>>,
    pub(crate) lanes_version: AtomicU64,
    /// The tick the worker plans to wake at, or [`AWAKE`].
    wake_at: CachePadded<AtomicU64>,
    /// The tick by which the worker must take every lane: a reset brought forward a timer still in
    /// transit, whose lane does not know.
    urgent: CachePadded<AtomicU64>,
    /// How often `urgent` was asked for (see
    /// [`ask_again_if_asked_since`](Self::ask_again_if_asked_since)).
    urgent_asked: CachePadded<AtomicU64>,
    /// Recent nanoseconds per callback (0 before any run; owner only): what a backlog is worth.
    callback_ns: AtomicU64,
    /// The worker thread, once it runs (none for engines driven by hand).
    pub(crate) thread: OnceLock<std::thread::Thread>,
    /// A driven engine's driver, woken in place of a worker thread.
    driver: Mutex<Option<Waker>>,
    /// A driver for this shard exists.
    has_driver: AtomicBool,
    pub(crate) counters: ShardCounters,
    /// Timers claimed from the wheel, waiting to run.
    pub(crate) run: RunQueue,
    /// Lists of due timers handed out to any worker.
    pub(crate) hand_outs: DueLists,
    signals: CachePadded<OwnerSignals>,
    /// Workers other than the owner holding or about to take this shard's timers; the last turn
    /// waits for them.
    in_hands: CachePadded<AtomicU64>,
}

/// Written by the owner (`next_due` by the wheel's holder), read by would-be stand-ins.
struct OwnerSignals {
    /// Hand-driven: some thread is turning the shard as its owner.
    busy: AtomicBool,
    /// The tick of the owner's latest look at its wheel.
    heartbeat: AtomicU64,
    /// The owner is running callbacks: only then can it be stuck (standing in for a merely
    /// descheduled owner lets workers on few cores wake each other without end).
    running: AtomicBool,
    /// When the owner last began running timers ([`NEVER_RAN`]: never).
    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    last_run: AtomicU64,
    /// The wheel's next deadline at its latest look (`u64::MAX`: none).
    next_due: AtomicU64,
}

impl ShardState {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            pool: Pool::with_capacity(capacity),
            inbox: Queue::new(),
            lanes: Mutex::new(Vec::new()),
            lanes_version: AtomicU64::new(0),
            wake_at: CachePadded::new(AtomicU64::new(AWAKE)),
            urgent: CachePadded::new(AtomicU64::new(u64::MAX)),
            urgent_asked: CachePadded::new(AtomicU64::new(0)),
            callback_ns: AtomicU64::new(0),
            thread: OnceLock::new(),
            driver: Mutex::new(None),
            has_driver: AtomicBool::new(false),
            counters: ShardCounters::default(),
            run: RunQueue::new(),
            hand_outs: DueLists::new(),
            signals: CachePadded::new(OwnerSignals {
                busy: AtomicBool::new(false),
                heartbeat: AtomicU64::new(0),
                running: AtomicBool::new(false),
                last_run: AtomicU64::new(NEVER_RAN),
                next_due: AtomicU64::new(u64::MAX),
            }),
            in_hands: CachePadded::new(AtomicU64::new(0)),
        }
    }

    /// Gives back the owner's part taken by [`try_own`](Self::try_own).
    pub(crate) fn disown(&self) {
        self.signals.busy.store(false, Ordering::SeqCst);
    }

    /// Takes the owner's part for one hand-driven turn; `false` if another thread has it.
    pub(crate) fn try_own(&self) -> bool {
        self.signals
            .busy
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
    }

    /// The owner looked at its wheel at `tick`.
    pub(crate) fn beat(&self, tick: u64) {
        self.signals.heartbeat.store(tick, Ordering::Release);
    }

    /// The tick of the owner's latest look at its wheel.
    pub(crate) fn heartbeat(&self) -> u64 {
        self.signals.heartbeat.load(Ordering::Acquire)
    }

    /// The owner began running timers at `tick`.
    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    pub(crate) fn mark_run(&self, tick: u64) {
        self.signals.last_run.store(tick, Ordering::Relaxed);
    }

    /// Whether the owner began running timers within `linger` ticks of `now_tick`.
    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    pub(crate) fn ran_within(&self, linger: u64, now_tick: u64) -> bool {
        let last = self.signals.last_run.load(Ordering::Relaxed);
        last != NEVER_RAN && last.saturating_add(linger) >= now_tick
    }

    /// The owner begins or ends running its timers' callbacks.
    pub(crate) fn set_running(&self, running: bool) {
        self.signals.running.store(running, Ordering::SeqCst);
    }

    pub(crate) fn is_running(&self) -> bool {
        self.signals.running.load(Ordering::SeqCst)
    }

    /// The wheel's holder records the wheel's next deadline.
    pub(crate) fn publish_next_due(&self, tick: u64) {
        self.signals.next_due.store(tick, Ordering::Release);
    }

    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    pub(crate) fn next_due(&self) -> u64 {
        self.signals.next_due.load(Ordering::Acquire)
    }

    /// Running callbacks without looking at its wheel for more than `after` ticks: stuck.
    pub(crate) fn is_stuck(&self, now_tick: u64, after: u64) -> bool {
        self.is_running() && now_tick > self.heartbeat().saturating_add(after)
    }

    /// A worker other than the owner is about to take this shard's timers; `false` once shutdown
    /// has begun.
    pub(crate) fn enter_hands(&self, shutdown: &AtomicBool) -> bool {
        self.in_hands.fetch_add(1, Ordering::SeqCst);
        // Pairs with the fence in `wait_for_hands`: either the last turn sees this worker, or this
        // worker sees the shutdown (the SeqCst accesses alone do not give that order).
        fence(Ordering::SeqCst);
        if shutdown.load(Ordering::SeqCst) {
            self.leave_hands();
            return false;
        }
        true
    }

    pub(crate) fn leave_hands(&self) {
        self.in_hands.fetch_sub(1, Ordering::SeqCst);
    }

    /// Walks one batch of the handed-out lists and, still in the shard's hands, calls `run` with
    /// what it claimed and the tick it was due by. Returns whether it found a list to walk.
    pub(crate) fn walk_hand_outs(
        &self,
        shutdown: &AtomicBool,
        walker: usize,
        run: impl FnOnce(&[u32], u64),
    ) -> bool {
        if !self.hand_outs.is_open() || !self.enter_hands(shutdown) {
            return false;
        }
        let mut batch = [0_u32; WALK_BATCH];
        let walked = self
            .hand_outs
            .walk(&self.pool, &mut batch, walker * WALK_LISTS);
        if let Some((claimed, due)) = walked
            && claimed > 0
        {
            run(&batch[..claimed], due);
        }
        self.leave_hands();
        walked.is_some()
    }

    /// Waits until no other worker holds this shard's timers; the caller has set the shutdown flag.
    pub(crate) fn wait_for_hands(&self) {
        // Orders the shutdown flag before the reads of `in_hands` (see `enter_hands`).
        fence(Ordering::SeqCst);
        crate::sync::wait_until(|| (self.in_hands.load(Ordering::SeqCst) == 0).then_some(()));
    }

    /// Opens a lane into this shard for the calling thread.
    pub(crate) fn open_lane(&self) -> Arc<Lane> {
        let lane = Arc::new(Lane::new());
        self.lanes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::clone(&lane));
        self.lanes_version.fetch_add(1, Ordering::AcqRel);
        lane
    }

    /// Tells the worker a lane was closed, so that it drops the lane once empty.
    pub(crate) fn lane_closed(&self) {
        self.lanes_version.fetch_add(1, Ordering::AcqRel);
        self.wake_for(0);
    }

    /// Wakes the worker if it plans to sleep past `need`. The fence pairs with the worker's after
    /// storing `wake_at`: either it sees what the caller published, or the caller sees its plan.
    #[inline]
    pub(crate) fn wake_for(&self, need: u64) {
        fence(Ordering::SeqCst);
        if need < self.wake_at.load(Ordering::SeqCst)
            && self.wake_at.swap(AWAKE, Ordering::SeqCst) != AWAKE
        {
            match self.thread.get() {
                Some(thread) => thread.unpark(),
                None => self.wake_driver(),
            }
        }
    }

    /// A driver stores its current waker, before it publishes its plan.
    pub(crate) fn register_driver(&self, waker: &Waker) {
        let mut driver = self.driver.lock().unwrap_or_else(|p| p.into_inner());
        if !driver
            .as_ref()
            .is_some_and(|stored| stored.will_wake(waker))
        {
            *driver = Some(waker.clone());
        }
    }

    /// Makes this shard's driver unless one exists (only one waker is kept).
    pub(crate) fn claim_driver(&self) -> bool {
        !self.has_driver.swap(true, Ordering::AcqRel)
    }

    /// The shard's driver is dropped: another may be made.
    pub(crate) fn release_driver(&self) {
        self.has_driver.store(false, Ordering::Release);
    }

    /// Wakes a driven shard's driver, if it has been polled.
    pub(crate) fn wake_driver(&self) {
        // Woken outside the lock: a waker may run its task's poll inline.
        let waker = self
            .driver
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Lowers the tick by which the worker must take every lane, waking it for that.
    pub(crate) fn make_urgent(&self, need: u64) {
        self.urgent_asked.fetch_add(1, Ordering::SeqCst);
        self.urgent.fetch_min(need, Ordering::SeqCst);
        self.wake_for(need);
    }

    /// Folds `callbacks` run in `took` into the recent average.
    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    pub(crate) fn note_run(&self, callbacks: usize, took: std::time::Duration) {
        if callbacks == 0 {
            return;
        }
        let sample = u64::try_from(took.as_nanos() / callbacks as u128).unwrap_or(u64::MAX);
        let average = match self.callback_ns.load(Ordering::Relaxed) {
            0 => sample,
            before => before - before / 4 + sample / 4,
        };
        // One writer: a plain store.
        self.callback_ns.store(average.max(1), Ordering::Relaxed);
    }

    /// Recent nanoseconds per callback; 0 before any run.
    pub(crate) fn callback_ns(&self) -> u64 {
        self.callback_ns.load(Ordering::Relaxed)
    }

    /// How many times [`make_urgent`](Self::make_urgent) has been called.
    pub(crate) fn urgent_asked(&self) -> u64 {
        self.urgent_asked.load(Ordering::SeqCst)
    }

    /// A producer published pending timers it cannot look at again, having read
    /// [`urgent_asked`](Self::urgent_asked) as `asked` first: if urgency was asked since, ask again
    /// at `now`, as the worker may have spent the urgent tick.
    pub(crate) fn ask_again_if_asked_since(&self, asked: u64, now: u64) {
        // Pairs with the fence in `take_urgent`: an ask not seen here comes after this publish, and
        // its take sees it.
        fence(Ordering::SeqCst);
        if self.urgent_asked() != asked {
            self.make_urgent(now);
        }
    }

    /// The worker takes the urgent tick if it has come, leaving a later one.
    pub(crate) fn take_urgent(&self, now: u64) -> bool {
        let urgent = self.urgent.swap(u64::MAX, Ordering::SeqCst);
        if urgent > now {
            if urgent != u64::MAX {
                self.urgent.fetch_min(urgent, Ordering::SeqCst);
            }
            return false;
        }
        // Pairs with the fence in `ask_again_if_asked_since`.
        fence(Ordering::SeqCst);
        true
    }

    /// The urgent tick, if any.
    pub(crate) fn urgent(&self) -> u64 {
        self.urgent.load(Ordering::SeqCst)
    }

    /// When the worker means to wake next, or [`AWAKE`]: a hint for lanes' needs.
    #[inline]
    pub(crate) fn planned_wake(&self) -> u64 {
        self.wake_at.load(Ordering::Relaxed)
    }

    /// The worker's plan, SeqCst (see
    /// [`IdleWorkers::running`](crate::engine::idle_workers::IdleWorkers::running)).
    pub(crate) fn wake_plan(&self) -> u64 {
        self.wake_at.load(Ordering::SeqCst)
    }

    /// The worker publishes when it means to wake next ([`AWAKE`] once it is up).
    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    pub(crate) fn plan_wake(&self, tick: u64) {
        self.wake_at.store(tick, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Pushes a node that has no lane to travel on.
    ///
    /// # Safety
    /// `node` must be live, held by the caller, and marked in transit.
    pub(crate) unsafe fn send_direct(&self, node: NonNull<TimerNode>, need: u64) {
        // SAFETY: forwarded from the caller.
        unsafe { self.inbox.push(node) };
        self.wake_for(need);
    }
}
