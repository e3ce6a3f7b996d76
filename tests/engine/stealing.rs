//! Expiry balancing as a user sees it: a stuck owner stood in for, deterministically on a
//! manual clock, and on the real clock a burst on one shard and a callback that sleeps a
//! second. The real-clock tests assert only what holds on a loaded 2-core machine: every
//! timer fires exactly once, never early, and a stuck owner's other timers are not held
//! up for the whole second; how much was stolen is printed, not asserted.

use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use crate::support::manual_with_rescue;
use corewheel::{Clock, ManualClock, PendingTimers, TimerEngine};

const TICK: Duration = Duration::from_millis(1);

/// The shard the calling thread's timers go to, found from the counts.
fn home_shard(engine: &TimerEngine) -> usize {
    let probe = engine.schedule(Duration::from_secs(3600), || {}).unwrap();
    let before = engine.stats();
    assert!(engine.cancel(probe));
    before
        .shards
        .iter()
        .position(|shard| shard.pending > 0)
        .expect("the probe is pending somewhere")
}

/// A callback that signals once it runs, then blocks until released: an owner stuck in a
/// callback, for as long as the test wants. Returns it, the signal and the release.
fn blocking_callback() -> (
    impl FnOnce() + Send + 'static,
    mpsc::Receiver<()>,
    mpsc::Sender<()>,
) {
    let (started_tx, started) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let callback = move || {
        started_tx.send(()).unwrap();
        release_rx.recv().unwrap();
    };
    (callback, started, release)
}

/// Turns the engine on a thread of its own, once the callback `started` reports is
/// running there; returns the thread.
fn turn_until_stuck(
    engine: &Arc<TimerEngine>,
    started: &mpsc::Receiver<()>,
) -> std::thread::JoinHandle<usize> {
    let engine = Arc::clone(engine);
    let owner = std::thread::spawn(move || engine.turn());
    started.recv().unwrap();
    owner
}

/// A manual engine whose owner thread is blocked inside a callback: another thread's turn
/// leaves the shard alone for `rescue_after` ticks, then stands in and runs its due timers
/// (counted as rescued and stolen) while the other shard runs as usual.
#[test]
fn a_turn_stands_in_for_a_stuck_owner_after_rescue_after_ticks() {
    let (engine, clock) = manual_with_rescue();
    let fired_at: Arc<Vec<AtomicU64>> = Arc::new((0..3).map(|_| AtomicU64::new(0)).collect());
    let origin = clock.now();
    let record = |slot: usize| {
        let (fired_at, clock) = (Arc::clone(&fired_at), clock.clone());
        move || {
            let at = clock.now().duration_since(origin).as_millis() as u64;
            fired_at[slot].store(at, Ordering::SeqCst);
        }
    };
    let (blocking, started, release) = blocking_callback();
    let stuck = home_shard(&engine);
    engine.schedule(TICK, blocking).unwrap();
    engine.schedule(TICK * 3, record(0)).unwrap();
    engine.schedule(TICK * 5, record(1)).unwrap();
    // Scheduled from another thread, whose home is the other shard.
    let other_engine = Arc::clone(&engine);
    let other_record = record(2);
    std::thread::spawn(move || other_engine.schedule(TICK * 3, other_record).unwrap())
        .join()
        .unwrap();
    assert_eq!(engine.stats().shards[stuck].scheduled, 4);

    clock.advance(TICK);
    let owner = turn_until_stuck(&engine, &started);
    // The owner is inside the callback from tick 1 on. At tick 3 it is only 2 ticks
    // behind: nobody stands in yet, but the other shard's timer runs on time.
    clock.advance(TICK * 2);
    assert_eq!(engine.turn(), 1);
    assert_eq!(
        fired_at[2].load(Ordering::SeqCst),
        3,
        "the other shard ran on time"
    );
    assert_eq!(fired_at[0].load(Ordering::SeqCst), 0, "stood in too soon");
    // At tick 4 the owner is more than 2 ticks behind: this turn stands in.
    clock.advance(TICK);
    assert_eq!(engine.turn(), 1);
    assert_eq!(fired_at[0].load(Ordering::SeqCst), 4);
    clock.advance(TICK);
    assert_eq!(engine.turn(), 1);
    assert_eq!(
        fired_at[1].load(Ordering::SeqCst),
        5,
        "on time while stood in for"
    );
    let stats = engine.stats().shards[stuck];
    assert_eq!((stats.rescued, stats.stolen), (2, 2));

    release.send(()).unwrap();
    assert_eq!(
        owner.join().unwrap(),
        1,
        "the owner ran only its own callback"
    );
    let stats = engine.stats().total;
    assert_eq!((stats.fired, stats.pending), (4, 0));
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
    assert_eq!(engine.nodes_in_use(), 0);
}

