//! A shard's held wheel: the wheel, the lanes it takes timers from, and what it has freed; touched
//! only by the wheel's holder (ground rule 1).

use std::ptr::NonNull;
use std::time::Instant;

use crate::engine::counters::Planned;
use crate::engine::counters::add;
use crate::engine::deferred_drops::{DeferredDrops, DeferredDropsBuilder};
use crate::engine::due_lists;
use crate::engine::forward_ring::{CHUNK, RING};
use crate::engine::lane::Lane;
use crate::engine::pool::FiledNodes;
use crate::engine::pool::Magazine;
use crate::engine::runner;
use crate::engine::shard_state::ShardState;
use crate::engine::shutdown::PendingTimers;
use crate::engine::timer_node::Claim;
use crate::engine::timer_node::TimerNode;
use crate::sync::Arc;
use crate::sync::atomic::Ordering;
use crate::sync::mpsc::Pop;
use crate::sync::run_queue::{Filler, MAX_RUN};
use crate::sync::timer_state::{Phase, Received};
use crate::time::ticks::Ticks;
use crate::tuning::{CLAIM_BATCH, HAND_OUT_AT_LEAST, RECEIVE_AHEAD};
use crate::wheel::core::WheelCore;
use crate::wheel::geometry::Geometry;
use crate::wheel::location::NIL;

/// The held wheel of one shard.
pub(crate) struct HeldWheel {
    wheel: WheelCore,
    /// Nodes freed during this look, on their way back to the pool.
    freed: Magazine,
    /// Nodes freed during this look whose captures' `Drop` is user code.
    deferred_drops: DeferredDropsBuilder,
    lanes: Vec<Arc<Lane>>,
    lanes_version: u64,
    /// The last turn has run (with this mode): nothing is filed or claimed any more.
    finished: Option<PendingTimers>,
    /// Whether a burst's due lists are handed out ([`due_lists`]).
    hands_out: bool,
    /// The lists out, not yet taken back: meanwhile a look receives and files nothing.
    handed: u64,
}

/// What one look at the wheel found.
pub(crate) struct Extracted {
    /// Timers claimed onto the run queue.
    pub(crate) claimed: usize,
    /// The tick the look judged due timers by (the caller's or the wheel's, whichever is later).
    pub(crate) now_tick: u64,
    /// The run queue filled up while timers were still due.
    pub(crate) more_due: bool,
    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    /// The tick by which the owner must look again; `None`: never.
    pub(crate) next: Option<u64>,
    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    /// What `next` is for.
    pub(crate) next_for: Planned,
    /// Captures for the caller to drop once it has let the wheel go.
    pub(crate) deferred_drops: DeferredDrops,
    /// Lists of due timers are out: the next looks do nothing more until they are walked.
    pub(crate) lists_out: bool,
    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    /// This look handed lists out: wake workers to walk them.
    pub(crate) handed_out: bool,
}

impl Extracted {
    /// A look that did nothing at `now_tick`, to look again at `next`.
    fn idle(now_tick: u64, next: Option<u64>, lists_out: bool) -> Self {
        Self {
            claimed: 0,
            now_tick,
            more_due: false,
            next,
            next_for: Planned::Wheel,
            deferred_drops: DeferredDrops::NONE,
            lists_out,
            handed_out: false,
        }
    }
}

impl HeldWheel {
    pub(crate) fn new(ticks: Ticks, hands_out: bool) -> Self {
        Self {
            wheel: WheelCore::new(ticks, Geometry::DEFAULT, true),
            freed: Magazine::EMPTY,
            deferred_drops: DeferredDropsBuilder::default(),
            lanes: Vec::new(),
            lanes_version: u64::MAX,
            finished: None,
            hands_out,
            handed: 0,
        }
    }

