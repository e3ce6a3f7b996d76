//! corewheel-proxy: an HTTP/1.1 reverse proxy on tokio and hyper whose every timer is
//! corewheel's, or, behind one setting ([`Config::timer`]), tokio's.
//!
//! Its timers: hyper's header read timeout (through `hyper::rt::Timer`), a per-connection
//! idle timeout reset on every read and write ([`IdleIo`]), a deadline on each upstream
//! call answered with 504, and an upstream connect timeout, also answered with 504. A
//! malformed request gets hyper's 400, an upstream that refuses or breaks a 502.
//!
//! ```sh
//! cargo run --release -p corewheel-proxy -- --upstream 127.0.0.1:3000 --timer corewheel
//! ```
#![deny(missing_docs)]

mod backend;
mod client;
mod config;
mod forward;
mod idle_io;
mod runtime;
mod server;
mod stats;
mod timer;
mod upstream;

pub use backend::{BODY, serve_backend};
pub use client::{Client, ClientError};
pub use config::{Command, Config, TimerKind, USAGE};
pub use forward::{ProxyBody, forward};
pub use idle_io::{Activity, IdleIo, idle_watch};
pub use runtime::run_blocking;
pub use server::{Proxy, listen};
pub use stats::{Lateness, LatenessSummary, Stats};
pub use timer::{CorewheelTimer, ProxyTimer, TimedOut, TokioTimer, driven_engine};
pub use upstream::{Upstream, UpstreamError};
