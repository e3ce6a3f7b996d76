//! steady-mix: a proxy's timers at a sustained rate. A million timers live, and for a fixed
//! time (10 s by default) T application threads keep arming new ones at an offered rate,
//! 90% of them request timeouts that are cancelled when the response comes and 10% that
//! fire. The figure that matters is the CPU each subject spends per timer at the same load,
//! every thread of the process included (the engine's workers, tokio's workers and driver,
//! the heap's timer thread); the achieved rate shows whether it kept up.
//!
//! Each thread owns a ring of slots, one live timer each, and visits the slots in turn at
//! its share of the rate, so that every slot comes round once a ring period (about 1 s at
//! the defaults). At its turn a slot's timer is retired and a new one armed in its place:
//! - a timer meant to be cancelled (delay a ring period plus 1..30 s) is cancelled, as its
//!   response has arrived; finding it fired means the thread fell a whole period behind;
//! - a timer meant to fire (delay 1 ms..half a ring period) must have fired by then; one
//!   still pending 50 ms or more after its deadline is late, and counted.
//!
//! Threads pace themselves in steps of 1 ms, sleeping in between (a thread sleep, or
//! tokio's `sleep` for tokio's tasks), and catch up on what a late wake-up left.

use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;
use std::time::{Duration, Instant};

use corewheel::WorkerWakes;
use tokio::time::Sleep;

use crate::cpu_time::{cpu_between, process_context_switches, process_cpu_time};
use crate::peers::engine;
use crate::peers::mutex_heap::SharedHeap;
use crate::peers::tokio_sleep::{self, StartLine, register};
use crate::peers::{SharedTimers, Subject};
use crate::repeat;
use crate::report::{Csv, CsvRow, RATIO_LEGEND, Table, ratio_cells, thousands};
use crate::rng::XorShift64;
use crate::workloads::parallel::share_of;
use crate::workloads::wake_floor;
use crate::workloads::{ratio_columns, ratio_headers};

pub const NAME: &str = "steady-mix";

/// The same mix at light load: a thousand and ten thousand timers a second, each rate
/// with about a second's worth of timers live, to show what the timers cost a process
/// that has little for them to do.
pub const LIGHT_NAME: &str = "light-load";

/// light-load's rates, timers armed per second.
pub const LIGHT_RATES: [u64; 2] = [1_000, 10_000];

/// Timers armed per second, all threads together, unless `--mix-rate` says otherwise.
pub const DEFAULT_RATE: u64 = 1_000_000;

/// How long the mix runs, unless `--mix-seconds` says otherwise.
pub const DEFAULT_SECONDS: u64 = 10;

/// One in this many timers is left to fire.
const FIRE_ONE_IN: u64 = 10;

/// How often a thread wakes to arm what its share of the rate asks for.
const STEP: Duration = Duration::from_millis(1);

/// A firing timer still pending this long after its deadline, at its slot's turn, is late.
const LATE: Duration = Duration::from_millis(50);

/// The shape of one run.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub threads: usize,
    /// Timers live at once, all threads together.
    pub live: u64,
    /// Timers armed per second, all threads together.
    pub rate: u64,
    pub duration: Duration,
}

impl Config {
    /// Slots per ring, all threads together, so that about `live` timers are pending: every
    /// slot but those whose firing timer has already fired. A firing timer lives a quarter
    /// of the ring period on average, so a slot is pending 90% + 10% / 4 of the time.
    fn slots(self) -> u64 {
        let pending_share = 1.0 - 0.75 / FIRE_ONE_IN as f64;
        (self.live as f64 / pending_share).round() as u64
    }

    /// The slots of thread `index`'s ring.
    fn ring_slots(self, index: usize) -> usize {
        share_of(self.slots(), self.threads, index).max(1) as usize
    }
}

/// One thread's part of a run: its ring, its rate, and what happened at its slots' turns.
struct Ring {
    rng: XorShift64,
    /// Whether each slot's timer is meant to fire (else to be cancelled).
    fires: Vec<bool>,
    /// Each firing timer's deadline, on the ring's schedule: the time since the run's start
    /// at which its turn was due, plus its delay (kept for firing timers only, the ones
    /// judged late or not). The thread arms no earlier than its schedule,
    /// so the real deadline is no earlier either, and lateness judged by this is never
    /// overstated.
    due: Vec<Duration>,
    /// Slot visits per second.
    rate: f64,
    /// How long a slot takes to come round.
    period: Duration,
    counts: Counts,
}

/// What a thread's slots' turns found, summed over the threads.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    /// Timers armed, the ring's first fill included.
    armed: u64,
    /// Timed turns: a timer retired and a new one armed.
    turns: u64,
    /// Cancels that stopped their timer.
    cancelled: u64,
    /// Timers meant to be cancelled that had fired by their turn.
    fired_before_cancel: u64,
    /// Timers meant to fire that had fired by their turn.
    fired: u64,
    /// Timers meant to fire still pending at their turn (cancelled then), `LATE` or more
    /// after their deadline...
    late: u64,
    /// ... or less.
    not_yet_fired: u64,
    /// After the run, the timers still in the rings: cancelled, or found fired.
    left_cancelled: u64,
    left_fired: u64,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.armed += other.armed;
        self.turns += other.turns;
        self.cancelled += other.cancelled;
        self.fired_before_cancel += other.fired_before_cancel;
        self.fired += other.fired;
        self.late += other.late;
        self.not_yet_fired += other.not_yet_fired;
        self.left_cancelled += other.left_cancelled;
        self.left_fired += other.left_fired;
    }

    /// Every cancel that stopped a timer, and every timer that fired.
    fn stopped_and_fired(&self) -> (u64, u64) {
        (
            self.cancelled + self.late + self.not_yet_fired + self.left_cancelled,
            self.fired + self.fired_before_cancel + self.left_fired,
        )
    }
}

