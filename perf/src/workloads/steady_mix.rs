//! steady-mix and light-load: a proxy's timers at a sustained rate. With a million timers live (light-load: a
//! second's worth), tasks arm new ones at an offered rate, 90% request timeouts cancelled when the response comes and
//! 10% that fire; what matters is the CPU per timer, every thread of the process included. Each task turns a ring of
//! slots (one live timer each) at its share of the rate: a slot's timer is retired and a new one armed. Every subject
//! is driven from tokio tasks paced by tokio's `sleep` in 1 ms steps, so the application's wake-ups cost all alike.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Context;
use std::time::{Duration, Instant};

use corewheel::{TimerEngine, WorkerWakes};
use tokio::runtime::Runtime;
use tokio::time::Sleep;

use crate::peers::engine;
use crate::peers::mutex_heap::SharedHeap;
use crate::peers::tokio_sleep::{self, StartLine, register, with_context};
use crate::peers::{SharedTimers, Subject};
use crate::report::{Col, Sheet, thousands};
use crate::runner::{self, Cell, Plan};
use crate::sys::{cpu_between, process_context_switches, process_cpu_time};
use crate::workloads::parallel::{self, share_of};
use crate::workloads::{Out, Workload, rng, wake_floor};

/// light-load's rates, timers armed per second, each with a second's worth live: the timers' cost at light load.
pub const LIGHT_RATES: [u64; 2] = [1_000, 10_000];

/// One in this many timers is left to fire.
const FIRE_ONE_IN: u64 = 10;

/// How often a task wakes to arm what its share of the rate asks for.
const STEP: Duration = Duration::from_millis(1);

/// A firing timer still pending this long after its deadline, at its slot's turn, is late.
const LATE: Duration = Duration::from_millis(50);

/// `a.f op b.f` for each field `f` named.
macro_rules! fieldwise {
    ($a:expr, $op:tt, $b:expr, $($field:ident),+) => {
        $($a.$field $op $b.$field;)+
    };
}

/// The shape of one run: `live` timers live and `rate` armed a second, all tasks together.
#[derive(Debug, Clone, Copy)]
struct Config {
    threads: usize,
    live: u64,
    rate: u64,
    duration: Duration,
}

impl Config {
    /// The slots of task `index`'s ring, so that about `live` timers are pending over all rings: a firing timer lives
    /// a quarter of the ring period on average, so a slot is pending 90% + 10% / 4 of the time.
    fn ring_slots(self, index: usize) -> usize {
        let slots = (self.live as f64 / (1.0 - 0.75 / FIRE_ONE_IN as f64)).round() as u64;
        share_of(slots, self.threads, index).max(1) as usize
    }
}

/// What the slots' turns found, summed over the tasks; `left_*`: what the rings held after the run.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    armed: u64,
    turns: u64,
    cancelled: u64,
    fired_before_cancel: u64,
    fired: u64,
    late: u64,
    not_yet_fired: u64,
    left_cancelled: u64,
    left_fired: u64,
}

impl Counts {
    /// Every cancel that stopped a timer, and every timer that fired.
    fn stopped_and_fired(&self) -> (u64, u64) {
        (
            self.cancelled + self.late + self.not_yet_fired + self.left_cancelled,
            self.fired + self.fired_before_cancel + self.left_fired,
        )
    }
}

/// A subject's timers as a ring holds them: a slot each.
trait Slots: Send + 'static {
    /// Arms a timer in the empty `slot`, polled with `cx` where the subject is a future.
    fn arm(&mut self, slot: usize, delay: Duration, cx: &mut Context<'_>) -> Result<(), String>;

    /// Cancels the slot's timer: `true` if it was pending and is now stopped, `false` if it had fired. The slot is
    /// empty afterwards.
    fn cancel(&mut self, slot: usize) -> bool;

    fn len(&self) -> usize;
}

/// One task's ring: whether each slot's timer is meant to fire, and its deadline on the ring's schedule.
struct Ring {
    rng: fastrand::Rng,
    fires: Vec<bool>,
    due: Vec<Duration>,
    rate: f64,
    period: Duration,
    counts: Counts,
}

