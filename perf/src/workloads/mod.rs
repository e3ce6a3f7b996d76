//! The workloads, one per file, and what they share: their names, their plans (which subjects they drive at which
//! settings), how the run dispatches to them, and the deadline distribution of request timeouts.

pub mod async_timers;
pub mod burst_steal;
pub mod engine_arm_cancel;
pub mod engine_reset;
pub mod fire_storm;
pub mod keyed;
pub mod lateness;
pub mod live;
pub mod parallel;
pub mod proxy;
pub mod single_owner;
pub mod steady_mix;
pub mod wake_floor;

use std::time::Duration;

use crate::cli::Options;
use crate::peers::Subject;
use crate::plots::Plots;
use crate::report::Csv;
use crate::runner::{Cell, Plan, RUNS};

/// What the workloads write into: the CSV rows and the plots' extra data.
#[derive(Default)]
pub struct Out {
    pub csv: Csv,
    pub plots: Plots,
}

crate::named::named_enum! {
    /// One workload of the harness.
    pub enum Workload {
        ArmCancel = "arm-cancel": "request timeouts: arm one, cancel the one armed 10,000 ops earlier",
        EngineArmCancel = "engine-arm-cancel": "request timeouts from 1..N threads, a window in flight per thread",
        Live1m = "live-1m": "insert a million timers, measure RSS, cancel them in random order",
        EngineLive1m = "engine-live-1m": "a million live timers on the TimerEngine: insert, RSS, cancel",
        ResetHeavy = "reset-heavy": "idle timeouts: 100,000 connections pushing their deadlines back",
        EngineReset = "engine-reset": "idle timeouts from 1..N threads, 100,000 connections",
        FireStorm = "fire-storm": "a million timers all due within one second, on the real clock",
        BurstSteal = "burst-steal": "a million timers due within 10 ms on one shard, stealing on and off",
        SteadyMix = "steady-mix": "a proxy's steady load: 1M live, 1M armed/s, 90% cancelled: CPU/timer",
        LightLoad = "light-load": "the same mix at 1,000 and 10,000 timers/s: cores busy, wakes/s",
        AsyncSleep = "async-sleep": "request timeouts as futures from 1..N threads: a sleep polled once",
        AsyncTimeout = "async-timeout": "the same with timeout() around a pending read",
        AsyncReset = "async-reset": "idle timeouts as futures: 10,000 connections per thread, reset",
        KeyedSetRemove = "keyed-set-remove": "a timer per key: set a new key, remove the one set 16 earlier",
        KeyedSetOver = "keyed-set-over": "a timer per key: set over one of 10,000 pending keys per thread",
        KeyedMove = "keyed-move": "a timer per key: move one of 10,000 pending keys per thread",
        Proxy = "proxy": "corewheel-proxy under wrk, each timer back-end in turns (needs wrk)",
    }
}

impl Workload {
    /// What a run without `--workloads` runs: all but the proxy, which needs wrk and starts processes.
    pub fn defaults() -> Vec<Workload> {
        Self::ALL
            .iter()
            .copied()
            .filter(|&w| w != Workload::Proxy)
            .collect()
    }

    /// Whether the workload drives `subject`.
    pub fn drives(self, subject: Subject) -> bool {
        use Subject::*;
        use Workload::*;
        match self {
            ArmCancel | Live1m | ResetHeavy => subject.is_single_owner(),
            FireStorm => subject.is_single_owner() || subject == Engine,
            EngineArmCancel => matches!(
                subject,
                Engine | TokioSleep | TokioTimeout | PingoraTimeout | MutexHeap
            ),
            AsyncSleep | AsyncTimeout | AsyncReset => {
                matches!(subject, CorewheelAsync | Tokio | AsyncIo | PingoraTimeout)
            }
            EngineReset | SteadyMix => matches!(subject, Engine | TokioSleep | MutexHeap),
            LightLoad => matches!(subject, Engine | EngineDriven | TokioSleep | MutexHeap),
            EngineLive1m => matches!(subject, Engine | TokioSleep),
            Proxy => matches!(subject, CorewheelAsync | EngineDriven | Tokio),
            BurstSteal => subject == Engine,
            KeyedSetRemove | KeyedSetOver | KeyedMove => {
                matches!(subject, Keyed | MutexMap | DelayQueueMap | Dashmap | Scc)
            }
        }
    }