    /// One look at `now`: takes what is due on the lanes and the inbox, files it, and claims due
    /// timers onto the run queue while it has room.
    pub(crate) fn extract(&mut self, shard: &ShardState, now: Instant) -> Extracted {
        if self.finished.is_some() {
            return Extracted::idle(self.wheel.elapsed(), None, false);
        }
        // A stand-in's or a late owner's reading may be older than the last look's.
        let (now, now_tick) = self.wheel.catch_up(now);
        if self.handed != 0 && !self.take_back(shard, false) {
            // Due work is out: a stand-in must see it, to take the lists back.
            shard.publish_next_due(now_tick);
            return Extracted::idle(now_tick, Some(now_tick), true);
        }
        self.refresh_lanes(shard);
        let all_lanes = shard.take_urgent(now_tick);
        self.collect(shard, now_tick, all_lanes);
        let (claimed, more_due) = self.claim_due(shard, now, now_tick);
        let handed_out =
            more_due && self.hands_out && self.hand_out(shard, (now, now_tick), HAND_OUT_AT_LEAST);
        self.freed.give_back(&shard.pool);
        let wheel_next = self.wheel.next_tick();
        let next_due = handed_out.then_some(now_tick).or(wheel_next);
        shard.publish_next_due(next_due.unwrap_or(u64::MAX));
        let for_wheel = [
            more_due.then_some(now_tick),
            wheel_next,
            self.wheel.move_ahead_tick(),
        ]
        .into_iter()
        .flatten()
        .min();
        let for_lanes = [self.lanes_need(), Some(shard.urgent())]
            .into_iter()
            .flatten()
            .min();
        let (next, next_for) = match (for_wheel, for_lanes) {
            (Some(wheel), Some(lanes)) if lanes < wheel => (Some(lanes), Planned::Lane),
            (None, lanes) => (lanes, Planned::Lane),
            (wheel, _) => (wheel, Planned::Wheel),
        };
        Extracted {
            claimed,
            now_tick,
            more_due,
            next: next.filter(|&tick| tick != u64::MAX),
            next_for,
            deferred_drops: self.deferred_drops.take(),
            lists_out: handed_out,
            handed_out,
        }
    }

    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    /// Whether anything arrived that the owner must see before `plan`: called after publishing the
    /// plan, so a producer who missed it is seen here.
    pub(crate) fn must_turn_before(&self, shard: &ShardState, plan: u64) -> bool {
        // SAFETY: only the wheel's holder (the inbox's single consumer) calls this.
        let inbox = unsafe { shard.inbox.has_pending() };
        // Lists a stand-in handed out: only a look takes them back.
        if self.handed != 0 {
            return true;
        }
        // A forwarded batch's need may be a message's lazy one: seen like the inbox.
        inbox
            || !self.rings_empty()
            || shard.lanes_version.load(Ordering::Acquire) != self.lanes_version
            || shard.urgent() < plan
            || self.lanes_need().is_some_and(|need| need < plan)
            || self.wheel.next_tick().is_some_and(|tick| tick < plan)
    }

    fn lanes_need(&self) -> Option<u64> {
        self.lanes.iter().filter_map(|lane| lane.need()).min()
    }

    fn refresh_lanes(&mut self, shard: &ShardState) {
        let version = shard.lanes_version.load(Ordering::Acquire);
        if version == self.lanes_version {
            return;
        }
        let mut lanes = shard.lanes.lock().unwrap_or_else(|p| p.into_inner());
        lanes.retain(|lane| {
            if !lane.is_finished() {
                return true;
            }
            let counters = &shard.counters;
            for (retired, count) in [
                (&counters.retired_scheduled, &lane.scheduled),
                (&counters.retired_cancelled, &lane.cancelled),
                (&counters.retired_reset, &lane.reset),
                (&counters.panicked, &lane.panicked),
            ] {
                add(retired, count.load(Ordering::Relaxed));
            }
            false
        });
        self.lanes.clone_from(&lanes);
        self.lanes_version = version;
    }

