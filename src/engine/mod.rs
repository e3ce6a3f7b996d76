//! The multi-core timer engine: one wheel per shard, owned by one worker thread and fed by
//! lock-free lanes from every other thread.
//!
//! # The journey of a timer
//!
//! 1. [`TimerEngine::schedule`] calls [`producer`]'s `arm`: the thread's [`context`] names its home
//!    shard and its [`lane`] into it; the deadline comes from the thread's cycle-counter bound on
//!    now ([`cycle_clock`](crate::time::cycle_clock)).
//! 2. A node comes from the thread's magazine of the shard's [`pool`]; the [`callback`] is stored
//!    inline in the [`timer_node`], whose state word ([`timer_state`](crate::sync::timer_state))
//!    says *pending, in transit*.
//! 3. The node goes onto the thread's [`lane`]. Every 64 pushes the thread takes the lane back
//!    (`reclaim`): timers it cancelled go back to its magazine, pending ones not due soon are held
//!    back a few ticks, and the rest go to the owner on the lane's [`forward_ring`] (when full, on
//!    the shard's inbox).
//! 4. The shard's owner, a [`worker`], looks at its wheel ([`shard`]'s `owner_look`,
//!    [`held_wheel`]'s `extract`): it takes the lanes whose need has come, the rings and the inbox,
//!    and files each node in its [`WheelCore`](crate::wheel::core::WheelCore): *pending, filed*.
//! 5. When its tick comes, a look claims it (*firing*) onto the shard's
//!    [`run_queue`](crate::sync::run_queue); a burst too big for the queue is handed out as whole
//!    lists ([`due_lists`]).
//! 6. The owner, or an idle worker that steals the run ([`stealing`]), runs it: [`runner`] calls
//!    the callback (catching a panic, [`panics`]) and gives the node back to the pool, or sends a
//!    repeating timer ([`periodic`]) back to be filed again.
//!
//! A cancel or reset changes the node's state word; when the wheel must change, the node travels to
//! the owner as a message on the canceller's lane. Captures with a `Drop` are dropped once the look
//! lets go of the wheel ([`deferred_drops`]). Another worker stands in for an owner stuck in a slow
//! callback ([`stuck_owners`]). A [driven](EngineBuilder::driven) engine has no workers: a
//! [`driver`] future per shard takes the owner's part. Shutdown gives every shard a last turn
//! ([`held_wheel`]'s `finish`).
//!
//! # Ground rules
//!
//! Every `unsafe` block in this layer relies on one of these.
//!
//! 1. **One wheel holder.** A shard's [`HeldWheel`](held_wheel::HeldWheel) is touched only by the
//!    thread holding its `HELD` bit ([`Shard::with_wheel`](shard::Shard::with_wheel)): the owner, a
//!    stand-in for one look, a thread turning a hand-driven engine, or after the last turn a
//!    sweeping thread.
//! 2. **One node holder.** A node's state word
//!    ([`TimerState`](crate::sync::timer_state::TimerState)) changes only by generation-checked
//!    compare-and-swaps, so a stale handle changes nothing. Its `deadline` is written by the arming
//!    thread before publishing, by a resetter under `LOCKED`, and by whoever runs a repeating
//!    timer. Its links and callback belong to one thread at a time, by phase: *free*, whoever took
//!    it from the pool; *in transit*, the arming thread, then whoever takes it off its queue;
//!    *filed*, the wheel's holder, or the holder of the handed-out list it is on; *firing*, whoever
//!    claimed it, then whoever takes its run-queue entry; *cancelled* or *done*, whoever holds it
//!    once no message names it (a look holds the nodes it leaves to [`deferred_drops`]). A pending
//!    waker timer's `Sleep`, under the reset lock, may replace the waker ([`waker_timer`]).
//! 3. **One producer per queue.** A lane and its forward ring are pushed only by their thread and
//!    taken only by it or the wheel's holder; a producer holding nodes it took back marks the lane
//!    busy. Only the wheel's holder appends to the run queue; a worker other than the owner
//!    registers in `in_hands` before taking from it. The last turn waits for busy lanes and
//!    `in_hands` to clear.
//! 4. **User code runs holding nothing.** Callbacks and captures' `Drop`s run holding no wheel and
//!    no busy lane (except in the last turn or a sweep), and may call into any engine, drop it or
//!    shut it down: nothing the engine then does waits for what its own thread holds
//!    ([`reentrancy`]). Shutdown sets the flag, then each shard's last turn collects every queue,
//!    waits for other hands and runs or drops what is pending; a push after the flag checks it
//!    again (SeqCst on both sides) and asks for a sweep.

