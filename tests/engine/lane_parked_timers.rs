//! Parked timers on lanes: a shard's worker takes only the lane stacks (the young stack and
//! the two old generations) whose own need has come (`Lane::take_due`). Parked timers stay
//! on their thread's lane until their generation's need (at most `IDLE_LANE_HORIZON`
//! ticks after its first park), unless a reset makes the shard urgent (then every stack of
//! every lane is taken).
//!
//! From the public API: threads that arm enough long timers to park them and then go quiet
//! (parked timers must still fire at their tick, and cancelled ones must still be dropped
//! within a bound); cancels and resets, earlier and later, from the arming thread and from
//! other threads, of timers parked, kept or forwarded at that moment; threads that exit
//! right after arming; shutdown in both modes and dropping the engine while timers sit on
//! old generations; a worker's own lane (callbacks that arm and cancel); several threads
//! racing their pushes, parks and claims against the owner's takes.
//!
//! Hand-driven tests check exact firing ticks and how long a cancelled timer's captures
//! outlive the cancel. Real-clock tests assert only: never early, exactly once, nothing
//! lost (captures and nodes all come back), with generous limits for "eventually".
//! Mutants (old generations or the young stack taken only when urgent, `<` for `<=`, the
//! park's need left uncapped or capped the wrong way, the urgent flag ignored, a push that
//! never wakes the owner) each fail some of them.

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::support::{Live, Rng, Witness, eventually, manual, ms, run_for, unpinned, within};
use corewheel::{Clock, ManualClock, PendingTimers, TimerEngine, TimerHandle};

/// The most ticks a cancelled timer's captures may outlive its cancel on an engine turned
/// every tick, whatever its thread does next: a lane's young stack is taken by
/// `IDLE_LANE_HORIZON` (32) ticks after it was started, an old generation by as many
/// after its first park, a forward ring and the inbox at every look.
const DROP_BOUND: u64 = 32;

// ---------------------------------------------------------------------------------------
// Hand-driven: a model with exact ticks.
// ---------------------------------------------------------------------------------------

/// What happened to each timer on the manual clock: (id, ms) of each run, and of each drop
/// of its closure's captures.
#[derive(Default)]
struct Book {
    ran: Mutex<Vec<(usize, u64)>>,
    dropped: Mutex<Vec<(usize, u64)>>,
}

/// Captured by timer `id`'s closure: notes when the captures are dropped.
struct Mark {
    id: usize,
    book: Arc<Book>,
    clock: ManualClock,
    start: Instant,
}

impl Drop for Mark {
    fn drop(&mut self) {
        let at = self.clock.now().duration_since(self.start).as_millis() as u64;
        self.book.dropped.lock().unwrap().push((self.id, at));
    }
}

struct Timer {
    handle: TimerHandle,
    /// The ms it is expected to run at, `None` once cancelled.
    due: Option<u64>,
    cancelled_at: Option<u64>,
}

/// What a helper thread does to a timer for the model, reporting the result.
enum Op {
    Cancel(TimerHandle),
    Reset(TimerHandle, u64),
}

/// A thread that runs cancels and resets for the model, one at a time, so that a timer
/// parked on the main thread's lane is touched from another thread in a known order.
struct Helper {
    ops: mpsc::Sender<(Op, mpsc::Sender<bool>)>,
}

impl Helper {
    fn new(engine: &Arc<TimerEngine>) -> Self {
        let (ops, rx) = mpsc::channel::<(Op, mpsc::Sender<bool>)>();
        let engine = Arc::clone(engine);
        std::thread::spawn(move || {
            for (op, reply) in rx {
                let result = match op {
                    Op::Cancel(handle) => engine.cancel(handle),
                    Op::Reset(handle, delay) => engine.reset(handle, ms(delay)),
                };
                let _ = reply.send(result);
            }
        });
        Self { ops }
    }

    fn run(&self, op: Op) -> bool {
        let (tx, rx) = mpsc::channel();
        self.ops.send((op, tx)).unwrap();
        rx.recv_timeout(Duration::from_secs(20))
            .expect("the helper answered")
    }
}

struct Model {
    clock: ManualClock,
    start: Instant,
    book: Arc<Book>,
    timers: Vec<Timer>,
}

impl Model {
    fn new(clock: &ManualClock) -> Self {
        Self {
            clock: clock.clone(),
            start: clock.now(),
            book: Arc::default(),
            timers: Vec::new(),
        }
    }

    fn now(&self) -> u64 {
        self.clock.now().duration_since(self.start).as_millis() as u64
    }

    /// The first turn at or after `now + delay`: the engine has turned at `now` already.
    fn due_after(&self, delay: u64) -> u64 {
        (self.now() + delay).max(self.now() + 1)
    }

    fn schedule(&mut self, engine: &TimerEngine, delay: u64) -> usize {
        let id = self.timers.len();
        let mark = Mark {
            id,
            book: Arc::clone(&self.book),
            clock: self.clock.clone(),
            start: self.start,
        };
        let handle = engine
            .schedule(ms(delay), move || {
                let at = mark.clock.now().duration_since(mark.start).as_millis() as u64;
                mark.book.ran.lock().unwrap().push((mark.id, at));
            })
            .unwrap();
        let due = Some(self.due_after(delay));
        self.timers.push(Timer {
            handle,
            due,
            cancelled_at: None,
        });
        id
    }

    fn pending(&self, id: usize) -> bool {
        self.timers[id].due.is_some_and(|due| due > self.now())
    }

    /// Cancels timer `id`, here or on `helper`'s thread.
    fn cancel(&mut self, engine: &TimerEngine, id: usize, helper: Option<&Helper>) {
        let handle = self.timers[id].handle;
        let got = match helper {
            Some(helper) => helper.run(Op::Cancel(handle)),
            None => engine.cancel(handle),
        };
        assert_eq!(
            got,
            self.pending(id),
            "cancel of timer {id} at {} ms (due {:?})",
            self.now(),
            self.timers[id].due
        );
        if got {
            self.timers[id].due = None;
            self.timers[id].cancelled_at = Some(self.now());
        }
    }

