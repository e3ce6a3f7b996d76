//! A small concurrent cache whose entries expire through `KeyedTimers`.
//!
//! Run it with `cargo run --example ttl_cache --features keyed`.
//!
//! Every entry lives in the keyed timers themselves: `insert` is a `set` with the entry's
//! time to live, `get` a `peek`, `touch` a `move_to` (sliding expiry), and the one handler
//! counts evictions. Four threads share the cache; the program then watches the entries
//! expire, one of them kept alive a while by a touch, and checks that none went early.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use corewheel::{KeyedTimers, TimerEngine};

/// A cache of `String` values by `u64` key, each with a time to live.
struct TtlCache<'e> {
    entries: KeyedTimers<'e, u64, String>,
    evicted: Arc<AtomicU64>,
}

impl<'e> TtlCache<'e> {
    fn new(engine: &'e TimerEngine) -> Self {
        let evicted = Arc::new(AtomicU64::new(0));
        let count = Arc::clone(&evicted);
        let entries = KeyedTimers::with_engine(engine, move |_key, _value: String| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        Self { entries, evicted }
    }

    /// Stores `value` under `key` for `ttl`, replacing any entry there.
    fn insert(&self, key: u64, value: String, ttl: Duration) {
        if let Err(refused) = self.entries.set(key, value, ttl) {
            eprintln!("not cached ({}): {}", refused.reason, refused.value);
        }
    }

    /// A copy of `key`'s value, if it has not expired.
    fn get(&self, key: u64) -> Option<String> {
        self.entries.peek(&key, String::clone)
    }

    /// Gives `key` a new `ttl` from now (sliding expiry); `false` if it has expired.
    fn touch(&self, key: u64, ttl: Duration) -> bool {
        self.entries.move_to(&key, ttl)
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }
}

fn main() {
    let engine = TimerEngine::builder()
        .workers(2)
        .build()
        .expect("the engine starts");
    let cache = TtlCache::new(&engine);
    let ttl = Duration::from_millis(200);
    let started = Instant::now();

    std::thread::scope(|scope| {
        for thread in 0..4_u64 {
            let cache = &cache;
            scope.spawn(move || {
                for n in 0..1_000 {
                    let key = thread * 1_000 + n;
                    cache.insert(key, format!("value {key}"), ttl);
                    assert_eq!(cache.get(key), Some(format!("value {key}")));
                }
            });
        }
    });
    println!("{} entries cached by 4 threads", cache.len());

    // Keep key 7 alive past its first deadline by touching it halfway.
    let set_at = Instant::now();
    cache.insert(7, "value 7".to_string(), ttl);
    std::thread::sleep(ttl / 2);
    if !cache.touch(7, ttl) {
        println!("the machine was too busy: key 7 expired before its touch");
    }
    while cache.len() > 1 && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    println!(
        "after {:?}: {} left (key 7, touched), {} evicted",
        started.elapsed(),
        cache.len(),
        cache.evicted()
    );
    while cache.get(7).is_some() && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let lived = set_at.elapsed();
    println!("key 7 lived {lived:?} (its ttl is {ttl:?}, touched at half of it)");
    assert!(lived >= ttl, "an entry expired before its time to live");
    assert_eq!(cache.evicted(), 4_000);
}
