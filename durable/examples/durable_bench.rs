//! Benchmarks of corewheel-durable. Run with `--release`:
//!
//! - `schedule <threads> <batch> <total>`: durable schedules per second with group commit,
//!   and fsyncs per second;
//! - `lateness <tasks>`: lateness of tasks loaded from disk ahead of time and of tasks
//!   scheduled into the window, against the system clock (never early is checked);
//! - `pending <tasks>`: RSS with that many tasks pending a day out, then the time from
//!   `open` to the first due task's delivery with them all still pending;
//! - `compare [tasks] [threads] [total]`: one table of durable timers against a Redis
//!   sorted set polled every 1 s and every 100 ms (a `redis-server` started by the bench,
//!   with an fsynced append-only file): schedules/s from concurrent single calls, and the
//!   lateness workload. Without `redis-server` it says how to install it and prints only
//!   the durable rows. A row for redb (group commit, one write transaction per group)
//!   gives schedules/s of the same calls on that embedded store.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use corewheel_durable::{DurableTimers, Options};

#[path = "../tests/common/redis_server.rs"]
mod redis_server;
use redis_server::Server;

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn ms(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64() * 1000.0
}

fn arg(args: &[String], i: usize, default: usize) -> usize {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
}

fn schedule(args: &[String]) {
    let (threads, batch, total) = (arg(args, 2, 4), arg(args, 3, 1000), arg(args, 4, 1_000_000));
    let dir = tempfile::tempdir().unwrap();
    let timers = Arc::new(DurableTimers::open(dir.path(), Options::default()).unwrap());
    let day = SystemTime::now() + Duration::from_secs(86_400);
    let start = Instant::now();
    let per_thread = total / threads;
    std::thread::scope(|s| {
        for t in 0..threads {
            let timers = Arc::clone(&timers);
            s.spawn(move || {
                let mut i = 0;
                while i < per_thread {
                    let n = batch.min(per_thread - i);
                    let tasks = (i..i + n).map(|k| (format!("t{t}-{k}"), [0u8; 16], day));
                    timers.schedule_batch(tasks).unwrap();
                    i += n;
                }
            });
        }
    });
    let secs = start.elapsed().as_secs_f64();
    let done = per_thread * threads;
    println!(
        "schedule: {threads} threads, batch {batch}: {done} durable schedules in {secs:.2} s = {:.0}/s; {} fsyncs = {:.0} fsyncs/s",
        done as f64 / secs,
        timers.fsyncs(),
        timers.fsyncs() as f64 / secs
    );
}

