//! A shard's held wheel: the wheel, the lanes it takes timers from, and what it has freed.
//! Only the thread holding the shard's wheel touches it: its owner, or for a while a
//! worker standing in for a stuck owner. Each look at the wheel takes what has come due on
//! the lanes, drains the inbox, and claims due timers onto the shard's run queue, where
//! the owner and idle workers take them to run (see [`runner`]).
//!
//! Who may touch what, and when: the ground rules in [`engine`](crate::engine).

use std::ptr::NonNull;
use std::time::Instant;

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
use crate::engine::wakes::Planned;
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

/// The held wheel of one shard. See the module documentation.
pub(crate) struct HeldWheel {
    wheel: WheelCore,
    /// Nodes freed during this look, on their way back to the pool.
    freed: Magazine,
    /// Nodes taken off for good during this look whose callbacks' drop runs code of its
    /// own: dropped once the wheel is let go (see [`DeferredDrops`]).
    deferred_drops: DeferredDropsBuilder,
    lanes: Vec<Arc<Lane>>,
    lanes_version: u64,
    /// The shard's last turn has run, with what it did to pending timers: nothing is filed
    /// or claimed any more.
    finished: Option<PendingTimers>,
    /// Whether a burst's due lists are handed out to other workers (see [`due_lists`]):
    /// on an engine with worker threads, stealing, and more than one worker.
    hands_out: bool,
    /// The bits of the lists handed out and not yet taken back: while any is out, a look
    /// receives and files nothing (see [`due_lists`]).
    handed: u64,
}

/// What one look at the wheel found.
pub(crate) struct Extracted {
    /// Timers claimed onto the run queue.
    pub(crate) claimed: usize,
    /// The tick the look judged due timers by: the caller's reading, or the wheel's latest
    /// if that was later. Whoever runs what it claimed runs it as of this tick.
    pub(crate) now_tick: u64,
    /// The run queue filled up while timers were still due: look again once it drains.
    pub(crate) more_due: bool,
    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    /// The tick by which the owner must look again: the wheel's next deadline, or a lane's
    /// need; `None` when nothing will ever be due.
    pub(crate) next: Option<u64>,
    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    /// What `next` is for: the wheel's work, or a lane's need.
    pub(crate) next_for: Planned,
    /// Timers the look took off for good whose callbacks are still to be dropped, by the
    /// caller once it has let the wheel go.
    pub(crate) deferred_drops: DeferredDrops,
    /// Lists of due timers are out (see [`due_lists`]): the look did nothing else, and the
    /// wheel waits for walkers to walk them to the end before its next look does more.
    pub(crate) lists_out: bool,
    #[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
    /// This look handed lists out: workers should be woken to walk them.
    pub(crate) handed_out: bool,
}

impl Extracted {
    /// A look that found nothing to do at `now_tick` and has nothing planned: `next` as
    /// given.
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
    /// `hands_out`: whether bursts' due lists are handed out to other workers.
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

