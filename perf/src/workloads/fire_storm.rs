//! fire-storm: a million timers due within one second, fired on the real clock the way each subject's users fire
//! them: corewheel and the heap by a loop that sleeps until the next deadline and drains what is due, DelayQueue by
//! its stream in a tokio runtime, the TimerEngine by its own two workers. Witness threads (one pinned per core) sleep
//! until each millisecond beside each storm; the floor table shows what the machine alone does to a sleeping thread.

use std::future::poll_fn;
use std::thread;
use std::time::{Duration, Instant};

use corewheel::TimerEngine;
use tokio_util::time::DelayQueue;

use crate::peers::binary_heap::TombstoneHeap;
use crate::peers::{PolledQueue, Subject, TICK, TimerQueue, engine};
use crate::report::{Col, Csv, Sheet, Table, thousands};
use crate::runner::{self, Cell, Plan};
use crate::sys::{process_cpu_time, thread_cpu_time};
use crate::workloads::lateness::{Lateness, LatenessSummary, worker_records};
use crate::workloads::{Out, ns_per, rng, wake_floor};

const NAME: &str = "fire-storm";
const FIRST_DUE: Duration = Duration::from_secs(1);
const SPREAD_NS: u64 = 1_000_000_000;
/// The longest one sleep of the driving loops, as an event loop bounds its wait to notice new work.
const SLEEP_CAP: Duration = Duration::from_millis(10);
/// Worker threads of the engine's storm, whatever the machine: the row compares machines.
const ENGINE_WORKERS: usize = 2;
/// How long the engine's storm may take to fire before its timers are called lost.
const GIVE_UP: Duration = Duration::from_secs(60);
/// How often the witnesses wake: often enough to catch a stall of a millisecond, cheaply.
const WITNESS_PERIOD: Duration = Duration::from_millis(1);

/// The storms' ticks in us: the default, then the finer ticks of the second table, on the engine and the wheel alone.
/// Rounding up to a whole tick makes every timer up to a tick late by design; the finer rows show what the engine and
/// the wheel do once that rounding is small. At 250 us the storm also crosses a level-2 boundary of the wheel.
pub const TICKS_US: [u64; 3] = [TICK.as_micros() as u64, 500, 250];

/// How long arming took, the first deadline, and when the last insert returned: after the first deadline, timers were
/// due before the driving loop began, and their lateness includes the rest of the inserting.
type Armed = (Duration, Instant, Instant);

/// What one storm measured.
struct Storm {
    armed: Armed,
    fire_cpu: Option<Duration>,
    lateness: LatenessSummary,
}

impl Storm {
    fn new(armed: Armed, fire_cpu: Option<Duration>, late: Lateness) -> Self {
        let lateness = late.summarize();
        Self {
            armed,
            fire_cpu,
            lateness,
        }
    }
}

/// Arms the storm through `put`, each value its own deadline.
fn arm<E>(timers: u64, mut put: impl FnMut(Instant) -> Result<(), E>) -> Result<Armed, E> {
    let mut rng = rng(0);
    let start = Instant::now();
    let mut first = start + FIRST_DUE + Duration::from_nanos(SPREAD_NS);
    for _ in 0..timers {
        let deadline = start + FIRST_DUE + Duration::from_nanos(rng.u64(..SPREAD_NS));
        first = first.min(deadline);
        put(deadline)?;
    }
    Ok((start.elapsed(), first, Instant::now()))
}

/// Arms the storm on a polled queue, then sleeps until each next deadline and drains what is due, as an event loop.
fn storm_polled<Q: TimerQueue<Instant> + PolledQueue<Instant>>(
    mut queue: Q,
    timers: u64,
) -> Result<Storm, String> {
    let mut lateness = Lateness::default();
    let armed = arm(timers, |deadline| {
        queue.arm(deadline, deadline);
        Ok::<_, String>(())
    })?;
    let cpu = thread_cpu_time();
    while let Some(next) = queue.next_deadline() {
        let wait = next.saturating_duration_since(Instant::now());
        thread::sleep(wait.min(SLEEP_CAP));
        let now = Instant::now();
        while let Some(deadline) = queue.pop_expired(now) {
            lateness.record(deadline, now, Instant::now());
        }
    }
    let cpu = crate::sys::cpu_between(cpu, thread_cpu_time());
    Ok(Storm::new(armed, cpu, lateness))
}