/// p50, p99 and max of a list of milliseconds, sorted in place.
fn percentiles(v: &mut [f64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    let p = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    (p(0.5), p(0.99), v[v.len() - 1])
}

/// Lateness of a plain `std::thread::sleep` timer loop on its own thread, for as long as
/// `running` is set: it sleeps until the next of a series of deadlines 0.2 ms apart (about
/// the tasks' density) and serves every deadline passed when it wakes. What the machine's
/// scheduler alone costs a thread that wakes at deadlines, the floor for any timer; since
/// its deadlines cover the run as evenly as the tasks' due times, a stall of the whole
/// machine weighs the same in both figures.
fn sleep_floor(running: Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<Vec<f64>> {
    std::thread::spawn(move || {
        let step = Duration::from_micros(200);
        let start = SystemTime::now() + step;
        let mut lags = Vec::new();
        let mut next = start;
        while running.load(Ordering::Relaxed) {
            if let Ok(wait) = next.duration_since(SystemTime::now()) {
                std::thread::sleep(wait);
            }
            let now = SystemTime::now();
            while next <= now {
                lags.push(ms(now) - ms(next));
                next += step;
            }
        }
        lags
    })
}

/// Deliveries as `(id, wall-clock ms at the handler call)`.
type Seen = Arc<Mutex<Vec<(String, f64)>>>;

/// The timer system under test in [`lateness_run`]: durable timers, or a Redis sorted set
/// polled as Sidekiq does it.
trait Timers: Sync {
    /// Schedules many tasks in one call, `(id, due)`.
    fn bulk(&self, tasks: Vec<(String, SystemTime)>);
    /// Schedules one task and returns once it is stored.
    fn one(&self, id: &str, due: SystemTime);
}

impl Timers for DurableTimers {
    fn bulk(&self, tasks: Vec<(String, SystemTime)>) {
        self.schedule_batch(tasks.into_iter().map(|(id, due)| (id, [0u8; 16], due)))
            .unwrap();
    }
    fn one(&self, id: &str, due: SystemTime) {
        self.schedule(id, [0u8; 16], due).unwrap();
    }
}

/// Lateness figures of one run.
struct Lateness {
    disk: (f64, f64, f64),
    recent: (f64, f64, f64),
    all: (f64, f64, f64),
    floor: (f64, f64, f64),
    acked_late: usize,
    early: u64,
    delivered: usize,
}

/// The lateness workload: `tasks / 2` scheduled in one call due 4 to 8 s out (so, for the
/// durable timers, read from disk by the loader ahead of time), and `tasks / 2` scheduled
/// one by one over 4 s, each due 50 ms after its call. `seen` receives `(id, wall ms at
/// the handler call)` from the system under test. A plain sleep loop runs meanwhile as
/// the floor.
fn lateness_run(timers: &dyn Timers, tasks: usize, seen: &Seen) -> Lateness {
    let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let floor = sleep_floor(Arc::clone(&running));
    let now = SystemTime::now();
    let half = tasks / 2;
    // id -> (due ms, ms when its schedule call returned).
    let mut due: std::collections::HashMap<String, (f64, f64)> = Default::default();
    let far: Vec<_> = (0..half)
        .map(|i| {
            let due = now + Duration::from_millis(4000 + (i as u64 * 4000) / (half as u64));
            (format!("d{i}"), due)
        })
        .collect();
    for (id, d) in &far {
        due.insert(id.clone(), (ms(*d).ceil(), 0.0));
    }
    timers.bulk(far);
    let start = Instant::now();
    for i in 0..half {
        let at = Duration::from_micros((i as u64 * 4_000_000) / (half as u64));
        if let Some(wait) = at.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let d = SystemTime::now() + Duration::from_millis(50);
        let id = format!("r{i}");
        timers.one(&id, d);
        due.insert(id, (ms(d).ceil(), ms(SystemTime::now())));
    }
    let give_up = Instant::now() + Duration::from_secs(30);
    while seen.lock().unwrap().len() < half * 2 && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(50));
    }
    running.store(false, Ordering::Relaxed);
    let mut floor = floor.join().unwrap();
    let all = seen.lock().unwrap().clone();
    let (mut disk, mut recent, mut every) = (Vec::new(), Vec::new(), Vec::new());
    let (mut acked_late, mut early) = (0, 0);
    for (id, at) in &all {
        let (d, acked) = due[id];
        if *at < d {
            early += 1;
        }
        every.push(at - d);
        if id.starts_with('d') {
            disk.push(at - d);
        } else {
            recent.push(at - d);
            if acked > d {
                acked_late += 1;
            }
        }
    }
    Lateness {
        disk: percentiles(&mut disk),
        recent: percentiles(&mut recent),
        all: percentiles(&mut every),
        floor: percentiles(&mut floor),
        acked_late,
        early,
        delivered: all.len(),
    }
}

/// Opens durable timers for the lateness workload: one-second buckets read 300 ms ahead.
fn durable_for_lateness(dir: &std::path::Path) -> (DurableTimers, Seen) {
    let options = Options::default()
        .bucket_width(Duration::from_secs(1))
        .load_ahead(Duration::from_millis(300));
    let timers = DurableTimers::open(dir, options).unwrap();
    let seen: Seen = Arc::default();
    let s = Arc::clone(&seen);
    timers
        .run_handler(2, move |task| {
            let at = ms(SystemTime::now());
            let id = String::from_utf8_lossy(task.id()).into_owned();
            s.lock().unwrap().push((id, at));
            Ok::<(), ()>(())
        })
        .unwrap();
    (timers, seen)
}

fn lateness(args: &[String]) {
    let tasks = arg(args, 2, 20_000);
    let dir = tempfile::tempdir().unwrap();
    let (timers, seen) = durable_for_lateness(dir.path());
    let l = lateness_run(&timers, tasks, &seen);
    for (name, (p50, p99, max)) in [
        ("loaded from disk", l.disk),
        ("recent (in window)", l.recent),
        ("floor: a plain std::thread::sleep timer loop", l.floor),
    ] {
        println!("lateness {name}: p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms");
    }
    println!(
        "delivered {} of {tasks}; recent tasks whose schedule call returned after their due time: {}",
        l.delivered, l.acked_late
    );
    println!("early: {}", l.early);
}

