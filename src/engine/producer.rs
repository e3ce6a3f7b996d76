//! The producer side, for any thread: arming a node and sending it on the thread's lane, taking the
//! lane back to recycle what it cancelled, cancelling and resetting.

use std::ptr::NonNull;
use std::time::Duration;

use crate::engine::callback::Callback;
use crate::engine::context::{self, Context};
use crate::engine::counters::add;
use crate::engine::forward_ring::CHUNK;
use crate::engine::handle::TimerHandle;
use crate::engine::lane::{CLAIM_EVERY, Chain, ChainBuilder, Lane, OLD_HORIZON};
use crate::engine::pool::Magazine;
use crate::engine::shard::Shard;
use crate::engine::shard_state::AWAKE;
use crate::engine::shard_state::ShardState;
use crate::engine::shared::{EngineShared, When};
use crate::engine::timer_node::TimerNode;
use crate::error::ScheduleError;
use crate::sync::Arc;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::timer_state::{Cancelled, Kind, Observed, Phase, TimerState};
use crate::time::ticks::nanos_of;
use crate::tuning::{IDLE_LANE_HORIZON, LANE_HORIZON, MAGAZINE_LIMIT};

/// An operation a producer counts for [`stats`](crate::TimerEngine::stats).
#[derive(Debug, Clone, Copy)]
enum Counted {
    Schedule,
    Cancel,
    Reset,
}

impl Counted {
    /// The count on a thread's own lane: written only by that thread.
    fn on_lane(self, lane: &Lane) -> &AtomicU64 {
        match self {
            Self::Schedule => &lane.scheduled,
            Self::Cancel => &lane.cancelled,
            Self::Reset => &lane.reset,
        }
    }

    /// The count for threads with no lane, shared with the retired lanes'.
    fn retired(self, shard: &Shard) -> &AtomicU64 {
        let counters = &shard.counters;
        match self {
            Self::Schedule => &counters.retired_scheduled,
            Self::Cancel => &counters.retired_cancelled,
            Self::Reset => &counters.retired_reset,
        }
    }
}

impl EngineShared {
    /// The deadline tick `delay` from now, never earlier.
    #[inline]
    pub(crate) fn deadline_after(this: &Arc<Self>, delay: Duration) -> u64 {
        context::with(this, |context| this.deadline_in(context, delay))
    }

    /// An upper bound on now in nanoseconds since the origin, from the thread's cycle-counter
    /// anchor; `None` without a counter or context.
    #[inline]
    fn nanos_at_most(&self, context: Option<&Context>) -> Option<u64> {
        let (scale, context) = self.cycles.zip(context)?;
        context
            .anchor
            .now_at_most(scale, || self.ticks.nanos_since_origin(self.clock.now()))
    }

    /// Whether now has certainly reached `tick`.
    pub(crate) fn has_reached(this: &Arc<Self>, tick: u64) -> bool {
        let ahead = context::with(this, |context| {
            this.nanos_at_most(context)
                .is_some_and(|at_most| this.ticks.floor_nanos(at_most) < tick)
        });
        !ahead && this.now_tick() >= tick
    }

    /// [`deadline_after`](Self::deadline_after) with the context already looked up.
    #[inline]
    fn deadline_in(&self, context: Option<&Context>, delay: Duration) -> u64 {
        self.nanos_at_most(context)
            .and_then(|since| self.ticks.ceil_after_nanos(since, delay))
            .unwrap_or_else(|| self.ticks.ceil_after(self.clock.now(), delay))
    }

    /// The deadline `delay` from now, never earlier, in signed nanoseconds since the origin (as a
    /// [`Sleep`](crate::Sleep) keeps it); `None` on overflow.
    #[inline]
    pub(crate) fn nanos_after(this: &Arc<Self>, delay: Duration) -> Option<i64> {
        context::with(this, |context| {
            let since = match this.nanos_at_most(context) {
                Some(since) => since,
                None => this.ticks.nanos_since_origin(this.clock.now())?,
            };
            i64::try_from(since.checked_add(nanos_of(delay)?)?).ok()
        })
    }

