//! burst-steal: a million timers scheduled from one thread, so all on its shard, all due within the same 10 ms, fired
//! on the real clock by an engine with one worker per thread count, stealing on and off. Each callback records its
//! lateness on its worker's own buffer, so the settings are compared on the engine's work alone.

use std::time::{Duration, Instant};

use corewheel::TimerEngine;

use crate::peers::engine;
use crate::report::{Table, thousands};
use crate::runner::{self, Plan, RUNS, median, spread};
use crate::workloads::lateness::{LatenessSummary, worker_records};
use crate::workloads::{Out, rng};

const NAME: &str = "burst-steal";
const SPREAD_NS: u64 = 10_000_000;
/// From the start of scheduling to the window: room to schedule a million timers (tens of ms) and a slow spell.
const LEAD: Duration = Duration::from_millis(600);
const GIVE_UP: Duration = Duration::from_secs(60);

struct Burst {
    last_fire: Duration,
    lateness: LatenessSummary,
    per_worker: Vec<u64>,
    stolen: u64,
    /// Timers claimed by a worker other than the owner (`Stats::claimed_elsewhere`).
    claimed_elsewhere: u64,
}

fn burst(workers: usize, stealing: bool, timers: u64) -> Result<Burst, String> {
    worker_records::prepare(workers);
    let engine = TimerEngine::builder().workers(workers);
    let engine = engine.stealing(stealing).build();
    let engine = engine.map_err(|error| format!("could not start the engine: {error}"))?;
    let mut rng = rng(0);
    let first = Instant::now() + LEAD;
    for _ in 0..timers {
        let deadline = first + Duration::from_nanos(rng.u64(..SPREAD_NS));
        let scheduled = engine.schedule_at(deadline, move || worker_records::record(deadline));
        scheduled.map_err(|error| format!("schedule failed: {error}"))?;
    }
    if Instant::now() > first {
        return Err("scheduling took longer than the lead before the burst".to_string());
    }
    engine::wait_until_fired(&engine, timers, Duration::from_millis(2), GIVE_UP)?;
    let total = engine.stats().total;
    let (stolen, claimed_elsewhere) = (total.stolen, total.claimed_elsewhere);
    drop(engine);
    let (all, per_worker) = worker_records::take();
    let lateness = all.summarize();
    let after_first = |last: Instant| last.saturating_duration_since(first);
    let last_fire = lateness.last_fire.map_or(Duration::ZERO, after_first);
    Ok(Burst {
        last_fire,
        lateness,
        per_worker,
        stolen,
        claimed_elsewhere,
    })
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Runs `plan`'s bursts (each worker count above 1, stealing on and off, in turns) and prints the table.
pub fn run(plan: &Plan, timers: u64, out: &mut Out) {
    let results = runner::in_turns(plan, |cell| burst(cell.threads, cell.param == 1, timers));
    let title = format!(
        "{NAME} ({} timers from one thread onto one shard, due within 10 ms; median of {RUNS} runs)",
        thousands(timers)
    );
    let header = "workers|stealing|last fire ms|p50 late ms|p99 late ms|max late ms|run elsewhere|claimed elsewhere|per worker|early|on/off";
    let mut table = Table::new(title, &header.split('|').collect::<Vec<_>>());
    let mut errors = Vec::new();
    let last = |runs: &[Burst]| median(runs.iter().map(|b| ms(b.last_fire)));
    for (cell, runs) in plan.cells.iter().zip(&results) {
        let (workers, stealing) = (cell.threads, cell.param == 1);
        let (on_off, subject) = match stealing {
            true => ("on", "engine"),
            false => ("off", "engine-no-steal"),
        };
        let runs = match runs {
            Ok(runs) => runs,
            Err(error) => {
                errors.push(format!(
                    "ERROR: {NAME}: {workers} workers, stealing {on_off}: {error}"
                ));
                continue;
            }
        };
        let middle = |f: &dyn Fn(&Burst) -> f64| median(runs.iter().map(f));
        let last_fire = last(runs);
        let p50 = middle(&|b| ms(b.lateness.p50));
        let p99 = middle(&|b| ms(b.lateness.p99));
        let max = middle(&|b| ms(b.lateness.max));
        let elsewhere = middle(&|b| 100.0 * b.stolen as f64 / timers as f64);
        let claimed = middle(&|b| 100.0 * b.claimed_elsewhere as f64 / timers as f64);
        let early: u64 = runs.iter().map(|b| b.lateness.early).sum();
        if early > 0 || runs.iter().any(|b| b.lateness.fired != timers) {
            errors.push(format!(
                "ERROR: {NAME}: {subject} fired {early} timers EARLY, or a wrong number of timers"
            ));
        }
        // The run whose last fire is the median's, for its split across workers.
        let off_median = |b: &&Burst| (ms(b.last_fire) - last_fire).abs();
        let typical = runs
            .iter()
            .min_by(|a, b| off_median(a).total_cmp(&off_median(b)));
        let share = |n: &u64| format!("{:.0}%", 100.0 * *n as f64 / timers as f64);
        let split = typical.map_or(Vec::new(), |b| b.per_worker.iter().map(share).collect());
        // Stealing on is measured beside stealing off at the same worker count.
        let mut cells = plan.cells.iter().zip(&results);
        let off = cells.find(|(c, _)| c.threads == workers && c.param == 0);
        let ratio = match (stealing, off.and_then(|(_, r)| r.as_ref().ok())) {
            (true, Some(off)) => format!("{:.2}x", last(off) / last_fire),
            _ => String::new(),
        };
        let late = [p50, p99, max].map(|ms| format!("{ms:.2}"));
        let shares = [elsewhere, claimed].map(|share| format!("{share:.0}%"));
        let mut cells = vec![workers.to_string(), on_off.to_string()];
        cells.push(format!("{last_fire:.1}"));
        cells.extend(late.into_iter().chain(shares));
        cells.extend([split.join("/"), thousands(early), ratio]);
        table.row(cells);
        let range = spread(runs.iter().map(|b| ms(b.last_fire)));
        table.note(format!(
            "{workers} workers, stealing {on_off}: last fire {range} ms over the runs"
        ));
        let metrics = [
            ("last_fire_after_first_deadline", last_fire, "ms"),
            ("lateness_p50", p50, "ms"),
            ("lateness_p99", p99, "ms"),
            ("lateness_max", max, "ms"),
            ("run_by_other_workers", elsewhere, "%"),
            ("claimed_by_other_workers", claimed, "%"),
            ("early_fires", early as f64, "count"),
        ];
        out.csv
            .push_metrics(NAME, subject, (workers, timers), &metrics);
    }
    table.note("last fire: from the first deadline to the last callback; the deadlines span 10 ms; late: callback start - deadline (deadlines round up to the 1 ms tick)");
    table.note("run elsewhere: share of the timers run by a worker other than their shard's owner (Stats::stolen); claimed elsewhere: share claimed off the owner's handed-out due lists by another worker (Stats::claimed_elsewhere)");
    table.note("per worker: share of the timers each worker thread ran, in the median run; on/off: last fire with stealing off / with stealing on: above 1 means stealing finished sooner");
    table.print();
    errors.iter().for_each(|error| runner::print(error));
}
