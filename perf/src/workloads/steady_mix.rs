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

use crate::peers::engine;
use crate::peers::mutex_heap::SharedHeap;
use crate::peers::tokio_sleep::{self, StartLine, register};
use crate::peers::{SharedTimers, Subject};
use crate::report::{Col, Sheet, thousands};
use crate::runner::{self, Cell, Plan};
use crate::sys::{cpu_between, process_context_switches, process_cpu_time};
use crate::workloads::parallel::share_of;
use crate::workloads::{Out, Workload, rng, wake_floor};

/// light-load's rates, timers armed per second: the same mix at light load, each rate with
/// about a second's worth of timers live, to show what the timers cost a process that has
/// little for them to do.
pub const LIGHT_RATES: [u64; 2] = [1_000, 10_000];

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
    rng: fastrand::Rng,
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
            rng: rng(index as u64 + 11),
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
        if self.rng.u64(..FIRE_ONE_IN) == 0 {
            (
                true,
                Duration::from_nanos(self.rng.u64(1_000_000..period / 2 + 1_000_001)),
            )
        } else {
            let extra = self.rng.u64(1_000_000_000..30_000_000_000);
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
                first_turn.mul_f64(self.rng.f64())
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
    /// light-load: CPU ns per timer over the subject's runs, on its median run.
    spread: Option<String>,
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
            spread: None,
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
        spread: None,
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

/// steady-mix: `plan`'s subjects once each for `seconds`, with `live` timers live.
pub fn run(plan: &Plan, live: u64, seconds: u64, out: &mut Out) {
    let config = |cell: &Cell| Config {
        threads: cell.threads,
        live,
        rate: cell.param,
        duration: Duration::from_secs(seconds),
    };
    let results = runner::in_turns(plan, |cell| measure(cell.subject, config(cell)));
    let wake_cost = bare_wake_cost(plan);
    if let Some(cell) = plan.cells.first() {
        table(
            plan,
            config(cell),
            &plan.cells.iter().zip(&results).collect::<Vec<_>>(),
            wake_cost,
            out,
        );
    }
}

/// What one wake-up of a thread that does nothing else costs in CPU here, measured when an
/// engine with worker threads is among the subjects (see [`wake_floor`]): a thread sleeping
/// until each millisecond for two seconds, after the subjects' runs.
fn bare_wake_cost(plan: &Plan) -> Option<Duration> {
    if !plan
        .cells
        .iter()
        .any(|cell| cell.subject == Subject::Engine)
    {
        return None;
    }
    wake_floor::sleep_through(Duration::from_millis(1), Duration::from_secs(2)).cpu_per_wake
}

/// light-load: the mix at each of [`LIGHT_RATES`] with about a second's worth of timers
/// live, each subject's runs a third of `seconds` (at least 1 s), in turns; a table per
/// rate, each row its subject's median run by CPU per timer.
pub fn run_light(plan: &Plan, seconds: u64, out: &mut Out) {
    let duration =
        (Duration::from_secs(seconds) / plan.runs.max(1) as u32).max(Duration::from_secs(1));
    let config = |cell: &Cell| Config {
        threads: cell.threads,
        live: cell.param,
        rate: cell.param,
        duration,
    };
    let results = runner::in_turns(plan, |cell| measure_light(cell.subject, config(cell)));
    let medians: Vec<Result<Vec<Run>, String>> = results
        .into_iter()
        .map(|runs| {
            let mut runs = runs?;
            runs.sort_by(|a, b| {
                cpu_per_timer_of(a)
                    .unwrap_or(f64::NAN)
                    .total_cmp(&cpu_per_timer_of(b).unwrap_or(f64::NAN))
            });
            let middle = runs.len() / 2;
            let spread = runner::spread(runs.iter().filter_map(cpu_per_timer_of));
            let mut median = runs.swap_remove(middle);
            median.spread = Some(spread);
            Ok(vec![median])
        })
        .collect();
    let wake_cost = bare_wake_cost(plan);
    for rate in LIGHT_RATES {
        let cells: Vec<_> = plan
            .cells
            .iter()
            .zip(&medians)
            .filter(|(cell, _)| cell.param == rate)
            .collect();
        if let Some((cell, _)) = cells.first() {
            table(plan, config(cell), &cells, wake_cost, out);
        }
    }
}

/// The process's CPU time per timer over a run.
fn cpu_per_timer_of(run: &Run) -> Option<f64> {
    Some(run.cpu?.as_nanos() as f64 / run.counts.turns.max(1) as f64)
}

/// Prints the table of `cells`' runs (one each) at `config`.
fn table(
    plan: &Plan,
    config: Config,
    cells: &[(&Cell, &Result<Vec<Run>, String>)],
    wake_cost: Option<Duration>,
    out: &mut Out,
) {
    let name = plan.workload.name();
    let runs = if plan.runs > 1 {
        format!(", {} runs in turns", plan.runs)
    } else {
        String::new()
    };
    let seconds = config.duration.as_secs_f64();
    let title = format!(
        "{name} ({} threads, {} timers live, {} timers/s offered for {seconds} s{runs}: 90% cancelled, 10% fired)",
        config.threads,
        thousands(config.live),
        thousands(config.rate),
    );
    let cols = vec![
        Col::new("timers/s", "timers_per_s", "1/s", 0).rate(),
        Col::new("CPU ns/timer", "cpu_ns_per_timer", "ns", 1).ratios(),
        Col::new("CPU cores busy", "cpu_cores_busy", "cores", 3),
        Col::new("wakes/s", "context_switches_per_s", "1/s", 0),
        Col::new("fired", "fired", "count", 0),
        Col::new("late", "fired_late", "count", 0),
        Col::new("pending at turn", "pending_at_turn", "count", 0),
        Col::new("fired before cancel", "fired_before_cancel", "count", 0),
    ];
    let mut sheet = Sheet::new(name, title, config.live, cols);
    let mut spreads = Vec::new();
    let mut engine_busy = None;
    let mut tokio_busy = None;
    for &(cell, result) in cells {
        let subject = cell.subject;
        let values = result.as_ref().map_err(Clone::clone).map(|runs| {
            let run = &runs[0];
            let per_s = |count: u64| count as f64 / run.wall.as_secs_f64();
            let counts = &run.counts;
            let busy = run.cpu.map(|cpu| cpu.as_secs_f64() / run.wall.as_secs_f64());
            match subject {
                Subject::Engine => engine_busy = busy.zip(run.wakes.map(|w| per_s(w.total()))),
                Subject::TokioSleep => tokio_busy = busy,
                _ => {}
            }
            if let Some(spread) = &run.spread {
                spreads.push(format!("{} {spread}", subject.name()));
            }
            if let Some(w) = run.wakes {
                let shown = |count: u64| thousands(per_s(count) as u64);
                sheet.note(format!(
                    "{}: its workers woke {} times a second (stats().total.wakes): {} with timers due, and with none: {} for the wheel, {} for a lane's need, {} to watch for stuck owners, {} woken early by another thread",
                    subject.name(), shown(w.total()), shown(w.due), shown(w.wheel), shown(w.lane), shown(w.watch), shown(w.woken),
                ));
                let wakes = [("worker_wakes_per_s", w.total()), ("worker_wakes_due_per_s", w.due), ("worker_wakes_wheel_per_s", w.wheel), ("worker_wakes_lane_per_s", w.lane), ("worker_wakes_watch_per_s", w.watch), ("worker_wakes_woken_per_s", w.woken)];
                let wakes = wakes.map(|(metric, count)| (metric, per_s(count), "1/s"));
                out.csv.push_metrics(name, subject.name(), config.live, &wakes);
            }
            out.csv.push_metrics(name, subject.name(), config.live, &[("offered_timers_per_s", config.rate as f64, "1/s")]);
            vec![
                Some(per_s(counts.turns)),
                cpu_per_timer_of(run),
                busy,
                run.switches.map(per_s),
                Some(counts.fired as f64),
                Some(counts.late as f64),
                Some(counts.not_yet_fired as f64),
                Some(counts.fired_before_cancel as f64),
            ]
        });
        sheet.add(subject, cell.threads, false, values);
    }
    if !spreads.is_empty() {
        sheet.note(format!(
            "each row is its subject's median run of {} by CPU ns/timer, the subjects taking turns; CPU ns/timer over the runs: {}",
            plan.runs,
            spreads.join(", ")
        ));
    }
    if let (Some(cost), Some((busy, wakes_per_s))) = (wake_cost, engine_busy) {
        let tokio =
            tokio_busy.map_or_else(String::new, |tokio| format!(" (tokio-sleep's: {tokio:.3})"));
        sheet.note(format!(
            "engine: a bare thread's wake-up costs {:.1} us of CPU here (a thread that only sleeps until each millisecond for 2 s, this run, on an idle core: the dearest kind); at that, its workers' {} wake-ups a second cost up to {:.3} cores of its {busy:.3}{tokio}",
            cost.as_secs_f64() * 1e6,
            thousands(wakes_per_s as u64),
            wakes_per_s * cost.as_secs_f64(),
        ));
    }
    sheet.note(format!(
        "timer = one turn of a ring slot: its timer retired (cancelled, or found fired) and a new one armed; each thread turns its slots at its share of the offered rate, in 1 ms steps, so each slot comes round every P = {:.2} s",
        Ring::new(0, config).period.as_secs_f64()
    ));
    sheet.note("90% of the timers are request timeouts (delay P + 1..30 s), cancelled at their slot's next turn; 10% fire (delay 1 ms..P/2), and must have fired by that turn");
    sheet.note("CPU ns/timer: process CPU time over the timed part (every thread: application, engine workers, tokio's workers and driver, the heap's timer thread) / timers; CPU cores busy: the same over wall time; wakes/s: the process's context switches per second");
    sheet.note(format!("late: firing timers still pending at their slot's turn, {} ms or more after their deadline; pending at turn: less than that; fired before cancel: request timeouts that fired before their turn (the thread fell a period behind); late and fired before cancel should be 0", LATE.as_millis()));
    sheet.note("engine: its stats() must match the rings' counts timer for timer; mutex-heap: its timer thread's count of fires must");
    if plan.workload == Workload::LightLoad {
        sheet.note("every subject is driven from tokio tasks on a runtime of as many workers as threads, paced by tokio's sleep, as a service on tokio would arm its timers: the difference is the timers' (the engine's and the heap's own threads included)");
    }
    sheet.finish(&mut out.csv);
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
