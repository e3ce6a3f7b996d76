//! Helpers shared by the integration tests: a time limit that turns a hang into a
//! failure, counted captures, engines of unpinned workers, a hand-driven engine turned a
//! millisecond at a time, keyed timers whose handler records what it is given, a book of
//! one-shot timers' fires (`fire_book`), a counting allocator for the tests of what
//! allocates (`allocs`), a seeded random generator, and the lock of a binary whose tests
//! share process-wide state (`serial`, `shared`). Each binary includes it with
//! `#[path = "../support/mod.rs"] mod support;`.
// Each test binary uses only some of these.
#![allow(dead_code)]

pub mod allocs;
pub mod driven;
pub mod fire_book;
pub mod pool_attack;
pub mod run_log;
pub mod stuck;
pub mod wheel_harness;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use corewheel::{Clock, KeyedTimers, ManualClock, MissedTicks, Stats, TimerEngine, WorkerWakes};

/// Stats agree with what ran, for bursts of one-shot timers: `fired` is the runs, a
/// helper's claims off handed-out lists were run as stolen runs, a stand-in's claims ran,
/// nothing is pending, and the shards add up to the total. The stats it checked.
///
/// A worker counts a run of callbacks once the run's last one returns, so the counts can
/// trail the callbacks by as long as the machine keeps that worker off its core: they are
/// waited for (up to 20 s) before the check.
pub fn assert_one_shot_stats(engine: &TimerEngine, runs: u64) -> Stats {
    eventually(Duration::from_secs(20), || {
        let t = engine.stats().total;
        t.fired >= runs && t.pending == 0
    });
    let stats = engine.stats();
    let t = &stats.total;
    assert_eq!(t.fired, runs, "fired is not what ran: {t:?}");
    assert!(t.stolen <= t.fired, "stolen more than fired: {t:?}");
    assert!(
        t.claimed_elsewhere <= t.stolen,
        "claimed elsewhere but not run elsewhere: {t:?}"
    );
    assert!(t.rescued <= t.fired, "rescued more than fired: {t:?}");
    assert_eq!(t.pending, 0, "{t:?}");
    for (index, shard) in stats.shards.iter().enumerate() {
        assert!(
            shard.claimed_elsewhere <= shard.stolen && shard.stolen <= shard.fired,
            "shard {index}: claimed elsewhere, stolen and fired out of order: {shard:?}"
        );
    }
    let fired: u64 = stats.shards.iter().map(|s| s.fired).sum();
    let elsewhere: u64 = stats.shards.iter().map(|s| s.claimed_elsewhere).sum();
    assert_eq!((fired, elsewhere), (t.fired, t.claimed_elsewhere));
    stats
}

/// Waits until no worker of `engine` has counted a wake-up for two `quiet` intervals in
/// a row, failing after `limit` with the counts seen: an engine with nothing pending must
/// fall still (a watcher lingers 64 × `rescue_after` ticks after the last run, a quiet
/// lane's messages up to 32 ticks). Two, because one still interval can be a lingering
/// watcher kept off its core for that long; a fixed sleep is as long as the longest
/// stall it allows for.
pub fn settle_wakes(engine: &TimerEngine, quiet: Duration, limit: Duration, what: &str) {
    let wakes = || -> Vec<WorkerWakes> { engine.stats().shards.iter().map(|s| s.wakes).collect() };
    let until = Instant::now() + limit;
    let mut seen = vec![wakes()];
    let mut still = 0;
    loop {
        std::thread::sleep(quiet);
        let now = wakes();
        if now == *seen.last().expect("a first reading") {
            still += 1;
            if still == 2 {
                return;
            }
            continue;
        }
        still = 0;
        seen.push(now);
        assert!(
            Instant::now() < until,
            "{what}: wake-ups still moving after {limit:?} with nothing pending: {seen:?}; {:?}",
            engine.stats().total
        );
    }
}

/// Keeps the panics a test makes on purpose (whose messages contain `mark`, or a mark
/// another test of the binary gave) off stderr; every other panic is reported as usual. The
/// first call in a test binary sets the hook.
pub fn quiet_panics_marked(mark: &'static str) {
    static MARKS: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    static ONCE: std::sync::Once = std::sync::Once::new();
    {
        let mut marks = MARKS.lock().unwrap_or_else(|p| p.into_inner());
        if !marks.contains(&mark) {
            marks.push(mark);
        }
    }
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied());
            let marked = message.is_some_and(|m| {
                let marks = MARKS.lock().unwrap_or_else(|p| p.into_inner());
                marks.iter().any(|mark| m.contains(mark))
            });
            if !marked {
                default(info);
            }
        }));
    });
}

/// Runs `f` on a thread of its own and waits at most `limit` for it: a body that never
/// returns fails the test (naming `what`) instead of hanging the suite.
pub fn within<R: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (done, result) = mpsc::channel();
    let body = std::thread::spawn(move || {
        let _ = done.send(f());
    });
    match result.recv_timeout(limit) {
        Ok(value) => value,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what} did not return within {limit:?}"),
        // The body panicked: raise its panic here, message and all.
        Err(mpsc::RecvTimeoutError::Disconnected) => match body.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => panic!("{what} ended without a result"),
        },
    }
}

