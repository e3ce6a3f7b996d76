//! reset-heavy: idle timeouts. Every connection has an idle timer, and every read or write
//! on it pushes that timer back. 100,000 connections; each operation picks one at random and
//! moves its deadline to "now" + 30 s, where "now" advances 1 µs per operation (the clock is
//! simulated: nothing waits and nothing fires).

use std::time::{Duration, Instant};

use crate::peers::{Measure, Subject, TimerQueue, measure_fresh};
use crate::repeat::in_turns;
use crate::report::{Csv, thousands};
use crate::rng::XorShift64;
use crate::workloads::{TimingTable, ns_per};

pub const NAME: &str = "reset-heavy";
pub const CONNECTIONS: usize = 100_000;
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
const STEP: Duration = Duration::from_micros(1);

struct ResetHeavy {
    resets: u64,
}

impl Measure<u64> for ResetHeavy {
    type Output = Duration;

    fn measure<Q: TimerQueue<u64>>(self, queue: &mut Q) -> Result<Duration, String> {
        let mut rng = XorShift64::new(XorShift64::SEED);
        let base = Instant::now();
        let mut timers: Vec<Q::Key> = (0..CONNECTIONS as u64)
            .map(|connection| queue.arm(base + IDLE_TIMEOUT, connection))
            .collect();
        queue.settle()?;

        let mut now = base;
        let started = Instant::now();
        for _ in 0..self.resets {
            now += STEP;
            let connection = rng.below(CONNECTIONS as u64) as usize;
            timers[connection] = queue.reset(timers[connection], now + IDLE_TIMEOUT);
        }
        let elapsed = started.elapsed();

        // Every connection's timer must still be there, or a reset lost it.
        let missing = timers
            .into_iter()
            .filter(|&key| queue.cancel(key).is_none())
            .count();
        if missing > 0 {
            return Err(format!("{missing} connections lost their idle timer"));
        }
        Ok(elapsed)
    }
}

pub fn run(subjects: &[Subject], resets: u64, csv: &mut Csv) {
    let runs = in_turns(subjects, |subject, run| {
        crate::progress::step(format!("{NAME}/{} (run {})", subject.name(), run + 1));
        measure_fresh(subject, ResetHeavy { resets }).map(|elapsed| ns_per(elapsed, resets))
    });
    let mut table = TimingTable {
        workload: NAME,
        title: format!(
            "{NAME} (1 thread, {} connections, {} resets)",
            thousands(CONNECTIONS as u64),
            thousands(resets)
        ),
        cost: "ns/reset",
        rate: "Mresets/s",
        cost_metric: "ns_per_reset",
        rate_metric: "mresets_per_s",
        timers: CONNECTIONS as u64,
        operation: "reset = move a random connection's idle timer to now + 30 s; corewheel Wheel::reset, DelayQueue::reset_at, binary-heap tombstone + push",
    }
    .build(subjects, &runs, csv);
    table.note("every new deadline is the latest yet (now + a constant), a binary heap's best case: its push never sifts up");
    table.note(format!(
        "from several threads: see {}, corewheel's TimerEngine against tokio's sleep",
        crate::workloads::engine_reset::NAME
    ));
    table.print();
}
