//! The proxy server: the accept loop and each client connection, on one timer back-end.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::config::{Config, TimerKind};
use crate::forward::forward;
use crate::idle_io::{Activity, IdleIo, idle_watch};
use crate::stats::Stats;
use crate::timer::{CorewheelTimer, ProxyTimer, TokioTimer};
use crate::upstream::Upstream;

/// How long the accept loop pauses after `accept` fails (out of file descriptors, most
/// likely), so that it does not spin while connections close and free some.
const ACCEPT_PAUSE: Duration = Duration::from_millis(10);

/// The accept queue's length (the kernel caps it at `net.core.somaxconn`). The usual 128
/// or 1024 overflows when thousands of clients connect at once: the kernel then drops the
/// handshake's last packet, and the client's connection is accepted only when the
/// handshake is retried, a second or more later.
const BACKLOG: u32 = 8192;

/// A listener on `addr` with a long accept queue ([`BACKLOG`]), for the proxy and for
/// servers that face as many connections at once (the load test's backend).
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // A restarted proxy can bind its port again while the old one's connections linger.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// A bound proxy, ready to run.
pub struct Proxy {
    listener: TcpListener,
    config: Config,
    stats: Arc<Stats>,
}

impl Proxy {
    /// Binds `config.listen`; port 0 picks a free port ([`Proxy::local_addr`] says which).
    pub async fn bind(config: Config) -> io::Result<Self> {
        let listener = listen(config.listen)?;
        Ok(Self {
            listener,
            config,
            stats: Arc::default(),
        })
    }

    /// Where the proxy listens.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// How late its timeouts have fired so far; it goes on counting while the proxy runs.
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.stats)
    }

    /// Serves clients until the task is dropped, on the timer `config.timer` names. Must
    /// run in a tokio runtime with I/O enabled, and with time enabled for the tokio timer
    /// and the driven corewheel timer (whose drivers it spawns on this runtime).
    pub async fn run(self) {
        let (listener, config, stats) = (self.listener, Arc::new(self.config), self.stats);
        match config.timer {
            TimerKind::Corewheel => serve(listener, config, stats, CorewheelTimer::default()).await,
            TimerKind::CorewheelDriven => {
                let timer = CorewheelTimer::drive_here();
                serve(listener, config, stats, timer).await
            }
            TimerKind::Tokio => serve(listener, config, stats, TokioTimer).await,
        }
    }
}

async fn serve<T: ProxyTimer>(
    listener: TcpListener,
    config: Arc<Config>,
    stats: Arc<Stats>,
    timer: T,
) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let config = Arc::clone(&config);
                tokio::spawn(serve_client(
                    stream,
                    config,
                    Arc::clone(&stats),
                    timer.clone(),
                ));
            }
            Err(_) => timer.sleep_until(timer.now() + ACCEPT_PAUSE).await,
        }
    }
}

/// Serves one client connection until it closes, times out or fails; its failures are its
/// own and end only it.
async fn serve_client<T: ProxyTimer>(
    stream: TcpStream,
    config: Arc<Config>,
    stats: Arc<Stats>,
    timer: T,
) {
    // Small requests and responses: waiting to coalesce them only adds latency.
    let _ = stream.set_nodelay(true);
    let activity = Arc::new(Activity::new(timer.now()));
    let watch = idle_watch(
        timer.clone(),
        Arc::clone(&activity),
        config.idle_timeout,
        Arc::clone(&stats),
    );
    let io = TokioIo::new(IdleIo::new(stream, timer.clone(), activity));
    let upstream = Arc::new(Upstream::new(
        config.upstream,
        timer.clone(),
        config.connect_timeout,
    ));
    let deadline = config.request_timeout;
    let hyper_timer = timer.hyper_timer();
    let service = service_fn(move |request| {
        let upstream = Arc::clone(&upstream);
        let timer = timer.clone();
        let stats = Arc::clone(&stats);
        async move { forward(&upstream, &timer, deadline, &stats, request).await }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(hyper_timer)
        .header_read_timeout(config.header_read_timeout)
        .serve_connection(io, service);
    // The connection's end, whatever its cause (the client closed, a timeout, bad input
    // already answered), concerns this connection only. An idle timeout drops the
    // connection future, which closes the socket and the upstream call in flight.
    tokio::select! {
        _ = connection => {}
        () = watch => {}
    }
}