    /// Resets timer `id` to `delay` from now, here or on `helper`'s thread.
    fn reset(&mut self, engine: &TimerEngine, id: usize, delay: u64, helper: Option<&Helper>) {
        let handle = self.timers[id].handle;
        let got = match helper {
            Some(helper) => helper.run(Op::Reset(handle, delay)),
            None => engine.reset(handle, ms(delay)),
        };
        assert_eq!(
            got,
            self.pending(id),
            "reset of timer {id} at {} ms (due {:?})",
            self.now(),
            self.timers[id].due
        );
        if got {
            self.timers[id].due = Some(self.due_after(delay));
        }
    }

    /// Turns the engine a tick at a time past every due timer plus `extra` ms, then checks
    /// that every timer ran once at its own tick or never (if cancelled), that every
    /// closure's captures were dropped exactly once, and every node is back. Returns the
    /// most ms a cancelled timer's captures outlived its cancel.
    fn settle(&mut self, engine: &TimerEngine, extra: u64) -> u64 {
        let last = self.timers.iter().filter_map(|t| t.due).max().unwrap_or(0);
        let until = last.max(self.now()) + extra;
        run_for(engine, &self.clock, until - self.now());
        let mut ran = self.book.ran.lock().unwrap().clone();
        ran.sort_unstable();
        let mut expected: Vec<(usize, u64)> = self
            .timers
            .iter()
            .enumerate()
            .filter_map(|(id, t)| Some((id, t.due?)))
            .collect();
        expected.sort_unstable();
        if ran != expected {
            let mut got: HashMap<usize, Vec<u64>> = HashMap::new();
            for &(id, at) in &ran {
                got.entry(id).or_default().push(at);
            }
            let wrong: Vec<_> = (0..self.timers.len())
                .filter(|&id| {
                    got.get(&id).cloned().unwrap_or_default()
                        != self.timers[id].due.into_iter().collect::<Vec<_>>()
                })
                .take(10)
                .map(|id| (id, self.timers[id].due, got.get(&id).cloned()))
                .collect();
            panic!(
                "{} runs, {} expected; wrong (id, expected ms, ran at ms): {wrong:?}",
                ran.len(),
                expected.len()
            );
        }
        let dropped = self.book.dropped.lock().unwrap().clone();
        let mut drops: HashMap<usize, Vec<u64>> = HashMap::new();
        for &(id, at) in &dropped {
            drops.entry(id).or_default().push(at);
        }
        let mut worst = 0;
        for (id, timer) in self.timers.iter().enumerate() {
            let at = match drops.get(&id).map(Vec::as_slice) {
                Some(&[at]) => at,
                other => panic!("timer {id}'s captures dropped at {other:?}, not once"),
            };
            if let Some(cancelled) = timer.cancelled_at {
                let late = at - cancelled;
                assert!(
                    late <= DROP_BOUND,
                    "timer {id}, cancelled at {cancelled} ms, kept its captures until {at} ms"
                );
                worst = worst.max(late);
            }
        }
        assert_eq!(engine.nodes_in_use(), 0, "every node back in its pool");
        worst
    }
}

/// A delay in ms: mostly long enough to be parked (past `OLD_HORIZON` ticks), with
/// short ones, ones due just around an old generation's need, and far ones.
fn delay(rng: &mut Rng) -> u64 {
    match rng.below(100) {
        0..=14 => rng.below(5),
        15..=34 => 5 + rng.below(12),
        35..=74 => 17 + rng.below(300),
        _ => 400 + rng.below(1_500),
    }
}

// Deterministic shape: 200 long timers armed at one tick, then nothing from the thread. The
// first 128 go through two claims and sit on one old generation (needed 9-32 ms later), the
// rest on the young stack (needed 32 ms later). Parked timers must fire at their own tick, parked
// and young cancelled ones must be dropped by their stack's need, not when the thread next
// arms (it never does).
#[test]
fn a_quiet_threads_parked_timers_fire_and_drop_on_time() {
    for (workers, cancel_from_helper) in [(1, false), (2, true)] {
        let (engine, clock) = manual(workers);
        let engine = Arc::new(engine);
        let helper = Helper::new(&engine);
        let helper = cancel_from_helper.then_some(&helper);
        let mut model = Model::new(&clock);
        // Due between 10 ms (just past the generation's need) and 3 s; every fifth is
        // short (due within `OLD_HORIZON`: forwarded at its first claim, never parked).
        for i in 0..200_u64 {
            let delay = if i % 5 == 4 {
                1 + i % 4
            } else {
                10 + (i * 37) % 3_000
            };
            model.schedule(&engine, delay);
        }
        // Cancelled at once, parked or young: by the time the stacks are needed.
        for id in (0..200).step_by(3) {
            if model.pending(id) {
                model.cancel(&engine, id, helper);
            }
        }
        run_for(&engine, &clock, 5);
        // Cancelled after some ticks, still parked.
        for id in (1..200).step_by(7) {
            if model.pending(id) {
                model.cancel(&engine, id, helper);
            }
        }
        model.settle(&engine, 40);
        // Cancelled at 0 ms while parked (ids below 128): taken with their generation by
        // its need, though the thread never arms again: by the worker's planned wake-up,
        // at most `IDLE_LANE_HORIZON` (32) ticks after the parking tick.
        let parked_drops: Vec<(usize, u64)> = model
            .book
            .dropped
            .lock()
            .unwrap()
            .iter()
            .copied()
            .filter(|&(id, _)| id < 128 && id % 3 == 0 && id % 5 != 4)
            .collect();
        let parked_cancelled = (0..128).filter(|id| id % 3 == 0 && id % 5 != 4).count();
        assert_eq!(parked_drops.len(), parked_cancelled);
        assert!(
            parked_drops.iter().all(|&(_, at)| at <= 33),
            "parked cancelled timers dropped late: {parked_drops:?}"
        );
    }
}

