//! The loader thread: reads each bucket into the wheel before its time.
//!
//! A bucket is read once the wall clock is within `load_ahead` of its start, oldest bucket
//! first, so tasks that came due while the process was down are armed first, and a bucket
//! is in memory well before its first task is due. The read happens without the window's
//! lock; only arming the tasks takes it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::record::Kind;
use crate::shared::Shared;
use crate::task::Task;
use crate::window::Load;

/// How often the loader looks for a bucket to read when none is due for loading.
const IDLE_POLL: Duration = Duration::from_millis(20);

/// Runs until shutdown.
pub(crate) fn run(shared: Arc<Shared>) {
    let ahead = u64::try_from(shared.options.load_ahead.as_millis()).unwrap_or(u64::MAX);
    while !shared.stopping() {
        let target = shared.now_ms().saturating_add(ahead);
        let next = {
            let mut core = shared.core();
            let next = core
                .buckets
                .iter()
                .find(|(start, b)| **start <= target && matches!(b.load, Load::Unloaded))
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
            Some((start, applied)) => load(&shared, start, applied),
            None => shared.pause(IDLE_POLL),
        }
    }
}

/// Reads one bucket and arms its live tasks, oldest due first. Only records applied by
/// the writer when loading began (`applied`) are taken from disk; see
/// [`Window::applied_seq`](crate::window::Window::applied_seq).
fn load(shared: &Shared, start: u64, applied: u64) {
    let tasks = loop {
        match read(shared, start, applied) {
            Ok(tasks) => break tasks,
            Err(e) => {
                eprintln!("corewheel-durable: reading bucket {start}: {e}; trying again");
                if shared.stopping() {
                    return;
                }
                shared.pause(Duration::from_secs(1));
            }
        }
    };
    let mut core = shared.core();
    let waiting = match core.buckets.get_mut(&start) {
        Some(bucket) => match std::mem::replace(&mut bucket.load, Load::Loaded) {
            Load::Loading(waiting) => waiting,
            _ => Vec::new(),
        },
        None => return,
    };
    for task in tasks.into_iter().chain(waiting) {
        if !core.is_void(&task.id, task.seq) {
            core.arm(task);
        }
    }
    drop(core);
    shared.core_changed.notify_all();
}

/// The bucket's tasks that no Done record finishes, sorted by due time.
fn read(shared: &Shared, start: u64, applied: u64) -> std::io::Result<Vec<Task>> {
    let mut tasks = Vec::new();
    let mut done = HashSet::new();
    shared.store.read_bucket(start, &mut |r| match r.kind {
        Kind::Task => tasks.push(Task {
            id: r.id,
            payload: r.payload,
            due_ms: r.due_ms,
            attempt: r.attempt,
            seq: r.seq,
            bucket: start,
        }),
        Kind::Done => {
            done.insert((r.id, r.seq));
        }
        _ => {}
    })?;
    // Only the newest record of an id counts, finished or not: a retry or an upsert whose
    // Done mark or tombstone a crash cut off leaves its older version beside it.
    let mut newest: HashMap<Box<[u8]>, u64> = HashMap::new();
    for t in &tasks {
        let seq = newest.entry(t.id.clone()).or_insert(0);
        *seq = (*seq).max(t.seq);
    }
    tasks.retain(|t| {
        t.seq <= applied && newest[&t.id] == t.seq && !done.contains(&(t.id.clone(), t.seq))
    });
    tasks.sort_by_key(|t| (t.due_ms, t.seq));
    Ok(tasks)
}
