//! The same delayed-task workload on `RedisTimers` and on Sidekiq-style sorted-set
//! polling (1 s and 100 ms), each with 4 consumer processes (this binary re-executed as
//! children), on one `redis-server` this bench starts (loopback, AOF `appendfsync
//! always`).
//!
//! `cargo run --release -p corewheel-durable --features redis --example redis_store_bench`
//!
//! One producer (this process, one thread) schedules `TASKS` tasks evenly over `LOAD`,
//! each due 20 ms to 3 s after it is scheduled (the same pseudo-random delays for every
//! subject), then the queue idles for `IDLE`. Per subject it reports: schedule calls a
//! second (one thread, one call per task: tasks over the time spent inside the calls);
//! lateness p50/p99/max and the early count, each measured by the consumer on the wall
//! clock against the due time; redis-server CPU (utime+stime from `/proc`) over the run;
//! consumer round trips per task (every request each consumer process sent after it was
//! ready, summed: a script call, command or pipeline counts one; hints pushed to
//! RedisTimers subscribers count nothing); and each consumer process's CPU over the run
//! (`/proc/self/stat`).
//!
//! The polling consumer is Sidekiq's scheduled-set poller: every interval (first one at
//! a random offset), it pops due entries one at a time with Sidekiq's Lua
//! `zpopbyscore` (`ZRANGEBYSCORE key -inf now LIMIT 0 1` then `ZREM`) until none is
//! due. It has no lease and no ack: a consumer dying after a pop loses the task.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use corewheel_durable::{RedisOptions, RedisTimers};

#[path = "../tests/common/redis_server.rs"]
mod redis_server;
use redis_server::Server;

const TASKS: u64 = 3000;
const LOAD: Duration = Duration::from_secs(10);
const IDLE: Duration = Duration::from_secs(10);
const MAX_DELAY_MS: u64 = 3000;
const PROCS: usize = 4;
const SHARDS: u32 = 8;

/// Sidekiq's `LUA_ZPOPBYSCORE` (lib/sidekiq/scheduled.rb).
const ZPOPBYSCORE: &str = r#"
local key, now = KEYS[1], ARGV[1]
local jobs = redis.call("zrangebyscore", key, "-inf", now, "limit", 0, 1)
if jobs[1] then
  redis.call("zrem", key, jobs[1])
  return jobs[1]
end
"#;

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// utime + stime of a process, in ms (clock ticks of 10 ms).
fn cpu_ms(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    (f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()) * 10
}

/// What a consumer process reports when told to stop.
struct Report {
    lateness_us: Vec<i64>,
    round_trips: u64,
    cpu_ms: u64,
}

fn main() {
    if let Ok(kind) = std::env::var("CWR_BENCH_CHILD") {
        child(&kind);
        return;
    }
    let Some(server) = Server::start_fsyncing("redis_store_bench") else {
        return;
    };
    let url = server.url();
    let redis_pid = server.pid().to_string();
    let subjects = [
        ("RedisTimers", "timers", 0),
        ("ZSET poll 1 s", "poll", 1000),
        ("ZSET poll 100 ms", "poll", 100),
    ];
    let mut rows = Vec::new();
    for (name, kind, interval) in subjects {
        let queue = format!("bench-{kind}-{interval}");
        eprintln!("running {name} ...");
        rows.push((name, run(&url, &redis_pid, kind, interval, &queue)));
    }
    println!(
        "{TASKS} tasks scheduled over {} s (due 20-{MAX_DELAY_MS} ms after scheduling), then {} s idle; {PROCS} consumer processes each; RedisTimers: {SHARDS} shards, window 1 s, 2 handler threads a process",
        LOAD.as_secs(),
        IDLE.as_secs()
    );
    println!(
        "{:<17} {:>8} {:>7} {:>8} {:>8} {:>9} {:>6} {:>10} {:>8}  consumer CPU ms (each)",
        "subject",
        "sched/s",
        "handled",
        "p50 ms",
        "p99 ms",
        "max ms",
        "early",
        "redis CPU",
        "RT/task"
    );
    for (name, r) in &rows {
        println!(
            "{:<17} {:>8.0} {:>7} {:>8.2} {:>8.2} {:>9.2} {:>6} {:>8}ms {:>8.3}  {:?}",
            name,
            r.sched_per_s,
            r.handled,
            r.p50,
            r.p99,
            r.max,
            r.early,
            r.redis_cpu_ms,
            r.rt_per_task,
            r.consumer_cpu_ms
        );
    }
    let base = &rows[0].1;
    for (name, r) in &rows[1..] {
        println!(
            "{name} / RedisTimers: p99 x{:.1}, RT/task x{:.2}, redis CPU x{:.2}, consumer CPU x{:.2}",
            r.p99 / base.p99,
            r.rt_per_task / base.rt_per_task,
            r.redis_cpu_ms as f64 / base.redis_cpu_ms.max(1) as f64,
            r.consumer_cpu_ms.iter().sum::<u64>() as f64
                / base.consumer_cpu_ms.iter().sum::<u64>().max(1) as f64
        );
    }
}

