//! Benchmarks of corewheel-durable. Run with `--release`:
//!
//! - `schedule <threads> <batch> <total>`: durable schedules per second with group commit,
//!   and fsyncs per second;
//! - `lateness <tasks>`: lateness of tasks loaded from disk ahead of time and of tasks
//!   scheduled into the window, against the system clock (never early is checked);
//! - `pending <tasks>`: RSS with that many tasks pending a day out, then the time from
//!   `open` to the first due task's delivery with them all still pending.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use corewheel_durable::{DurableTimers, Options};

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

fn lateness(args: &[String]) {
    let tasks = arg(args, 2, 20_000);
    let dir = tempfile::tempdir().unwrap();
    let options = Options::default()
        .bucket_width(Duration::from_secs(1))
        .load_ahead(Duration::from_millis(300));
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let late: Arc<Mutex<Vec<(bool, f64)>>> = Arc::default();
    let early = Arc::new(AtomicU64::new(0));
    {
        let (late, early) = (Arc::clone(&late), Arc::clone(&early));
        timers
            .run_handler(2, move |task| {
                let lag = ms(SystemTime::now()) - ms(task.due());
                if lag < 0.0 {
                    early.fetch_add(1, Ordering::Relaxed);
                }
                let from_disk = task.id()[0] == b'd';
                late.lock().unwrap().push((from_disk, lag));
                Ok::<(), ()>(())
            })
            .unwrap();
    }
    let now = SystemTime::now();
    // From disk: due 4 to 8 s out, so in buckets read by the loader 300 ms ahead.
    let far = (0..tasks / 2).map(|i| {
        let due = now + Duration::from_millis(4000 + (i as u64 * 4000) / (tasks as u64 / 2));
        (format!("d{i}"), [0u8; 16], due)
    });
    timers.schedule_batch(far).unwrap();
    // Recent: scheduled into the window, due 50 ms after each schedule, spread over 4 s.
    let start = Instant::now();
    for i in 0..tasks / 2 {
        let at = Duration::from_micros((i as u64 * 4_000_000) / (tasks as u64 / 2));
        if let Some(wait) = at.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let due = SystemTime::now() + Duration::from_millis(50);
        timers.schedule(format!("r{i}"), [0u8; 16], due).unwrap();
    }
    while late.lock().unwrap().len() < tasks / 2 * 2 {
        std::thread::sleep(Duration::from_millis(50));
    }
    let all = late.lock().unwrap().clone();
    for (name, disk) in [("loaded from disk", true), ("recent (in window)", false)] {
        let mut v: Vec<f64> = all
            .iter()
            .filter(|(d, _)| *d == disk)
            .map(|(_, l)| *l)
            .collect();
        v.sort_by(f64::total_cmp);
        let p = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
        println!(
            "lateness {name}: {} tasks, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            v.len(),
            p(0.5),
            p(0.99),
            v[v.len() - 1]
        );
    }
    println!("early: {}", early.load(Ordering::Relaxed));
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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("schedule") => schedule(&args),
        Some("lateness") => lateness(&args),
        Some("pending") => pending(&args),
        _ => eprintln!("usage: durable_bench schedule|lateness|pending [args]"),
    }
}
