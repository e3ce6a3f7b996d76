//! The workloads, one per file, and what they share: their names, their sizes and the
//! deadline distribution of request timeouts.

pub mod arm_cancel;
pub mod async_timers;
pub mod burst_steal;
pub mod engine_arm_cancel;
pub mod engine_live_1m;
pub mod engine_reset;
pub mod fire_storm;
pub mod keyed;
pub mod lateness;
pub mod live_1m;
pub mod live_runs;
pub mod parallel;
pub mod proxy;
pub mod proxy_load;
pub mod reset_heavy;
pub mod steady_mix;
pub mod wake_floor;

use std::time::Duration;

use crate::peers::Subject;
use crate::repeat::{self, median, spread};
use crate::report::{Csv, RATIO_LEGEND, Table, ratio_cells};
use crate::rng::XorShift64;

/// The measurements made in a child process of this binary (see [`crate::child`]): the
/// encoded result for `subject` at `timers`, `None` for a workload that has none.
pub fn measure_in_child(
    workload: &str,
    subject: Subject,
    timers: u64,
) -> Option<Result<String, String>> {
    Some(match workload {
        live_1m::NAME => live_1m::measure_here(subject, timers).map(|r| live_runs::encode(&r)),
        engine_live_1m::NAME => {
            engine_live_1m::measure_here(subject, timers).map(|r| live_runs::encode(&r))
        }
        _ => return async_timers::measure_in_child(workload, subject, timers),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    ArmCancel,
    EngineArmCancel,
    Live1m,
    EngineLive1m,
    ResetHeavy,
    EngineReset,
    FireStorm,
    BurstSteal,
    SteadyMix,
    LightLoad,
    AsyncSleep,
    AsyncTimeout,
    AsyncReset,
    KeyedSetRemove,
    KeyedSetOver,
    KeyedMove,
    Proxy,
}

impl Workload {
    pub const ALL: [Workload; 17] = [
        Workload::ArmCancel,
        Workload::EngineArmCancel,
        Workload::Live1m,
        Workload::EngineLive1m,
        Workload::ResetHeavy,
        Workload::EngineReset,
        Workload::FireStorm,
        Workload::BurstSteal,
        Workload::SteadyMix,
        Workload::LightLoad,
        Workload::AsyncSleep,
        Workload::AsyncTimeout,
        Workload::AsyncReset,
        Workload::KeyedSetRemove,
        Workload::KeyedSetOver,
        Workload::KeyedMove,
        Workload::Proxy,
    ];

    /// What a run without `--workloads` runs: all but the proxy, which opens thousands of
    /// sockets and starts processes, and which is not part of the engine's reference set.
    pub fn defaults() -> Vec<Workload> {
        Self::ALL
            .into_iter()
            .filter(|&workload| workload != Workload::Proxy)
            .collect()
    }

    pub fn name(self) -> &'static str {
        match self {
            Workload::ArmCancel => "arm-cancel",
            Workload::EngineArmCancel => engine_arm_cancel::NAME,
            Workload::Live1m => "live-1m",
            Workload::EngineLive1m => engine_live_1m::NAME,
            Workload::ResetHeavy => "reset-heavy",
            Workload::EngineReset => engine_reset::NAME,
            Workload::FireStorm => "fire-storm",
            Workload::BurstSteal => burst_steal::NAME,
            Workload::SteadyMix => steady_mix::NAME,
            Workload::LightLoad => steady_mix::LIGHT_NAME,
            Workload::AsyncSleep => async_timers::SLEEP,
            Workload::AsyncTimeout => async_timers::TIMEOUT,
            Workload::AsyncReset => async_timers::RESET,
            Workload::KeyedSetRemove => keyed::SET_REMOVE,
            Workload::KeyedSetOver => keyed::SET_OVER,
            Workload::KeyedMove => keyed::MOVE,
            Workload::Proxy => proxy::NAME,
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|workload| workload.name() == name)
    }

    pub fn summary(self) -> &'static str {
        match self {
            Workload::ArmCancel => {
                "request timeouts: arm one, cancel the one armed 10,000 ops earlier"
            }
            Workload::EngineArmCancel => {
                "request timeouts from 1..N threads: TimerEngine vs tokio sleep and timeout(), pingora-timeout and a shared Mutex<BinaryHeap>, a window of requests in flight per thread"
            }
            Workload::Live1m => "insert a million timers, measure RSS, cancel them in random order",
            Workload::EngineLive1m => {
                "a million live timers on the TimerEngine vs tokio sleep: insert, RSS, cancel"
            }
            Workload::ResetHeavy => {
                "idle timeouts: 100,000 connections pushing their deadlines back"
            }
            Workload::EngineReset => {
                "idle timeouts from 1..N threads: TimerEngine reset vs tokio Sleep::reset and a shared Mutex<BinaryHeap>, 100,000 connections"
            }
            Workload::FireStorm => {
                "a million timers all due within one second, fired on the real clock"
            }
            Workload::BurstSteal => {
                "a million timers from one thread, due within 10 ms, on a TimerEngine with stealing on and off: last fire and lateness"
            }
            Workload::SteadyMix => {
                "a proxy's steady load: a million live timers, new ones armed at a fixed rate for 10 s, 90% cancelled and 10% fired: CPU per timer"
            }
            Workload::LightLoad => {
                "the same mix at light load, 1,000 and 10,000 timers/s with a second's worth live, default worker count: CPU cores busy and wakes per second"
            }
            Workload::AsyncSleep => {
                "request timeouts as futures from 1..N threads: a sleep polled once and dropped; corewheel-async vs tokio (default and alt timer), async-io and pingora-timeout, CPU per timer"
            }
            Workload::AsyncTimeout => {
                "the same with timeout() around a pending read, polled once and dropped"
            }
            Workload::Proxy => {
                "corewheel-proxy (tokio, hyper) on loopback in its own process, every timer on corewheel or on tokio: 2,000 busy and 200 light keep-alive connections, req/s, latency, proxy CPU per request, timer share; and an accuracy check of its idle timeout and deadline"
            }
            Workload::AsyncReset => {
                "idle timeouts as futures from 1..N threads: 10,000 connections per thread, each read pushing its sleep back (Sleep::reset, Timer::set_at; pingora re-creates)"
            }
            Workload::KeyedSetRemove => {
                "a timer per key from 1..N threads: set a new key, remove the one set 16 earlier; KeyedTimers vs a Mutex<HashMap> over the engine and a locked DelayQueue with a key map"
            }
            Workload::KeyedSetOver => {
                "the same subjects: set over one of 10,000 pending keys per thread"
            }
            Workload::KeyedMove => "the same subjects: move one of 10,000 pending keys per thread",
        }
    }
}