// A parked timer reset earlier (before its generation's need, at once, or just after it) is
// fired at its new tick: the shard is made urgent and every stack is taken. Reset later, it
// does not fire at its old tick. From this thread and from another.
#[test]
fn resets_of_parked_timers_fire_at_their_new_tick() {
    for from_helper in [false, true] {
        // With a helper, on two shards: its messages travel on its own lane into ours.
        let (engine, clock) = manual(1 + usize::from(from_helper));
        let engine = Arc::new(engine);
        let helper_thread = Helper::new(&engine);
        let helper = from_helper.then_some(&helper_thread);
        let mut model = Model::new(&clock);
        for i in 0..200_u64 {
            model.schedule(&engine, 2_000 + i);
        }
        run_for(&engine, &clock, 1);
        // Parked (ids below 128), kept on the young stack (128..192), new (192..200).
        for (id, delay) in [
            (0, 1),
            (1, 0),
            (2, 5),
            (3, 8),
            (4, 9),
            (5, 30),
            (6, 3_000),
            (130, 1),
            (131, 40),
            (195, 0),
            (196, 2),
        ] {
            model.reset(&engine, id, delay, helper);
        }
        run_for(&engine, &clock, 3);
        // Reset again: one already moved earlier, one moved later, now brought back.
        model.reset(&engine, 5, 2, helper);
        model.reset(&engine, 6, 4, helper);
        // Past the generation's need: what is left of it is on the wheel now.
        run_for(&engine, &clock, 10);
        model.reset(&engine, 100, 1, helper);
        model.reset(&engine, 101, 5_000, helper);
        model.cancel(&engine, 102, helper);
        // And a second batch parks while the first is filed: reset and cancel it too.
        for i in 0..200_u64 {
            model.schedule(&engine, 1_000 + i);
        }
        let second = model.timers.len() - 200;
        model.reset(&engine, second, 3, helper);
        model.reset(&engine, second + 1, 0, helper);
        model.cancel(&engine, second + 2, helper);
        model.settle(&engine, 40);
    }
}

// A seeded mix: bursts of schedules of every length (so lanes claim, park, rotate and take
// generations back), then quiet spells of up to 60 ticks in which only cancels and resets
// come, from this thread or another; every timer fires at its own tick, every cancelled
// timer's captures are dropped within the bound.
#[test]
fn bursts_and_quiet_spells_keep_every_tick() {
    let mut worst = 0;
    for seed in 0..3 {
        let (engine, clock) = manual(1 + seed as usize % 2);
        let engine = Arc::new(engine);
        let helper = Helper::new(&engine);
        let mut model = Model::new(&clock);
        let mut rng = Rng(0x7A4E_D0E0 + seed);
        for _round in 0..30 {
            let burst = [0, 30, 70, 140, 200, 260, 450][rng.below(7) as usize];
            for _ in 0..burst {
                let d = delay(&mut rng);
                let id = model.schedule(&engine, d);
                if rng.percent(15) {
                    let victim = id - (rng.below(150) as usize).min(id);
                    if model.pending(victim) {
                        model.cancel(&engine, victim, None);
                    }
                }
            }
            let spell = [0, 1, 3, 8, 9, 10, 20, 40, 60][rng.below(9) as usize];
            for _ in 0..spell {
                run_for(&engine, &clock, 1);
                if rng.percent(30) && !model.timers.is_empty() {
                    let count = model.timers.len();
                    let victim = count - 1 - (rng.below(400) as usize).min(count - 1);
                    if !model.pending(victim) {
                        continue;
                    }
                    let helper = rng.percent(50).then_some(&helper);
                    match rng.below(4) {
                        0 => model.cancel(&engine, victim, helper),
                        1 => model.reset(&engine, victim, rng.below(4), helper),
                        2 => model.reset(&engine, victim, 4 + rng.below(20), helper),
                        _ => model.reset(&engine, victim, 500 + rng.below(800), helper),
                    }
                }
            }
            if spell == 0 {
                run_for(&engine, &clock, 1);
            }
        }
        worst = worst.max(model.settle(&engine, 40));
    }
    eprintln!("bursts_and_quiet_spells: worst drop after cancel {worst} ms");
}

// A thread arms, parks and cancels, and exits (its lane closes with old generations on
// it), in steps the main thread interleaves with turns: before the generation's need,
// after it, and once the worker has taken one generation and the thread has parked more.
#[test]
fn threads_exiting_with_parked_generations_lose_nothing() {
    for exit_after in [0_u64, 3, 9, 12, 40] {
        let (engine, clock) = manual(2);
        let engine = Arc::new(engine);
        let model = Arc::new(Mutex::new(Model::new(&clock)));
        let (jobs, job_rx) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            for job in job_rx {
                job();
                done_tx.send(()).unwrap();
            }
        });
        let on_thread = |job: Box<dyn FnOnce() + Send>| {
            jobs.send(job).unwrap();
            done_rx.recv_timeout(Duration::from_secs(20)).unwrap();
        };
        let arm = |seed: u64| {
            let (engine, model) = (Arc::clone(&engine), Arc::clone(&model));
            Box::new(move || {
                let mut model = model.lock().unwrap();
                let mut rng = Rng(seed);
                let first = model.timers.len();
                for _ in 0..230 {
                    let d = 10 + rng.below(600);
                    model.schedule(&engine, d);
                }
                for id in (first..model.timers.len()).step_by(4) {
                    model.cancel(&engine, id, None);
                }
                model.reset(&engine, first + 1, 2, None);
            }) as Box<dyn FnOnce() + Send>
        };
        on_thread(arm(1 + exit_after));
        run_for(&engine, &clock, exit_after);
        if exit_after >= 9 {
            // The worker took the first generation; park a second one.
            on_thread(arm(100 + exit_after));
            run_for(&engine, &clock, 2);
        }
        drop(jobs);
        thread.join().unwrap();
        let mut model = model.lock().unwrap();
        model.settle(&engine, 40);
    }
}

