//! The keyed-timer subjects: corewheel's `KeyedTimers`, and what users build today for a timer per key (a
//! `Mutex<HashMap>` of handles over the same engine, tokio-util's `DelayQueue` with a key map behind one lock); and the
//! two candidate maps alone (dashmap, scc), doing `KeyedTimers`' map operations without timers: how the map was
//! chosen, and what the timers add over it. Nothing comes due during a run, so the handlers do nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corewheel::{KeyedTimers, TimerEngine, TimerHandle};
use tokio_util::time::DelayQueue;
use tokio_util::time::delay_queue::Key;

use crate::runner::lock;

/// What the keyed workloads do to a subject, from any thread.
pub trait Keyed: Sync {
    /// Sets `key` to `value`, due `delay` from now; an existing key gets both replaced.
    fn set(&self, key: u64, value: u64, delay: Duration) -> Result<(), String>;
    /// Moves `key`'s deadline to `delay` from now; `false` if it is not pending.
    fn move_to(&self, key: u64, delay: Duration) -> bool;
    /// Takes `key` out; `false` if it is not pending.
    fn remove(&self, key: u64) -> bool;
}

impl Keyed for KeyedTimers<'_, u64, u64> {
    fn set(&self, key: u64, value: u64, delay: Duration) -> Result<(), String> {
        let set = KeyedTimers::set(self, key, value, delay);
        set.map(drop).map_err(|error| error.to_string())
    }

    fn move_to(&self, key: u64, delay: Duration) -> bool {
        KeyedTimers::move_to(self, &key, delay)
    }

    fn remove(&self, key: u64) -> bool {
        KeyedTimers::remove(self, &key).is_some()
    }
}

/// corewheel's keyed timers on `engine`, with a handler that drops what it is given.
pub fn keyed_timers(engine: &TimerEngine) -> KeyedTimers<'_, u64, u64> {
    KeyedTimers::with_engine(engine, |_, _| {})
}

/// A timer per key as users write it: a `Mutex<HashMap>` of values and handles, expiry removing under the lock.
pub struct MutexMap<'e>(
    &'e TimerEngine,
    Arc<Mutex<HashMap<u64, (u64, TimerHandle)>>>,
);

impl<'e> MutexMap<'e> {
    pub fn new(engine: &'e TimerEngine) -> Self {
        Self(engine, Arc::default())
    }
}

impl Keyed for MutexMap<'_> {
    fn set(&self, key: u64, value: u64, delay: Duration) -> Result<(), String> {
        let mut map = lock(&self.1);
        if let Some(slot) = map.get_mut(&key)
            && self.0.reset(slot.1, delay)
        {
            slot.0 = value;
            return Ok(());
        }
        let shared = Arc::clone(&self.1);
        let expire = move || {
            lock(&shared).remove(&key);
        };
        let timer = self.0.schedule(delay, expire).map_err(|e| e.to_string())?;
        map.insert(key, (value, timer));
        Ok(())
    }

    fn move_to(&self, key: u64, delay: Duration) -> bool {
        lock(&self.1)
            .get(&key)
            .is_some_and(|&(_, timer)| self.0.reset(timer, delay))
    }

    fn remove(&self, key: u64) -> bool {
        let taken = lock(&self.1).remove(&key);
        taken.is_some_and(|(_, timer)| self.0.cancel(timer))
    }
}

/// tokio-util's `DelayQueue` with a key map, behind one lock, as users share it between threads today: the queue
/// holds each key's (key, value), the map each key's queue entry. Its methods need a tokio runtime's context (the
/// queue arms a tokio `Sleep`).
#[derive(Default)]
pub struct DelayQueueMap(Mutex<QueueAndKeys>);

type QueueAndKeys = (DelayQueue<(u64, u64)>, HashMap<u64, Key>);

impl Keyed for DelayQueueMap {
    fn set(&self, key: u64, value: u64, delay: Duration) -> Result<(), String> {
        let (queue, keys) = &mut *lock(&self.0);
        // A new value needs a new entry: the queue has no way to replace one in place.
        if let Some(old) = keys.remove(&key) {
            queue.remove(&old);
        }
        keys.insert(key, queue.insert((key, value), delay));
        Ok(())
    }

    fn move_to(&self, key: u64, delay: Duration) -> bool {
        let (queue, keys) = &mut *lock(&self.0);
        keys.get(&key).map(|e| queue.reset(e, delay)).is_some()
    }

    fn remove(&self, key: u64) -> bool {
        let (queue, keys) = &mut *lock(&self.0);
        keys.remove(&key).map(|e| queue.remove(&e)).is_some()
    }
}

/// The slot `KeyedTimers` keeps per key (a value and a handle), for the map-only subjects.
type Slot = (u64, u64, u64);

/// dashmap alone (upsert, `get_mut`, remove), with `KeyedTimers`' shard count (16 per CPU, not dashmap's 4).
pub struct DashMapOnly(dashmap::DashMap<u64, Slot>);

impl Default for DashMapOnly {
    fn default() -> Self {
        let shards = (super::engine::cpus() * 16).next_power_of_two();
        Self(dashmap::DashMap::with_shard_amount(shards))
    }
}

impl Keyed for DashMapOnly {
    fn set(&self, key: u64, value: u64, _: Duration) -> Result<(), String> {
        self.0
            .entry(key)
            .and_modify(|slot| slot.0 = value)
            .or_insert((value, key, 0));
        Ok(())
    }

    fn move_to(&self, key: u64, _: Duration) -> bool {
        self.0.get_mut(&key).map(|mut slot| slot.2 += 1).is_some()
    }

    fn remove(&self, key: u64) -> bool {
        self.0.remove(&key).is_some()
    }
}

/// scc's `HashMap` alone, doing what [`DashMapOnly`] does.
#[derive(Default)]
pub struct SccOnly(scc::HashMap<u64, Slot>);

impl Keyed for SccOnly {
    fn set(&self, key: u64, value: u64, _: Duration) -> Result<(), String> {
        match self.0.entry_sync(key) {
            scc::hash_map::Entry::Occupied(mut slot) => slot.get_mut().0 = value,
            scc::hash_map::Entry::Vacant(slot) => {
                slot.insert_entry((value, key, 0));
            }
        }
        Ok(())
    }

    fn move_to(&self, key: u64, _: Duration) -> bool {
        self.0.update_sync(&key, |_, slot| slot.2 += 1).is_some()
    }

    fn remove(&self, key: u64) -> bool {
        self.0.remove_sync(&key).is_some()
    }
}