/// The same on a DelayQueue in a runtime, awaiting its stream of expired timers.
fn storm_delay_queue(timers: u64) -> Result<Storm, String> {
    crate::peers::runtime()?.block_on(async {
        let (mut lateness, mut queue) = (Lateness::default(), DelayQueue::new());
        let armed = arm(timers, |deadline| {
            queue.arm(deadline, deadline);
            Ok::<_, String>(())
        })?;
        let cpu = thread_cpu_time();
        // DelayQueue decides inside the runtime's timer when a timer is due, so the moment it reaches this loop is
        // the only clock reading there is to check it against.
        while let Some(expired) = poll_fn(|cx| queue.poll_expired(cx)).await {
            let fired_at = Instant::now();
            lateness.record(expired.into_inner(), fired_at, fired_at);
        }
        let cpu = crate::sys::cpu_between(cpu, thread_cpu_time());
        Ok(Storm::new(armed, cpu, lateness))
    })
}

/// Arms the storm on a [`TimerEngine`] from this thread (one shard); each callback records lateness on its worker.
fn storm_engine(timers: u64, tick: Duration) -> Result<Storm, String> {
    worker_records::prepare(ENGINE_WORKERS);
    let built = TimerEngine::builder().workers(ENGINE_WORKERS);
    let built = built.tick(tick).build();
    let engine = built.map_err(|error| format!("could not start the engine: {error}"))?;
    let armed = arm(timers, |deadline| {
        let scheduled = engine.schedule_at(deadline, move || worker_records::record(deadline));
        scheduled
            .map(drop)
            .map_err(|error| format!("schedule failed: {error}"))
    })?;
    let cpu = process_cpu_time();
    engine::wait_until_fired(&engine, timers, Duration::from_millis(5), GIVE_UP)?;
    let cpu = crate::sys::cpu_between(cpu, process_cpu_time());
    drop(engine);
    Ok(Storm::new(armed, cpu, worker_records::take().0))
}

fn storm(subject: Subject, timers: u64, tick: Duration) -> Result<Storm, String> {
    match subject {
        Subject::Corewheel => storm_polled(corewheel::Wheel::new(tick, Instant::now()), timers),
        Subject::DelayQueue => storm_delay_queue(timers),
        Subject::BinaryHeap => storm_polled(TombstoneHeap::<Instant>::default(), timers),
        Subject::Engine => storm_engine(timers, tick),
        _ => Err(format!("{} is not a fire-storm subject", subject.name())),
    }
}

/// Starts one witness per core, each pinned there, that only sleeps until each millisecond over the second of a storm
/// armed right after this call; its join gives how late the latest of their wake-ups came. One per core because this
/// VM stalls one virtual CPU at a time: an unpinned witness missed stalls of the core an engine worker is pinned to.
fn witness() -> thread::JoinHandle<Option<Duration>> {
    let from = Instant::now() + FIRST_DUE;
    let boundaries = (SPREAD_NS / WITNESS_PERIOD.as_nanos() as u64) as u32;
    thread::spawn(move || {
        let witness = move |core| {
            thread::spawn(move || {
                core_affinity::set_for_current(core);
                let slept = wake_floor::sleep_from(from, WITNESS_PERIOD, boundaries);
                slept.oversleep_summary().max
            })
        };
        let cores = core_affinity::get_core_ids().unwrap_or_default();
        let witnesses: Vec<_> = cores.into_iter().map(witness).collect();
        witnesses.into_iter().filter_map(|w| w.join().ok()).max()
    })
}

/// The machine's floor under the storm at each tick: how late a thread that only sleeps until each tick boundary woke,
/// and the storm's lateness had each tick's timers fired then at no cost. Measured after the storms, in the same run.
fn floor_table(timers: u64, csv: &mut Csv) {
    let title = format!(
        "{NAME} floor (no timers: a thread that only sleeps until each tick boundary for 1 s)"
    );
    let header = "tick us|wake-ups|p50 oversleep us|p99 oversleep us|max oversleep us|storm floor p50 late us|p99 late us|max late us";
    let mut table = Table::new(title, &header.split('|').collect::<Vec<_>>());
    let names = "oversleep_p50 oversleep_p99 oversleep_max lateness_p50 lateness_p99 lateness_max";
    for tick in TICKS_US.map(Duration::from_micros) {
        let sleeper = wake_floor::sleep_through(tick, Duration::from_nanos(SPREAD_NS));
        let over = sleeper.oversleep_summary();
        let floor = sleeper.storm_floor(tick, timers);
        let us = |s: &LatenessSummary| [s.p50, s.p99, s.max].map(|d| d.as_secs_f64() * 1e6);
        let figures = [us(&over), us(&floor)].concat();
        let mut cells = vec![tick.as_micros().to_string(), thousands(over.fired)];
        cells.extend(figures.iter().map(|us| format!("{us:.0}")));
        table.row(cells);
        let metrics = names.split(' ').zip(figures).map(|(n, us)| (n, us, "us"));
        let subject = format!("floor-{}us", tick.as_micros());
        csv.push_metrics(NAME, &subject, (1, timers), &metrics.collect::<Vec<_>>());
    }
    table.note("oversleep: how long after each boundary the thread woke (std::thread::park_timeout, as the engine's workers sleep); a wake-up more than a tick late makes the next boundaries late too");
    table.note("storm floor: the storm's deadlines rounded up to the tick, each fired the moment the thread woke at its boundary, at no cost: what a structure that rounds to this tick could at best have done over that second");
    table.print();
}

