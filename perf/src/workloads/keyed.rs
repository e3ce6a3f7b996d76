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
const KEYS_PER_THREAD: u64 = 10_000;
/// Keys a thread holds in keyed-set-remove: each is removed this many sets later.
const WINDOW: u64 = 16;
const DEADLINE: Duration = Duration::from_secs(30);

/// One thread's share of `workload`'s `ops`: its keys set up, then its operations; a key found not pending fails.
fn thread_share(
    subject: &dyn Keyed,
    (index, gate): (usize, &Gate),
    (workload, threads, ops): (Workload, usize, u64),
) -> Result<Share, String> {
    let (base, ops) = ((index as u64) << 40, share_of(ops, threads, index));
    let (mut share, mut rng) = (Share::new(), rng(index as u64 + 29));
    let setup = match workload {
        Workload::KeyedSetRemove => Ok(()),
        _ => (0..KEYS_PER_THREAD).try_for_each(|key| subject.set(base + key, key, DEADLINE)),
    };
    gate.wait();
    setup?;
    let mut missing = 0;
    for op in 0..ops {
        let pending = match workload {
            Workload::KeyedSetRemove => {
                subject.set(base + op, op, DEADLINE)?;
                op < WINDOW || subject.remove(base + op - WINDOW)
            }
            Workload::KeyedSetOver => {
                subject.set(base + rng.u64(..KEYS_PER_THREAD), op, DEADLINE)?;
                true
            }
            _ => subject.move_to(base + rng.u64(..KEYS_PER_THREAD), DEADLINE),
        };
        missing += u64::from(!pending);
    }
    if workload == Workload::KeyedSetRemove {
        missing += (ops.saturating_sub(WINDOW)..ops)
            .filter(|&op| !subject.remove(base + op))
            .count() as u64;
    }
    share.done = Instant::now();
    match missing {
        0 => Ok(share),
        _ => Err(format!(
            "{missing} keys were not pending when the thread came back to them"
        )),
    }
}

/// One run of `subject`, with the engine's workers' CPU where it has them; the keys left are dropped untimed.
fn measure(subject: Subject, config: (Workload, usize, u64)) -> Result<Run, String> {
    let run = |keyed: &dyn Keyed, workers_cpu: fn() -> Option<Duration>| {
        let body = |i, gate: &Gate| thread_share(keyed, (i, gate), config);
        parallel::on_threads(config.1, workers_cpu, body, |_| Ok(None))
    };
    let (workers, none): (fn() -> _, fn() -> _) = (engine::workers_cpu_time, || None);
    match subject {
        Subject::Keyed => run(&keyed::keyed_timers(&engine::build(false)?), workers),
        Subject::MutexMap => run(&MutexMap::new(&engine::build(false)?), workers),
        Subject::DelayQueueMap => {
            let (runtime, queue) = (crate::peers::runtime()?, DelayQueueMap::default());
            // Every thread inserts into the queue, which needs the runtime's context.
            let body = |index, gate: &Gate| {
                let _context = runtime.enter();
                thread_share(&queue, (index, gate), config)
            };
            parallel::on_threads(config.1, none, body, |_| Ok(None))
        }
        Subject::Dashmap => run(&DashMapOnly::default(), none),
        Subject::Scc => run(&SccOnly::default(), none),
        _ => Err(format!("{} is not a keyed subject", subject.name())),
    }
}

pub fn run(workload: Workload, plan: &Plan, ops: u64, out: &mut Out) {
    let config = |cell: &Cell| (workload, cell.threads, ops);
    let results = parallel::measure(plan, |_| ops, |cell| measure(cell.subject, config(cell)));
    let cells: Vec<_> = plan.cells.iter().zip(&results).collect();
    let (unit, operation) = match workload {
        Workload::KeyedSetRemove => (
            "op",
            "op = set a new key (30 s) and remove the key this thread set 16 operations earlier",
        ),
        Workload::KeyedSetOver => (
            "set",
            "set = set a random one of the thread's 10,000 pending keys again: a new value and a deadline 30 s from now",
        ),
        _ => (
            "move",
            "move = move a random one of the thread's 10,000 pending keys to 30 s from now",
        ),
    };
    let name = workload.name();
    let title = format!(
        "{name} ({} operations per run over the threads; deadlines 30 s out, nothing due)",
        thousands(ops)
    );
    let too_late = "not pending when came back to";
    let mut sheet = threads_sheet((name, title), (unit, ops), too_late, &cells);
    sheet.note(operation);
    sheet.note("keyed: corewheel::KeyedTimers<u64, u64> on a TimerEngine (dashmap underneath); mutex-map: a Mutex<HashMap<key, (value, TimerHandle)>> over the same engine, its callbacks removing their key under the lock; delay-queue-map: tokio-util's DelayQueue with a HashMap<key, delay_queue::Key>, both behind one Mutex (a new value is a remove and an insert: the queue cannot replace one in place)");
    sheet.note("dashmap, scc: the map operations KeyedTimers does (entry upsert, get_mut, remove) on a 24-byte slot, with no timer: to choose the map, and to show what the timers add over it (dashmap with KeyedTimers' 16 shards per CPU)");
    sheet.finish(&mut out.csv);
}