// Shutdown while timers sit on old generations (and the young stack) of a quiet thread and
// of one that has exited: every pending timer runs once or is dropped, as asked, and no
// cancelled one runs.
#[test]
fn shutdown_with_parked_timers_settles_each_once() {
    for pending in [PendingTimers::Run, PendingTimers::Drop] {
        let (engine, clock) = manual(2);
        let engine = Arc::new(engine);
        let model = Arc::new(Mutex::new(Model::new(&clock)));
        {
            let (engine, model) = (Arc::clone(&engine), Arc::clone(&model));
            std::thread::spawn(move || {
                let mut model = model.lock().unwrap();
                for i in 0..300 {
                    model.schedule(&engine, 100 + i);
                }
                for id in (0..300).step_by(5) {
                    model.cancel(&engine, id, None);
                }
            })
            .join()
            .unwrap();
        }
        let mut model = model.lock().unwrap();
        let first = model.timers.len();
        for i in 0..300 {
            model.schedule(&engine, 50 + i);
        }
        for id in (first..first + 300).step_by(6) {
            model.cancel(&engine, id, None);
        }
        run_for(&engine, &clock, 3);
        let report = engine.shutdown(pending);
        let pending_now = model.timers.iter().filter(|t| t.due.is_some()).count() as u64;
        let ran = model.book.ran.lock().unwrap().clone();
        let mut runs: HashMap<usize, usize> = HashMap::new();
        for (id, _) in &ran {
            *runs.entry(*id).or_default() += 1;
        }
        match pending {
            PendingTimers::Run => {
                assert_eq!(report.ran, pending_now, "{report:?}");
                assert_eq!(ran.len() as u64, pending_now);
                for (id, t) in model.timers.iter().enumerate() {
                    let want = usize::from(t.due.is_some());
                    assert_eq!(runs.get(&id).copied().unwrap_or(0), want, "timer {id}");
                }
            }
            PendingTimers::Drop => {
                assert_eq!(report.dropped, pending_now, "{report:?}");
                assert!(ran.is_empty(), "ran at a dropping shutdown: {ran:?}");
            }
        }
        let drops = model.book.dropped.lock().unwrap().len();
        assert_eq!(drops, model.timers.len(), "every capture dropped once");
        assert_eq!(engine.nodes_in_use(), 0);
    }
}

// Repeating timers parked on a quiet thread's lane: each runs at every multiple of its
// period from its first (or reset) deadline, whether it waited on an old generation or
// the young stack; cancelled (before the first run, or later from another thread, once
// filed) they stop, and their captures are dropped within the bound.
#[test]
fn parked_repeating_timers_keep_their_period() {
    let (engine, clock) = manual(2);
    let engine = Arc::new(engine);
    let helper = Helper::new(&engine);
    let start = clock.now();
    let book = Arc::new(Book::default());
    let mut timers = Vec::new();
    for i in 0..200_u64 {
        let period = 12 + (i * 7) % 70;
        let mark = Mark {
            id: i as usize,
            book: Arc::clone(&book),
            clock: clock.clone(),
            start,
        };
        let handle = engine
            .schedule_repeating(ms(period), move || {
                let at = mark.clock.now().duration_since(mark.start).as_millis() as u64;
                mark.book.ran.lock().unwrap().push((mark.id, at));
            })
            .unwrap();
        // (handle, first run, period, cancelled at)
        timers.push((handle, period, period, None::<u64>));
    }
    run_for(&engine, &clock, 1);
    for i in [0_usize, 1, 2, 150, 199] {
        assert!(engine.reset(timers[i].0, ms(5)));
        timers[i].1 = 1 + 5;
    }
    run_for(&engine, &clock, 2);
    for i in (3..200).step_by(11) {
        assert!(engine.cancel(timers[i].0));
        timers[i].3 = Some(3);
    }
    run_for(&engine, &clock, 247);
    for (i, timer) in timers.iter_mut().enumerate() {
        if timer.3.is_none() {
            let cancelled = if i % 2 == 0 {
                helper.run(Op::Cancel(timer.0))
            } else {
                engine.cancel(timer.0)
            };
            assert!(cancelled, "repeating timer {i} cancelled");
            timer.3 = Some(250);
        }
    }
    run_for(&engine, &clock, 60);
    let ran = book.ran.lock().unwrap().clone();
    for (i, &(_, first, period, cancelled)) in timers.iter().enumerate() {
        let end = cancelled.unwrap();
        let expected: Vec<u64> = (0..)
            .map(|k| first + k * period)
            .take_while(|&at| at <= end)
            .collect();
        let got: Vec<u64> = ran.iter().filter(|r| r.0 == i).map(|r| r.1).collect();
        assert_eq!(got, expected, "repeating timer {i} (period {period})");
    }
    let dropped = book.dropped.lock().unwrap().clone();
    for (i, &(_, _, _, cancelled)) in timers.iter().enumerate() {
        let drops: Vec<u64> = dropped.iter().filter(|d| d.0 == i).map(|d| d.1).collect();
        assert_eq!(
            drops.len(),
            1,
            "repeating timer {i}'s captures dropped {drops:?}"
        );
        assert!(
            drops[0] - cancelled.unwrap() <= DROP_BOUND,
            "repeating timer {i} cancelled at {cancelled:?} dropped at {}",
            drops[0]
        );
    }
    assert_eq!(engine.nodes_in_use(), 0);
}