    /// Takes the lanes whose need has come (all with `all`), the forward rings and the inbox.
    fn collect(&mut self, shard: &ShardState, now_tick: u64, all: bool) {
        let mut forwarded = [0_u32; CHUNK];
        for lane_index in 0..self.lanes.len() {
            // At most a ring's worth: a fast producer must not keep the owner from its wheel.
            let mut took = false;
            for _ in 0..RING / CHUNK {
                // SAFETY: the wheel's holder is the rings' one consumer.
                let taken = unsafe { self.lanes[lane_index].forward.take(&mut forwarded) };
                if taken == 0 {
                    break;
                }
                took = true;
                self.receive_indices(shard, &forwarded[..taken]);
            }
            if took && self.lanes[lane_index].is_finished() {
                // A closed lane's ring is empty now: the next look drops it.
                shard.lanes_version.fetch_add(1, Ordering::AcqRel);
            }
            let chain = self.lanes[lane_index].take_due(now_tick, all);
            self.receive_all(shard, chain);
        }
        let inbox = std::iter::from_fn(|| {
            // SAFETY: the wheel's holder is the inbox's single consumer.
            match unsafe { shard.inbox.pop() } {
                Pop::Node(node) => Some(node),
                Pop::Empty => None,
                // A producer is mid-push; it wakes us if need be.
                Pop::Inconsistent => None,
            }
        });
        self.receive_all(shard, inbox);
    }

    /// Receives every node `nodes` yields, in order, [`RECEIVE_AHEAD`] behind taking them, asking
    /// for each node's wheel neighbours as it is taken so that the misses overlap.
    fn receive_all(&mut self, shard: &ShardState, nodes: impl Iterator<Item = NonNull<TimerNode>>) {
        let mut ahead = [NonNull::<TimerNode>::dangling(); RECEIVE_AHEAD];
        let mut taken = 0_usize;
        for node in nodes {
            if self.finished.is_none() {
                self.wheel
                    .prefetch_neighbours(&FiledNodes(&shard.pool), shard.pool.index_of(node));
            }
            let slot = &mut ahead[taken % RECEIVE_AHEAD];
            let behind = std::mem::replace(slot, node);
            if taken >= RECEIVE_AHEAD {
                self.receive(shard, behind);
            }
            taken += 1;
        }
        let waiting = taken.min(RECEIVE_AHEAD);
        for offset in 0..waiting {
            let node = ahead[(taken - waiting + offset) % RECEIVE_AHEAD];
            self.receive(shard, node);
        }
    }

    /// Receives the nodes at `indices`, asking for each [`RECEIVE_AHEAD`] nodes ahead.
    fn receive_indices(&mut self, shard: &ShardState, indices: &[u32]) {
        let pool = &shard.pool;
        let nodes = indices.iter().enumerate().filter_map(|(position, &index)| {
            if let Some(ahead) = indices.get(position + RECEIVE_AHEAD)
                && let Some(node) = pool.node(*ahead)
            {
                TimerNode::prefetch_for_write(NonNull::from(node));
            }
            let node = pool.node(index);
            debug_assert!(node.is_some(), "a forwarded index outside the pool");
            node.map(NonNull::from)
        });
        self.receive_all(shard, nodes);
    }

    fn receive(&mut self, shard: &ShardState, node: NonNull<TimerNode>) {
        // SAFETY: nodes on lanes and the inbox are live pool nodes.
        let node_ref = unsafe { node.as_ref() };
        let received = node_ref.state.receive();
        // After the last turn the wheel's lists are gone, so nothing is filed, unlinked or
        // run. A timer pushed after the last turn's collection is withdrawn by its scheduler,
        // and stays marked filed until that cancel's message comes back to a sweep.
        let live = self.finished.is_none();
        if live && matches!(received, Received::Refile | Received::UnlinkAndFree) {
            self.wheel
                .unlink(&mut FiledNodes(&shard.pool), shard.pool.index_of(node));
        }
        match received {
            Received::File | Received::Refile if live => {
                self.file(shard, node_ref, node_ref.deadline());
            }
            Received::UnlinkAndFree | Received::Free => self.free(shard, node),
            _ => {}
        }
    }

    /// Files a node marked `FILED` at `deadline` (due at once if past).
    fn file(&mut self, shard: &ShardState, node: &TimerNode, deadline: u64) {
        let index = shard.pool.index_of(NonNull::from(node));
        self.wheel
            .file(&mut FiledNodes(&shard.pool), index, deadline, false);
    }