    /// What this workload will measure under `options`: its cells and runs.
    pub fn plan(self, options: &Options) -> Plan {
        use Workload::*;
        let drives = options.peers.iter().copied().filter(|&s| self.drives(s));
        let mut subjects: Vec<Subject> = drives.collect();
        if matches!(self, AsyncSleep | AsyncTimeout | AsyncReset) {
            // corewheel's rows first, then the peers in the order given.
            subjects.sort_by_key(|subject| !subject.is_corewheel());
        }
        let all: Vec<usize> = options.threads.iter().map(|&t| t.into()).collect();
        let most = [all.iter().copied().max().unwrap_or(1)];
        let workers: Vec<usize> = all.iter().copied().filter(|&n| n > 1).collect();
        let windows: Vec<u64> = options.windows.iter().map(|&w| u64::from(w)).collect();
        let rate = [options.mix_rate];
        let (threads, params, runs, param): (&[usize], &[u64], usize, &str) = match self {
            ArmCancel | Live1m | EngineLive1m | ResetHeavy => (&[1], &[0], RUNS, ""),
            EngineArmCancel => (&all, &windows, RUNS, "window"),
            FireStorm => (&[1], &fire_storm::TICKS_US, 1, "tick us"),
            BurstSteal => (&workers, &[1, 0], RUNS, "stealing"),
            SteadyMix => (&most, &rate, 1, ""),
            LightLoad => (&most, &steady_mix::LIGHT_RATES, RUNS, "timers/s"),
            Proxy if proxy::wrk_missing() => (&[1], &[1], RUNS, ""),
            Proxy => (&[1], &[0, 1], RUNS, ""),
            _ => (&all, &[0], RUNS, ""),
        };
        let mut cells = Vec::new();
        for (&param, &threads) in params
            .iter()
            .flat_map(|p| threads.iter().map(move |t| (p, t)))
        {
            cells.extend(subjects.iter().map(|&subject| Cell {
                subject,
                threads,
                param,
            }));
        }
        if self == FireStorm {
            let fine = |s| matches!(s, Subject::Engine | Subject::Corewheel);
            cells.retain(|c| c.param == fire_storm::TICKS_US[0] || fine(c.subject));
        }
        Plan {
            workload: self,
            cells,
            runs,
            param,
        }
    }

    /// Runs `plan` (this workload's) and prints its tables.
    pub fn run(self, plan: &Plan, options: &Options, out: &mut Out) {
        use Workload::*;
        let [ops, live, storm, async_ops] = options.sizes();
        match self {
            ArmCancel => single_owner::arm_cancel(plan, ops, out),
            EngineArmCancel => engine_arm_cancel::run(plan, ops, out),
            Live1m | EngineLive1m => live::run(plan, live, out),
            ResetHeavy => single_owner::reset_heavy(plan, ops, out),
            EngineReset => engine_reset::run(plan, ops, out),
            FireStorm => fire_storm::run(plan, storm, out),
            BurstSteal => burst_steal::run(plan, storm, out),
            SteadyMix => steady_mix::run(plan, Some(storm), options.mix_seconds, out),
            LightLoad => steady_mix::run(plan, None, options.mix_seconds, out),
            AsyncSleep | AsyncTimeout | AsyncReset => async_timers::run(self, plan, async_ops, out),
            KeyedSetRemove | KeyedSetOver | KeyedMove => keyed::run(self, plan, ops, out),
            Proxy => proxy::run(plan, options.wrk_seconds, out),
        }
    }
}

/// A request timeout: uniform in 1 ms..30 s, drawn in nanoseconds.
#[inline]
pub fn request_timeout(rng: &mut fastrand::Rng) -> Duration {
    Duration::from_nanos(rng.u64(1_000_000..30_000_000_000))
}

/// The random numbers every workload starts from, so every run draws the same timers; `stream` tells threads apart.
pub fn rng(stream: u64) -> fastrand::Rng {
    fastrand::Rng::with_seed(0x9E37_79B9_7F4A_7C15 ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03))
}

/// Nanoseconds per item, from a duration over `count` items.
pub fn ns_per(elapsed: Duration, count: u64) -> f64 {
    elapsed.as_nanos() as f64 / count.max(1) as f64
}
