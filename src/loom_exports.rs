//! The lock-free internals, exposed only to the loom models in `loom-tests/` (built with
//! `--cfg loom`). Not part of the API: this module does not exist in a normal build.

pub use crate::sync::mpsc::testing::{Message, consume, message};
pub use crate::sync::mpsc::{Link, Linked, Pop, Queue, link_after};
pub use crate::sync::timer_state::{
    AfterFire, Cancelled, Defused, Kind, Observed, Phase, Received, TimerState,
};

use std::ptr::NonNull;

use crate::engine::timer_node::TimerNode;

/// One shard's pieces of a worker's loop, driven by hand: the owner's look at its
/// wheel, the owner's run of a run of claimed timers, another worker's steal from the
/// run queue, and another worker standing in for a stuck owner. Each returns the
/// timers it claimed or ran.
pub mod shard_steps {
    use crate::TimerEngine;

    /// The owner looks at shard `shard`'s wheel (waiting out a stand-in's hold) and
    /// claims what is due onto the run queue. Returns the timers claimed.
    pub fn owner_look(engine: &TimerEngine, shard: usize) -> usize {
        let shared = engine.shared();
        let (shard_ref, now) = (&shared.shards[shard], shared.clock.now());
        let look = shard_ref.owner_look(now, shared.ticks.floor(now));
        look.deferred_drops.free(shard_ref);
        look.claimed
    }

    /// The owner runs one run of at most `most` timers off its queue. Returns the
    /// callbacks run.
    pub fn owner_run(engine: &TimerEngine, shard: usize, most: usize) -> usize {
        let shared = engine.shared();
        let shard_ref = &shared.shards[shard];
        let now_tick = shared.ticks.floor(shared.clock.now());
        shard_ref.run.take(most).map_or(0, |run| {
            crate::engine::runner::run(shard_ref, run.indices(), now_tick, true)
        })
    }

    /// Another worker takes one run of at most `most` timers off shard `shard`'s queue
    /// and runs it, as a thief does (the real steal, told of a backlog of twice `most`).
    /// Returns the callbacks run.
    pub fn steal(engine: &TimerEngine, shard: usize, most: usize) -> usize {
        let shared = engine.shared();
        let backlog = most.saturating_mul(2);
        let now_tick = shared.now_tick();
        shared
            .idle_workers
            .steal(
                &shared.shards,
                &shared.shards[shard],
                &shared.shutdown,
                now_tick,
                backlog,
                None,
            )
            .unwrap_or(0)
    }

    /// Another worker stands in for shard `shard`'s owner: claims what is due if the
    /// owner is not holding the wheel, then runs the queue. Returns the callbacks run.
    pub fn stand_in(engine: &TimerEngine, shard: usize) -> usize {
        let shared = engine.shared();
        crate::engine::idle_workers::IdleWorkers::stand_in(
            &shared.shards[shard],
            &shared.shutdown,
            shared.now_at(shared.clock.now()),
            None,
            None,
        )
    }

    /// The wheel's holder (waiting out another's hold) hands out the lists of shard
    /// `shard`'s due slots whole, however few timers they hold, as an owner's look does with
    /// a burst (see `engine::due_lists`). Until every list is walked, the owner's looks do
    /// nothing else. Returns whether it handed any out.
    pub fn hand_out(engine: &TimerEngine, shard: usize) -> bool {
        let shared = engine.shared();
        let (shard_ref, now) = (&shared.shards[shard], shared.clock.now());
        shard_ref.with_wheel_waiting(|wheel| wheel.hand_out_now(shard_ref, now))
    }

    /// A worker walks one batch of shard `shard`'s handed-out lists and runs what it
    /// claimed, as a helper does. Returns the callbacks run, `None` if it found no list.
    pub fn walk(engine: &TimerEngine, shard: usize) -> Option<usize> {
        let shared = engine.shared();
        let shard_ref = &shared.shards[shard];
        let mut ran = 0;
        shard_ref
            .walk_hand_outs(&shared.shutdown, 0, |batch, due| {
                ran = crate::engine::runner::run(shard_ref, batch, due, false);
            })
            .then_some(ran)
    }

    /// [`owner_look`] with a clock reading of the caller's, which may be older than
    /// one another thread already looked with.
    pub fn owner_look_at(engine: &TimerEngine, shard: usize, now: std::time::Instant) -> usize {
        let shared = engine.shared();
        let shard_ref = &shared.shards[shard];
        let look = shard_ref.owner_look(now, shared.ticks.floor(now));
        look.deferred_drops.free(shard_ref);
        look.claimed
    }