    /// Gives a node back, or defers it if dropping its callback runs user code.
    fn free(&mut self, shard: &ShardState, node: NonNull<TimerNode>) {
        // SAFETY: the caller holds the node: it is off every list and queue.
        if unsafe {
            node.as_ref()
                .with_callback(|callback| callback.drops_anything())
        } {
            self.deferred_drops.push(node);
            return;
        }
        runner::free_into(shard, node, &mut self.freed);
    }

    /// Claims due timers onto the run queue while it has room; `true` if it filled with timers
    /// still due.
    fn claim_due(&mut self, shard: &ShardState, now: Instant, now_tick: u64) -> (usize, bool) {
        let mut filler = shard.run.filler();
        let mut claimed = 0;
        let mut batch = [0_u32; CLAIM_BATCH];
        while filler.room() > 0 {
            // Only what there is room for: each timer taken is claimed or refiled.
            let room = filler.room().min(CLAIM_BATCH);
            let taken =
                self.wheel
                    .poll_batch(&mut FiledNodes(&shard.pool), now, &mut batch[..room]);
            if taken == 0 {
                return (claimed, false);
            }
            for &index in &batch[..taken] {
                claimed += self.claim(shard, &mut filler, index, now_tick);
            }
        }
        (
            claimed,
            self.wheel.next_tick().is_some_and(|tick| tick <= now_tick),
        )
    }

    /// Claims a due timer onto the run queue (1), or leaves it to its cancel's message or refiles
    /// it (0).
    fn claim(
        &mut self,
        shard: &ShardState,
        filler: &mut Filler<'_>,
        index: u32,
        now_tick: u64,
    ) -> usize {
        let Some(node_ref) = shard.pool.node(index) else {
            return 0;
        };
        match node_ref.claim(now_tick) {
            Claim::Fired => {
                let pushed = filler.push(index);
                debug_assert!(pushed, "the run queue had room");
                1
            }
            Claim::Cancelled => 0,
            Claim::Refile(at) => {
                self.file(shard, node_ref, at);
                0
            }
        }
    }

    /// Hands out the due slots' lists if they hold `at_least` timers; whether it did.
    fn hand_out(
        &mut self,
        shard: &ShardState,
        (now, now_tick): (Instant, u64),
        at_least: u32,
    ) -> bool {
        let mut lists = [(NIL, NIL); due_lists::LISTS];
        let count = self.wheel.detach_due(now, &mut lists, at_least);
        if count == 0 {
            return false;
        }
        self.handed = shard.hand_outs.hand_out(&lists[..count], now_tick);
        true
    }

    /// Hands out the due lists at once, for a model or a test to walk.
    #[cfg(any(test, loom))]
    pub(crate) fn hand_out_now(&mut self, shard: &ShardState, now: Instant) -> bool {
        if self.handed != 0 || self.finished.is_some() {
            return false;
        }
        let now = self.wheel.catch_up(now);
        self.hand_out(shard, now, 1)
    }

    /// Takes back the lists, refiling what is left and what walkers sent back, once all are walked,
    /// or with `now` at once (the last turn). Returns whether it took them.
    fn take_back(&mut self, shard: &ShardState, now: bool) -> bool {
        if !now && !shard.hand_outs.all_back(self.handed) {
            return false;
        }
        let handed = std::mem::take(&mut self.handed);
        shard.hand_outs.take_back(handed, &shard.pool, |index| {
            if let Some(node_ref) = shard.pool.node(index) {
                // The next claim judges due ones afresh.
                self.file(shard, node_ref, node_ref.deadline());
            }
        });
        true
    }