impl Ring {
    fn new(index: usize, config: Config) -> Self {
        let slots = config.ring_slots(index);
        let rate = share_of(config.rate, config.threads, index).max(1) as f64;
        Self {
            rng: rng(index as u64 + 11),
            fires: vec![false; slots],
            due: vec![Duration::ZERO; slots],
            rate,
            period: Duration::from_secs_f64(slots as f64 / rate),
            counts: Counts::default(),
        }
    }

    fn draw(&mut self) -> (bool, Duration) {
        let period = self.period.as_nanos() as u64;
        let fires = self.rng.u64(..FIRE_ONE_IN) == 0;
        let ns = match fires {
            true => self.rng.u64(1_000_000..period / 2 + 1_000_001),
            false => period + self.rng.u64(1_000_000_000..30_000_000_000),
        };
        (fires, Duration::from_nanos(ns))
    }

    fn turn_time(&self, turn: u64) -> Duration {
        Duration::from_secs_f64(turn as f64 / self.rate)
    }

    /// Arms every slot before the run, so that it starts in its steady state: a request timeout is due after its
    /// slot's first turn, a firing timer before it.
    fn fill(&mut self, slots: &mut impl Slots, cx: &mut Context<'_>) -> Result<(), String> {
        for slot in 0..slots.len() {
            let (fires, delay) = self.draw();
            let first_turn = self.turn_time(slot as u64);
            let delay = match fires {
                true => first_turn.mul_f64(self.rng.f64()),
                false => first_turn + delay,
            };
            slots.arm(slot, delay, cx)?;
            (self.fires[slot], self.due[slot]) = (fires, delay);
            self.counts.armed += 1;
        }
        Ok(())
    }

    fn catch_up(
        &mut self,
        slots: &mut impl Slots,
        elapsed: Duration,
        cx: &mut Context<'_>,
    ) -> Result<(), String> {
        let due = (elapsed.as_secs_f64() * self.rate) as u64;
        while self.counts.turns < due {
            let turn = self.counts.turns;
            let slot = (turn % slots.len() as u64) as usize;
            let pending = slots.cancel(slot);
            let late = self.turn_time(turn) >= self.due[slot] + LATE;
            let counts = &mut self.counts;
            match (self.fires[slot], pending) {
                (true, true) if late => counts.late += 1,
                (true, true) => counts.not_yet_fired += 1,
                (true, false) => counts.fired += 1,
                (false, true) => counts.cancelled += 1,
                (false, false) => counts.fired_before_cancel += 1,
            }
            let (fires, delay) = self.draw();
            slots.arm(slot, delay, cx)?;
            (self.fires[slot], self.due[slot]) = (fires, self.turn_time(turn) + delay);
            self.counts.armed += 1;
            self.counts.turns += 1;
        }
        Ok(())
    }

    fn empty(&mut self, slots: &mut impl Slots) {
        for slot in 0..slots.len() {
            match slots.cancel(slot) {
                true => self.counts.left_cancelled += 1,
                false => self.counts.left_fired += 1,
            }
        }
    }
}

struct SharedSlots<S: SharedTimers> {
    subject: Arc<S>,
    handles: Vec<Option<S::Handle>>,
}

