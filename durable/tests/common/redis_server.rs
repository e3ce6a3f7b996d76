//! A `redis-server` on a free loopback port, with an append-only file, in a temp dir,
//! killed on drop. Shared by the Redis tests and `examples/redis_store_bench.rs` and
//! `examples/durable_bench.rs`.
//!
//! Redis writes the append-only file before it replies, so whatever a client was told
//! survives the server's `kill -9` with any fsync policy: the tests, which kill
//! processes and not machines, leave fsync to the kernel (`appendfsync no`). Their
//! timing then does not hang on the disk: an fsync stall of a loaded machine's disk
//! lasts longer than a short lease. The benchmarks fsync before each reply, as a
//! deployment that must survive power loss would.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of one test, killed on drop.
pub struct Server {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
    /// The `appendfsync` policy.
    fsync: &'static str,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts one for a test (`appendfsync no`), or says loudly that `test` is skipped
    /// and returns `None`.
    pub fn start(test: &str) -> Option<Server> {
        Self::start_with(test, "no")
    }

    /// Starts one that fsyncs before each reply (`appendfsync always`), for a benchmark.
    pub fn start_fsyncing(test: &str) -> Option<Server> {
        Self::start_with(test, "always")
    }

    fn start_with(test: &str, fsync: &'static str) -> Option<Server> {
        if Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!(
                "\n!!! {test}: redis-server not found, SKIPPED. Install it with `apt-get install redis-server`.\n"
            );
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = spawn_server(port, dir.path(), fsync);
        let server = Server {
            child,
            port,
            dir,
            fsync,
        };
        server.wait_ready();
        Some(server)
    }

    /// The server process's id (for reading its CPU time from `/proc`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Members of `queue` whose heartbeat has not lapsed by the server's clock.
    pub fn live_members(&self, queue: &str) -> usize {
        let mut conn = redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let (secs, micros): (String, String) = redis::cmd("TIME").query(&mut conn).unwrap();
        let now_ms = secs.parse::<u64>().unwrap() * 1000 + micros.parse::<u64>().unwrap() / 1000;
        redis::cmd("ZCOUNT")
            .arg(format!("{{{queue}}}:members"))
            .arg(format!("({now_ms}"))
            .arg("+inf")
            .query(&mut conn)
            .unwrap()
    }

    fn wait_ready(&self) {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Ok(client) = redis::Client::open(self.url())
                && let Ok(mut con) = client.get_connection()
                && redis::cmd("PING").query::<String>(&mut con).is_ok()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server did not answer on port {}", self.port);
    }

    /// Stops the server with SIGSTOP: it holds its connections and answers nothing (the
    /// kernel still accepts new ones) until [`Server::resume`].
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Continues a server stopped by [`Server::pause`].
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(signal)
            .arg(self.child.id().to_string())
            .status()
            .expect("running kill");
        assert!(status.success(), "kill {signal} failed");
    }

    /// Kills the server with SIGKILL and starts it again on the same port and files.
    pub fn crash_and_restart(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.child = spawn_server(self.port, self.dir.path(), self.fsync);
        self.wait_ready();
    }
}

fn spawn_server(port: u16, dir: &std::path::Path, fsync: &str) -> Child {
    Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "yes", "--appendfsync", fsync])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("starting redis-server")
}