    /// [`stand_in`] with a clock reading of the caller's, which may be older than one
    /// another thread already looked with.
    pub fn stand_in_at(engine: &TimerEngine, shard: usize, now: std::time::Instant) -> usize {
        let shared = engine.shared();
        crate::engine::idle_workers::IdleWorkers::stand_in(
            &shared.shards[shard],
            &shared.shutdown,
            shared.now_at(now),
            None,
            None,
        )
    }

    /// Marks shard `shard`'s owner as running callbacks (as an owner stuck in one is),
    /// or not.
    pub fn set_owner_running(engine: &TimerEngine, shard: usize, running: bool) {
        engine.shared().shards[shard].set_running(running);
    }

    /// Shard `shard`'s owner begins running timers as its worker does: marks itself
    /// running, then wakes a parked worker to watch for it getting stuck unless someone
    /// watches or another worker will go to sleep soon anyway. Returns whether it woke one.
    pub fn owner_begins_running(engine: &TimerEngine, shard: usize) -> bool {
        let shared = engine.shared();
        let shard_ref = &shared.shards[shard];
        shard_ref.set_running(true);
        shared
            .idle_workers
            .running(&shared.shards, shard_ref, shared.now_tick())
    }

    /// Shard `shard`'s worker goes to sleep until tick `plan` as its worker does: publishes
    /// the plan and becomes wakeable. `None` if it found helpers' work waiting (it does
    /// not sleep then); else it sleeps until [`Sleeper::wake`].
    pub fn worker_sleeps_until(engine: &TimerEngine, shard: usize, plan: u64) -> Option<Sleeper> {
        let shared = engine.shared();
        shared.shards[shard].plan_wake(plan);
        let idle = shared
            .idle_workers
            .begin_idle(&shared.shards, shard, shared.now_tick())?;
        Some(Sleeper { idle, shard })
    }

    /// A worker asleep in a model: see [`worker_sleeps_until`].
    pub struct Sleeper {
        idle: crate::engine::idle_workers::Idle,
        shard: usize,
    }

    impl Sleeper {
        /// The tick by which it wakes to look for stuck owners, if it watches.
        pub fn watch(&self) -> Option<u64> {
            self.idle.watch
        }

        /// It wakes, as its worker does when its park ends.
        pub fn wake(self, engine: &TimerEngine) {
            let shared = engine.shared();
            shared.idle_workers.end_idle(self.idle);
            shared.shards[self.shard].plan_wake(crate::engine::shard_state::AWAKE);
        }
    }

    /// The engine's current tick.
    pub fn now_tick(engine: &TimerEngine) -> u64 {
        engine.shared().now_tick()
    }
}

/// A handle's node index and generation, so that a model can tell that a node was
/// reused by a later timer.
pub fn handle_parts(handle: crate::TimerHandle) -> (u32, u32) {
    (handle.index(), handle.generation())
}

std::thread_local! {
    /// The region of the pool the model on this test thread made last: a node's index
    /// is its offset there. A model makes one pool at a time, and loom runs a model's
    /// threads on its test's own thread, so this names the pool its nodes come from.
    static REGION: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A pool node, as its holder names it. The index is worked out when the node is
/// handed out, so that naming it never touches memory the pool may have dropped since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    node: NonNull<TimerNode>,
    index: u32,
}

// SAFETY: a `Node` is a name; every access through it is behind an `unsafe` method
// whose caller vouches that the pool is alive and that it holds the node.
unsafe impl Send for Node {}

impl Node {
    /// # Safety
    /// `node` must be a live pool node.
    unsafe fn new(node: NonNull<TimerNode>) -> Self {
        let region = REGION.with(std::cell::Cell::get);
        let index = (node.as_ptr() as usize - region) / size_of::<TimerNode>();
        Self {
            node,
            index: index as u32,
        }
    }

    /// The node's index in its pool.
    pub fn index(self) -> u32 {
        self.index
    }
}

/// A shard's node pool ([`crate::engine::pool::Pool`]).
pub struct Pool(crate::engine::pool::Pool);

impl Pool {
    /// An empty pool: no chunk yet.
    #[allow(clippy::new_without_default, reason = "test-only wrapper")]
    pub fn new() -> Self {
        let pool = crate::engine::pool::Pool::new();
        REGION.with(|region| region.set(pool.region_start() as usize));
        Self(pool)
    }