/// One slot-holding subject, as a ring drives it.
trait Slots {
    /// Arms a timer in the empty `slot`.
    fn arm(&mut self, slot: usize, delay: Duration, id: u64) -> Result<(), String>;

    /// Cancels the slot's timer: `true` if it was pending and is now stopped, `false` if it
    /// had fired. The slot is empty afterwards.
    fn cancel(&mut self, slot: usize) -> bool;

    /// Number of slots.
    fn len(&self) -> usize;
}

impl Ring {
    fn new(index: usize, config: Config) -> Self {
        let slots = config.ring_slots(index);
        let rate = (share_of(config.rate, config.threads, index).max(1)) as f64;
        Self {
            rng: XorShift64::new(XorShift64::SEED ^ (index as u64 + 11).wrapping_mul(0x9E37_79B9)),
            fires: vec![false; slots],
            due: vec![Duration::ZERO; slots],
            rate,
            period: Duration::from_secs_f64(slots as f64 / rate),
            counts: Counts::default(),
        }
    }

    /// A new timer's fate and delay.
    fn draw(&mut self) -> (bool, Duration) {
        let period = self.period.as_nanos() as u64;
        if self.rng.below(FIRE_ONE_IN) == 0 {
            (
                true,
                Duration::from_nanos(self.rng.between(1_000_000, period / 2 + 1_000_001)),
            )
        } else {
            let extra = self.rng.between(1_000_000_000, 30_000_000_000);
            (false, Duration::from_nanos(period + extra))
        }
    }

    /// Arms every slot before the run, so that it starts in its steady state: a request
    /// timeout is due after its slot's first turn as usual, and a firing timer somewhere
    /// between the start and that turn.
    fn fill<S: Slots>(&mut self, slots: &mut S) -> Result<(), String> {
        for slot in 0..slots.len() {
            let (fires, delay) = self.draw();
            let first_turn = self.turn_time(slot as u64);
            let delay = if fires {
                first_turn.mul_f64(self.rng.below(1 << 20) as f64 / (1 << 20) as f64)
            } else {
                first_turn + delay
            };
            slots.arm(slot, delay, slot as u64)?;
            self.fires[slot] = fires;
            self.due[slot] = delay;
            self.counts.armed += 1;
        }
        Ok(())
    }

    /// When turn `turn` is due, counted from the run's start.
    fn turn_time(&self, turn: u64) -> Duration {
        Duration::from_secs_f64(turn as f64 / self.rate)
    }

    /// Takes turns until `elapsed` of the run's time has had its share of them.
    fn catch_up<S: Slots>(&mut self, slots: &mut S, elapsed: Duration) -> Result<(), String> {
        let due = (elapsed.as_secs_f64() * self.rate) as u64;
        let len = slots.len() as u64;
        while self.counts.turns < due {
            let slot = (self.counts.turns % len) as usize;
            let turn = self.counts.turns;
            let pending = slots.cancel(slot);
            // Only a firing timer still pending needs its turn's time.
            let is_late =
                self.fires[slot] && pending && self.turn_time(turn) >= self.due[slot] + LATE;
            let counts = &mut self.counts;
            match (self.fires[slot], pending) {
                (true, true) if is_late => counts.late += 1,
                (true, true) => counts.not_yet_fired += 1,
                (true, false) => counts.fired += 1,
                (false, true) => counts.cancelled += 1,
                (false, false) => counts.fired_before_cancel += 1,
            }
            let (fires, delay) = self.draw();
            slots.arm(slot, delay, self.counts.armed)?;
            self.fires[slot] = fires;
            if fires {
                self.due[slot] = self.turn_time(turn) + delay;
            }
            self.counts.armed += 1;
            self.counts.turns += 1;
        }
        Ok(())
    }

    /// Cancels what the ring still holds, after the timed part.
    fn empty<S: Slots>(&mut self, slots: &mut S) {
        for slot in 0..slots.len() {
            if slots.cancel(slot) {
                self.counts.left_cancelled += 1;
            } else {
                self.counts.left_fired += 1;
            }
        }
    }
}

/// The slots of a structure the threads share: a handle each, `None` while empty.
struct SharedSlots<'a, S: SharedTimers> {
    subject: &'a S,
    handles: Vec<Option<S::Handle>>,
}

impl<'a, S: SharedTimers> SharedSlots<'a, S> {
    fn new(subject: &'a S, slots: usize) -> Self {
        Self {
            subject,
            handles: vec![None; slots],
        }
    }
}