fn pending(args: &[String]) {
    let tasks = arg(args, 2, 10_000_000);
    let dir = tempfile::tempdir_in(std::env::var("BENCH_DIR").unwrap_or("/tmp".into())).unwrap();
    let rss0 = rss_kib();
    let now = SystemTime::now();
    {
        let timers = Arc::new(
            DurableTimers::open(dir.path(), Options::default().expected_pending(tasks)).unwrap(),
        );
        let start = Instant::now();
        std::thread::scope(|s| {
            for t in 0..2usize {
                let timers = Arc::clone(&timers);
                s.spawn(move || {
                    let mut i = t;
                    while i < tasks {
                        let batch: Vec<(String, [u8; 16], SystemTime)> = (0..10_000)
                            .map(|k| i + 2 * k)
                            .take_while(|&k| k < tasks)
                            .map(|k| {
                                // A day out, spread over the following 24 hours.
                                let due = now
                                    + Duration::from_secs(
                                        86_400 + (k as u64 * 86_400) / tasks as u64,
                                    );
                                (format!("order-{k:010}"), [0u8; 16], due)
                            })
                            .collect();
                        i += 2 * batch.len();
                        timers.schedule_batch(batch).unwrap();
                    }
                });
            }
        });
        timers
            .schedule("due-now", b"", now + Duration::from_secs(1))
            .unwrap();
        let secs = start.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_millis(500));
        let rss = rss_kib();
        println!(
            "pending: {tasks} tasks a day out scheduled in {secs:.1} s ({:.0}/s); RSS {} MiB (before open {} MiB), {:.1} bytes/task above the start; in memory {}",
            tasks as f64 / secs,
            rss / 1024,
            rss0 / 1024,
            (rss.saturating_sub(rss0) * 1024) as f64 / tasks as f64,
            timers.in_memory()
        );
        match Arc::try_unwrap(timers) {
            Ok(t) => t.close().unwrap(),
            Err(_) => unreachable!(),
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    let start = Instant::now();
    let timers =
        DurableTimers::open(dir.path(), Options::default().expected_pending(tasks)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = Mutex::new(tx);
    timers
        .run_handler(1, move |task| {
            let _ = tx
                .lock()
                .unwrap()
                .send(String::from_utf8_lossy(task.id()).into_owned());
            Ok::<(), ()>(())
        })
        .unwrap();
    let first = rx.recv().unwrap();
    println!(
        "open to first due fire with {tasks} pending: {:.1} ms ({first}); RSS after reopen {} MiB",
        start.elapsed().as_secs_f64() * 1000.0,
        rss_kib() / 1024
    );
    std::thread::sleep(Duration::from_secs(3));
    println!(
        "RSS 3 s after reopen (upsert filter rebuilt): {} MiB",
        rss_kib() / 1024
    );
}

/// Durable schedules per second with `threads` callers each scheduling one task per call,
/// `total` in all, due a day out: what group commit gives concurrent single calls.
fn durable_throughput(threads: usize, total: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let timers = DurableTimers::open(dir.path(), Options::default()).unwrap();
    let day = SystemTime::now() + Duration::from_secs(86_400);
    let per_thread = total / threads;
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let timers = &timers;
            s.spawn(move || {
                for k in 0..per_thread {
                    timers
                        .schedule(format!("t{t}-{k}"), [0u8; 16], day)
                        .unwrap();
                }
            });
        }
    });
    (per_thread * threads) as f64 / start.elapsed().as_secs_f64()
}