/// Counts the live values of one kind, so a test can tell when captures were dropped.
#[derive(Clone, Default)]
pub struct Live(Arc<AtomicUsize>);

/// One live value, counted by its [`Live`] from creation to drop.
pub struct Witness(Arc<AtomicUsize>);

impl Live {
    pub fn witness(&self) -> Witness {
        self.0.fetch_add(1, Ordering::SeqCst);
        Witness(Arc::clone(&self.0))
    }

    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Drop for Witness {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An engine of `workers` unpinned workers, shareable with the threads that race it.
pub fn unpinned(workers: usize) -> Arc<TimerEngine> {
    Arc::new(unpinned_engine(workers))
}

/// An engine of `workers` unpinned workers that lives for the rest of the test binary, so
/// that futures on it are `'static`, as spawned tasks must be.
pub fn leaked_unpinned(workers: usize) -> &'static TimerEngine {
    Box::leak(Box::new(unpinned_engine(workers)))
}

/// [`leaked_unpinned`] with ticks of `tick`.
pub fn leaked_unpinned_tick(workers: usize, tick: Duration) -> &'static TimerEngine {
    Box::leak(Box::new(
        TimerEngine::builder()
            .workers(workers)
            .tick(tick)
            .pin_workers(false)
            .build()
            .unwrap(),
    ))
}

/// An engine of `workers` unpinned workers with stealing and rescue as given.
pub fn unpinned_balancing(workers: usize, stealing: bool, rescue: Option<u32>) -> TimerEngine {
    TimerEngine::builder()
        .workers(workers)
        .pin_workers(false)
        .stealing(stealing)
        .rescue_after(rescue)
        .build()
        .expect("workers start")
}

fn unpinned_engine(workers: usize) -> TimerEngine {
    TimerEngine::builder()
        .workers(workers)
        .pin_workers(false)
        .build()
        .unwrap()
}

/// A hand-driven engine of `workers` shards on a new manual clock.
pub fn manual(workers: usize) -> (TimerEngine, ManualClock) {
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(workers)
        .manual_clock(clock.clone())
        .build()
        .expect("a manual engine");
    (engine, clock)
}

/// A hand-driven two-shard engine whose turns stand in for an owner that has not looked
/// at its wheel for two ticks while running callbacks.
pub fn manual_with_rescue() -> (Arc<TimerEngine>, ManualClock) {
    let clock = ManualClock::new();
    let engine = TimerEngine::builder()
        .workers(2)
        .rescue_after(Some(2))
        .manual_clock(clock.clone())
        .build()
        .expect("a manual engine");
    (Arc::new(engine), clock)
}

/// Milliseconds on `clock` since `start`.
pub fn since(clock: &ManualClock, start: Instant) -> u64 {
    clock.now().duration_since(start).as_millis() as u64
}

/// A waker that counts its wakes.
#[derive(Default)]
pub struct Wakes(pub AtomicUsize);

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Wakes {
    /// A counter and a waker that counts into it.
    pub fn waker() -> (Arc<Self>, Waker) {
        let wakes = Arc::new(Self::default());
        let waker = Waker::from(Arc::clone(&wakes));
        (wakes, waker)
    }

    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Polls `future` once with `waker`.
pub fn poll<F: Future + Unpin>(future: &mut F, waker: &Waker) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(waker))
}

/// Advances the clock one millisecond at a time, turning the engine after each step.
pub fn run_for(engine: &TimerEngine, clock: &ManualClock, millis: u64) {
    for _ in 0..millis {
        clock.advance(Duration::from_millis(1));
        engine.turn();
    }
}

/// What a recording handler saw: (key, value, milliseconds since it was made, by the
/// clock it was given).
pub type Seen = Arc<Mutex<Vec<(u32, u32, u64)>>>;

/// Keyed timers on `engine` whose handler records what it is given, timed by `clock`.
pub fn recording<'e>(
    engine: &'e TimerEngine,
    clock: &ManualClock,
) -> (KeyedTimers<'e, u32, u32>, Seen) {
    let seen: Seen = Arc::default();
    let sink = Arc::clone(&seen);
    let clock = clock.clone();
    let start = clock.now();
    let timers = KeyedTimers::with_engine(engine, move |key, value| {
        let ms = (clock.now() - start).as_millis() as u64;
        sink.lock().unwrap().push((key, value, ms));
    });
    (timers, seen)
}

/// The lock of a binary whose tests share process-wide state (the keyed timers' slot
/// table, crossbeam-epoch's collector) or measure the whole process (its CPU time, its
/// workers' context switches, its live heap bytes).
static SERIAL: RwLock<()> = RwLock::new(());

