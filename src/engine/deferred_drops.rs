//! Timers a look at a shard's wheel took off for good, whose callbacks' captures have a
//! `Drop`: the look chains them here, and drops them once it has let the wheel go, marked
//! as running callbacks.
//!
//! Why not at once: a `Drop` is user code and may block, and under the wheel nobody could
//! stand in (a stand-in needs the wheel). After, it is like a blocking callback: a watcher
//! notices and stands in ([`stuck_owners`](crate::engine::stuck_owners)). Captures without drop glue
//! are freed at once (nothing can block, and a second visit would cost), as are those of
//! the last turn and its sweeps, which run callbacks under the wheel anyway.
//! Ground rules: [`engine`](crate::engine).

use std::ptr::NonNull;

use crate::engine::lane::{Chain, ChainBuilder};
use crate::engine::pool::Magazine;
use crate::engine::runner;
use crate::engine::shard_state::ShardState;
use crate::engine::timer_node::TimerNode;

/// Nodes held by the thread that took them off a shard's wheel, their callbacks not yet
/// dropped. Must be [`free`](Self::free)d, or the nodes never return to the pool.
#[must_use = "the nodes return to the pool only through `free`"]
pub(crate) struct DeferredDrops {
    chain: Option<Chain>,
}

/// Collects the nodes of one look (see [`DeferredDrops`]).
#[derive(Default)]
pub(crate) struct DeferredDropsBuilder {
    chain: ChainBuilder,
}

// SAFETY: ground rule 2: the chained nodes belong to the builder's holder (the wheel's);
// moving the builder moves that hold.
unsafe impl Send for DeferredDropsBuilder {}

impl DeferredDropsBuilder {
    /// Adds a node the caller holds, on no list or queue, its generation not yet moved on.
    pub(crate) fn push(&mut self, node: NonNull<TimerNode>) {
        self.chain.push(node, 0);
    }

    /// What was collected, leaving the builder empty.
    pub(crate) fn take(&mut self) -> DeferredDrops {
        let chain = std::mem::take(&mut self.chain);
        DeferredDrops {
            chain: (!chain.is_empty()).then(|| chain.into_chain()),
        }
    }
}

impl DeferredDrops {
    /// Nothing to free.
    pub(crate) const NONE: Self = Self { chain: None };

    pub(crate) fn is_empty(&self) -> bool {
        self.chain.is_none()
    }

    /// Drops each node's callback (catching panics) and frees it; with the wheel let go.
    pub(crate) fn free(mut self, shard: &ShardState) {
        let Some(chain) = self.chain.take() else {
            return;
        };
        let mut freed = Magazine::EMPTY;
        // The iterator reads each link before handing the node out, so freeing is safe.
        for node in chain {
            runner::free_into(shard, node, &mut freed);
        }
        freed.give_back(&shard.pool);
    }
}

impl Drop for DeferredDrops {
    fn drop(&mut self) {
        debug_assert!(
            self.chain.is_none(),
            "timers taken off a wheel were never freed"
        );
    }
}
