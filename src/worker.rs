//! A shard's owner: the only thread that touches the shard's wheel. Each turn it takes what
//! has come due on the lanes, drains the inbox, fires due timers and gives freed nodes
//! back to the pool.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::time::Instant;

use crate::geometry::Geometry;
use crate::lane::Lane;
use crate::mpsc::Pop;
use crate::pool::FiledNodes;
use crate::pool::{BATCH, Magazine};
use crate::shard::Shard;
use crate::shard_counters::bump;
use crate::sync::Arc;
use crate::sync::atomic::Ordering;
use crate::ticks::Ticks;
use crate::timer_node::TimerNode;
use crate::timer_state::{AfterFire, Phase, Received};
use crate::wheel_core::WheelCore;

/// What pending timers get at shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingTimers {
    /// Run every pending timer's callback once, now, on its worker (early, by the
    /// caller's choice); repeating timers run once more and stop.
    Run,
    /// Drop every pending timer's callback without running it.
    Drop,
}

/// The owner side of one shard.
pub(crate) struct Worker {
    wheel: WheelCore,
    ticks: Ticks,
    /// Nodes freed this turn, on their way back to the pool.
    freed: Magazine,
    lanes: Vec<Arc<Lane>>,
    lanes_version: u64,
}

/// The outcome of one turn.
pub(crate) struct Turn {
    /// Callback runs.
    pub(crate) fired: usize,
    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    /// The tick by which the worker must turn again: the wheel's next deadline, or a lane's
    /// need; `None` when nothing will ever be due.
    pub(crate) next: Option<u64>,
}

impl Worker {
    pub(crate) fn new(ticks: Ticks) -> Self {
        Self {
            wheel: WheelCore::new(ticks, Geometry::DEFAULT),
            ticks,
            freed: Magazine::EMPTY,
            lanes: Vec::new(),
            lanes_version: u64::MAX,
        }
    }

    /// One turn at `now`.
    pub(crate) fn turn(&mut self, shard: &Shard, now: Instant) -> Turn {
        let now_tick = self.ticks.floor(now);
        self.refresh_lanes(shard);
        let all_lanes = shard.take_urgent(now_tick);
        self.collect(shard, now_tick, all_lanes);
        let fired = self.fire_due(shard, now, now_tick);
        self.freed.give_back(&shard.pool);
        let next = [
            self.wheel.next_tick(),
            self.lanes_need(),
            Some(shard.urgent()),
        ]
        .into_iter()
        .flatten()
        .min()
        .filter(|&tick| tick != u64::MAX);
        Turn { fired, next }
    }

    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    /// Whether anything arrived that the worker must see before `plan`: called after
    /// publishing the plan, so that a producer who missed it has been seen here.
    pub(crate) fn must_turn_before(&self, shard: &Shard, plan: u64) -> bool {
        // SAFETY: only the worker (the inbox's single consumer) calls this.
        let inbox = unsafe { shard.inbox.has_pending() };
        inbox
            || shard.lanes_version.load(Ordering::Acquire) != self.lanes_version
            || shard.urgent() < plan
            || self.lanes_need().is_some_and(|need| need < plan)
    }

    fn lanes_need(&self) -> Option<u64> {
        self.lanes.iter().filter_map(|lane| lane.need()).min()
    }

    fn refresh_lanes(&mut self, shard: &Shard) {
        let version = shard.lanes_version.load(Ordering::Acquire);
        if version == self.lanes_version {
            return;
        }
        let mut lanes = shard
            .lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        lanes.retain(|lane| {
            if !lane.is_finished() {
                return true;
            }
            let counters = &shard.counters;
            bump(
                &counters.retired_scheduled,
                lane.scheduled.load(Ordering::Relaxed),
            );
            bump(
                &counters.retired_cancelled,
                lane.cancelled.load(Ordering::Relaxed),
            );
            bump(&counters.retired_reset, lane.reset.load(Ordering::Relaxed));
            bump(&counters.panicked, lane.panicked.load(Ordering::Relaxed));
            false
        });
        self.lanes.clone_from(&lanes);
        self.lanes_version = version;
    }