impl<S: SharedTimers> Slots for SharedSlots<'_, S> {
    fn arm(&mut self, slot: usize, delay: Duration, id: u64) -> Result<(), String> {
        self.handles[slot] = Some(self.subject.arm(delay, id)?);
        Ok(())
    }

    fn cancel(&mut self, slot: usize) -> bool {
        self.handles[slot]
            .take()
            .is_some_and(|handle| self.subject.cancel(handle))
    }

    fn len(&self) -> usize {
        self.handles.len()
    }
}

/// tokio's slots: a pinned `Option<Sleep>` each, reused, so that arming writes a new
/// `Sleep` over the empty slot without an allocation. Lives for one poll of its task.
struct TokioSlots<'a, 'b, 'c> {
    sleeps: &'a mut [Pin<Box<Option<Sleep>>>],
    cx: &'b mut Context<'c>,
}

impl Slots for TokioSlots<'_, '_, '_> {
    fn arm(&mut self, slot: usize, delay: Duration, _id: u64) -> Result<(), String> {
        let sleep = &mut self.sleeps[slot];
        sleep.as_mut().set(Some(tokio::time::sleep(delay)));
        if let Some(timer) = sleep.as_mut().as_pin_mut() {
            register(timer, self.cx);
        }
        Ok(())
    }

    fn cancel(&mut self, slot: usize) -> bool {
        let sleep = &mut self.sleeps[slot];
        let pending = sleep
            .as_ref()
            .get_ref()
            .as_ref()
            .is_some_and(|s| !s.is_elapsed());
        sleep.as_mut().set(None);
        pending
    }

    fn len(&self) -> usize {
        self.sleeps.len()
    }
}

/// One run's figures.
struct Run {
    /// From the start line to the last thread's end of its timed part.
    wall: Duration,
    cpu: Option<Duration>,
    /// The process's context switches over the same span.
    switches: Option<u64>,
    /// The engine's worker wake-ups over the same span, by cause (the engine only).
    wakes: Option<WorkerWakes>,
    counts: Counts,
}

/// What the main thread reads over a run's timed part.
struct Timed {
    wall: Duration,
    cpu: Option<Duration>,
    switches: Option<u64>,
    wakes: Option<WorkerWakes>,
}

/// Reads a subject's own count of its threads' wake-ups, where it keeps one.
type WakesReader<'a> = &'a (dyn Fn() -> Option<WorkerWakes> + Sync);

/// For subjects that keep no count of their wake-ups.
const NO_WAKES: WakesReader<'static> = &|| None;

/// The engine's count of its workers' wake-ups.
fn engine_wakes(engine: &corewheel::TimerEngine) -> Option<WorkerWakes> {
    Some(engine.stats().total.wakes)
}

/// `after - before`, cause by cause.
fn wakes_between(before: WorkerWakes, after: WorkerWakes) -> WorkerWakes {
    WorkerWakes {
        due: after.due - before.due,
        wheel: after.wheel - before.wheel,
        lane: after.lane - before.lane,
        watch: after.watch - before.watch,
        woken: after.woken - before.woken,
    }
}

/// The start and end lines of a run, and the readings the main thread takes at them.
#[derive(Default)]
struct Lines {
    start: StartLine,
    end: StartLine,
}

impl Lines {
    /// Called by the main thread: starts the run, waits out its time, and reads the CPU
    /// the process used from the start to the moment every thread has finished.
    fn time_run(
        &self,
        threads: usize,
        duration: Duration,
        wakes: WakesReader,
    ) -> Result<Timed, String> {
        self.start.gather(threads)?;
        let cpu_before = process_cpu_time();
        let switches_before = process_context_switches();
        let wakes_before = wakes();
        let start = self.start.go();
        std::thread::sleep(duration);
        self.end.gather(threads)?;
        let cpu = cpu_between(cpu_before, process_cpu_time());
        let switches = process_context_switches()
            .zip(switches_before)
            .map(|(after, before)| after.saturating_sub(before));
        let wakes = wakes()
            .zip(wakes_before)
            .map(|(after, before)| wakes_between(before, after));
        let end = self.end.go();
        Ok(Timed {
            wall: end - start,
            cpu,
            switches,
            wakes,
        })
    }
}

/// A plain thread's part on a subject shared by plain threads.
fn thread_part<S: Slots>(
    slots: &mut S,
    index: usize,
    config: Config,
    lines: &Lines,
) -> Result<Counts, String> {
    let mut ring = Ring::new(index, config);
    let start = ring.start(slots, lines)?;
    while ring.step(slots, start, config.duration)? {
        std::thread::sleep(STEP);
    }
    ring.finish(slots, lines)
}

impl Ring {
    /// Fills the ring, then waits at the start line: the timed part begins as this returns,
    /// at the instant it returns.
    fn start<S: Slots>(&mut self, slots: &mut S, lines: &Lines) -> Result<Instant, String> {
        let filled = self.fill(slots);
        if !lines.start.arrive_and_wait() {
            return Err("the run was called off".to_string());
        }
        filled?;
        Ok(Instant::now())
    }