pub(crate) mod builder;
pub(crate) mod callback;
pub(crate) mod context;
pub(crate) mod counters;
pub(crate) mod deferred_drops;
pub(crate) mod driver;
pub(crate) mod due_lists;
pub(crate) mod forward_ring;
pub(crate) mod handle;
pub(crate) mod held_wheel;
pub(crate) mod idle_workers;
pub(crate) mod lane;
pub(crate) mod panics;
pub(crate) mod periodic;
pub(crate) mod pool;
pub(crate) mod producer;
pub(crate) mod reentrancy;
pub(crate) mod runner;
pub(crate) mod shard;
pub(crate) mod shard_state;
pub(crate) mod shared;
pub(crate) mod shutdown;
pub(crate) mod stats;
pub(crate) mod stealing;
pub(crate) mod stuck_owners;
pub(crate) mod timer_node;
pub(crate) mod waker_timer;
// loom models drive engines by hand, without worker threads.
#[cfg(not(loom))]
mod worker;

use std::num::NonZeroU32;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::engine::builder::EngineBuilder;
use crate::engine::counters::{WakeCounters, read};
use crate::engine::handle::TimerHandle;
use crate::engine::idle_workers::IdleWorkers;
use crate::engine::periodic::{MissedTicks, Period};
use crate::engine::reentrancy::Turn;
use crate::engine::shard::Shard;
use crate::engine::shared::{EngineShared, When};
use crate::engine::shutdown::{PendingTimers, ShutdownReport};
use crate::engine::stats::{ShardStats, Stats};
use crate::error::{BuildError, ScheduleError};
use crate::sync::Arc;
use crate::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use crate::sync::run_queue::MAX_RUN;
use crate::sync::timer_state::Kind;
use crate::sync::unmodelled::{self, AtomicU32, Mutex as StdMutex};
use crate::time::clock::{Clock, MonotonicClock};
use crate::time::cycle_clock::CycleScale;
use crate::time::ticks::{Ticks, nanos_of};

/// Engines made so far: a handle carries its engine's number, so it is stale in every other.
static ENGINES: AtomicU32 = AtomicU32::new(1);

