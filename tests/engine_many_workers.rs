//! Engines with far more workers than CPUs. This file holds a single test, so that the
//! process's CPU time is the engine's alone.

use std::time::{Duration, Instant};

use corewheel::{BuildError, MAX_WORKERS, PendingTimers, TimerEngine};

/// CPU time this process has used, user and system, from `/proc/self/stat` (in clock
/// ticks of 10 ms); `None` where there is no such file.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the parenthesised command name; utime and stime are the 14th and
    // 15th fields of the line, so the 12th and 13th after the name.
    let after_name = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

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
        let measuring = Instant::now();
        let mut windows = Vec::new();
        let cores = loop {
            let (cpu_before, wall_before) = (process_cpu(), Instant::now());
            std::thread::sleep(Duration::from_secs(2));
            let idle_cpu = process_cpu()
                .zip(cpu_before)
                .map(|(after, before)| after.saturating_sub(before));
            let cores = idle_cpu.map(|cpu| cpu.as_secs_f64() / wall_before.elapsed().as_secs_f64());
            windows.push(cores);
            if cores.is_none_or(|cores| cores < 0.1)
                || measuring.elapsed() > Duration::from_secs(30)
            {
                break cores;
            }
        };
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