impl Workload {
    /// Whether the workload drives `subject`: the single-thread workloads drive the
    /// single-owner structures; the engine workloads the multi-thread subjects that can do
    /// what they ask (a `timeout()` future is only armed and cancelled; engine-live-1m
    /// measures each subject's memory in a child process, and has tokio as its peer).
    pub fn drives(self, subject: Subject) -> bool {
        match self {
            Workload::ArmCancel | Workload::Live1m | Workload::ResetHeavy => {
                subject.is_single_owner()
            }
            Workload::FireStorm => subject.is_single_owner() || subject == Subject::Engine,
            Workload::EngineArmCancel => matches!(
                subject,
                Subject::Engine
                    | Subject::TokioSleep
                    | Subject::TokioTimeout
                    | Subject::PingoraTimeout
                    | Subject::MutexHeap
            ),
            Workload::AsyncSleep | Workload::AsyncTimeout | Workload::AsyncReset => matches!(
                subject,
                Subject::CorewheelAsync
                    | Subject::Tokio
                    | Subject::TokioAlt
                    | Subject::AsyncIo
                    | Subject::PingoraTimeout
            ),
            Workload::EngineReset | Workload::SteadyMix => matches!(
                subject,
                Subject::Engine | Subject::TokioSleep | Subject::MutexHeap
            ),
            Workload::LightLoad => matches!(
                subject,
                Subject::Engine | Subject::EngineDriven | Subject::TokioSleep | Subject::MutexHeap
            ),
            Workload::EngineLive1m => matches!(subject, Subject::Engine | Subject::TokioSleep),
            Workload::Proxy => matches!(subject, Subject::CorewheelAsync | Subject::Tokio),
            Workload::BurstSteal => subject == Subject::Engine,
            Workload::KeyedSetRemove | Workload::KeyedSetOver | Workload::KeyedMove => matches!(
                subject,
                Subject::Keyed
                    | Subject::MutexMap
                    | Subject::DelayQueueMap
                    | Subject::DashMapOnly
                    | Subject::SccOnly
            ),
        }
    }

    /// Whether the workload drives the multi-thread subjects (the engine, tokio sleep)
    /// rather than the single-owner ones.
    pub fn is_engine(self) -> bool {
        matches!(
            self,
            Workload::EngineArmCancel
                | Workload::EngineLive1m
                | Workload::EngineReset
                | Workload::AsyncSleep
                | Workload::AsyncTimeout
                | Workload::AsyncReset
                | Workload::KeyedSetRemove
                | Workload::KeyedSetOver
                | Workload::KeyedMove
        )
    }
}

/// How big each workload runs.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub arm_cancel_ops: u64,
    pub live_timers: u64,
    pub reset_ops: u64,
    pub storm_timers: u64,
    /// Operations per thread in each async workload's run.
    pub async_ops: u64,
}