/// With rescue off, a stuck owner's due timers wait for it.
#[test]
fn without_rescue_a_stuck_owners_timers_wait_for_it() {
    let clock = ManualClock::new();
    let engine = Arc::new(
        TimerEngine::builder()
            .workers(1)
            .rescue_after(None)
            .manual_clock(clock.clone())
            .build()
            .unwrap(),
    );
    let (blocking, started, release) = blocking_callback();
    engine.schedule(TICK, blocking).unwrap();
    let later = engine.schedule(TICK * 2, || {}).unwrap();
    clock.advance(TICK);
    let owner = turn_until_stuck(&engine, &started);
    clock.advance(TICK * 100);
    assert_eq!(engine.turn(), 0);
    assert!(engine.is_pending(later));
    release.send(()).unwrap();
    // The owner's turn looks at its wheel again after the callback and runs the rest.
    assert_eq!(owner.join().unwrap(), 2);
    assert!(!engine.is_pending(later));
    assert_eq!(engine.stats().total.rescued, 0);
}

/// Per-timer record of a real-clock run.
struct Outcomes {
    fires: Vec<AtomicU8>,
    /// Nanoseconds from the deadline to the run.
    late_ns: Vec<AtomicU64>,
    early: AtomicUsize,
    done: AtomicUsize,
}

impl Outcomes {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Self {
            fires: (0..n).map(|_| AtomicU8::new(0)).collect(),
            late_ns: (0..n).map(|_| AtomicU64::new(0)).collect(),
            early: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
        })
    }

    fn callback(
        self: &Arc<Self>,
        index: usize,
        deadline: Instant,
    ) -> impl FnOnce() + Send + 'static {
        let outcomes = Arc::clone(self);
        move || {
            let now = Instant::now();
            if now < deadline {
                outcomes.early.fetch_add(1, Ordering::Relaxed);
            }
            outcomes.late_ns[index].store(
                now.saturating_duration_since(deadline).as_nanos() as u64,
                Ordering::Relaxed,
            );
            outcomes.fires[index].fetch_add(1, Ordering::Relaxed);
            outcomes.done.fetch_add(1, Ordering::Release);
        }
    }

    /// Waits (up to a generous minute) for `n` runs, then checks exactly once and never
    /// early.
    fn check_all_fired_once(&self, n: usize) {
        let give_up = Instant::now() + Duration::from_secs(60);
        while self.done.load(Ordering::Acquire) < n && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(5));
        }
        // Anything that would run twice would run by now too.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(self.early.load(Ordering::Relaxed), 0, "early fires");
        let wrong = self
            .fires
            .iter()
            .filter(|fires| fires.load(Ordering::Relaxed) != 1)
            .count();
        assert_eq!(wrong, 0, "timers that did not fire exactly once");
    }

    fn max_late(&self, range: std::ops::Range<usize>) -> Duration {
        Duration::from_nanos(
            self.late_ns[range]
                .iter()
                .map(|late| late.load(Ordering::Relaxed))
                .max()
                .unwrap_or(0),
        )
    }
}

/// Many timers from one thread onto one shard, all due within the same 10 ms, with
/// stealing on and off: each fires exactly once and never early either way.
#[test]
fn a_burst_on_one_shard_fires_exactly_once_with_stealing_on_and_off() {
    let timers = if cfg!(debug_assertions) {
        100_000
    } else {
        1_000_000
    };
    for stealing in [true, false] {
        let engine = TimerEngine::builder()
            .workers(2)
            .pin_workers(false)
            .stealing(stealing)
            .build()
            .unwrap();
        let outcomes = Outcomes::new(timers);
        let start = Instant::now() + Duration::from_millis(200);
        for index in 0..timers {
            let deadline = start + Duration::from_micros((index % 10_000) as u64);
            engine
                .schedule_at(deadline, outcomes.callback(index, deadline))
                .unwrap();
        }
        outcomes.check_all_fired_once(timers);
        // A run adds to the fired count after its last callback returns, and its worker
        // may be descheduled in between.
        let give_up = Instant::now() + Duration::from_secs(60);
        while engine.stats().total.fired < timers as u64 && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(5));
        }
        let stats = engine.stats().total;
        eprintln!(
            "burst, stealing {stealing}: {} fired, {} stolen, last {:?} late",
            stats.fired,
            stats.stolen,
            outcomes.max_late(0..timers)
        );
        assert_eq!(stats.fired, timers as u64);
        if !stealing {
            // An owner the machine deschedules mid-run for longer than `rescue_after` is
            // stood in for, and those runs count as stolen too: with stealing off, every
            // timer run elsewhere was claimed by a stand-in.
            assert!(
                stats.stolen <= stats.rescued,
                "stolen with stealing off: {stats:?}"
            );
        }
        assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
        assert_eq!(engine.nodes_in_use(), 0);
    }
}

