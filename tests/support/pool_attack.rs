//! What the tests of the node pool share (`engine/pool_bitmap.rs`, `engine/pool_growth.rs`,
//! `wheel/eight_lists_per_slot.rs`): the pool's sizes as the public API shows them, engines
//! to attack, and a record of what became of each timer of a real-clock race.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use corewheel::{ManualClock, PendingTimers, ScheduleError, TimerEngine, TimerHandle};

use super::{Live, Rng, within};

/// Nodes carved at a time: the smallest capacity a pool may have, and its unit of growth.
pub const CHUNK: usize = 1024;

/// Bytes of one timer node (`stats().pool_bytes` counts carved nodes of this size).
pub const NODE_BYTES: usize = 64;

/// How long any one test may take before it counts as hung.
pub const LIMIT: Duration = Duration::from_secs(60);

/// The generation and the node index a handle names, read from its `Debug` output
/// (`TimerHandle { place: .., slot: generation << 32 | index }`).
pub fn slot(handle: TimerHandle) -> (u32, u32) {
    let text = format!("{handle:?}");
    let slot: u64 = text
        .split("slot: ")
        .nth(1)
        .and_then(|rest| rest.trim_end_matches(['}', ' ']).parse().ok())
        .unwrap_or_else(|| panic!("a handle's Debug names its slot: {text}"));
    ((slot >> 32) as u32, slot as u32)
}

/// Nodes the engine's pools have carved.
pub fn pool_nodes(engine: &TimerEngine) -> usize {
    engine.stats().pool_bytes / NODE_BYTES
}

/// A hand-driven engine of one shard with a pool of `capacity` nodes.
pub fn manual_engine(capacity: usize) -> (TimerEngine, ManualClock) {
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(1)
        .capacity(capacity)
        .manual_clock(clock.clone())
        .build()
        .expect("a manual engine");
    (engine, clock)
}

/// A real-clock engine of `workers` unpinned workers with pools of `capacity` nodes.
pub fn real_engine(workers: usize, capacity: usize) -> Arc<TimerEngine> {
    Arc::new(
        TimerEngine::builder()
            .workers(workers)
            .pin_workers(false)
            .capacity(capacity)
            .build()
            .expect("a real-clock engine"),
    )
}

/// Arms timers of `delay` from a thread of its own (one with no magazine yet) until the
/// pool says it is full; how many it armed. A pool whose nodes have all come back arms
/// exactly its capacity.
pub fn arm_until_full(engine: &Arc<TimerEngine>, delay: Duration) -> usize {
    let engine = Arc::clone(engine);
    within(LIMIT, "arming until full", move || {
        let mut armed = 0;
        loop {
            match engine.schedule(delay, || {}) {
                Ok(_) => armed += 1,
                Err(ScheduleError::Capacity) => return armed,
                Err(other) => panic!("arming until full: {other:?}"),
            }
        }
    })
}

/// What became of each timer of a real-clock race: runs, early runs, cancels that won.
pub struct Outcomes {
    pub ran: Vec<AtomicU8>,
    pub cancelled: Vec<AtomicU8>,
    pub early: AtomicUsize,
}

impl Outcomes {
    pub fn new(timers: usize) -> Arc<Self> {
        Arc::new(Self {
            ran: (0..timers).map(|_| AtomicU8::new(0)).collect(),
            cancelled: (0..timers).map(|_| AtomicU8::new(0)).collect(),
            early: AtomicUsize::new(0),
        })
    }

    /// Whether timer `id` is over: it ran, or a cancel won.
    pub fn settled(&self, id: usize) -> bool {
        self.ran[id].load(Ordering::SeqCst) + self.cancelled[id].load(Ordering::SeqCst) > 0
    }

    /// Checks that each of the first `armed` timers ran exactly once or was cancelled and
    /// never ran, and none ran early.
    pub fn check(&self, armed: usize) {
        assert_eq!(self.early.load(Ordering::SeqCst), 0, "timers ran early");
        for id in 0..armed {
            let (ran, cancelled) = (
                self.ran[id].load(Ordering::SeqCst),
                self.cancelled[id].load(Ordering::SeqCst),
            );
            assert!(
                (ran, cancelled) == (1, 0) || (ran, cancelled) == (0, 1),
                "timer {id}: ran {ran} times, cancelled {cancelled}"
            );
        }
    }

