//! The MPSC queue that carries inserts, cancels and resets to a shard's owner: producers
//! racing each other and the consumer, single nodes and batched chains.
#![cfg(loom)]

use corewheel::loom_exports::{Message, Pop, Queue, consume, link_after, message};
use loom::sync::Arc;
use loom::thread;

/// Pops until `count` messages have arrived, yielding to loom while a producer has not
/// finished, and returns their values in arrival order.
fn receive(queue: &Queue<Message>, count: usize) -> Vec<usize> {
    let mut got = Vec::new();
    while got.len() < count {
        // SAFETY: the model's main thread is the only consumer.
        match unsafe { queue.pop() } {
            // SAFETY: a popped node is off the queue, and came from `message`.
            Pop::Node(node) => got.push(unsafe { consume(node) }),
            Pop::Empty | Pop::Inconsistent => thread::yield_now(),
        }
    }
    // SAFETY: single consumer.
    assert!(
        matches!(unsafe { queue.pop() }, Pop::Empty),
        "nothing extra arrives"
    );
    got
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

/// Two producers push one message each while the consumer pops: each arrives exactly once.
#[test]
fn two_producers_each_message_arrives_once() {
    model(|| {
        let queue = Arc::new(Queue::new());
        let producers: Vec<_> = (0..2)
            .map(|p| {
                let queue = Arc::clone(&queue);
                // SAFETY: a fresh node, freed by the consumer after it is popped.
                thread::spawn(move || unsafe { queue.push(message(p)) })
            })
            .collect();
        let mut got = receive(&queue, 2);
        for producer in producers {
            producer.join().unwrap();
        }
        got.sort_unstable();
        assert_eq!(got, vec![0, 1]);
    });
}

/// A producer's two pushes arrive in the order it made them, with the consumer popping
/// between them (which puts the stub back in behind a lone node).
#[test]
fn one_producers_messages_stay_in_order_against_the_consumer() {
    model(|| {
        let queue = Arc::new(Queue::new());
        let producer = {
            let queue = Arc::clone(&queue);
            thread::spawn(move || {
                // SAFETY: fresh nodes, freed by the consumer after they are popped.
                unsafe {
                    queue.push(message(1));
                    queue.push(message(2));
                }
            })
        };
        assert_eq!(receive(&queue, 2), vec![1, 2]);
        producer.join().unwrap();
    });
}

/// A batched chain races a single push: the chain arrives whole and in order, and the
/// single message lands before or after it, never inside it.
#[test]
fn a_chain_arrives_whole_against_another_producer() {
    model(|| {
        let queue = Arc::new(Queue::new());
        let chain = {
            let queue = Arc::clone(&queue);
            thread::spawn(move || {
                let (a, b) = (message(10), message(11));
                // SAFETY: both are fresh and private to this thread until pushed; the
                // consumer frees them after popping.
                unsafe {
                    link_after(a, b);
                    queue.push_chain(a, b);
                }
            })
        };
        let single = {
            let queue = Arc::clone(&queue);
            // SAFETY: as above.
            thread::spawn(move || unsafe { queue.push(message(1)) })
        };
        let got = receive(&queue, 3);
        chain.join().unwrap();
        single.join().unwrap();
        assert!(
            got == vec![1, 10, 11] || got == vec![10, 11, 1],
            "the chain was split or reordered: {got:?}"
        );
    });
}