    /// Arms a timer due at `due` and sends it to the calling thread's home shard.
    #[inline]
    pub(crate) fn arm(
        this: &Arc<Self>,
        due: When,
        kind: Kind,
        store: impl FnOnce(&mut Callback),
    ) -> Result<TimerHandle, ScheduleError> {
        if this.shutdown.load(Ordering::Acquire) {
            return Err(ScheduleError::Shutdown);
        }
        let handle = context::with(this, |context| {
            let tick = match due {
                When::After(delay) => this.deadline_in(context, delay),
                When::AtTick(tick) => tick,
            };
            match context {
                Some(context) => this.arm_on_lane(context, tick, kind, store),
                None => this.arm_direct(tick, kind, store),
            }
        })?;
        // SeqCst: see `pushed`.
        if this.shutdown.load(Ordering::SeqCst) && Self::withdraw(this, handle) {
            // Refused: to the caller and the counts, this timer never existed.
            Self::count(this, handle.shard() as usize, Counted::Schedule, u64::MAX);
            return Err(ScheduleError::Shutdown);
        }
        Ok(handle)
    }

    #[inline]
    fn arm_on_lane(
        &self,
        context: &Context,
        tick: u64,
        kind: Kind,
        store: impl FnOnce(&mut Callback),
    ) -> Result<TimerHandle, ScheduleError> {
        let shard_index = context.home;
        let shard = &self.shards[shard_index];
        let lane = context.lane(self, shard_index);
        // SAFETY: this thread is the lane's producer, outside any other borrow of its side.
        let node = unsafe {
            lane.with_producer(|side| {
                side.magazine.take().or_else(|| {
                    side.magazine
                        .refill(&shard.pool)
                        .then(|| side.magazine.take())
                        .flatten()
                })
            })
        }
        .ok_or(ScheduleError::Capacity)?;
        let handle = self.prepare(shard_index, node, tick, kind, store);
        Lane::count(Counted::Schedule.on_lane(lane));
        self.send(lane, shard, node, tick);
        Ok(handle)
    }

    /// Arms a node straight onto the inbox, for a thread whose locals are gone.
    #[cold]
    fn arm_direct(
        &self,
        tick: u64,
        kind: Kind,
        store: impl FnOnce(&mut Callback),
    ) -> Result<TimerHandle, ScheduleError> {
        let shard = &self.shards[0];
        let mut magazine = Magazine::EMPTY;
        if !magazine.refill(&shard.pool) {
            return Err(ScheduleError::Capacity);
        }
        let node = magazine.take().ok_or(ScheduleError::Capacity)?;
        magazine.give_back(&shard.pool);
        let handle = self.prepare(0, node, tick, kind, store);
        add(Counted::Schedule.retired(shard), 1);
        // SAFETY: `node` is armed, in transit, and held by this thread until pushed.
        unsafe { shard.send_direct(node, tick) };
        self.pushed(shard);
        Ok(handle)
    }

    /// Fills in a free node this thread holds and marks it pending and in transit.
    #[inline]
    fn prepare(
        &self,
        shard: usize,
        node: NonNull<TimerNode>,
        tick: u64,
        kind: Kind,
        store: impl FnOnce(&mut Callback),
    ) -> TimerHandle {
        // SAFETY: ground rule 2: a free node from a magazine is live and this thread's.
        let node_ref = unsafe { node.as_ref() };
        // SAFETY: as above.
        unsafe {
            node_ref.with_callback(store);
            node_ref.with_links(|links| links.start_transit());
        };
        node_ref.deadline.store(tick, Ordering::Relaxed);
        let generation = node_ref.state.arm(kind);
        TimerHandle::new(
            self.id,
            shard as u32,
            self.shards[shard].pool.index_of(node),
            generation,
        )
    }

    /// Pushes a node this thread holds onto its lane into `shard`, waking the worker if needed
    /// sooner than it plans; reclaims the lane first when due. `need` is the deadline, or
    /// `u64::MAX` for a message.
    #[inline]
    fn send(&self, lane: &Lane, shard: &Shard, node: NonNull<TimerNode>, need: u64) {
        // SAFETY: this thread is the lane's producer.
        if unsafe { lane.wants_claim() } {
            self.reclaim(lane, shard);
        }
        // SAFETY: this thread is the lane's producer and holds `node`.
        if let Some(need) = unsafe { lane.push(node, need, || fresh_need(shard, self.now_tick())) }
        {
            shard.wake_for(need);
        }
        self.pushed(shard);
    }

    /// After a push: once the last turn is over, only a sweep takes the node. SeqCst pairs with the
    /// shutdown's flag store: either the last turn's collection takes the node or this sees the
    /// flag.
    #[inline]
    fn pushed(&self, shard: &Shard) {
        if self.shutdown.load(Ordering::SeqCst) {
            shard.settle_after_shutdown();
        }
    }