    /// One look at `now`: takes what is due on the lanes and the whole inbox, files it, and
    /// claims due timers onto the run queue while it has room.
    pub(crate) fn extract(&mut self, shard: &ShardState, now: Instant) -> Extracted {
        if self.finished.is_some() {
            return Extracted::idle(self.wheel.elapsed(), None, false);
        }
        // A stand-in's or a late owner's reading may be older than the last look's.
        let (now, now_tick) = self.wheel.catch_up(now);
        if self.handed != 0 && !self.take_back(shard, false) {
            // Due work is out: a worker standing in for a stuck owner must see it, to take
            // the lists back once walked.
            shard.publish_next_due(now_tick);
            // Look again at once: the lists come back within a batch's walk.
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
        // With lists out, what is due now is on them (see above).
        let next_due = if handed_out {
            Some(now_tick)
        } else {
            wheel_next
        };
        shard.publish_next_due(next_due.unwrap_or(u64::MAX));
        let for_wheel = [
            more_due.then_some(now_tick),
            wheel_next,
            // Before the next deadline when the wheel has timers to move down ahead of
            // time (a coarse slot with many timers coming up).
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
    /// Whether anything arrived that the owner must see before `plan`: called after
    /// publishing the plan, so that a producer who missed it has been seen here. Also
    /// catches a timer a rescuer filed after the owner's last look.
    pub(crate) fn must_turn_before(&self, shard: &ShardState, plan: u64) -> bool {
        // SAFETY: only the wheel's holder (the inbox's single consumer) calls this.
        let inbox = unsafe { shard.inbox.has_pending() };
        // Lists a stand-in handed out just before the owner got here: they are due work,
        // and only a look takes them back.
        if self.handed != 0 {
            return true;
        }
        // A forwarded batch is seen like the inbox: its need may be a message's lazy one.
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
        let mut lanes = shard
            .lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        lanes.retain(|lane| {
            if !lane.is_finished() {
                return true;
            }
            let counters = &shard.counters;
            add(
                &counters.retired_scheduled,
                lane.scheduled.load(Ordering::Relaxed),
            );
            add(
                &counters.retired_cancelled,
                lane.cancelled.load(Ordering::Relaxed),
            );
            add(&counters.retired_reset, lane.reset.load(Ordering::Relaxed));
            add(&counters.panicked, lane.panicked.load(Ordering::Relaxed));
            false
        });
        self.lanes.clone_from(&lanes);
        self.lanes_version = version;
    }

    /// Takes the lanes whose need has come (every lane when `all`), and everything
    /// forwarded: the lanes' forward rings and the inbox.
    fn collect(&mut self, shard: &ShardState, now_tick: u64, all: bool) {
        let mut forwarded = [0_u32; CHUNK];
        for lane_index in 0..self.lanes.len() {
            // No more than a full ring's worth: a producer forwarding as fast as this
            // receives must not keep the owner from its wheel.
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
                // Its thread closed it with a batch still on the ring: now that the ring is
                // empty, the next look may drop the lane.
                shard.lanes_version.fetch_add(1, Ordering::AcqRel);
            }
            // Only the stacks whose need has come: an old generation taken with the young
            // stack would reach the wheel before its thread could catch its cancels.
            let chain = self.lanes[lane_index].take_due(now_tick, all);
            self.receive_all(shard, chain);
        }
        let inbox = std::iter::from_fn(|| {
            // SAFETY: the wheel's holder is the inbox's single consumer.
            match unsafe { shard.inbox.pop() } {
                Pop::Node(node) => Some(node),
                Pop::Empty => None,
                // A producer is mid-push; it wakes us if the node is due before our plan.
                Pop::Inconsistent => None,
            }
        });
        self.receive_all(shard, inbox);
    }

    /// Receives every node `nodes` yields, in order, [`RECEIVE_AHEAD`] behind taking them.
    /// A cancelled timer's unlink writes both of its neighbours in the wheel, lines nobody
    /// has touched since they were filed, and taking the next node off its chain or the
    /// inbox reads a line the producer just wrote: a node-at-a-time loop pays those misses
    /// in turn. Here each node's neighbours are asked for as it is taken, and it is
    /// received only after the next few have been taken, so the misses overlap. Taking a
    /// node before receiving the ones ahead of it changes nothing: a node in transit is
    /// pushed nowhere else until it is received.
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

    /// Receives the nodes at `indices`, in order. Unlike a chain's, their misses need not
    /// wait for one another: each node is asked for [`RECEIVE_AHEAD`] nodes before
    /// [`receive_all`](Self::receive_all) takes it (and asks for its neighbours).
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
        if self.finished.is_some() {
            // Swept up after the last turn: the wheel's lists are gone, so nothing is filed
            // or unlinked, and nothing is run (a sweep may be made by any thread that
            // pushed, and callbacks run on workers). A timer that arrives new, one-shot or
            // repeating, was pushed after the last turn's collection, so its scheduler sees
            // the shutdown and cancels it (and `schedule` returns `Err(Shutdown)`): it
            // stays marked filed, on no list, until that cancel's message comes back here.
            // No re-arm of a repeating timer can arrive now: every run of this shard's
            // timers ended before the last turn (it waits for other hands, and runs what
            // was claimed first).
            match received {
                Received::File | Received::Refile | Received::Ignore => {}
                Received::UnlinkAndFree | Received::Free => self.free(shard, node),
            }
            return;
        }
        match received {
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
    fn file(&mut self, shard: &ShardState, node: &TimerNode, deadline: u64) {
        let index = shard.pool.index_of(NonNull::from(node));
        self.wheel
            .file(&mut FiledNodes(&shard.pool), index, deadline, false);
    }

    /// Gives a node back: drops any callback, moves the generation on, batches the node. A
    /// callback whose drop runs code of its own waits on `deferred_drops` instead, node and all,
    /// for its drop outside the wheel (see [`DeferredDrops`]).
    fn free(&mut self, shard: &ShardState, node: NonNull<TimerNode>) {
        // SAFETY: the caller holds the node exclusively: it is off every list and queue.
        if unsafe {
            node.as_ref()
                .with_callback(|callback| callback.drops_anything())
        } {
            self.deferred_drops.push(node);
            return;
        }
        runner::free_into(shard, node, &mut self.freed);
    }

    /// Claims due timers onto the run queue while it has room; `true` beside the count if
    /// it filled up with timers still due.
    fn claim_due(&mut self, shard: &ShardState, now: Instant, now_tick: u64) -> (usize, bool) {
        let mut filler = shard.run.filler();
        let mut claimed = 0;
        let mut batch = [0_u32; CLAIM_BATCH];
        while filler.room() > 0 {
            // No more than there is room for: every timer taken off the wheel here is
            // claimed onto the run queue or filed again before the next batch.
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

    /// Claims one due timer taken off the wheel onto the run queue (1), or leaves it to
    /// its cancel's message, or files it again where it now belongs (0).
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

    /// Hands out the lists of the finest slots due at `now` (see [`due_lists`]) when they
    /// hold `at_least` timers, enough to be worth the hand-over. Returns whether it did.
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

    /// Hands out the due lists at once, whatever they hold, for a model or a test to walk.
    #[cfg(any(test, loom))]
    pub(crate) fn hand_out_now(&mut self, shard: &ShardState, now: Instant) -> bool {
        if self.handed != 0 || self.finished.is_some() {
            return false;
        }
        let now = self.wheel.catch_up(now);
        self.hand_out(shard, now, 1)
    }

    /// Takes back the lists handed out, filing what is left on them and what walkers sent
    /// back, once every one has been walked to the end, or, with `now`, at once: in the
    /// last turn, when no walker is in the shard's hands. Returns whether it took them.
    fn take_back(&mut self, shard: &ShardState, now: bool) -> bool {
        if !now && !shard.hand_outs.all_back(self.handed) {
            return false;
        }
        let handed = std::mem::take(&mut self.handed);
        shard.hand_outs.take_back(handed, &shard.pool, |index| {
            if let Some(node_ref) = shard.pool.node(index) {
                // Due ones go on the ready list, and the next claim judges them afresh.
                self.file(shard, node_ref, node_ref.deadline());
            }
        });
        true
    }

    /// The last turn: runs what is already claimed, takes everything in transit, then runs
    /// or drops every pending timer. The caller has made sure no other worker still holds
    /// or can take this shard's timers.
    pub(crate) fn finish(&mut self, shard: &ShardState, pending: PendingTimers, now: Instant) {
        if self.finished.is_some() {
            return;
        }
        // Orders the shutdown flag (set before this call) before the lane and inbox reads
        // below, against a scheduler's push-then-flag-check: either this turn sees its
        // timer, or the scheduler sees the flag and takes the timer back.
        crate::sync::atomic::fence(crate::sync::atomic::Ordering::SeqCst);
        // Lists still out go back into the wheel, walked or not: their timers were not
        // claimed, so `pending` decides for them as for the rest. No walker is in the
        // shard's hands any more.
        if self.handed != 0 {
            self.take_back(shard, true);
        }
        // Claimed timers were due before the shutdown: they run, whatever `pending` says.
        let (_, now_tick) = self.wheel.catch_up(now);
        while let Some(run) = shard.run.take(MAX_RUN) {
            runner::run(shard, run.indices(), now_tick, true);
        }
        self.lanes_version = u64::MAX;
        self.refresh_lanes(shard);
        // Collect until no producer holds nodes it took off a lane (it puts them back where
        // this sees them, see `Lane::enter`) and no push to the inbox is half done.
        crate::sync::spin_until(|| {
            // Busy first: a lane seen idle here has put back everything it took before this
            // read, so the collection after it finds them.
            let busy = self.lanes.iter().any(|lane| lane.is_busy());
            self.collect(shard, u64::MAX, true);
            // SAFETY: the wheel's holder is the inbox's single consumer.
            (!busy && !unsafe { shard.inbox.has_pending() } && self.rings_empty()).then_some(())
        });
        for lane in &self.lanes {
            // SAFETY: this is the rings' consumer, they are empty, and no reclaim can start
            // after the shutdown flag (see `Lane::enter`) or is still under way (none was
            // busy above), so nothing publishes on them again.
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
        // Under the wheel: the last turn has run callbacks under it anyway, and nobody
        // stands in after it.
        self.deferred_drops.take().free(shard);
        self.freed.give_back(&shard.pool);
        self.finished = Some(pending);
    }

    /// Runs or drops (as `pending` says) a timer of this shard at shutdown, or frees it if
    /// it was cancelled; leaves it if a message in transit still names it (that message's
    /// arrival frees it). The timer is in no wheel list. Returns the runs and drops.
    fn settle_at_shutdown(
        &mut self,
        shard: &ShardState,
        node_ref: &TimerNode,
        pending: PendingTimers,
    ) -> (u64, u64) {
        let node = NonNull::from(node_ref);
        loop {
            // Waits out a resetter's lock: two instructions, unless that thread was preempted.
            let seen = crate::sync::spin_until(|| {
                let seen = node_ref.state.observe();
                (seen.phase() != Phase::Pending || !seen.is_locked()).then_some(seen)
            });
            // A future waiting on a timer is woken either way: dropping its waker unwoken
            // would leave its task waiting for ever.
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
                        // A message raced the shutdown: its arrival (swept up after the
                        // last turn) frees the node. The timer is over either way.
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

    /// After the last turn, nobody else takes what threads push onto this shard's lanes
    /// and inbox: a cancel's message that raced the shutdown, or a timer scheduled as it
    /// began. Whoever pushes one then asks for a sweep (see
    /// [`Shard::settle_after_shutdown`](crate::engine::shard::Shard::settle_after_shutdown)), and this takes everything pushed so far and
    /// settles it: a cancelled or finished timer's node is freed, dropping its callback
    /// (see `receive` for a timer that arrives new). It never runs a callback. Before the
    /// last turn it does nothing: that turn takes everything pushed before it.
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
        // Under the wheel, as in the last turn: nobody stands in any more.
        self.deferred_drops.take().free(shard);
        self.freed.give_back(&shard.pool);
    }

    /// Whether every lane's forward ring is empty.
    fn rings_empty(&self) -> bool {
        self.lanes.iter().all(|lane| lane.forward.is_empty())
    }
}
