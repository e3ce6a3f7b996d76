//! The writer thread: group commit.
//!
//! Every schedule, cancel, ack, retry and requeue becomes records that the one writer
//! thread appends. It takes all ops waiting when it wakes, writes them with one `write`
//! per file, fsyncs each file it touched once, and only then answers every caller of the
//! batch and applies the batch to the window. So concurrent callers share an fsync, and
//! nothing reaches the wheel (or is delivered) before it is durable.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use crate::error::{Error, share};
use crate::record::{Kind, Record};
use crate::shared::{NewTask, Op, Outcome, Reply, Shared};
use crate::store::{SEQ_BITS, Target};
use crate::task::Task;
use crate::window::Window;

/// Records per group commit at most, so that one batch's memory stays small.
const MAX_BATCH_RECORDS: usize = 1 << 16;
/// How often the writer deletes finished buckets and drops old tombstones when idle.
const HOUSEKEEPING: Duration = Duration::from_millis(100);

/// What a committed batch does to the window, in order.
enum Effect {
    Tomb(Box<[u8]>, u64),
    Place(Task),
    Finished(u64),
    Dead(Task),
    Undead(u64),
}

/// The writer's state between batches.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    next_seq: u64,
    /// Finish ops whose commit failed, tried again with the next batch: a handler's
    /// outcome must not be forgotten while the process runs.
    retry_later: Vec<Op>,
    /// Where the ids of durably acked tasks go to the `on_ack` listener's thread, if
    /// there is a listener. The listener does not run here: one that schedules would
    /// wait on this very thread for its answer.
    acks: Option<Sender<Box<[u8]>>>,
    /// The batch being built: the newest tombstone it writes for each id, and the dead
    /// letters it requeues. The window learns of them only once the batch is durable, so
    /// an op later in the same batch must look here too.
    batch_tombs: HashMap<Box<[u8]>, u64>,
    batch_requeued: HashSet<u64>,
    /// Finished buckets not deleted yet, by start, with their smallest sequence number
    /// and whether a failure to delete was reported: their records are still on disk, so
    /// the tombstones they need are kept until a later try deletes them.
    undeleted: BTreeMap<u64, (u64, bool)>,
    unwritten_marks: UnwrittenMarks,
}

/// Requeue marks whose write failed, after their requeues' tombstones were durable:
/// tried again less and less often, or written by the next open from the tombstones,
/// which are not pruned meanwhile.
#[derive(Default)]
struct UnwrittenMarks {
    bytes: Vec<u8>,
    failures: u32,
    retry_at: Option<Instant>,
}

/// The wait before the first retry of a failed requeue mark write; it doubles with each
/// failure up to [`MARKS_RETRY_MAX`], so a disk that keeps failing is not asked (nor
/// logged about) ten times a second.
const MARKS_RETRY_FIRST: Duration = Duration::from_millis(100);
const MARKS_RETRY_MAX: Duration = Duration::from_secs(10);

impl Writer {
    pub(crate) fn new(shared: Arc<Shared>, acks: Option<Sender<Box<[u8]>>>) -> Writer {
        let next_seq = (shared.store.epoch() << SEQ_BITS) + 1;
        Writer {
            shared,
            next_seq,
            retry_later: Vec::new(),
            acks,
            batch_tombs: HashMap::new(),
            batch_requeued: HashSet::new(),
            undeleted: BTreeMap::new(),
            unwritten_marks: UnwrittenMarks::default(),
        }
    }

    /// Runs until every sender of `ops` is gone and the queue is drained.
    pub(crate) fn run(mut self, ops: Receiver<Op>) {
        self.fill_bloom();
        loop {
            let first = match ops.recv_timeout(HOUSEKEEPING) {
                Ok(op) => Some(op),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => {
                    if self.retry_later.is_empty() {
                        break;
                    }
                    None
                }
            };
            let mut batch = std::mem::take(&mut self.retry_later);
            let mut records = 0;
            if let Some(op) = first {
                records += op_records(&op);
                batch.push(op);
                while records < MAX_BATCH_RECORDS {
                    match ops.try_recv() {
                        Ok(op) => {
                            records += op_records(&op);
                            batch.push(op);
                        }
                        Err(_) => break,
                    }
                }
            }
            if !batch.is_empty() {
                self.commit(batch);
            }
            self.housekeeping();
            if self.shared.stopping() && !self.retry_later.is_empty() {
                // Closing on a disk that keeps failing: what is not acked is delivered
                // again after the next open.
                self.retry_later.clear();
            }
        }
        self.housekeeping();
    }

