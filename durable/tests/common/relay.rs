//! A loopback TCP relay for tests: real bytes passed to a real server, and switches that
//! freeze them (both directions, or the replies only) to stand for a network pause, or
//! cut the connections open now.
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Accepts on a free loopback port and copies each connection to `upstream` and back,
/// unless frozen: then nothing moves (the bytes wait in the sockets' buffers).
pub struct Relay {
    port: u16,
    frozen: Arc<AtomicBool>,
    replies_frozen: Arc<AtomicBool>,
    /// Connections are numbered as accepted; those numbered below this are cut.
    accepted: Arc<AtomicU64>,
    cut_below: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    stall_subscribe: Arc<AtomicBool>,
}

impl Relay {
    /// A relay to `upstream` (`host:port`).
    pub fn start(upstream: String) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let frozen = Arc::new(AtomicBool::new(false));
        let replies_frozen = Arc::new(AtomicBool::new(false));
        let (accepted, cut_below) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let stall_subscribe = Arc::new(AtomicBool::new(false));
        let (f, rf, n, cut, s, st) = (
            Arc::clone(&frozen),
            Arc::clone(&replies_frozen),
            Arc::clone(&accepted),
            Arc::clone(&cut_below),
            Arc::clone(&stop),
            Arc::clone(&stall_subscribe),
        );
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let number = n.fetch_add(1, Ordering::SeqCst);
                        let server = TcpStream::connect(&upstream).unwrap();
                        for (from, to, stall, replies) in [
                            (
                                client.try_clone().unwrap(),
                                server.try_clone().unwrap(),
                                Some(Arc::clone(&st)),
                                None,
                            ),
                            (server, client, None, Some(Arc::clone(&rf))),
                        ] {
                            let (f, s, cut) = (Arc::clone(&f), Arc::clone(&s), Arc::clone(&cut));
                            let link = Link {
                                frozen: f,
                                replies_frozen: replies,
                                number,
                                cut_below: cut,
                                stop: s,
                                stall,
                            };
                            std::thread::spawn(move || pump(from, to, &link));
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => panic!("relay accept: {e}"),
                }
            }
        });
        Relay {
            port,
            frozen,
            replies_frozen,
            accepted,
            cut_below,
            stop,
            stall_subscribe,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Stops moving bytes, both ways, on every connection.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// Stops moving bytes from the server to its clients only: requests still arrive and
    /// run, their replies wait (a one-way stall). A reply already being read (for up to
    /// 5 ms) still goes through.
    pub fn freeze_replies(&self) {
        self.replies_frozen.store(true, Ordering::SeqCst);
    }

    /// Closes every connection open now, both ways, dropping what it holds (a server that
    /// ran a request and died before its reply left, or a middlebox reset); replies move
    /// again on the connections made after.
    pub fn cut(&self) {
        self.cut_below
            .store(self.accepted.load(Ordering::SeqCst), Ordering::SeqCst);
        self.replies_frozen.store(false, Ordering::SeqCst);
    }

    /// Moves bytes again, both ways.
    pub fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
        self.replies_frozen.store(false, Ordering::SeqCst);
    }

    /// From now on, a connection whose client sends `SUBSCRIBE` stops moving bytes (both
    /// ways) from that request on: a network that fails right after a subscriber
    /// connected, its handshake answered.
    pub fn stall_subscribes(&self) {
        self.stall_subscribe.store(true, Ordering::SeqCst);
    }

    /// Connections made from now on subscribe normally again (those stalled stay so).
    pub fn resume_subscribes(&self) {
        self.stall_subscribe.store(false, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One direction of one connection, and the switches it obeys.
struct Link {
    frozen: Arc<AtomicBool>,
    /// Set on the replies' direction only.
    replies_frozen: Option<Arc<AtomicBool>>,
    number: u64,
    cut_below: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    /// Set on the requests' direction only: see [`Relay::stall_subscribes`].
    stall: Option<Arc<AtomicBool>>,
}

/// Copies `from` to `to` while not frozen; ends when either side closes or the link is
/// cut. With `stall` set, a chunk holding `SUBSCRIBE` is swallowed and nothing more
/// moves this way.
fn pump(mut from: TcpStream, mut to: TcpStream, link: &Link) {
    from.set_read_timeout(Some(Duration::from_millis(5)))
        .unwrap();
    let mut buf = [0u8; 16 * 1024];
    while !link.stop.load(Ordering::Relaxed) {
        if link.number < link.cut_below.load(Ordering::SeqCst) {
            let _ = from.shutdown(std::net::Shutdown::Both);
            break;
        }
        if link.frozen.load(Ordering::SeqCst)
            || link
                .replies_frozen
                .as_ref()
                .is_some_and(|f| f.load(Ordering::SeqCst))
        {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if link
                    .stall
                    .as_ref()
                    .is_some_and(|s| s.load(Ordering::SeqCst))
                    && buf[..n].windows(9).any(|w| w == b"SUBSCRIBE")
                {
                    // Held open, silent, until the relay stops.
                    while !link.stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    break;
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}
