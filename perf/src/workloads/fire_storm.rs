//! fire-storm: a million timers all due within one second (deadlines uniform in
//! [start + 1 s, start + 2 s)), fired on the real clock the way each subject's users fire
//! them: corewheel and the heap by a loop that sleeps until the next deadline and then
//! drains what is due, DelayQueue by awaiting its stream in a tokio runtime, and the
//! TimerEngine by its own two workers, the timers armed from one thread.

use std::future::poll_fn;
use std::thread;
use std::time::{Duration, Instant};

use tokio_util::time::DelayQueue;

use corewheel::TimerEngine;

use crate::peers::binary_heap::TombstoneHeap;
use crate::peers::{PolledQueue, Subject, TimerQueue, delay_queue, engine, wheel};
use crate::report::{Col, Csv, Row, Sheet, Table, thousands};
use crate::runner::{self, Cell, Plan};
use crate::sys::{cpu_between, process_cpu_time, thread_cpu_time};
use crate::workloads::lateness::{Lateness, LatenessSummary, worker_records};
use crate::workloads::{Out, ns_per, rng, wake_floor};

const NAME: &str = "fire-storm";
const FIRST_DUE: Duration = Duration::from_secs(1);
const SPREAD_NS: u64 = 1_000_000_000;
/// The longest one sleep of the driving loops. An event loop bounds its wait so that it
/// notices new work; here the bound only splits the wait for the first deadline.
const SLEEP_CAP: Duration = Duration::from_millis(10);

struct Storm {
    insert: Duration,
    first_deadline: Instant,
    /// When the last insert returned: after `first_deadline`, timers were due before the
    /// driving loop began, and their lateness includes the rest of the inserting.
    armed_at: Instant,
    fire_cpu: Option<Duration>,
    lateness: LatenessSummary,
}

/// Arms the storm. Each timer's value is its own deadline, so whoever fires it can tell how
/// late it is.
fn arm<Q: TimerQueue<Instant>>(queue: &mut Q, timers: u64) -> (Duration, Instant) {
    let armed: Result<_, std::convert::Infallible> = arm_with(timers, |deadline| {
        queue.arm(deadline, deadline);
        Ok(())
    });
    armed.unwrap_or_else(|never| match never {})
}

/// Arms the storm's deadlines through `put`; returns how long that took and the first
/// deadline.
fn arm_with<E>(
    timers: u64,
    mut put: impl FnMut(Instant) -> Result<(), E>,
) -> Result<(Duration, Instant), E> {
    let mut rng = rng(0);
    let start = Instant::now();
    let mut first = start + FIRST_DUE + Duration::from_nanos(SPREAD_NS);
    let started = Instant::now();
    for _ in 0..timers {
        let deadline = start + FIRST_DUE + Duration::from_nanos(rng.u64(..SPREAD_NS));
        first = first.min(deadline);
        put(deadline)?;
    }
    Ok((started.elapsed(), first))
}

/// Worker threads of the engine's storm: the engine as the issue that asked for this row
/// measured it, on 2 cores and on 16.
const ENGINE_WORKERS: usize = 2;

/// Arms the storm on a [`TimerEngine`] from this thread, so all on one shard, and lets its
/// workers fire it: each callback records its lateness on the worker that runs it.
fn storm_engine(timers: u64, tick: Duration) -> Result<Storm, String> {
    worker_records::prepare(ENGINE_WORKERS);
    let engine = TimerEngine::builder()
        .workers(ENGINE_WORKERS)
        .tick(tick)
        .build()
        .map_err(|error| format!("could not start the engine: {error}"))?;
    let (insert, first_deadline) = arm_with(timers, |deadline| {
        engine
            .schedule_at(deadline, move || worker_records::record(deadline))
            .map(drop)
            .map_err(|error| format!("schedule failed: {error}"))
    })?;
    let armed_at = Instant::now();
    let cpu = process_cpu_time();
    engine::wait_until_fired(&engine, timers, Duration::from_millis(5), GIVE_UP)?;
    let fire_cpu = cpu_between(cpu, process_cpu_time());
    drop(engine);
    let (all, _) = worker_records::take();
    Ok(Storm {
        insert,
        first_deadline,
        armed_at,
        fire_cpu,
        lateness: all.summarize(),
    })
}