/// A multi-core timer engine.
///
/// Each shard has a timing wheel owned by one worker thread (pinned to a CPU by default).
/// Scheduling takes a node from the thread's own magazine and pushes it onto the thread's own lane
/// into the shard: no lock, no allocation. Cancels and resets work from any thread.
///
/// - **Never early.** A callback runs at or after its deadline, rounded up to the tick.
/// - **Exactly once.** A one-shot timer runs once, unless [`cancel`](Self::cancel) returned
///   `true`, in which case it never runs.
/// - **Stale handles are harmless.** After a timer is over, its handle is stale: every
///   operation on it returns `false` and touches nothing else.
/// - **No panics on bad input.** Zero delays run on the next tick; deadlines in the past run
///   on the worker's next turn; a delay past the end of time never fires (it can still be
///   cancelled or reset); a repeating period shorter than a tick is one tick; anything
///   after shutdown is an error or `false`.
///
/// Callbacks run on the shard's worker thread; a panic is caught and counted in [`Stats`]. Keep
/// them short: while one runs, the shard's other timers wait.
///
/// ```
/// use corewheel::{ManualClock, TimerEngine};
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let engine = TimerEngine::builder().workers(2).manual_clock(clock.clone()).build().unwrap();
/// let fired = Arc::new(AtomicUsize::new(0));
/// let counter = Arc::clone(&fired);
/// let request = engine
///     .schedule(Duration::from_millis(30), move || { counter.fetch_add(1, Ordering::Relaxed); })
///     .unwrap();
/// let idle = engine.schedule(Duration::from_secs(60), || unreachable!()).unwrap();
///
/// clock.advance(Duration::from_millis(29));
/// engine.turn();
/// assert_eq!(fired.load(Ordering::Relaxed), 0, "never early");
/// clock.advance(Duration::from_millis(1));
/// engine.turn();
/// assert_eq!(fired.load(Ordering::Relaxed), 1);
/// assert!(!engine.cancel(request), "already fired");
/// assert!(engine.cancel(idle));
/// ```
pub struct TimerEngine {
    pub(crate) shared: Arc<EngineShared>,
    threads: StdMutex<Vec<JoinHandle<()>>>,
    /// No worker threads (manual clock or [`EngineBuilder::driven`]): [`turn`](Self::turn) turns
    /// the shards.
    hand_driven: bool,
    /// Built with [`EngineBuilder::driven`].
    driven: bool,
    /// Whether a shutdown has begun; held while the first one runs.
    shutdown_started: StdMutex<bool>,
    /// Workers pinned to a CPU, counted before `build` returns.
    pinned: usize,
}

impl EngineBuilder {
    /// Starts the engine.
    pub fn build(self) -> Result<TimerEngine, BuildError> {
        let workers = match self.workers {
            Some(0) => return Err(BuildError::NoWorkers),
            Some(n) if n > builder::MAX_WORKERS => return Err(BuildError::TooManyWorkers(n)),
            Some(n) => n,
            None => std::thread::available_parallelism()
                .map_or(1, |n| n.get().min(builder::MAX_WORKERS)),
        };
        if self.tick.is_zero() {
            return Err(BuildError::ZeroTick);
        }
        TimerEngine::start(self, workers)
    }
}

