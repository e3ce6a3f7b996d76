//! The proxy as a process: its own tokio runtime, built for the timer it runs on.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::config::{Config, TimerKind};
use crate::server::Proxy;
use crate::stats::Stats;

/// Builds the runtime, binds, calls `listening` with the bound address and the proxy's
/// [`Stats`], and serves until the process ends. Fails only if the runtime cannot be built
/// or the address bound.
///
/// On corewheel's timer the runtime is built without tokio's time driver: any timer that
/// escaped to tokio would fail loudly instead of being measured as corewheel's. The
/// driven corewheel timer needs it: its engine's drivers sleep on tokio's timer.
pub fn run_blocking(
    config: Config,
    listening: impl FnOnce(SocketAddr, Arc<Stats>),
) -> io::Result<()> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_io();
    if config.timer != TimerKind::Corewheel {
        builder.enable_time();
    }
    if let Some(threads) = config.threads {
        builder.worker_threads(threads);
    }
    let runtime = builder.build()?;
    runtime.block_on(async move {
        let proxy = Proxy::bind(config).await?;
        listening(proxy.local_addr()?, proxy.stats());
        proxy.run().await;
        Ok(())
    })
}
