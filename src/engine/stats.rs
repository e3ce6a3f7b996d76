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
    /// Timers taken out of this shard's wheel onto its run queue by another worker while
    /// the owner was stuck in a callback (they are counted in `stolen` too when that worker
    /// runs them). A burst's due lists that such a worker hands out are claimed by
    /// whoever walks them, and counted in `claimed_elsewhere` when that is not the owner.
    pub rescued: u64,
    /// Due timers claimed by another shard's worker from this shard's wheel: a burst's
    /// lists of due timers, which the owner hands out for idle workers to claim and run in
    /// parallel with it once more is due than its run queue holds (they are counted in
    /// `stolen` too when they run). 0 with [`stealing`](crate::EngineBuilder::stealing)
    /// off or a single worker.
    pub claimed_elsewhere: u64,
    /// Pending timers run by a shutdown that asked for it.
    pub ran_at_shutdown: u64,
    /// Pending timers dropped unrun by a shutdown.
    pub dropped_at_shutdown: u64,
    /// Why the shard's worker woke up, how many times: at rest, the engine's cost.
    pub wakes: WorkerWakes,
}

/// How many times a shard's worker woke from sleep, by what it had slept until and what it
/// found. A worker with nothing pending sleeps until woken, so an idle engine's counts
/// stay still, once the watch for stuck owners (with two workers or more and
/// [`rescue_after`](crate::EngineBuilder::rescue_after) on) has stopped lingering, 64 times
/// `rescue_after` ticks after the last callback ran. At a light load, these wake-ups are
/// most of what the engine costs.
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
    /// At the tick it planned for its wheel, with no timer due: timers to move down ahead
    /// of time, or the tick of a timer cancelled since.
    pub wheel: u64,
    /// At the tick by which it had to take what a thread left on its lane (cancels, timers
    /// due later), with no timer due.
    pub lane: u64,
    /// At a tick it planned no more than a few ticks ahead, with no timer due: threads kept
    /// arming timers due before its plans, so it wakes on its own for a while rather than
    /// be woken for each.
    pub close: u64,
    /// To look at the other shards for an owner stuck in a callback (see
    /// [`rescue_after`](crate::EngineBuilder::rescue_after)).
    pub watch: u64,
    /// Before its plan, woken by another thread: a timer armed to fall due sooner, a
    /// backlog to help with, a stuck owner to watch, shutdown.
    pub woken: u64,
}

impl WorkerWakes {
    /// Every wake-up counted.
    pub fn total(&self) -> u64 {
        self.due + self.wheel + self.lane + self.close + self.watch + self.woken
    }

    fn add(&mut self, other: &Self) {
        self.due += other.due;
        self.wheel += other.wheel;
        self.lane += other.lane;
        self.close += other.close;
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
    /// Workers pinned to a CPU. Final once [`build`](crate::EngineBuilder::build) has
    /// returned, which waits for every worker to try; 0 for an engine driven by hand.
    pub pinned_workers: usize,
    /// Bytes of timer-node memory the shards' pools hold. Nodes are pooled, not freed,
    /// while the engine lives, so this is the high-water mark of timers in flight.
    pub pool_bytes: usize,
}
