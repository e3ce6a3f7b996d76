//! The single-thread workloads on the single-owner structures, each timing one kind of operation; nothing fires.
//! arm-cancel: request timeouts, a window of 10,000 outstanding timers, each operation arming a new one and cancelling
//! the oldest. reset-heavy: idle timeouts, 100,000 connections, each operation moving a random one's deadline to
//! "now" + 30 s, where "now" advances 1 µs per operation (the clock is simulated: nothing waits).

use std::hint::black_box;
use std::time::{Duration, Instant};

use crate::peers::{Measure, TimerQueue, measure_fresh};
use crate::report::{Col, Sheet, thousands};
use crate::runner::{Plan, in_turns, median, spread};
use crate::workloads::{Out, ns_per, request_timeout, rng};

/// Timers arm-cancel keeps between an arm and its cancel.
const WINDOW: usize = 10_000;
const CONNECTIONS: usize = 100_000;
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// arm-cancel's measurement: `ops` arms, each with the cancel of the oldest in the window.
#[derive(Clone, Copy)]
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
#[derive(Clone, Copy)]
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
        let lost = timers
            .into_iter()
            .filter(|&key| queue.cancel(key).is_none());
        match lost.count() {
            0 => Ok(elapsed),
            missing => Err(format!("{missing} connections lost their idle timer")),
        }
    }
}

/// Runs `measurement` (`ops` operations) on `plan`'s subjects in turns: each one's median ns per `unit`, rate, range.
fn cost_sheet<M: Measure<u64, Output = Duration> + Copy>(
    plan: &Plan,
    (measurement, ops, timers): (M, u64, u64),
    (title, unit): (String, &str),
) -> Sheet {
    let runs = in_turns(plan, |cell| {
        measure_fresh(cell.subject, measurement).map(|took| ns_per(took, ops))
    });
    let cols = vec![
        Col::new(format!("ns/{unit}"), format!("ns_per_{unit}"), "ns", 1).ratios(),
        Col::new(format!("M{unit}s/s"), format!("m{unit}s_per_s"), "M/s", 2).rate(),
    ];
    let mut sheet = Sheet::new(plan.workload.name(), title, timers, cols);
    let mut spreads = Vec::new();
    for (cell, runs) in plan.cells.iter().zip(runs) {
        let values = runs.map(|runs| {
            let (name, range) = (cell.subject.name(), spread(runs.iter().copied()));
            spreads.push(format!("{name} {range}"));
            let ns = median(runs);
            vec![Some(ns), Some(1e3 / ns)]
        });
        sheet.add(cell.subject, cell.threads, values);
    }
    let (runs, spreads) = (plan.runs, spreads.join(", "));
    sheet.note(format!(
        "median of {runs} runs per subject, taken in turns; ns/{unit} range: {spreads}"
    ));
    sheet
}

pub fn arm_cancel(plan: &Plan, ops: u64, out: &mut Out) {
    let (ops_text, window) = (thousands(ops), thousands(WINDOW as u64));
    let title = format!("arm-cancel (1 thread, {ops_text} ops, window {window})");
    let mut sheet = cost_sheet(plan, (ArmCancel(ops), ops, ops), (title, "op"));
    sheet.note(
        "op = arm one timer (delay uniform in 1 ms..30 s) + cancel the one armed 10,000 ops earlier; nothing fires",
    );
    if let Ok(took) = ArmCancel(ops).measure(&mut Nothing) {
        let ns = ns_per(took, ops);
        sheet.note(format!(
            "every row includes the harness's own {ns:.1} ns/op (drawing the delay, computing the deadline)"
        ));
    }
    sheet.note("from several threads: see engine-arm-cancel, corewheel's TimerEngine against tokio's sleep");
    sheet.finish(&mut out.csv);
}

pub fn reset_heavy(plan: &Plan, resets: u64, out: &mut Out) {
    let (connections, resets_text) = (thousands(CONNECTIONS as u64), thousands(resets));
    let title = format!("reset-heavy (1 thread, {connections} connections, {resets_text} resets)");
    let measurement = (ResetHeavy(resets), resets, CONNECTIONS as u64);
    let mut sheet = cost_sheet(plan, measurement, (title, "reset"));
    sheet.note("reset = move a random connection's idle timer to now + 30 s; corewheel Wheel::reset, DelayQueue::reset_at, binary-heap tombstone + push");
    sheet.note(
        "every new deadline is the latest yet (now + a constant), a binary heap's best case: its push never sifts up",
    );
    sheet.note(
        "from several threads: see engine-reset, corewheel's TimerEngine against tokio's sleep",
    );
    sheet.finish(&mut out.csv);
}
