//! The node pool: threads taking and giving back batches on its shared free stack, and a
//! stale handle racing the reuse of its node by the engine.
#![cfg(loom)]

use std::collections::HashSet;

use corewheel::loom_exports::{Magazine, Phase, Pool, handle_parts};
use corewheel_loom_tests::{Probe, engine, model, ticks};
use loom::sync::Arc;
use loom::thread;

/// Every node `magazine` holds, by index.
fn drain(magazine: &mut Magazine) -> Vec<u32> {
    std::iter::from_fn(|| magazine.take().map(|node| node.index())).collect()
}

/// One thread pops a batch while another pops both and pushes the first back, then
/// returns one node of the second as a batch of its own (as the worker gives back the
/// nodes it frees). That is the ABA schedule for a Treiber stack: a pop that read the head
/// and the batch below it resumes after that head was popped and pushed again, with the
/// batch below it now held by the other thread. No node may be handed out twice or lost:
/// afterwards the two threads and the stack hold every node of both chunks exactly once.
#[test]
fn concurrent_pops_and_pushes_hand_out_each_node_once() {
    model(None, || {
        let pool = Arc::new(Pool::new());
        // Two chunks of one batch each, both on the free stack.
        let (mut first, mut second) = (Magazine::new(), Magazine::new());
        assert!(first.refill(&pool) && second.refill(&pool));
        first.give_back(&pool);
        second.give_back(&pool);
        assert_eq!(pool.chunks(), 2);

        let popper = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                // Finds the stack empty if the other thread holds both batches.
                let mut magazine = Magazine::new();
                magazine.refill(&pool);
                drain(&mut magazine)
            })
        };
        let mut returned = Magazine::new();
        let mut kept = Magazine::new();
        assert!(
            returned.refill(&pool),
            "two batches, and the other thread takes one"
        );
        let both = kept.refill(&pool);
        returned.give_back(&pool);
        if both {
            let mut single = Magazine::new();
            // SAFETY: taken from `kept` just now, so held by this thread alone and on no
            // chain, and `pool` is alive.
            unsafe { single.put(kept.take().unwrap()) };
            single.give_back(&pool);
        }
        let mut held = drain(&mut kept);
        let popped = popper.join().unwrap();
        held.extend(&popped);
        let mut stacked = Magazine::new();
        while stacked.refill(&pool) {
            held.extend(drain(&mut stacked));
        }
        let distinct: HashSet<u32> = held.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            held.len(),
            "a node was handed out twice: {held:?}"
        );
        assert_eq!(distinct, (0..8).collect(), "a node was lost");
        assert_eq!(pool.chunks(), 2);
        assert_eq!(pool.nodes_in_use(), 0);
    });
}

/// Two threads refill from an empty pool at once, so both grow it: each gets a chunk of
/// its own, and the pool, at its size limit (two chunks under loom), refuses a third.
/// Meanwhile a third thread looks up a node of the second chunk, as a stale handle may at
/// any time: it finds no chunk there or a node in its free state.
#[test]
fn concurrent_growth_allocates_distinct_chunks() {
    model(None, || {
        let pool = Arc::new(Pool::new());
        let grower = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                let mut magazine = Magazine::new();
                assert!(magazine.refill(&pool), "the pool has room for two chunks");
                drain(&mut magazine)
            })
        };
        let looker = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                if let Some(state) = pool.state(4) {
                    assert_eq!(state.observe().phase(), Phase::Free);
                }
            })
        };
        let mut magazine = Magazine::new();
        assert!(magazine.refill(&pool), "the pool has room for two chunks");
        let mut held = drain(&mut magazine);
        held.extend(grower.join().unwrap());
        looker.join().unwrap();
        held.sort_unstable();
        assert_eq!(
            held,
            (0..8).collect::<Vec<_>>(),
            "chunks overlap or went missing"
        );
        assert_eq!(pool.chunks(), 2);
        assert!(!Magazine::new().refill(&pool), "grew past its size limit");
    });
}

/// A stale handle's cancel, reset and `is_pending` race the worker freeing its node and
/// this thread arming a new timer in it. Every call on the stale handle must fail, and the
/// new timer must be untouched: pending, and firing once at its deadline.
#[test]
fn a_stale_handle_never_touches_the_timer_that_reused_its_node() {
    model(None, || {
        let (engine, clock) = engine();
        // Use up this thread's magazine (one batch: the loom pool's four-node chunk), so
        // that its next schedule refills from what the worker gives back. Every timer is
        // cancelled while still on this thread's lane, due now.
        let old: Vec<Probe> = (0..4).map(|_| Probe::new()).collect();
        let handles: Vec<_> = old
            .iter()
            .map(|probe| engine.schedule(ticks(0), probe.callback()).unwrap())
            .collect();
        for &handle in &handles {
            assert!(engine.cancel(handle));
        }
        // The handle whose node the next schedule takes: the turn frees the two timers
        // the third schedule's reclaim forwarded (on the lane's forward ring) before the two
        // still on the lane's stack (newest first), and a refill hands out the last node
        // freed first, the third timer's.
        let stale = handles[2];
        let stale_thread = {
            let engine = Arc::clone(&engine);
            thread::spawn(move || {
                (
                    engine.cancel(stale),
                    engine.reset(stale, ticks(1)),
                    engine.is_pending(stale),
                )
            })
        };
        // The worker takes the lane, frees the four nodes and gives them back as one
        // batch, and the schedule refills from it.
        assert_eq!(engine.turn(), 0);
        let probe = Probe::new();
        let new = engine.schedule(ticks(2), probe.callback()).unwrap();
        let (cancelled, reset, pending) = stale_thread.join().unwrap();
        let ((old_index, old_generation), (new_index, new_generation)) =
            (handle_parts(stale), handle_parts(new));
        assert_eq!(
            old_index, new_index,
            "the model meant the node to be reused"
        );
        assert_ne!(old_generation, new_generation);
        assert!(!cancelled, "a stale cancel succeeded");
        assert!(!reset, "a stale reset succeeded");
        assert!(!pending, "a stale handle looked pending");
        assert!(
            engine.is_pending(new),
            "the stale handle reached the new timer"
        );
        clock.advance(ticks(1));
        assert_eq!(engine.turn(), 0, "the new timer fired early");
        clock.advance(ticks(1));
        assert_eq!(
            engine.turn(),
            1,
            "the new timer did not fire at its deadline"
        );
        assert_eq!(probe.ran(), 1);
        for probe in &old {
            assert_eq!((probe.ran(), probe.dropped()), (0, 1));
        }
        assert_eq!(engine.nodes_in_use(), 0);
    });
}