/// A callback blocks its shard's owner while that shard's other timers come due: another
/// worker stands in, so they fire while the owner is still stuck. Timers on the other shard
/// are not held up either.
///
/// The callback stays blocked until those timers have fired (or a generous minute has
/// passed), rather than for a fixed time with a bound on lateness: a slow machine then only
/// makes the test wait longer, and a shard that waits for its stuck owner never fires them.
/// Only timers due by the moment the callback began may wait for it: its owner may have
/// claimed them into the same run.
#[test]
fn a_stuck_callback_does_not_hold_up_its_shards_other_timers() {
    const EACH: usize = 40;
    let engine = Arc::new(
        TimerEngine::builder()
            .workers(2)
            .pin_workers(false)
            .rescue_after(Some(2))
            .build()
            .unwrap(),
    );
    let stuck = home_shard(&engine);
    let outcomes = Outcomes::new(2 * EACH);
    let start = Instant::now() + Duration::from_millis(50);
    let deadline = |k: usize| start + Duration::from_millis(20 * (k as u64 % EACH as u64 + 1));
    let began = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let (release, release_rx) = mpsc::channel::<()>();
    {
        let began = Arc::clone(&began);
        engine
            .schedule_at(start, move || {
                *began.lock().unwrap() = Some(Instant::now());
                let _ = release_rx.recv();
            })
            .unwrap();
    }
    // Two scheduling threads: each has its own home shard, one of them the stuck one.
    std::thread::scope(|scope| {
        for thread in 0..2 {
            let (engine, outcomes) = (&engine, &outcomes);
            scope.spawn(move || {
                for k in 0..EACH {
                    let index = thread * EACH + k;
                    engine
                        .schedule_at(deadline(index), outcomes.callback(index, deadline(index)))
                        .unwrap();
                }
            });
        }
    });
    // The timers that must fire while the callback is blocked: those due after it began.
    // A tick of margin covers the rounding of deadlines up to ticks.
    let must_fire = |began: Instant| {
        (0..2 * EACH)
            .filter(|&index| deadline(index) > began + TICK)
            .collect::<Vec<_>>()
    };
    let unfired = |indices: &[usize]| {
        indices
            .iter()
            .filter(|&&index| outcomes.fires[index].load(Ordering::Relaxed) == 0)
            .count()
    };
    let give_up = Instant::now() + Duration::from_secs(60);
    let blocked_since = loop {
        let began = *began.lock().unwrap();
        if let Some(began) = began
            && (unfired(&must_fire(began)) == 0 || Instant::now() >= give_up)
        {
            break began;
        }
        assert!(Instant::now() < give_up, "the blocking callback never ran");
        std::thread::sleep(Duration::from_millis(5));
    };
    let expected = must_fire(blocked_since);
    let held_up = unfired(&expected);
    release.send(()).unwrap();
    assert_eq!(
        held_up,
        0,
        "{held_up} of the {} timers due after the callback blocked waited for it",
        expected.len()
    );
    outcomes.check_all_fired_once(2 * EACH);
    let stats = engine.stats();
    eprintln!(
        "stuck owner: {} of {} timers due while it was stuck, worst lateness {:?}, rescued {:?}",
        expected.len(),
        2 * EACH,
        outcomes.max_late(0..2 * EACH),
        stats.shards.iter().map(|s| s.rescued).collect::<Vec<_>>()
    );
    assert!(
        stats.shards[stuck].scheduled as usize > EACH,
        "the stuck shard had timers of its own to hold up: {stats:?}"
    );
    assert_eq!(engine.shutdown(PendingTimers::Drop).dropped, 0);
}
