//! Threads that look at one shard's wheel with clock readings taken at different times: an
//! owner stuck in a callback, a turn that read the clock before one of its own callbacks
//! moved time on, and another turn standing in with a later reading. A reading older than
//! one the wheel has already seen must not stop the shard: every timer fires once, never
//! before its deadline, and every turn returns.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use corewheel::{Clock, PendingTimers};

use crate::support::{manual_with_rescue, within};

const MS: Duration = Duration::from_millis(1);

/// Timers on the blocked shard, due from 30 to 40 ms: more than one run queue's worth
/// (1024), so that the stand-in with the later reading leaves due timers in the wheel.
const DUE_LATER: usize = 3000;

/// The shape in which a stand-in once spun forever: thread A's turn is blocked in a
/// callback of shard 1, which also holds 3000 timers due at 30-40 ms. The main turn reads
/// the clock at 20 ms; one of its shard-0 callbacks moves the clock to 50 ms and waits while
/// a third thread's turn stands in for shard 1 at 50 ms and runs a full run queue. The main
/// turn then stands in for shard 1 with its 20 ms reading, and must return.
#[test]
fn a_stand_in_with_an_older_reading_than_the_wheel_has_seen_returns() {
    let (engine, clock) = manual_with_rescue();
    let origin = clock.now();
    let fired = Arc::new(AtomicUsize::new(0));
    let early = Arc::new(AtomicUsize::new(0));
    // A timer that records whether it ran before its deadline, by the manual clock.
    let timer = {
        let (fired, early, clock) = (Arc::clone(&fired), Arc::clone(&early), clock.clone());
        move |delay: Duration| {
            let (fired, early, clock) = (Arc::clone(&fired), Arc::clone(&early), clock.clone());
            move || {
                if clock.now() < origin + delay {
                    early.fetch_add(1, Ordering::SeqCst);
                }
                fired.fetch_add(1, Ordering::SeqCst);
            }
        }
    };

    // Shard 0 is the main thread's home; thread A's is shard 1.
    let (blocked_tx, blocked) = mpsc::channel();
    let (release_a, release_rx) = mpsc::channel::<()>();
    let main_probe = engine.schedule(Duration::from_secs(3600), || {}).unwrap();
    let main_home = engine.stats().shards.iter().position(|s| s.pending > 0);
    assert!(engine.cancel(main_probe));
    let filler = {
        let engine = Arc::clone(&engine);
        let timer = timer.clone();
        std::thread::spawn(move || {
            engine
                .schedule(MS, move || {
                    blocked_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                })
                .unwrap();
            for k in 0..DUE_LATER {
                let delay = MS * (30 + (k % 11) as u32);
                engine.schedule(delay, timer(delay)).unwrap();
            }
        })
    };
    filler.join().unwrap();
    let stats = engine.stats();
    let a_home = stats.shards.iter().position(|s| s.pending > 0).unwrap();
    assert_eq!(stats.shards[a_home].pending as usize, DUE_LATER + 1);
    assert_ne!(
        Some(a_home),
        main_home,
        "A's timers are on a shard of their own"
    );

    // Thread A turns at 1 ms and blocks inside shard 1's first callback.
    clock.advance(MS);
    let a = {
        let engine = Arc::clone(&engine);
        std::thread::spawn(move || engine.turn())
    };
    blocked.recv().unwrap();

    // Main's shard-0 callback at 20 ms moves the clock to 50 ms and waits for a third
    // thread's turn, which stands in for shard 1 at 50 ms.
    let (third_done_tx, third_done) = mpsc::channel::<usize>();
    {
        let (moved_on, clock) = (Arc::clone(&engine), clock.clone());
        // Scheduled from the main thread, so it lands on main's home shard.
        engine
            .schedule(MS * 19, move || {
                clock.advance(MS * 30);
                let third = std::thread::spawn(move || moved_on.turn());
                third_done_tx.send(third.join().unwrap()).unwrap();
            })
            .unwrap();
    }
    clock.advance(MS * 19);
    assert_eq!(clock.now().duration_since(origin), MS * 20);
    let main_turn = {
        let engine = Arc::clone(&engine);
        within(
            Duration::from_secs(30),
            "the turn with the 20 ms reading",
            move || engine.turn(),
        )
    };
    let third_ran = third_done.recv().unwrap();
    assert!(
        third_ran >= 1024,
        "the third turn ran a full run queue: {third_ran}"
    );
    assert!(
        main_turn > 1,
        "the main turn stood in for shard 1 too: {main_turn}"
    );

    // The owner comes back and finishes what is left.
    release_a.send(()).unwrap();
    within(Duration::from_secs(30), "thread A's turn", move || {
        a.join().unwrap()
    });
    within(Duration::from_secs(30), "the last turn", {
        let engine = Arc::clone(&engine);
        move || engine.turn()
    });
    assert_eq!(fired.load(Ordering::SeqCst), DUE_LATER);
    assert_eq!(early.load(Ordering::SeqCst), 0, "a timer fired early");
    let stats = engine.stats().total;
    assert_eq!((stats.pending, stats.fired as usize), (0, DUE_LATER + 2));
    engine.shutdown(PendingTimers::Drop);
    assert_eq!(engine.nodes_in_use(), 0);
}