    /// One step of the timed part: the turns the schedule asks for by now. `false` once
    /// the run's time is up.
    fn step<S: Slots>(
        &mut self,
        slots: &mut S,
        start: Instant,
        duration: Duration,
    ) -> Result<bool, String> {
        let elapsed = start.elapsed();
        if elapsed >= duration {
            return Ok(false);
        }
        self.catch_up(slots, elapsed)?;
        Ok(true)
    }

    /// Waits at the end line, then retires what is left.
    fn finish<S: Slots>(mut self, slots: &mut S, lines: &Lines) -> Result<Counts, String> {
        if !lines.end.arrive_and_wait() {
            return Err("the run was called off".to_string());
        }
        self.empty(slots);
        Ok(self.counts)
    }
}

/// Runs `part(index, lines)` on `threads` plain threads and times the run.
fn on_plain_threads(
    config: Config,
    wakes: WakesReader,
    part: impl Fn(usize, &Lines) -> Result<Counts, String> + Sync,
) -> Result<Run, String> {
    let lines = Lines::default();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..config.threads)
            .map(|index| {
                let (part, lines) = (&part, &lines);
                scope.spawn(move || part(index, lines))
            })
            .collect();
        let timed = lines.time_run(config.threads, config.duration, wakes);
        let mut counts = Counts::default();
        for handle in handles {
            let part = handle
                .join()
                .unwrap_or_else(|_| Err("an application thread panicked".to_string()))?;
            counts.add(&part);
        }
        let Timed {
            wall,
            cpu,
            switches,
            wakes,
        } = timed?;
        Ok(Run {
            wall,
            cpu,
            switches,
            wakes,
            counts,
        })
    })
}

fn run_engine(config: Config) -> Result<Run, String> {
    let engine = engine::build()?;
    let run = on_plain_threads(config, &|| engine_wakes(&engine), |index, lines| {
        let mut slots = SharedSlots::new(&engine, config.ring_slots(index));
        thread_part(&mut slots, index, config, lines)
    })?;
    engine_saw(&engine, run)
}

/// The run, once the engine has settled, if its counts match what the rings saw, timer
/// for timer: exactly once.
fn engine_saw(engine: &corewheel::TimerEngine, run: Run) -> Result<Run, String> {
    let settled = engine::settle(engine)?;
    let (stopped, fired) = run.counts.stopped_and_fired();
    engine::check_counts(&settled.stats, run.counts.armed, stopped, fired)?;
    Ok(run)
}

fn run_mutex_heap(config: Config) -> Result<Run, String> {
    let heap = SharedHeap::start()?;
    let run = on_plain_threads(config, NO_WAKES, |index, lines| {
        let mut slots = SharedSlots::new(&heap, config.ring_slots(index));
        thread_part(&mut slots, index, config, lines)
    })?;
    heap_saw(&heap, run)
}

/// The run, if the heap's timer thread fired exactly the timers the rings saw fire.
fn heap_saw(heap: &SharedHeap, run: Run) -> Result<Run, String> {
    let (_, fired) = run.counts.stopped_and_fired();
    if heap.fired() != fired {
        return Err(format!(
            "the heap fired {} timers, the rings saw {fired} fire",
            heap.fired()
        ));
    }
    Ok(run)
}

/// One tokio task's part: the same ring, its turns taken in one poll per step.
async fn tokio_part(index: usize, config: Config, lines: Arc<Lines>) -> Result<Counts, String> {
    let mut ring = Ring::new(index, config);
    let mut sleeps: Vec<Pin<Box<Option<Sleep>>>> = (0..config.ring_slots(index))
        .map(|_| Box::pin(None))
        .collect();
    let filled = tokio_sleep::with_context(|cx| {
        ring.fill(&mut TokioSlots {
            sleeps: &mut sleeps,
            cx,
        })
    })
    .await;
    if !lines.start.arrive_and_wait_yielding().await {
        return Err("the run was called off".to_string());
    }
    filled?;
    let start = Instant::now();
    loop {
        let elapsed = start.elapsed();
        if elapsed >= config.duration {
            break;
        }
        tokio_sleep::with_context(|cx| {
            ring.catch_up(
                &mut TokioSlots {
                    sleeps: &mut sleeps,
                    cx,
                },
                elapsed,
            )
        })
        .await?;
        tokio::time::sleep(STEP).await;
    }
    if !lines.end.arrive_and_wait_yielding().await {
        return Err("the run was called off".to_string());
    }
    tokio_sleep::with_context(|cx| {
        ring.empty(&mut TokioSlots {
            sleeps: &mut sleeps,
            cx,
        })
    })
    .await;
    Ok(ring.counts)
}

fn run_tokio(config: Config) -> Result<Run, String> {
    on_tokio(config, NO_WAKES, |index, lines| {
        tokio_part(index, config, lines)
    })
}

/// Runs `part(index, lines)` as one task per thread on a tokio runtime of `threads`
/// workers, and times the run.
fn on_tokio<F>(
    config: Config,
    wakes: WakesReader,
    part: impl Fn(usize, Arc<Lines>) -> F,
) -> Result<Run, String>
where
    F: std::future::Future<Output = Result<Counts, String>> + Send + 'static,
{
    on_runtime(tokio_sleep::runtime(config.threads)?, config, wakes, part)
}

