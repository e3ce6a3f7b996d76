//! A loopback TCP relay for tests: real bytes passed to a real server, and a switch that
//! freezes them (both directions) to stand for a network pause.
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Accepts on a free loopback port and copies each connection to `upstream` and back,
/// unless frozen: then nothing moves (the bytes wait in the sockets' buffers).
pub struct Relay {
    port: u16,
    frozen: Arc<AtomicBool>,
    replies_frozen: Arc<AtomicBool>,
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
        let stop = Arc::new(AtomicBool::new(false));
        let stall_subscribe = Arc::new(AtomicBool::new(false));
        let (f, rf, s, st) = (
            Arc::clone(&frozen),
            Arc::clone(&replies_frozen),
            Arc::clone(&stop),
            Arc::clone(&stall_subscribe),
        );
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
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
                            let (f, s) = (Arc::clone(&f), Arc::clone(&s));
                            std::thread::spawn(move || pump(from, to, &f, replies, &s, stall));
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
    /// run, their replies wait (a one-way stall).
    pub fn freeze_replies(&self) {
        self.replies_frozen.store(true, Ordering::SeqCst);
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
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copies `from` to `to` while neither `frozen` nor `also_frozen` is set; ends when either side closes. With `stall`
/// set, a chunk holding `SUBSCRIBE` is swallowed and nothing more moves this way.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    frozen: &AtomicBool,
    also_frozen: Option<Arc<AtomicBool>>,
    stop: &AtomicBool,
    stall: Option<Arc<AtomicBool>>,
) {
    from.set_read_timeout(Some(Duration::from_millis(5)))
        .unwrap();
    let mut buf = [0u8; 16 * 1024];
    while !stop.load(Ordering::Relaxed) {
        if frozen.load(Ordering::SeqCst)
            || also_frozen
                .as_ref()
                .is_some_and(|f| f.load(Ordering::SeqCst))
        {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if stall.as_ref().is_some_and(|s| s.load(Ordering::SeqCst))
                    && buf[..n].windows(9).any(|w| w == b"SUBSCRIBE")
                {
                    // Held open, silent, until the relay stops.
                    while !stop.load(Ordering::Relaxed) {
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
