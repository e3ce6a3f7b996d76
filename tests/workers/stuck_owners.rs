//! Stuck owners and what watching them costs: a worker that helps another shard marks its
//! own running (`Helper::running`), a stuck owner with nothing due is watched rather than
//! stood in for in a loop (`Balance::watch_until`, `Balance::work_waiting`), and an owner
//! beginning to run counts only on sleeping workers to watch (`another_looks_by`).
//!
//! The cases, beyond `rescue_watch`: what a long stuck episode costs with many workers
//! (wake-ups counted per worker thread) and with `rescue_after` at 0; several owners stuck
//! at once with timers due right away, several periods later, armed from other threads
//! and from the stuck callbacks, reset earlier and cancelled while stuck; a helper stuck in
//! a run it stole (not stood in for); a stand-in whose callback arms a timer and then
//! blocks; many unpinned workers on two cores; a `rescue_after` of hundreds of ticks and of
//! `u32::MAX`; and shutdown (`Run`, and dropping the engine) while owners are stuck and the
//! watcher sleeps.
//!
//! Real-clock tests assert only what holds on a loaded 2-core machine: never early,
//! exactly once, nothing lost, a rescue within [`LIMIT`], and costs with wide margins.
//! Every blocked callback is released either way, so a failing test fails, not hangs.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak, mpsc};
use std::time::{Duration, Instant};

use crate::support::stuck::{
    Gate, OpenOnDrop, agents, block_owner_and_stand_in, blocking, engine, on_agent, started,
    worker_index,
};
use crate::support::{CpuWindow, Live, ms, serial, within, worker_switches};
use corewheel::{PendingTimers, TimerEngine};

/// How long a timer that must be rescued may take before the test calls it held up.
const LIMIT: Duration = Duration::from_secs(20);

/// Per-timer records: how often each ran, and how many ran before their deadline.
#[derive(Default)]
struct Book {
    fires: Mutex<Vec<(String, Arc<AtomicU8>)>>,
    early: AtomicUsize,
}

