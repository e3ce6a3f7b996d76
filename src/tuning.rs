//! Every tuning constant of the engine and the wheel, in one place, each with a line on
//! what sets it. The code that uses one says why it works the way it does; this file says
//! why the number is what it is. The A/B runs behind these choices are under
//! `perf/results/ablation/`. Under loom (and Miri, where it matters) some are smaller, so
//! that models with a handful of timers reach every path.
//!
//! Constants that are not tuning (bit layouts, sentinels, the public limits
//! [`MAX_WORKERS`](crate::engine::builder::MAX_WORKERS) and
//! [`DEFAULT_RESCUE_AFTER`](crate::engine::builder::DEFAULT_RESCUE_AFTER), the inline
//! callback sizes) stay beside the code they describe.

// ----- Lanes: what a thread stages for its shard -----

/// Pushes after which a thread takes its lane back: a batch large enough to amortise the
/// swap, small enough that a request timeout cancelled within it never leaves the thread.
#[cfg(not(loom))]
pub(crate) const CLAIM_EVERY: u32 = 64;
#[cfg(loom)]
pub(crate) const CLAIM_EVERY: u32 = 2;

/// Ticks an old generation collects parked timers, then waits before it is taken back:
/// set by how long a proxy's request timeouts usually live before their cancel.
pub(crate) const OLD_HORIZON: u64 = 4;

/// The fewest ticks a node waits on a lane before the worker takes it (unless due
/// sooner): one, so a message rides the worker's planned wake-up.
pub(crate) const LANE_HORIZON: u64 = 1;

/// The most ticks a node waits on a lane (unless due sooner): long enough that an idle
/// thread's cancels ride the worker's own wake-ups, short enough to free nodes promptly.
pub(crate) const IDLE_LANE_HORIZON: u64 = 32;

/// Node indices a lane's forward ring holds (16 KiB a lane): room for a thread cancelling
/// as fast as it can while the worker wakes.
#[cfg(not(loom))]
pub(crate) const RING: usize = 4096;
#[cfg(loom)]
pub(crate) const RING: usize = 4;

/// Indices forwarded or taken at a time through a stack buffer: enough for their cache
/// misses to overlap.
#[cfg(not(loom))]
pub(crate) const CHUNK: usize = 256;
#[cfg(loom)]
pub(crate) const CHUNK: usize = 2;

/// Entries in a forward ring at which a publish asks for the worker by the next tick (at
/// half full, at once): early enough that the ring rarely overflows to the inbox.
pub(crate) const RING_WAKE_AT: u64 = RING as u64 / 4;

// ----- The node pool -----

/// Nodes carved from a pool's reserved region at a time: a chunk is the unit of growth
/// (smaller under loom and Miri, which interpret every node carved).
#[cfg(not(any(loom, miri)))]
pub(crate) const CHUNK_NODES: usize = 1024;
#[cfg(all(miri, not(loom)))]
pub(crate) const CHUNK_NODES: usize = 256;
#[cfg(loom)]
pub(crate) const CHUNK_NODES: usize = 4;

/// Nodes a pool may hold unless the builder says otherwise: address space reserved, made
/// resident only as used (smaller under loom and Miri, which interpret every page).
#[cfg(not(any(loom, miri)))]
pub(crate) const DEFAULT_CAPACITY: usize = 4 << 20;
#[cfg(all(miri, not(loom)))]
pub(crate) const DEFAULT_CAPACITY: usize = 8 * CHUNK_NODES;
#[cfg(loom)]
pub(crate) const DEFAULT_CAPACITY: usize = 2 * CHUNK_NODES;

/// Free nodes a thread keeps per shard before handing a batch back to the pool: a few
/// refills' worth, so that arming rarely touches the shared bitmap.
pub(crate) const MAGAZINE_LIMIT: u32 = 4 * u64::BITS;

/// Bitmap words a refill looks at for one at least half free: enough to pass over the
/// nodes of timers still pending, few enough that a nearly full pool grows soon (fewer
/// under Miri, whose pool tests fill twice this many words).
#[cfg(not(miri))]
pub(crate) const LOOK_WORDS: usize = 64;
#[cfg(miri)]
pub(crate) const LOOK_WORDS: usize = 8;

/// A refill finding nothing half free near its cursor grows the pool while fewer than
/// one node in this many is free: the free band ahead of the cursor, bounding spare memory.
pub(crate) const SPARE_SHARE: u64 = 8;

