//! Handler threads: where due tasks run, away from the dispatcher.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use crate::shared::{Op, Outcome, Shared};
use crate::task::Task;

/// How long an idle handler thread waits before checking for shutdown again.
const IDLE_WAIT: Duration = Duration::from_millis(50);

/// Takes due tasks until shutdown and runs `handler` on each. A panic counts as a failure,
/// so one bad task cannot take a thread down with it.
pub(crate) fn run<F, E>(shared: Arc<Shared>, handler: Arc<F>)
where
    F: Fn(&Task) -> Result<(), E> + Send + Sync + 'static,
{
    while let Some(task) = next(&shared) {
        let outcome = match catch_unwind(AssertUnwindSafe(|| handler(&task))) {
            Ok(Ok(())) => Outcome::Succeeded,
            Ok(Err(_)) | Err(_) => Outcome::Failed,
        };
        // After close the task stays unacked on disk and is delivered after the next
        // open, which is what at-least-once means for it.
        let _ = shared.send(Op::Finish(task, outcome));
    }
}

/// The next due task, or `None` once shutdown began.
fn next(shared: &Shared) -> Option<Task> {
    let mut ready = shared.ready();
    loop {
        if shared.stopping() {
            return None;
        }
        if let Some(task) = ready.pop_front() {
            return Some(task);
        }
        ready = shared
            .ready_changed
            .wait_timeout(ready, IDLE_WAIT)
            .map(|(guard, _)| guard)
            .unwrap_or_else(|p| p.into_inner().0);
    }
}
