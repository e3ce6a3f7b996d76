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
/// to [`LEAD`](crate::dispatcher::LEAD) before they are due; the front task is taken only once the clock reads its
/// due time, which is what keeps delivery from being early. Tasks come in due order but
/// for one scheduled into the past behind others handed over early, which waits at most
/// the lead.
fn next(shared: &Shared) -> Option<(Task, u64)> {
    let mut ready = shared.ready();
    loop {
        if shared.stopping() {
            return None;
        }
        let wait = match ready.front() {
            Some((task, _)) => match task.due().duration_since(shared.options.clock.now()) {
                Ok(wait) if !wait.is_zero() => wait.min(MAX_WAIT),
                _ => return ready.pop_front(),
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
