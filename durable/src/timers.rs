//! [`DurableTimers`]: the public handle.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::SystemTime;

use crate::bloom::Bloom;
use crate::clock::ceil_ms;
use crate::error::Error;
use crate::journal::Journal;
use crate::options::Options;
use crate::record::{Kind, Record};
use crate::shared::{NewTask, Op, Shared};
use crate::store::{SEQ_BITS, Store, Target};
use crate::task::Task;
use crate::window::{Bucket, Load, Window};
use crate::writer::Writer;
use crate::{MAX_ID_LEN, MAX_PAYLOAD_LEN, consumer, dispatcher, loader};

/// Durable delayed tasks in one directory.
///
/// A task is an id, a payload and a wall-clock due time. Once [`schedule`] returns, the
/// task survives a crash; when it is due it goes to the handler given to
/// [`run_handler`], and it is gone only once that handler has succeeded. See the crate
/// documentation for the guarantees and the on-disk layout.
///
/// [`schedule`]: DurableTimers::schedule
/// [`run_handler`]: DurableTimers::run_handler
pub struct DurableTimers {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Runs [`Options::on_ack`](crate::Options::on_ack), after the writer has stopped.
    ack_thread: Mutex<Option<JoinHandle<()>>>,
    handlers_started: AtomicBool,
}

