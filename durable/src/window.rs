//! The in-memory window: tasks due soon, in a corewheel [`Wheel`], and what is known about
//! every bucket.
//!
//! Everything here sits behind one mutex ([`Shared::core`](crate::shared::Shared)) and is
//! touched by the writer (after a commit), the loader (after reading a bucket) and the
//! dispatcher (to poll the wheel). Each holds it only for in-memory work, never for I/O.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use corewheel::{TimerKey, Wheel};

use crate::bloom::Bloom;
use crate::task::Task;

/// Whether a bucket's tasks are in memory.
pub(crate) enum Load {
    /// Only on disk; the loader will read it ahead of its time.
    Unloaded,
    /// The loader is reading it; tasks scheduled into it meanwhile wait here, so that the
    /// loader's snapshot and a direct insert cannot both deliver one record.
    Loading(Vec<Task>),
    /// Its live tasks are in the wheel; new ones go straight there too.
    Loaded,
}

/// What the window knows about one bucket.
pub(crate) struct Bucket {
    pub load: Load,
    /// No task record in the bucket has a smaller sequence number: tombstones at or
    /// below the smallest of these over all buckets can no longer void anything.
    pub min_seq: u64,
    /// Tasks of a loaded bucket in the wheel or in flight; the bucket is deleted once
    /// this is 0 and its time is past.
    pub outstanding: u64,
}

/// A task waiting in the wheel.
pub(crate) struct Entry {
    pub seq: u64,
    pub key: TimerKey,
}

/// The window and the bookkeeping the writer, loader and dispatcher share.
pub(crate) struct Window {
    wheel: Wheel<Box<Task>>,
    origin: Instant,
    origin_ms: u64,
    /// The latest wall-clock time polled, in ms since the Unix epoch.
    pub high_ms: u64,
    /// Buckets starting at or before this are loaded or loading.
    pub horizon_ms: u64,
    pub bucket_ms: u64,
    /// Tasks in the wheel by id.
    pub entries: HashMap<Box<[u8]>, Entry>,
    pub buckets: BTreeMap<u64, Bucket>,
    /// Latest tombstone per id: records of the id with a smaller sequence number are void.
    pub tombs: HashMap<Box<[u8]>, u64>,
    pub bloom: Bloom,
    pub dead: Vec<Task>,
    /// Every record with a sequence number up to this has been committed and applied.
    /// A bucket's loader takes from disk only records up to the value when it began:
    /// later ones reach the window through [`Load::Loading`] or directly, and reading them
    /// from disk as well would deliver them twice.
    pub applied_seq: u64,
    /// Tombstones applied by this open so far: a task that left the wheel while this read
    /// `n` may have been voided since only if it now reads more.
    pub tombs_applied: u64,
}

impl Window {
    pub(crate) fn new(now_ms: u64, bucket_ms: u64, bloom: Bloom) -> Window {
        let origin = Instant::now();
        Window {
            wheel: Wheel::new(Duration::from_millis(1), origin),
            origin,
            origin_ms: now_ms,
            high_ms: now_ms,
            horizon_ms: 0,
            bucket_ms,
            entries: HashMap::new(),
            buckets: BTreeMap::new(),
            tombs: HashMap::new(),
            bloom,
            dead: Vec::new(),
            applied_seq: 0,
            tombs_applied: 0,
        }
    }

    /// The start of the bucket holding due time `due_ms`.
    pub(crate) fn bucket_of(&self, due_ms: u64) -> u64 {
        due_ms - due_ms % self.bucket_ms
    }

    /// Wall-clock milliseconds as the wheel's instants: the wheel only ever sees this
    /// mapping, so its never-early rounding applies to wall time.
    fn instant(&self, ms: u64) -> Instant {
        self.origin + Duration::from_millis(ms.saturating_sub(self.origin_ms))
    }

    /// Whether the tombstones void the record `(id, seq)`.
    pub(crate) fn is_void(&self, id: &[u8], seq: u64) -> bool {
        self.tombs.get(id).is_some_and(|&tomb| tomb > seq)
    }

    /// The bucket record for `start`, created for a bucket this open has not seen.
    pub(crate) fn bucket_mut(&mut self, start: u64, seq: u64) -> &mut Bucket {
        let loaded = start <= self.horizon_ms;
        let bucket = self.buckets.entry(start).or_insert_with(|| Bucket {
            load: if loaded { Load::Loaded } else { Load::Unloaded },
            min_seq: seq,
            outstanding: 0,
        });
        bucket.min_seq = bucket.min_seq.min(seq);
        bucket
    }

    /// Puts a committed task where its bucket's state says: the wheel, the loader's
    /// waiting list, or nowhere (it is on disk and will be loaded in time).
    pub(crate) fn place(&mut self, task: Task) {
        let Some(bucket) = self.buckets.get_mut(&task.bucket) else {
            return;
        };
        match &mut bucket.load {
            Load::Unloaded => {}
            Load::Loading(waiting) => waiting.push(task),
            Load::Loaded => self.arm(task),
        }
    }

