//! Lateness of `RedisTimers` (wheel-armed claims) against a plain sorted set polled every
//! 100 ms, on a `redis-server` this bench starts (loopback, AOF `appendfsync always`).
//!
//! `cargo run --release -p corewheel-durable --features redis --example redis_store_bench`
//!
//! Both get the same tasks (due spread over three seconds) and report how late each was
//! handled after its due time, and how many ran early (should be 0).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use corewheel_durable::{RedisOptions, RedisTimers};

#[path = "../tests/common/redis_server.rs"]
mod redis_server;
use redis_server::Server;

const TASKS: u64 = 3000;
const SPREAD_MS: u64 = 3000;

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn main() {
    let Some(server) = Server::start("redis_store_bench") else {
        return;
    };
    let url = server.url();
    let mut con = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();

    // RedisTimers: two consumers (threads standing for processes) racing for each task.
    let late = Arc::new(Mutex::new(Vec::new()));
    let consumers: Vec<RedisTimers> = (0..2)
        .map(|_| {
            let t = RedisTimers::open(&url, "bench", RedisOptions::default().shards(4)).unwrap();
            let late = Arc::clone(&late);
            t.run_handler(2, move |task| {
                let due = task.due().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64;
                late.lock().unwrap().push(now_us() as i64 - due as i64);
                Ok::<(), ()>(())
            })
            .unwrap();
            t
        })
        .collect();
    let start = SystemTime::now() + Duration::from_millis(500);
    consumers[0]
        .schedule_batch((0..TASKS).map(|i| {
            let due = start + Duration::from_millis(i * SPREAD_MS / TASKS);
            (format!("t{i}"), Vec::new(), due)
        }))
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while consumers[0].pending().unwrap() > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(consumers);
    report("RedisTimers (wheel + claim)", &late.lock().unwrap());

    // Baseline: one sorted set, polled every 100 ms, each due member taken with ZREM.
    let start_ms = (now_us() / 1000) + 500;
    for i in 0..TASKS {
        let due = start_ms + i * SPREAD_MS / TASKS;
        redis::cmd("ZADD")
            .arg("poll")
            .arg(due)
            .arg(format!("t{i}"))
            .query::<()>(&mut con)
            .unwrap();
    }
    let mut late = Vec::new();
    while late.len() < TASKS as usize {
        let now_ms = now_us() / 1000;
        let due: Vec<(String, u64)> = redis::cmd("ZRANGEBYSCORE")
            .arg("poll")
            .arg("-inf")
            .arg(now_ms)
            .arg("WITHSCORES")
            .query(&mut con)
            .unwrap();
        for (id, due_ms) in due {
            let taken: i64 = redis::cmd("ZREM")
                .arg("poll")
                .arg(&id)
                .query(&mut con)
                .unwrap();
            if taken == 1 {
                late.push(now_us() as i64 - (due_ms * 1000) as i64);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    report("ZSET polled every 100 ms", &late);
}

fn report(name: &str, late_us: &[i64]) {
    let mut v = late_us.to_vec();
    v.sort_unstable();
    if v.is_empty() {
        println!("{name}: nothing delivered");
        return;
    }
    let q = |p: f64| v[((v.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    let early = v.iter().filter(|&&l| l < 0).count();
    println!(
        "{name}: {} tasks, lateness p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, early {early}",
        v.len(),
        q(0.5),
        q(0.99),
        q(1.0)
    );
}
