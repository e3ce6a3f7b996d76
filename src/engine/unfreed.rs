//! Timers that a look at a shard's wheel took off it for good (cancelled, or over), whose
//! callbacks still hold captures with a `Drop` of their own. The look leaves them chained
//! here, and whoever made it drops those callbacks once it has let the wheel go, marked as
//! running callbacks.
//!
//! Why not at once: dropping a capture runs user code, which may block (a bounded channel's
//! send in a `Drop`, a file closed on a hung mount) or take long (the last `Arc` of a large
//! structure). Dropped while the wheel is held, such a drop keeps the shard's due timers
//! waiting with nobody able to stand in, since a stand-in needs the wheel; and the owner,
//! waiting out a stand-in's hold, would spin. Dropped after, it is like a callback that
//! blocks: the shard counts as running, a watcher notices the owner stuck, and takes the
//! wheel to claim and run what comes due (see [`balance`](crate::engine::balance)).
//!
//! Callbacks whose drop runs nothing (captures without drop glue) are freed at once, as
//! before: nothing of theirs can block, and a second visit to their nodes would cost a
//! cancel-heavy shard for nothing. The last turn and the sweeps after it also free at
//! once: they run callbacks under the wheel anyway, and no stand-in follows them.
//!
//! Who may touch what, and when: the ground rules in [`engine`](crate::engine).

use std::ptr::NonNull;

use crate::engine::lane::{Chain, ChainBuilder};
use crate::engine::pool::Magazine;
use crate::engine::runner;
use crate::engine::shard_parts::ShardParts;
use crate::engine::timer_node::TimerNode;

/// Nodes held by the thread that took them off a shard's wheel, off every list and queue,
/// their callbacks not yet dropped. Must be [`free`](Self::free)d: dropped otherwise, the
/// nodes never return to the pool.
#[must_use = "the nodes return to the pool only through `free`"]
pub(crate) struct Unfreed {
    chain: Option<Chain>,
}

/// Collects the nodes of one look (see [`Unfreed`]).
#[derive(Default)]
pub(crate) struct UnfreedBuilder {
    chain: ChainBuilder,
}

// SAFETY: the chained nodes are pool nodes that the builder's holder (the wheel side's, so
// whoever holds the wheel) holds exclusively; moving the builder moves that hold, and no
// other thread reaches the nodes meanwhile.
unsafe impl Send for UnfreedBuilder {}

impl UnfreedBuilder {
    /// Adds a node the caller holds exclusively, on no list or queue, whose generation has
    /// not moved on (so every handle to it still reads it as cancelled or over).
    pub(crate) fn push(&mut self, node: NonNull<TimerNode>) {
        self.chain.push(node, 0);
    }

    /// What was collected, leaving the builder empty.
    pub(crate) fn take(&mut self) -> Unfreed {
        let chain = std::mem::take(&mut self.chain);
        Unfreed {
            chain: (!chain.is_empty()).then(|| chain.into_chain()),
        }
    }
}

impl Unfreed {
    /// Nothing to free.
    pub(crate) const NONE: Self = Self { chain: None };

    /// Whether there is nothing to free.
    pub(crate) fn is_empty(&self) -> bool {
        self.chain.is_none()
    }

    /// Drops each node's callback (a panic in a capture's `Drop` is caught and counted),
    /// moves its generation on and gives it back to `shard`'s pool. Call it with the
    /// wheel let go.
    pub(crate) fn free(mut self, shard: &ShardParts) {
        let Some(chain) = self.chain.take() else {
            return;
        };
        let mut freed = Magazine::EMPTY;
        // The chain's iterator reads a node's link before handing it out, so freeing the
        // node (which may reuse the link) does not cut the chain.
        for node in chain {
            runner::free_into(shard, node, &mut freed);
        }
        freed.give_back(&shard.pool);
    }
}

impl Drop for Unfreed {
    fn drop(&mut self) {
        debug_assert!(
            self.chain.is_none(),
            "timers taken off a wheel were never freed"
        );
    }
}