    /// Takes this thread's young stack (and an aged old one) back: frees timers cancelled before
    /// they left the thread, parks pending ones not due soon, and forwards the rest.
    fn reclaim(&self, lane: &Lane, shard: &Shard) {
        if !lane.enter(&self.shutdown) {
            return;
        }
        let recycled = self.reclaim_entered(lane, shard);
        lane.leave();
        // User code (captures' `Drop`s) only once the lane is left: rule 4.
        for node in recycled {
            self.recycle(lane, node);
        }
    }

    /// [`reclaim`](Self::reclaim) while the lane is busy; returns the timers to recycle.
    fn reclaim_entered(&self, lane: &Lane, shard: &Shard) -> Chain {
        let now = self.now_tick();
        // Before any node is taken: see `look_again`.
        let urgent_asked = shard.urgent_asked();
        let mut recycled = ChainBuilder::default();
        let park_after = now.saturating_add(OLD_HORIZON);
        let mut forward = ForwardBatch::new();
        let mut park = ChainBuilder::default();
        let mut keep = ChainBuilder::default();
        // Pending nodes published and their needs, for `look_again`; `unseen` if more.
        let mut published = [(None, 0); 2 * CLAIM_EVERY as usize];
        let mut published_count = 0;
        let mut unseen = false;
        let mut look_again_at = |node, need| {
            if let Some(slot) = published.get_mut(published_count) {
                *slot = (Some(node), need);
                published_count += 1;
            } else {
                unseen = true;
            }
        };
        let mut sort = |node: NonNull<TimerNode>, young: bool| {
            // SAFETY: nodes on a lane are live pool nodes, held by whoever takes them.
            let node_ref = unsafe { node.as_ref() };
            let seen = node_ref.state.observe();
            if recyclable(seen) {
                return recycled.push(node, 0);
            }
            let need = forward_need(node_ref, seen, now, shard);
            // A filed node is a message: its links are the wheel's.
            if young && !seen.is_filed() && need > park_after {
                // A timer stays young for one more claim: most are cancelled soon.
                // SAFETY: held by this thread, taken off its lane, not filed.
                if unsafe { node_ref.with_links(|links| links.outlive_claim()) } {
                    park.push(node, need);
                } else {
                    keep.push(node, need);
                }
                look_again_at(node, need);
            } else {
                if seen.phase() == Phase::Pending {
                    look_again_at(node, need);
                }
                // SAFETY: this thread is the lane's producer.
                unsafe { forward.push((lane, shard), node, need, now) };
            }
        };
        // SAFETY: this thread is the lane's producer.
        unsafe { lane.claim() }.for_each(|node| sort(node, true));
        // SAFETY: as above.
        unsafe { lane.claim_old_if_due(now) }.for_each(|node| sort(node, false));
        // SAFETY: this thread is the lane's producer (for each step).
        unsafe {
            Self::hold_back(lane, shard, park, keep, now);
            forward.send(lane, shard, now);
            Self::look_again(
                shard,
                &published[..published_count],
                (unseen, urgent_asked),
                now,
            );
            lane.with_producer(|side| {
                if side.magazine.len() > MAGAZINE_LIMIT {
                    side.magazine.give_back(&shard.pool);
                }
            });
        }
        recycled.into_chain()
    }

    /// Puts held-back timers on the old stack (past their first claim) or the young one.
    ///
    /// # Safety
    /// The caller is the lane's producer, and the chains are its own.
    #[inline]
    unsafe fn hold_back(
        lane: &Lane,
        shard: &Shard,
        park: ChainBuilder,
        keep: ChainBuilder,
        now: u64,
    ) {
        if let Some((first, last, earliest)) = park.finish() {
            let quiet = quiet_need(shard, now);
            // SAFETY: forwarded from the caller.
            if let Some(need) = unsafe { lane.park(first, last, earliest, quiet) } {
                shard.wake_for(need);
            }
        }
        if let Some((first, last, earliest)) = keep.finish() {
            let fresh = || fresh_need(shard, now);
            // SAFETY: forwarded from the caller.
            if let Some(need) = unsafe { lane.requeue(first, last, earliest, fresh) } {
                shard.wake_for(need);
            }
        }
    }

    /// Once a reclaim's timers are published: a reset that brought one forward meanwhile missed the
    /// need it went with, so look at the deadlines again; past what `published` holds (`unseen`),
    /// re-ask any urgency asked since the reclaim began.
    #[inline]
    fn look_again(
        shard: &Shard,
        published: &[(Option<NonNull<TimerNode>>, u64)],
        (unseen, asked): (bool, u64),
        now: u64,
    ) {
        if unseen {
            shard.ask_again_if_asked_since(asked, now);
        }
        let moved = published
            .iter()
            .filter_map(|&(node, need)| {
                // SAFETY: pool nodes stay live while the engine does.
                let deadline = unsafe { node?.as_ref() }.deadline();
                (deadline < need).then_some(deadline)
            })
            .min();
        if let Some(deadline) = moved {
            shard.make_urgent(deadline);
        }
    }

