//! A lane: the producer pushes and claims its lane back while the shard's worker takes it.
//! Both sides empty the lane with one swap, so each node pushed must reach exactly one of
//! them, whole chains in push order reversed (the lane is a stack).
//!
//! The lane's old stack, where the producer parks pending timers and takes them back once
//! they have waited their horizon, is emptied the same way, and the need the worker reads
//! must cover every node on either stack: the worker sleeps no later than that.
#![cfg(loom)]

use std::collections::HashSet;

use corewheel::loom_exports::{Lane, Magazine, Node, OLD_HORIZON, Pool};
use corewheel_loom_tests::model;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};
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

/// Checks that `claimed`, `taken` and `left` hold nodes `0..n` between them, each once.
fn each_once(n: u32, claimed: &[u32], taken: &[u32], left: &[u32]) {
    let mut all: Vec<u32> = claimed.iter().chain(taken).chain(left).copied().collect();
    let distinct: HashSet<u32> = all.iter().copied().collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..n).collect::<Vec<u32>>(),
        "claimed {claimed:?}, taken {taken:?}, left {left:?}"
    );
    assert_eq!(distinct.len(), n as usize);
}

/// `n` nodes from a fresh pool, in index order: the first is node 0.
fn fresh_nodes(pool: &Pool, n: u32) -> Vec<Node> {
    let mut magazine = Magazine::new();
    let nodes: Vec<Node> = (0..n)
        .map(|_| {
            magazine.take().unwrap_or_else(|| {
                assert!(magazine.refill(pool));
                magazine.take().expect("a refilled magazine has a node")
            })
        })
        .collect();
    let indexes: Vec<u32> = nodes.iter().map(|node| node.index()).collect();
    assert_eq!(indexes, (0..n).collect::<Vec<u32>>());
    nodes
}

/// The producer parks a chain of two nodes on the old stack, then a third node, takes the
/// old stack back once it has waited its horizon, and parks a fourth, while the worker
/// takes the lane twice: every node is received exactly once, by one side. Depending on
/// the worker, a park lands on an empty or a non-empty stack, and the claim finds all,
/// some or none of the first three.
#[test]
fn take_against_park_and_claim_old_receives_each_node_once() {
    model(None, || {
        let pool = Arc::new(Pool::new());
        // Parked so that the stack reads newest (highest index) first.
        let nodes = fresh_nodes(&pool, 4);
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
        // SAFETY: this thread is the lane's only producer, each node is parked once and
        // nothing else holds it, and `pool` outlives the lane's use.
        let claimed = unsafe {
            lane.park(&[(nodes[1], 10), (nodes[0], 10)], 0);
            lane.park(&[(nodes[2], 10)], 1);
            // Whichever park started the stack's contents, they have not waited long enough.
            assert!(lane.claim_old_if_due(1).is_empty(), "claimed before due");
            // Started at tick 0 or 1: due by now.
            let claimed = indexes(&lane.claim_old_if_due(1 + OLD_HORIZON));
            lane.park(&[(nodes[3], 10)], 1 + OLD_HORIZON);
            claimed
        };
        let by_worker = worker.join().unwrap();
        // SAFETY: the pool is alive.
        let left = indexes(&unsafe { lane.take() });
        assert_eq!(lane.need(), None, "an empty lane needs nothing");
        each_once(4, &claimed, &by_worker, &left);
    });
}