/// [`on_tokio`] on a runtime the caller made (and spawned its own tasks on).
fn on_runtime<F>(
    runtime: tokio::runtime::Runtime,
    config: Config,
    wakes: WakesReader,
    part: impl Fn(usize, Arc<Lines>) -> F,
) -> Result<Run, String>
where
    F: std::future::Future<Output = Result<Counts, String>> + Send + 'static,
{
    let lines = Arc::new(Lines::default());
    // One task at a time, each once the one before waits at the start line, so that each
    // starts on a worker of its own: spawned together, two could land on one worker, and
    // the other, back asleep, might not steal the second while the first spins (runs were
    // called off so). The tasks yield now and then at the lines, so that even then they
    // all arrive.
    let mut handles = Vec::with_capacity(config.threads);
    let mut spawned = Ok(());
    for index in 0..config.threads {
        handles.push(runtime.spawn(part(index, Arc::clone(&lines))));
        spawned = lines.start.gather(index + 1);
        if spawned.is_err() {
            break;
        }
    }
    let timed = spawned.and_then(|()| lines.time_run(config.threads, config.duration, wakes));
    let parts = runtime.block_on(join_all(handles));
    // The main thread's failure first: the tasks' are then only that it called them off.
    let Timed {
        wall,
        cpu,
        switches,
        wakes,
    } = timed?;
    let mut counts = Counts::default();
    for part in parts {
        counts.add(&part?);
    }
    drop(runtime);
    Ok(Run {
        wall,
        cpu,
        switches,
        wakes,
        counts,
    })
}

/// A tokio task's part on a subject shared by the tasks (the engine, the locked heap):
/// [`thread_part`]'s ring, paced by tokio's `sleep` as [`tokio_part`] is, so that the
/// pacing costs every subject the same.
async fn task_part<S: SharedTimers + Send + Sync>(
    subject: Arc<S>,
    index: usize,
    config: Config,
    lines: Arc<Lines>,
) -> Result<Counts, String> {
    let mut slots = SharedSlots::new(&*subject, config.ring_slots(index));
    let mut ring = Ring::new(index, config);
    let filled = ring.fill(&mut slots);
    if !lines.start.arrive_and_wait_yielding().await {
        return Err("the run was called off".to_string());
    }
    filled?;
    let start = Instant::now();
    while ring.step(&mut slots, start, config.duration)? {
        tokio::time::sleep(STEP).await;
    }
    if !lines.end.arrive_and_wait_yielding().await {
        return Err("the run was called off".to_string());
    }
    ring.empty(&mut slots);
    Ok(ring.counts)
}

/// light-load's runs: every subject driven from tokio tasks paced by tokio's `sleep`, as a
/// service on tokio would arm them, so that the application's own wake-ups are the same
/// for all and the difference is the timers'.
fn measure_light(subject: Subject, config: Config) -> Result<Run, String> {
    match subject {
        Subject::Engine => {
            let engine = Arc::new(engine::build()?);
            let shared = Arc::clone(&engine);
            let run = on_tokio(config, &|| engine_wakes(&engine), move |index, lines| {
                task_part(Arc::clone(&shared), index, config, lines)
            })?;
            engine_saw(&engine, run)
        }
        Subject::EngineDriven => {
            let engine = Arc::new(engine::build_driven()?);
            let runtime = tokio_sleep::runtime(config.threads)?;
            for driver in engine.drivers(|at| tokio::time::sleep_until(at.into())) {
                runtime.spawn(driver);
            }
            let shared = Arc::clone(&engine);
            let run = on_runtime(runtime, config, NO_WAKES, move |index, lines| {
                task_part(Arc::clone(&shared), index, config, lines)
            });
            // The runtime, and the drivers with it, are gone: what is left to settle (the
            // last cancels' messages) is turned here.
            let turning = std::sync::atomic::AtomicBool::new(true);
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    while turning.load(std::sync::atomic::Ordering::Relaxed) {
                        engine.turn();
                        std::thread::sleep(Duration::from_millis(1));
                    }
                });
                let saw = run.and_then(|run| engine_saw(&engine, run));
                turning.store(false, std::sync::atomic::Ordering::Relaxed);
                saw
            })
        }
        Subject::TokioSleep => run_tokio(config),
        Subject::MutexHeap => {
            let heap = Arc::new(SharedHeap::start()?);
            let shared = Arc::clone(&heap);
            let run = on_tokio(config, NO_WAKES, move |index, lines| {
                task_part(Arc::clone(&shared), index, config, lines)
            })?;
            heap_saw(&heap, run)
        }
        _ => Err(format!("{} is not a light-load subject", subject.name())),
    }
}

/// Awaits every task, in order.
async fn join_all(
    handles: Vec<tokio::task::JoinHandle<Result<Counts, String>>>,
) -> Vec<Result<Counts, String>> {
    let mut parts = Vec::with_capacity(handles.len());
    for handle in handles {
        parts.push(
            handle
                .await
                .unwrap_or_else(|error| Err(format!("a task failed: {error}"))),
        );
    }
    parts
}

