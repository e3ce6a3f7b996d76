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
//! - `D <id>`: at open, `id` is a dead letter;
//! - `r <id>`: a requeue of `id` is about to be called; `R <id>`: it returned, so it is
//!   durable.
//!
//! Every fifth batch also schedules a task a second or more out and at once cancels it,
//! or schedules it again half a second later, so that kills land around durable cancels
//! and upserts too. Every seventh schedules a task (`<life>-dead<n>-<due ms>`) that fails
//! every attempt but a first one due after that time (only a requeue makes one), and so
//! becomes a dead letter; each batch requeues the dead letters (the last life, with no
//! batches, every 100 ms), so that kills land around requeues.
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

/// The first due time a `-dead` task's id carries, if it is one.
fn dead_task_due(id: &str) -> Option<u64> {
    let (_, rest) = id.split_once("-dead")?;
    rest.split_once('-')?.1.parse().ok()
}

/// Requeues every dead letter.
fn requeue_dead(timers: &DurableTimers) {
    for letter in timers.dead_letters() {
        let id = String::from_utf8_lossy(letter.id()).into_owned();
        line(format_args!("r {id}"));
        match timers.requeue(&id) {
            Ok(()) => line(format_args!("R {id}")),
            Err(corewheel_durable::Error::NotDead) => {}
            Err(e) => {
                eprintln!("requeue: {e}");
                std::process::exit(1);
            }
        }
    }
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
    for letter in timers.dead_letters() {
        line(format_args!("D {}", String::from_utf8_lossy(letter.id())));
    }
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
            let first_due = dead_task_due(&id);
            if first_due.is_some_and(|first| task.attempt() > 1 || due as u64 <= first) {
                Err("a task that fails until it is requeued")
            } else if fails && task.attempt() == 1 && first_due.is_none() {
                Err("first attempt of a failing task")
            } else {
                line(format_args!("H {id}"));
                Ok(())
            }
        })
        .expect("first run_handler");
    if mode != "load" {
        loop {
            requeue_dead(&timers);
            std::thread::sleep(Duration::from_millis(100));
        }
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
        if batches % 7 == 0 {
            n += 1;
            let due = SystemTime::now() + Duration::from_millis(fastrand::u64(0..100));
            let id = format!("{incarnation}-dead{n}-{}", due_ms(due));
            schedule_or_exit(&timers, &id, due);
            line(format_args!("S {id} {}", due_ms(due)));
        }
        requeue_dead(&timers);
        std::thread::sleep(Duration::from_micros(fastrand::u64(0..4000)));
    }
}