    /// Chunks allocated so far.
    pub fn chunks(&self) -> usize {
        self.0.chunks()
    }

    /// Nodes not free.
    pub fn nodes_in_use(&self) -> usize {
        self.0.nodes_in_use()
    }

    /// The state word of the node at `index`, as a stale handle would find it.
    pub fn state(&self, index: u32) -> Option<&TimerState> {
        self.0.node(index).map(|node| &node.state)
    }
}

/// One thread's free nodes ([`crate::engine::pool::Magazine`]).
pub struct Magazine(crate::engine::pool::Magazine);

impl Magazine {
    /// An empty magazine.
    #[allow(clippy::new_without_default, reason = "test-only wrapper")]
    pub fn new() -> Self {
        Self(crate::engine::pool::Magazine::EMPTY)
    }

    /// Takes the free nodes of a word of `pool`'s bitmap (or grows it) into this empty
    /// magazine.
    pub fn refill(&mut self, pool: &Pool) -> bool {
        self.0.refill(&pool.0)
    }

    /// Takes one node.
    pub fn take(&mut self) -> Option<Node> {
        // SAFETY: a magazine's nodes are live pool nodes.
        self.0.take().map(|node| unsafe { Node::new(node) })
    }

    /// Adds a free node.
    ///
    /// # Safety
    /// The caller must hold `node` exclusively, its pool must be alive, and the node
    /// must be on no other chain.
    pub unsafe fn put(&mut self, node: Node) {
        self.0.put(node.node);
    }

    /// Nodes held.
    pub fn len(&self) -> u32 {
        self.0.len()
    }

    /// Whether the magazine holds no node.
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }

    /// Gives every node back to `pool`'s bitmap.
    pub fn give_back(&mut self, pool: &Pool) {
        self.0.give_back(&pool.0);
    }
}

/// Ticks a timer may wait on a lane's old stack before the producer forwards it
/// ([`crate::engine::lane::OLD_HORIZON`]).
pub const OLD_HORIZON: u64 = crate::engine::lane::OLD_HORIZON;

/// One thread's lane into a shard ([`crate::engine::lane::Lane`]).
pub struct Lane(crate::engine::lane::Lane);

impl Lane {
    /// An empty lane.
    #[allow(clippy::new_without_default, reason = "test-only wrapper")]
    pub fn new() -> Self {
        Self(crate::engine::lane::Lane::new())
    }

    /// Pushes `node`, needed by tick `need`.
    ///
    /// # Safety
    /// As [`crate::engine::lane::Lane::push`]: only the producer thread pushes, and `node` is
    /// live, held by the caller and on no chain.
    pub unsafe fn push(&self, node: Node, need: u64) {
        // SAFETY: forwarded from the caller.
        let _ = unsafe { self.0.push(node.node, need, || need) };
    }

    /// The producer takes everything back.
    ///
    /// # Safety
    /// Only the producer thread may call this, and the nodes' pool must be alive.
    pub unsafe fn claim(&self) -> Vec<Node> {
        // SAFETY: forwarded from the caller; taken nodes are live.
        unsafe { self.0.claim() }
            .map(|node| unsafe { Node::new(node) })
            .collect()
    }

    /// Parks `chain` on the old stack at tick `now`, as the producer does with the
    /// pending timers it claimed: the nodes are linked first to last in the order given
    /// (so a take finds them in that order, ahead of what was parked before), each
    /// needed by the tick beside it. Returns the old stack's need if this set or lowered
    /// it (the producer then checks whether to wake the worker).
    ///
    /// # Safety
    /// As [`crate::engine::lane::Lane::park`]: only the producer thread may call this, `chain`
    /// is not empty, and its nodes are live, distinct, held by the caller and on no
    /// chain.
    pub unsafe fn park(&self, chain: &[(Node, u64)], now: u64) -> Option<u64> {
        let mut builder = crate::engine::lane::ChainBuilder::default();
        for &(node, need) in chain {
            builder.push(node.node, need);
        }
        let (first, last, earliest) = builder.finish().expect("a parked chain has a node");
        let quiet = now.saturating_add(2 * OLD_HORIZON + 1);
        // SAFETY: forwarded from the caller; the builder linked the chain first to last.
        unsafe { self.0.park(first, last, earliest, quiet) }
    }