/// Free nodes above which a refill searches the whole region before growing it.
pub(crate) const PLENTY_FREE: u64 = 2 * CHUNK_NODES as u64;

// ----- Claiming and running due timers -----

/// Entries a shard's run queue holds: small enough that claimed timers are still warm in
/// cache when they run.
#[cfg(not(loom))]
pub(crate) const RUN_QUEUE: usize = 1024;
#[cfg(loom)]
pub(crate) const RUN_QUEUE: usize = 4;

/// The most entries one take from a run queue gets: a run short enough that the owner
/// looks at its wheel often, long enough to amortise the take.
#[cfg(not(loom))]
pub(crate) const MAX_RUN: usize = 32;
#[cfg(loom)]
pub(crate) const MAX_RUN: usize = 2;

/// Entries on a run queue before idle workers are woken to take some: a backlog worth a
/// cross-core hand-over.
pub(crate) const STEAL_MIN: usize = MAX_RUN;

/// The share of a tick (one part in this many) a backlog's callbacks must take before the
/// owner wakes a parked worker to share them: a fire storm's ticks still wake a helper,
/// steady traffic's small backlogs do not.
pub(crate) const WAKE_FOR_TICK_PARTS: u64 = 32;

/// How long a watcher for stuck owners keeps watching after the last time any owner began
/// running timers, in multiples of `rescue_after`.
pub(crate) const LINGER_PERIODS: u64 = 64;

// ----- The clock -----

/// How long a thread's cycle-counter anchor is extrapolated before the real clock is read
/// again: long enough to save most reads, short enough that the rate's error stays tiny.
pub(crate) const ANCHOR_LIFE_NS: u64 = 1_000_000;

// ----- Claiming due timers, and bursts handed out to every worker -----

/// Due timers a look claims off the wheel at a time: enough to walk several due slots'
/// lists in turn.
pub(crate) const CLAIM_BATCH: usize = 64;

/// Nodes taken off a lane or the inbox ahead of filing them: enough for their cache
/// misses to overlap.
pub(crate) const RECEIVE_AHEAD: usize = 16;

/// Due timers left once a look fills the run queue that make it hand their lists out
/// rather than claim them itself: a few batches for each of a few walkers.
pub(crate) const HAND_OUT_AT_LEAST: u32 = 1024;

/// Lists a shard can have out at once, a bit each in one word: eight due finest slots at
/// [`SPLIT`] lists each.
#[cfg(not(loom))]
pub(crate) const LISTS: usize = 64;
#[cfg(loom)]
pub(crate) const LISTS: usize = 8;

/// Lists a walker takes at a time: walked from both ends, twice as many chains of cache
/// misses in flight on its core.
pub(crate) const WALK_LISTS: usize = 4;

/// Timers a walker walks before it runs what it claimed: a run's worth, so that a blocked
/// callback holds up no more timers claimed with it than a run's (the `rescue_after` bound).
pub(crate) const WALK_BATCH: usize = MAX_RUN;

// ----- The wheel -----

/// Lists each finest slot of an engine's wheel keeps, so that walking a burst keeps this
/// many chains of cache misses in flight (two under loom, so that a model's few timers
/// share lists).
#[cfg(not(loom))]
pub(crate) const SPLIT: usize = 8;
#[cfg(loom)]
pub(crate) const SPLIT: usize = 2;

/// Due finest slots a batch claim takes from in turn: the cache misses it keeps in flight.
pub(crate) const INTERLEAVE: usize = 16;

/// Timers a tick with nothing due moves into the lookahead at least: a few hundred
/// microseconds of cache misses at most, so no tick is held up by a millisecond of moves.
pub(crate) const LOOKAHEAD_BUDGET: usize = 1024;

/// Slots of the level below in which the next coarse slot's timers are moved down before
/// its boundary: enough for a slot of a million timers to move while a storm fires.
pub(crate) const PRE_CASCADE_SLOTS: usize = 4;

/// The pace of the moves ahead of time, in timers a tick: a coarse slot of `n` timers
/// starts moving `n / FILL_PER_TICK` ticks before it begins, so that no due timer waits
/// for a storm's worth of moves.
pub(crate) const FILL_PER_TICK: u64 = 2 * LOOKAHEAD_BUDGET as u64;