// Two threads arm, cancel and reset their own timers while the main thread turns the
// manual clock: pushes, parks, claims and generation takes race the owner's take_due for
// real. Each thread notes the clock before it schedules; nothing may run before that plus
// its delay, and everything not cancelled must run exactly once.
#[test]
fn racing_producers_on_a_turning_manual_engine() {
    let (engine, clock) = manual(2);
    let engine = Arc::new(engine);
    let start = clock.now();
    let now_ms = {
        let clock = clock.clone();
        move || clock.now().duration_since(start).as_millis() as u64
    };
    // Per timer: (earliest allowed ms, cancelled).
    let timers: Arc<Mutex<Vec<(u64, bool)>>> = Arc::default();
    let runs: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let live = Live::default();
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..2_u64)
        .map(|p| {
            let (engine, timers, runs, live, stop, now_ms) = (
                Arc::clone(&engine),
                Arc::clone(&timers),
                Arc::clone(&runs),
                live.clone(),
                Arc::clone(&stop),
                now_ms.clone(),
            );
            std::thread::spawn(move || {
                let mut rng = Rng(0xACE0 + p);
                let mut mine: Vec<(usize, TimerHandle)> = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let burst = rng.below(150);
                    for _ in 0..burst {
                        let d = delay(&mut rng);
                        let not_before = now_ms() + d;
                        let id = {
                            let mut timers = timers.lock().unwrap();
                            timers.push((not_before, false));
                            timers.len() - 1
                        };
                        let (runs, w, at_ms) = (Arc::clone(&runs), live.witness(), now_ms.clone());
                        let handle = engine
                            .schedule(ms(d), move || {
                                let _keep = &w;
                                runs.lock().unwrap().push((id, at_ms()));
                            })
                            .unwrap();
                        mine.push((id, handle));
                        if rng.percent(20) && !mine.is_empty() {
                            let (vid, victim) = mine
                                [mine.len() - 1 - (rng.below(100) as usize).min(mine.len() - 1)];
                            if rng.percent(50) {
                                if engine.cancel(victim) {
                                    timers.lock().unwrap()[vid].1 = true;
                                }
                            } else {
                                let d = rng.below(30);
                                let not_before = now_ms() + d;
                                if engine.reset(victim, ms(d)) {
                                    timers.lock().unwrap()[vid].0 = not_before;
                                }
                            }
                        }
                    }
                    // A quiet spell of real time while the clock moves on.
                    std::thread::sleep(Duration::from_micros(rng.below(3_000)));
                }
            })
        })
        .collect();
    for _ in 0..800 {
        clock.advance(ms(1));
        engine.turn();
        std::thread::sleep(Duration::from_micros(200));
    }
    stop.store(true, Ordering::Relaxed);
    for producer in producers {
        producer.join().unwrap();
    }
    run_for(&engine, &clock, 2_000);
    let timers = timers.lock().unwrap();
    let runs = runs.lock().unwrap();
    let mut count = vec![0_usize; timers.len()];
    for &(id, at) in runs.iter() {
        count[id] += 1;
        assert!(
            at >= timers[id].0,
            "timer {id} ran at {at} ms, not before {} ms",
            timers[id].0
        );
    }
    for (id, &(_, cancelled)) in timers.iter().enumerate() {
        assert_eq!(
            count[id],
            usize::from(!cancelled),
            "timer {id} (cancelled: {cancelled})"
        );
    }
    assert_eq!(live.count(), 0, "every capture dropped");
    assert_eq!(engine.nodes_in_use(), 0);
    eprintln!("racing_producers: {} timers", timers.len());
}

// ---------------------------------------------------------------------------------------
// Real clock: never early, exactly once, nothing lost.
// ---------------------------------------------------------------------------------------

/// Real-clock records: per timer, the earliest instant it may run (moved by successful
/// resets), whether it was cancelled, when it ran, when its captures were dropped.
#[derive(Default)]
struct Real {
    timers: Mutex<Vec<RealTimer>>,
}

#[derive(Clone)]
struct RealTimer {
    not_before: Instant,
    cancelled: Option<Instant>,
    ran: Vec<Instant>,
    dropped: Option<Instant>,
}

