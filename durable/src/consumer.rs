//! Handler threads: where due tasks run, away from the dispatcher.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::shared::{Op, Outcome, Shared};
use crate::task::Task;

/// How long an idle handler thread waits before checking for shutdown again.
const IDLE_WAIT: Duration = Duration::from_millis(50);
/// The longest wait for a handed-over task's due time, so that a manual clock moved by a
/// test, or a wall-clock step, is noticed promptly.
const MAX_WAIT: Duration = Duration::from_millis(5);

/// Takes due tasks until shutdown and runs `handler` on each. A panic counts as a failure,
/// so one bad task cannot take a thread down with it.
pub(crate) fn run<F, E>(shared: Arc<Shared>, handler: Arc<F>)
where
    F: Fn(&Task) -> Result<(), E> + Send + Sync + 'static,
{
    while let Some((task, tombs)) = next(&shared) {
        // The window's lock is taken only if a tombstone came since the task left the
        // wheel: a loader or writer holding it must not delay a due task.
        let tombed = shared.tombs_applied.load(Ordering::Acquire) != tombs;
        if tombed && shared.core().is_void(&task.id, task.seq) {
            // Cancelled or replaced after the dispatcher handed it over, up to the lead
            // before its due time: a cancel that returned before the due time still
            // stops it. The finish (no ack, no retry for a void task) lets its bucket go.
            let _ = shared.send(Op::Finish(task, Outcome::Failed));
            continue;
        }
        let outcome = match catch_unwind(AssertUnwindSafe(|| handler(&task))) {
            Ok(Ok(())) => Outcome::Succeeded,
            Ok(Err(_)) | Err(_) => Outcome::Failed,
        };
        // After close the task stays unacked on disk and is delivered after the next
        // open, which is what at-least-once means for it.
        let _ = shared.send(Op::Finish(task, outcome));
    }
}

/// The next due task, or `None` once shutdown began. The dispatcher hands tasks over up
/// to [`LEAD`](crate::dispatcher::LEAD) before they are due; the earliest due task is
/// taken only once the clock reads its due time, which is what keeps delivery from being
/// early. The queue is in due order, so if any task is due by the clock as it reads now
/// (even after a backward step left a task handed over early ahead of it), the first one
/// is; the wait is capped so that a clock step is seen promptly.
fn next(shared: &Shared) -> Option<(Task, u64)> {
    let mut ready = shared.ready();
    loop {
        if shared.stopping() {
            return None;
        }
        let wait = match ready.first_key_value() {
            Some((_, (task, _))) => match task.due().duration_since(shared.options.clock.now()) {
                Ok(wait) if !wait.is_zero() => wait.min(MAX_WAIT),
                _ => return ready.pop_first().map(|(_, entry)| entry),
            },
            None => IDLE_WAIT,
        };
        ready = shared
            .ready_changed
            .wait_timeout(ready, wait)
            .map(|(guard, _)| guard)
            .unwrap_or_else(|p| p.into_inner().0);
    }
}
