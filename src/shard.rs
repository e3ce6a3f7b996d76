//! What every thread shares about one shard: its node pool, its inbox, the lanes threads
//! have opened into it, the handshake that wakes its worker, its wheel (behind a hand-over
//! flag, so that another worker can stand in for a stuck owner) and its run queue of
//! claimed timers.

use std::ptr::NonNull;
use std::sync::OnceLock;

use crossbeam_utils::CachePadded;

use crate::lane::Lane;
use crate::mpsc::Queue;
use crate::pool::Pool;
use crate::run_queue::RunQueue;
use crate::shard_counters::ShardCounters;
use crate::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering, fence};
use crate::sync::{Arc, Mutex, UnsafeCell};
use crate::ticks::Ticks;
use crate::timer_node::TimerNode;
use crate::worker::{Extracted, Worker};

/// `wake_at` while the worker is awake: no producer needs to wake it.
pub(crate) const AWAKE: u64 = 0;

/// In `wheel_hold`: a thread holds the wheel side.
const HELD: u8 = 1;
/// In `wheel_hold`, only with [`HELD`]: a sweep is asked of the holder.
const SWEEP: u8 = 2;

/// `last_run` of an owner that has not run a timer yet.
const NEVER_RAN: u64 = u64::MAX;

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
    /// The wheel side, touched only by the thread whose [`HELD`] bit is in `wheel_hold`.
    wheel: UnsafeCell<Worker>,
    /// [`HELD`] while a thread holds the wheel side, with [`SWEEP`] when a thread that
    /// pushed after the last turn may have begun asks the holder to sweep before letting
    /// go (see [`settle_after_shutdown`](Self::settle_after_shutdown)). One word, changed
    /// only by read-modify-writes, so a request and a release cannot miss each other.
    wheel_hold: CachePadded<AtomicU8>,
    /// Timers claimed from the wheel, waiting to run.
    pub(crate) run: RunQueue,
    signals: CachePadded<OwnerSignals>,
    /// Workers other than the owner that are running, or about to take, this shard's
    /// timers; the owner's last turn waits for them.
    in_hands: CachePadded<AtomicU64>,
}

/// What a shard's owner tells the workers that might stand in for it: written by the owner
/// (and `next_due` by the wheel's holder), read by the others while they look for work.
struct OwnerSignals {
    /// For an engine driven by hand: some thread is turning the shard as its owner.
    busy: AtomicBool,
    /// The tick of the owner's latest look at its wheel.
    heartbeat: AtomicU64,
    /// The owner is running its timers' callbacks: only then can it be stuck in one. An
    /// owner that is merely awake looks at its wheel again within moments, unless the
    /// operating system has not scheduled it; standing in for such owners made hundreds of
    /// workers on a few cores wake each other without end.
    running: AtomicBool,
    /// The tick at which the owner last began running timers ([`NEVER_RAN`]: never).
    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    last_run: AtomicU64,
    /// The wheel's next deadline at its latest look (`u64::MAX`: none).
    next_due: AtomicU64,
}

// SAFETY: every field is shared through atomics, locks or lock-free queues, except `wheel`,
// which only the thread whose `HELD` bit is in `wheel_hold` touches (see `with_wheel`).
unsafe impl Sync for Shard {}