/// How long the engine's storm may take to fire before its timers are called lost.
const GIVE_UP: Duration = Duration::from_secs(60);

fn sleep_until(deadline: Instant) {
    let now = Instant::now();
    if deadline > now {
        thread::sleep((deadline - now).min(SLEEP_CAP));
    }
}

fn cpu_since(start: Option<Duration>) -> Option<Duration> {
    Some(thread_cpu_time()?.saturating_sub(start?))
}

/// Arms the storm on a queue its owner polls, then sleeps until each next deadline and
/// drains what is due, as an event loop does.
fn storm_polled<Q: TimerQueue<Instant> + PolledQueue<Instant>>(mut queue: Q, timers: u64) -> Storm {
    let mut lateness = Lateness::default();
    let (insert, first_deadline) = arm(&mut queue, timers);
    let armed_at = Instant::now();
    let cpu = thread_cpu_time();
    while let Some(next) = queue.next_deadline() {
        sleep_until(next);
        let now = Instant::now();
        while let Some(deadline) = queue.pop_expired(now) {
            lateness.record(deadline, now, Instant::now());
        }
    }
    Storm {
        insert,
        first_deadline,
        armed_at,
        fire_cpu: cpu_since(cpu),
        lateness: lateness.summarize(),
    }
}

fn storm_delay_queue(timers: u64) -> Result<Storm, String> {
    let runtime = delay_queue::runtime()?;
    Ok(runtime.block_on(async {
        let mut lateness = Lateness::default();
        let mut queue: DelayQueue<Instant> = DelayQueue::new();
        let (insert, first_deadline) = arm(&mut queue, timers);
        let armed_at = Instant::now();
        let cpu = thread_cpu_time();
        // DelayQueue decides inside the runtime's timer when a timer is due, so the moment
        // it reaches this loop is the only clock reading there is to check it against.
        while let Some(expired) = poll_fn(|cx| queue.poll_expired(cx)).await {
            let fired_at = Instant::now();
            lateness.record(expired.into_inner(), fired_at, fired_at);
        }
        Storm {
            insert,
            first_deadline,
            armed_at,
            fire_cpu: cpu_since(cpu),
            lateness: lateness.summarize(),
        }
    }))
}

fn storm(subject: Subject, timers: u64, tick: Duration) -> Result<Storm, String> {
    match subject {
        Subject::Corewheel => Ok(storm_polled(
            wheel::new_wheel_ticking::<Instant>(tick),
            timers,
        )),
        Subject::DelayQueue => storm_delay_queue(timers),
        Subject::BinaryHeap => Ok(storm_polled(TombstoneHeap::<Instant>::new(), timers)),
        Subject::Engine => storm_engine(timers, tick),
        _ => Err(format!("{} is not a fire-storm subject", subject.name())),
    }
}

fn micros(duration: Duration) -> String {
    format!("{:.0}", duration.as_secs_f64() * 1e6)
}

/// The finer ticks of the second table: the default's rounding up to a whole tick makes
/// every timer up to a tick late by design (p99 at least 0.99 ms at 1 ms), so these rows
/// show what the engine and the wheel do once that rounding is small. At 250 us the
/// storm also crosses a level-2 boundary of the wheel (level 1 spans 1.024 s there, 4.096
/// s at 1 ms), with most of the storm in the slot after it.
pub const FINE_TICKS: [Duration; 2] = [Duration::from_micros(500), Duration::from_micros(250)];

