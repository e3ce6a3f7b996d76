//! What [`TimerEngine::stats`](crate::TimerEngine::stats) reports.

/// Counts for one shard, or for the whole engine.
///
/// Counts are kept by the thread that does each thing (schedules, cancels and resets by the
/// calling thread, the rest by the shard's worker) and read without stopping anyone, so a
/// snapshot taken while timers are in flight can be a little behind; `pending` is derived
/// and can briefly lag the others.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardStats {
    /// Timers scheduled (a repeating timer counts once).
    pub scheduled: u64,
    /// Callback runs, each run of a repeating timer included.
    pub fired: u64,
    /// Successful cancels.
    pub cancelled: u64,
    /// Successful resets.
    pub reset: u64,
    /// Timers that will still run: scheduled, and not yet fired (one-shot), cancelled or
    /// ended by shutdown.
    pub pending: u64,
    /// Callback runs that panicked (the panic was caught and the worker went on).
    pub panicked: u64,
    /// Callback runs more than one tick after their deadline.
    pub late: u64,
    /// Callback runs of this shard's timers by another shard's worker: stolen from a burst
    /// of expirations, or run for a stuck owner.
    pub stolen: u64,
    /// Timers taken out of this shard's wheel by another worker while the owner was stuck
    /// in a callback (they are counted in `stolen` too when that worker runs them).
    pub rescued: u64,
    /// Pending timers run by a shutdown that asked for it.
    pub ran_at_shutdown: u64,
    /// Pending timers dropped unrun by a shutdown.
    pub dropped_at_shutdown: u64,
}

impl ShardStats {
    pub(crate) fn add(&mut self, other: &Self) {
        self.scheduled += other.scheduled;
        self.fired += other.fired;
        self.cancelled += other.cancelled;
        self.reset += other.reset;
        self.pending += other.pending;
        self.panicked += other.panicked;
        self.late += other.late;
        self.stolen += other.stolen;
        self.rescued += other.rescued;
        self.ran_at_shutdown += other.ran_at_shutdown;
        self.dropped_at_shutdown += other.dropped_at_shutdown;
    }
}

/// Counts per shard and in total, and what the engine holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// The sum over every shard.
    pub total: ShardStats,
    /// One entry per shard, in shard order.
    pub shards: Vec<ShardStats>,
    /// Workers pinned to a CPU. Final once [`build`](crate::EngineBuilder::build) has
    /// returned, which waits for every worker to try; 0 for an engine driven by hand.
    pub pinned_workers: usize,
    /// Bytes of timer-node memory the shards' pools hold. Nodes are pooled, not freed,
    /// while the engine lives, so this is the high-water mark of timers in flight.
    pub pool_bytes: usize,
}