impl Shard {
    pub(crate) fn new(capacity: usize, ticks: Ticks) -> Self {
        Self {
            pool: Pool::with_capacity(capacity),
            inbox: Queue::new(),
            lanes: Mutex::new(Vec::new()),
            lanes_version: AtomicU64::new(0),
            wake_at: CachePadded::new(AtomicU64::new(AWAKE)),
            urgent: CachePadded::new(AtomicU64::new(u64::MAX)),
            thread: OnceLock::new(),
            counters: ShardCounters::default(),
            wheel: UnsafeCell::new(Worker::new(ticks)),
            wheel_hold: CachePadded::new(AtomicU8::new(0)),
            run: RunQueue::new(),
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

    /// Runs `f` on the wheel side if no other thread holds it; `None` if one does. Nobody
    /// waits long for the wheel: a holder only files and claims timers, never runs
    /// callbacks.
    pub(crate) fn with_wheel<R>(&self, f: impl FnOnce(&mut Worker) -> R) -> Option<R> {
        self.try_hold_wheel().then(|| self.held_wheel(f))
    }

    /// [`with_wheel`](Self::with_wheel) for the owner, which waits out a stand-in's short
    /// hold.
    pub(crate) fn with_wheel_waiting<R>(&self, f: impl FnOnce(&mut Worker) -> R) -> R {
        let mut attempts = 0;
        while !self.try_hold_wheel() {
            attempts += 1;
            crate::sync::spin_or_yield(attempts);
        }
        self.held_wheel(f)
    }

    fn try_hold_wheel(&self) -> bool {
        self.wheel_hold
            .compare_exchange(0, HELD, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Runs `f` on the wheel this thread has just come to hold, then lets it go.
    fn held_wheel<R>(&self, f: impl FnOnce(&mut Worker) -> R) -> R {
        // SAFETY: this thread holds the wheel (`try_hold_wheel` succeeded), so it is the
        // wheel's only holder until `let_go_of_wheel`, and its Acquire pairs with the
        // previous holder's release.
        let result = self.wheel.with_mut(|wheel| f(unsafe { &mut *wheel }));
        self.let_go_of_wheel();
        result
    }

    /// Lets the wheel go, first sweeping it for each thread that asked while this one held
    /// it. The release only succeeds on a word with no request in it, so a request made
    /// before it is seen here, and one made after it takes the wheel itself.
    fn let_go_of_wheel(&self) {
        // Acquire on failure: the request was made after its maker's push, which the sweep
        // must see.
        while self
            .wheel_hold
            .compare_exchange(HELD, 0, Ordering::Release, Ordering::Acquire)
            .is_err()
        {
            // A read-modify-write, so that a request made meanwhile stays in the word (and
            // fails the next release, whose Acquire then orders its push before a sweep).
            self.wheel_hold.fetch_and(!SWEEP, Ordering::Relaxed);
            // SAFETY: this thread still holds the wheel.
            self.wheel
                .with_mut(|wheel| unsafe { &mut *wheel }.sweep(self));
        }
    }

    /// Called by a thread that pushed a node onto one of this shard's lanes or its inbox,
    /// and then saw the engine shutting down: once the shard's last turn is over nobody
    /// takes what is pushed, so it sweeps the wheel side itself, or, if another thread
    /// holds the wheel, leaves the sweep to that thread's release. Never waits.
    pub(crate) fn settle_after_shutdown(&self) {
        // Release: the holder that sees the request sees the push before it. Acquire: a
        // thread that takes the wheel here follows the last holder's release.
        let before = self.wheel_hold.fetch_or(HELD | SWEEP, Ordering::AcqRel);
        if before & HELD == 0 {
            // This thread holds the wheel now, with its own request in the word.
            self.let_go_of_wheel();
        }
    }

    /// The owner's look at its wheel at `now` (tick `now_tick`): claims what is due, waiting
    /// out a stand-in's hold, and records the look as the owner's heartbeat.
    pub(crate) fn owner_look(&self, now: std::time::Instant, now_tick: u64) -> Extracted {
        let look = self.with_wheel_waiting(|wheel| wheel.extract(self, now));
        self.beat(now_tick);
        look
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

    /// Whether the owner began running timers within `linger` ticks before `now_tick`.
    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    pub(crate) fn ran_within(&self, linger: u64, now_tick: u64) -> bool {
        let last = self.signals.last_run.load(Ordering::Relaxed);
        last != NEVER_RAN && last.saturating_add(linger) >= now_tick
    }

    /// The owner begins (`true`) or ends a spell of running its timers' callbacks.
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

    /// Whether the owner is running callbacks and has not looked at its wheel for more
    /// than `after` ticks: it is stuck in a callback, and another worker may stand in for
    /// it.
    pub(crate) fn is_stuck(&self, now_tick: u64, after: u64) -> bool {
        self.is_running() && now_tick > self.heartbeat().saturating_add(after)
    }

    /// A worker other than the owner is about to take this shard's timers. `false` (and
    /// nothing taken) once shutdown has begun: the owner's last turn settles them.
    pub(crate) fn enter_hands(&self, shutdown: &AtomicBool) -> bool {
        self.in_hands.fetch_add(1, Ordering::SeqCst);
        if shutdown.load(Ordering::SeqCst) {
            self.leave_hands();
            return false;
        }
        true
    }

    pub(crate) fn leave_hands(&self) {
        self.in_hands.fetch_sub(1, Ordering::SeqCst);
    }

    /// Waits until no other worker holds this shard's timers; the caller has set the
    /// shutdown flag, so none will take more.
    pub(crate) fn wait_for_hands(&self) {
        let mut attempts = 0;
        while self.in_hands.load(Ordering::SeqCst) != 0 {
            attempts += 1;
            crate::sync::spin_or_yield(attempts);
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