    /// The producer takes the old stack back if its timers have waited
    /// [`OLD_HORIZON`] ticks by tick `now`.
    ///
    /// # Safety
    /// Only the producer thread may call this, and the nodes' pool must be alive.
    pub unsafe fn claim_old_if_due(&self, now: u64) -> Vec<Node> {
        // SAFETY: forwarded from the caller; taken nodes are live.
        unsafe { self.0.claim_old_if_due(now) }
            .map(|node| unsafe { Node::new(node) })
            .collect()
    }

    /// The worker takes everything.
    ///
    /// # Safety
    /// The nodes' pool must be alive.
    pub unsafe fn take(&self) -> Vec<Node> {
        // SAFETY: taken nodes are live, by the caller's contract.
        self.0
            .take()
            .map(|node| unsafe { Node::new(node) })
            .collect()
    }

    /// The worker's take at tick `now`: each stack whose need has come.
    ///
    /// # Safety
    /// The nodes' pool must be alive.
    pub unsafe fn take_due(&self, now: u64) -> Vec<Node> {
        // SAFETY: taken nodes are live, by the caller's contract.
        self.0
            .take_due(now, false)
            .map(|node| unsafe { Node::new(node) })
            .collect()
    }

    /// The tick by which the worker must take the lane, `None` when empty.
    pub fn need(&self) -> Option<u64> {
        self.0.need()
    }
}

/// The most indices a lane's forward ring holds
/// ([`crate::engine::forward_ring::RING`]).
pub const FORWARD_RING: usize = crate::engine::forward_ring::RING;

/// A shard's urgent tick, as resets of timers in transit ask for it and the worker takes
/// it ([`crate::engine::shard_state::ShardState`]).
pub struct Urgency(crate::engine::shard_state::ShardState);

impl Urgency {
    /// No urgency asked for.
    #[allow(clippy::new_without_default, reason = "test-only wrapper")]
    pub fn new() -> Self {
        Self(crate::engine::shard_state::ShardState::new(1))
    }

    /// Asks the worker to take every lane by tick `need`.
    pub fn make_urgent(&self, need: u64) {
        self.0.make_urgent(need);
    }

    /// How many times urgency has been asked for.
    pub fn asked(&self) -> u64 {
        self.0.urgent_asked()
    }

    /// A producer's check after publishing timers it cannot look at again.
    pub fn ask_again_if_asked_since(&self, asked: u64, now: u64) {
        self.0.ask_again_if_asked_since(asked, now);
    }

    /// The worker at tick `now`: whether it takes the urgent tick (and then every lane).
    pub fn take_urgent(&self, now: u64) -> bool {
        self.0.take_urgent(now)
    }

    /// The urgent tick still asked for, `u64::MAX` if none.
    pub fn urgent(&self) -> u64 {
        self.0.urgent()
    }
}

/// The most indices one take from a forward ring returns
/// ([`crate::engine::forward_ring::CHUNK`]).
pub const FORWARD_CHUNK: usize = crate::engine::forward_ring::CHUNK;

/// A lane's forward ring ([`crate::engine::forward_ring::ForwardRing`]).
pub struct ForwardRing(crate::engine::forward_ring::ForwardRing);

impl ForwardRing {
    /// An empty ring.
    #[allow(clippy::new_without_default, reason = "test-only wrapper")]
    pub fn new() -> Self {
        Self(crate::engine::forward_ring::ForwardRing::new())
    }

    /// Publishes `indices`, needed by tick `need`, at tick `now`: the ring's need, or
    /// `None` (nothing published) when they do not all fit.
    ///
    /// # Safety
    /// Only one thread, the producer, may publish.
    pub unsafe fn publish(&self, indices: &[u32], need: u64, now: u64) -> Option<u64> {
        // SAFETY: forwarded from the caller.
        unsafe { self.0.publish(indices, need, now) }
    }

    /// Takes up to [`FORWARD_CHUNK`] indices, oldest first.
    ///
    /// # Safety
    /// Only one thread at a time may take.
    pub unsafe fn take(&self) -> Vec<u32> {
        let mut out = [0; FORWARD_CHUNK];
        // SAFETY: forwarded from the caller.
        let taken = unsafe { self.0.take(&mut out) };
        out[..taken].to_vec()
    }

    /// The tick by which the consumer must take the ring, `None` when it is empty.
    pub fn need(&self) -> Option<u64> {
        self.0.need()
    }
}
