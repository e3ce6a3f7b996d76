//! [`KeyedTimers`]: a timer per key, whose value goes to one handler when it expires.

use std::hash::Hash;
use std::time::Duration;

use crate::engine::TimerEngine;
use crate::engine::handle::TimerHandle;
use crate::error::{KeyedError, Refused};
use crate::keyed::anchor::{self, Anchor};
use crate::keyed::key_map::KeyMap;
use crate::keyed::token;
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::unmodelled::{Arc, Weak};

/// A timer per key, on a [`TimerEngine`]: when a key's timer expires, its key and value go
/// to one handler. go-zero's `TimingWheel`, safe from any thread: the interface for cache
/// entries with a TTL, idle timers keyed by connection id, and session expiry.
///
/// - [`set`](Self::set) upserts: a key already pending gets the new value and deadline.
/// - [`move_to`](Self::move_to) changes only the deadline; [`remove`](Self::remove) takes
///   the value back; [`drain`](Self::drain) and [`stop`](Self::stop) hand every pending
///   entry over.
///
/// **Guarantees**, whatever number of threads set, move and remove the same keys at once:
/// each key has at most one pending timer; every value is handed out exactly once, to the
/// handler, to `remove`, to `drain` or `stop`, or back from `set` when a later `set`
/// replaces it (never twice, never lost; dropping the `KeyedTimers` drops the values still
/// pending); a key removed before it expires never reaches the handler; and the handler
/// never sees a key before its deadline (rounded up to the engine's tick), unless the
/// engine shuts down with [`PendingTimers::Run`](crate::PendingTimers::Run), which runs
/// every pending timer at once. Each key's changes happen under that key's lock in the
/// map, so they are ordered as the locks are taken: a `set` that takes the lock after the
/// old timer began to fire, but before its fire took the lock, replaces the value, which
/// then does not reach the handler. Every timer carries a token of its own `set`, and a
/// fire takes only the slot that holds its token.
///
/// **The handler** runs on the engine's worker threads, holding no lock, so it may set the
/// same key again (a repeating TTL) or call any other method. It should be quick, as any
/// timer callback should: it holds up the timers behind it. A panic in it is caught and
/// counted in the engine's stats, and the value is dropped.
///
/// **Cost**: a `set` is the engine's arm (or reset, for a key already pending) under one
/// lock of the map (dashmap's, sharded) and a clone of the key; `remove` is a map removal
/// and the engine's cancel. Neither touches a cache line that other threads write, beyond
/// the map's own lock: a timer's callback finds the map through a slot in a process-wide
/// table, not a reference count. A fire reads that slot inside a crossbeam-epoch critical
/// section (the handler runs after it), and takes a reference to the handler for the
/// length of its call: an increment and a decrement that the fires of one `KeyedTimers`
/// share, paid per fire, never per `set` or `remove`. A key of up to one machine word
/// (`u64`, a connection id) keeps the callback (the slot's index, the key and its token)
/// in the timer's node; a larger one costs an allocation per new key's timer.
///
/// **Dropping** cancels every timer and drops the values at once, on the dropping thread;
/// so is the handler, unless a fire holds it (a fire takes it for the length of its
/// lookup and call), in which case it is dropped when that fire returns, on its worker.
/// What is left (the emptied map) is freed once no fire can be reading it, and runs no code
/// of yours.
///
/// **After the engine shuts down**, `set` is refused. With
/// [`PendingTimers::Drop`](crate::PendingTimers::Drop) the entries still pending stay in
/// the map until removed, drained or stopped (their timers will not fire); with
/// [`PendingTimers::Run`](crate::PendingTimers::Run) they all go to the handler during
/// the shutdown, early.
///
/// **Keys and values** must be well-behaved for the map (`Eq` consistent with `Hash`);
/// one that is not (a NaN) can never be found by `remove`, `move_to` or a fire, but
/// `drain`, `stop` and dropping still take it out.
///
/// ```
/// use corewheel::{KeyedTimers, ManualClock, TimerEngine};
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let engine = TimerEngine::builder().manual_clock(clock.clone()).build().unwrap();
/// let expired = Arc::new(Mutex::new(Vec::new()));
/// let sink = Arc::clone(&expired);
/// let sessions = KeyedTimers::with_engine(&engine, move |id: u64, user: &'static str| {
///     sink.lock().unwrap().push((id, user));
/// });
/// sessions.set(1, "ada", Duration::from_secs(30)).unwrap();
/// sessions.set(2, "brian", Duration::from_secs(30)).unwrap();
/// clock.advance(Duration::from_secs(20));
/// assert!(sessions.move_to(&1, Duration::from_secs(30)), "ada was active");
/// clock.advance(Duration::from_secs(10));
/// engine.turn();
/// assert_eq!(*expired.lock().unwrap(), [(2, "brian")]);
/// assert_eq!(sessions.remove(&1), Some("ada"));
/// ```
pub struct KeyedTimers<'e, K: Eq + Hash, V> {
    engine: &'e TimerEngine,
    inner: Anchor<Inner<K, V>>,
    /// The handler's one lasting strong reference: dropped with the `KeyedTimers`, so that
    /// the handler goes then, or with the last fire still holding it.
    #[expect(
        dead_code,
        reason = "held for its drop; fires reach the handler through `inner`"
    )]
    handler: Arc<Handler<K, V>>,
}

