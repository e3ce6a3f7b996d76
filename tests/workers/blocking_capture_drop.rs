//! A cancelled timer's captures whose `Drop` blocks, dropped by the worker that frees the
//! timer's node: that worker must not hold its shard's wheel meanwhile, so the shard's
//! other timers are rescued as they would be from a blocking callback. Before `Unfreed`,
//! the worker dropped them with the wheel held: no stand-in could take it, and the
//! shard's timers waited for the `Drop` to return.
//!
//! Real clock, asserting only what holds on a loaded 2-core machine: a timer due while
//! the `Drop` blocks fires before it returns, within a generous limit; never early.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::stuck::{Gate, OpenOnDrop, agents, engine, on_agent, worker_index};
use crate::support::{ms, serial};
use corewheel::PendingTimers;

/// How long a timer that must be rescued may take before the test calls it held up.
const LIMIT: Duration = Duration::from_secs(20);

/// A capture whose `Drop` reports the worker it runs on, then blocks on its gate.
struct BlocksOnDrop {
    gate: Gate,
    dropping: mpsc::Sender<Option<usize>>,
}

impl Drop for BlocksOnDrop {
    fn drop(&mut self) {
        let _ = self.dropping.send(worker_index());
        self.gate.wait();
    }
}

/// For each shard of a 2-worker engine (and rescue on or off): a repeating timer filed on
/// the shard, capturing a [`BlocksOnDrop`], is cancelled, so the shard's owner frees its
/// node and drops the capture, which blocks. A timer armed on the same shard 50 ms later
/// must fire while the capture still blocks, and not before its deadline. With rescue
/// off nobody stands in, which shows the test can tell: the timer waits for the gate.
#[test]
fn a_cancelled_timers_blocking_capture_does_not_hold_its_shard_up() {
    let _serial = serial();
    for rescue in [Some(8), None] {
        let engine = engine(2, rescue);
        let agents = agents(&engine);
        for (shard, agent) in agents.iter().enumerate() {
            let gate = Gate::default();
            let _open = OpenOnDrop(gate.clone());
            let (dropping_tx, dropping) = mpsc::channel();
            let capture = BlocksOnDrop {
                gate: gate.clone(),
                dropping: dropping_tx,
            };
            let engine_a = engine.clone();
            let repeating = on_agent(agent, move || {
                engine_a
                    .schedule_repeating(ms(20), move || {
                        let _ = &capture;
                    })
                    .unwrap()
            });
            // Fired a few times: filed on the wheel between its runs.
            std::thread::sleep(ms(110));
            let (fired_tx, fired) = mpsc::channel();
            let engine_a = engine.clone();
            let deadline = on_agent(agent, move || {
                assert!(engine_a.cancel(repeating), "shard {shard}: cancel");
                let deadline = Instant::now() + ms(50);
                engine_a
                    .schedule_at(deadline, move || {
                        let _ = fired_tx.send(Instant::now());
                    })
                    .unwrap();
                deadline
            });
            let dropper = dropping
                .recv_timeout(LIMIT)
                .expect("the capture was dropped");
            assert!(
                dropper.is_some(),
                "shard {shard}: the capture was dropped by a worker"
            );
            let on_time = fired.recv_timeout(match rescue {
                Some(_) => LIMIT,
                None => ms(500),
            });
            gate.open();
            match (rescue, on_time) {
                (Some(_), Ok(at)) => assert!(at >= deadline, "shard {shard}: fired early"),
                (Some(_), Err(_)) => panic!(
                    "shard {shard}: a timer due while a capture's Drop blocked waited for it"
                ),
                (None, Ok(_)) => {
                    panic!("shard {shard}, rescue off: the timer fired while its owner was blocked")
                }
                (None, Err(_)) => {
                    let at = fired.recv_timeout(LIMIT).expect("fired once let go");
                    assert!(at >= deadline, "shard {shard}: fired early");
                }
            }
        }
        let report = engine.shutdown(PendingTimers::Drop);
        assert_eq!(report.dropped, 0, "nothing was left pending");
    }
}