    /// Takes the lanes whose need has come (every lane when `all`), and the whole inbox.
    fn collect(&mut self, shard: &Shard, now_tick: u64, all: bool) {
        for lane_index in 0..self.lanes.len() {
            let lane = &self.lanes[lane_index];
            if lane.need().is_some_and(|need| all || need <= now_tick) {
                let chain = lane.take();
                for node in chain {
                    self.receive(shard, node);
                }
            }
        }
        loop {
            // SAFETY: the worker is the inbox's single consumer.
            match unsafe { shard.inbox.pop() } {
                Pop::Node(node) => self.receive(shard, node),
                Pop::Empty => break,
                // A producer is mid-push; it wakes us if the node is due before our plan.
                Pop::Inconsistent => break,
            }
        }
    }

    fn receive(&mut self, shard: &Shard, node: NonNull<TimerNode>) {
        // SAFETY: nodes on lanes and the inbox are live pool nodes.
        let node_ref = unsafe { node.as_ref() };
        match node_ref.state.receive() {
            Received::File => self.file(shard, node_ref, node_ref.deadline()),
            Received::Refile => {
                self.wheel
                    .unlink(&mut FiledNodes(&shard.pool), shard.pool.index_of(node));
                self.file(shard, node_ref, node_ref.deadline());
            }
            Received::UnlinkAndFree => {
                self.wheel
                    .unlink(&mut FiledNodes(&shard.pool), shard.pool.index_of(node));
                self.free(shard, node);
            }
            Received::Free => self.free(shard, node),
            Received::Ignore => {}
        }
    }

    /// Files a node that is marked `FILED` at `deadline` (due at once if already past).
    fn file(&mut self, shard: &Shard, node: &TimerNode, deadline: u64) {
        let index = shard.pool.index_of(NonNull::from(node));
        self.wheel
            .file(&mut FiledNodes(&shard.pool), index, deadline, false);
    }

    /// Gives a node back: drops any callback, moves the generation on, batches the node.
    fn free(&mut self, shard: &Shard, node: NonNull<TimerNode>) {
        // SAFETY: the caller holds the node exclusively (nothing else will touch it until
        // the generation moves on below).
        let node_ref = unsafe { node.as_ref() };
        // SAFETY: as above.
        let panicked = unsafe { node_ref.with_held(|held| held.callback.clear()) };
        bump(&shard.counters.panicked, u64::from(panicked));
        if node_ref.state.free() {
            self.freed.put(node);
            if self.freed.len() >= BATCH {
                self.freed.give_back(&shard.pool);
            }
        }
    }

    fn fire_due(&mut self, shard: &Shard, now: Instant, now_tick: u64) -> usize {
        let mut fired = 0;
        while let Some(index) = self.wheel.poll(&mut FiledNodes(&shard.pool), now) {
            let Some(node_ref) = shard.pool.node(index) else {
                continue;
            };
            let node = NonNull::from(node_ref);
            loop {
                let seen = node_ref.state.observe();
                match seen.phase() {
                    Phase::Cancelled => {
                        // Its cancel message is in transit and will free it.
                        node_ref.state.keep_filed();
                        break;
                    }
                    Phase::Pending if seen.is_locked() => {
                        // A reset is mid-write: look again next tick.
                        self.file(shard, node_ref, now_tick + 1);
                        break;
                    }
                    Phase::Pending => {
                        let deadline = node_ref.deadline();
                        if deadline > now_tick {
                            // Pushed back since it was filed.
                            self.file(shard, node_ref, deadline);
                            break;
                        }
                        if node_ref.state.try_fire(seen) {
                            self.fire(shard, node, deadline, now_tick);
                            fired += 1;
                            break;
                        }
                    }
                    _ => {
                        debug_assert!(false, "a {:?} timer in the wheel", seen.phase());
                        break;
                    }
                }
            }
        }
        fired
    }