/// The function expired keys and their values go to.
type Handler<K, V> = dyn Fn(K, V) + Send + Sync;

/// What the timers' callbacks share with the `KeyedTimers`, through its [`Anchor`]. Its
/// free is deferred past every fire that may be reading it, on any thread, so it owns
/// nothing whose drop runs user code: the map is empty by then (the drop takes every
/// value), and the handler is only referred to, weakly.
struct Inner<K: Eq + Hash, V> {
    map: KeyMap<K, Slot<V>>,
    /// A fire takes a strong reference for the length of its call: one increment and one
    /// decrement per fire (never per `set` or `remove`), and none left behind.
    handler: Weak<Handler<K, V>>,
    /// Set by `stop`: `set` is refused from then on.
    stopped: AtomicBool,
}

/// A pending key's value and the timer that will hand it to the handler.
struct Slot<V> {
    /// `Some` while the slot is in the map: taken out only as the slot leaves it, by
    /// `drain`, `stop` or the drop, which empty the map in place.
    value: Option<V>,
    timer: TimerHandle,
    /// The token of `timer`'s `set` (see the `token` module), which its callback
    /// carries: a fire takes only the slot with its own token.
    token: u64,
}

impl<K, V> KeyedTimers<'static, K, V>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    V: Send + Sync + 'static,
{
    /// Keyed timers on the process-wide [`default_engine`](crate::default_engine), handing
    /// each expired key and its value to `handler`.
    pub fn new(handler: impl Fn(K, V) + Send + Sync + 'static) -> Self {
        Self::with_engine(crate::default_engine(), handler)
    }
}

impl<'e, K, V> KeyedTimers<'e, K, V>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    V: Send + Sync + 'static,
{
    /// Keyed timers on `engine`, handing each expired key and its value to `handler`.
    pub fn with_engine(
        engine: &'e TimerEngine,
        handler: impl Fn(K, V) + Send + Sync + 'static,
    ) -> Self {
        let handler: Arc<Handler<K, V>> = Arc::new(handler);
        Self {
            engine,
            inner: Anchor::new(Inner {
                map: KeyMap::new(),
                handler: Arc::downgrade(&handler),
                stopped: AtomicBool::new(false),
            }),
            handler,
        }
    }