    /// Arms a task of a loaded bucket, replacing an older version of its id.
    pub(crate) fn arm(&mut self, task: Task) {
        if let Some(old) = self.entries.get(&task.id) {
            if old.seq >= task.seq {
                return;
            }
            self.void(&task.id.clone(), task.seq);
        }
        let deadline = self.instant(task.due_ms);
        let id = task.id.clone();
        let seq = task.seq;
        if let Some(bucket) = self.buckets.get_mut(&task.bucket) {
            bucket.outstanding += 1;
        }
        let key = self.wheel.insert(deadline, Box::new(task));
        self.entries.insert(id, Entry { seq, key });
    }

    /// Applies a tombstone: records of `id` below `seq` are void, and one waiting in the
    /// wheel is taken out.
    pub(crate) fn void(&mut self, id: &[u8], seq: u64) {
        self.tombs_applied += 1;
        let tomb = self.tombs.entry(id.into()).or_insert(0);
        *tomb = (*tomb).max(seq);
        if let Some(entry) = self.entries.get(id)
            && entry.seq < seq
        {
            let key = entry.key;
            self.entries.remove(id);
            if let Some(task) = self.wheel.cancel(key) {
                self.finished(task.bucket);
            }
        }
    }

    /// One task of `bucket` is finished (acked, voided, retried elsewhere or dead).
    pub(crate) fn finished(&mut self, bucket: u64) {
        if let Some(b) = self.buckets.get_mut(&bucket) {
            b.outstanding = b.outstanding.saturating_sub(1);
        }
    }

    /// Buckets whose tasks are all finished and whose time is past, removed from the
    /// window for the writer to delete from disk.
    pub(crate) fn take_finished_buckets(&mut self) -> Vec<(u64, u64)> {
        let past = self.high_ms;
        let width = self.bucket_ms;
        let done: Vec<(u64, u64)> = self
            .buckets
            .iter()
            .filter(|(start, b)| {
                matches!(b.load, Load::Loaded)
                    && b.outstanding == 0
                    && start.saturating_add(width) <= past
            })
            .map(|(start, b)| (*start, b.min_seq))
            .collect();
        for (start, _) in &done {
            self.buckets.remove(start);
        }
        done
    }

    /// The next task due by `upto_ms`, if any; `now_ms` is the wall clock's reading.
    /// Polling a little ahead of the clock lets the handler threads, which wait for each
    /// task's exact due time, be the only wake-up between a due time and its handler.
    pub(crate) fn poll(&mut self, now_ms: u64, upto_ms: u64) -> Option<Task> {
        self.high_ms = self.high_ms.max(now_ms);
        let task = self.wheel.poll_expired(self.instant(upto_ms.max(now_ms)))?;
        if self
            .entries
            .get(&task.id)
            .is_some_and(|e| e.seq == task.seq)
        {
            self.entries.remove(&task.id);
        }
        Some(*task)
    }

    /// The wall-clock millisecond at which the wheel next needs a poll, if ever.
    pub(crate) fn next_poll_ms(&self) -> Option<u64> {
        let next = self.wheel.next_deadline()?;
        Some(self.origin_ms + next.saturating_duration_since(self.origin).as_millis() as u64)
    }

    /// Restarts the wheel's time at `now_ms` after the wall clock stepped backwards, so
    /// that tasks still waiting fire when the clock reads their due time again, not
    /// earlier. Tasks already delivered stay delivered.
    pub(crate) fn rebase(&mut self, now_ms: u64) {
        let mut tasks = Vec::with_capacity(self.entries.len());
        for (_, entry) in self.entries.drain() {
            if let Some(task) = self.wheel.cancel(entry.key) {
                tasks.push(*task);
            }
        }
        self.origin = Instant::now();
        self.wheel = Wheel::new(Duration::from_millis(1), self.origin);
        self.origin_ms = now_ms;
        self.high_ms = now_ms;
        tasks.sort_by_key(|t| t.due_ms);
        for task in tasks {
            let deadline = self.instant(task.due_ms);
            let id = task.id.clone();
            let seq = task.seq;
            let key = self.wheel.insert(deadline, Box::new(task));
            self.entries.insert(id, Entry { seq, key });
        }
    }

    /// Tasks waiting in the wheel.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Drops tombstones no bucket can need any more and returns the bound used: every
    /// live bucket's tasks, and every bucket at or above `floor` still on disk, have
    /// sequence numbers at or above it.
    pub(crate) fn prune_tombs(&mut self, next_seq: u64, floor: u64) -> u64 {
        let bound = self
            .buckets
            .values()
            .map(|b| b.min_seq)
            .min()
            .unwrap_or(next_seq)
            .min(floor);
        // A tombstone at the bound itself is kept: an upsert's record (same sequence
        // number) is live only beside it.
        self.tombs.retain(|_, &mut seq| seq >= bound);
        bound
    }
}
