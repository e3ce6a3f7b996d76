//! The dispatcher thread: polls the wheel and hands due tasks to the consumers.
//!
//! It wakes [`LEAD`] before the wheel's next deadline and hands over, oldest first, what
//! is due by then; the handler threads wait for each task's exact due time, so only their
//! wake-up lies between a due time and the handler call. It never runs a handler itself,
//! so a slow handler cannot hold up the wheel. It also
//! watches the wall clock: a step backwards restarts the wheel's time at the new reading
//! (see [`Window::rebase`](crate::window::Window::rebase)); a step forwards makes every
//! task in the skipped span due at once, as after downtime.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{floor_ms, to_system};
use crate::shared::Shared;
use crate::task::Task;

/// The longest sleep between polls, so that wall-clock steps and a manual clock moved by
/// a test are noticed promptly.
const MAX_SLEEP: Duration = Duration::from_millis(5);
/// The shortest sleep, which lets go of the window's lock even when a poll is due now.
const MIN_SLEEP: Duration = Duration::from_micros(10);
/// How far ahead of the clock tasks go to the handler threads. A handler waits for its
/// task's exact due time itself, so the dispatcher's own wake-up, which a loaded machine
/// can delay, is off the path between a due time and the handler call.
pub(crate) const LEAD: Duration = Duration::from_millis(2);
/// Due tasks taken from the wheel per hold of the window's lock.
const POLL_CHUNK: usize = 4096;
/// A task this late when it comes due counts as catch-up, subject to the catch-up rate.
const OVERDUE_MS: u64 = 1000;

/// Spends the catch-up rate: whole tasks per second, refilled continuously.
struct Tokens {
    per_sec: Option<u32>,
    tokens: f64,
    /// The clock reading of the last refill. Always the latest reading, even one behind
    /// it: after a backward step, keeping the older, later reading would refill nothing
    /// until the clock regained the step, stalling catch-up for its whole length.
    last_ms: u64,
}

impl Tokens {
    fn take(&mut self, now_ms: u64) -> bool {
        let Some(rate) = self.per_sec else {
            return true;
        };
        let rate = f64::from(rate);
        // A backward step refills nothing for the step itself, and restarts from here.
        let elapsed = now_ms.saturating_sub(self.last_ms) as f64 / 1000.0;
        self.last_ms = now_ms;
        self.tokens = (self.tokens + elapsed * rate).min(rate.max(1.0));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// How long until the next whole task's worth has refilled (the clock is read in
    /// whole milliseconds, so rounded up to one).
    fn until_next(&self) -> Duration {
        let Some(rate) = self.per_sec else {
            return Duration::ZERO;
        };
        let missing = (1.0 - self.tokens).max(0.0);
        Duration::from_millis((missing * 1000.0 / f64::from(rate)).ceil() as u64)
    }
}

/// Runs until shutdown.
pub(crate) fn run(shared: Arc<Shared>) {
    let mut tokens = Tokens {
        per_sec: shared.options.catch_up_per_sec,
        tokens: 1.0,
        last_ms: shared.now_ms(),
    };
    // Due tasks taken from the wheel and not yet handed over, oldest first. The wheel
    // hands out due tasks in no promised order (one filed after the wheel's time passed
    // its deadline, as a bucket loaded during catch-up is, can come out before older
    // ones), so every due task is taken from it before any is handed over, and the
    // oldest goes first; overdue ones wait here for the catch-up rate.
    // Each with the window's tombstone count when it left the wheel, for the handlers.
    let mut held: BTreeMap<(u64, u64), (Task, u64)> = BTreeMap::new();
    let mut out = Vec::new();
    let mut core = shared.core();
    while !shared.stopping() {
        let now = shared.options.clock.now();
        let now_ms = floor_ms(now);
        if now_ms < core.high_ms {
            core.rebase(now_ms);
        }
        let upto_ms = floor_ms(now + LEAD);
        let mut drained = false;
        for _ in 0..POLL_CHUNK {
            match core.poll(now_ms, upto_ms) {
                Some(task) => {
                    held.insert((task.due_ms, task.seq), (task, core.tombs_applied));
                }
                None => {
                    drained = true;
                    break;
                }
            }
        }
        if !drained {
            // Many due at once (catch-up): let the writer and loader at the lock between
            // chunks.
            drop(core);
            core = shared.core();
            continue;
        }
        // Overdue tasks (due before `cutoff`) are the front of `held`; only they wait for
        // the catch-up rate. The rest go at once, however long the overdue backlog: the
        // rate is documented to limit catch-up, not tasks that are on time.
        let cutoff = now_ms.saturating_sub(OVERDUE_MS);
        out.extend(held.split_off(&(cutoff, 0)));
        while let Some(entry) = held.first_entry() {
            if !tokens.take(now_ms) {
                break;
            }
            out.push((*entry.key(), entry.remove()));
        }
        if !out.is_empty() {
            drop(core);
            shared.ready().extend(out.drain(..));
            shared.ready_changed.notify_all();
            core = shared.core();
            continue;
        }
        // Sleep until the next poll is due less the lead, to the microsecond: rounding to
        // whole milliseconds would make every task up to a millisecond late.
        // Overdue tasks held for the catch-up rate wait for its next token, not spun on.
        let sleep = match core.next_poll_ms() {
            Some(ms) => (to_system(ms) - LEAD)
                .duration_since(shared.options.clock.now())
                .unwrap_or(Duration::ZERO)
                .min(MAX_SLEEP),
            None => MAX_SLEEP,
        };
        let sleep = if held.is_empty() {
            sleep
        } else {
            sleep.min(tokens.until_next())
        };
        core = shared
            .core_changed
            .wait_timeout(core, sleep.max(MIN_SLEEP))
            .map(|(guard, _)| guard)
            .unwrap_or_else(|p| p.into_inner().0);
    }
}