    /// Sets `key`'s value and its deadline, `delay` from now. A key already pending gets
    /// both replaced, and its old value comes back as `Ok(Some(old))`; a new key gives
    /// `Ok(None)`. Refused, with `value` handed back, after [`stop`](Self::stop), once the
    /// engine has shut down, or when its pool is full. Delays are clamped as the engine's
    /// are: zero fires on the next tick, and one too long to add to now never fires.
    ///
    /// A key whose timer began to fire before this `set` took the key's lock gets a new
    /// timer: the fire then finds another token in the slot and leaves it, and the old
    /// value comes back here rather than reaching the handler.
    pub fn set(&self, key: K, value: V, delay: Duration) -> Result<Option<V>, KeyedError<V>> {
        if self.inner.stopped.load(Ordering::Acquire) {
            return Err(KeyedError::new(value, Refused::Stopped));
        }
        let for_timer = key.clone();
        let (outcome, unused_key) = self.inner.map.edit(key, |slot| {
            // Looked at again under the lock: `stop` sets the flag before it empties the
            // map, so a `set` that misses it here is one `stop` then finds.
            if self.inner.stopped.load(Ordering::Acquire) {
                let refused = Err(KeyedError::new(value, Refused::Stopped));
                return ((refused, Some(for_timer)), None);
            }
            match slot {
                Some(slot) if self.engine.reset(slot.timer, delay) => {
                    ((Ok(slot.value.replace(value)), Some(for_timer)), None)
                }
                // Firing: its callback waits for this lock, and finds another token here.
                Some(slot) => match self.arm(for_timer, delay) {
                    Ok((timer, token)) => {
                        (slot.timer, slot.token) = (timer, token);
                        ((Ok(slot.value.replace(value)), None), None)
                    }
                    Err(reason) => ((Err(KeyedError::new(value, reason)), None), None),
                },
                None => match self.arm(for_timer, delay) {
                    Ok((timer, token)) => {
                        let slot = Slot {
                            value: Some(value),
                            timer,
                            token,
                        };
                        ((Ok(None), None), Some(slot))
                    }
                    Err(reason) => ((Err(KeyedError::new(value, reason)), None), None),
                },
            }
        });
        // Dropped here, out of the lock, and before the outcome is returned: a key whose
        // drop panics then unwinds through `outcome`, which drops the value it holds.
        drop(unused_key);
        outcome
    }

    /// Arms the timer that hands `key`'s value to the handler `delay` from now; returns
    /// it and its token.
    fn arm(&self, key: K, delay: Duration) -> Result<(TimerHandle, u64), Refused> {
        let anchor = self.inner.index();
        let token = token::fresh();
        self.engine
            .schedule(delay, move || {
                // Everything of the user's (the handler's call, the key's and the handler's
                // drops) happens after the read section, so that a handler or a `Drop` that
                // blocks holds up no free. Nothing is handed out if this `KeyedTimers` has
                // been dropped.
                let expired = anchor::with(anchor, |inner: &Inner<K, V>| inner.expire(key, token));
                let Ok(Expired {
                    handler,
                    taken,
                    key,
                }) = expired
                else {
                    return;
                };
                // First, on its own: a panic here unwinds through `handler` and `taken`,
                // which drops them, rather than through a half-built value.
                drop(key);
                if let (Some(handler), Some((key, value))) = (handler, taken) {
                    handler(key, value);
                }
            })
            .map(|timer| (timer, token))
            .map_err(Refused::Engine)
    }

    /// Moves `key`'s deadline to `delay` from now, keeping its value. `false` if the key
    /// is not pending (never set, removed, or its timer has begun to fire), and then
    /// nothing changes.
    pub fn move_to(&self, key: &K, delay: Duration) -> bool {
        self.inner
            .map
            .with(key, |slot| self.engine.reset(slot.timer, delay))
            .unwrap_or(false)
    }

    /// Takes `key` out before it expires, and gives its value back; `None` if it is not
    /// pending. A key removed here never reaches the handler.
    pub fn remove(&self, key: &K) -> Option<V> {
        self.take(key).map(|(_, value)| value)
    }

    /// Takes `key`'s entry out of the map and cancels its timer. A timer already firing
    /// finds no slot, and hands nothing to the handler.
    fn take(&self, key: &K) -> Option<(K, V)> {
        let (key, slot) = self.inner.map.remove(key)?;
        let _cancelled = self.engine.cancel(slot.timer);
        slot.value.map(|value| (key, value))
    }

    /// Runs `f` on `key`'s value, if the key is pending, and returns what `f` returns: how a
    /// cache reads an entry whose expiry these timers keep. `f` runs under a shared lock
    /// on part of the map, so it should be short, and it must not change this
    /// `KeyedTimers` (`set`, `remove`, `drain`, `stop`: they would wait for that lock for
    /// ever); reading (`peek`, `contains`, `len`) is fine. A key past its deadline whose timer has not yet run (at most
    /// about a tick later, on a worker that keeps up) is still pending.
    pub fn peek<R>(&self, key: &K, f: impl FnOnce(&V) -> R) -> Option<R> {
        self.inner
            .map
            .with(key, |slot| slot.value.as_ref().map(f))
            .flatten()
    }

    /// Whether `key` is pending.
    pub fn contains(&self, key: &K) -> bool {
        self.inner.map.contains(key)
    }

