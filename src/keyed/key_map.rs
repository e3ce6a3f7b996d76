//! The concurrent map under [`KeyedTimers`](crate::KeyedTimers): a key's slot, locked for the
//! length of one operation.
//!
//! Every change to a key's state (set, move, remove, and the fire that hands its value to
//! the handler) happens under that key's lock, so the map's own locking is what orders
//! them. The map is dashmap's sharded `HashMap` (see the choice in
//! `keyed`); under loom, whose models cannot see dashmap's locks, a
//! `Mutex<HashMap>` with the same surface stands in, so that the models check the same
//! key-state logic.

#[cfg(not(loom))]
mod imp {
    use std::hash::Hash;

    use dashmap::DashMap;
    use dashmap::mapref::entry::Entry;

    pub(crate) struct KeyMap<K, V>(DashMap<K, V>);

    /// Shards: 16 per CPU, at most 256. dashmap's default of 4 per CPU has two threads on
    /// one shard's lock once in every 4N operations, which showed in the keyed workloads as
    /// lock contention. A shard costs a padded cache line or two when empty, and `len`,
    /// `drain` and the drop visit every one, hence the cap (32 KiB of empty shards).
    fn shard_amount() -> usize {
        static SHARDS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *SHARDS.get_or_init(|| {
            (std::thread::available_parallelism().map_or(1, usize::from) * 16)
                .next_power_of_two()
                .min(256)
        })
    }

    impl<K: Eq + Hash, V> KeyMap<K, V> {
        pub(crate) fn new() -> Self {
            Self(DashMap::with_shard_amount(shard_amount()))
        }

        /// Runs `f` on `key`'s slot under the key's lock and returns what it returned: `f`
        /// changes an occupied slot in place, and may give an empty one a value to hold.
        pub(crate) fn edit<R>(
            &self,
            key: K,
            f: impl FnOnce(Option<&mut V>) -> (R, Option<V>),
        ) -> R {
            match self.0.entry(key) {
                Entry::Occupied(mut slot) => {
                    let (answer, fill) = f(Some(slot.get_mut()));
                    debug_assert!(fill.is_none(), "an occupied slot is changed in place");
                    // The entry holds the key `edit` was given, whose drop is user code: if
                    // it panics, the unwinding drops `answer`, which a drop after it became
                    // the return value would leak.
                    drop(slot);
                    answer
                }
                Entry::Vacant(slot) => {
                    let (answer, fill) = f(None);
                    if let Some(value) = fill {
                        slot.insert(value);
                    }
                    answer
                }
            }
        }

        /// Runs `f` on `key`'s value under the key's shared lock, if it has one.
        pub(crate) fn with<R>(&self, key: &K, f: impl FnOnce(&V) -> R) -> Option<R> {
            self.0.get(key).map(|value| f(&value))
        }

        /// Takes `key`'s entry out if `take` says so, under the key's lock.
        pub(crate) fn remove_if(&self, key: &K, take: impl FnOnce(&V) -> bool) -> Option<(K, V)> {
            self.0.remove_if(key, |_, value| take(value))
        }

        pub(crate) fn remove(&self, key: &K) -> Option<(K, V)> {
            self.0.remove(key)
        }

        pub(crate) fn contains(&self, key: &K) -> bool {
            self.0.contains_key(key)
        }

        pub(crate) fn len(&self) -> usize {
            self.0.len()
        }

        /// Empties the map, whatever the keys' `Eq` says, showing `f` each entry (which may
        /// take what it holds) as it leaves.
        pub(crate) fn take_all(&self, mut f: impl FnMut(&K, &mut V)) {
            self.0.retain(|key, value| {
                f(key, value);
                false
            });
        }
    }
}

#[cfg(loom)]
mod imp {
    use std::collections::HashMap;
    use std::hash::Hash;

    use crate::sync::Mutex;

    pub(crate) struct KeyMap<K, V>(Mutex<HashMap<K, V>>);

    impl<K: Eq + Hash, V> KeyMap<K, V> {
        pub(crate) fn new() -> Self {
            Self(Mutex::new(HashMap::new()))
        }

        fn map(&self) -> loom::sync::MutexGuard<'_, HashMap<K, V>> {
            self.0
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        }

        pub(crate) fn edit<R>(
            &self,
            key: K,
            f: impl FnOnce(Option<&mut V>) -> (R, Option<V>),
        ) -> R {
            let mut map = self.map();
            let (answer, fill) = f(map.get_mut(&key));
            if let Some(value) = fill {
                debug_assert!(
                    !map.contains_key(&key),
                    "an occupied slot is changed in place"
                );
                map.insert(key, value);
            }
            answer
        }

        pub(crate) fn with<R>(&self, key: &K, f: impl FnOnce(&V) -> R) -> Option<R> {
            self.map().get(key).map(f)
        }

        pub(crate) fn remove_if(&self, key: &K, take: impl FnOnce(&V) -> bool) -> Option<(K, V)> {
            let mut map = self.map();
            if take(map.get(key)?) {
                map.remove_entry(key)
            } else {
                None
            }
        }

        pub(crate) fn remove(&self, key: &K) -> Option<(K, V)> {
            self.map().remove_entry(key)
        }

        pub(crate) fn contains(&self, key: &K) -> bool {
            self.map().contains_key(key)
        }

        pub(crate) fn len(&self) -> usize {
            self.map().len()
        }

        pub(crate) fn take_all(&self, mut f: impl FnMut(&K, &mut V)) {
            for (key, mut value) in self.map().drain() {
                f(&key, &mut value);
            }
        }
    }
}

pub(crate) use imp::KeyMap;