impl DurableTimers {
    /// Opens the timers stored in `dir`, creating it if needed.
    ///
    /// Tasks that came due while no process had the directory open are delivered first,
    /// oldest first bucket by bucket, as the buckets load (at most
    /// [`Options::catch_up_rate`] a second if set): a retry is kept in its first attempt's
    /// bucket, so it can come before older tasks of a later bucket. A second open of
    /// the same directory, from this process or another, is refused with
    /// [`Error::Locked`] until the first is closed.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<DurableTimers, Error> {
        options.validate()?;
        let store = Journal::open(dir.as_ref(), options.bucket_ms())?;
        Self::with_store(Box::new(store), options)
    }

    pub(crate) fn with_store(
        store: Box<dyn Store>,
        options: Options,
    ) -> Result<DurableTimers, Error> {
        let now_ms = crate::clock::floor_ms(options.clock.now());
        let mut window = Window::new(
            now_ms,
            options.bucket_ms(),
            Bloom::new(options.expected_pending),
        );
        for info in store.buckets()? {
            window.buckets.insert(
                info.start_ms,
                Bucket {
                    load: Load::Unloaded,
                    min_seq: info.min_seq,
                    outstanding: 0,
                },
            );
        }
        let mut requeued_by_tombs = HashSet::new();
        for tomb in store.read_log(Target::Control)? {
            requeued_by_tombs.extend(tomb.requeued_letter());
            let seq = window.tombs.entry(tomb.id).or_insert(0);
            *seq = (*seq).max(tomb.seq);
        }
        window.dead = read_dead(store.as_ref(), &requeued_by_tombs)?;
        // Everything of earlier opens is on disk for the loader to read.
        window.applied_seq = store.epoch() << SEQ_BITS;
        let (ops, receiver) = mpsc::channel();
        let shared = Arc::new(Shared {
            options,
            store,
            core: Mutex::new(window),
            core_changed: Condvar::new(),
            ready: Mutex::new(BTreeMap::new()),
            ready_changed: Condvar::new(),
            ops: Mutex::new(Some(ops)),
            stopping: AtomicBool::new(false),
            tombs_applied: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
        });
        // The on_ack listener gets a thread of its own, fed by the writer after each
        // commit, so that a listener may call back into these timers (schedule, cancel)
        // without waiting on the writer thread it would be running on.
        let (ack_sender, ack_thread) = match shared.options.on_ack.clone() {
            Some(listener) => {
                let (sender, acks) = mpsc::channel::<Box<[u8]>>();
                let thread = spawn("cwd-acks", move || {
                    for id in acks {
                        listener(&id);
                    }
                })?;
                (Some(sender), Some(thread))
            }
            None => (None, None),
        };
        let writer = spawn("cwd-writer", {
            let shared = Arc::clone(&shared);
            move || Writer::new(shared, ack_sender).run(receiver)
        })?;
        let mut threads = Vec::new();
        let s = Arc::clone(&shared);
        threads.push(spawn("cwd-loader", move || loader::run(s))?);
        let s = Arc::clone(&shared);
        threads.push(spawn("cwd-dispatch", move || dispatcher::run(s))?);
        Ok(DurableTimers {
            shared,
            threads: Mutex::new(threads),
            writer: Mutex::new(Some(writer)),
            ack_thread: Mutex::new(ack_thread),
            handlers_started: AtomicBool::new(false),
        })
    }

    /// Schedules (or replaces) the task `id` to be delivered at `due`, with `payload`.
    ///
    /// Returns once the task is durable; concurrent calls share one fsync. Scheduling an
    /// id that is already pending replaces that task (an upsert). A `due` in the past is
    /// delivered at once. The id must be 1 to [`MAX_ID_LEN`] bytes and the payload at
    /// most [`MAX_PAYLOAD_LEN`] bytes.
    pub fn schedule(
        &self,
        id: impl AsRef<[u8]>,
        payload: impl AsRef<[u8]>,
        due: SystemTime,
    ) -> Result<(), Error> {
        self.schedule_batch([(id, payload, due)])
    }

    /// Schedules many tasks with one durable write: all are durable when it returns `Ok`.
    /// Each is checked first, so a bad one fails the call before anything is written.
    pub fn schedule_batch<I, K, P>(&self, tasks: I) -> Result<(), Error>
    where
        I: IntoIterator<Item = (K, P, SystemTime)>,
        K: AsRef<[u8]>,
        P: AsRef<[u8]>,
    {
        let mut batch = Vec::new();
        for (id, payload, due) in tasks {
            let (id, payload) = (id.as_ref(), payload.as_ref());
            check_task(id, payload)?;
            batch.push(NewTask {
                id: id.into(),
                payload: payload.into(),
                due_ms: ceil_ms(due),
            });
        }
        if batch.is_empty() {
            return Ok(());
        }
        self.call(|reply| Op::Schedule(batch, reply))
    }

    /// Cancels the pending task `id`, durably. Cancelling an id that is not pending does
    /// nothing. A task whose handler is already running is not stopped; if that handler
    /// fails, the task is not retried.
    pub fn cancel(&self, id: impl AsRef<[u8]>) -> Result<(), Error> {
        let id = id.as_ref();
        check_id(id)?;
        let id: Box<[u8]> = id.into();
        self.call(|reply| Op::Cancel(id, reply))
    }

    /// Runs `handler` on every due task, on `threads` threads of its own (at least one).
    ///
    /// `Ok` acks the task. `Err` or a panic is a failure: the task is tried again after
    /// the [`RetryPolicy`](crate::RetryPolicy)'s backoff, and after its last attempt it
    /// becomes a [dead letter](DurableTimers::dead_letters). The handler may run again for
    /// a task whose previous run was cut short by a crash, so it should be idempotent,
    /// keyed by [`Task::id`]. Call this once; a second call is refused.
    pub fn run_handler<F, E>(&self, threads: usize, handler: F) -> Result<(), Error>
    where
        F: Fn(&Task) -> Result<(), E> + Send + Sync + 'static,
    {
        if self.handlers_started.swap(true, Ordering::AcqRel) {
            return Err(Error::BadOptions("run_handler was already called"));
        }
        let handler = Arc::new(handler);
        let mut list = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        for i in 0..threads.max(1) {
            let shared = Arc::clone(&self.shared);
            let handler = Arc::clone(&handler);
            list.push(spawn(&format!("cwd-handler-{i}"), move || {
                consumer::run(shared, handler)
            })?);
        }
        Ok(())
    }

    /// The tasks that failed their last attempt, oldest first.
    pub fn dead_letters(&self) -> Vec<Task> {
        self.shared.core().dead.clone()
    }

    /// Takes the newest dead letter of `id` off the list and schedules it again, due now,
    /// from attempt 1. [`Error::NotDead`] if no dead letter has this id. Like any schedule
    /// of `id`, it replaces a pending task of that id, one an earlier requeue of another
    /// of its letters made too: requeue an id's next letter once the last one has run.
    pub fn requeue(&self, id: impl AsRef<[u8]>) -> Result<(), Error> {
        let id: Box<[u8]> = id.as_ref().into();
        self.call(|reply| Op::Requeue(id, reply))
    }

    /// Tasks in memory: those in the wheel, waiting for their due time. Far-off tasks are
    /// only on disk and not counted.
    pub fn in_memory(&self) -> usize {
        self.shared.core().len()
    }

    /// Files fsynced by group commits since open: with the number of calls, how well
    /// concurrent calls share fsyncs.
    pub fn fsyncs(&self) -> u64 {
        self.shared.fsyncs.load(Ordering::Relaxed)
    }

    /// Damaged spans found inside journal segments since open, each followed by valid
    /// records, which were read (a torn tail, as a crash leaves, is cut and not counted).
    /// What a damaged span held is lost: a task, a cancel or an ack. Each is also reported
    /// on stderr with its file; the file is left as it is and is passed over again on
    /// every read, so a segment read twice counts twice.
    pub fn damaged_spans(&self) -> u64 {
        self.shared.store.damaged_spans()
    }

    /// Stops delivering, waits for running handlers to finish and their acks to be
    /// written, and releases the directory. Tasks not acked are delivered after the next
    /// open.
    pub fn close(self) -> Result<(), Error> {
        self.shutdown();
        Ok(())
    }

    fn call(
        &self,
        op: impl FnOnce(mpsc::SyncSender<Result<(), Error>>) -> Op,
    ) -> Result<(), Error> {
        let (reply, answer): (_, Receiver<_>) = mpsc::sync_channel(1);
        self.shared.send(op(reply))?;
        answer.recv().map_err(|_| Error::Closed)?
    }

    fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.core_changed.notify_all();
        self.shared.ready_changed.notify_all();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for thread in threads {
            join_unless_current(thread);
        }
        self.shared
            .ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(writer) = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            join_unless_current(writer);
        }
        // After the writer: it sends the last acks, and its end closes the channel.
        let acks = self
            .ack_thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(thread) = acks {
            join_unless_current(thread);
        }
    }
}