impl<S: SharedTimers + Send + 'static> Slots for SharedSlots<S>
where
    S::Handle: Send,
{
    fn arm(&mut self, slot: usize, delay: Duration, _: &mut Context<'_>) -> Result<(), String> {
        self.handles[slot] = Some(self.subject.arm(delay, slot as u64)?);
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

/// tokio's slots: a pinned `Option<Sleep>` each, reused so that arming allocates nothing, polled with the waker.
struct TokioSlots(Vec<Pin<Box<Option<Sleep>>>>);

impl Slots for TokioSlots {
    fn arm(&mut self, slot: usize, delay: Duration, cx: &mut Context<'_>) -> Result<(), String> {
        let sleep = &mut self.0[slot];
        sleep.as_mut().set(Some(tokio::time::sleep(delay)));
        if let Some(timer) = sleep.as_mut().as_pin_mut() {
            register(timer, cx);
        }
        Ok(())
    }

    fn cancel(&mut self, slot: usize) -> bool {
        let sleep = &mut self.0[slot];
        let pending = matches!(sleep.as_ref().get_ref(), Some(s) if !s.is_elapsed());
        sleep.as_mut().set(None);
        pending
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

/// One run's figures from the start line to the end line; `spread`: light-load's CPU per timer over the runs.
struct Run {
    wall: Duration,
    cpu: Option<Duration>,
    switches: Option<u64>,
    wakes: Option<WorkerWakes>,
    counts: Counts,
    spread: Option<String>,
}

#[derive(Default)]
struct Lines {
    start: StartLine,
    end: StartLine,
}

async fn part(
    mut slots: impl Slots,
    index: usize,
    config: Config,
    lines: Arc<Lines>,
) -> Result<Counts, String> {
    let mut ring = Ring::new(index, config);
    let filled = with_context(|cx| ring.fill(&mut slots, cx)).await;
    lines.start.arrive_and_wait_yielding().await?;
    filled?;
    let start = Instant::now();
    while start.elapsed() < config.duration {
        let elapsed = start.elapsed();
        with_context(|cx| ring.catch_up(&mut slots, elapsed, cx)).await?;
        tokio::time::sleep(STEP).await;
    }
    lines.end.arrive_and_wait_yielding().await?;
    ring.empty(&mut slots);
    Ok(ring.counts)
}

/// Runs a ring per task on `runtime` over `slots(index)`, timed from the start line to the end line.
fn on_runtime<S: Slots>(
    runtime: Runtime,
    config: Config,
    engine: Option<&TimerEngine>,
    slots: impl Fn(usize) -> S,
) -> Result<Run, String> {
    let lines = Arc::new(Lines::default());
    // One task at a time, each once the one before waits at the start line, so that each starts on a worker of its
    // own: spawned together, two could land on one worker.
    let mut handles = Vec::with_capacity(config.threads);
    let spawned = (0..config.threads).try_for_each(|index| {
        handles.push(runtime.spawn(part(slots(index), index, config, Arc::clone(&lines))));
        lines.start.gather(index + 1)
    });
    let wakes = || engine.map(|engine| engine.stats().total.wakes);
    let timed = spawned.and_then(|()| {
        let (cpu, switches, woke) = (process_cpu_time(), process_context_switches(), wakes());
        let start = lines.start.go();
        std::thread::sleep(config.duration);
        lines.end.gather(config.threads)?;
        let cpu = cpu_between(cpu, process_cpu_time());
        let switches = process_context_switches()
            .zip(switches)
            .map(|(a, b)| a.saturating_sub(b));
        let wakes = wakes().zip(woke).map(|(mut a, b)| {
            fieldwise!(a, -=, b, due, wheel, lane, watch, woken);
            a
        });
        let (wall, counts) = (lines.end.go() - start, Counts::default());
        Ok(Run {
            wall,
            cpu,
            switches,
            wakes,
            counts,
            spread: None,
        })
    });
    let parts = runtime.block_on(parallel::join_all(handles));
    drop(runtime);
    // The main thread's failure first: the tasks' are then only that it called them off.
    let mut run = timed?;
    for part in parts {
        let (c, p) = (&mut run.counts, part?);
        fieldwise!(c, +=, p, armed, turns, cancelled, fired_before_cancel, fired, late, not_yet_fired);
        fieldwise!(c, +=, p, left_cancelled, left_fired);
    }
    Ok(run)
}

fn engine_saw(engine: &TimerEngine, run: Run) -> Result<Run, String> {
    let settled = engine::settle(engine)?;
    let (stopped, fired) = run.counts.stopped_and_fired();
    engine::check_counts(&settled.stats, run.counts.armed, stopped, fired)?;
    Ok(run)
}

fn shared<S: SharedTimers>(subject: &Arc<S>, config: Config) -> impl Fn(usize) -> SharedSlots<S> {
    move |index| SharedSlots {
        subject: Arc::clone(subject),
        handles: vec![None; config.ring_slots(index)],
    }
}

fn measure(subject: Subject, config: Config) -> Result<Run, String> {
    let runtime = tokio_sleep::runtime(config.threads)?;
    match subject {
        Subject::Engine => {
            let engine = Arc::new(engine::build(false)?);
            let run = on_runtime(runtime, config, Some(&engine), shared(&engine, config))?;
            engine_saw(&engine, run)
        }
        Subject::EngineDriven => {
            let engine = Arc::new(engine::build(true)?);
            for driver in engine.drivers(|at| tokio::time::sleep_until(at.into())) {
                runtime.spawn(driver);
            }
            let run = on_runtime(runtime, config, None, shared(&engine, config));
            // The runtime, and the drivers with it, are gone: what is left to settle (the last cancels' messages) is
            // turned here.
            let turning = AtomicBool::new(true);
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    while turning.load(Ordering::Relaxed) {
                        engine.turn();
                        std::thread::sleep(Duration::from_millis(1));
                    }
                });
                let saw = run.and_then(|run| engine_saw(&engine, run));
                turning.store(false, Ordering::Relaxed);
                saw
            })
        }
        Subject::TokioSleep => on_runtime(runtime, config, None, |index| {
            let slots = (0..config.ring_slots(index)).map(|_| Box::pin(None));
            TokioSlots(slots.collect())
        }),
        Subject::MutexHeap => {
            let heap = Arc::new(SharedHeap::start()?);
            let run = on_runtime(runtime, config, None, shared(&heap, config))?;
            let (fired, heap_fired) = (run.counts.stopped_and_fired().1, heap.fired());
            let wrong = format!("the heap fired {heap_fired} timers, the rings saw {fired} fire");
            (heap_fired == fired).then_some(run).ok_or(wrong)
        }
        _ => Err(format!("{} is not a steady-mix subject", subject.name())),
    }
}

