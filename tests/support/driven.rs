//! Driven engines on tokio: a runtime, the engine's drivers spawned on it, and the wait
//! for them to end after a shutdown (a driver that never ends fails the test rather than
//! hanging it).

use std::time::Duration;

use corewheel::TimerEngine;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

/// A multi-thread tokio runtime of `threads` workers, with its timer.
pub fn multi_thread(threads: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_time()
        .build()
        .expect("a tokio runtime")
}

/// Spawns `engine`'s drivers on `runtime`, sleeping on tokio's timer.
pub fn spawn_drivers(engine: &TimerEngine, runtime: &Runtime) -> Vec<JoinHandle<()>> {
    engine
        .drivers(|at| tokio::time::sleep_until(at.into()))
        .into_iter()
        .map(|driver| runtime.spawn(driver))
        .collect()
}

/// Waits up to 30 s for each driver to end, as they must once their engine has shut down.
pub fn await_drivers(runtime: &Runtime, drivers: Vec<JoinHandle<()>>) {
    for driver in drivers {
        runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(30), driver).await })
            .expect("a driver did not end after shutdown")
            .expect("a driver panicked");
    }
}