impl Drop for DurableTimers {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Joins `thread`, unless it is the calling thread: the last handle can be dropped on a
/// handler or `on_ack` thread (by a handler that upgraded a `Weak`), and a thread cannot
/// wait for itself. That thread is left to end by itself, which it does once its handler
/// or listener returns, since `stopping` is set and the writer's channel closed; its
/// `Arc<Shared>`, and with it the directory lock, goes when it ends. A task whose handler
/// is the one dropping the handle is not acked (the writer is gone by the time it
/// returns) and is delivered again after the next open.
fn join_unless_current(thread: JoinHandle<()>) {
    if thread.thread().id() != std::thread::current().id() {
        let _ = thread.join();
    }
}

/// Refuses an id or payload out of range, before anything is written.
pub(crate) fn check_task(id: &[u8], payload: &[u8]) -> Result<(), Error> {
    check_id(id)?;
    if payload.len() > MAX_PAYLOAD_LEN {
        return Err(Error::PayloadTooLarge { len: payload.len() });
    }
    Ok(())
}

pub(crate) fn check_id(id: &[u8]) -> Result<(), Error> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(Error::BadId { len: id.len() });
    }
    Ok(())
}

pub(crate) fn spawn(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, Error> {
    Ok(std::thread::Builder::new().name(name.into()).spawn(f)?)
}

/// Records a dead-letter log may hold beyond twice its live letters before an open
/// rewrites it: a few requeues do not cost a rewrite.
const DEAD_LOG_SLACK: usize = 1024;

/// The dead letters on disk: those not since requeued, by a requeue mark or by a
/// requeue's tombstone (`by_tombs`) whose mark a crash cut off, which is written now, before
/// the tombstone can be pruned. A log that holds more than twice as many records as its
/// letters, and [`DEAD_LOG_SLACK`] more, is rewritten with only them, so that requeue
/// after requeue does not grow it for ever.
fn read_dead(store: &dyn Store, by_tombs: &HashSet<u64>) -> Result<Vec<Task>, Error> {
    let log = store.read_log(Target::Dead)?;
    let marked: HashSet<u64> = log
        .iter()
        .filter(|r| r.kind == Kind::Requeued)
        .map(|r| r.seq)
        .collect();
    let total = log.len();
    // A letter written twice (see the writer's `finish`) carries one number: read once.
    let mut seen = HashSet::new();
    let (mut live, mut unmarked) = (Vec::new(), Vec::new());
    for r in log {
        if r.kind != Kind::Dead || marked.contains(&r.seq) || !seen.insert(r.seq) {
            continue;
        }
        if by_tombs.contains(&r.seq) {
            Record::marker(Kind::Requeued, &r.id, r.seq).encode(&mut unmarked);
        } else {
            live.push(r);
        }
    }
    if !unmarked.is_empty() {
        store.append(&BTreeMap::from([(Target::Dead, unmarked)]))?;
    }
    if total > live.len().saturating_mul(2).saturating_add(DEAD_LOG_SLACK) {
        store.rewrite_dead(&live)?;
    }
    Ok(live
        .into_iter()
        .map(|r| Task {
            id: r.id,
            payload: r.payload,
            due_ms: r.due_ms,
            attempt: r.attempt,
            seq: r.seq,
            bucket: 0,
        })
        .collect())
}