/// Runs `plan`'s cells, `seconds` split over the runs (at least 1 s each); a table per rate, median run by CPU.
pub fn run(plan: &Plan, live: Option<u64>, seconds: u64, out: &mut Out) {
    let duration = (Duration::from_secs(seconds) / plan.runs as u32).max(Duration::from_secs(1));
    let config = |cell: &Cell| {
        let (threads, rate) = (cell.threads, cell.param);
        Config {
            threads,
            live: live.unwrap_or(rate),
            rate,
            duration,
        }
    };
    let results = runner::in_turns(plan, |cell| measure(cell.subject, config(cell)));
    let cost = |run: &Run| cpu_per_timer_of(run).unwrap_or(f64::NAN);
    let median = |runs: Result<Vec<Run>, String>| {
        let mut runs = runs?;
        runs.sort_by(|a, b| cost(a).total_cmp(&cost(b)));
        let spread = (plan.runs > 1).then(|| runner::spread(runs.iter().map(cost)));
        let mut median = runs.swap_remove(runs.len() / 2);
        median.spread = spread;
        Ok(vec![median])
    };
    let medians: Vec<Result<Vec<Run>, String>> = results.into_iter().map(median).collect();
    // What a bare thread's wake-up costs in CPU here (see `wake_floor`), for the threaded engine's note.
    let engine = plan.cells.iter().any(|c| c.subject == Subject::Engine);
    let wake_cost = engine
        .then(|| wake_floor::sleep_through(Duration::from_millis(1), Duration::from_secs(2)))
        .and_then(|sleeper| sleeper.cpu_per_wake);
    for cells in runner::by_param(plan, &medians) {
        table(plan, config(cells[0].0), &cells, wake_cost, out);
    }
}

fn cpu_per_timer_of(run: &Run) -> Option<f64> {
    Some(run.cpu?.as_nanos() as f64 / run.counts.turns.max(1) as f64)
}