/// The same concurrent single calls against redb, with the group commit the durable
/// timers' writer does: one thread takes every waiting call and commits them in one write
/// transaction with `Durability::Immediate`, then answers them. Each task is two inserts,
/// by id and by due time, as a timer store needs to find due tasks in order. Returns
/// schedules/s and the number of commits.
fn redb_throughput(threads: usize, total: usize) -> (f64, u64) {
    use redb::{Database, Durability, TableDefinition};
    const TASKS: TableDefinition<&str, (u64, &[u8])> = TableDefinition::new("tasks");
    const BY_DUE: TableDefinition<(u64, &str), ()> = TableDefinition::new("by_due");
    type Call = (String, u64, std::sync::mpsc::SyncSender<()>);
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(dir.path().join("timers.redb")).unwrap();
    let (calls, queue) = std::sync::mpsc::channel::<Call>();
    let writer = std::thread::spawn(move || {
        let mut commits = 0;
        while let Ok(first) = queue.recv() {
            let mut group = vec![first];
            group.extend(queue.try_iter().take(1 << 16));
            let mut txn = db.begin_write().unwrap();
            txn.set_durability(Durability::Immediate).unwrap();
            {
                let mut tasks = txn.open_table(TASKS).unwrap();
                let mut by_due = txn.open_table(BY_DUE).unwrap();
                for (id, due, _) in &group {
                    tasks.insert(id.as_str(), (*due, &[0u8; 16][..])).unwrap();
                    by_due.insert((*due, id.as_str()), ()).unwrap();
                }
            }
            txn.commit().unwrap();
            commits += 1;
            for (_, _, reply) in group {
                let _ = reply.send(());
            }
        }
        commits
    });
    let day = ms(SystemTime::now() + Duration::from_secs(86_400)) as u64;
    let per_thread = total / threads;
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let calls = calls.clone();
            s.spawn(move || {
                for k in 0..per_thread {
                    let (reply, done) = std::sync::mpsc::sync_channel(1);
                    calls.send((format!("t{t}-{k}"), day, reply)).unwrap();
                    done.recv().unwrap();
                }
            });
        }
    });
    let rate = (per_thread * threads) as f64 / start.elapsed().as_secs_f64();
    drop(calls);
    (rate, writer.join().unwrap())
}

/// A connection to `server`.
fn connect(server: &Server) -> redis::Connection {
    redis::Client::open(server.url())
        .and_then(|client| client.get_connection())
        .unwrap()
}

/// Empties `server` between workloads.
fn flush(server: &Server) {
    redis::cmd("FLUSHALL")
        .query::<()>(&mut connect(server))
        .unwrap();
}

/// The redb release the bench is built against, for the table.
const REDB_VERSION: &str = "4.1";

/// The sorted set of pending ids scored by due ms, and the hash of their payloads.
const ZSET: &str = "schedule";
const PAYLOADS: &str = "payloads";

/// Takes up to ARGV[2] members due by ARGV[1] off the set, with their payloads, in one
/// atomic step, so two pollers can never take one task twice.
const TAKE_DUE: &str = r"
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #ids == 0 then return {} end
redis.call('ZREM', KEYS[1], unpack(ids))
local payloads = redis.call('HMGET', KEYS[2], unpack(ids))
redis.call('HDEL', KEYS[2], unpack(ids))
local out = {}
for i = 1, #ids do out[2 * i - 1] = ids[i]; out[2 * i] = payloads[i] end
return out
";

/// Schedules into Redis: ZADD of the id at its due ms with the payload in a hash, both in
/// one MULTI.
struct RedisTimers {
    con: Mutex<redis::Connection>,
}

fn redis_add(pipe: &mut redis::Pipeline, id: &str, due: SystemTime) {
    pipe.cmd("ZADD")
        .arg(ZSET)
        .arg(ms(due).ceil() as u64)
        .arg(id)
        .ignore()
        .cmd("HSET")
        .arg(PAYLOADS)
        .arg(id)
        .arg(&[0u8; 16][..])
        .ignore();
}

impl Timers for RedisTimers {
    fn bulk(&self, tasks: Vec<(String, SystemTime)>) {
        let mut con = self.con.lock().unwrap();
        for chunk in tasks.chunks(1000) {
            let mut pipe = redis::pipe();
            pipe.atomic();
            for (id, due) in chunk {
                redis_add(&mut pipe, id, *due);
            }
            pipe.query::<()>(&mut *con).unwrap();
        }
    }
    fn one(&self, id: &str, due: SystemTime) {
        let mut pipe = redis::pipe();
        pipe.atomic();
        redis_add(&mut pipe, id, due);
        pipe.query::<()>(&mut *self.con.lock().unwrap()).unwrap();
    }
}

/// The Sidekiq-style poller: every `interval`, takes every due task off the set, 100 at a
/// time, and "runs" each (records when it had it) until `stop` is set.
fn redis_poller(
    server: &Server,
    interval: Duration,
    seen: Seen,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let mut con = connect(server);
    std::thread::spawn(move || {
        let mut tick = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            loop {
                let now = ms(SystemTime::now()).floor() as u64;
                let taken: Vec<Vec<u8>> = redis::cmd("EVAL")
                    .arg(TAKE_DUE)
                    .arg(2)
                    .arg(ZSET)
                    .arg(PAYLOADS)
                    .arg(now)
                    .arg(100)
                    .query(&mut con)
                    .unwrap();
                let at = ms(SystemTime::now());
                let n = taken.len() / 2;
                let mut seen = seen.lock().unwrap();
                for pair in taken.chunks(2) {
                    seen.push((String::from_utf8_lossy(&pair[0]).into_owned(), at));
                }
                if n < 100 {
                    break;
                }
            }
            tick += interval;
            if let Some(wait) = tick.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
    })
}

