//! arm-cancel: request timeouts. Almost every request finishes before its timeout, so the
//! timer is armed and then cancelled, and it never fires. One thread keeps a window of
//! 10,000 outstanding timers: each operation arms a new one and cancels the one armed 10,000
//! operations earlier.

use std::hint::black_box;
use std::time::{Duration, Instant};

use crate::peers::{Measure, TimerQueue, measure_fresh};
use crate::report::thousands;
use crate::runner::{Plan, in_turns};
use crate::workloads::{Out, cost_sheet, ns_per, request_timeout, rng};

/// Timers each operation keeps between its arm and its cancel.
pub const WINDOW: usize = 10_000;

struct ArmCancel {
    ops: u64,
}

impl Measure<u64> for ArmCancel {
    type Output = Duration;

    fn measure<Q: TimerQueue<u64>>(self, queue: &mut Q) -> Result<Duration, String> {
        let mut rng = rng(0);
        let base = Instant::now();
        let mut window = Vec::with_capacity(WINDOW);
        for i in 0..WINDOW as u64 {
            window.push(queue.arm(base + request_timeout(&mut rng), i));
            if i == 0 {
                queue.settle()?;
            }
        }

        let mut oldest = 0;
        let mut missing = 0u64;
        let started = Instant::now();
        for op in 0..self.ops {
            let fresh = queue.arm(base + request_timeout(&mut rng), op);
            let old = std::mem::replace(&mut window[oldest], fresh);
            if black_box(queue.cancel(old)).is_none() {
                missing += 1;
            }
            oldest += 1;
            if oldest == WINDOW {
                oldest = 0;
            }
        }
        let elapsed = started.elapsed();

        if missing > 0 {
            return Err(format!("{missing} cancels found no timer: the structure lost timers"));
        }
        Ok(elapsed)
    }
}

/// The harness's own cost per operation (drawing a delay, computing a deadline, the window's
/// bookkeeping), measured with a structure that does nothing. Every row includes it.
struct Nothing;

impl TimerQueue<u64> for Nothing {
    type Key = u64;

    fn arm(&mut self, deadline: Instant, value: u64) -> u64 {
        black_box(deadline);
        value
    }

    fn cancel(&mut self, key: u64) -> Option<u64> {
        Some(key)
    }

    fn reset(&mut self, key: u64, _deadline: Instant) -> u64 {
        key
    }
}

/// Runs `plan`'s subjects and prints the table.
pub fn run(plan: &Plan, ops: u64, out: &mut Out) {
    let runs =
        in_turns(plan, |cell| measure_fresh(cell.subject, ArmCancel { ops }).map(|elapsed| ns_per(elapsed, ops)));
    let overhead = ArmCancel { ops }.measure(&mut Nothing);
    let title = format!("arm-cancel (1 thread, {} ops, window {})", thousands(ops), thousands(WINDOW as u64));
    let mut sheet = cost_sheet(plan, title, "op", ("ns_per_op", "mops_per_s"), ops, &runs);
    sheet.note(
        "op = arm one timer (delay uniform in 1 ms..30 s) + cancel the one armed 10,000 ops earlier; nothing fires",
    );
    if let Ok(elapsed) = overhead {
        sheet.note(format!(
            "every row includes the harness's own {:.1} ns/op (drawing the delay, computing the deadline)",
            ns_per(elapsed, ops)
        ));
    }
    sheet.note("from several threads: see engine-arm-cancel, corewheel's TimerEngine against tokio's sleep");
    sheet.finish(&mut out.csv);
}