    /// Runs a claimed timer's callback and settles the node.
    fn fire(&mut self, shard: &Shard, node: NonNull<TimerNode>, due: u64, now_tick: u64) {
        // SAFETY: `try_fire` succeeded, so the worker holds the node until `finish_fire`.
        let node_ref = unsafe { node.as_ref() };
        let counters = &shard.counters;
        Self::run_callback(shard, node_ref);
        if now_tick > due.saturating_add(1) {
            bump(&counters.late, 1);
        }
        // SAFETY: as above.
        let period = unsafe { node_ref.with_held(|held| held.callback.period()) };
        let next = period
            .is_repeating()
            .then(|| period.missed.next_after(due, period.ticks, now_tick));
        if let Some(next) = next {
            // No resetter can touch a firing timer, so the owner may store its deadline.
            node_ref.deadline.store(next, Ordering::Release);
        }
        match node_ref.state.finish_fire() {
            AfterFire::Rearm => self.file(shard, node_ref, next.unwrap_or(now_tick + 1)),
            AfterFire::Free => {
                if !period.is_repeating() {
                    bump(&counters.completed, 1);
                }
                self.free(shard, node);
            }
            AfterFire::AwaitMessage => {
                if !period.is_repeating() {
                    bump(&counters.completed, 1);
                }
            }
        }
    }

    /// Runs a claimed timer's callback, catching and counting a panic.
    fn run_callback(shard: &Shard, node: &TimerNode) {
        // SAFETY: the caller claimed the timer (its state says Firing), so the worker holds
        // the node until it settles it.
        let panicked = unsafe {
            node.with_held(|held| catch_unwind(AssertUnwindSafe(|| held.callback.call())).is_err())
        };
        bump(&shard.counters.fired, 1);
        bump(&shard.counters.panicked, u64::from(panicked));
    }

    /// The last turn: takes everything in transit, then runs or drops every pending timer.
    pub(crate) fn finish(&mut self, shard: &Shard, pending: PendingTimers) {
        // Orders the shutdown flag (set before this call) before the lane and inbox reads
        // below, against a scheduler's push-then-flag-check: either this turn sees its
        // timer, or the scheduler sees the flag and takes the timer back.
        crate::sync::atomic::fence(crate::sync::atomic::Ordering::SeqCst);
        self.lanes_version = u64::MAX;
        self.refresh_lanes(shard);
        // Collect until no producer holds nodes it took off a lane (it puts them back where
        // this sees them, see `Lane::enter`) and no push to the inbox is half done.
        let mut attempts = 0;
        loop {
            // Busy first: a lane seen idle here has put back everything it took before this
            // read, so the collection after it finds them.
            let busy = self.lanes.iter().any(|lane| lane.is_busy());
            self.collect(shard, u64::MAX, true);
            // SAFETY: the worker is the inbox's single consumer.
            if !busy && !unsafe { shard.inbox.has_pending() } {
                break;
            }
            attempts += 1;
            crate::sync::spin_or_yield(attempts);
        }
        let counters = &shard.counters;
        for index in self.wheel.drain(&mut FiledNodes(&shard.pool)) {
            let Some(node_ref) = shard.pool.node(index) else {
                continue;
            };
            let node = NonNull::from(node_ref);
            loop {
                let seen = node_ref.state.observe();
                match seen.phase() {
                    Phase::Pending if seen.is_locked() => crate::sync::spin_or_yield(64),
                    Phase::Pending => {
                        let claimed = match pending {
                            PendingTimers::Run => node_ref.state.try_fire(seen),
                            PendingTimers::Drop => node_ref.state.try_discard(seen),
                        };
                        if !claimed {
                            continue;
                        }
                        if pending == PendingTimers::Run {
                            Self::run_callback(shard, node_ref);
                            bump(&counters.ran_at_shutdown, 1);
                        } else {
                            bump(&counters.dropped_at_shutdown, 1);
                        }
                        if seen.in_transit() {
                            // A message raced the shutdown; nobody takes it any more. The
                            // timer is over either way.
                            node_ref.state.end();
                        } else {
                            self.free(shard, node);
                        }
                        break;
                    }
                    Phase::Cancelled if !seen.in_transit() => {
                        self.free(shard, node);
                        break;
                    }
                    _ => break,
                }
            }
        }
        self.freed.give_back(&shard.pool);
    }
}