    /// Frees a recyclable node into this thread's magazine.
    fn recycle(&self, lane: &Lane, node: NonNull<TimerNode>) {
        // SAFETY: held by this thread (taken off its lane), and cancelled in transit.
        let node_ref = unsafe { node.as_ref() };
        // SAFETY: as above.
        if unsafe { node_ref.with_callback(|callback| callback.clear()) } {
            Lane::count(&lane.panicked);
        }
        if node_ref.state.free() {
            // SAFETY: this thread is the lane's producer.
            unsafe { lane.with_producer(|side| side.magazine.put(node)) };
        }
    }

    /// Sends a node to `shard`'s owner as a message, on this thread's lane if it has one.
    fn notify(this: &Arc<Self>, shard_index: usize, node: &TimerNode, need: u64) {
        let node = NonNull::from(node);
        let shard = &this.shards[shard_index];
        context::with(this, |context| match context {
            Some(context) => this.send(context.lane(this, shard_index), shard, node, need),
            None => {
                let need = need.min(fresh_need(shard, this.now_tick()));
                // SAFETY: the cancel or reset that set `MSG` gave this thread the push.
                unsafe { shard.send_direct(node, need) };
                this.pushed(shard);
            }
        });
    }

    /// Adds `by` to this thread's count of `what`: 1, or `u64::MAX` (wrapping) to take one back.
    fn count(this: &Arc<Self>, shard: usize, what: Counted, by: u64) {
        context::with(this, |context| match context {
            Some(context) => {
                let counter = what.on_lane(context.lane(this, shard));
                let count = counter.load(Ordering::Relaxed).wrapping_add(by);
                counter.store(count, Ordering::Relaxed);
            }
            None => add(what.retired(&this.shards[shard]), by),
        });
    }

    /// Takes back a timer armed into a shutdown, unless the last turn ran or is running it. Counts
    /// no cancel.
    #[cold]
    fn withdraw(this: &Arc<Self>, handle: TimerHandle) -> bool {
        Self::stop(this, handle, TimerState::try_withdraw).is_some()
    }

    pub(crate) fn cancel(this: &Arc<Self>, handle: TimerHandle) -> bool {
        let Some(shard) = Self::stop(this, handle, TimerState::try_cancel) else {
            return false;
        };
        Self::count(this, shard, Counted::Cancel, 1);
        true
    }

    /// Stops `handle`'s timer with `how`, messaging its owner where filed; returns its shard.
    #[inline]
    fn stop(
        this: &Arc<Self>,
        handle: TimerHandle,
        how: impl FnOnce(&TimerState, u32) -> Option<Cancelled>,
    ) -> Option<usize> {
        let (shard, node) = this.lookup(handle)?;
        if how(&node.state, handle.generation())? == Cancelled::Notify {
            Self::notify(this, shard, node, u64::MAX);
        }
        Some(shard)
    }

    pub(crate) fn reset(this: &Arc<Self>, handle: TimerHandle, tick: u64) -> bool {
        let Some((shard, node)) = this.lookup(handle) else {
            return false;
        };
        if !node.state.lock_for_reset(handle.generation()) {
            return false;
        }
        let earlier = tick < node.deadline.load(Ordering::Relaxed);
        node.deadline.store(tick, Ordering::Relaxed);
        if node.state.unlock_reset(earlier) {
            Self::notify(this, shard, node, tick);
        } else if earlier {
            // In transit on a lane whose need may be later than the new deadline.
            this.shards[shard].make_urgent(tick);
        }
        Self::count(this, shard, Counted::Reset, 1);
        true
    }

    /// A thread's context is dropped: forward its lane, return its magazine, retire the lane.
    pub(crate) fn close_lane(&self, shard_index: usize, lane: &Lane) {
        let shard = &self.shards[shard_index];
        // At shutdown the nodes stay on the lane for the last turn.
        if lane.enter(&self.shutdown) {
            let mut forward = ChainBuilder::default();
            for node in lane.take() {
                forward.push(node, 0);
            }
            if let Some((first, last, _)) = forward.finish() {
                // SAFETY: a chain of live nodes held by this thread, linked in order.
                unsafe { shard.inbox.push_chain(first, last) };
            }
            lane.leave();
        }
        // SAFETY: the exiting thread is the lane's producer.
        unsafe { lane.with_producer(|side| side.magazine.give_back(&shard.pool)) };
        lane.close();
        shard.lane_closed();
    }
}

