//! Helpers for tests of owners stuck in callbacks, on the real clock: a gate that blocks
//! callbacks, engines of unpinned workers, and threads whose timers go to a chosen shard.

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use corewheel::TimerEngine;

/// How long these helpers wait for a job or a callback to report in.
const WAIT: Duration = Duration::from_secs(20);

/// Blocks the callbacks that wait on it until opened (or two minutes pass, so that a
/// failing test never leaves a worker blocked for ever).
#[derive(Clone, Default)]
pub struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    pub fn wait(&self) {
        let (open, changed) = &*self.0;
        let guard = open.lock().unwrap();
        let _ = changed
            .wait_timeout_while(guard, Duration::from_secs(120), |open| !*open)
            .unwrap();
    }

    pub fn open(&self) {
        let (open, changed) = &*self.0;
        *open.lock().unwrap() = true;
        changed.notify_all();
    }
}

/// Opens its gate when dropped, so that a panicking test still releases its workers.
pub struct OpenOnDrop(pub Gate);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// A real-clock engine of `workers` unpinned workers with the given rescue setting.
pub fn engine(workers: usize, rescue: Option<u32>) -> Arc<TimerEngine> {
    Arc::new(
        TimerEngine::builder()
            .workers(workers)
            .pin_workers(false)
            .rescue_after(rescue)
            .build()
            .unwrap(),
    )
}

/// The index of the worker running the calling code (`corewheel-N`), if it is one.
pub fn worker_index() -> Option<usize> {
    std::thread::current()
        .name()?
        .strip_prefix("corewheel-")?
        .parse()
        .ok()
}

/// The shard the calling thread's timers go to: the one whose pending count a probe
/// raises. Call it while no timer of `engine` is due.
pub fn home_of(engine: &TimerEngine) -> usize {
    let before = engine.stats();
    let probe = engine.schedule(Duration::from_secs(3600), || {}).unwrap();
    let after = engine.stats();
    assert!(engine.cancel(probe));
    (0..after.shards.len())
        .find(|&shard| after.shards[shard].pending > before.shards[shard].pending)
        .expect("the probe is pending somewhere")
}

pub type Job = Box<dyn FnOnce() + Send>;

/// One thread per shard whose timers go to that shard, running the jobs sent to it. Threads
/// are given homes in turn, so a few rounds cover every shard. Each holds the engine only
/// until it knows its home.
pub fn agents(engine: &Arc<TimerEngine>) -> Vec<mpsc::Sender<Job>> {
    let shards = engine.workers();
    let mut by_shard: Vec<Option<mpsc::Sender<Job>>> = vec![None; shards];
    for _ in 0..8 * shards {
        if by_shard.iter().all(Option::is_some) {
            break;
        }
        let (jobs, job_rx) = mpsc::channel::<Job>();
        let (home_tx, home_rx) = mpsc::channel();
        let engine = Arc::clone(engine);
        std::thread::spawn(move || {
            home_tx.send(home_of(&engine)).unwrap();
            drop(engine);
            for job in job_rx {
                job();
            }
        });
        let home = home_rx.recv().unwrap();
        by_shard[home].get_or_insert(jobs);
    }
    by_shard
        .into_iter()
        .map(|agent| agent.expect("an agent for every shard"))
        .collect()
}

/// Runs `job` on `agent`'s thread and waits for it.
pub fn on_agent<R: Send + 'static>(
    agent: &mpsc::Sender<Job>,
    job: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (done, result) = mpsc::channel();
    agent
        .send(Box::new(move || {
            let _ = done.send(job());
        }))
        .unwrap();
    result.recv_timeout(WAIT).expect("the agent ran the job")
}

/// A callback that reports which worker runs it, then blocks on `gate`.
pub fn blocking(
    gate: &Gate,
    started: &mpsc::Sender<Option<usize>>,
) -> impl FnOnce() + Send + 'static {
    let (gate, started) = (gate.clone(), started.clone());
    move || {
        let _ = started.send(worker_index());
        gate.wait();
    }
}

/// Waits for a blocking callback to report in with the worker that runs it.
pub fn started(rx: &mpsc::Receiver<Option<usize>>, what: &str) -> Option<usize> {
    rx.recv_timeout(WAIT)
        .unwrap_or_else(|_| panic!("{what} never ran"))
}

/// Blocks the owner of the calling thread's shard, A, on `owner` in a callback due 100 ms
/// from now, and the worker that stands in for it on `stand_in` in A's next callback, due
/// 30 ms later; returns once both have reported in on `started`, with the workers that
/// run them (the second is never A's owner).
pub fn block_owner_and_stand_in(
    engine: &TimerEngine,
    (owner, stand_in): (&Gate, &Gate),
    (started_tx, started_rx): (&mpsc::Sender<Option<usize>>, &mpsc::Receiver<Option<usize>>),
) -> (Option<usize>, Option<usize>) {
    let t0 = std::time::Instant::now() + Duration::from_millis(100);
    for (due, gate) in [(t0, owner), (t0 + Duration::from_millis(30), stand_in)] {
        engine.schedule_at(due, blocking(gate, started_tx)).unwrap();
    }
    let a = started(started_rx, "A's blocking callback");
    let w = started(started_rx, "the stand-in's blocking callback");
    assert_ne!(a, w, "a stand-in ran A's second callback");
    (a, w)
}
