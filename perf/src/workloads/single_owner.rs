//! The single-thread workloads on the single-owner structures, each timing one kind of operation; nothing fires.
//! arm-cancel: request timeouts, a window of 10,000 outstanding timers, each operation arming a new one and cancelling
//! the oldest. reset-heavy: idle timeouts, 100,000 connections, each operation moving a random one's deadline to
//! "now" + 30 s, where "now" advances 1 µs per operation (the clock is simulated: nothing waits).

use std::hint::black_box;
use std::time::{Duration, Instant};

use crate::peers::{Measure, TimerQueue, measure_fresh};
use crate::report::thousands;
use crate::runner::{Plan, in_turns};
use crate::workloads::{Out, cost_sheet, ns_per, request_timeout, rng};

/// Timers arm-cancel keeps between an arm and its cancel.
const WINDOW: usize = 10_000;
const CONNECTIONS: usize = 100_000;
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// arm-cancel's measurement: `ops` arms, each with the cancel of the oldest in the window.
struct ArmCancel(u64);

impl Measure<u64> for ArmCancel {
    type Output = Duration;

    fn measure<Q: TimerQueue<u64>>(self, queue: &mut Q) -> Result<Duration, String> {
        let (mut rng, base) = (rng(0), Instant::now());
        let mut window = Vec::with_capacity(WINDOW);
        for i in 0..WINDOW as u64 {
            window.push(queue.arm(base + request_timeout(&mut rng), i));
            if i == 0 {
                queue.settle()?;
            }
        }
        let (mut missing, started) = (0u64, Instant::now());
        for op in 0..self.0 {
            let fresh = queue.arm(base + request_timeout(&mut rng), op);
            let old = std::mem::replace(&mut window[op as usize % WINDOW], fresh);
            missing += u64::from(black_box(queue.cancel(old)).is_none());
        }
        let elapsed = started.elapsed();
        match missing {
            0 => Ok(elapsed),
            _ => Err(format!(
                "{missing} cancels found no timer: the structure lost timers"
            )),
        }
    }
}

/// The harness's own cost per operation (delay, deadline, window), on a structure that does nothing: in every row.
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

/// reset-heavy's measurement: `resets` resets of random connections' idle timers.
struct ResetHeavy(u64);

impl Measure<u64> for ResetHeavy {
    type Output = Duration;

    fn measure<Q: TimerQueue<u64>>(self, queue: &mut Q) -> Result<Duration, String> {
        let (mut rng, base) = (rng(0), Instant::now());
        let mut timers: Vec<Q::Key> = (0..CONNECTIONS as u64)
            .map(|c| queue.arm(base + IDLE_TIMEOUT, c))
            .collect();
        queue.settle()?;
        let started = Instant::now();
        for op in 1..=self.0 {
            let connection = rng.usize(..CONNECTIONS);
            let deadline = base + Duration::from_micros(op) + IDLE_TIMEOUT;
            timers[connection] = queue.reset(timers[connection], deadline);
        }
        let elapsed = started.elapsed();
        // Every connection's timer must still be there, or a reset lost it.
        match timers
            .into_iter()
            .filter(|&key| queue.cancel(key).is_none())
            .count()
        {
            0 => Ok(elapsed),
            missing => Err(format!("{missing} connections lost their idle timer")),
        }
    }
}

pub fn arm_cancel(plan: &Plan, ops: u64, out: &mut Out) {
    let runs = in_turns(plan, |cell| {
        measure_fresh(cell.subject, ArmCancel(ops)).map(|took| ns_per(took, ops))
    });
    let overhead = ArmCancel(ops).measure(&mut Nothing);
    let title = format!(
        "arm-cancel (1 thread, {} ops, window {})",
        thousands(ops),
        thousands(WINDOW as u64)
    );
    let mut sheet = cost_sheet(plan, (title, "op", ("ns_per_op", "mops_per_s")), ops, &runs);
    sheet.note(
        "op = arm one timer (delay uniform in 1 ms..30 s) + cancel the one armed 10,000 ops earlier; nothing fires",
    );
    if let Ok(took) = overhead {
        let ns = ns_per(took, ops);
        sheet.note(format!(
            "every row includes the harness's own {ns:.1} ns/op (drawing the delay, computing the deadline)"
        ));
    }
    sheet.note("from several threads: see engine-arm-cancel, corewheel's TimerEngine against tokio's sleep");
    sheet.finish(&mut out.csv);
}

pub fn reset_heavy(plan: &Plan, resets: u64, out: &mut Out) {
    let runs = in_turns(plan, |cell| {
        measure_fresh(cell.subject, ResetHeavy(resets)).map(|took| ns_per(took, resets))
    });
    let title = format!(
        "reset-heavy (1 thread, {} connections, {} resets)",
        thousands(CONNECTIONS as u64),
        thousands(resets)
    );
    let metrics = ("ns_per_reset", "mresets_per_s");
    let mut sheet = cost_sheet(plan, (title, "reset", metrics), CONNECTIONS as u64, &runs);
    sheet.note("reset = move a random connection's idle timer to now + 30 s; corewheel Wheel::reset, DelayQueue::reset_at, binary-heap tombstone + push");
    sheet.note(
        "every new deadline is the latest yet (now + a constant), a binary heap's best case: its push never sifts up",
    );
    sheet.note(
        "from several threads: see engine-reset, corewheel's TimerEngine against tokio's sleep",
    );
    sheet.finish(&mut out.csv);
}