/// Redis schedules per second with `threads` connections each adding one task per MULTI.
fn redis_throughput(server: &Server, threads: usize, total: usize) -> f64 {
    flush(server);
    let day = SystemTime::now() + Duration::from_secs(86_400);
    let per_thread = total / threads;
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let mut con = connect(server);
            s.spawn(move || {
                for k in 0..per_thread {
                    let mut pipe = redis::pipe();
                    pipe.atomic();
                    redis_add(&mut pipe, &format!("t{t}-{k}"), day);
                    pipe.query::<()>(&mut con).unwrap();
                }
            });
        }
    });
    let rate = (per_thread * threads) as f64 / start.elapsed().as_secs_f64();
    flush(server);
    rate
}

/// One table row: name, durability, schedules/s and a lateness run.
fn row(name: &str, durability: &str, rate: f64, l: &Lateness, tasks: usize) {
    let f = |(p50, p99, max): (f64, f64, f64)| format!("{p50:.2} / {p99:.2} / {max:.1}");
    println!(
        "| {name} | {durability} | {rate:.0} | {} | {} | {} | {} | {} | {}/{tasks} |",
        f(l.all),
        f(l.disk),
        f(l.recent),
        l.acked_late,
        l.early,
        l.delivered
    );
}

/// Durable timers against Redis sorted-set polling (1 s and 100 ms), the same workloads,
/// one table.
fn compare(args: &[String]) {
    let tasks = arg(args, 2, 20_000);
    let threads = arg(args, 3, 16);
    let total = arg(args, 4, 20_000);
    println!(
        "schedules/s: {threads} threads, one task per call, {total} in all. Lateness (ms, p50 / p99 / max): \
         {} tasks due 4-8 s out scheduled in one call (\"far\") and {} scheduled one by one over 4 s \
         due 50 ms after the call (\"near\"); \"near stored after due\": near tasks whose schedule call \
         returned after their due time; early = delivered before the due time. Redis's schedules/s is \
         one measurement, shown on both of its rows.",
        tasks / 2,
        tasks / 2
    );
    println!();
    println!(
        "| system | durability | schedules/s | lateness all | far | near | near stored after due | early | delivered |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let rate = durable_throughput(threads, total);
    let dir = tempfile::tempdir().unwrap();
    let (timers, seen) = durable_for_lateness(dir.path());
    let l = lateness_run(&timers, tasks, &seen);
    drop(timers);
    row(
        "corewheel-durable",
        "fsync per group commit",
        rate,
        &l,
        tasks,
    );
    let (rate, commits) = redb_throughput(threads, total);
    println!(
        "| redb {REDB_VERSION}, group commit | one write transaction per group, Durability::Immediate ({commits} commits) | {rate:.0} | - | - | - | - | - | - |"
    );
    let mut floors = vec![("corewheel-durable run", l.floor)];
    if let Some(server) = Server::start_fsyncing("durable_bench: the Redis rows") {
        let rate = redis_throughput(&server, threads, total);
        for (name, interval) in [
            ("Redis ZSET, 1 s poll", Duration::from_secs(1)),
            ("Redis ZSET, 100 ms poll", Duration::from_millis(100)),
        ] {
            flush(&server);
            let seen: Seen = Arc::default();
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let poller = redis_poller(&server, interval, Arc::clone(&seen), Arc::clone(&stop));
            let timers = RedisTimers {
                con: Mutex::new(connect(&server)),
            };
            let l = lateness_run(&timers, tasks, &seen);
            stop.store(true, Ordering::Relaxed);
            poller.join().unwrap();
            row(name, "AOF, appendfsync always", rate, &l, tasks);
            floors.push((name, l.floor));
        }
    }
    for (during, (p50, p99, max)) in floors {
        println!(
            "| floor: a plain std::thread::sleep timer loop, during the {during} | - | - | {p50:.2} / {p99:.2} / {max:.1} | | | | | |"
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("schedule") => schedule(&args),
        Some("lateness") => lateness(&args),
        Some("pending") => pending(&args),
        Some("compare") => compare(&args),
        _ => eprintln!("usage: durable_bench schedule|lateness|pending|compare [args]"),
    }
}
