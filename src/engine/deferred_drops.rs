//! Timers a look took off the wheel for good whose captures have a `Drop`: user code that may
//! block, so they are dropped once the wheel is let go, marked as running callbacks, where a
//! watcher can stand in ([`stuck_owners`](crate::engine::stuck_owners)). The last turn and its
//! sweeps drop them under the wheel.

use std::ptr::NonNull;

use crate::engine::lane::{Chain, ChainBuilder};
use crate::engine::pool::Magazine;
use crate::engine::runner;
use crate::engine::shard_state::ShardState;
use crate::engine::timer_node::TimerNode;

/// Nodes taken off a wheel, callbacks not yet dropped; must be [`free`](Self::free)d.
#[must_use = "the nodes return to the pool only through `free`"]
pub(crate) struct DeferredDrops {
    chain: Option<Chain>,
}

/// Collects the nodes of one look.
#[derive(Default)]
pub(crate) struct DeferredDropsBuilder {
    chain: ChainBuilder,
}

// SAFETY: ground rule 2: the chained nodes are the builder's holder's.
unsafe impl Send for DeferredDropsBuilder {}

impl DeferredDropsBuilder {
    /// Adds a node the caller holds, on no list or queue.
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
        // The iterator reads each link before handing the node out.
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