    /// After a shutdown racing the first `ids` timers: none ran twice, none both ran and
    /// was cancelled, and, where the shutdown dropped pending timers rather than running
    /// them (which runs them before their deadlines), none ran early.
    pub fn check_after_shutdown(&self, ids: usize, pending: PendingTimers) {
        if pending == PendingTimers::Drop {
            assert_eq!(self.early.load(Ordering::SeqCst), 0, "ran early");
        }
        for id in 0..ids {
            let (ran, cancelled) = (
                self.ran[id].load(Ordering::SeqCst),
                self.cancelled[id].load(Ordering::SeqCst),
            );
            assert!(
                ran + cancelled <= 1,
                "timer {id}: ran {ran}, cancelled {cancelled}"
            );
        }
    }

    /// A callback for timer `id` armed now with `delay`, counting its run and whether it
    /// ran early.
    pub fn callback(
        self: &Arc<Self>,
        id: usize,
        delay: Duration,
        live: &Live,
    ) -> impl FnOnce() + Send + 'static {
        let (o, witness, armed_at) = (Arc::clone(self), live.witness(), Instant::now());
        move || {
            let _witness = &witness;
            if Instant::now() < armed_at + delay {
                o.early.fetch_add(1, Ordering::SeqCst);
            }
            o.ran[id].fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// How one racing thread arms: its random seed, its timers' longest delay, and whether a
/// shutdown error is expected (a shutdown races it).
#[derive(Clone, Copy)]
pub struct ArmShape {
    pub seed: u64,
    pub most_delay: Duration,
    pub shutdown_ok: bool,
}

/// One thread's part of a real-clock race: arms timers of up to `shape.most_delay` with ids
/// from `next`, cancelling a random recent one 40% of the time, until `stop`. Every
/// schedule succeeds or is a capacity error (or, with `shutdown_ok`, a shutdown error);
/// one refused counts as cancelled, so that every id is accounted for. Returns its handles
/// and its capacity errors.
pub fn race_arms(
    engine: &TimerEngine,
    outcomes: &Arc<Outcomes>,
    (next, stop): (&AtomicUsize, &AtomicBool),
    shape: ArmShape,
    live: &Live,
) -> (Vec<TimerHandle>, usize) {
    let mut rng = Rng(shape.seed);
    let most_us = u64::try_from(shape.most_delay.as_micros()).unwrap_or(u64::MAX);
    let mut handles = Vec::new();
    let mut recent: Vec<(usize, TimerHandle)> = Vec::new();
    let mut full = 0;
    while !stop.load(Ordering::Relaxed) {
        let id = next.fetch_add(1, Ordering::Relaxed);
        if id >= outcomes.ran.len() {
            break;
        }
        let delay = Duration::from_micros(rng.below(most_us));
        match engine.schedule(delay, outcomes.callback(id, delay, live)) {
            Ok(handle) => {
                handles.push(handle);
                recent.push((id, handle));
                if recent.len() > 64 {
                    recent.remove(0);
                }
            }
            Err(ScheduleError::Capacity) => {
                outcomes.cancelled[id].store(1, Ordering::SeqCst);
                full += 1;
            }
            Err(ScheduleError::Shutdown) if shape.shutdown_ok => {
                outcomes.cancelled[id].store(1, Ordering::SeqCst);
            }
            Err(other) => panic!("schedule failed with {other:?}"),
        }
        if rng.percent(40) && !recent.is_empty() {
            let (id, handle) = recent.swap_remove(rng.below(recent.len() as u64) as usize);
            if engine.cancel(handle) {
                outcomes.cancelled[id].fetch_add(1, Ordering::SeqCst);
            }
        }
        if rng.percent(2) {
            std::thread::yield_now();
        }
    }
    (handles, full)
}
