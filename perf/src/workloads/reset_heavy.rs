//! reset-heavy: idle timeouts. Every connection has an idle timer, and every read or write
//! on it pushes that timer back. 100,000 connections; each operation picks one at random and
//! moves its deadline to "now" + 30 s, where "now" advances 1 µs per operation (the clock is
//! simulated: nothing waits and nothing fires).

use std::time::{Duration, Instant};

use crate::peers::{Measure, TimerQueue, measure_fresh};
use crate::report::thousands;
use crate::runner::{Plan, in_turns};
use crate::workloads::{Out, cost_sheet, ns_per, rng};

/// Connections, each with one idle timer.
const CONNECTIONS: usize = 100_000;
/// How long a connection may stay idle.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
const STEP: Duration = Duration::from_micros(1);

struct ResetHeavy {
    resets: u64,
}

impl Measure<u64> for ResetHeavy {
    type Output = Duration;

    fn measure<Q: TimerQueue<u64>>(self, queue: &mut Q) -> Result<Duration, String> {
        let mut rng = rng(0);
        let base = Instant::now();
        let mut timers: Vec<Q::Key> =
            (0..CONNECTIONS as u64).map(|connection| queue.arm(base + IDLE_TIMEOUT, connection)).collect();
        queue.settle()?;

        let mut now = base;
        let started = Instant::now();
        for _ in 0..self.resets {
            now += STEP;
            let connection = rng.usize(..CONNECTIONS);
            timers[connection] = queue.reset(timers[connection], now + IDLE_TIMEOUT);
        }
        let elapsed = started.elapsed();

        // Every connection's timer must still be there, or a reset lost it.
        let missing = timers.into_iter().filter(|&key| queue.cancel(key).is_none()).count();
        if missing > 0 {
            return Err(format!("{missing} connections lost their idle timer"));
        }
        Ok(elapsed)
    }
}

/// Runs `plan`'s subjects and prints the table.
pub fn run(plan: &Plan, resets: u64, out: &mut Out) {
    let runs = in_turns(plan, |cell| {
        measure_fresh(cell.subject, ResetHeavy { resets }).map(|elapsed| ns_per(elapsed, resets))
    });
    let title =
        format!("reset-heavy (1 thread, {} connections, {} resets)", thousands(CONNECTIONS as u64), thousands(resets));
    let mut sheet = cost_sheet(plan, title, "reset", ("ns_per_reset", "mresets_per_s"), CONNECTIONS as u64, &runs);
    sheet.note("reset = move a random connection's idle timer to now + 30 s; corewheel Wheel::reset, DelayQueue::reset_at, binary-heap tombstone + push");
    sheet.note(
        "every new deadline is the latest yet (now + a constant), a binary heap's best case: its push never sifts up",
    );
    sheet.note("from several threads: see engine-reset, corewheel's TimerEngine against tokio's sleep");
    sheet.finish(&mut out.csv);
}
