//! What the threads of one [`DurableTimers`](crate::DurableTimers) share.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Sender, SyncSender};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::floor_ms;
use crate::error::Error;
use crate::options::Options;
use crate::store::Store;
use crate::task::Task;
use crate::window::Window;

/// A task to write, its id and payload already checked against the limits.
pub(crate) struct NewTask {
    pub id: Box<[u8]>,
    pub payload: Box<[u8]>,
    pub due_ms: u64,
}

/// How a delivered task's handler ended.
pub(crate) enum Outcome {
    Succeeded,
    Failed,
}

/// Where the writer answers a caller waiting for its op to be durable.
pub(crate) type Reply = SyncSender<Result<(), Error>>;

/// Work for the writer thread. Ops with a reply are answered once their records are
/// durable (or failed to be).
pub(crate) enum Op {
    Schedule(Vec<NewTask>, Reply),
    Cancel(Box<[u8]>, Reply),
    Finish(Task, Outcome),
    Requeue(Box<[u8]>, Reply),
}

/// The ready queue: due tasks by (due time in ms, seq), each with the tombstone count
/// when it left the wheel.
pub(crate) type Ready = BTreeMap<(u64, u64), (Task, u64)>;

/// The state and signals shared by the writer, loader, dispatcher and handler threads.
pub(crate) struct Shared {
    pub options: Options,
    pub store: Box<dyn Store>,
    pub core: Mutex<Window>,
    /// Wakes the dispatcher: the wheel changed or shutdown began.
    pub core_changed: Condvar,
    /// Due tasks waiting for a handler thread, by (due time, seq), each with the window's
    /// [`tombs_applied`](crate::window::Window::tombs_applied) when it left the wheel.
    /// Kept in due order, not arrival order, so that the first entry is always the
    /// earliest due: after a backward clock step a task handed over ahead of its due time
    /// cannot hold up one behind it that the clock has already reached.
    pub ready: Mutex<Ready>,
    pub ready_changed: Condvar,
    pub ops: Mutex<Option<Sender<Op>>>,
    /// Set to stop the loader, dispatcher and handlers.
    pub stopping: AtomicBool,
    /// The window's [`tombs_applied`](crate::window::Window::tombs_applied), stored by
    /// the writer before it answers the calls that applied them, so that a handler thread
    /// can see without the window's lock that no tombstone came since its task left the
    /// wheel.
    pub tombs_applied: AtomicU64,
    /// Files fsynced by group commits so far.
    pub fsyncs: AtomicU64,
}

impl Shared {
    pub(crate) fn core(&self) -> MutexGuard<'_, Window> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn ready(&self) -> MutexGuard<'_, Ready> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn now_ms(&self) -> u64 {
        floor_ms(self.options.clock.now())
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Hands an op to the writer; `Closed` once the writer has stopped.
    pub(crate) fn send(&self, op: Op) -> Result<(), Error> {
        let ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        ops.as_ref()
            .ok_or(Error::Closed)?
            .send(op)
            .map_err(|_| Error::Closed)
    }

    /// Sleeps up to `timeout` or until shutdown begins, whichever is first.
    pub(crate) fn pause(&self, timeout: Duration) {
        let core = self.core();
        if !self.stopping() {
            let _ = self.core_changed.wait_timeout(core, timeout);
        }
    }
}
