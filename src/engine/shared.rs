//! The engine state every thread shares; what producers do with it is in
//! [`producer`](crate::engine::producer).

use std::time::{Duration, Instant};

use crate::engine::handle::TimerHandle;
use crate::engine::idle_workers::IdleWorkers;
use crate::engine::shard::Shard;
use crate::engine::shutdown::PendingTimers;
use crate::engine::timer_node::TimerNode;
use crate::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use crate::time::clock::Clock;
use crate::time::cycle_clock::CycleScale;
use crate::time::ticks::Ticks;

/// When a timer being armed is due.
#[derive(Debug, Clone, Copy)]
pub(crate) enum When {
    /// This long from now, as [`EngineShared::deadline_after`] reads "now".
    After(Duration),
    /// At this tick.
    AtTick(u64),
}

/// Shared by the engine handle, its workers and every thread's context.
pub(crate) struct EngineShared {
    pub(crate) id: std::num::NonZeroU32,
    pub(crate) shards: Box<[Shard]>,
    pub(crate) ticks: Ticks,
    pub(crate) clock: Box<dyn Clock>,
    /// How to extrapolate `clock` from the cycle counter (monotonic clock, trusted counter).
    pub(crate) cycles: Option<&'static CycleScale>,
    pub(crate) shutdown: AtomicBool,
    /// What the workers' last turn does with pending timers: a [`PendingTimers`] as a byte.
    pub(crate) pending_mode: AtomicU8,
    pub(crate) next_home: AtomicU64,
    pub(crate) idle_workers: IdleWorkers,
}

impl EngineShared {
    pub(crate) fn set_pending_mode(&self, pending: PendingTimers) {
        self.pending_mode
            .store(u8::from(pending == PendingTimers::Run), Ordering::SeqCst);
    }

    pub(crate) fn pending_mode(&self) -> PendingTimers {
        if self.pending_mode.load(Ordering::SeqCst) == 1 {
            PendingTimers::Run
        } else {
            PendingTimers::Drop
        }
    }

    #[inline]
    pub(crate) fn now_tick(&self) -> u64 {
        self.ticks.floor(self.clock.now())
    }

    /// `now` with its tick.
    #[inline]
    pub(crate) fn now_at(&self, now: Instant) -> (Instant, u64) {
        (now, self.ticks.floor(now))
    }

    /// Whether the timer `handle` names is waiting to fire (see
    /// [`TimerEngine::is_pending`](crate::TimerEngine::is_pending)).
    #[inline]
    pub(crate) fn is_pending(&self, handle: TimerHandle) -> bool {
        self.lookup(handle)
            .is_some_and(|(_, node)| node.state.is_pending(handle.generation()))
    }

    /// The shard and node a handle names, if the handle belongs to this engine.
    #[inline]
    pub(crate) fn lookup(&self, handle: TimerHandle) -> Option<(usize, &TimerNode)> {
        if handle.engine() != self.id.get() {
            return None;
        }
        let shard = self.shards.get(handle.shard() as usize)?;
        Some((handle.shard() as usize, shard.pool.node(handle.index())?))
    }
}