/// Captured by a real-clock timer: notes the drop.
struct RealMark(usize, Arc<Real>, #[allow(dead_code)] Witness);

impl Drop for RealMark {
    fn drop(&mut self) {
        self.1.timers.lock().unwrap()[self.0].dropped = Some(Instant::now());
    }
}

impl Real {
    fn schedule(
        this: &Arc<Self>,
        engine: &TimerEngine,
        live: &Live,
        delay: Duration,
    ) -> (usize, TimerHandle) {
        let before = Instant::now();
        let id = {
            let mut timers = this.timers.lock().unwrap();
            timers.push(RealTimer {
                not_before: before + delay,
                cancelled: None,
                ran: Vec::new(),
                dropped: None,
            });
            timers.len() - 1
        };
        let mark = RealMark(id, Arc::clone(this), live.witness());
        let handle = engine
            .schedule(delay, move || {
                let at = Instant::now();
                mark.1.timers.lock().unwrap()[mark.0].ran.push(at);
            })
            .unwrap();
        (id, handle)
    }

    fn cancel(&self, engine: &TimerEngine, id: usize, handle: TimerHandle) -> bool {
        let at = Instant::now();
        let got = engine.cancel(handle);
        if got {
            self.timers.lock().unwrap()[id].cancelled = Some(at);
        }
        got
    }

    fn reset(&self, engine: &TimerEngine, id: usize, handle: TimerHandle, delay: Duration) -> bool {
        let before = Instant::now();
        let got = engine.reset(handle, delay);
        if got {
            self.timers.lock().unwrap()[id].not_before = before + delay;
        }
        got
    }

    /// Waits (up to `limit`) for every timer not cancelled to run and every capture to be
    /// dropped, then checks never early and exactly once; returns the longest a cancelled
    /// timer's captures outlived its cancel.
    fn check(&self, engine: &TimerEngine, live: &Live, limit: Duration) -> Duration {
        let done = eventually(limit, || {
            live.count() == 0
                && self
                    .timers
                    .lock()
                    .unwrap()
                    .iter()
                    .all(|t| t.cancelled.is_some() || !t.ran.is_empty())
        });
        let timers = self.timers.lock().unwrap().clone();
        let missing: Vec<_> = timers
            .iter()
            .enumerate()
            .filter(|(_, t)| t.cancelled.is_none() && t.ran.is_empty())
            .map(|(id, _)| id)
            .take(10)
            .collect();
        assert!(
            done,
            "after {limit:?}: {} captures alive, timers never run: {missing:?}",
            live.count()
        );
        let mut worst = Duration::ZERO;
        for (id, t) in timers.iter().enumerate() {
            match t.cancelled {
                Some(at) => {
                    assert!(t.ran.is_empty(), "timer {id} was cancelled and ran");
                    let dropped = t.dropped.expect("dropped");
                    worst = worst.max(dropped.saturating_duration_since(at));
                }
                None => {
                    assert_eq!(t.ran.len(), 1, "timer {id} ran {} times", t.ran.len());
                    assert!(
                        t.ran[0] >= t.not_before,
                        "timer {id} ran {:?} early",
                        t.not_before - t.ran[0]
                    );
                }
            }
        }
        assert!(
            eventually(Duration::from_secs(5), || engine.nodes_in_use() == 0),
            "{} nodes still in use",
            engine.nodes_in_use()
        );
        worst
    }
}

// Threads each arm a stream of long timers (parked) interleaved with short ones, cancel
// and reset some, hand others to a thread that cancels or resets them later, and then
// either go quiet (alive, arming nothing) or exit. Parked timers of the quiet threads must
// still run, once and not early, and cancelled ones be dropped.
#[test]
fn real_clock_streams_then_quiet_or_exit() {
    within(Duration::from_secs(60), "the real-clock streams", || {
        let engine = unpinned(2);
        let real = Arc::new(Real::default());
        let live = Live::default();
        let (to_other, from_threads) = mpsc::channel::<(usize, TimerHandle, u64)>();
        let quiet = Arc::new(Barrier::new(4));
        let other = {
            let (engine, real) = (Arc::clone(&engine), Arc::clone(&real));
            std::thread::spawn(move || {
                let mut rng = Rng(0x0DD);
                let mut held = Vec::new();
                for (id, handle, coin) in from_threads {
                    held.push((id, handle, coin));
                    if held.len() > 20 || rng.percent(10) {
                        for (id, handle, coin) in held.drain(..) {
                            match coin % 3 {
                                0 => drop(real.cancel(&engine, id, handle)),
                                1 => drop(real.reset(&engine, id, handle, ms(coin % 25))),
                                _ => drop(real.reset(&engine, id, handle, ms(200 + coin % 400))),
                            }
                        }
                    }
                }
                // What is left is handled once every thread has gone quiet or exited.
                for (id, handle, _) in held {
                    real.cancel(&engine, id, handle);
                }
            })
        };
        let threads: Vec<_> = (0..6_u64)
            .map(|t| {
                let (engine, real, live, to_other, quiet) = (
                    Arc::clone(&engine),
                    Arc::clone(&real),
                    live.clone(),
                    to_other.clone(),
                    Arc::clone(&quiet),
                );
                std::thread::spawn(move || {
                    let mut rng = Rng(0x5742_0000 + t);
                    let mut mine = Vec::new();
                    for _round in 0..12 {
                        for _ in 0..rng.range(60, 260) {
                            let d = if rng.percent(30) {
                                rng.below(15)
                            } else {
                                60 + rng.below(900)
                            };
                            let (id, handle) = Real::schedule(&real, &engine, &live, ms(d));
                            mine.push((id, handle));
                            match rng.below(100) {
                                0..=14 => {
                                    let (id, handle) = mine[mine.len()
                                        - 1
                                        - (rng.below(80) as usize).min(mine.len() - 1)];
                                    real.cancel(&engine, id, handle);
                                }
                                15..=19 => {
                                    let (id, handle) = mine[mine.len()
                                        - 1
                                        - (rng.below(80) as usize).min(mine.len() - 1)];
                                    real.reset(&engine, id, handle, ms(rng.below(20)));
                                }
                                20..=29 => to_other.send((id, handle, rng.next())).unwrap(),
                                _ => {}
                            }
                        }
                        std::thread::sleep(ms(rng.below(25)));
                    }
                    // Cancel a last few, then: odd threads exit, even ones stay quiet.
                    for _ in 0..10 {
                        let (id, handle) = mine[rng.below(mine.len() as u64) as usize];
                        real.cancel(&engine, id, handle);
                    }
                    drop(to_other);
                    if t % 2 == 0 {
                        quiet.wait();
                        // Alive and quiet until the checks are done.
                        quiet.wait();
                    }
                })
            })
            .collect();
        drop(to_other);
        quiet.wait();
        other.join().unwrap();
        let worst = real.check(&engine, &live, Duration::from_secs(10));
        quiet.wait();
        for thread in threads {
            thread.join().unwrap();
        }
        eprintln!(
            "real_clock_streams: {} timers, worst drop after cancel {worst:?}",
            real.timers.lock().unwrap().len()
        );
    });
}

// One thread parks a generation of long timers and goes quiet; another cancels or resets
// (earlier, to around the generation's need) each of them, spread over the ticks around
// that need, racing the owner's take of the generation. Every cancel of a pending timer
// succeeds, the reset ones run once and not early, and the cancelled ones' captures are
// dropped while the arming thread stays quiet. Also measures how long that takes.
#[test]
fn another_thread_cancels_and_resets_around_the_generations_need() {
    within(Duration::from_secs(60), "cancels around the need", || {
        let engine = unpinned(2);
        let live = Live::default();
        let mut worst = Duration::ZERO;
        for round in 0..10_u64 {
            let real = Arc::new(Real::default());
            let (handles_tx, handles_rx) = mpsc::channel();
            let release = Arc::new(Barrier::new(2));
            let armer = {
                let (engine, real, live, release) = (
                    Arc::clone(&engine),
                    Arc::clone(&real),
                    live.clone(),
                    Arc::clone(&release),
                );
                std::thread::spawn(move || {
                    let handles: Vec<_> = (0..200)
                        .map(|i| Real::schedule(&real, &engine, &live, ms(3_000 + i)))
                        .collect();
                    handles_tx.send(handles).unwrap();
                    // Quiet, alive, until the round is checked.
                    release.wait();
                })
            };
            let handles = handles_rx.recv().unwrap();
            let mut rng = Rng(0xC0FFEE + round);
            let started = Instant::now();
            for (k, &(id, handle)) in handles.iter().enumerate() {
                // Spread over about 20 ms: across the generation's need (9 ticks).
                let at = started + Duration::from_micros(100 * k as u64);
                if let Some(wait) = at.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let ok = if k % 3 == 0 {
                    real.reset(&engine, id, handle, ms(rng.below(15)))
                } else {
                    real.cancel(&engine, id, handle)
                };
                assert!(ok, "round {round}: timer {k} was pending");
            }
            worst = worst.max(real.check(&engine, &live, Duration::from_secs(5)));
            release.wait();
            armer.join().unwrap();
        }
        eprintln!("around_the_need: worst drop after cancel {worst:?}");
        assert!(
            worst < Duration::from_secs(2),
            "worst drop after cancel {worst:?}"
        );
    });
}

// Callbacks on the workers arm long timers on the worker's own lane (the worker is its
// own lane's producer), cancel some and reset some; then nothing else happens. The parked
// ones must still run, once and not early, and the cancelled ones' captures be dropped.
#[test]
fn callbacks_park_timers_on_the_workers_own_lane() {
    within(Duration::from_secs(60), "callbacks parking", || {
        let engine = unpinned(2);
        let real = Arc::new(Real::default());
        let live = Live::default();
        let spawned = Arc::new(AtomicUsize::new(0));
        for k in 0..4_u64 {
            let (weak, real2, live2, spawned) = (
                Arc::downgrade(&engine),
                Arc::clone(&real),
                live.clone(),
                Arc::clone(&spawned),
            );
            engine
                .schedule(ms(2 + k), move || {
                    let Some(engine) = weak.upgrade() else { return };
                    let mut rng = Rng(0xCA11 + k);
                    let mut mine = Vec::new();
                    for _ in 0..220 {
                        let d = if rng.percent(20) {
                            rng.below(10)
                        } else {
                            100 + rng.below(700)
                        };
                        mine.push(Real::schedule(&real2, &engine, &live2, ms(d)));
                    }
                    for (n, &(id, handle)) in mine.iter().enumerate() {
                        match n % 5 {
                            0 => drop(real2.cancel(&engine, id, handle)),
                            1 => drop(real2.reset(&engine, id, handle, ms(rng.below(12)))),
                            _ => {}
                        }
                    }
                    spawned.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
        }
        assert!(eventually(Duration::from_secs(10), || spawned
            .load(Ordering::SeqCst)
            == 4));
        let worst = real.check(&engine, &live, Duration::from_secs(10));
        eprintln!("own_lane: worst drop after cancel {worst:?}");
        assert!(
            worst < Duration::from_secs(2),
            "worst drop after cancel {worst:?}"
        );
    });
}

// Dropping the engine while threads' timers sit on old generations (of quiet threads, of
// exited ones): once the drop returns, no capture is left alive and none ran early.
#[test]
fn dropping_the_engine_with_parked_timers_drops_every_capture() {
    within(
        Duration::from_secs(60),
        "dropping with parked timers",
        || {
            for round in 0..4_u64 {
                let engine = unpinned(2);
                let real = Arc::new(Real::default());
                let live = Live::default();
                let parked = Arc::new(Barrier::new(4));
                let release = Arc::new(Barrier::new(3));
                let threads: Vec<_> = (0..3_u64)
                    .map(|t| {
                        let (engine, real, live, parked, release) = (
                            Arc::clone(&engine),
                            Arc::clone(&real),
                            live.clone(),
                            Arc::clone(&parked),
                            Arc::clone(&release),
                        );
                        std::thread::spawn(move || {
                            let mut rng = Rng(round * 8 + t);
                            let mut mine = Vec::new();
                            for _ in 0..rng.range(130, 400) {
                                let d = 5_000 + rng.below(1_000);
                                mine.push(Real::schedule(&real, &engine, &live, ms(d)));
                            }
                            for &(id, handle) in mine.iter().step_by(3) {
                                real.cancel(&engine, id, handle);
                            }
                            drop(engine);
                            parked.wait();
                            if t != 0 {
                                // Quiet, alive, through the engine's drop.
                                release.wait();
                            }
                        })
                    })
                    .collect();
                parked.wait();
                // Past some generations' need, before others'.
                std::thread::sleep(ms(round * 4));
                let engine =
                    Arc::try_unwrap(engine).unwrap_or_else(|_| panic!("the only engine handle"));
                drop(engine);
                let left = live.count();
                release.wait();
                for thread in threads {
                    thread.join().unwrap();
                }
                assert_eq!(
                    left, 0,
                    "round {round}: captures alive after the engine's drop"
                );
                let timers = real.timers.lock().unwrap();
                assert!(timers.iter().all(|t| t.ran.is_empty()), "a 5 s timer ran");
                assert!(timers.iter().all(|t| t.dropped.is_some()));
            }
        },
    );
}

// Short-lived threads, two at a time, each arm a few hundred timers (parking most of them),
// cancel and reset some, and exit at once: their lanes close with generations on them
// while the workers take what is due. Never early, exactly once, nothing lost.
#[test]
fn short_lived_threads_exit_right_after_parking() {
    within(Duration::from_secs(60), "short-lived threads", || {
        let engine = unpinned(2);
        let real = Arc::new(Real::default());
        let live = Live::default();
        for wave in 0..40_u64 {
            let threads: Vec<_> = (0..2_u64)
                .map(|t| {
                    let (engine, real, live) =
                        (Arc::clone(&engine), Arc::clone(&real), live.clone());
                    std::thread::spawn(move || {
                        let mut rng = Rng(wave * 2 + t);
                        let mut mine = Vec::new();
                        for _ in 0..rng.range(64, 330) {
                            let d = if rng.percent(25) {
                                rng.below(12)
                            } else {
                                20 + rng.below(400)
                            };
                            mine.push(Real::schedule(&real, &engine, &live, ms(d)));
                        }
                        for _ in 0..rng.below(40) {
                            let (id, handle) = mine[rng.below(mine.len() as u64) as usize];
                            if rng.percent(50) {
                                real.cancel(&engine, id, handle);
                            } else {
                                real.reset(&engine, id, handle, ms(rng.below(30)));
                            }
                        }
                    })
                })
                .collect();
            for thread in threads {
                thread.join().unwrap();
            }
            std::thread::sleep(ms(wave % 12));
        }
        let worst = real.check(&engine, &live, Duration::from_secs(10));
        eprintln!(
            "short_lived_threads: {} timers, worst drop after cancel {worst:?}",
            real.timers.lock().unwrap().len()
        );
    });
}

// The quietest case on the real clock: one thread arms 200 long timers (128 of them are
// parked), cancels every one, and arms nothing more; nothing else runs on the engine.
// Only the owner's takes of the lane at each stack's own need can free them. Measures
// how long the captures (probed by an `Arc`'s strong count) outlive the cancels.
#[test]
fn a_quiet_threads_cancelled_timers_are_freed_by_the_owner() {
    within(Duration::from_secs(60), "quiet cancels", || {
        let engine = unpinned(2);
        let mut times = Vec::new();
        for _round in 0..3 {
            let probe = Arc::new(());
            let (tx, rx) = mpsc::channel();
            let release = Arc::new(Barrier::new(2));
            let armer = {
                let (engine, probe, release) = (
                    Arc::clone(&engine),
                    Arc::clone(&probe),
                    Arc::clone(&release),
                );
                std::thread::spawn(move || {
                    let handles: Vec<_> = (0..200)
                        .map(|i| {
                            let probe = Arc::clone(&probe);
                            engine
                                .schedule(ms(10_000 + i), move || drop(probe))
                                .unwrap()
                        })
                        .collect();
                    drop(probe);
                    let cancelled_at = Instant::now();
                    let all = handles.iter().all(|&handle| engine.cancel(handle));
                    tx.send((all, cancelled_at)).unwrap();
                    // Quiet, alive, until measured.
                    release.wait();
                })
            };
            let (all, cancelled_at) = rx.recv().unwrap();
            assert!(all, "every cancel of a pending timer succeeds");
            let freed = eventually(Duration::from_secs(5), || Arc::strong_count(&probe) == 1);
            let took = cancelled_at.elapsed();
            let alive = Arc::strong_count(&probe) - 1;
            release.wait();
            armer.join().unwrap();
            assert!(
                freed,
                "{alive} captures still alive 5 s after their cancels, the thread quiet"
            );
            times.push(took);
        }
        eprintln!("quiet cancels freed after {times:?}");
        assert!(
            eventually(Duration::from_secs(5), || engine.nodes_in_use() == 0),
            "{} nodes in use",
            engine.nodes_in_use()
        );
    });
}

// A stack left behind by a take that read a stale need must be covered by the wake-up
// handshake: here every short timer is the only thing due, pushed on a young stack that
// the owner has just emptied (or beside parked generations with needs of their own),
// while the owner sleeps; the thread then waits for it. A timer left on the lane with the
// owner asleep would stall a round until the owner's next wake-up for something else
// (none comes: the other timers are far off or cancelled).
#[test]
fn each_short_timer_fires_while_its_thread_waits_for_it() {
    within(Duration::from_secs(60), "ping-pong", || {
        let engine = unpinned(2);
        let mut rng = Rng(0x9199);
        let mut lateness = Vec::new();
        let mut parked = Vec::new();
        for round in 0..1_500 {
            if round % 50 == 0 {
                // Park a generation (and keep a young stack) of far timers, cancelling
                // most: their stacks' needs come and go between the rounds.
                for handle in parked.drain(..) {
                    engine.cancel(handle);
                }
                for i in 0..rng.range(130, 260) {
                    parked.push(engine.schedule(ms(60_000 + i), || {}).unwrap());
                }
            }
            let (tx, rx) = mpsc::channel();
            let d = rng.below(3);
            let before = Instant::now();
            engine
                .schedule(ms(d), move || {
                    let _ = tx.send(Instant::now());
                })
                .unwrap();
            let ran = rx
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("round {round}: a {d} ms timer did not run in 20 s"));
            assert!(ran >= before + ms(d), "round {round}: ran early");
            lateness.push(ran - (before + ms(d)));
            if rng.percent(30) {
                // Let the owner settle into a sleep first.
                std::thread::sleep(Duration::from_micros(rng.below(4_000)));
            }
        }
        for handle in parked {
            engine.cancel(handle);
        }
        lateness.sort_unstable();
        eprintln!(
            "ping-pong lateness: median {:?}, p99 {:?}, max {:?}",
            lateness[lateness.len() / 2],
            lateness[lateness.len() * 99 / 100],
            lateness[lateness.len() - 1]
        );
        assert!(
            eventually(Duration::from_secs(5), || engine.nodes_in_use() == 0),
            "{} nodes in use",
            engine.nodes_in_use()
        );
    });
}

/// A waker that notes the manual-clock ms of each wake.
struct TimedWake {
    woken: Mutex<Vec<u64>>,
    clock: ManualClock,
    start: Instant,
}

impl std::task::Wake for TimedWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let at = self.clock.now().duration_since(self.start).as_millis() as u64;
        self.woken.lock().unwrap().push(at);
    }
}