/// The worker takes only what is due (`take_due`) twice while the producer pushes a node
/// due by then, parks one that is not, claims its young stack back and pushes another:
/// every node is received exactly once, by one side, and the parked node is never the
/// worker's (its generation's need is published with it, and comes after the worker's
/// tick).
#[test]
fn take_due_against_push_park_and_claim_receives_each_node_once() {
    model(None, || {
        let pool = Arc::new(Pool::new());
        let nodes = fresh_nodes(&pool, 3);
        let lane = Arc::new(Lane::new());
        let worker = {
            let (lane, pool) = (Arc::clone(&lane), Arc::clone(&pool));
            thread::spawn(move || {
                // SAFETY: `pool`, which the nodes come from, is alive for the whole call.
                let mut got = indexes(&unsafe { lane.take_due(4) });
                // SAFETY: as above.
                got.extend(indexes(&unsafe { lane.take_due(4) }));
                drop(pool);
                got
            })
        };
        // SAFETY: this thread is the lane's only producer, each node is pushed or parked
        // once and nothing else holds it, and `pool` outlives the lane's use.
        let claimed = unsafe {
            lane.push(nodes[0], 3);
            // Its generation is needed by tick 4 + 2 * OLD_HORIZON + 1, after the worker's 4.
            lane.park(&[(nodes[1], 50)], 4);
            let claimed = indexes(&lane.claim());
            lane.push(nodes[2], 20);
            claimed
        };
        let by_worker = worker.join().unwrap();
        assert!(
            !by_worker.contains(&1),
            "the worker took a generation not yet due: {by_worker:?}"
        );
        // SAFETY: the pool is alive.
        let left = indexes(&unsafe { lane.take() });
        each_once(3, &claimed, &by_worker, &left);
    });
}

/// The ticks by which the nodes of `need_covers_every_node_parked_before_it_is_read` are
/// due, by index: node 0 is pushed on the young stack, the others are parked.
const DUE: [u64; 5] = [6, 3, 2, 9, 10];

/// Checks that `need`, read while `nodes` were on the lane, is no later than any of their
/// deadlines.
fn covers(need: Option<u64>, nodes: impl IntoIterator<Item = u32>, when: &str) {
    for index in nodes {
        let due = DUE[index as usize];
        assert!(
            need.is_some_and(|need| need <= due),
            "{when}: need {need:?} read with node {index} (due {due}) on the lane"
        );
    }
}

/// The producer pushes a node on the young stack, parks two single nodes on the old one
/// (due sooner than the young node and than the horizon, so that the first sets the need
/// and the second lowers it), takes the old stack back, and parks two more (the first
/// starts a fresh stack, the second, due later, leaves its need as it is); after each step
/// it publishes how many nodes it has handed over. The worker reads how many have been
/// handed over, then the lane's need, then takes the lane. Each node it gets that was
/// handed over before the need was read was on a stack when the need was read (only the
/// worker's take and the producer's claim remove nodes, and claimed nodes are not parked
/// again), so the need must be no later than its deadline. Once both are done, the need
/// must cover every node left, whichever stack the worker emptied under the producer.
///
/// A node whose push or park is still under way when the need is read is left out: the
/// need is published after the node, and the producer then wakes the worker if it must,
/// which `need_is_seen_or_the_worker_is_woken` covers.
#[test]
fn need_covers_every_node_parked_before_it_is_read() {
    model(None, || {
        let pool = Arc::new(Pool::new());
        let nodes = fresh_nodes(&pool, 5);
        let lane = Arc::new(Lane::new());
        let handed_over = Arc::new(AtomicUsize::new(0));
        let worker = {
            let (lane, pool, handed_over) = (
                Arc::clone(&lane),
                Arc::clone(&pool),
                Arc::clone(&handed_over),
            );
            thread::spawn(move || {
                // Nodes `0..before` are on a stack, or taken, before the need is read.
                let before = handed_over.load(Ordering::Acquire) as u32;
                let need = lane.need();
                // SAFETY: `pool`, which the nodes come from, is alive for the call.
                let taken: Vec<u32> = unsafe { lane.take() }
                    .iter()
                    .map(|node| node.index())
                    .collect();
                let on_lane = taken.iter().copied().filter(|&index| index < before);
                covers(need, on_lane, "worker");
                drop(pool);
                taken
            })
        };
        // SAFETY: this thread is the lane's only producer, each node is pushed or parked
        // once and nothing else holds it, and `pool` outlives the lane's use.
        let claimed = unsafe {
            lane.push(nodes[0], DUE[0]);
            handed_over.store(1, Ordering::Release);
            lane.park(&[(nodes[1], DUE[1])], 0);
            handed_over.store(2, Ordering::Release);
            lane.park(&[(nodes[2], DUE[2])], 1);
            handed_over.store(3, Ordering::Release);
            let claimed: Vec<u32> = lane
                .claim_old_if_due(1 + OLD_HORIZON)
                .iter()
                .map(|node| node.index())
                .collect();
            lane.park(&[(nodes[3], DUE[3])], 1 + OLD_HORIZON);
            handed_over.store(4, Ordering::Release);
            lane.park(&[(nodes[4], DUE[4])], 1 + OLD_HORIZON);
            handed_over.store(5, Ordering::Release);
            claimed
        };
        let by_worker = worker.join().unwrap();
        let need = lane.need();
        // SAFETY: the pool is alive.
        let left: Vec<u32> = unsafe { lane.take() }
            .iter()
            .map(|node| node.index())
            .collect();
        covers(need, left.iter().copied(), "after both");
        each_once(5, &claimed, &by_worker, &left);
    });
}

