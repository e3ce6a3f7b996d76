//! arm-cancel: request timeouts. Almost every request finishes before its timeout, so the
//! timer is armed and then cancelled, and it never fires. One thread keeps a window of
//! 10,000 outstanding timers: each operation arms a new one and cancels the one armed 10,000
//! operations earlier.

use std::hint::black_box;
use std::time::{Duration, Instant};

use crate::peers::{Measure, Subject, TimerQueue, measure_fresh};
use crate::repeat::in_turns;
use crate::report::{Csv, thousands};
use crate::rng::XorShift64;
use crate::workloads::{TimingTable, ns_per, request_timeout};

pub const NAME: &str = "arm-cancel";
pub const WINDOW: usize = 10_000;

struct ArmCancel {
    ops: u64,
}

impl Measure<u64> for ArmCancel {
    type Output = Duration;

    fn measure<Q: TimerQueue<u64>>(self, queue: &mut Q) -> Result<Duration, String> {
        let mut rng = XorShift64::new(XorShift64::SEED);
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
            return Err(format!(
                "{missing} cancels found no timer: the structure lost timers"
            ));
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

pub fn run(subjects: &[Subject], ops: u64, csv: &mut Csv) {
    let runs = in_turns(subjects, |subject, run| {
        crate::progress::step(format!("{NAME}/{} (run {})", subject.name(), run + 1));
        measure_fresh(subject, ArmCancel { ops }).map(|elapsed| ns_per(elapsed, ops))
    });
    let overhead = ArmCancel { ops }.measure(&mut Nothing);

    let mut table = TimingTable {
        workload: NAME,
        title: format!(
            "{NAME} (1 thread, {} ops, window {})",
            thousands(ops),
            thousands(WINDOW as u64)
        ),
        cost: "ns/op",
        rate: "Mops/s",
        cost_metric: "ns_per_op",
        rate_metric: "mops_per_s",
        timers: ops,
        operation: "op = arm one timer (delay uniform in 1 ms..30 s) + cancel the one armed 10,000 ops earlier; nothing fires",
    }
    .build(subjects, &runs, csv);
    if let Ok(elapsed) = overhead {
        table.note(format!(
            "every row includes the harness's own {:.1} ns/op (drawing the delay, computing the deadline)",
            ns_per(elapsed, ops)
        ));
    }
    table.note(format!(
        "from several threads: see {}, corewheel's TimerEngine against tokio's sleep",
        crate::workloads::engine_arm_cancel::NAME
    ));
    table.print();
}