impl Book {
    /// A callback for a timer due at `due`, named `name`, that counts its runs and an
    /// early one.
    fn timer(self: &Arc<Self>, name: String, due: Instant) -> impl FnOnce() + Send + 'static {
        let fires = Arc::new(AtomicU8::new(0));
        self.fires.lock().unwrap().push((name, Arc::clone(&fires)));
        let book = Arc::clone(self);
        move || {
            if Instant::now() < due {
                book.early.fetch_add(1, Ordering::SeqCst);
            }
            fires.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The timers that have not run (or, with `twice`, that ran more than once).
    fn not_once(&self, twice: bool) -> Vec<String> {
        self.fires
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, fires)| {
                let fires = fires.load(Ordering::SeqCst);
                if twice { fires > 1 } else { fires == 0 }
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn all_ran(&self) -> bool {
        self.not_once(false).is_empty()
    }

    /// Waits up to [`LIMIT`] for every timer while `gate` holds a callback blocked, notes
    /// those not run, opens the gate, checks that each then ran once and none early, and
    /// shuts `engine` down with nothing pending. Returns the timers that waited for the gate.
    fn held_up_until_opened(&self, gate: &Gate, engine: &TimerEngine) -> Vec<String> {
        let missing = if self.wait_all(LIMIT) {
            Vec::new()
        } else {
            self.not_once(false)
        };
        gate.open();
        assert!(self.wait_all(LIMIT), "never ran at all");
        assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
        assert_eq!(self.early.load(Ordering::SeqCst), 0, "ran early");
        assert!(self.not_once(true).is_empty(), "ran twice");
        missing
    }

    /// Waits up to `limit` for every timer to have run.
    fn wait_all(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if self.all_ran() {
                return true;
            }
            std::thread::sleep(ms(1));
        }
        self.all_ran()
    }
}

/// One 2 s window's wake-ups of the workers: in all, and how many workers had any; and
/// the process's CPU use in cores (`None` where it cannot be read).
fn window() -> (u64, usize, Option<f64>) {
    let (before, cpu) = (worker_switches(), CpuWindow::start());
    std::thread::sleep(Duration::from_secs(2));
    let (after, cores) = (worker_switches(), cpu.cores());
    let deltas: Vec<u64> = after
        .iter()
        .filter_map(|(id, n)| {
            let (_, m) = before.iter().find(|(other, _)| other == id)?;
            Some(n.saturating_sub(*m))
        })
        .collect();
    (
        deltas.iter().sum(),
        deltas.iter().filter(|&&d| d > 0).count(),
        cores,
    )
}

/// An owner stuck with nothing due, at many workers: the one watcher looks once every
/// `rescue_after` ticks, so about `2000 / rescue_after` wake-ups per 2 s window, by one
/// worker. Guards a fault since fixed: each look stood in with the watcher's own shard
/// marked running and called `Balance::running` even when it ran nothing: the watcher is
/// awake (its watch ended), so nobody watched and no sleeper counted, and it woke a parked
/// worker, which stood in too (and might wake another) before it slept again: two to three
/// wake-ups per look, by three or four workers.
///
/// Fails when the quietest of three windows has more than 1.5 wake-ups per period (plus
/// 40), or when that window used 0.3 cores or more (a spinning worker uses a whole one;
/// 64 workers at `rescue_after` 1 use about 0.06 here in a debug build).
#[test]
fn a_stuck_owner_at_many_workers_costs_one_wake_up_a_period() {
    let _serial = serial();
    let mut over = Vec::new();
    for (workers, rescue) in [(4, 8), (16, 2), (64, 1)] {
        let engine = engine(workers, Some(rescue));
        let gate = Gate::default();
        let _release = OpenOnDrop(gate.clone());
        let (started_tx, started_rx) = mpsc::channel();
        engine
            .schedule(ms(20), blocking(&gate, &started_tx))
            .unwrap();
        started(&started_rx, "the blocking callback");
        std::thread::sleep(ms(500));
        let windows: Vec<_> = (0..3).map(|_| window()).collect();
        let quietest = *windows.iter().min_by_key(|(wakes, ..)| *wakes).unwrap();
        gate.open();
        assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
        let periods = 2000 / u64::from(rescue);
        println!(
            "{workers} workers, rescue_after {rescue}: (wake-ups, workers woken, cores) per \
             2 s window {windows:?}, {periods} periods"
        );
        let (wakes, _, cores) = quietest;
        if wakes > periods * 3 / 2 + 40 || cores.is_some_and(|cores| cores >= 0.3) {
            over.push((workers, rescue, quietest, periods));
        }
    }
    assert!(
        over.is_empty(),
        "an owner stuck with nothing due cost more than one worker's look a period: \
         (workers, rescue_after, (wake-ups, workers woken, cores), periods): {over:?}"
    );
}

/// `rescue_after(Some(0))` is accepted. Guards a fault since fixed: a worker going to sleep
/// within the tick an owner began running timers (`ran_within(64 * 0)`) got `watch_until` =
/// now, so it never parked (`wake > now_tick` failed in the worker loop) and spun out the
/// tick: one owner with a 1 ms repeating timer kept the other worker busy nearly all the
/// time. `Some(1)` costs under a tenth of a core here.
///
/// Fails when each of three 2 s windows uses half a core or more.
#[test]
fn rescue_after_zero_does_not_spin_beside_a_busy_owner() {
    let _serial = serial();
    let mut readings = Vec::new();
    for rescue in [Some(1), Some(0)] {
        let engine = engine(2, rescue);
        let handle = engine.schedule_repeating(ms(1), || {}).unwrap();
        std::thread::sleep(ms(300));
        let windows: Vec<Option<f64>> = (0..3).map(|_| window().2).collect();
        assert!(engine.cancel(handle));
        assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
        readings.push((rescue, windows));
    }
    println!("cores per 2 s window: {readings:?}");
    for (rescue, windows) in &readings {
        let quietest = windows.iter().flatten().copied().fold(f64::MAX, f64::min);
        assert!(
            quietest < 0.5,
            "rescue_after {rescue:?}: a 1 ms repeating timer kept a core busy: {readings:?}"
        );
    }
}

/// Several owners stuck at once, with fewer idle workers than stuck owners (down to one),
/// and timers on the stuck shards due right away, several `rescue_after` periods later and
/// much later: armed by each stuck callback just before it blocks (on its own lane), by
/// other threads onto the stuck shards while they are stuck, and before (in the published
/// deadline); one far timer per stuck shard reset to soon and one cancelled while stuck.
///
/// Fails when a timer has not run [`LIMIT`] after the last was due while the callbacks
/// block, or on any early or second run, or a run after a cancel that returned `true`.
#[test]
fn several_stuck_owners_have_every_timer_rescued_exactly_once() {
    let _serial = serial();
    for (workers, stuck, rescue) in [(4, 3, 1_u64), (6, 3, 8), (3, 2, 40)] {
        within(
            Duration::from_secs(120),
            "several stuck owners",
            move || {
                several_stuck(workers, stuck, rescue);
            },
        );
    }
}

fn several_stuck(workers: usize, stuck: usize, rescue: u64) {
    let engine = engine(workers, Some(rescue as u32));
    let agents = agents(&engine);
    let gate = Gate::default();
    let _release = OpenOnDrop(gate.clone());
    let book = Arc::new(Book::default());
    let (started_tx, started_rx) = mpsc::channel();
    let t0 = Instant::now() + ms(200);
    let period = ms(rescue);
    for (shard, agent) in agents.iter().enumerate().take(stuck) {
        let (weak, gate, book, started_tx) = (
            Arc::downgrade(&engine),
            gate.clone(),
            Arc::clone(&book),
            started_tx.clone(),
        );
        on_agent(agent, move || {
            let engine = weak.upgrade().unwrap();
            let (weak, armed) = (Arc::downgrade(&engine), Arc::clone(&book));
            engine
                .schedule_at(t0 + ms(shard as u64), move || {
                    if let Some(engine) = weak.upgrade() {
                        let now = Instant::now();
                        for (name, due) in [
                            ("1 ms", now + ms(1)),
                            ("5 periods", now + 5 * period),
                            ("30 periods", now + 30 * period),
                        ] {
                            let callback = armed.timer(format!("{shard}: own, {name}"), due);
                            engine.schedule_at(due, callback).unwrap();
                        }
                    }
                    let _ = started_tx.send(worker_index());
                    gate.wait();
                })
                .unwrap();
            let due = t0 + ms(400);
            let callback = book.timer(format!("{shard}: before, t0+400ms"), due);
            engine.schedule_at(due, callback).unwrap();
        });
    }
    for _ in 0..stuck {
        started(&started_rx, "a blocking callback");
    }
    let cancelled_ran = Arc::new(AtomicBool::new(false));
    let mut cancels = Vec::new();
    for (shard, agent) in agents.iter().enumerate().take(stuck) {
        let (weak, book, cancelled_ran) = (
            Arc::downgrade(&engine),
            Arc::clone(&book),
            Arc::clone(&cancelled_ran),
        );
        cancels.push(on_agent(agent, move || {
            let engine = weak.upgrade().unwrap();
            let now = Instant::now();
            for (name, due) in [
                ("1 ms", now + ms(1)),
                ("3 periods", now + 3 * period),
                ("20 periods", now + 20 * period),
            ] {
                let callback = book.timer(format!("{shard}: other thread, {name}"), due);
                engine.schedule_at(due, callback).unwrap();
            }
            // Something far in the wheel, cancelled once the callbacks are released.
            let far = engine.schedule(Duration::from_secs(3600), || {}).unwrap();
            // Not the book's: its deadline moves. Early is judged against the new one.
            let soon = now + ms(30);
            let reset_fires = Arc::new(AtomicU8::new(0));
            let (fires, early_book) = (Arc::clone(&reset_fires), Arc::clone(&book));
            let moved = engine
                .schedule_at(now + Duration::from_secs(3600), move || {
                    if Instant::now() < soon {
                        early_book.early.fetch_add(1, Ordering::SeqCst);
                    }
                    fires.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
            book.fires
                .lock()
                .unwrap()
                .push((format!("{shard}: reset to 30 ms"), reset_fires));
            assert!(engine.reset_at(moved, soon), "a pending timer resets");
            let doomed = engine
                .schedule_at(now + 2 * period + ms(5), move || {
                    cancelled_ran.store(true, Ordering::SeqCst);
                })
                .unwrap();
            (far, engine.cancel(doomed))
        }));
    }
    let all = book.wait_all(LIMIT);
    let missing = book.not_once(false);
    let stats = engine.stats();
    gate.open();
    assert!(
        book.wait_all(LIMIT),
        "never ran at all: {:?}",
        book.not_once(false)
    );
    for (far, _) in &cancels {
        assert!(engine.cancel(*far));
    }
    let cancelled: Vec<bool> = cancels.iter().map(|&(_, cancelled)| cancelled).collect();
    std::thread::sleep(ms(50));
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
    assert_eq!(book.early.load(Ordering::SeqCst), 0, "ran early");
    assert!(
        book.not_once(true).is_empty(),
        "ran twice: {:?}",
        book.not_once(true)
    );
    if cancelled.iter().all(|&c| c) {
        assert!(
            !cancelled_ran.load(Ordering::SeqCst),
            "ran after its cancel"
        );
    }
    assert!(
        all,
        "{workers} workers, {stuck} stuck, rescue_after {rescue}: not run while the owners \
         were stuck: {missing:?} (rescued per shard {:?})",
        stats.shards.iter().map(|s| s.rescued).collect::<Vec<_>>()
    );
}

/// Three workers. Shard A's owner claims a burst of 96 timers at once (a backlog, so idle
/// workers steal runs of it; its own callbacks sleep 200 µs each so that the burst lasts).
/// The first of them run by another worker W blocks: W is stuck in a run it took from A,
/// its own wheel unlooked at (`Helper::running` marks its shard running for this). W's
/// shard's timer, and every shard's, must still run; the burst's timers that W claimed in
/// the same run wait for it (as documented), and run once it is released.
///
/// Fails when a shard's timer has not run [`LIMIT`] after it was due while W is blocked,
/// or on a timer of the burst not run once, or any early run.
#[test]
fn a_worker_stuck_in_a_run_it_took_from_a_backlog_is_rescued() {
    let _serial = serial();
    let engine = engine(3, Some(4));
    let agents = agents(&engine);
    let a = 0;
    let gate = Gate::default();
    let _release = OpenOnDrop(gate.clone());
    let (book, burst) = (Arc::new(Book::default()), Arc::new(Book::default()));
    let (started_tx, started_rx) = mpsc::channel();
    let blocked = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now() + ms(200);
    {
        let (weak, gate, burst, blocked) = (
            Arc::downgrade(&engine),
            gate.clone(),
            Arc::clone(&burst),
            Arc::clone(&blocked),
        );
        on_agent(&agents[a], move || {
            let engine = weak.upgrade().unwrap();
            for k in 0..96 {
                let counted = burst.timer(format!("A's burst {k}"), t0);
                let (gate, blocked, started_tx) =
                    (gate.clone(), Arc::clone(&blocked), started_tx.clone());
                engine
                    .schedule_at(t0, move || {
                        counted();
                        match worker_index() {
                            Some(me) if me == a => std::thread::sleep(Duration::from_micros(200)),
                            me => {
                                if !blocked.swap(true, Ordering::SeqCst) {
                                    let _ = started_tx.send(me);
                                    gate.wait();
                                }
                            }
                        }
                    })
                    .unwrap();
            }
        });
    }
    for (shard, agent) in agents.iter().enumerate() {
        let (weak, book) = (Arc::downgrade(&engine), Arc::clone(&book));
        on_agent(agent, move || {
            let engine = weak.upgrade().unwrap();
            let due = t0 + ms(300);
            let callback = book.timer(format!("shard {shard}'s timer at t0+300ms"), due);
            engine.schedule_at(due, callback).unwrap();
        });
    }
    let w = started(&started_rx, "a helper's blocking callback");
    let all = book.wait_all(LIMIT);
    let missing = book.not_once(false);
    let stats = engine.stats();
    gate.open();
    assert!(book.wait_all(LIMIT), "never ran at all");
    assert!(
        burst.wait_all(LIMIT),
        "not run: {:?}",
        burst.not_once(false)
    );
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
    for book in [&book, &burst] {
        assert_eq!(book.early.load(Ordering::SeqCst), 0, "ran early");
        assert!(book.not_once(true).is_empty(), "ran twice");
    }
    assert!(
        all,
        "held up while worker {w:?} was blocked in a run of shard {a}'s (stolen per shard \
         {:?}, rescued {:?}): {missing:?}",
        stats.shards.iter().map(|s| s.stolen).collect::<Vec<_>>(),
        stats.shards.iter().map(|s| s.rescued).collect::<Vec<_>>()
    );
}

/// Three workers, `rescue_after` 2. Shard A's owner blocks; its next timer is run by a
/// stand-in W, and that callback arms a timer (onto W's own shard, its home) and then
/// blocks. The timer sits on W's lane or wheel, which W no longer looks at: the third
/// worker must run it, and a timer armed on A by another thread meanwhile.
///
/// Fails when either has not run [`LIMIT`] after it was due while both callbacks block.
#[test]
fn a_stand_in_that_arms_a_timer_and_then_blocks_has_it_rescued() {
    let _serial = serial();
    let engine = engine(3, Some(2));
    let gate = Gate::default();
    let _release = OpenOnDrop(gate.clone());
    let book = Arc::new(Book::default());
    let (started_tx, started_rx) = mpsc::channel();
    let t0 = Instant::now() + ms(100);
    let (held, tx) = (gate.clone(), started_tx.clone());
    engine
        .schedule_at(t0, move || {
            let _ = tx.send(worker_index());
            held.wait();
        })
        .unwrap();
    let (weak, held, armed) = (Arc::downgrade(&engine), gate.clone(), Arc::clone(&book));
    engine
        .schedule_at(t0 + ms(30), move || {
            if let Some(engine) = weak.upgrade() {
                let due = Instant::now() + ms(50);
                let callback = armed.timer("armed by the stand-in".to_owned(), due);
                engine.schedule_at(due, callback).unwrap();
            }
            let _ = started_tx.send(worker_index());
            held.wait();
        })
        .unwrap();
    let a = started(&started_rx, "A's blocking callback");
    let w = started(&started_rx, "the stand-in's blocking callback");
    assert_ne!(a, w, "a stand-in ran A's second callback");
    let due = Instant::now() + ms(40);
    let callback = book.timer("armed on A while stuck".to_owned(), due);
    engine.schedule_at(due, callback).unwrap();
    let missing = book.held_up_until_opened(&gate, &engine);
    assert!(
        missing.is_empty(),
        "held up while A's owner ({a:?}) and its stand-in ({w:?}) were blocked: {missing:?}"
    );
}

/// Many unpinned workers on two cores, one owner stuck, `rescue_after` 1 and 16: timers
/// armed on the stuck shard before it blocks (due well after), by the stuck callback, and
/// by the test thread while it is stuck, and timers on other shards from other threads.
///
/// Fails when a timer has not run [`LIMIT`] after it was due while the callback blocks,
/// or on an early or second run.
#[test]
fn many_workers_with_one_stuck_owner_run_every_timer_once() {
    let _serial = serial();
    for (workers, rescue) in [(48, 1_u64), (24, 16)] {
        let engine = engine(workers, Some(rescue as u32));
        let gate = Gate::default();
        let _release = OpenOnDrop(gate.clone());
        let book = Arc::new(Book::default());
        let (started_tx, started_rx) = mpsc::channel();
        let t0 = Instant::now() + ms(300);
        let (weak, held, armed) = (Arc::downgrade(&engine), gate.clone(), Arc::clone(&book));
        engine
            .schedule_at(t0, move || {
                if let Some(engine) = weak.upgrade() {
                    let now = Instant::now();
                    for k in 1..=4 {
                        let due = now + ms(k * k * rescue);
                        let callback = armed.timer(format!("from the stuck callback {k}"), due);
                        engine.schedule_at(due, callback).unwrap();
                    }
                }
                let _ = started_tx.send(worker_index());
                held.wait();
            })
            .unwrap();
        for k in 1..=3 {
            let due = t0 + ms(100 * k);
            let callback = book.timer(format!("before, t0+{}ms", 100 * k), due);
            engine.schedule_at(due, callback).unwrap();
        }
        let others: Vec<_> = (0..4)
            .map(|t| {
                let (weak, book) = (Arc::downgrade(&engine), Arc::clone(&book));
                std::thread::spawn(move || {
                    let engine = weak.upgrade().unwrap();
                    for k in 0..20_u64 {
                        let due = t0 + ms(10 * k);
                        let callback = book.timer(format!("thread {t} timer {k}"), due);
                        engine.schedule_at(due, callback).unwrap();
                    }
                })
            })
            .collect();
        for other in others {
            other.join().unwrap();
        }
        started(&started_rx, "the blocking callback");
        let now = Instant::now();
        for k in 0..5 {
            let due = now + ms(k * rescue + 1);
            let callback = book.timer(format!("while stuck {k}"), due);
            engine.schedule_at(due, callback).unwrap();
        }
        let missing = book.held_up_until_opened(&gate, &engine);
        assert!(
            missing.is_empty(),
            "{workers} workers, rescue_after {rescue}: not run while an owner was stuck: \
             {missing:?}"
        );
    }
}

/// A `rescue_after` of 400 ticks: a timer due right after an owner blocks runs once the
/// owner has been stuck that long, never early. And of `u32::MAX` (never stuck in
/// practice): nothing overflows (a worker panicking on it would lose its timers), the
/// engine stays quiet while the owner blocks, and the timer runs once it returns.
///
/// Fails on a timer not run within [`LIMIT`] (while blocked, for 400; after, for the
/// largest), an early run, or a worker busy while the owner blocks.
#[test]
fn large_rescue_afters_rescue_late_or_never_but_never_spin() {
    let _serial = serial();
    for rescue in [400, u32::MAX] {
        let engine = engine(3, Some(rescue));
        let gate = Gate::default();
        let _release = OpenOnDrop(gate.clone());
        let book = Arc::new(Book::default());
        // Read in the callback: this thread may run well after it has begun.
        let (started_tx, started_rx) = mpsc::channel();
        let blocked = gate.clone();
        engine
            .schedule(ms(20), move || {
                let _ = started_tx.send(Instant::now());
                blocked.wait();
            })
            .unwrap();
        let blocked_at = started_rx
            .recv_timeout(LIMIT)
            .expect("the blocking callback never ran");
        let due = blocked_at + ms(2);
        engine
            .schedule_at(due, book.timer("due right after".to_owned(), due))
            .unwrap();
        let (rescued, cores) = if rescue == u32::MAX {
            std::thread::sleep(ms(300));
            (false, window().2)
        } else {
            (book.wait_all(LIMIT), None)
        };
        let waited = blocked_at.elapsed();
        gate.open();
        assert!(book.wait_all(LIMIT), "never ran at all");
        assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
        assert_eq!(book.early.load(Ordering::SeqCst), 0, "ran early");
        assert!(book.not_once(true).is_empty(), "ran twice");
        if rescue == u32::MAX {
            assert!(
                cores.is_none_or(|cores| cores < 0.3),
                "busy while an owner blocked: {cores:?} cores"
            );
        } else {
            assert!(rescued, "not rescued within {LIMIT:?}");
            assert!(
                waited >= ms(u64::from(rescue) / 2),
                "rescued after only {waited:?}: the owner was not stuck yet"
            );
        }
    }
}

/// How the shutdown under test is made.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// `shutdown(PendingTimers::Run)`.
    Run,
    /// Dropping the last reference to the engine (pending timers dropped).
    Drop,
}

/// Four workers. Two owners block (one of them with a stand-in blocked in its next
/// callback), the fourth worker sleeps watching, and far timers wait on the stuck shards:
/// armed before, by a stuck callback, and by other threads while stuck. A shutdown begun
/// then waits for the callbacks (it joins the workers), and once they are released
/// returns, having run (or dropped) every pending timer exactly once and dropped every
/// capture.
///
/// Fails when the shutdown returns before the gate opens or not within [`LIMIT`] after,
/// when its report's count is not the pending timers', when a timer ran twice (or at all,
/// when dropped), or when a capture is left alive.
#[test]
fn shutdown_while_owners_are_stuck_and_the_watcher_sleeps() {
    let _serial = serial();
    for stop in [Stop::Run, Stop::Drop] {
        within(Duration::from_secs(120), "the shutdown test", move || {
            shutdown_while_stuck(stop);
        });
    }
}

fn shutdown_while_stuck(stop: Stop) {
    let engine = engine(4, Some(2));
    let agents = agents(&engine);
    let gate = Gate::default();
    let _release = OpenOnDrop(gate.clone());
    let live = Live::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let (started_tx, started_rx) = mpsc::channel();
    let far = Duration::from_secs(3600);
    // A far timer whose capture is counted and whose runs are counted.
    let far_timer = {
        let (live, runs) = (live.clone(), Arc::clone(&runs));
        move || {
            let witness = live.witness();
            let runs = Arc::clone(&runs);
            move || {
                let _witness = &witness;
                runs.fetch_add(1, Ordering::SeqCst);
            }
        }
    };
    let t0 = Instant::now() + ms(150);
    let mut pending = 0_u64;
    for (shard, blockers) in [(0, 2), (1, 1)] {
        let (weak, gate, started_tx, far_timer) = (
            Arc::downgrade(&engine),
            gate.clone(),
            started_tx.clone(),
            far_timer.clone(),
        );
        on_agent(&agents[shard], move || {
            let engine = weak.upgrade().unwrap();
            for k in 0..blockers {
                let (weak, gate, started_tx, far_timer) = (
                    Arc::downgrade(&engine),
                    gate.clone(),
                    started_tx.clone(),
                    far_timer.clone(),
                );
                engine
                    .schedule_at(t0 + ms(40 * k), move || {
                        if let Some(engine) = weak.upgrade() {
                            for _ in 0..5 {
                                engine.schedule(far, far_timer()).unwrap();
                            }
                        }
                        let _ = started_tx.send(worker_index());
                        gate.wait();
                    })
                    .unwrap();
            }
            for _ in 0..5 {
                engine.schedule(far, far_timer()).unwrap();
            }
        });
        pending += 5 + 5 * blockers;
    }
    for _ in 0..3 {
        started(&started_rx, "a blocking callback");
    }
    for agent in &agents {
        let (weak, far_timer) = (Arc::downgrade(&engine), far_timer.clone());
        on_agent(agent, move || {
            let engine = weak.upgrade().unwrap();
            for _ in 0..5 {
                engine.schedule(far, far_timer()).unwrap();
            }
        });
        pending += 5;
    }
    drop(agents);
    // Let the watcher settle into its sleep (nothing due on the stuck shards).
    std::thread::sleep(ms(300));
    let (done_tx, done_rx) = mpsc::channel();
    let weak: Weak<TimerEngine> = Arc::downgrade(&engine);
    let stopping = std::thread::spawn(move || {
        let report = match stop {
            Stop::Run => Some(engine.shutdown(PendingTimers::Run)),
            Stop::Drop => {
                // The agents have gone; the stuck callbacks hold no strong reference.
                while Arc::strong_count(&engine) > 1 {
                    std::thread::sleep(ms(1));
                }
                drop(engine);
                None
            }
        };
        let _ = done_tx.send(());
        report
    });
    let returned_early = done_rx.recv_timeout(ms(500)).is_ok();
    gate.open();
    let returned = done_rx.recv_timeout(LIMIT).is_ok();
    assert!(
        !returned_early,
        "{stop:?}: returned while callbacks were blocked"
    );
    assert!(
        returned,
        "{stop:?}: did not return within {LIMIT:?} of the release"
    );
    let report = stopping.join().unwrap();
    assert!(weak.upgrade().is_none(), "the engine outlived its shutdown");
    let (runs, live) = (runs.load(Ordering::SeqCst), live.count());
    match (stop, report) {
        (Stop::Run, Some(report)) => {
            assert_eq!(
                (report.ran, report.dropped, runs as u64),
                (pending, 0, pending),
                "{stop:?}: (ran, dropped, runs counted)"
            );
        }
        _ => assert_eq!(runs, 0, "{stop:?}: a pending timer ran"),
    }
    assert_eq!(live, 0, "{stop:?}: captures left alive");
}

/// Three workers. Shard A's owner blocks, and its stand-in W blocks in A's next callback
/// (holding A's timers in its hands). A shutdown begins; then A's owner is released, while
/// W still blocks. A's last turn waits for W's hands in `ShardParts::wait_for_hands`,
/// a `spin_until` that spins and yields: a core busy for as long as the helper's callback
/// blocks (stand-ins have held a shard's hands
/// since stealing began; helping now counts as running, but the wait is unchanged).
///
/// Fails when the quieter of two 2 s windows of that wait uses half a core or more, or
/// when the shutdown does not return within [`LIMIT`] of W's release.
#[test]
fn a_shutdown_waiting_for_a_blocked_helper_does_not_spin() {
    let _serial = serial();
    let engine = engine(3, Some(2));
    let (owners, helpers) = (Gate::default(), Gate::default());
    let _release = (OpenOnDrop(owners.clone()), OpenOnDrop(helpers.clone()));
    let (started_tx, started_rx) = mpsc::channel();
    let (a, w) = block_owner_and_stand_in(&engine, (&owners, &helpers), (&started_tx, &started_rx));
    let (done_tx, done_rx) = mpsc::channel();
    let stopping = Arc::clone(&engine);
    std::thread::spawn(move || {
        let _ = done_tx.send(stopping.shutdown(PendingTimers::Drop));
    });
    std::thread::sleep(ms(300));
    owners.open();
    std::thread::sleep(ms(300));
    let windows: Vec<Option<f64>> = (0..2).map(|_| window().2).collect();
    helpers.open();
    let report = done_rx.recv_timeout(LIMIT);
    println!("cores while the shutdown waited for the helper: {windows:?}");
    assert!(report.is_ok(), "the shutdown did not return");
    let quietest = windows.iter().flatten().copied().fold(f64::MAX, f64::min);
    assert!(
        quietest < 0.5,
        "a shutdown waiting for stand-in {w:?} blocked in shard {a:?}'s callback kept a core \
         busy: {windows:?} cores"
    );
}
