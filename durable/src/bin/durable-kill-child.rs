//! A child process for the kill tests: schedules tasks and handles them under load, and
//! reports on stdout what is durable, so a parent can `kill -9` it at any moment and check
//! its ledger against what survives.
//!
//! Usage: `durable-kill-child <dir> <load|drain> <incarnation>`. Lines, each written
//! whole:
//! - `S <id> <due ms>`: the schedule of `id` returned, so it is durable;
//! - `F <id> <attempt> <due ms> <now ms>`: the handler started on `id`;
//! - `H <id>`: the handler of `id` succeeded and is about to return (its ack may or may
//!   not become durable before a kill);
//! - `A <id>`: the ack of `id` is durable;
//! - `c <id>`: a cancel of `id` is about to be called; `C <id>`: it returned, so it is
//!   durable. A task scheduled again (an upsert) gets a second `S` line, with its new due
//!   time, once that call returned.
//!
//! Every fifth batch also schedules a task a second or more out and at once cancels it,
//! or schedules it again half a second later, so that kills land around durable cancels
//! and upserts too.
//!
//! A task whose id hashes to 0 mod 10 fails its first attempt, to exercise retries.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use corewheel_durable::{DurableTimers, Options, RetryPolicy};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A due time as the ledger compares it: milliseconds since the epoch, rounded up.
fn due_ms(due: SystemTime) -> u128 {
    due.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().div_ceil(1_000_000))
}

fn schedule_or_exit(timers: &DurableTimers, id: &str, due: SystemTime) {
    if let Err(e) = timers.schedule(id, b"p", due) {
        eprintln!("schedule: {e}");
        std::process::exit(1);
    }
}

fn line(text: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_fmt(text);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: durable-kill-child <dir> <load|drain> <incarnation>");
        std::process::exit(2);
    }
    let (dir, mode, incarnation) = (&args[1], &args[2], &args[3]);
    let options = Options::default()
        .bucket_width(Duration::from_millis(250))
        .load_ahead(Duration::from_millis(100))
        .retry(RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(20),
            multiplier: 2,
            max_backoff: Duration::from_millis(100),
        })
        .on_ack(|id| line(format_args!("A {}", String::from_utf8_lossy(id))));
    let timers = match DurableTimers::open(dir, options) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("open: {e}");
            std::process::exit(1);
        }
    };
    // Under load a handler takes a while, so that kills land inside handlers; the last,
    // unkilled life drains the backlog at full speed.
    let work = if mode == "load" { 3000 } else { 0 };
    timers
        .run_handler(2, move |task| {
            let id = String::from_utf8_lossy(task.id()).into_owned();
            let due = task
                .due()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            line(format_args!("F {id} {} {due} {}", task.attempt(), now_ms()));
            std::thread::sleep(Duration::from_micros(fastrand::u64(0..=work)));
            let fails = id.bytes().map(u32::from).sum::<u32>() % 10 == 0;
            if fails && task.attempt() == 1 {
                Err("first attempt of a failing task")
            } else {
                line(format_args!("H {id}"));
                Ok(())
            }
        })
        .expect("first run_handler");
    if mode != "load" {
        std::thread::sleep(Duration::from_secs(3600));
        return;
    }
    let (mut n, mut batches) = (0u64, 0u64);
    loop {
        let count = fastrand::usize(1..20);
        let batch: Vec<(String, SystemTime)> = (0..count)
            .map(|_| {
                n += 1;
                let due = SystemTime::now() + Duration::from_millis(fastrand::u64(0..400));
                (format!("{incarnation}-{n}"), due)
            })
            .collect();
        let result = timers.schedule_batch(batch.iter().map(|(id, due)| (id, b"p", *due)));
        if let Err(e) = result {
            eprintln!("schedule: {e}");
            std::process::exit(1);
        }
        for (id, due) in &batch {
            line(format_args!("S {id} {}", due_ms(*due)));
        }
        batches += 1;
        if batches % 5 == 0 {
            n += 1;
            let id = format!("{incarnation}-far{n}");
            let due = SystemTime::now() + Duration::from_millis(fastrand::u64(1000..3000));
            schedule_or_exit(&timers, &id, due);
            line(format_args!("S {id} {}", due_ms(due)));
            if fastrand::bool() {
                line(format_args!("c {id}"));
                if let Err(e) = timers.cancel(&id) {
                    eprintln!("cancel: {e}");
                    std::process::exit(1);
                }
                line(format_args!("C {id}"));
            } else {
                let later = due + Duration::from_millis(500);
                schedule_or_exit(&timers, &id, later);
                line(format_args!("S {id} {}", due_ms(later)));
            }
        }
        std::thread::sleep(Duration::from_micros(fastrand::u64(0..4000)));
    }
}