fn measure(subject: Subject, config: Config) -> Result<Run, String> {
    match subject {
        Subject::Engine => run_engine(config),
        Subject::TokioSleep => run_tokio(config),
        Subject::MutexHeap => run_mutex_heap(config),
        _ => Err(format!("{} is not a steady-mix subject", subject.name())),
    }
}

pub fn run(subjects: &[Subject], config: Config, csv: &mut Csv) {
    let plan = Plan {
        measure,
        wake_cost: bare_wake_cost(subjects),
        in_turns: false,
    };
    run_as(NAME, subjects, config, plan, csv);
}

/// What one wake-up of a thread that does nothing else costs in CPU here, measured when an
/// engine with worker threads is among `subjects` (see [`wake_floor`]): a thread sleeping
/// until each millisecond for two seconds.
fn bare_wake_cost(subjects: &[Subject]) -> Option<Duration> {
    if !subjects.contains(&Subject::Engine) {
        return None;
    }
    crate::progress::step("a bare thread's wake-ups, 1,000 a second (2 s)".to_string());
    wake_floor::sleep_through(Duration::from_millis(1), Duration::from_secs(2)).cpu_per_wake
}

/// light-load: the mix at each of [`LIGHT_RATES`] with about a second's worth of timers
/// live, on `threads` threads; a table per rate.
pub fn run_light(subjects: &[Subject], threads: usize, duration: Duration, csv: &mut Csv) {
    // In turns: the subjects' differences here are a few thousandths of a core, inside what
    // one run moves by from the next on these VMs.
    let plan = Plan {
        measure: measure_light,
        wake_cost: bare_wake_cost(subjects),
        in_turns: true,
    };
    for rate in LIGHT_RATES {
        let config = Config {
            threads,
            live: rate,
            rate,
            duration,
        };
        run_as(LIGHT_NAME, subjects, config, plan, csv);
    }
}

/// How a table's workload measures its subjects.
#[derive(Clone, Copy)]
struct Plan {
    measure: fn(Subject, Config) -> Result<Run, String>,
    /// A bare thread's CPU per wake-up, when measured (see [`bare_wake_cost`]).
    wake_cost: Option<Duration>,
    /// Whether each subject runs [`repeat::RUNS`] times in turns, each run a share of the
    /// duration, and the table shows its median run; otherwise once for the whole duration.
    in_turns: bool,
}

/// The process's CPU time per timer over a run.
fn cpu_per_timer_of(run: &Run) -> Option<f64> {
    Some(run.cpu?.as_nanos() as f64 / run.counts.turns.max(1) as f64)
}

/// The process's CPU time over a run's wall time: the cores it kept busy.
fn cores_busy_of(run: &Run) -> Option<f64> {
    Some(run.cpu?.as_secs_f64() / run.wall.as_secs_f64())
}

/// Each subject's run, or its median run by CPU per timer with the runs' spread, as `plan`
/// says.
fn measure_all(
    name: &str,
    subjects: &[Subject],
    config: Config,
    plan: Plan,
) -> Vec<Result<(Run, Option<String>), String>> {
    let step = |subject: Subject, config: Config| {
        crate::progress::step(format!(
            "{name}/{} ({} threads, {} timers/s, {:.1} s)",
            subject.name(),
            config.threads,
            thousands(config.rate),
            config.duration.as_secs_f64()
        ));
        (plan.measure)(subject, config)
    };
    if !plan.in_turns {
        return subjects
            .iter()
            .map(|&subject| step(subject, config).map(|run| (run, None)))
            .collect();
    }
    repeat::in_turns(subjects, |subject, _| step(subject, config))
        .into_iter()
        .map(|runs| {
            let mut runs = runs?;
            let costs: Vec<f64> = runs.iter().filter_map(cpu_per_timer_of).collect();
            let spread = (costs.len() == runs.len()).then(|| repeat::spread(costs));
            runs.sort_by(|a, b| {
                cpu_per_timer_of(a)
                    .unwrap_or(f64::NAN)
                    .total_cmp(&cpu_per_timer_of(b).unwrap_or(f64::NAN))
            });
            let middle = runs.len() / 2;
            Ok((runs.swap_remove(middle), spread))
        })
        .collect()
}