// `Sleep`s polled once by a thread that then only turns the engine: their waker timers
// park on its lane like any other. Each is woken once, at its own tick; those reset
// earlier (the shard made urgent) at their new one; those dropped (a retired waker timer)
// never, and their wakers are let go within the bound.
#[test]
fn parked_sleeps_wake_at_their_tick() {
    let (engine, clock) = manual(1);
    let start = clock.now();
    let wakes: Vec<Arc<TimedWake>> = (0..200)
        .map(|_| {
            Arc::new(TimedWake {
                woken: Mutex::default(),
                clock: clock.clone(),
                start,
            })
        })
        .collect();
    let mut sleeps: Vec<Option<corewheel::Sleep<'_>>> = (0..200_u64)
        .map(|i| Some(engine.sleep(ms(40 + (i * 13) % 500))))
        .collect();
    let mut due: Vec<Option<u64>> = (0..200_u64).map(|i| Some(40 + (i * 13) % 500)).collect();
    let waker_of = |i: usize| std::task::Waker::from(Arc::clone(&wakes[i]));
    for (i, sleep) in sleeps.iter_mut().enumerate() {
        let sleep = sleep.as_mut().unwrap();
        assert!(support::poll(sleep, &waker_of(i)).is_pending());
    }
    run_for(&engine, &clock, 2);
    // Parked (below 128) and young ones: earlier, to before and after the generation's need.
    for (i, delay) in [(0_usize, 1_u64), (1, 6), (2, 12), (150, 3), (199, 0)] {
        let now = clock.now().duration_since(start).as_millis() as u64;
        sleeps[i].as_mut().unwrap().reset(clock.now() + ms(delay));
        due[i] = Some((now + delay).max(now + 1));
    }
    for i in [3_usize, 4, 5, 100, 160] {
        sleeps[i] = None;
        due[i] = None;
    }
    let retired_at = clock.now().duration_since(start).as_millis() as u64;
    for _ in 0..560 {
        run_for(&engine, &clock, 1);
        let now = clock.now().duration_since(start).as_millis() as u64;
        for (i, wake) in wakes.iter().enumerate() {
            let woken = wake.woken.lock().unwrap().clone();
            match due[i] {
                Some(at) if at <= now => assert_eq!(woken, vec![at], "sleep {i} at {now} ms"),
                _ => assert!(
                    woken.is_empty(),
                    "sleep {i} woken at {woken:?}, due {:?}",
                    due[i]
                ),
            }
            if due[i].is_none() && now >= retired_at + DROP_BOUND {
                assert_eq!(
                    Arc::strong_count(wake),
                    1,
                    "the dropped sleep {i}'s waker still held at {now} ms"
                );
            }
        }
    }
    drop(sleeps);
    run_for(&engine, &clock, 40);
    assert_eq!(engine.nodes_in_use(), 0);
}
