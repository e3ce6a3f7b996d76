//! A lane's forward ring: the producer publishes batches of node indices while the holder
//! of the shard's wheel takes them. Every index published must be taken exactly once, in
//! the order published, and never an index that was not published (a slot is written
//! again only after the consumer has read it). The ring's need must cover every index
//! published before it is read, and a consumer that plans to sleep must either see a
//! publish or be woken for it.
#![cfg(loom)]

use corewheel::loom_exports::{FORWARD_CHUNK, FORWARD_RING, ForwardRing};
use corewheel_loom_tests::model;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};
use loom::thread;

/// A tick later than every need in these models, so that the ring's half-full rule (its
/// need becomes `now`) never hides what the need would otherwise be.
const LATE: u64 = 1_000;

/// Takes until the ring is empty.
///
/// # Safety
/// The caller is the ring's only consumer at the time.
unsafe fn drain(ring: &ForwardRing) -> Vec<u32> {
    let mut all = Vec::new();
    loop {
        // SAFETY: forwarded from the caller.
        let chunk = unsafe { ring.take() };
        if chunk.is_empty() {
            return all;
        }
        assert!(chunk.len() <= FORWARD_CHUNK);
        all.extend(chunk);
    }
}

/// The producer publishes three batches, one of which may not fit, while the consumer
/// takes twice: what was taken, then and after, is exactly what was published, in order.
#[test]
fn each_index_published_is_taken_once_in_order() {
    const BATCHES: [&[u32]; 3] = [&[10, 11], &[12], &[13, 14]];
    assert_eq!(FORWARD_RING, 4, "the batches are sized to fill a ring of 4");
    model(None, || {
        let ring = Arc::new(ForwardRing::new());
        let consumer = {
            let ring = Arc::clone(&ring);
            thread::spawn(move || {
                // SAFETY: this thread is the only consumer until it is joined.
                let mut taken = unsafe { ring.take() };
                // SAFETY: as above.
                taken.extend(unsafe { ring.take() });
                taken
            })
        };
        let mut published = Vec::new();
        for batch in BATCHES {
            // SAFETY: this thread is the only producer.
            if unsafe { ring.publish(batch, 5, LATE) }.is_some() {
                published.extend_from_slice(batch);
            }
        }
        let mut taken = consumer.join().unwrap();
        // SAFETY: the consumer has been joined.
        taken.extend(unsafe { drain(&ring) });
        assert_eq!(taken, published);
        assert!(
            published.len() >= 3,
            "the first two batches always fit: {published:?}"
        );
        assert_eq!(ring.need(), None);
    });
}

/// The ticks by which the indices of `need_covers_every_index_published_before_it_is_read`
/// are needed, by index.
const DUE: [u64; 3] = [6, 3, 9];

/// The producer publishes three single indices (the second lowers the need, the third
/// does not), counting each as handed over once published. The consumer reads the count,
/// then the need, then takes: every index it takes that was handed over before it read
/// the need must be covered by that need. Afterwards, the need must cover what is left.
#[test]
fn need_covers_every_index_published_before_it_is_read() {
    model(None, || {
        let ring = Arc::new(ForwardRing::new());
        let handed_over = Arc::new(AtomicUsize::new(0));
        let consumer = {
            let (ring, handed_over) = (Arc::clone(&ring), Arc::clone(&handed_over));
            thread::spawn(move || {
                let before = handed_over.load(Ordering::Acquire) as u32;
                let need = ring.need();
                // SAFETY: this thread is the only consumer until it is joined.
                let taken = unsafe { drain(&ring) };
                for &index in taken.iter().filter(|&&index| index < before) {
                    let due = DUE[index as usize];
                    assert!(
                        need.is_some_and(|need| need <= due),
                        "need {need:?} read with index {index} (due {due}) on the ring"
                    );
                }
                taken
            })
        };
        for (index, due) in DUE.iter().enumerate() {
            // SAFETY: this thread is the only producer.
            let published = unsafe { ring.publish(&[index as u32], *due, LATE) };
            assert!(published.is_some(), "one index always fits here");
            handed_over.store(index + 1, Ordering::Release);
        }
        let mut taken = consumer.join().unwrap();
        let need = ring.need();
        // SAFETY: the consumer has been joined.
        let left = unsafe { drain(&ring) };
        for &index in &left {
            let due = DUE[index as usize];
            assert!(
                need.is_some_and(|need| need <= due),
                "need {need:?} with index {index} (due {due}) left"
            );
        }
        taken.extend(left);
        assert_eq!(taken, vec![0, 1, 2]);
    });
}

/// The wake-up handshake: the consumer publishes the tick it plans to wake at, then reads
/// the ring's need (as `Shard::plan_wake` then `HeldWheel::must_turn_before`); the
/// producer publishes and then reads the plan, and would wake the consumer for an earlier
/// need (as `Shard::wake_for`). Both put a `SeqCst` fence between their write and their
/// read, as the engine does. Either the producer would wake the consumer, or the consumer
/// saw a need no later than the index's.
#[test]
fn need_is_seen_or_the_consumer_is_woken() {
    const PLAN: u64 = 100;
    const DUE: u64 = 7;
    model(None, || {
        let ring = Arc::new(ForwardRing::new());
        // 0 while the consumer is awake: no need to wake it.
        let wake_at = Arc::new(AtomicU64::new(0));
        let consumer = {
            let (ring, wake_at) = (Arc::clone(&ring), Arc::clone(&wake_at));
            thread::spawn(move || {
                wake_at.store(PLAN, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                ring.need()
            })
        };
        // SAFETY: this thread is the only producer.
        let need = unsafe { ring.publish(&[0], DUE, LATE) };
        assert_eq!(need, Some(DUE));
        fence(Ordering::SeqCst);
        let woke = DUE < wake_at.load(Ordering::SeqCst);
        let seen = consumer.join().unwrap();
        assert!(
            woke || seen.is_some_and(|need| need <= DUE),
            "the consumer read need {seen:?} and was not woken for an index due at {DUE}"
        );
    });
}
