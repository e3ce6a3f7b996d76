//! A shard's urgent tick against a producer that published more pending timers than it can
//! look at again. A reset that brings forward a timer in transit asks for urgency, so that
//! the worker takes every lane; if the producer held the timer at that moment, the
//! worker's take missed it, and the timer went out with the need it had before the reset.
//! The producer reads the count of asks before taking its lane back and again after
//! publishing: if it changed, it asks again. The worker's take of an urgent tick must then
//! never be the only answer to the reset while missing what the producer published.
#![cfg(loom)]

use corewheel::loom_exports::{ForwardRing, Urgency};
use corewheel_loom_tests::model;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;

/// Later than every tick of the model.
const LATE: u64 = 1_000;

/// The producer takes back a timer (index 7) and publishes it with the need its deadline
/// gives, then checks the asks, while a reset brings the timer forward to tick 1 and asks
/// for urgency, and the worker, at tick 5, takes the urgent tick and then the ring.
/// Whatever the order, once everyone is done the worker has the index, or urgency is
/// still asked for, or the ring's need covers the new deadline: the timer is never left
/// behind with the need it had before the reset.
#[test]
fn an_ask_missed_by_the_worker_is_seen_by_the_producer() {
    model(None, || {
        let urgency = Arc::new(Urgency::new());
        let ring = Arc::new(ForwardRing::new());
        let deadline = Arc::new(AtomicU64::new(LATE));
        let producer = {
            let (urgency, ring, deadline) = (
                Arc::clone(&urgency),
                Arc::clone(&ring),
                Arc::clone(&deadline),
            );
            thread::spawn(move || {
                let asked = urgency.asked();
                // The timer is this thread's from here until it is published.
                let need = deadline.load(Ordering::Relaxed);
                // SAFETY: this thread is the ring's only publisher.
                let published = unsafe { ring.publish(&[7], need, 4) };
                assert!(published.is_some(), "an empty ring holds one index");
                urgency.ask_again_if_asked_since(asked, 3);
            })
        };
        let reset = {
            let (urgency, deadline) = (Arc::clone(&urgency), Arc::clone(&deadline));
            thread::spawn(move || {
                deadline.store(1, Ordering::Relaxed);
                urgency.make_urgent(1);
            })
        };
        let took = urgency.take_urgent(5);
        // SAFETY: this thread is the ring's only consumer.
        let got = if took {
            unsafe { ring.take() }
        } else {
            Vec::new()
        };
        producer.join().unwrap();
        reset.join().unwrap();
        assert!(
            got.contains(&7)
                || urgency.urgent() != u64::MAX
                || ring.need().is_some_and(|need| need <= 1),
            "the worker spent the urgent tick without the index, nobody asked again, and \
             the ring's need is {:?} (took {took}, got {got:?})",
            ring.need()
        );
    });
}