    /// How many keys are pending.
    pub fn len(&self) -> usize {
        self.inner.map.len()
    }

    /// Whether no key is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hands every pending key and value to `f`, cancelling their timers: none of them
    /// reaches the handler. Keys set by other threads while it runs may be left; call
    /// [`stop`](Self::stop) to refuse them first. `f` runs once the entries are out of the
    /// map, holding no lock. Returns how many it handed over.
    pub fn drain(&self, mut f: impl FnMut(K, V)) -> usize {
        let mut taken = Vec::new();
        self.inner
            .take_all(self.engine, |key, value| taken.push((key.clone(), value)));
        let handed = taken.len();
        for (key, value) in taken {
            f(key, value);
        }
        handed
    }

    /// Stops: every later [`set`](Self::set) is refused, and every pending key and value is
    /// handed to `f` (pass `|_, _| {}` to drop them) until none is left. Returns how many
    /// it handed over. A timer already firing as it runs may still reach the handler
    /// before `stop` takes its key. Dropping the `KeyedTimers` stops it and drops the
    /// values.
    pub fn stop(&self, mut f: impl FnMut(K, V)) -> usize {
        self.inner.stopped.store(true, Ordering::SeqCst);
        let mut handed = 0;
        // Ends: a `set` that got past the flag before it was raised adds at most one key,
        // and `drain` takes every key, found or not.
        loop {
            handed += self.drain(&mut f);
            if self.inner.map.len() == 0 {
                return handed;
            }
        }
    }

    /// Whether [`stop`](Self::stop) has been called.
    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::Acquire)
    }
}

impl<K: Eq + Hash, V> Inner<K, V> {
    /// Empties the map in place (whatever the keys' `Eq` says), cancelling each key's
    /// timer before showing `f` the key and handing it the value, under the key's lock:
    /// `f` only collects.
    fn take_all(&self, engine: &TimerEngine, mut f: impl FnMut(&K, V)) {
        self.map.take_all(|key, slot| {
            let _cancelled = engine.cancel(slot.timer);
            if let Some(value) = slot.value.take() {
                f(key, value);
            }
        });
    }

    /// A key's timer fired: takes the key and value for the handler, with the handler, if
    /// the slot is still this timer's (holds its `token`). A slot with another token
    /// belongs to a later `set` (this fire lost the race for the lock to it); no slot means
    /// a `remove`, `drain` or `stop` took it. The handler is taken first: once the
    /// `KeyedTimers` is gone it cannot be, and the value is left for the drop, which takes
    /// every value in the map. Everything comes back out of the read section to be used
    /// or dropped there, the fire's own copy of the key included.
    fn expire(&self, key: K, token: u64) -> Expired<K, V> {
        let Some(handler) = self.handler.upgrade() else {
            return Expired {
                handler: None,
                taken: None,
                key,
            };
        };
        let taken = self.map.remove_if(&key, |slot| slot.token == token);
        Expired {
            handler: Some(handler),
            taken: taken.and_then(|(key, slot)| slot.value.map(|value| (key, value))),
            key,
        }
    }
}

/// What a fire took in its read section, to use and drop after it.
struct Expired<K, V> {
    handler: Option<Arc<Handler<K, V>>>,
    /// The key and value for the handler, if the slot was this timer's.
    taken: Option<(K, V)>,
    /// The fire's own copy of the key, used to find the slot.
    key: K,
}

impl<K: Eq + Hash, V> Drop for KeyedTimers<'_, K, V> {
    /// Stops, cancelling every pending timer and dropping its value, so that nothing
    /// reaches the handler afterwards. With `&mut self` no other thread can set, so one
    /// pass empties the map.
    ///
    /// Every timer is cancelled before any value is dropped, and the values are dropped
    /// out of the map's locks, each on its own: one whose `Drop` panics is caught, and the
    /// others are still dropped.
    fn drop(&mut self) {
        self.inner.stopped.store(true, Ordering::SeqCst);
        let mut values = Vec::new();
        self.inner
            .take_all(self.engine, |_, value| values.push(value));
        for value in values {
            let _panicked = crate::engine::panics::contain(move || drop(value));
        }
    }
}

impl<K: Eq + Hash, V> std::fmt::Debug for KeyedTimers<'_, K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedTimers")
            .field("stopped", &self.inner.stopped.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}