    /// The last turn: runs what is claimed, takes everything in transit, then runs or drops every
    /// pending timer.
    pub(crate) fn finish(&mut self, shard: &ShardState, pending: PendingTimers, now: Instant) {
        if self.finished.is_some() {
            return;
        }
        // Orders the shutdown flag before the reads below, against a scheduler's
        // push-then-flag-check: this turn sees its timer, or it sees the flag.
        crate::sync::atomic::fence(crate::sync::atomic::Ordering::SeqCst);
        // Unclaimed timers on lists still out go back into the wheel.
        if self.handed != 0 {
            self.take_back(shard, true);
        }
        // Claimed timers run, whatever `pending` says.
        let (_, now_tick) = self.wheel.catch_up(now);
        while let Some(run) = shard.run.take(MAX_RUN) {
            runner::run(shard, run.indices(), now_tick, true);
        }
        self.lanes_version = u64::MAX;
        self.refresh_lanes(shard);
        // Collect until no producer holds nodes it took off a lane and no inbox push is half done.
        crate::sync::spin_until(|| {
            // Busy first: a lane seen idle has put back what it took before this read.
            let busy = self.lanes.iter().any(|lane| lane.is_busy());
            self.collect(shard, u64::MAX, true);
            // SAFETY: the wheel's holder is the inbox's single consumer.
            (!busy && !unsafe { shard.inbox.has_pending() } && self.rings_empty()).then_some(())
        });
        for lane in &self.lanes {
            // SAFETY: this is the rings' consumer, they are empty, and no reclaim can start after
            // the shutdown flag (`Lane::enter`) or is under way (none was busy).
            unsafe { lane.forward.release() };
        }
        let (mut ran, mut dropped) = (0, 0);
        for index in self.wheel.drain(&mut FiledNodes(&shard.pool)) {
            if let Some(node_ref) = shard.pool.node(index) {
                let (r, d) = self.settle_at_shutdown(shard, node_ref, pending);
                (ran, dropped) = (ran + r, dropped + d);
            }
        }
        add(&shard.counters.ran_at_shutdown, ran);
        add(&shard.counters.dropped_at_shutdown, dropped);
        // Under the wheel, like the last turn's callbacks.
        self.deferred_drops.take().free(shard);
        self.freed.give_back(&shard.pool);
        self.finished = Some(pending);
    }

    /// Runs or drops a timer drained from the wheel, or frees it if cancelled, unless a message in
    /// transit names it. Returns runs and drops.
    fn settle_at_shutdown(
        &mut self,
        shard: &ShardState,
        node_ref: &TimerNode,
        pending: PendingTimers,
    ) -> (u64, u64) {
        let node = NonNull::from(node_ref);
        loop {
            // Waits out a resetter's lock.
            let seen = crate::sync::spin_until(|| {
                let seen = node_ref.state.observe();
                (seen.phase() != Phase::Pending || !seen.is_locked()).then_some(seen)
            });
            // A waker is woken either way, or its task would wait for ever.
            let pending = if seen.is_waker() {
                PendingTimers::Run
            } else {
                pending
            };
            match seen.phase() {
                Phase::Pending => {
                    let claimed = match pending {
                        PendingTimers::Run => node_ref.state.try_fire(seen),
                        PendingTimers::Drop => node_ref.state.try_discard(seen),
                    };
                    if !claimed {
                        continue;
                    }
                    if pending == PendingTimers::Run {
                        runner::run_callback(shard, node_ref);
                    }
                    if seen.in_transit() {
                        // A message raced the shutdown: its arrival frees the node.
                        node_ref.state.end();
                    } else {
                        self.free(shard, node);
                    }
                    return match pending {
                        PendingTimers::Run => (1, 0),
                        PendingTimers::Drop => (0, 1),
                    };
                }
                Phase::Cancelled if !seen.in_transit() => {
                    self.free(shard, node);
                    return (0, 0);
                }
                _ => return (0, 0),
            }
        }
    }

    /// After the last turn, takes what threads pushed since
    /// ([`Shard::settle_after_shutdown`](crate::engine::shard::Shard::settle_after_shutdown)) and
    /// frees what is over, running no callback.
    pub(crate) fn sweep(&mut self, shard: &ShardState) {
        if self.finished.is_none() {
            return;
        }
        self.refresh_lanes(shard);
        loop {
            self.collect(shard, u64::MAX, true);
            if self.rings_empty() {
                break;
            }
        }
        self.deferred_drops.take().free(shard);
        self.freed.give_back(&shard.pool);
    }

    /// Whether every lane's forward ring is empty.
    fn rings_empty(&self) -> bool {
        self.lanes.iter().all(|lane| lane.forward.is_empty())
    }
}
