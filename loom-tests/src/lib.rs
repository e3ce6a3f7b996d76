//! loom models of corewheel's concurrent protocols.
//!
//! The models live in `tests/` and compile only with `RUSTFLAGS="--cfg loom"`, which also
//! switches corewheel's `sync` shim to loom's atomics, so the models explore the library's
//! real code. `scripts/test-all.sh` runs them, optimised but with debug assertions
//! (`RUSTFLAGS="--cfg loom -C debug-assertions"`), so that the library's own invariant
//! checks run in every explored interleaving.
//!
//! This library holds what the engine-level models share: a one-shard engine driven by a
//! manual clock, and callbacks that count their runs and drops.

#[cfg(loom)]
pub use rig::*;

#[cfg(loom)]
mod rig {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use corewheel::{ManualClock, TimerEngine, TimerHandle};
    use loom::sync::Arc;

    /// The engine's tick in every model: whole milliseconds keep the arithmetic obvious.
    pub const TICK: Duration = Duration::from_millis(1);

    /// Runs `f` under loom, exploring every interleaving with at most `preemptions`
    /// preemptions per execution (`None`: every interleaving).
    pub fn model(preemptions: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = preemptions;
        builder.check(f);
    }

    /// A one-shard engine driven by hand, shareable with the model's threads.
    pub fn engine() -> (Arc<TimerEngine>, ManualClock) {
        let clock = ManualClock::new();
        let engine = TimerEngine::builder()
            .workers(1)
            .tick(TICK)
            .manual_clock(clock.clone())
            .build()
            .expect("a manual engine starts no threads");
        (Arc::new(engine), clock)
    }

    /// `n` ticks.
    pub fn ticks(n: u32) -> Duration {
        TICK * n
    }

    /// Schedules `f` `delay_ticks` from now and has the worker file it in its wheel, so that
    /// the model starts with the timer pending in the wheel rather than in transit.
    ///
    /// The worker takes a lane when its need comes due, which is no later than the earliest
    /// deadline on it; so the timer goes out due in one tick, a reset moves it later
    /// (which sends nothing), and the turn at that first tick files it at the later
    /// deadline. On return the clock stands one tick after the schedule.
    pub fn filed(
        engine: &TimerEngine,
        clock: &ManualClock,
        delay_ticks: u32,
        f: impl FnOnce() + Send + 'static,
    ) -> TimerHandle {
        assert!(delay_ticks > 1);
        let handle = engine.schedule(ticks(1), f).expect("the engine is running");
        assert!(engine.reset(handle, ticks(delay_ticks)));
        clock.advance(ticks(1));
        assert_eq!(engine.turn(), 0, "a timer filed later does not fire now");
        assert!(engine.is_pending(handle));
        handle
    }

    /// Ticks within which a cancel's or reset's message reaches the worker: it travels on
    /// the sender's lane, which the worker takes once the lane's need comes due, at most
    /// the idle lane horizon (32 ticks) out for an engine turned by hand, plus a tick.
    pub const MESSAGE_TICKS: u32 = 34;

    /// Turns until every node is back in the pool, at most three times, each
    /// [`MESSAGE_TICKS`] on (one long step rather than a turn per tick, which would take a
    /// model past loom's branch limit), and returns how many callbacks ran meanwhile. The
    /// caller then checks `nodes_in_use`.
    pub fn settle(engine: &TimerEngine, clock: &ManualClock) -> usize {
        let mut fired = 0;
        for _ in 0..3 {
            if engine.nodes_in_use() == 0 {
                break;
            }
            clock.advance(ticks(MESSAGE_TICKS));
            fired += engine.turn();
        }
        fired
    }

    /// A waker that counts its wakes. Plain std atomics, invisible to loom: read on the
    /// thread that woke it or after joining that thread.
    #[derive(Default)]
    pub struct Wakes(AtomicUsize);

    impl std::task::Wake for Wakes {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    impl Wakes {
        /// How many times it has been woken.
        pub fn count(&self) -> usize {
            self.0.load(Ordering::Relaxed)
        }
    }

    /// A counting waker, and its count.
    pub fn counting() -> (std::sync::Arc<Wakes>, std::task::Waker) {
        let wakes = std::sync::Arc::new(Wakes::default());
        let waker = std::task::Waker::from(std::sync::Arc::clone(&wakes));
        (wakes, waker)
    }

    /// What happened to the callbacks made by one [`Probe`].
    #[derive(Debug, Default)]
    struct Counts {
        ran: AtomicUsize,
        dropped: AtomicUsize,
    }

    /// Makes callbacks that count how often they ran and how often they were dropped (run
    /// or not: a one-shot callback is dropped after it runs). Plain std atomics, invisible
    /// to loom: the counts are read on the thread that ran or dropped the callbacks, or
    /// after joining it, so they need no modelling and add no interleavings.
    #[derive(Debug, Clone, Default)]
    pub struct Probe(std::sync::Arc<Counts>);

    /// Counts one drop of the callback that owns it.
    struct Guard(std::sync::Arc<Counts>);

    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    impl Probe {
        pub fn new() -> Self {
            Self::default()
        }

        /// A one-shot callback that counts its run and its drop.
        pub fn callback(&self) -> impl FnOnce() + Send + 'static {
            let guard = Guard(std::sync::Arc::clone(&self.0));
            move || {
                guard.0.ran.fetch_add(1, Ordering::Relaxed);
                drop(guard);
            }
        }

        /// A repeating callback that counts its runs, and its drop once it is dropped.
        pub fn repeating_callback(&self) -> impl FnMut() + Send + 'static {
            let guard = Guard(std::sync::Arc::clone(&self.0));
            move || {
                guard.0.ran.fetch_add(1, Ordering::Relaxed);
            }
        }

        pub fn ran(&self) -> usize {
            self.0.ran.load(Ordering::Relaxed)
        }

        pub fn dropped(&self) -> usize {
            self.0.dropped.load(Ordering::Relaxed)
        }

        /// Exactly one of a cancel (which returned `cancelled`) and this timer's run won.
        #[track_caller]
        pub fn assert_one_winner(&self, cancelled: bool) {
            assert_eq!(
                u8::from(cancelled) + u8::from(self.ran() == 1),
                1,
                "cancelled={cancelled}, ran={}",
                self.ran()
            );
        }
    }
}
