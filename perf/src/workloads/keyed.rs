//! keyed-*: a timer per key from 1..N threads, corewheel's `KeyedTimers` against what users build today (a
//! `Mutex<HashMap>` of handles over the same engine, and tokio-util's `DelayQueue` with a key map behind one lock),
//! and the candidate maps alone. Each thread works on keys of its own (its index in the high bits); every deadline is
//! 30 s out, so nothing comes due during a run.

use std::time::{Duration, Instant};

use crate::peers::Subject;
use crate::peers::engine;
use crate::peers::keyed::{self, DashMapOnly, DelayQueueMap, Keyed, MutexMap, SccOnly};
use crate::report::thousands;
use crate::runner::{Cell, Plan};
use crate::workloads::parallel::{self, Gate, Run, Share, share_of, threads_sheet};
use crate::workloads::{Out, Workload, rng};

/// Keys each thread sets before keyed-set-over and keyed-move begin.
pub const KEYS_PER_THREAD: u64 = 10_000;
/// Keys a thread holds in keyed-set-remove: each is removed this many sets later.
pub const WINDOW: u64 = 16;
const DEADLINE: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    SetRemove,
    SetOver,
    Move,
}

impl Kind {
    fn operation(self) -> (&'static str, &'static str) {
        match self {
            Kind::SetRemove => (
                "op",
                "op = set a new key (30 s) and remove the key this thread set 16 operations earlier",
            ),
            Kind::SetOver => (
                "set",
                "set = set a random one of the thread's 10,000 pending keys again: a new value and a deadline 30 s from now",
            ),
            Kind::Move => (
                "move",
                "move = move a random one of the thread's 10,000 pending keys to 30 s from now",
            ),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Config {
    kind: Kind,
    threads: usize,
    ops: u64,
}

/// One thread's share: sets up its keys, waits at the gate, then does its operations.
fn thread_share(
    subject: &dyn Keyed,
    index: usize,
    gate: &Gate,
    config: Config,
) -> Result<Share, String> {
    let base = (index as u64) << 40;
    let ops = share_of(config.ops, config.threads, index);
    let mut share = Share::new();
    let mut rng = rng(index as u64 + 29);
    let setup: Result<(), String> = if config.kind == Kind::SetRemove {
        Ok(())
    } else {
        (0..KEYS_PER_THREAD).try_for_each(|key| subject.set(base + key, key, DEADLINE))
    };
    gate.wait();
    setup?;
    match config.kind {
        Kind::SetRemove => {
            for op in 0..ops {
                subject.set(base + op, op, DEADLINE)?;
                if op >= WINDOW && !subject.remove(base + op - WINDOW) {
                    share.too_late += 1;
                }
            }
            for op in ops.saturating_sub(WINDOW)..ops {
                if !subject.remove(base + op) {
                    share.too_late += 1;
                }
            }
        }
        Kind::SetOver => {
            for op in 0..ops {
                subject.set(base + rng.u64(..KEYS_PER_THREAD), op, DEADLINE)?;
            }
        }
        Kind::Move => {
            for _ in 0..ops {
                if !subject.move_to(base + rng.u64(..KEYS_PER_THREAD), DEADLINE) {
                    share.too_late += 1;
                }
            }
        }
    }
    share.done = Instant::now();
    if share.too_late > 0 {
        return Err(format!(
            "{} keys were not pending when the thread came back to them",
            share.too_late
        ));
    }
    Ok(share)
}

fn no_workers() -> Option<Duration> {
    None
}

/// Runs the threads against `subject`, counting the engine's workers' CPU if `on_engine`.
fn run_on(subject: &dyn Keyed, on_engine: bool, config: Config) -> Result<Run, String> {
    let workers_cpu = if on_engine {
        engine::workers_cpu_time
    } else {
        no_workers
    };
    parallel::on_threads(
        config.threads,
        workers_cpu,
        |i, gate| thread_share(subject, i, gate, config),
        |_| Ok(None),
    )
}

/// One run of `subject`; the keys left pending are dropped with it, untimed.
fn measure(subject: Subject, config: Config) -> Result<Run, String> {
    match subject {
        Subject::Keyed => run_on(&keyed::keyed_timers(&engine::build(false)?), true, config),
        Subject::MutexMap => run_on(&MutexMap::new(&engine::build(false)?), true, config),
        Subject::DelayQueueMap => {
            let runtime = crate::peers::runtime()?;
            let queue = DelayQueueMap::default();
            // Every thread inserts into the queue, which needs the runtime's context.
            let body = |index, gate: &Gate| {
                let _context = runtime.enter();
                thread_share(&queue, index, gate, config)
            };
            parallel::on_threads(config.threads, no_workers, body, |_| Ok(None))
        }
        Subject::Dashmap => run_on(&DashMapOnly::default(), false, config),
        Subject::Scc => run_on(&SccOnly::default(), false, config),
        _ => Err(format!("{} is not a keyed subject", subject.name())),
    }
}

pub fn run(workload: Workload, plan: &Plan, ops: u64, out: &mut Out) {
    let kind = match workload {
        Workload::KeyedSetOver => Kind::SetOver,
        Workload::KeyedMove => Kind::Move,
        _ => Kind::SetRemove,
    };
    let results = parallel::measure(
        plan,
        |_| ops,
        |cell: &Cell| {
            measure(
                cell.subject,
                Config {
                    kind,
                    threads: cell.threads,
                    ops,
                },
            )
        },
    );
    let cells: Vec<_> = plan.cells.iter().zip(&results).collect();
    let (unit, operation) = kind.operation();
    let name = workload.name();
    let title = format!(
        "{name} ({} operations per run over the threads; deadlines 30 s out, nothing due)",
        thousands(ops)
    );
    let too_late = "not pending when came back to";
    let mut sheet = threads_sheet((name.to_string(), title), (unit, ops), too_late, &cells);
    sheet.note(operation);
    sheet.note("keyed: corewheel::KeyedTimers<u64, u64> on a TimerEngine (dashmap underneath); mutex-map: a Mutex<HashMap<key, (value, TimerHandle)>> over the same engine, its callbacks removing their key under the lock; delay-queue-map: tokio-util's DelayQueue with a HashMap<key, delay_queue::Key>, both behind one Mutex (a new value is a remove and an insert: the queue cannot replace one in place)");
    sheet.note("dashmap, scc: the map operations KeyedTimers does (entry upsert, get_mut, remove) on a 24-byte slot, with no timer: to choose the map, and to show what the timers add over it (dashmap with KeyedTimers' 16 shards per CPU)");
    sheet.finish(&mut out.csv);
}