/// Runs one test at a time in such a binary: each holds this guard, which also keeps every
/// [`shared`] test out.
pub fn serial() -> RwLockWriteGuard<'static, ()> {
    SERIAL
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// For a test that measures nothing process-wide in such a binary: runs beside the other
/// [`shared`] tests, never beside a [`serial`] one.
pub fn shared() -> RwLockReadGuard<'static, ()> {
    SERIAL
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Waits up to `limit` for `done`, sleeping a millisecond between looks (never holding an
/// epoch section open); whether it came true.
pub fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    while std::time::Instant::now() < until {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    done()
}

/// Milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Checks, allowing 5 s for the workers to finish, that every capture `live` counted has
/// been dropped and every node of `engine` is back in its pool: nothing left behind.
pub fn assert_all_given_back(engine: &TimerEngine, live: &Live) {
    assert!(
        eventually(Duration::from_secs(5), || live.count() == 0),
        "every capture dropped: {} left",
        live.count()
    );
    assert!(
        eventually(Duration::from_secs(5), || engine.nodes_in_use() == 0),
        "every node back: {} in use",
        engine.nodes_in_use()
    );
}

/// SplitMix64: a seeded, dependency-free generator, so every run sees the same cases.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Below `n` (0 for 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// In `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo))
    }

    /// True `p` times in a hundred.
    pub fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

/// xorshift64: a seeded generator whose choices a test can replay from the seed alone (a
/// thread's number, a round's).
pub struct XorShift(pub u64);

impl XorShift {
    /// Seeded from any number, 0 included (the state is never 0).
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Below `n` (`n` not 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// CPU time this process has used, user and system, from `/proc/self/stat` (in clock
/// ticks of 10 ms); `None` where there is no such file.
pub fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the parenthesised command name; utime and stime are the 14th and
    // 15th fields of the line, so the 12th and 13th after the name.
    let after_name = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// The process's CPU use, in cores, over successive 2 s windows until one comes out under
/// a tenth of a core or `give_up` has passed: on a loaded machine, start-up and settling
/// show as CPU time, while an engine that spins when idle is busy in every window. Returns
/// the last window's reading (`None` where the CPU time cannot be read) and every window's.
pub fn idle_cores(give_up: Duration) -> (Option<f64>, Vec<Option<f64>>) {
    cores_until_below(0.1, give_up)
}

/// [`idle_cores`] with another bound: windows until one comes out under `below` cores.
pub fn cores_until_below(below: f64, give_up: Duration) -> (Option<f64>, Vec<Option<f64>>) {
    let measuring = Instant::now();
    let mut windows = Vec::new();
    loop {
        let window = CpuWindow::start();
        std::thread::sleep(Duration::from_secs(2));
        let cores = window.cores();
        windows.push(cores);
        if cores.is_none_or(|cores| cores < below) || measuring.elapsed() > give_up {
            return (cores, windows);
        }
    }
}

/// The process's CPU use from [`start`](Self::start) on, for readings taken over a window.
pub struct CpuWindow {
    cpu: Option<Duration>,
    wall: Instant,
}

impl CpuWindow {
    pub fn start() -> Self {
        Self {
            cpu: process_cpu(),
            wall: Instant::now(),
        }
    }

    /// Cores used since the start (CPU time over wall time); `None` where the CPU time
    /// cannot be read.
    pub fn cores(&self) -> Option<f64> {
        process_cpu().zip(self.cpu).map(|(after, before)| {
            after.saturating_sub(before).as_secs_f64() / self.wall.elapsed().as_secs_f64()
        })
    }
}

/// Voluntary context switches of each of this process's `corewheel-N` threads, by thread
/// id: each is the thread going to sleep, so between two readings, the wake-ups it had.
/// Empty where `/proc` cannot be read.
pub fn worker_switches() -> Vec<(String, u64)> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| {
            let path = task.path();
            let comm = std::fs::read_to_string(path.join("comm")).ok()?;
            if !comm.starts_with("corewheel-") {
                return None;
            }
            let status = std::fs::read_to_string(path.join("status")).ok()?;
            let switches = status
                .lines()
                .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))?
                .trim()
                .parse()
                .ok()?;
            Some((task.file_name().to_string_lossy().into_owned(), switches))
        })
        .collect()
}

/// The voluntary context switches of every worker thread alive now, summed: between two
/// readings, the workers' wake-ups.
pub fn worker_switches_total() -> u64 {
    worker_switches().iter().map(|(_, n)| n).sum()
}

/// Whether worker wake-ups can be counted here (`/proc/self/task` readable), once
/// `engine`'s workers have started.
pub fn can_count_worker_switches(engine: &TimerEngine) -> bool {
    engine.workers() > 0 && !worker_switches().is_empty()
}

/// tokio's next deadline for an interval whose tick due at `due` completed at `now`: a
/// tick up to 5 ms late is followed a period after its deadline, a later one as `policy`
/// says (tokio's `MissedTickBehavior`).
pub fn tokio_next(policy: MissedTicks, due: Instant, now: Instant, period: Duration) -> Instant {
    if now <= due + Duration::from_millis(5) {
        return due + period;
    }
    match policy {
        MissedTicks::Burst => due + period,
        MissedTicks::Delay => now + period,
        MissedTicks::Skip => {
            let late = (now - due).as_nanos() % period.as_nanos();
            now + period - Duration::from_nanos(late as u64)
        }
    }
}
