//! A lane: the producer pushes and claims its lane back while the shard's worker takes it.
//! Both sides empty the lane with one swap, so each node pushed must reach exactly one of
//! them, whole chains in push order reversed (the lane is a stack).
#![cfg(loom)]

use std::collections::HashSet;

use corewheel::loom_exports::{Lane, Magazine, Node, Pool};
use corewheel_loom_tests::model;
use loom::sync::Arc;
use loom::thread;

/// The indexes of `chain`, checking that a taken chain is newest first.
fn indexes(chain: &[Node]) -> Vec<u32> {
    let indexes: Vec<u32> = chain.iter().map(|node| node.index()).collect();
    assert!(
        indexes.windows(2).all(|pair| pair[0] > pair[1]),
        "a chain came out of push order: {indexes:?}"
    );
    indexes
}

/// The producer pushes two nodes, claims the lane back, and pushes a third, while the
/// worker takes the lane twice: every node is received exactly once, by one side.
#[test]
fn take_against_push_and_claim_receives_each_node_once() {
    model(None, || {
        let pool = Arc::new(Pool::new());
        let mut magazine = Magazine::new();
        assert!(magazine.refill(&pool));
        // Taken in index order, so that chains can be checked for order by index.
        let nodes: Vec<Node> = (0..3).map(|_| magazine.take().unwrap()).collect();
        let lane = Arc::new(Lane::new());
        let worker = {
            let (lane, pool) = (Arc::clone(&lane), Arc::clone(&pool));
            thread::spawn(move || {
                // SAFETY: `pool`, which the nodes come from, is alive for the whole call.
                let mut got = indexes(&unsafe { lane.take() });
                // SAFETY: as above.
                got.extend(indexes(&unsafe { lane.take() }));
                drop(pool);
                got
            })
        };
        // SAFETY: this thread is the lane's only producer, each node is pushed once and
        // nothing else holds it, and `pool` outlives the lane's use.
        let claimed = unsafe {
            lane.push(nodes[0], 1);
            lane.push(nodes[1], 1);
            let claimed = indexes(&lane.claim());
            lane.push(nodes[2], 1);
            claimed
        };
        let by_worker = worker.join().unwrap();
        // SAFETY: the pool is alive.
        let left = indexes(&unsafe { lane.take() });
        assert_eq!(lane.need(), None, "an empty lane needs nothing");
        let mut all: Vec<u32> = claimed
            .iter()
            .chain(&by_worker)
            .chain(&left)
            .copied()
            .collect();
        let distinct: HashSet<u32> = all.iter().copied().collect();
        all.sort_unstable();
        assert_eq!(
            all,
            vec![0, 1, 2],
            "claimed {claimed:?}, taken {by_worker:?}, left {left:?}"
        );
        assert_eq!(distinct.len(), 3);
    });
}
