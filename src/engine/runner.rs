//! Running claimed timers, by the owner or any other worker: the claim gave the runner the node, so
//! a run needs no wheel.

use std::ptr::NonNull;

use crate::engine::counters::add;
use crate::engine::pool::{BATCH, Magazine};
use crate::engine::shard_state::ShardState;
use crate::engine::timer_node::TimerNode;
use crate::sync::atomic::Ordering;
use crate::sync::timer_state::{AfterFire, Phase};

/// Runs every claimed timer of `run` at `now_tick`; `by_owner` when the shard's own worker runs it.
/// Returns the callbacks run.
pub(crate) fn run(shard: &ShardState, run: &[u32], now_tick: u64, by_owner: bool) -> usize {
    let mut freed = Magazine::EMPTY;
    let (mut fired, mut late, mut completed) = (0_u64, 0_u64, 0_u64);
    // Start every node's cache miss at once.
    for &index in run {
        if let Some(node) = shard.pool.node(index) {
            TimerNode::prefetch_for_write(NonNull::from(node));
        }
    }
    for &index in run {
        let Some(node_ref) = shard.pool.node(index) else {
            debug_assert!(false, "a claimed index outside the pool");
            continue;
        };
        let node = NonNull::from(node_ref);
        let due = node_ref.deadline();
        if run_claimed(shard, node_ref) {
            fired += 1;
            late += u64::from(now_tick > due.saturating_add(1));
        }
        // SAFETY: claimed for this run, so this thread holds the node until it settles it.
        let period = unsafe { node_ref.with_callback(|callback| callback.period()) };
        let next = period
            .is_repeating()
            .then(|| period.missed.next_after(due, period.ticks, now_tick));
        if let Some(next) = next {
            // No resetter touches a firing timer.
            node_ref.deadline.store(next, Ordering::Release);
        }
        match node_ref.state.finish_fire() {
            AfterFire::Rearm => {
                let need = next.unwrap_or(now_tick + 1);
                // SAFETY: `finish_fire` marked the node in transit and gave this thread the push.
                unsafe { shard.send_direct(node, need) };
            }
            AfterFire::RearmOnArrival => {}
            AfterFire::Free => {
                completed += u64::from(!period.is_repeating());
                free_into(shard, node, &mut freed);
            }
            AfterFire::AwaitMessage => completed += u64::from(!period.is_repeating()),
        }
    }
    freed.give_back(&shard.pool);
    let counters = &shard.counters;
    add(&counters.fired, fired);
    add(&counters.late, late);
    add(&counters.completed, completed);
    if !by_owner {
        add(&counters.stolen, fired);
    }
    fired as usize
}

/// Runs a claimed timer's callback, counting the run.
pub(crate) fn run_callback(shard: &ShardState, node: &TimerNode) {
    if run_claimed(shard, node) {
        add(&shard.counters.fired, 1);
    }
}

/// Runs a claimed timer's callback, catching and counting a panic, unless a repeating timer was
/// cancelled while queued or a waker timer's `Sleep` was dropped. Returns whether it ran.
fn run_claimed(shard: &ShardState, node: &TimerNode) -> bool {
    let seen = node.state.observe();
    let run = if seen.is_waker() {
        node.state.begin_wake()
    } else {
        seen.phase() != Phase::FiringCancelled
    };
    if run {
        // SAFETY: the caller claimed the timer, so this thread holds the node.
        let panicked = unsafe {
            node.with_callback(|callback| crate::engine::panics::contain(|| callback.call()))
        };
        add(&shard.counters.panicked, u64::from(panicked));
    }
    run
}

/// Gives back a node the caller holds: drops any callback, moves the generation on, and puts it on
/// `freed`, handed to the pool a [`BATCH`] at a time.
pub(crate) fn free_into(shard: &ShardState, node: NonNull<TimerNode>, freed: &mut Magazine) {
    // SAFETY: the caller holds the node until the generation moves on.
    let node_ref = unsafe { node.as_ref() };
    // SAFETY: as above.
    let panicked = unsafe { node_ref.with_callback(|callback| callback.clear()) };
    add(&shard.counters.panicked, u64::from(panicked));
    if node_ref.state.free() {
        freed.put(node);
    }
    if freed.len() >= BATCH {
        freed.give_back(&shard.pool);
    }
}