/// The storms to run: every subject at the default tick, then the engine and the wheel at
/// each finer tick; a cell's setting is its tick in microseconds.
pub fn cells(subjects: &[Subject]) -> Vec<Cell> {
    let default = wheel::TICK.as_micros() as u64;
    let mut cells: Vec<Cell> = subjects
        .iter()
        .map(|&subject| Cell {
            subject,
            threads: 1,
            param: default,
        })
        .collect();
    for tick in FINE_TICKS {
        let fine = subjects
            .iter()
            .filter(|s| matches!(s, Subject::Engine | Subject::Corewheel));
        cells.extend(fine.map(|&subject| Cell {
            subject,
            threads: 1,
            param: tick.as_micros() as u64,
        }));
    }
    cells
}

/// The row's and the CSV's name: the subject's, with the tick when it is not the default.
fn case_name(cell: &Cell) -> String {
    match cell.param == wheel::TICK.as_micros() as u64 {
        true => cell.subject.name().to_string(),
        false => format!("{}-{}us", cell.subject.name(), cell.param),
    }
}

/// Runs `plan`'s storms, each beside its witnesses, and prints the default tick's table,
/// the finer ticks' and the machine's floor.
pub fn run(plan: &Plan, timers: u64, out: &mut Out) {
    let results = runner::in_turns(plan, |cell| {
        let witness = witness();
        let storm = storm(cell.subject, timers, Duration::from_micros(cell.param));
        let witnessed = witness.join().ok().flatten();
        storm.map(|storm| (storm, witnessed))
    });
    let default = wheel::TICK.as_micros() as u64;
    let mut errors = Vec::new();
    for fine in [false, true] {
        let title = match fine {
            false => format!(
                "{NAME} (1 thread, {} timers due within 1 s, real clock)",
                thousands(timers)
            ),
            true => format!("{NAME} at finer ticks (the same storm; the tick is the only change)"),
        };
        let cols = vec![
            Col::new("ns/insert", "ns_per_insert", "ns", 1),
            Col::new("fire CPU ns/timer", "fire_cpu_ns_per_timer", "ns", 1).ratios(),
            Col::new("M fired/CPU-s", "m_fired_per_cpu_s", "M/s", 2).rate(),
            Col::new(
                "first due..last fired ms",
                "first_due_to_last_fired",
                "ms",
                1,
            ),
            Col::new("p50 late us", "lateness_p50", "us", 0),
            Col::new("p99 late us", "lateness_p99", "us", 0),
            Col::new("max late us", "lateness_max", "us", 0),
            Col::new("witness max us", "witness_oversleep_max", "us", 0),
            Col::new("early", "early_fires", "count", 0),
        ];
        let mut sheet = Sheet::new(NAME, title, timers, cols);
        for (cell, result) in plan
            .cells
            .iter()
            .zip(&results)
            .filter(|(c, _)| (c.param != default) == fine)
        {
            let name = case_name(cell);
            let values = result.as_ref().map_err(Clone::clone).map(|runs| {
                let (storm, witnessed) = &runs[0];
                let late = &storm.lateness;
                out.plots.add_lateness(&name, late.cdf.clone());
                if late.early > 0 || late.fired != timers {
                    errors.push(format!(
                        "ERROR: {name} fired {} of {} timers, {} of them EARLY, before their deadline",
                        thousands(late.fired),
                        thousands(timers),
                        thousands(late.early)
                    ));
                }
                if storm.armed_at > storm.first_deadline {
                    sheet.note(format!("{name}: inserting took past the first deadline, so early timers' lateness includes the rest of the inserting"));
                }
                let cost = storm.fire_cpu.map(|cpu| ns_per(cpu, late.fired));
                let span = late.last_fire.map(|last| last.saturating_duration_since(storm.first_deadline));
                let us = |d: Duration| Some(d.as_secs_f64() * 1e6);
                vec![
                    Some(ns_per(storm.insert, timers)),
                    cost,
                    cost.map(|ns| 1e3 / ns),
                    span.map(|span| span.as_secs_f64() * 1e3),
                    us(late.p50),
                    us(late.p99),
                    us(late.max),
                    witnessed.and_then(us),
                    Some(late.early as f64),
                ]
            });
            sheet.rows.push(Row {
                name,
                subject: cell.subject,
                threads: 1,
                values,
            });
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
    for error in &errors {
        runner::print(error);
    }
}

/// How often the storm's witnesses wake: often enough to catch any stall of a millisecond,
/// seldom enough to cost the storm's threads little (about 2% of a core each on these VMs).
const WITNESS_PERIOD: Duration = Duration::from_millis(1);

/// Starts one witness per core, each pinned there, that only sleeps until each millisecond
/// over the second of a storm armed right after this call; returns a handle whose join
/// gives how late the latest of their wake-ups came: whether the machine delayed sleeping
/// threads, on any core, in that same second. One per core because this VM stalls one
/// virtual CPU at a time: an unpinned witness missed stalls of the core an engine worker
/// is pinned to.
fn witness() -> thread::JoinHandle<Option<Duration>> {
    let from = Instant::now() + FIRST_DUE;
    let boundaries =
        u32::try_from(Duration::from_nanos(SPREAD_NS).as_nanos() / WITNESS_PERIOD.as_nanos())
            .unwrap_or(u32::MAX);
    thread::spawn(move || {
        let cores = core_affinity::get_core_ids().unwrap_or_default();
        let witnesses: Vec<_> = cores
            .into_iter()
            .map(|core| {
                thread::spawn(move || {
                    core_affinity::set_for_current(core);
                    wake_floor::sleep_from(from, WITNESS_PERIOD, boundaries)
                        .oversleep_summary()
                        .max
                })
            })
            .collect();
        witnesses
            .into_iter()
            .filter_map(|witness| witness.join().ok())
            .max()
    })
}

/// The machine's floor under the storm, at each tick the tables used: a thread that only
/// sleeps until each tick boundary for the storm's second, how late it woke, and the
/// lateness a storm would have had if each tick's timers had fired, at no cost, the moment
/// that thread woke. No subject can do better on this machine over the same second;
/// measured after the storms, in the same run, because the VM's stalls come and go.
fn floor_table(timers: u64, csv: &mut Csv) {
    let mut table = Table::new(
        format!(
            "{NAME} floor (no timers: a thread that only sleeps until each tick boundary for 1 s)"
        ),
        &[
            "tick us",
            "wake-ups",
            "p50 oversleep us",
            "p99 oversleep us",
            "max oversleep us",
            "storm floor p50 late us",
            "p99 late us",
            "max late us",
        ],
    );
    for tick in std::iter::once(wheel::TICK).chain(FINE_TICKS) {
        let sleeper = wake_floor::sleep_through(tick, Duration::from_nanos(SPREAD_NS));
        let over = sleeper.oversleep_summary();
        let floor = sleeper.storm_floor(tick, timers);
        table.row(vec![
            tick.as_micros().to_string(),
            thousands(over.fired),
            micros(over.p50),
            micros(over.p99),
            micros(over.max),
            micros(floor.p50),
            micros(floor.p99),
            micros(floor.max),
        ]);
        let us = |duration: Duration| duration.as_secs_f64() * 1e6;
        csv.push_metrics(
            NAME,
            &format!("floor-{}us", tick.as_micros()),
            (1, timers),
            &[
                ("oversleep_p50", us(over.p50), "us"),
                ("oversleep_p99", us(over.p99), "us"),
                ("oversleep_max", us(over.max), "us"),
                ("lateness_p50", us(floor.p50), "us"),
                ("lateness_p99", us(floor.p99), "us"),
                ("lateness_max", us(floor.max), "us"),
            ],
        );
    }
    table.note("oversleep: how long after each boundary the thread woke (std::thread::park_timeout, as the engine's workers sleep); a wake-up more than a tick late makes the next boundaries late too");
    table.note("storm floor: the storm's deadlines (as many, as spread) rounded up to the tick, each fired the moment the thread woke at its boundary, at no cost: what a structure that rounds to this tick could at best have done over that second; a storm's own rows add their work and their threads' wake-ups to it");
    table.print();
}
