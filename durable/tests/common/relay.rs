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
    stop: Arc<AtomicBool>,
}

impl Relay {
    /// A relay to `upstream` (`host:port`).
    pub fn start(upstream: String) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let frozen = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (f, s) = (Arc::clone(&frozen), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let server = TcpStream::connect(&upstream).unwrap();
                        for (from, to) in [
                            (client.try_clone().unwrap(), server.try_clone().unwrap()),
                            (server, client),
                        ] {
                            let (f, s) = (Arc::clone(&f), Arc::clone(&s));
                            std::thread::spawn(move || pump(from, to, &f, &s));
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => panic!("relay accept: {e}"),
                }
            }
        });
        Relay { port, frozen, stop }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Stops moving bytes, both ways, on every connection.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    pub fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copies `from` to `to` while not frozen; ends when either side closes.
fn pump(mut from: TcpStream, mut to: TcpStream, frozen: &AtomicBool, stop: &AtomicBool) {
    from.set_read_timeout(Some(Duration::from_millis(5)))
        .unwrap();
    let mut buf = [0u8; 16 * 1024];
    while !stop.load(Ordering::Relaxed) {
        if frozen.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
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