/// By when the worker needs a forwarded node: a new timer by its deadline, a message by
/// [`fresh_need`] (or its timer's deadline, if a reset brought it forward).
fn forward_need(node: &TimerNode, seen: Observed, now: u64, shard: &Shard) -> u64 {
    match seen.phase() {
        Phase::Pending if !seen.is_filed() => node.deadline(),
        Phase::Pending => node.deadline().min(fresh_need(shard, now)),
        _ => fresh_need(shard, now),
    }
}

/// By when the worker must take what a thread starts sending.
#[inline]
fn fresh_need(shard: &Shard, now: u64) -> u64 {
    riding_planned_wake(shard, now, LANE_HORIZON)
}

/// By when the worker takes back an old generation if its producer goes quiet: a busy producer
/// takes it back itself within two horizons, and a sooner need would wake the worker for a
/// generation already gone.
#[inline]
fn quiet_need(shard: &Shard, now: u64) -> u64 {
    riding_planned_wake(shard, now, 2 * OLD_HORIZON + 1)
}

/// The worker's planned wake-up held within `soonest`..=[`IDLE_LANE_HORIZON`] ticks of `now`, so
/// that a need costs no wake-up of its own.
#[inline]
fn riding_planned_wake(shard: &Shard, now: u64, soonest: u64) -> u64 {
    let latest = now.saturating_add(IDLE_LANE_HORIZON);
    match shard.planned_wake() {
        AWAKE => latest,
        planned => planned.clamp(now.saturating_add(soonest), latest),
    }
}

/// Cancelled before ever filed: nobody else can reach it, so this thread frees it.
fn recyclable(seen: Observed) -> bool {
    seen.phase() == Phase::Cancelled && !seen.is_filed()
}

/// What one reclaim forwards: on the lane's ring [`CHUNK`] at a time, or as one chain on the inbox
/// when the ring is full.
struct ForwardBatch {
    indices: [u32; CHUNK],
    len: usize,
    /// The earliest need among `indices`.
    need: u64,
    published: Option<u64>,
    /// Nodes the ring had no room for.
    overflow: ChainBuilder,
}

impl ForwardBatch {
    fn new() -> Self {
        Self {
            indices: [0; CHUNK],
            len: 0,
            need: u64::MAX,
            published: None,
            overflow: ChainBuilder::default(),
        }
    }

    /// Adds a node the caller holds, on no chain.
    ///
    /// # Safety
    /// The caller is `lane`'s producer.
    unsafe fn push(
        &mut self,
        (lane, shard): (&Lane, &ShardState),
        node: NonNull<TimerNode>,
        need: u64,
        now: u64,
    ) {
        if self.len == CHUNK {
            // SAFETY: forwarded from the caller.
            unsafe { self.flush(lane, shard, now) };
        }
        self.indices[self.len] = shard.pool.index_of(node);
        self.len += 1;
        self.need = self.need.min(need);
    }

    /// Publishes the indices gathered, or chains their nodes for the inbox.
    ///
    /// # Safety
    /// The caller is `lane`'s producer.
    unsafe fn flush(&mut self, lane: &Lane, shard: &ShardState, now: u64) {
        let indices = &self.indices[..self.len];
        // SAFETY: the caller is the lane's producer.
        match unsafe { lane.forward.publish(indices, self.need, now) } {
            Some(need) => self.published = Some(need),
            None => {
                for &index in indices {
                    if let Some(node) = shard.pool.node(index) {
                        self.overflow.push(NonNull::from(node), self.need);
                    }
                }
            }
        }
        (self.len, self.need) = (0, u64::MAX);
    }

    /// Sends what is left, waking the owner if needed.
    ///
    /// # Safety
    /// The caller is `lane`'s producer, and holds every node of the batch.
    unsafe fn send(mut self, lane: &Lane, shard: &ShardState, now: u64) {
        // SAFETY: forwarded from the caller.
        unsafe { self.flush(lane, shard, now) };
        if let Some(need) = self.published {
            shard.wake_for(need);
        }
        if let Some((first, last, need)) = self.overflow.finish() {
            // SAFETY: a chain of live nodes the caller holds, linked in order.
            unsafe { shard.inbox.push_chain(first, last) };
            shard.wake_for(need);
        }
    }
}