impl Sizes {
    /// Defaults finish in seconds on two cores; `full` is the size the workloads are named
    /// for. `timers` overrides the timer count of live-1m and fire-storm.
    pub fn new(full: bool, timers: Option<u64>) -> Self {
        let (arm_cancel_ops, live_timers, reset_ops) = if full {
            (20_000_000, 10_000_000, 20_000_000)
        } else {
            (2_000_000, 1_000_000, 2_000_000)
        };
        Self {
            arm_cancel_ops,
            live_timers: timers.unwrap_or(live_timers),
            reset_ops,
            storm_timers: timers.unwrap_or(1_000_000),
            async_ops: if full {
                async_timers::FULL_OPS
            } else {
                async_timers::DEFAULT_OPS
            },
        }
    }
}

/// A request timeout: uniform in 1 ms..30 s, drawn in nanoseconds.
#[inline]
pub fn request_timeout(rng: &mut XorShift64) -> Duration {
    Duration::from_nanos(rng.between(1_000_000, 30_000_000_000))
}

/// Which subjects get a "vs" column: the peers, as the point is how corewheel compares with
/// them; every subject when corewheel is not in the run.
pub fn ratio_columns(subjects: &[Subject]) -> Vec<usize> {
    if subjects.len() < 2 {
        return Vec::new();
    }
    let peers: Vec<usize> = (0..subjects.len())
        .filter(|&i| !subjects[i].is_corewheel())
        .collect();
    if peers.len() < subjects.len() {
        peers
    } else {
        (0..subjects.len()).collect()
    }
}

/// Adds a "vs X" header cell for each ratio column.
pub fn ratio_headers(table: &mut Table, subjects: &[Subject], columns: &[usize]) {
    for &column in columns {
        table.header_cell(format!("vs {}", subjects[column].name()));
    }
}

/// Nanoseconds per item, from a duration over `count` items.
pub fn ns_per(elapsed: Duration, count: u64) -> f64 {
    elapsed.as_nanos() as f64 / count.max(1) as f64
}

/// The shape shared by the workloads that time one kind of operation: a cost per operation
/// and its rate, per subject, with ratio columns.
pub struct TimingTable {
    pub workload: &'static str,
    pub title: String,
    /// Header of the cost column, such as `ns/op`.
    pub cost: &'static str,
    /// Header of the rate column, such as `Mops/s`.
    pub rate: &'static str,
    /// CSV metric names for the cost (ns) and the rate (millions a second).
    pub cost_metric: &'static str,
    pub rate_metric: &'static str,
    /// The `timers` CSV column.
    pub timers: u64,
    /// What one operation is, the first note under the table.
    pub operation: &'static str,
}

impl TimingTable {
    /// Builds the table from each subject's runs, in ns per operation, and records the
    /// medians in the CSV. The caller adds its notes and prints it.
    pub fn build(
        self,
        subjects: &[Subject],
        runs: &[Result<Vec<f64>, String>],
        csv: &mut Csv,
    ) -> Table {
        let costs: Vec<Option<f64>> = runs
            .iter()
            .map(|runs| runs.as_ref().ok().map(|runs| median(runs.iter().copied())))
            .collect();
        let columns = ratio_columns(subjects);
        let mut table = Table::new(self.title, &["subject", self.cost, self.rate]);
        ratio_headers(&mut table, subjects, &columns);
        table.note(self.operation);
        let mut spreads = Vec::new();
        for (row, (subject, runs)) in subjects.iter().zip(runs).enumerate() {
            let name = subject.name();
            match (runs, costs[row]) {
                (Ok(runs), Some(ns)) => {
                    let mut cells = vec![
                        name.to_string(),
                        format!("{ns:.1}"),
                        format!("{:.2}", 1e3 / ns),
                    ];
                    cells.extend(ratio_cells(&costs, row, &columns));
                    table.row(cells);
                    spreads.push(format!("{name} {}", spread(runs.iter().copied())));
                    csv.push_metrics(
                        self.workload,
                        name,
                        self.timers,
                        &[
                            (self.cost_metric, ns, "ns"),
                            (self.rate_metric, 1e3 / ns, "M/s"),
                        ],
                    );
                }
                (Err(error), _) => {
                    table.row(vec![name.to_string(), "error".to_string()]);
                    table.note(format!("ERROR: {name}: {error}"));
                }
                (Ok(_), None) => table.row(vec![name.to_string(), "no runs".to_string()]),
            }
        }
        table.note(format!(
            "median of {} runs per subject, taken in turns; {} range: {}",
            repeat::RUNS,
            self.cost,
            spreads.join(", ")
        ));
        if !columns.is_empty() {
            table.note(RATIO_LEGEND);
        }
        table
    }
}
