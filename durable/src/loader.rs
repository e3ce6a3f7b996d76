//! The loader thread: reads each bucket into the wheel before its time.
//!
//! A bucket is read once the wall clock is within `load_ahead` of its start, oldest bucket
//! first, so tasks that came due while the process was down are armed first, and a bucket
//! is in memory well before its first task is due. The read happens without the window's
//! lock; only arming the tasks takes it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::record::Kind;
use crate::shared::Shared;
use crate::task::Task;
use crate::window::Load;

/// How often the loader looks for a bucket to read when none is due for loading.
const IDLE_POLL: Duration = Duration::from_millis(20);
/// How long a bucket whose read failed waits before it is read again; the other buckets
/// are loaded meanwhile.
const RETRY_MS: u64 = 1000;

/// Runs until shutdown.
pub(crate) fn run(shared: Arc<Shared>) {
    let ahead = u64::try_from(shared.options.load_ahead.as_millis()).unwrap_or(u64::MAX);
    // Buckets whose read failed, and when each is read again (by the monotonic clock:
    // the wall clock may step back).
    let mut retry_at: HashMap<u64, Instant> = HashMap::new();
    while !shared.stopping() {
        let target = shared.now_ms().saturating_add(ahead);
        let now = Instant::now();
        let next = {
            let mut core = shared.core();
            let next = core
                .buckets
                .iter()
                .find(|(start, b)| {
                    **start <= target
                        && matches!(b.load, Load::Unloaded)
                        && retry_at.get(*start).is_none_or(|&at| at <= now)
                })
                .map(|(start, _)| *start);
            match next {
                Some(start) => {
                    if let Some(bucket) = core.buckets.get_mut(&start) {
                        bucket.load = Load::Loading(Vec::new());
                    }
                    next.map(|start| (start, core.applied_seq))
                }
                None => {
                    core.horizon_ms = core.horizon_ms.max(target);
                    None
                }
            }
        };
        match next {
            Some((start, applied)) => {
                if load(&shared, start, applied) {
                    retry_at.remove(&start);
                } else {
                    retry_at.insert(start, Instant::now() + Duration::from_millis(RETRY_MS));
                }
            }
            None => shared.pause(IDLE_POLL),
        }
    }
}

/// Reads one bucket and arms its live tasks, oldest due first. Only records applied by
/// the writer when loading began (`applied`) are taken from disk; see
/// [`Window::applied_seq`](crate::window::Window::applied_seq). A bucket that cannot be
/// read goes back to unloaded (what was committed to it meanwhile is on disk too) and
/// `false` is returned.
fn load(shared: &Shared, start: u64, applied: u64) -> bool {
    let OnDisk {
        mut tasks,
        done,
        upserts,
    } = match read(shared, start) {
        Ok(read) => read,
        Err(e) => {
            eprintln!(
                "corewheel-durable: reading bucket {start}: {e}; read again in {RETRY_MS} ms, \
                 the other buckets meanwhile"
            );
            if let Some(bucket) = shared.core().buckets.get_mut(&start) {
                bucket.load = Load::Unloaded;
            }
            return false;
        }
    };
    // A record at or below `applied` had its commit applied to the window before this
    // load began; later ones come through `waiting`, or are of a commit that failed and
    // never counted, so they may not hide an older version either.
    tasks.retain(|t| t.seq <= applied);
    // An upsert is whole only with its tombstone, which the same commit wrote to the
    // control log after it: without it a crash (or a failed write) cut the upsert short,
    // and the version before it stays.
    let torn: HashSet<u64> = {
        let core = shared.core();
        tasks
            .iter()
            .filter(|t| upserts.contains(&t.seq) && core.tombs.get(&t.id) != Some(&t.seq))
            .map(|t| t.seq)
            .collect()
    };
    tasks.retain(|t| !torn.contains(&t.seq));
    // Then only the newest record of an id counts, finished or not: a retry whose Done
    // mark a crash cut off leaves its older version beside it.
    let mut newest: HashMap<Box<[u8]>, u64> = HashMap::new();
    for t in &tasks {
        let seq = newest.entry(t.id.clone()).or_insert(0);
        *seq = (*seq).max(t.seq);
    }
    tasks.retain(|t| newest[&t.id] == t.seq && !done.contains(&(t.id.clone(), t.seq)));
    tasks.sort_by_key(|t| (t.due_ms, t.seq));
    let mut core = shared.core();
    let waiting = match core.buckets.get_mut(&start) {
        Some(bucket) => match std::mem::replace(&mut bucket.load, Load::Loaded) {
            Load::Loading(waiting) => waiting,
            _ => Vec::new(),
        },
        None => return true,
    };
    for task in tasks.into_iter().chain(waiting) {
        if !core.is_void(&task.id, task.seq) {
            core.arm(task);
        }
    }
    drop(core);
    shared.core_changed.notify_all();
    true
}

/// A bucket's records as read from disk.
struct OnDisk {
    tasks: Vec<Task>,
    /// The tasks a Done record finishes, by id and sequence number.
    done: HashSet<(Box<[u8]>, u64)>,
    /// The sequence numbers of tasks written as upserts.
    upserts: HashSet<u64>,
}

/// Reads a bucket's task and Done records.
fn read(shared: &Shared, start: u64) -> std::io::Result<OnDisk> {
    let mut bucket = OnDisk {
        tasks: Vec::new(),
        done: HashSet::new(),
        upserts: HashSet::new(),
    };
    shared.store.read_bucket(start, &mut |r| match r.kind {
        Kind::Task | Kind::Upsert => {
            if r.kind == Kind::Upsert {
                bucket.upserts.insert(r.seq);
            }
            bucket.tasks.push(Task {
                id: r.id,
                payload: r.payload,
                due_ms: r.due_ms,
                attempt: r.attempt,
                seq: r.seq,
                bucket: start,
            });
        }
        Kind::Done => {
            bucket.done.insert((r.id, r.seq));
        }
        _ => {}
    })?;
    Ok(bucket)
}