    /// Reads every bucket once at open so that upserts of ids scheduled before it are
    /// recognised. Ops wait meanwhile; the loader and dispatcher do not.
    fn fill_bloom(&mut self) {
        let starts: Vec<u64> = self.shared.core().buckets.keys().copied().collect();
        for start in starts {
            let mut ids: Vec<Box<[u8]>> = Vec::new();
            let result = self.shared.store.read_bucket(start, &mut |r: Record| {
                if matches!(r.kind, Kind::Task | Kind::Upsert) {
                    ids.push(r.id);
                }
                if ids.len() >= 4096 {
                    let mut core = self.shared.core();
                    for id in ids.drain(..) {
                        core.bloom.insert(&id);
                    }
                }
            });
            let mut core = self.shared.core();
            for id in ids {
                core.bloom.insert(&id);
            }
            if let Err(e) = result {
                // Without the bucket's ids an upsert could miss an old version: mark
                // nothing as certain-new from now on.
                eprintln!("corewheel-durable: reading bucket {start} at open: {e}");
                core.bloom = crate::bloom::Bloom::saturated();
            }
        }
    }

    fn seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Writes one batch, fsyncs it, then answers its callers and applies it.
    fn commit(&mut self, batch: Vec<Op>) {
        let shared = Arc::clone(&self.shared);
        let mut writes = Writes::default();
        let mut effects = Vec::new();
        let mut acked: Vec<Box<[u8]>> = Vec::new();
        let mut replies: Vec<(Reply, Result<(), Error>)> = Vec::new();
        let mut finishes = Vec::new();
        self.batch_tombs.clear();
        self.batch_requeued.clear();
        {
            let mut core = shared.core();
            let now_ms = shared.now_ms();
            for op in batch {
                match op {
                    Op::Schedule(tasks, reply) => {
                        for task in tasks {
                            self.schedule(&mut core, task, 1, None, &mut writes, &mut effects);
                        }
                        replies.push((reply, Ok(())));
                    }
                    Op::Cancel(id, reply) => {
                        if core.bloom.may_contain(&id) {
                            let seq = self.seq();
                            self.tomb(id, seq, None, &mut writes, &mut effects);
                        }
                        replies.push((reply, Ok(())));
                    }
                    Op::Requeue(id, reply) => {
                        let requeued = &self.batch_requeued;
                        let Some(pos) = core
                            .dead
                            .iter()
                            .rposition(|t| t.id == id && !requeued.contains(&t.seq))
                        else {
                            replies.push((reply, Err(Error::NotDead)));
                            continue;
                        };
                        let dead = core.dead[pos].clone();
                        self.batch_requeued.insert(dead.seq);
                        writes.record(Target::Dead, &Record::marker(Kind::Requeued, &id, dead.seq));
                        effects.push(Effect::Undead(dead.seq));
                        let task = NewTask {
                            id: dead.id,
                            payload: dead.payload,
                            due_ms: now_ms,
                        };
                        let letter = Some(dead.seq);
                        self.schedule(&mut core, task, 1, letter, &mut writes, &mut effects);
                        replies.push((reply, Ok(())));
                    }
                    Op::Finish(task, outcome) => {
                        self.finish(
                            &mut core,
                            &task,
                            &outcome,
                            now_ms,
                            &mut writes,
                            &mut effects,
                        );
                        if matches!(outcome, Outcome::Succeeded) {
                            acked.push(task.id.clone());
                        }
                        finishes.push(Op::Finish(task, outcome));
                    }
                }
            }
        }
        match writes.append(&shared) {
            Ok(_) => {
                // The batch is durable: a requeue's tombstone stands for its mark.
                self.write_marks(writes.marks());
                let mut core = shared.core();
                for effect in effects {
                    apply(&mut core, effect);
                }
                core.applied_seq = self.next_seq - 1;
                shared
                    .tombs_applied
                    .store(core.tombs_applied, std::sync::atomic::Ordering::Release);
                drop(core);
                shared.core_changed.notify_all();
                for (reply, result) in replies {
                    let _ = reply.send(result);
                }
                if let Some(acks) = &self.acks {
                    for id in acked {
                        // The listener's thread ends only after this one: it cannot fail.
                        let _ = acks.send(id);
                    }
                }
            }
            Err(e) => {
                let e = Error::Io(e);
                for (reply, _) in replies {
                    let _ = reply.send(Err(share(&e)));
                }
                self.retry_later = finishes;
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// Records a new task (or a new version of one) and the tombstone an upsert needs. A
    /// requeue of the dead letter `requeues` is always an upsert, whose tombstone names the
    /// letter: the task then counts only where the letter is gone.
    fn schedule(
        &mut self,
        core: &mut Window,
        task: NewTask,
        attempt: u32,
        requeues: Option<u64>,
        writes: &mut Writes,
        effects: &mut Vec<Effect>,
    ) {
        let seq = self.seq();
        let known = core.bloom.may_contain(&task.id);
        let upsert = known || requeues.is_some();
        if upsert {
            self.tomb(task.id.clone(), seq, requeues, writes, effects);
        }
        if !known {
            core.bloom.insert(&task.id);
        }
        let bucket = core.bucket_of(task.due_ms);
        core.bucket_mut(bucket, seq);
        let record = Record {
            kind: if upsert { Kind::Upsert } else { Kind::Task },
            seq,
            due_ms: task.due_ms,
            attempt,
            id: task.id,
            payload: task.payload,
        };
        writes.record(Target::Bucket(bucket), &record);
        effects.push(Effect::Place(Task {
            id: record.id,
            payload: record.payload,
            due_ms: record.due_ms,
            attempt,
            seq,
            bucket,
        }));
    }

    /// Records a tombstone: every record of `id` below `seq` is void, and so is the dead
    /// letter it `requeues`.
    fn tomb(
        &mut self,
        id: Box<[u8]>,
        seq: u64,
        requeues: Option<u64>,
        writes: &mut Writes,
        effects: &mut Vec<Effect>,
    ) {
        let mut record = Record::marker(Kind::Tomb, &id, seq);
        if let Some(letter) = requeues {
            record.payload = letter.to_le_bytes().into();
        }
        writes.record(Target::Control, &record);
        self.batch_tombs.insert(id.clone(), seq);
        effects.push(Effect::Tomb(id, seq));
    }

    /// Records how a delivered task ended: done, a retry later, or a dead letter.
    fn finish(
        &mut self,
        core: &mut Window,
        task: &Task,
        outcome: &Outcome,
        now_ms: u64,
        writes: &mut Writes,
        effects: &mut Vec<Effect>,
    ) {
        writes.record(
            Target::Bucket(task.bucket),
            &Record::marker(Kind::Done, &task.id, task.seq),
        );
        effects.push(Effect::Finished(task.bucket));
        let void = core.is_void(&task.id, task.seq)
            || self
                .batch_tombs
                .get(&task.id)
                .is_some_and(|&tomb| tomb > task.seq);
        if matches!(outcome, Outcome::Succeeded) || void {
            return;
        }
        let policy = &self.shared.options.retry;
        if task.attempt >= policy.max_attempts {
            // Numbered as the attempt that died, not afresh: a commit retried after a
            // failure (or a redelivery after a crash) that wrote this record once already
            // writes the same letter again, which a read counts once.
            let seq = task.seq;
            let dead = Task {
                seq,
                ..task.clone()
            };
            writes.record(
                Target::Dead,
                &Record {
                    kind: Kind::Dead,
                    seq,
                    due_ms: task.due_ms,
                    attempt: task.attempt,
                    id: task.id.clone(),
                    payload: task.payload.clone(),
                },
            );
            effects.push(Effect::Dead(dead));
            return;
        }
        let backoff = u64::try_from(policy.backoff(task.attempt).as_millis()).unwrap_or(u64::MAX);
        let seq = self.seq();
        // The retry stays in the failed attempt's bucket, whatever its due time, so that
        // the new attempt and the old one's Done mark are in one file: the loader keeps
        // only the newest record of an id per bucket, so a crash between the two writes
        // cannot leave two live versions in different buckets.
        let retry = Task {
            seq,
            due_ms: now_ms.saturating_add(backoff),
            attempt: task.attempt + 1,
            ..task.clone()
        };
        core.bucket_mut(task.bucket, seq);
        writes.record(
            Target::Bucket(task.bucket),
            &Record {
                kind: Kind::Task,
                seq,
                due_ms: retry.due_ms,
                attempt: retry.attempt,
                id: retry.id.clone(),
                payload: retry.payload.clone(),
            },
        );
        effects.push(Effect::Place(retry));
    }

    /// Deletes buckets whose tasks are all finished and drops tombstones nothing needs.
    fn housekeeping(&mut self) {
        let finished = self.shared.core().take_finished_buckets();
        for (start, min_seq) in finished {
            self.undeleted.insert(start, (min_seq, false));
        }
        // A bucket written to again since its delete failed (a task scheduled into its
        // span) is not deleted with that task: it goes once its new tasks are finished,
        // and the window's bucket holds the old records' tombstone bound meanwhile.
        {
            let mut core = self.shared.core();
            self.undeleted
                .retain(|start, (min_seq, _)| match core.buckets.get_mut(start) {
                    Some(bucket) => {
                        bucket.min_seq = bucket.min_seq.min(*min_seq);
                        false
                    }
                    None => true,
                });
        }
        // A cancelled task in a bucket has no Done mark, only its tombstone, which must
        // outlive the bucket's files: a bucket that could not be deleted is tried again
        // each round, and holds the tombstones' bound down meanwhile.
        let store = &self.shared.store;
        self.undeleted
            .retain(|&start, (_, reported)| match store.delete_bucket(start) {
                Ok(()) => false,
                Err(e) => {
                    if !std::mem::replace(reported, true) {
                        eprintln!("corewheel-durable: deleting bucket {start}: {e}; trying again");
                    }
                    true
                }
            });
        let floor = self
            .undeleted
            .values()
            .map(|(seq, _)| *seq)
            .min()
            .unwrap_or(u64::MAX);
        let bound = self.shared.core().prune_tombs(self.next_seq, floor);
        self.write_marks(Vec::new());
        if !self.unwritten_marks.bytes.is_empty() {
            return;
        }
        if let Err(e) = self.shared.store.prune_control(bound) {
            eprintln!("corewheel-durable: pruning tombstones: {e}");
        }
    }

    /// Writes `marks` after those whose write failed before, unless their retry is not
    /// due yet; keeps them all if it fails.
    fn write_marks(&mut self, marks: Vec<u8>) {
        let pending = &mut self.unwritten_marks;
        pending.bytes.extend_from_slice(&marks);
        if pending.bytes.is_empty() || pending.retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        let writes = BTreeMap::from([(Target::Dead, std::mem::take(&mut pending.bytes))]);
        match append_counted(&self.shared, &writes) {
            Ok(()) => {
                if pending.failures > 0 {
                    eprintln!(
                        "corewheel-durable: requeue marks written after {} failed tries",
                        pending.failures
                    );
                }
                *pending = UnwrittenMarks::default();
            }
            Err(e) => {
                if pending.failures == 0 {
                    eprintln!(
                        "corewheel-durable: writing requeue marks: {e}; trying again less and \
                         less often, tombstones kept meanwhile"
                    );
                }
                pending.failures += 1;
                let backoff = MARKS_RETRY_FIRST
                    .saturating_mul(1 << (pending.failures - 1).min(7))
                    .min(MARKS_RETRY_MAX);
                pending.retry_at = Some(Instant::now() + backoff);
                pending.bytes = writes.into_values().next().unwrap_or_default();
            }
        }
    }
}

fn op_records(op: &Op) -> usize {
    match op {
        Op::Schedule(tasks, _) => tasks.len(),
        _ => 1,
    }
}

/// A batch's encoded records in two phases: what adds (tasks, dead letters) is made
/// durable before what removes (tombstones, Done marks). A crash between the two, or a
/// write that fails in the second, can then leave a finished task unmarked (delivered
/// again, as at-least-once allows), never a task lost. An upsert's new record
/// (`Kind::Upsert`) counts only beside its tombstone, so a cut upsert leaves the old
/// version alone rather than both. Requeue marks come after both: a requeue's tombstone
/// already hides its dead letter, and a mark durable before it would hide the letter of a
/// task not yet live.
#[derive(Default)]
struct Writes {
    phases: [BTreeMap<Target, Vec<u8>>; 2],
    marks: Vec<u8>,
}

impl Writes {
    fn record(&mut self, target: Target, record: &Record) {
        let phase = match record.kind {
            Kind::Task | Kind::Upsert | Kind::Dead => 0,
            Kind::Tomb | Kind::Done => 1,
            Kind::Requeued => return record.encode(&mut self.marks),
        };
        record.encode(self.phases[phase].entry(target).or_default());
    }

    fn marks(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.marks)
    }

    fn append(&self, shared: &Shared) -> std::io::Result<()> {
        for phase in &self.phases {
            if !phase.is_empty() {
                append_counted(shared, phase)?;
            }
        }
        Ok(())
    }
}

/// Appends `writes` to the store and counts the files it fsynced.
fn append_counted(shared: &Shared, writes: &BTreeMap<Target, Vec<u8>>) -> std::io::Result<()> {
    let synced = shared.store.append(writes)?;
    shared
        .fsyncs
        .fetch_add(synced as u64, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

fn apply(core: &mut Window, effect: Effect) {
    match effect {
        Effect::Tomb(id, seq) => core.void(&id, seq),
        Effect::Place(task) => core.place(task),
        Effect::Finished(bucket) => core.finished(bucket),
        Effect::Dead(task) => {
            if !core.dead.iter().any(|d| d.seq == task.seq) {
                core.dead.push(task);
            }
        }
        Effect::Undead(seq) => core.dead.retain(|t| t.seq != seq),
    }
}
