//! What [`TimerEngine::stats`](crate::TimerEngine::stats) reports.

/// Counts for one shard, or for the whole engine.
///
/// Read without stopping anyone: a snapshot taken while timers are in flight can be a little
/// behind.
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
    /// Timers that will still run: not yet fired (one-shot), cancelled or ended by shutdown.
    pub pending: u64,
    /// Callback runs that panicked (the panic was caught and the worker went on).
    pub panicked: u64,
    /// Callback runs more than one tick after their deadline.
    pub late: u64,
    /// Callback runs of this shard's timers by another shard's worker.
    pub stolen: u64,
    /// Timers claimed from this shard's wheel by a worker standing in for its stuck owner.
    pub rescued: u64,
    /// Due timers of a burst claimed by another shard's worker.
    pub claimed_elsewhere: u64,
    /// Pending timers run by a shutdown that asked for it.
    pub ran_at_shutdown: u64,
    /// Pending timers dropped unrun by a shutdown.
    pub dropped_at_shutdown: u64,
    /// Why the shard's worker woke up, how many times: at rest, the engine's cost.
    pub wakes: WorkerWakes,
}

/// How many times a shard's worker woke, by what it had slept until and what it found.
///
/// ```
/// let engine = corewheel::TimerEngine::builder().workers(1).build()?;
/// let wakes = engine.stats().total.wakes;
/// println!("{} wake-ups, {} of them with timers due", wakes.total(), wakes.due);
/// # Ok::<(), corewheel::BuildError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerWakes {
    /// At the tick it planned, with timers due: it ran them.
    pub due: u64,
    /// At the tick it planned for its wheel, with no timer due.
    pub wheel: u64,
    /// At the tick by which it had to take what a thread left on its lane, with no timer due.
    pub lane: u64,
    /// To watch for a stuck owner ([`rescue_after`](crate::EngineBuilder::rescue_after)).
    pub watch: u64,
    /// Before its plan, woken by another thread.
    pub woken: u64,
}

impl WorkerWakes {
    /// Every wake-up counted.
    pub fn total(&self) -> u64 {
        self.due + self.wheel + self.lane + self.watch + self.woken
    }

    fn add(&mut self, other: &Self) {
        self.due += other.due;
        self.wheel += other.wheel;
        self.lane += other.lane;
        self.watch += other.watch;
        self.woken += other.woken;
    }
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
        self.claimed_elsewhere += other.claimed_elsewhere;
        self.ran_at_shutdown += other.ran_at_shutdown;
        self.dropped_at_shutdown += other.dropped_at_shutdown;
        self.wakes.add(&other.wakes);
    }
}

/// Counts per shard and in total, and what the engine holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// The sum over every shard.
    pub total: ShardStats,
    /// One entry per shard, in shard order.
    pub shards: Vec<ShardStats>,
    /// Workers pinned to a CPU, final once [`build`](crate::EngineBuilder::build) returns;
    /// 0 for an engine driven by hand.
    pub pinned_workers: usize,
    /// Bytes of timer-node memory the pools hold: pooled, not freed, so a high-water mark.
    pub pool_bytes: usize,
}