fn run_as(name: &str, subjects: &[Subject], mut config: Config, plan: Plan, csv: &mut Csv) {
    if plan.in_turns {
        config.duration = (config.duration / repeat::RUNS as u32).max(Duration::from_secs(1));
    }
    let (results, spreads): (Vec<Result<Run, String>>, Vec<Option<String>>) =
        measure_all(name, subjects, config, plan)
            .into_iter()
            .map(|result| match result {
                Ok((run, spread)) => (Ok(run), spread),
                Err(error) => (Err(error), None),
            })
            .unzip();
    let cpu_per_timer: Vec<Option<f64>> = results
        .iter()
        .map(|run| cpu_per_timer_of(run.as_ref().ok()?))
        .collect();
    let cores_busy: Vec<Option<f64>> = results
        .iter()
        .map(|run| cores_busy_of(run.as_ref().ok()?))
        .collect();
    let columns = ratio_columns(subjects);
    let mut table = Table::new(
        format!(
            "{name} ({} threads, {} timers live, {} timers/s offered for {} s{}: 90% cancelled, 10% fired)",
            config.threads,
            thousands(config.live),
            thousands(config.rate),
            format_seconds(config.duration),
            if plan.in_turns {
                format!(", {} runs in turns", repeat::RUNS)
            } else {
                String::new()
            }
        ),
        &[
            "subject",
            "timers/s",
            "CPU ns/timer",
            "CPU cores busy",
            "wakes/s",
            "fired",
            "late",
            "pending at turn",
            "fired before cancel",
        ],
    );
    ratio_headers(&mut table, subjects, &columns);
    for (row, (subject, result)) in subjects.iter().zip(&results).enumerate() {
        let subject_name = subject.name();
        let run = match result {
            Ok(run) => run,
            Err(error) => {
                table.row(vec![subject_name.to_string(), "error".to_string()]);
                table.note(format!("ERROR: {subject_name}: {error}"));
                continue;
            }
        };
        let counts = &run.counts;
        let achieved = counts.turns as f64 / run.wall.as_secs_f64();
        let busy = cores_busy[row];
        let wakes = run
            .switches
            .map(|switches| switches as f64 / run.wall.as_secs_f64());
        let mut cells = vec![
            subject_name.to_string(),
            thousands(achieved as u64),
            cpu_per_timer[row].map_or_else(|| "n/a".to_string(), |ns| format!("{ns:.1}")),
            busy.map_or_else(|| "n/a".to_string(), |busy| format!("{busy:.3}")),
            wakes.map_or_else(|| "n/a".to_string(), |wakes| thousands(wakes as u64)),
            thousands(counts.fired),
            thousands(counts.late),
            thousands(counts.not_yet_fired),
            thousands(counts.fired_before_cancel),
        ];
        cells.extend(ratio_cells(&cpu_per_timer, row, &columns));
        table.row(cells);
        let mut metrics = vec![
            ("timers_per_s", achieved, "1/s"),
            ("offered_timers_per_s", config.rate as f64, "1/s"),
            ("fired", counts.fired as f64, "count"),
            ("fired_late", counts.late as f64, "count"),
            ("pending_at_turn", counts.not_yet_fired as f64, "count"),
            (
                "fired_before_cancel",
                counts.fired_before_cancel as f64,
                "count",
            ),
        ];
        metrics.extend(cpu_per_timer[row].map(|ns| ("cpu_ns_per_timer", ns, "ns")));
        metrics.extend(busy.map(|busy| ("cpu_cores_busy", busy, "cores")));
        metrics.extend(wakes.map(|wakes| ("context_switches_per_s", wakes, "1/s")));
        if let Some(worker) = run.wakes {
            let per_s = |count: u64| count as f64 / run.wall.as_secs_f64();
            let shown = |count: u64| thousands(per_s(count) as u64);
            table.note(format!(
                "{subject_name}: its workers woke {} times a second (stats().total.wakes): {} with timers due, and with none: {} for the wheel, {} for a lane's need, {} to watch for stuck owners, {} woken early by another thread",
                shown(worker.total()),
                shown(worker.due),
                shown(worker.wheel),
                shown(worker.lane),
                shown(worker.watch),
                shown(worker.woken),
            ));
            metrics.extend(
                [
                    ("worker_wakes_per_s", worker.total()),
                    ("worker_wakes_due_per_s", worker.due),
                    ("worker_wakes_wheel_per_s", worker.wheel),
                    ("worker_wakes_lane_per_s", worker.lane),
                    ("worker_wakes_watch_per_s", worker.watch),
                    ("worker_wakes_woken_per_s", worker.woken),
                ]
                .map(|(metric, count)| (metric, per_s(count), "1/s")),
            );
        }
        for (metric, value, unit) in metrics {
            csv.push(CsvRow {
                workload: name.to_string(),
                subject: subject_name.to_string(),
                threads: config.threads as u32,
                timers: config.live,
                metric,
                value,
                unit,
            });
        }
    }
    if plan.in_turns {
        let spreads: Vec<String> = subjects
            .iter()
            .zip(&spreads)
            .filter_map(|(subject, spread)| {
                Some(format!("{} {}", subject.name(), spread.as_ref()?))
            })
            .collect();
        table.note(format!(
            "each row is its subject's median run of {} by CPU ns/timer, the subjects taking turns; CPU ns/timer over the runs: {}",
            repeat::RUNS,
            spreads.join(", ")
        ));
    }
    if let Some(cost) = plan.wake_cost {
        note_wake_floor(&mut table, subjects, (&results, &cores_busy), cost);
    }
    let period = Ring::new(0, config).period;
    table.note(format!(
        "timer = one turn of a ring slot: its timer retired (cancelled, or found fired) and a new one armed; each thread turns its slots at its share of the offered rate, in 1 ms steps, so each slot comes round every P = {:.2} s",
        period.as_secs_f64()
    ));
    table.note("90% of the timers are request timeouts (delay P + 1..30 s), cancelled at their slot's next turn; 10% fire (delay 1 ms..P/2), and must have fired by that turn");
    table.note("CPU ns/timer: process CPU time over the timed part (every thread: application, engine workers, tokio's workers and driver, the heap's timer thread) / timers; CPU cores busy: the same over wall time; wakes/s: the process's context switches per second over the same part, mostly its threads going to sleep and waking (the application threads' own 1 ms steps included)");
    table.note(format!("late: firing timers still pending at their slot's turn, {} ms or more after their deadline; pending at turn: less than that (only first-lap timers can be); fired before cancel: request timeouts that fired before their turn (the thread fell a period behind); late and fired before cancel should be 0", LATE.as_millis()));
    table.note("one run per subject, each with a fresh structure and its first fill untimed; engine: its stats() must match the rings' counts timer for timer; mutex-heap: its timer thread's count of fires must");
    if name == LIGHT_NAME {
        table.note("every subject is driven from tokio tasks on a runtime of as many workers as threads, paced by tokio's sleep, as a service on tokio would arm its timers: the application's own wake-ups cost every subject the same, and the difference is the timers' (the engine's and the heap's own threads included)");
    }
    if !columns.is_empty() {
        table.note(format!("{RATIO_LEGEND}; on CPU ns/timer"));
    }
    table.print();
}

