//! `KeyedTimers` on the real clock, with threads racing on the same few keys: every value
//! ends in exactly one place (the handler, `remove`, back from `set` as replaced, refused,
//! or `stop`), the handler never sees a key before its deadline, and nothing hangs.
//! Asserts only what holds on a loaded 2-core machine: no timing bound but generous ones.

use crate::support;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::XorShift as Rng;
use crate::support::{leaked_unpinned, within};
use corewheel::{KeyedTimers, PendingTimers};

const THREADS: u64 = 4;
const OPS: u64 = 100_000;
const KEYS: u64 = 16;

/// A value: who made it, and when it may fire at the earliest.
#[derive(Debug)]
struct Value {
    id: usize,
    not_before: Instant,
}

/// How many places each value has ended up in: must be exactly one.
struct Fates(Vec<AtomicU8>);

impl Fates {
    fn end(&self, value: &Value) {
        self.0[value.id].fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn racing_threads_never_lose_or_duplicate_a_value_and_never_fire_early() {
    let _serial = support::serial();
    within(Duration::from_secs(600), "the keyed stress run", || {
        let engine = leaked_unpinned(2);
        let fates = Arc::new(Fates(
            (0..(THREADS * OPS) as usize)
                .map(|_| AtomicU8::new(0))
                .collect(),
        ));
        let early = Arc::new(Mutex::new(Vec::new()));
        let timers: Arc<KeyedTimers<'static, u64, Value>> =
            Arc::new(KeyedTimers::with_engine(engine, {
                let fates = Arc::clone(&fates);
                let early = Arc::clone(&early);
                move |key, value: Value| {
                    let now = Instant::now();
                    if now < value.not_before {
                        early.lock().unwrap().push((key, value.not_before - now));
                    }
                    fates.end(&value);
                }
            }));
        let threads: Vec<_> = (0..THREADS)
            .map(|thread| {
                let timers = Arc::clone(&timers);
                let fates = Arc::clone(&fates);
                std::thread::spawn(move || {
                    let mut rng = Rng::new(thread);
                    let mut next = || rng.next();
                    for op in 0..OPS {
                        let key = next() % KEYS;
                        match next() % 10 {
                            0..=4 => {
                                // Sets use 1-2 ms; moves use 2 ms, so a value's deadline is
                                // never before its set's.
                                let delay = Duration::from_millis(1 + next() % 2);
                                let value = Value {
                                    id: (thread * OPS + op) as usize,
                                    not_before: Instant::now() + delay,
                                };
                                match timers.set(key, value, delay) {
                                    Ok(Some(replaced)) => fates.end(&replaced),
                                    Ok(None) => {}
                                    Err(refused) => fates.end(&refused.value),
                                }
                            }
                            5 | 6 => {
                                let _moved = timers.move_to(&key, Duration::from_millis(2));
                            }
                            7 | 8 => {
                                if let Some(value) = timers.remove(&key) {
                                    fates.end(&value);
                                }
                            }
                            _ => {
                                let _ = (timers.contains(&key), timers.len());
                            }
                        }
                        if op % 1024 == 0 {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        // Every key left pending fires, soon: one whose timer fired without taking its
        // slot (or was never armed) would stay for ever.
        let waited = Instant::now();
        while !timers.is_empty() && waited.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let stuck = timers.stop(|_, value| fates.end(&value));
        assert_eq!(
            stuck, 0,
            "keys still pending 60 s after their last set or move"
        );
        // Every callback that began before the stop has run once the workers are joined.
        engine.shutdown(PendingTimers::Drop);
        assert!(timers.is_empty());
        assert!(
            early.lock().unwrap().is_empty(),
            "early fires: {:?}",
            early.lock().unwrap()
        );
        let made = made_ids(&fates);
        assert!(
            made.len() as u64 > THREADS * OPS / 3,
            "the threads set values"
        );
        let wrong: Vec<(usize, u8)> = made
            .into_iter()
            .filter(|&(_, count)| count != 1)
            .take(10)
            .collect();
        assert!(
            wrong.is_empty(),
            "values not ended exactly once (id, count): {wrong:?}"
        );
    });
}

/// The ids of the values the threads made, with their fate counts: the threads' choices
/// replayed, since only the ops that chose `set` made one.
fn made_ids(fates: &Fates) -> Vec<(usize, u8)> {
    let mut made = Vec::new();
    for thread in 0..THREADS {
        let mut rng = Rng::new(thread);
        for op in 0..OPS {
            let _key = rng.next();
            if rng.next() % 10 <= 4 {
                let _delay = rng.next();
                let id = (thread * OPS + op) as usize;
                made.push((id, fates.0[id].load(Ordering::Relaxed)));
            }
        }
    }
    made
}

/// `stop` racing threads that keep setting: each value made ends once (set back as
/// replaced or refused, the handler, or `stop`), and after `stop` returns, nothing is
/// left and every `set` is refused.
#[test]
fn stop_racing_sets_loses_nothing_and_leaves_nothing() {
    let _serial = support::serial();
    within(Duration::from_secs(600), "the stop race", || {
        let engine = leaked_unpinned(2);
        let fates = Arc::new(Fates((0..2_000_000).map(|_| AtomicU8::new(0)).collect()));
        let timers: Arc<KeyedTimers<'static, u64, Value>> =
            Arc::new(KeyedTimers::with_engine(engine, {
                let fates = Arc::clone(&fates);
                move |_, value: Value| fates.end(&value)
            }));
        let setters: Vec<_> = (0..2_u64)
            .map(|thread| {
                let timers = Arc::clone(&timers);
                let fates = Arc::clone(&fates);
                std::thread::spawn(move || {
                    let mut made = 0;
                    for n in 0..1_000_000_u64 {
                        let value = Value {
                            id: (thread * 1_000_000 + n) as usize,
                            not_before: Instant::now(),
                        };
                        made += 1;
                        match timers.set(n % 64, value, Duration::from_millis(n % 3)) {
                            Ok(Some(replaced)) => fates.end(&replaced),
                            Ok(None) => {}
                            Err(refused) => {
                                fates.end(&refused.value);
                                return (thread, made);
                            }
                        }
                    }
                    (thread, made)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        timers.stop(|_, value| fates.end(&value));
        assert!(timers.is_empty(), "stop left keys behind");
        let made: Vec<(u64, u64)> = setters.into_iter().map(|s| s.join().unwrap()).collect();
        engine.shutdown(PendingTimers::Drop);
        assert!(timers.is_empty(), "a set after stop got in");
        for (thread, count) in made {
            for n in 0..count {
                let id = (thread * 1_000_000 + n) as usize;
                assert_eq!(fates.0[id].load(Ordering::Relaxed), 1, "value {id}");
            }
        }
    });
}
