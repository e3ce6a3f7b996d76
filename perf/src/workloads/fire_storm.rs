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

use crate::cpu_time::{cpu_between, process_cpu_time, thread_cpu_time};
use crate::peers::binary_heap::TombstoneHeap;
use crate::peers::{PolledQueue, Subject, TimerQueue, delay_queue, engine, wheel};
use crate::plots::Plots;
use crate::report::{Csv, RATIO_LEGEND, Table, ratio_cells, thousands};
use crate::rng::XorShift64;
use crate::workloads::lateness::{Lateness, LatenessSummary, worker_records};
use crate::workloads::wake_floor;
use crate::workloads::{ns_per, ratio_columns, ratio_headers};

pub const NAME: &str = "fire-storm";
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
    let mut rng = XorShift64::new(XorShift64::SEED);
    let start = Instant::now();
    let mut first = start + FIRST_DUE + Duration::from_nanos(SPREAD_NS);
    let started = Instant::now();
    for _ in 0..timers {
        let deadline = start + FIRST_DUE + Duration::from_nanos(rng.below(SPREAD_NS));
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
fn storm_engine(timers: u64, capacity: usize, tick: Duration) -> Result<Storm, String> {
    worker_records::prepare(ENGINE_WORKERS, capacity);
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
    let (all, _) = worker_records::take(capacity);
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
fn storm_polled<Q: TimerQueue<Instant> + PolledQueue<Instant>>(
    mut queue: Q,
    timers: u64,
    capacity: usize,
) -> Storm {
    let mut lateness = Lateness::with_capacity(capacity);
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

fn storm_delay_queue(timers: u64, capacity: usize) -> Result<Storm, String> {
    let runtime = delay_queue::runtime()?;
    Ok(runtime.block_on(async {
        let mut lateness = Lateness::with_capacity(capacity);
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
    let capacity = usize::try_from(timers).map_err(|_| "too many timers for this machine")?;
    match subject {
        Subject::Corewheel => Ok(storm_polled(
            wheel::new_wheel_ticking::<Instant>(tick),
            timers,
            capacity,
        )),
        Subject::DelayQueue => storm_delay_queue(timers, capacity),
        Subject::BinaryHeap => Ok(storm_polled(
            TombstoneHeap::<Instant>::new(),
            timers,
            capacity,
        )),
        Subject::Engine => storm_engine(timers, capacity, tick),
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

/// One storm to run: a subject at a tick.
#[derive(Clone, Copy)]
struct Case {
    subject: Subject,
    tick: Duration,
}

impl Case {
    /// The row's and the CSV's name: the subject's, with the tick when it is not the
    /// default.
    fn name(self) -> String {
        if self.tick == wheel::TICK {
            self.subject.name().to_string()
        } else {
            format!("{}-{}us", self.subject.name(), self.tick.as_micros())
        }
    }
}

pub fn run(subjects: &[Subject], timers: u64, csv: &mut Csv, plots: &mut Plots) {
    let cases: Vec<Case> = subjects
        .iter()
        .map(|&subject| Case {
            subject,
            tick: wheel::TICK,
        })
        .collect();
    let mut errors = table_of(
        &cases,
        subjects,
        timers,
        format!(
            "{NAME} (1 thread, {} timers due within 1 s, real clock)",
            thousands(timers)
        ),
        csv,
        plots,
    );
    let fine: Vec<Case> = FINE_TICKS
        .iter()
        .flat_map(|&tick| {
            subjects
                .iter()
                .filter(|subject| matches!(subject, Subject::Engine | Subject::Corewheel))
                .map(move |&subject| Case { subject, tick })
        })
        .collect();
    if !fine.is_empty() {
        errors.extend(table_of(
            &fine,
            &[],
            timers,
            format!("{NAME} at finer ticks (the same storm; the tick is the only change)"),
            csv,
            plots,
        ));
    }
    floor_table(timers, csv);
    for error in &errors {
        crate::progress::print(error);
    }
    if !errors.is_empty() {
        crate::progress::print("");
    }
}

/// Runs `cases`, prints their table (with ratios against `ratio_subjects`, the cases'
/// own subjects in the same order, or none), and returns the errors found.
fn table_of(
    cases: &[Case],
    ratio_subjects: &[Subject],
    timers: u64,
    title: String,
    csv: &mut Csv,
    plots: &mut Plots,
) -> Vec<String> {
    let results: Vec<Result<(Storm, Option<Duration>), String>> = cases
        .iter()
        .map(|&case| {
            crate::progress::step(format!("{NAME}/{} (about 2 s of real time)", case.name()));
            let witness = witness();
            let storm = storm(case.subject, timers, case.tick);
            let witnessed = witness.join().ok().flatten();
            storm.map(|storm| (storm, witnessed))
        })
        .collect();

    let costs: Vec<Option<f64>> = results
        .iter()
        .map(|result| {
            let (storm, _) = result.as_ref().ok()?;
            Some(ns_per(storm.fire_cpu?, storm.lateness.fired))
        })
        .collect();
    let columns = ratio_columns(ratio_subjects);
    let mut table = Table::new(
        title,
        &[
            "subject",
            "ns/insert",
            "fire CPU ns/timer",
            "M fired/CPU-s",
            "first due..last fired ms",
            "p50 late us",
            "p99 late us",
            "max late us",
            "witness max us",
            "early",
        ],
    );
    ratio_headers(&mut table, ratio_subjects, &columns);
    let mut errors = Vec::new();
    for (row, (case, result)) in cases.iter().zip(&results).enumerate() {
        let name = case.name();
        let name = name.as_str();
        let (storm, witnessed) = match result {
            Ok((storm, witnessed)) => (storm, *witnessed),
            Err(error) => {
                table.row(vec![name.to_string(), "error".to_string()]);
                table.note(format!("{name}: {error}"));
                continue;
            }
        };
        let late = &storm.lateness;
        plots.add_lateness(name, late.cdf.clone());
        let span = late
            .last_fire
            .map(|last| last.saturating_duration_since(storm.first_deadline));
        let insert_ns = ns_per(storm.insert, timers);
        let show = |value: Option<String>| value.unwrap_or_else(|| "n/a".to_string());
        let mut cells = vec![
            name.to_string(),
            format!("{insert_ns:.1}"),
            show(costs[row].map(|ns| format!("{ns:.1}"))),
            show(costs[row].map(|ns| format!("{:.2}", 1e3 / ns))),
            show(span.map(|span| format!("{:.1}", span.as_secs_f64() * 1e3))),
            micros(late.p50),
            micros(late.p99),
            micros(late.max),
            show(witnessed.map(micros)),
            thousands(late.early),
        ];
        cells.extend(ratio_cells(&costs, row, &columns));
        table.row(cells);

        if late.early > 0 {
            errors.push(format!(
                "ERROR: {name} fired {} of {} timers EARLY, before their deadline",
                thousands(late.early),
                thousands(late.fired)
            ));
        }
        if late.fired != timers {
            errors.push(format!(
                "ERROR: {name} fired {} timers, not {}",
                thousands(late.fired),
                thousands(timers)
            ));
        }
        if storm.armed_at > storm.first_deadline {
            table.note(format!(
                "{name}: inserting took past the first deadline, so early timers' lateness includes the rest of the inserting"
            ));
        }

        let mut metrics = vec![
            ("ns_per_insert", insert_ns, "ns"),
            ("lateness_p50", late.p50.as_secs_f64() * 1e6, "us"),
            ("lateness_p99", late.p99.as_secs_f64() * 1e6, "us"),
            ("lateness_max", late.max.as_secs_f64() * 1e6, "us"),
            ("early_fires", late.early as f64, "count"),
            ("fired", late.fired as f64, "count"),
        ];
        if let Some(ns) = costs[row] {
            metrics.push(("fire_cpu_ns_per_timer", ns, "ns"));
        }
        if let Some(witnessed) = witnessed {
            metrics.push(("witness_oversleep_max", witnessed.as_secs_f64() * 1e6, "us"));
        }
        if let Some(span) = span {
            metrics.push(("first_due_to_last_fired", span.as_secs_f64() * 1e3, "ms"));
        }
        csv.push_metrics(NAME, name, timers, &metrics);
    }
    table.note("fire CPU: this thread's CPU time from the last insert to the last fire (the sleeps cost none), per timer fired; engine: the process's CPU time (its 2 workers, which run the callbacks, and this thread waiting)");
    table.note("late: fire instant (clock read as the value reaches the loop, or in the engine's callback) - deadline; corewheel, the engine and DelayQueue round deadlines up to their tick, never down (at 1 ms, p99 is at least 0.99 ms by that alone), the heap fires at the exact instant");
    table.note("witness max: the latest wake-up of threads that only slept until each millisecond over the storm's second, beside it, one pinned to each core (see the floor table below): a storm whose worst lateness is more than its tick plus this lost that time itself; the witnesses also wait for the storm's own threads, which share their cores");
    table.note("early: fire instant or the poll's `now` before the deadline; must be 0");
    if !columns.is_empty() {
        table.note(format!("{RATIO_LEGEND}; on fire CPU"));
    }
    table.print();
    errors
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
        crate::progress::step(format!("{NAME}/floor at {} us (1 s)", tick.as_micros()));
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
            timers,
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