fn table(
    plan: &Plan,
    config: Config,
    cells: &[(&Cell, &Result<Vec<Run>, String>)],
    wake_cost: Option<Duration>,
    out: &mut Out,
) {
    let name = plan.workload.name();
    let runs = match plan.runs {
        1 => String::new(),
        runs => format!(", {runs} runs in turns"),
    };
    let (threads, seconds) = (config.threads, config.duration.as_secs_f64());
    let (live, rate) = (thousands(config.live), thousands(config.rate));
    let title = format!(
        "{name} ({threads} threads, {live} timers live, {rate} timers/s offered for {seconds} s{runs}: 90% cancelled, 10% fired)"
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
    let (mut spreads, mut engine_busy, mut tokio_busy) = (Vec::new(), None, None);
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
                sheet.note(format!("{}: its workers woke {} times a second (stats().total.wakes): {} with timers due, and with none: {} for the wheel, {} for a lane's need, {} to watch for stuck owners, {} woken early by another thread", subject.name(), shown(w.total()), shown(w.due), shown(w.wheel), shown(w.lane), shown(w.watch), shown(w.woken)));
                let wakes = [("worker_wakes_per_s", w.total()), ("worker_wakes_due_per_s", w.due), ("worker_wakes_wheel_per_s", w.wheel), ("worker_wakes_lane_per_s", w.lane), ("worker_wakes_watch_per_s", w.watch), ("worker_wakes_woken_per_s", w.woken)];
                let wakes = wakes.map(|(metric, count)| (metric, per_s(count), "1/s"));
                out.csv.push_metrics(name, subject.name(), (config.threads, config.live), &wakes);
            }
            out.csv.push_metrics(name, subject.name(), (config.threads, config.live), &[("offered_timers_per_s", config.rate as f64, "1/s")]);
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
        sheet.add(subject, cell.threads, values);
    }
    if !spreads.is_empty() {
        sheet.note(format!("each row is its subject's median run of {} by CPU ns/timer, the subjects taking turns; CPU ns/timer over the runs: {}", plan.runs, spreads.join(", ") ));
    }
    if let (Some(cost), Some((busy, wakes_per_s))) = (wake_cost, engine_busy) {
        let tokio =
            tokio_busy.map_or_else(String::new, |tokio| format!(" (tokio-sleep's: {tokio:.3})"));
        sheet.note(format!("engine: a bare thread's wake-up costs {:.1} us of CPU here (a thread that only sleeps until each millisecond for 2 s, this run, on an idle core: the dearest kind); at that, its workers' {} wake-ups a second cost up to {:.3} cores of its {busy:.3}{tokio}", cost.as_secs_f64() * 1e6, thousands(wakes_per_s as u64), wakes_per_s * cost.as_secs_f64()));
    }
    sheet.note(format!("timer = one turn of a ring slot: its timer retired (cancelled, or found fired) and a new one armed; each thread turns its slots at its share of the offered rate, in 1 ms steps, so each slot comes round every P = {:.2} s", Ring::new(0, config).period.as_secs_f64() ));
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
    use std::task::{Context, Waker};
    use std::time::Duration;

    /// Slots on a virtual clock: every turn is on schedule, and a timer fires exactly at its deadline.
    struct Recorder {
        turns: u64,
        due: Vec<Option<Duration>>,
    }

    impl Slots for Recorder {
        fn arm(&mut self, slot: usize, delay: Duration, _: &mut Context<'_>) -> Result<(), String> {
            assert!(self.due[slot].is_none(), "armed over a live timer");
            self.due[slot] = Some(Duration::from_millis(self.turns) + delay);
            Ok(())
        }

        /// Called once per turn, before that turn's arm.
        fn cancel(&mut self, slot: usize) -> bool {
            let due = self.due[slot].take().expect("a timer in the slot");
            self.turns += 1;
            due > Duration::from_millis(self.turns - 1)
        }

        fn len(&self) -> usize {
            self.due.len()
        }
    }

    /// A ring keeps its rate and its mix: after 2 s of turns at 1,000 a second it has taken 2,000, about a tenth of
    /// them on firing timers, each armed before its turn.
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
            turns: 0,
            due: vec![None; config.ring_slots(0)],
        };
        let mut cx = Context::from_waker(Waker::noop());
        ring.fill(&mut slots, &mut cx).expect("filled");
        ring.catch_up(&mut slots, Duration::from_secs(2), &mut cx)
            .expect("turns");
        let counts = ring.counts;
        let wrong = counts.late + counts.not_yet_fired + counts.fired_before_cancel;
        assert_eq!(
            (counts.turns, counts.cancelled + counts.fired, wrong),
            (2_000, 2_000, 0),
            "{counts:?}"
        );
        assert!((100..300).contains(&counts.fired), "{counts:?}");
        assert_eq!(counts.armed, 2_000 + slots.len() as u64);
    }
}