impl TimerEngine {
    /// A builder: workers, tick, pinning, or a manual clock.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    pub(crate) fn start(builder: EngineBuilder, workers: usize) -> Result<Self, BuildError> {
        let manual = builder.manual_clock.is_some();
        let clock: Box<dyn Clock> = match builder.manual_clock {
            Some(clock) => Box::new(clock),
            None => Box::new(MonotonicClock),
        };
        let origin = clock.now();
        let ticks = Ticks::new(builder.tick, origin);
        // Only worker threads walk handed-out lists.
        let hands_out = !manual && !builder.driven && builder.stealing && workers > 1;
        let shared = Arc::new(EngineShared {
            // Wraps to 1 after four billion engines, never to 0.
            id: NonZeroU32::new(ENGINES.fetch_add(1, unmodelled::Ordering::Relaxed))
                .unwrap_or(NonZeroU32::MIN),
            shards: (0..workers)
                .map(|_| Shard::new(builder.capacity, ticks, hands_out))
                .collect(),
            ticks,
            clock,
            cycles: if manual { None } else { CycleScale::get() },
            shutdown: AtomicBool::new(false),
            pending_mode: AtomicU8::new(0),
            next_home: AtomicU64::new(0),
            idle_workers: IdleWorkers::new(
                workers,
                builder.stealing,
                builder.rescue_after.map(u64::from),
                nanos_of(ticks.tick()).unwrap_or(u64::MAX),
            ),
        });
        let driven = builder.driven;
        let mut engine = Self {
            threads: StdMutex::new(Vec::new()),
            hand_driven: manual || driven,
            driven,
            shutdown_started: StdMutex::new(false),
            pinned: 0,
            shared,
        };
        if !engine.hand_driven {
            engine.pinned = engine.spawn_workers(workers, builder.pin_workers)?;
        }
        Ok(engine)
    }

    /// Starts the workers; returns how many were pinned, once each has tried.
    #[cfg(not(loom))]
    fn spawn_workers(&self, workers: usize, pin: bool) -> Result<usize, BuildError> {
        let cores = if pin {
            core_affinity::get_core_ids().unwrap_or_default()
        } else {
            Vec::new()
        };
        let (pin_results, pinned) = std::sync::mpsc::channel();
        let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        for index in 0..workers {
            let shared = Arc::clone(&self.shared);
            let core = (!cores.is_empty()).then(|| cores[index % cores.len()]);
            let pin_result = pin_results.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("corewheel-{index}"))
                .spawn(move || {
                    let pinned_here = core.is_some_and(core_affinity::set_for_current);
                    // Nobody listens if another spawn failed.
                    let _ = pin_result.send(pinned_here);
                    drop(pin_result);
                    worker::run(&shared, index);
                });
            match spawned {
                Ok(handle) => {
                    let _ = self.shared.shards[index]
                        .thread
                        .set(handle.thread().clone());
                    threads.push(handle);
                }
                Err(error) => {
                    drop(threads);
                    self.shutdown(PendingTimers::Drop);
                    return Err(BuildError::Spawn(error));
                }
            }
        }
        drop(threads);
        drop(pin_results);
        // A worker that died before sending closes its sender, ending the count.
        Ok(pinned.iter().filter(|&pinned_here| pinned_here).count())
    }

    #[cfg(loom)]
    fn spawn_workers(&self, _workers: usize, _pin: bool) -> Result<usize, BuildError> {
        Ok(0)
    }

    /// Schedules `f` to run once, `delay` from now.
    ///
    /// A zero delay runs on the next tick; a deadline past the engine's time range never fires by
    /// itself. "Now" is never underestimated: with an invariant time-stamp counter (x86-64 Linux) a
    /// thread extrapolates the clock from the counter, rounding up. Closures of at most
    /// [`INLINE_CALLBACK_BYTES`](crate::INLINE_CALLBACK_BYTES), word-aligned, are stored in the
    /// node; larger ones are boxed.
    #[inline]
    pub fn schedule(
        &self,
        delay: Duration,
        f: impl FnOnce() + Send + 'static,
    ) -> Result<TimerHandle, ScheduleError> {
        EngineShared::arm(
            &self.shared,
            When::After(delay),
            Kind::OneShot,
            |callback| callback.set_once(f),
        )
    }

    /// Schedules `f` to run once at `deadline`, rounded up to the tick. A deadline in the
    /// past runs on the worker's next turn.
    #[inline]
    pub fn schedule_at(
        &self,
        deadline: Instant,
        f: impl FnOnce() + Send + 'static,
    ) -> Result<TimerHandle, ScheduleError> {
        let tick = self.shared.ticks.ceil(deadline);
        EngineShared::arm(
            &self.shared,
            When::AtTick(tick),
            Kind::OneShot,
            |callback| callback.set_once(f),
        )
    }

    /// Schedules `f` to run every `period`, first `period` from now, skipping missed ticks:
    /// [`schedule_repeating_with`](Self::schedule_repeating_with) with [`MissedTicks::Skip`].
    pub fn schedule_repeating(
        &self,
        period: Duration,
        f: impl FnMut() + Send + 'static,
    ) -> Result<TimerHandle, ScheduleError> {
        self.schedule_repeating_with(period, MissedTicks::Skip, f)
    }

    /// Schedules `f` to run every `period`, choosing what happens to missed ticks.
    ///
    /// The period is rounded up to whole ticks (at least one). A period over 2^62 - 2 ticks runs
    /// once, then stays pending until cancelled; never early.
    ///
    /// ```
    /// use corewheel::{ManualClock, MissedTicks, TimerEngine};
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let engine = TimerEngine::builder().workers(1).manual_clock(clock.clone()).build().unwrap();
    /// let runs = Arc::new(AtomicUsize::new(0));
    /// let counter = Arc::clone(&runs);
    /// engine
    ///     .schedule_repeating_with(Duration::from_millis(10), MissedTicks::Burst, move || {
    ///         counter.fetch_add(1, Ordering::Relaxed);
    ///     })
    ///     .unwrap();
    /// clock.advance(Duration::from_millis(35)); // the worker was away for three periods
    /// while engine.turn() > 0 {}
    /// assert_eq!(runs.load(Ordering::Relaxed), 3, "burst runs every missed tick");
    /// ```
    pub fn schedule_repeating_with(
        &self,
        period: Duration,
        missed: MissedTicks,
        f: impl FnMut() + Send + 'static,
    ) -> Result<TimerHandle, ScheduleError> {
        let first = When::After(period);
        let period = Period {
            ticks: self.shared.ticks.span(period),
            missed,
        };
        EngineShared::arm(&self.shared, first, Kind::Repeating, |callback| {
            callback.set_repeating(f, period)
        })
    }

    /// Stops the timer: `true` if and only if this call stopped it from running (for a repeating
    /// timer, from running again, even mid-callback). O(1) from any thread; the node and its
    /// captures go back within 32 ticks.
    #[inline]
    pub fn cancel(&self, handle: TimerHandle) -> bool {
        EngineShared::cancel(&self.shared, handle)
    }

    /// Moves a pending timer's deadline to `delay` from now. `false` if the timer already
    /// fired or started firing, was cancelled, or the handle is stale.
    ///
    /// A later deadline only changes the node (the worker moves the timer when the old deadline
    /// comes); an earlier one is sent to the worker. A repeating timer cannot be reset while its
    /// callback runs.
    #[inline]
    pub fn reset(&self, handle: TimerHandle, delay: Duration) -> bool {
        let tick = EngineShared::deadline_after(&self.shared, delay);
        EngineShared::reset(&self.shared, handle, tick)
    }

    /// Moves a pending timer's deadline to `deadline`, as [`reset`](Self::reset) does.
    #[inline]
    pub fn reset_at(&self, handle: TimerHandle, deadline: Instant) -> bool {
        EngineShared::reset(&self.shared, handle, self.shared.ticks.ceil(deadline))
    }

    /// Whether the timer will still run (pending, or repeating and not cancelled).
    #[inline]
    pub fn is_pending(&self, handle: TimerHandle) -> bool {
        self.shared.is_pending(handle)
    }

    /// Counts per shard and in total.
    pub fn stats(&self) -> Stats {
        let mut stats = Stats::default();
        for shard in self.shared.shards.iter() {
            let counters = &shard.counters;
            // Under the lanes lock: a closing lane's counts are read on the lane or as retired,
            // once.
            let lanes = shard.lanes.lock().unwrap_or_else(|p| p.into_inner());
            let mut one = ShardStats {
                scheduled: read(&counters.retired_scheduled),
                cancelled: read(&counters.retired_cancelled),
                reset: read(&counters.retired_reset),
                fired: read(&counters.fired),
                panicked: read(&counters.panicked),
                late: read(&counters.late),
                stolen: read(&counters.stolen),
                rescued: read(&counters.rescued),
                claimed_elsewhere: read(&counters.claimed_elsewhere),
                ran_at_shutdown: read(&counters.ran_at_shutdown),
                dropped_at_shutdown: read(&counters.dropped_at_shutdown),
                pending: 0,
                wakes: WakeCounters::read(&counters.wakes),
            };
            for lane in lanes.iter() {
                one.scheduled += read(&lane.scheduled);
                one.cancelled += read(&lane.cancelled);
                one.reset += read(&lane.reset);
                one.panicked += read(&lane.panicked);
            }
            one.pending = one
                .scheduled
                .saturating_sub(one.cancelled)
                .saturating_sub(read(&counters.completed))
                .saturating_sub(one.ran_at_shutdown)
                .saturating_sub(one.dropped_at_shutdown);
            drop(lanes);
            stats.total.add(&one);
            stats.shards.push(one);
            stats.pool_bytes += shard.pool.allocated_bytes();
        }
        stats.pinned_workers = self.pinned;
        stats
    }

    /// Runs every shard's due work once on the calling thread and returns how many callbacks ran.
    /// Only for engines without worker threads ([`EngineBuilder::manual_clock`],
    /// [`EngineBuilder::driven`]); elsewhere, or from inside its own callback, returns 0.
    ///
    /// Several threads may turn at once. A shard another thread is turning is skipped, unless that
    /// thread has been in its callbacks for more than [`rescue_after`](EngineBuilder::rescue_after)
    /// ticks: then this call stands in for it.
    pub fn turn(&self) -> usize {
        if !self.hand_driven {
            return 0;
        }
        let shared = &*self.shared;
        // Inside a turn of this engine already, or on an exiting thread that cannot mark one.
        let Ok(turn) = Turn::begin(shared.id.get()) else {
            return 0;
        };
        let (now, now_tick) = shared.now_at(shared.clock.now());
        let mut fired = 0;
        for shard in shared.shards.iter() {
            if shared.shutdown.load(Ordering::SeqCst) {
                // Shut down meanwhile: every shard gets its last turn instead.
                break;
            }
            if shard.try_own() {
                fired += Self::turn_owned(shared, shard).0;
                self.disown(shard);
            } else if shared
                .idle_workers
                .rescue_after
                .is_some_and(|after| shard.is_stuck(now_tick, after))
            {
                fired +=
                    IdleWorkers::stand_in(shard, &shared.shutdown, (now, now_tick), None, None);
            }
        }
        if shared.shutdown.load(Ordering::SeqCst) {
            // A shard someone else is turning is finished when that turn ends.
            self.finish_manual(false);
        }
        drop(turn);
        fired
    }

    /// Gives back a shard turned by hand, waking its driver.
    fn disown(&self, shard: &Shard) {
        shard.disown();
        if self.driven {
            shard.wake_driver();
        }
    }

    /// A hand-driven owner's turn: looks and runs until a look claims nothing. Returns the
    /// callbacks run and the last look's next tick.
    fn turn_owned(shared: &EngineShared, shard: &Shard) -> (usize, Option<u64>) {
        let mut fired = 0;
        loop {
            let (now, now_tick) = shared.now_at(shared.clock.now());
            let look = shard.owner_look(now, now_tick);
            shard.set_running(true);
            look.deferred_drops.free(shard);
            while let Some(run) = shard.run.take(MAX_RUN) {
                fired += runner::run(shard, run.indices(), now_tick, true);
            }
            // Only loom models hand lists out here: walk what is open, wait out a walker holding
            // the rest.
            let walked = look.lists_out
                && shard.walk_hand_outs(&shared.shutdown, 0, |batch, due| {
                    fired += runner::run(shard, batch, due, true);
                });
            shard.set_running(false);
            if look.lists_out && !shared.shutdown.load(Ordering::SeqCst) {
                if !walked {
                    crate::sync::yield_now();
                }
                continue;
            }
            if look.claimed == 0 && !look.more_due {
                return (fired, look.next);
            }
        }
    }

    /// The last turn of every hand-driven shard not finished. With `wait`, waits for a shard's
    /// current turn to end; without, leaves it to the thread turning it. The caller is inside a
    /// [`Turn`], so a nested `turn` from user code gets 0.
    fn finish_manual(&self, wait: bool) {
        let shared = &*self.shared;
        let (pending, now) = (shared.pending_mode(), shared.clock.now());
        for shard in shared.shards.iter() {
            let owned = if wait {
                crate::sync::wait_until(|| match shard.is_finished() {
                    true => Some(false),
                    false => shard.try_own().then_some(true),
                })
            } else {
                !shard.is_finished() && shard.try_own()
            };
            if owned {
                shard.finish(pending, now);
                self.disown(shard);
            }
        }
    }

    /// Stops the engine: new schedules fail with [`ScheduleError::Shutdown`], and every
    /// pending timer is run now or dropped, as `pending` says. Waits for the workers and
    /// reports how many timers went each way; a later call reports the figures then.
    /// Dropping the engine shuts it down with [`PendingTimers::Drop`].
    ///
    /// On a worker thread it waits for no worker, nor does a drop there. Inside a callback of a
    /// hand-driven turn, that turn finishes the engine when it ends; a call made while another is
    /// in progress returns at once. The report then counts what was settled so far; a later call
    /// from a thread that can wait reports the final figures.
    ///
    /// Callbacks a shutdown runs run on the workers (the calling thread, hand-driven); a
    /// [`turn`](Self::turn) inside one returns 0.
    pub fn shutdown(&self, pending: PendingTimers) -> ShutdownReport {
        // Another shutdown in progress may wait for this thread: do not wait for it.
        let started = match self.shutdown_started.try_lock() {
            Ok(started) => Some(started),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        if let Some(mut started) = started {
            if !*started {
                *started = true;
                self.shared.set_pending_mode(pending);
                self.shared.shutdown.store(true, Ordering::SeqCst);
            }
            // Also on a later call: the first may have been unable to wait.
            self.finish_workers();
        }
        let mut report = ShutdownReport::default();
        for shard in self.shared.shards.iter() {
            report.ran += read(&shard.counters.ran_at_shutdown);
            report.dropped += read(&shard.counters.dropped_at_shutdown);
        }
        report
    }

    /// Makes or waits for every shard's last turn, where the calling thread may wait.
    fn finish_workers(&self) {
        if self.hand_driven {
            // Woken first, so that a shutdown from inside a callback ends them too.
            if self.driven {
                for shard in self.shared.shards.iter() {
                    shard.wake_driver();
                }
            }
            // Only a thread nobody can be waiting for may wait for another's turn.
            let wait = !reentrancy::is_worker() && !reentrancy::in_any_turn();
            let turn = match Turn::begin(self.shared.id.get()) {
                // The turn running this callback finishes instead.
                Err(reentrancy::NoTurn::Inside) => return,
                begun => begun.ok(),
            };
            self.finish_manual(wait);
            drop(turn);
            return;
        }
        for shard in self.shared.shards.iter() {
            if let Some(thread) = shard.thread.get() {
                thread.unpark();
            }
        }
        // A worker waits for no worker (it may be waited for); the handles stay for a later call.
        if reentrancy::is_worker() {
            return;
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for handle in threads {
            let _ = handle.join();
        }
    }

    /// What every thread shares, for loom models and unit tests.
    #[cfg(any(loom, test))]
    pub(crate) fn shared(&self) -> &EngineShared {
        &self.shared
    }

    /// Worker threads (shards).
    pub fn workers(&self) -> usize {
        self.shared.shards.len()
    }

    /// The tick length.
    pub fn tick(&self) -> Duration {
        self.shared.ticks.tick()
    }

    /// The engine's clock (the manual clock, if built with one), which deadlines are read
    /// against.
    pub fn now(&self) -> Instant {
        self.shared.clock.now()
    }

    /// Pool nodes holding a timer, counted in O(nodes) (a leak check: 0 after a shutdown
    /// with no schedules racing it). Only with the `test-util` feature.
    #[cfg(any(test, feature = "test-util"))]
    pub fn nodes_in_use(&self) -> usize {
        self.shared
            .shards
            .iter()
            .map(|shard| shard.pool.nodes_in_use())
            .sum()
    }
}

impl Drop for TimerEngine {
    fn drop(&mut self) {
        self.shutdown(PendingTimers::Drop);
    }
}

impl std::fmt::Debug for TimerEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimerEngine")
            .field("workers", &self.workers())
            .field("tick", &self.tick())
            .field("hand_driven", &self.hand_driven)
            .field("driven", &self.driven)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::ManualClock;
    use std::sync::atomic::AtomicUsize;

    /// The whole protocol in a few hundred timers: lanes, claims, the inbox, cancel
    /// messages, the pool and shutdown, small enough for Miri to check every unsafe access.
    #[test]
    fn threads_schedule_and_cancel_while_the_owner_turns() {
        let clock = ManualClock::new();
        let engine = Arc::new(
            TimerEngine::builder()
                .workers(2)
                .manual_clock(clock.clone())
                .build()
                .expect("manual engine"),
        );
        let fired = Arc::new(AtomicUsize::new(0));
        let per_thread = if cfg!(miri) { 60 } else { 150_u64 };
        let cancelled: usize = std::thread::scope(|scope| {
            let producers: Vec<_> = (0..2)
                .map(|_| {
                    let (engine, fired) = (Arc::clone(&engine), Arc::clone(&fired));
                    scope.spawn(move || {
                        let mut cancelled = 0;
                        for k in 0..per_thread {
                            let fired = Arc::clone(&fired);
                            let handle = engine
                                .schedule(Duration::from_millis(1 + k % 7), move || {
                                    fired.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                })
                                .expect("scheduled");
                            if k % 3 == 0 && engine.cancel(handle) {
                                cancelled += 1;
                            }
                            if k % 5 == 0 {
                                engine.reset(handle, Duration::from_millis(3));
                            }
                        }
                        cancelled
                    })
                })
                .collect();
            for _ in 0..5 {
                clock.advance(Duration::from_millis(1));
                engine.turn();
            }
            producers
                .into_iter()
                .map(|p| p.join().expect("no panic"))
                .sum()
        });
        for _ in 0..20 {
            clock.advance(Duration::from_millis(1));
            engine.turn();
        }
        assert_eq!(
            (fired.load(std::sync::atomic::Ordering::Relaxed) + cancelled) as u64,
            2 * per_thread
        );
        let report = engine.shutdown(PendingTimers::Drop);
        assert_eq!(report.dropped, 0);
        assert_eq!(engine.nodes_in_use(), 0);
    }

    /// A cancelled timer's captures are dropped by the turn that frees its node once the
    /// turn has let the shard's wheel go, and with the shard marked running (as for a
    /// callback): a capture whose `Drop` blocks then leaves the wheel to a stand-in. A
    /// capture without drop glue is freed at once; either way the node goes back.
    #[test]
    fn a_cancelled_timers_captures_are_dropped_with_the_wheel_let_go() {
        struct Probe(Arc<TimerEngine>, Arc<AtomicUsize>);
        impl Drop for Probe {
            fn drop(&mut self) {
                let shared = self.0.shared();
                let shard = &shared.shards[0];
                let free = shard.with_wheel(|_| ()).is_some();
                let stuck = shard.is_stuck(shared.now_tick() + 100, 1);
                let code = if free && stuck { 1 } else { 2 };
                self.1.store(code, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let clock = ManualClock::new();
        let engine = Arc::new(
            TimerEngine::builder()
                .workers(1)
                .manual_clock(clock.clone())
                .build()
                .expect("manual engine"),
        );
        let seen = Arc::new(AtomicUsize::new(0));
        let probe = Probe(Arc::clone(&engine), Arc::clone(&seen));
        let timer = engine
            .schedule_repeating(Duration::from_millis(2), move || {
                let _ = &probe;
            })
            .expect("scheduled");
        let plain = engine
            .schedule_repeating(Duration::from_millis(2), || {})
            .expect("scheduled");
        // Fired once: both are filed on the wheel now, and their cancels go to the owner.
        clock.advance(Duration::from_millis(3));
        assert_eq!(engine.turn(), 2);
        assert!(engine.cancel(timer) && engine.cancel(plain));
        // Past the cancel messages' lazy need.
        clock.advance(Duration::from_millis(100));
        engine.turn();
        assert_eq!(
            seen.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "dropped with the wheel free and the shard running"
        );
        assert_eq!(engine.nodes_in_use(), 0, "both nodes went back");
        let report = engine.shutdown(PendingTimers::Drop);
        assert_eq!(report.dropped, 0);
    }
}
