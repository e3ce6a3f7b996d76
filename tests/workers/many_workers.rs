//! Engines with far more workers than CPUs. This file holds a single test, so that the
//! process's CPU time is the engine's alone.

use std::time::{Duration, Instant};

use corewheel::{BuildError, MAX_WORKERS, PendingTimers, TimerEngine};

use crate::support;

use crate::support::idle_cores;

/// More than [`MAX_WORKERS`] is a typed error. At the cap, on a 2-core machine, an idle
/// engine uses no CPU (before, 896 workers or more with rescue on kept both cores busy for
/// the engine's whole life), and building it is quick (2048 workers once took 22 s, and
/// 4096 took 142 s); both are printed, and the idle cost is asserted with a wide margin.
///
/// On a loaded machine the workers may take long to start and settle, and that start-up
/// shows as CPU time, so the idle cost is measured in successive windows until one comes
/// out idle: an engine whose idle workers spin is busy in every window, however many.
#[test]
fn an_idle_engine_with_the_most_workers_costs_no_cpu() {
    let _serial = support::serial();
    assert!(matches!(
        TimerEngine::builder().workers(MAX_WORKERS + 1).build(),
        Err(BuildError::TooManyWorkers(n)) if n == MAX_WORKERS + 1
    ));
    for workers in [MAX_WORKERS / 4, MAX_WORKERS] {
        let started = Instant::now();
        let engine = TimerEngine::builder()
            .workers(workers)
            .pin_workers(false)
            .build()
            .unwrap();
        let built = started.elapsed();
        // Let every worker start and settle into its first sleep.
        std::thread::sleep(Duration::from_secs(1));
        let (cores, windows) = idle_cores(Duration::from_secs(30));
        let stopping = Instant::now();
        let report = engine.shutdown(PendingTimers::Drop);
        println!(
            "{workers} workers: built in {built:?}, 2 s windows idle using {windows:?} cores, \
             shut down in {:?}",
            stopping.elapsed()
        );
        assert_eq!(report.dropped, 0);
        if let Some(cores) = cores {
            assert!(
                cores < 0.1,
                "an idle engine of {workers} workers kept {cores:.2} cores busy in every \
                 2 s window for 30 s: {windows:?}"
            );
        }
    }
}