/// The wake-up handshake that covers a park still under way when the worker reads the
/// need. The worker publishes the tick it plans to wake at, then reads the lane's need
/// (as `Shard::plan_wake` then `HeldWheel::must_turn_before`); the producer pushes a node on
/// the young stack and parks one on the old stack, and after each that lowered the need
/// reads the plan and would wake the worker for an earlier need (as `Shard::wake_for`).
/// Both sides put a `SeqCst` fence between their write and their read, as the engine
/// does: loom models `SeqCst` loads and stores as merely acquire/release, and fences are
/// what the engine relies on. For each node, either the producer saw the plan and would
/// wake the worker for it, or the worker saw a need no later than its deadline.
#[test]
fn need_is_seen_or_the_worker_is_woken() {
    /// The tick the worker plans to sleep until: after every deadline.
    const PLAN: u64 = 100;
    /// When the node pushed on the young stack is due.
    const YOUNG_DUE: u64 = 6;
    /// When the parked node is due: sooner, so the park lowers the lane's need.
    const OLD_DUE: u64 = 3;
    model(None, || {
        let pool = Arc::new(Pool::new());
        let nodes = fresh_nodes(&pool, 2);
        let lane = Arc::new(Lane::new());
        // 0 while the worker is awake (`shard::AWAKE`): no need to wake it.
        let wake_at = Arc::new(AtomicU64::new(0));
        let worker = {
            let (lane, wake_at) = (Arc::clone(&lane), Arc::clone(&wake_at));
            thread::spawn(move || {
                wake_at.store(PLAN, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                lane.need()
            })
        };
        let wakes = |need: Option<u64>| {
            need.is_some_and(|need| {
                fence(Ordering::SeqCst);
                need < wake_at.load(Ordering::SeqCst)
            })
        };
        // SAFETY: this thread is the lane's only producer, each node is pushed or parked
        // once and nothing else holds it, and `pool` outlives the lane's use.
        let (young_woke, old_woke) = unsafe {
            // The push starts the young stack, so it reports its need (which the wrapper
            // drops): the producer checks the plan for it.
            lane.push(nodes[0], YOUNG_DUE);
            let young_woke = wakes(Some(YOUNG_DUE));
            let old_woke = wakes(lane.park(&[(nodes[1], OLD_DUE)], 0));
            (young_woke, old_woke)
        };
        let need = worker.join().unwrap();
        for (woke, due) in [(young_woke, YOUNG_DUE), (old_woke, OLD_DUE)] {
            assert!(
                woke || need.is_some_and(|need| need <= due),
                "the worker read need {need:?} and was not woken for a node due at {due}"
            );
        }
        // SAFETY: the pool is alive.
        let left: Vec<u32> = unsafe { lane.take() }
            .iter()
            .map(|node| node.index())
            .collect();
        each_once(2, &[], &[], &left);
    });
}
