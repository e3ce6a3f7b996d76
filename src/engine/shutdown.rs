//! What a shutdown does with pending timers, and what it reports.

/// What pending timers get at shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingTimers {
    /// Run every pending timer's callback once, now (early); repeating timers then stop.
    Run,
    /// Drop every pending timer's callback without running it.
    Drop,
}

/// What [`TimerEngine::shutdown`](crate::TimerEngine::shutdown) did with the timers still pending.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Pending timers whose callbacks were run (with [`PendingTimers::Run`]).
    pub ran: u64,
    /// Pending timers dropped unrun (with [`PendingTimers::Drop`]).
    pub dropped: u64,
}