struct Row {
    sched_per_s: f64,
    handled: usize,
    p50: f64,
    p99: f64,
    max: f64,
    early: usize,
    redis_cpu_ms: u64,
    rt_per_task: f64,
    consumer_cpu_ms: Vec<u64>,
}

fn run(url: &str, redis_pid: &str, kind: &str, interval_ms: u64, queue: &str) -> Row {
    let dir = tempfile::tempdir().unwrap();
    let mut children: Vec<_> = (0..PROCS)
        .map(|i| {
            let out = dir.path().join(format!("c{i}"));
            let mut child = Command::new(std::env::current_exe().unwrap())
                .env("CWR_BENCH_CHILD", kind)
                .env("CWR_BENCH_URL", url)
                .env("CWR_BENCH_QUEUE", queue)
                .env("CWR_BENCH_INTERVAL", interval_ms.to_string())
                .env("CWR_BENCH_OUT", &out)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            assert_eq!(line.trim(), "READY");
            (child, out)
        })
        .collect();
    let redis_cpu0 = cpu_ms(redis_pid);
    let producer = RedisTimers::open(url, queue, RedisOptions::default().shards(SHARDS)).unwrap();
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    let mut rng = fastrand::Rng::with_seed(44);
    let start = Instant::now();
    let mut in_calls = Duration::ZERO;
    for i in 0..TASKS {
        let at = start + LOAD * (i as u32) / (TASKS as u32);
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let due = SystemTime::now() + Duration::from_millis(rng.u64(20..=MAX_DELAY_MS));
        let id = format!("t{i}");
        let before = Instant::now();
        if kind == "timers" {
            producer.schedule(&id, b"", due).unwrap();
        } else {
            let due_ms = due
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos()
                .div_ceil(1_000_000) as u64;
            redis::cmd("ZADD")
                .arg(queue)
                .arg(due_ms)
                .arg(format!("{id}|{due_ms}"))
                .query::<()>(&mut con)
                .unwrap();
        }
        in_calls += before.elapsed();
    }
    std::thread::sleep(Duration::from_millis(MAX_DELAY_MS + 1000) + IDLE);
    let redis_cpu_ms = cpu_ms(redis_pid) - redis_cpu0;
    let mut lateness = Vec::new();
    let mut round_trips = 0;
    let mut consumer_cpu_ms = Vec::new();
    for (child, _) in &mut children {
        child.stdin.take().unwrap().write_all(b"stop\n").unwrap();
    }
    for (mut child, out) in children {
        assert!(child.wait().unwrap().success());
        let r = read_report(&out);
        lateness.extend(r.lateness_us);
        round_trips += r.round_trips;
        consumer_cpu_ms.push(r.cpu_ms);
    }
    drop(producer);
    lateness.sort_unstable();
    let q = |p: f64| lateness[((lateness.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    Row {
        sched_per_s: TASKS as f64 / in_calls.as_secs_f64(),
        handled: lateness.len(),
        p50: q(0.5),
        p99: q(0.99),
        max: q(1.0),
        early: lateness.iter().filter(|&&l| l < 0).count(),
        redis_cpu_ms,
        rt_per_task: round_trips as f64 / TASKS as f64,
        consumer_cpu_ms,
    }
}

fn read_report(path: &std::path::Path) -> Report {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let head: Vec<u64> = lines
        .next()
        .unwrap()
        .split(' ')
        .map(|n| n.parse().unwrap())
        .collect();
    Report {
        round_trips: head[0],
        cpu_ms: head[1],
        lateness_us: lines.map(|l| l.parse().unwrap()).collect(),
    }
}

/// A consumer process: says READY, consumes until told to stop on stdin, then writes
/// `<round trips> <cpu ms>` and one lateness (µs) a line to its output file.
fn child(kind: &str) {
    let var = |name: &str| std::env::var(name).unwrap();
    let (url, queue, out) = (
        var("CWR_BENCH_URL"),
        var("CWR_BENCH_QUEUE"),
        var("CWR_BENCH_OUT"),
    );
    let late = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let round_trips = Arc::new(Mutex::new(0u64));
    let mut timers = None;
    let mut poller = None;
    if kind == "timers" {
        let t = RedisTimers::open(&url, &queue, RedisOptions::default().shards(SHARDS)).unwrap();
        let late = Arc::clone(&late);
        t.run_handler(2, move |task| {
            let due = task.due().duration_since(UNIX_EPOCH).unwrap().as_micros() as i64;
            late.lock().unwrap().push(now_us() - due);
            Ok::<(), ()>(())
        })
        .unwrap();
        timers = Some(t);
    } else {
        let interval = Duration::from_millis(var("CWR_BENCH_INTERVAL").parse().unwrap());
        let (late, stop, rts) = (
            Arc::clone(&late),
            Arc::clone(&stop),
            Arc::clone(&round_trips),
        );
        let mut con = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(ZPOPBYSCORE)
            .query(&mut con)
            .unwrap();
        poller = Some(std::thread::spawn(move || {
            let mut next = Instant::now() + interval.mul_f64(fastrand::f64());
            while !stop.load(Ordering::Relaxed) {
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait.min(Duration::from_millis(20)));
                    continue;
                }
                next += interval;
                loop {
                    let now_ms = now_us() / 1000;
                    let job: Option<String> = redis::cmd("EVALSHA")
                        .arg(&sha)
                        .arg(1)
                        .arg(&queue)
                        .arg(now_ms)
                        .query(&mut con)
                        .unwrap();
                    *rts.lock().unwrap() += 1;
                    let Some(job) = job else { break };
                    let due_ms: i64 = job.split_once('|').unwrap().1.parse().unwrap();
                    late.lock().unwrap().push(now_us() - due_ms * 1000);
                }
            }
        }));
    }
    let rt0 = timers.as_ref().map_or(0, RedisTimers::round_trips);
    let cpu0 = cpu_ms("self");
    println!("READY");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    stop.store(true, Ordering::Relaxed);
    let rts = match (timers, poller) {
        (Some(t), _) => {
            let rts = t.round_trips() - rt0;
            t.close().unwrap();
            rts
        }
        (None, Some(p)) => {
            p.join().unwrap();
            *round_trips.lock().unwrap()
        }
        _ => unreachable!(),
    };
    let cpu = cpu_ms("self") - cpu0;
    let mut text = format!("{rts} {cpu}\n");
    for l in late.lock().unwrap().iter() {
        text.push_str(&format!("{l}\n"));
    }
    std::fs::write(out, text).unwrap();
}