/// The row's and the CSV's name: the subject's, with the tick when it is not the default.
fn case_name(cell: &Cell) -> String {
    match cell.param == TICKS_US[0] {
        true => cell.subject.name().to_string(),
        false => format!("{}-{}us", cell.subject.name(), cell.param),
    }
}

/// Runs `plan`'s storms beside their witnesses; prints the default tick's table, the finer ticks' and the floor.
pub fn run(plan: &Plan, timers: u64, out: &mut Out) {
    let results = runner::in_turns(plan, |cell| {
        let witness = witness();
        let storm = storm(cell.subject, timers, Duration::from_micros(cell.param));
        let witnessed = witness.join().ok().flatten();
        storm.map(|storm| (storm, witnessed))
    });
    let default = TICKS_US[0];
    let (mut errors, timers_text) = (Vec::new(), thousands(timers));
    for fine in [false, true] {
        let title = match fine {
            false => format!("{NAME} (1 thread, {timers_text} timers due within 1 s, real clock)"),
            true => format!("{NAME} at finer ticks (the same storm; the tick is the only change)"),
        };
        let ms = |header, metric| Col::new(header, metric, "ms", 1);
        let cols = vec![
            Col::new("ns/insert", "ns_per_insert", "ns", 1),
            Col::new("fire CPU ns/timer", "fire_cpu_ns_per_timer", "ns", 1).ratios(),
            Col::new("M fired/CPU-s", "m_fired_per_cpu_s", "M/s", 2).rate(),
            ms("first due..last fired ms", "first_due_to_last_fired"),
            Col::new("p50 late us", "lateness_p50", "us", 0),
            Col::new("p99 late us", "lateness_p99", "us", 0),
            Col::new("max late us", "lateness_max", "us", 0),
            Col::new("witness max us", "witness_oversleep_max", "us", 0),
            Col::new("early", "early_fires", "count", 0),
        ];
        let mut sheet = Sheet::new(NAME, title, timers, cols);
        let cells = plan.cells.iter().zip(&results);
        for (cell, result) in cells.filter(|(c, _)| (c.param != default) == fine) {
            let name = case_name(cell);
            let values = result.as_ref().map_err(Clone::clone).map(|runs| {
                let (storm, witnessed) = &runs[0];
                let late = &storm.lateness;
                out.plots.add_lateness(&name, late.cdf.clone());
                if late.early > 0 || late.fired != timers {
                    let (fired, all, early) = (thousands(late.fired), thousands(timers), thousands(late.early));
                    errors.push(format!("ERROR: {name} fired {fired} of {all} timers, {early} of them EARLY, before their deadline"));
                }
                if storm.armed.2 > storm.armed.1 {
                    sheet.note(format!("{name}: inserting took past the first deadline, so early timers' lateness includes the rest of the inserting"));
                }
                let cost = storm.fire_cpu.map(|cpu| ns_per(cpu, late.fired));
                let span = late.last_fire.map(|last| last.saturating_duration_since(storm.armed.1));
                let us = |d: Duration| Some(d.as_secs_f64() * 1e6);
                let mut row = vec![Some(ns_per(storm.armed.0, timers)), cost, cost.map(|ns| 1e3 / ns)];
                row.extend([span.map(|span| span.as_secs_f64() * 1e3), us(late.p50), us(late.p99), us(late.max)]);
                row.extend([witnessed.and_then(us), Some(late.early as f64)]);
                row
            });
            sheet.push(&name, cell.subject, values);
        }
        if sheet.rows.is_empty() {
            continue;
        }
        sheet.note("fire CPU: this thread's CPU time from the last insert to the last fire (the sleeps cost none), per timer fired; engine: the process's CPU time (its 2 workers, which run the callbacks, and this thread waiting)");
        sheet.note("late: fire instant (clock read as the value reaches the loop, or in the engine's callback) - deadline; corewheel, the engine and DelayQueue round deadlines up to their tick, never down (at 1 ms, p99 is at least 0.99 ms by that alone), the heap fires at the exact instant; early: fire instant or the poll's `now` before the deadline, must be 0");
        sheet.note("witness max: the latest wake-up of threads that only slept until each millisecond over the storm's second, one pinned to each core (see the floor table below): a storm whose worst lateness is more than its tick plus this lost that time itself");
        sheet.finish(&mut out.csv);
    }
    floor_table(timers, &mut out.csv);
    errors.iter().for_each(|error| runner::print(error));
}
