//! The node pool: threads taking and giving back nodes through its shared bitmap of free
//! nodes, and a stale handle racing the reuse of its node by the engine.
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

/// Two threads give nodes back to the same bitmap word while each also refills from it:
/// one gives back a whole magazine and refills, the other gives back a single node (as the
/// worker gives back the nodes it frees), refills, and then gives back the rest of what it
/// held. Gives (an OR) and takes (a swap of the whole word) interleave every way loom
/// finds: no node may be handed out twice or lost, so afterwards the two threads and the
/// bitmap hold every node of both chunks exactly once.
#[test]
fn refills_racing_give_backs_hand_out_each_node_once() {
    model(None, || {
        let pool = Arc::new(Pool::new());
        // Two chunks, each held whole by a magazine; under loom both lie in one word.
        let (mut first, mut second) = (Magazine::new(), Magazine::new());
        assert!(first.refill(&pool) && second.refill(&pool));
        assert_eq!(pool.chunks(), 2);

        let giver = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                first.give_back(&pool);
                // Finds nothing if the other thread took the word meanwhile: the pool is at
                // its size limit, so it cannot grow either.
                let mut magazine = Magazine::new();
                magazine.refill(&pool);
                drain(&mut magazine)
            })
        };
        let mut single = Magazine::new();
        // SAFETY: taken from `second` just now, so held by this thread alone and on no
        // chain, and `pool` is alive.
        unsafe { single.put(second.take().unwrap()) };
        single.give_back(&pool);
        let mut refilled = Magazine::new();
        let mut held = if refilled.refill(&pool) {
            drain(&mut refilled)
        } else {
            Vec::new()
        };
        second.give_back(&pool);
        held.extend(giver.join().unwrap());
        let mut rest = Magazine::new();
        while rest.refill(&pool) {
            held.extend(drain(&mut rest));
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

/// Two threads refill a pool whose first chunk is held, so that one carves the last chunk
/// while the other finds the bitmap empty and the region used up: that one waits for the
/// carve to settle (its nodes kept or given to the bitmap) before it reports the pool
/// full, and the wait ends in every interleaving. Under loom a chunk lies in one bitmap
/// word, which its carver keeps, so the waiter finds nothing after it either; on a real
/// pool (16 words a chunk) it finds the 15 given (`tests/engine/pool_bitmap.rs`,
/// `racing_first_schedules_never_find_an_empty_pool_full`).
#[test]
fn a_refill_at_the_size_limit_waits_for_the_last_chunk_being_carved() {
    model(None, || {
        let pool = Arc::new(Pool::new());
        let mut held = Magazine::new();
        assert!(held.refill(&pool));
        let other = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                let mut magazine = Magazine::new();
                magazine.refill(&pool);
                drain(&mut magazine)
            })
        };
        let mut magazine = Magazine::new();
        magazine.refill(&pool);
        let mut last = drain(&mut magazine);
        let theirs = other.join().unwrap();
        assert!(
            last.is_empty() || theirs.is_empty(),
            "both carved the last chunk"
        );
        last.extend(theirs);
        last.sort_unstable();
        assert_eq!(
            last,
            (4..8).collect::<Vec<_>>(),
            "the last chunk went missing"
        );
        assert_eq!(pool.chunks(), 2);
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
        // The handle whose node the next schedule takes: the turn frees all four, and a
        // refill hands out a word's free nodes in address order, so the first timer's
        // node (the lowest) comes first.
        let stale = handles[0];
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
        // The worker takes the lane, frees the four nodes and gives them back to the
        // pool's bitmap, and the schedule refills from it.
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