/// Seconds, with a decimal only where the duration has a fraction of one.
fn format_seconds(duration: Duration) -> String {
    if duration.subsec_nanos() == 0 {
        duration.as_secs().to_string()
    } else {
        format!("{:.1}", duration.as_secs_f64())
    }
}

/// Notes what the engine's worker wake-ups cost at a bare thread's `cost` a wake-up, beside
/// the engine's CPU and tokio-sleep's, whose timers fire inside wake-ups its runtime makes
/// anyway. An upper bound: the bare thread wakes an idle core, the dearest wake-up on these
/// VMs, and a worker woken while the application keeps the cores busy costs less.
fn note_wake_floor(
    table: &mut Table,
    subjects: &[Subject],
    (results, cores_busy): (&[Result<Run, String>], &[Option<f64>]),
    cost: Duration,
) {
    let row = |subject: Subject| subjects.iter().position(|&s| s == subject);
    let busy = |subject: Subject| cores_busy[row(subject)?];
    let Some(engine) = row(Subject::Engine) else {
        return;
    };
    let (Ok(run), Some(engine_busy)) = (&results[engine], cores_busy[engine]) else {
        return;
    };
    let Some(wakes) = run.wakes else {
        return;
    };
    let wakes_per_s = wakes.total() as f64 / run.wall.as_secs_f64();
    let in_wakes = wakes_per_s * cost.as_secs_f64();
    let tokio = busy(Subject::TokioSleep)
        .map_or_else(String::new, |tokio| format!(" (tokio-sleep's: {tokio:.3})"));
    table.note(format!(
        "engine: a bare thread's wake-up costs {:.1} us of CPU here (a thread that only sleeps until each millisecond for 2 s, this run, on an idle core: the dearest kind); at that, its workers' {} wake-ups a second cost up to {in_wakes:.3} cores of its {engine_busy:.3}{tokio}",
        cost.as_secs_f64() * 1e6,
        thousands(wakes_per_s as u64),
    ));
}

#[cfg(test)]
mod tests {
    use super::{Config, Ring, Slots};
    use std::time::Duration;

    /// Slots on a virtual clock: every turn is on schedule, and a timer fires exactly at
    /// its deadline.
    struct Recorder {
        rate: f64,
        turns: u64,
        due: Vec<Option<Duration>>,
    }

    impl Recorder {
        fn now(&self) -> Duration {
            Duration::from_secs_f64(self.turns as f64 / self.rate)
        }
    }

    impl Slots for Recorder {
        fn arm(&mut self, slot: usize, delay: Duration, _id: u64) -> Result<(), String> {
            assert!(self.due[slot].is_none(), "armed over a live timer");
            self.due[slot] = Some(self.now() + delay);
            Ok(())
        }

        /// Called once per turn, before that turn's arm.
        fn cancel(&mut self, slot: usize) -> bool {
            let due = self.due[slot].take().expect("a timer in the slot");
            let pending = due > self.now();
            self.turns += 1;
            pending
        }

        fn len(&self) -> usize {
            self.due.len()
        }
    }

    /// A ring keeps its rate and its mix: after 2 s of turns at 1,000 a second it has taken
    /// 2,000, about a tenth of them on firing timers, each armed before its turn.
    #[test]
    fn ring_turns_at_its_rate_with_a_tenth_firing() {
        let config = Config {
            threads: 1,
            live: 900,
            rate: 1_000,
            duration: Duration::from_secs(2),
        };
        let mut ring = Ring::new(0, config);
        let mut slots = Recorder {
            rate: 1_000.0,
            turns: 0,
            due: vec![None; config.slots() as usize],
        };
        ring.fill(&mut slots).expect("filled");
        ring.catch_up(&mut slots, Duration::from_secs(2))
            .expect("turns");
        let counts = ring.counts;
        assert_eq!(counts.turns, 2_000);
        assert_eq!(counts.late + counts.not_yet_fired, 0, "{counts:?}");
        assert_eq!(counts.fired_before_cancel, 0);
        assert!((100..300).contains(&counts.fired), "{counts:?}");
        assert_eq!(counts.cancelled + counts.fired, 2_000);
        assert_eq!(counts.armed, 2_000 + slots.len() as u64);
    }
}
