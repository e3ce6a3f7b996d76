//! The Redis store under faults, against a real `redis-server` (AOF on, started per test
//! on a free loopback port): consumer processes killed with SIGKILL while holding
//! leases, and a network pause longer than a lease. No mock. Without `redis-server` every
//! test says so loudly and passes.
#![cfg(feature = "redis")]

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use corewheel_durable::{Error, RedisOptions, RedisTimers, RetryPolicy};

#[path = "common/redis_server.rs"]
mod redis_server;
use redis_server::Server;
#[path = "common/relay.rs"]
mod relay;
use relay::Relay;

const VISIBILITY: Duration = Duration::from_millis(600);

fn opts() -> RedisOptions {
    RedisOptions::default()
        .shards(12)
        .window(Duration::from_millis(100))
        .visibility(VISIBILITY)
}

/// A relay in front of `server`, for a network that can pause.
fn relay_to(server: &Server) -> Relay {
    let url = server.url();
    Relay::start(
        url.trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_string(),
    )
}

fn us(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_micros() as u64
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The child of [`a_consumer_process_killed_at_random_loses_nothing_and_overlaps_nothing`]:
/// a consumer whose handler appends `S <id> <attempt> <µs>` when it starts and
/// `E <id> <attempt> <µs>` when it ends to its ledger, each line fsynced before going
/// on, so the ledger outlives a SIGKILL. A no-op in a normal run.
#[test]
fn child_ledger_consumer() {
    let (Ok(url), Ok(path)) = (
        std::env::var("CWR_LEDGER_URL"),
        std::env::var("CWR_LEDGER_FILE"),
    ) else {
        return;
    };
    let ledger = Mutex::new(
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap(),
    );
    let note = move |kind: &str, task: &corewheel_durable::Task| {
        let mut file = ledger.lock().unwrap();
        let id = String::from_utf8_lossy(task.id());
        let line = format!("{kind} {id} {} {}\n", task.attempt(), us(SystemTime::now()));
        file.write_all(line.as_bytes()).unwrap();
        file.sync_data().unwrap();
    };
    let t = RedisTimers::open(&url, "ledger", opts()).unwrap();
    t.run_handler(2, move |task| {
        note("S", task);
        std::thread::sleep(Duration::from_millis(fastrand::u64(10..40)));
        note("E", task);
        Ok::<(), ()>(())
    })
    .unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(out, "\nREADY").unwrap();
    out.flush().unwrap();
    drop(out);
    std::thread::sleep(Duration::from_secs(60));
}

/// One delivery from a ledger: which child, attempt, start and end (µs; no end if the
/// child was killed in the handler).
#[derive(Debug, Clone)]
struct Delivery {
    child: usize,
    attempt: u32,
    start: u64,
    end: Option<u64>,
}

fn read_ledger(path: &std::path::Path, child: usize, into: &mut HashMap<String, Vec<Delivery>>) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let [kind, id, attempt, at] = f[..] else {
            panic!("torn ledger line {line:?}");
        };
        let (attempt, at) = (attempt.parse().unwrap(), at.parse().unwrap());
        let runs = into.entry(id.to_string()).or_default();
        if kind == "S" {
            runs.push(Delivery {
                child,
                attempt,
                start: at,
                end: None,
            });
        } else {
            let open = runs
                .iter_mut()
                .rev()
                .find(|d| d.child == child && d.end.is_none())
                .expect("an end without a start");
            open.end = Some(at);
        }
    }
}

fn spawn_child(url: &str, ledger: &std::path::Path) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_ledger_consumer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CWR_LEDGER_URL", url)
        .env("CWR_LEDGER_FILE", ledger)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while !lines
        .next()
        .expect("child output")
        .unwrap()
        .contains("READY")
    {}
    child
}

#[test]
fn a_consumer_process_killed_at_random_loses_nothing_and_overlaps_nothing() {
    let Some(server) = Server::start("killed_consumer_ledger") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ledgers: Vec<_> = (0..3)
        .map(|i| dir.path().join(format!("ledger{i}")))
        .collect();
    let mut children: Vec<Child> = ledgers
        .iter()
        .map(|l| spawn_child(&server.url(), l))
        .collect();
    let producer = RedisTimers::open(&server.url(), "ledger", opts()).unwrap();
    let start = SystemTime::now();
    let due: HashMap<String, SystemTime> = (0..300)
        .map(|i| {
            (
                format!("k{i}"),
                start + Duration::from_millis(200 + (i * 7) % 2000),
            )
        })
        .collect();
    producer
        .schedule_batch(due.iter().map(|(id, d)| (id.clone(), Vec::new(), *d)))
        .unwrap();
    // A random moment in the run, then the first instant a consumer is inside a handler
    // (its ledger has a start without an end): that one dies holding leases. (Which
    // consumer is not chosen beforehand: one may own no shard.)
    std::thread::sleep(Duration::from_millis(fastrand::u64(400..1400)));
    let give_up = Instant::now() + Duration::from_secs(10);
    let (victim, open_at_kill) = 'found: loop {
        assert!(
            Instant::now() < give_up,
            "no consumer was ever seen in a handler"
        );
        let first = fastrand::usize(..ledgers.len());
        for i in (0..ledgers.len()).map(|k| (first + k) % ledgers.len()) {
            let mut seen = HashMap::new();
            read_ledger(&ledgers[i], i, &mut seen);
            let open: Vec<String> = seen
                .iter()
                .filter(|(_, runs)| runs.iter().any(|d| d.end.is_none()))
                .map(|(id, _)| id.clone())
                .collect();
            if !open.is_empty() {
                break 'found (i, open);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    children[victim].kill().unwrap(); // SIGKILL
    children[victim].wait().unwrap();
    let killed_at = us(SystemTime::now());
    wait_until("every task acked", Duration::from_secs(30), || {
        producer.pending().unwrap() == 0
    });
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut runs: HashMap<String, Vec<Delivery>> = HashMap::new();
    for (i, path) in ledgers.iter().enumerate() {
        read_ledger(path, i, &mut runs);
    }
    // 0 lost, 0 early.
    assert_eq!(runs.len(), due.len(), "tasks never delivered");
    let vis = VISIBILITY.as_micros() as u64;
    let mut redelivered = 0;
    for (id, deliveries) in &runs {
        let due_us = us(due[id]).div_ceil(1000) * 1000;
        for d in deliveries {
            assert!(
                d.start >= due_us,
                "{id} started {} µs early",
                due_us - d.start
            );
            assert_eq!(d.attempt, 1, "{id}: no handler failed, so no retry");
        }
        let mut sorted = deliveries.clone();
        sorted.sort_by_key(|d| d.start);
        for pair in sorted.windows(2) {
            let (first, again) = (&pair[0], &pair[1]);
            redelivered += 1;
            // Only the killed child's claims may come back, and only once its lease
            // lapsed: renewed every third of the visibility while it lived, a lease was
            // valid for at least two thirds of it after the kill.
            assert_eq!(first.child, victim, "{id} redelivered from a live consumer");
            assert!(
                again.start >= killed_at + vis / 2,
                "{id} redelivered {} µs after the kill, inside a valid lease",
                again.start.saturating_sub(killed_at)
            );
            // Never two at once: the first ran until its end, or until the kill.
            let first_end = first.end.unwrap_or(killed_at);
            assert!(again.start >= first_end, "{id}: two deliveries overlapped");
        }
    }
    for id in &open_at_kill {
        assert!(
            runs[id].iter().any(|d| d.child != victim),
            "{id}, in the victim's handler at the kill, was not delivered again"
        );
    }
    eprintln!(
        "killed child {victim} holding {} running tasks; {redelivered} redeliveries",
        open_at_kill.len()
    );
}

#[test]
fn a_network_pause_longer_than_a_lease_hands_the_task_over_and_refuses_the_late_ack() {
    let Some(server) = Server::start("network_pause") else {
        return;
    };
    let relay = relay_to(&server);
    let paused = RedisTimers::open(&relay.url(), "pause", opts()).unwrap();
    let due = SystemTime::now();
    paused.schedule("job", b"p", due).unwrap();
    let claim = paused.claim_next().unwrap().expect("the due task");
    let lease_until = claim.lease_until();
    let log = Arc::new(Mutex::new(Vec::new()));
    let live = RedisTimers::open(&server.url(), "pause", opts()).unwrap();
    {
        let log = Arc::clone(&log);
        live.run_handler(1, move |task| {
            log.lock().unwrap().push((
                String::from_utf8_lossy(task.id()).into_owned(),
                SystemTime::now(),
            ));
            Ok::<(), ()>(())
        })
        .unwrap();
    }
    relay.freeze();
    let frozen_at = Instant::now();
    std::thread::scope(|s| {
        // The paused consumer finishes its work and acks while the network is down: the
        // request waits in the relay.
        let late_ack = s.spawn(|| paused.ack(&claim));
        wait_until("the task handed over", Duration::from_secs(10), || {
            !log.lock().unwrap().is_empty()
        });
        // Paused for more than two leases in all, then the network comes back.
        std::thread::sleep((VISIBILITY * 2).saturating_sub(frozen_at.elapsed()));
        relay.thaw();
        assert!(
            matches!(late_ack.join().unwrap(), Err(Error::LeaseLost)),
            "an ack after the lease lapsed was accepted"
        );
    });
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log.len(),
        1,
        "delivered {} times to the live consumer",
        log.len()
    );
    assert!(log[0].1 >= lease_until, "handed over inside the lease");
    assert!(log[0].1 >= due, "ran early");
    // The paused consumer recovers: its next calls answer promptly.
    let asked = Instant::now();
    wait_until("the live consumer's ack", Duration::from_secs(5), || {
        paused.pending().unwrap() == 0
    });
    paused.schedule("after", b"", SystemTime::now()).unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "the paused consumer hung"
    );
    wait_until(
        "a task scheduled after the pause",
        Duration::from_secs(5),
        || live.pending().unwrap() == 0,
    );
}

/// Once the one consumer behind `relay` has subscribed to its hints, makes every later
/// `SUBSCRIBE` through the relay go unanswered (the handshake before it still is) and
/// closes that subscriber's connection on the server.
fn drop_the_hints_subscriber_with_subscribes_stalled(server: &Server, relay: &Relay) {
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let pubsub = |what: &str| {
        let mut cmd = redis::cmd("CLIENT");
        cmd.arg(what).arg("TYPE").arg("pubsub");
        cmd
    };
    wait_until("the hints subscription", Duration::from_secs(5), || {
        let list: String = pubsub("LIST").query(&mut admin).unwrap();
        !list.trim().is_empty()
    });
    relay.stall_subscribes();
    let killed: u64 = pubsub("KILL").query(&mut admin).unwrap();
    assert_eq!(killed, 1, "the hints connection");
}

#[test]
fn close_returns_when_the_hints_subscription_stalls_after_connecting() {
    let Some(server) = Server::start("stalled_subscribe") else {
        return;
    };
    let relay = relay_to(&server);
    let t = RedisTimers::open(&relay.url(), "stall", opts()).unwrap();
    t.run_handler(1, |_| Ok::<(), ()>(())).unwrap();
    // The network fails right after the hints thread's next connect: its handshake is
    // answered, its SUBSCRIBE never is.
    drop_the_hints_subscriber_with_subscribes_stalled(&server, &relay);
    std::thread::sleep(Duration::from_millis(500));
    let (done, closed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        t.close().unwrap();
        let _ = done.send(());
    });
    assert!(
        closed.recv_timeout(Duration::from_secs(10)).is_ok(),
        "close hung on a subscription that never answered"
    );
}

#[test]
fn a_claim_whose_lease_lapsed_while_it_waited_for_a_handler_is_not_run() {
    let Some(server) = Server::start("stale_claim") else {
        return;
    };
    let relay = relay_to(&server);
    let options = opts().shards(1);
    // (consumer, id, started, ended)
    type Runs = Arc<Mutex<Vec<(u8, String, Instant, Option<Instant>)>>>;
    let runs: Runs = Arc::default();
    let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    let handler = |who: u8, runs: &Runs, gate: &Arc<(Mutex<bool>, std::sync::Condvar)>| {
        let (runs, gate) = (Arc::clone(runs), Arc::clone(gate));
        move |task: &corewheel_durable::Task| {
            let id = String::from_utf8_lossy(task.id()).into_owned();
            let i = {
                let mut runs = runs.lock().unwrap();
                runs.push((who, id.clone(), Instant::now(), None));
                runs.len() - 1
            };
            if who == 1 && id == "a" {
                let (open, cv) = &*gate;
                let mut open = open.lock().unwrap();
                while !*open {
                    open = cv.wait(open).unwrap();
                }
            } else if who == 2 {
                std::thread::sleep(Duration::from_millis(1500));
            }
            runs.lock().unwrap()[i].3 = Some(Instant::now());
            Ok::<(), ()>(())
        }
    };
    // Consumer 1, behind the relay, one handler thread: it claims both tasks in one
    // sweep, runs "a" (held at the gate), and "b" waits in its ready queue.
    let c1 = RedisTimers::open(&relay.url(), "stale", options.clone()).unwrap();
    c1.run_handler(1, handler(1, &runs, &gate)).unwrap();
    wait_until("consumer 1 owns the shard", Duration::from_secs(5), || {
        c1.owned_shards() == 1
    });
    let now = SystemTime::now();
    c1.schedule_batch([("a", b"", now), ("b", b"", now)])
        .unwrap();
    // One sweep claimed both (they were scheduled in one script, due at once).
    wait_until("a running, b waiting", Duration::from_secs(5), || {
        !runs.lock().unwrap().is_empty()
    });
    // The network fails for longer than a lease: consumer 1 can neither renew nor
    // heartbeat; consumer 2 takes the shard and, once the leases lapse, both tasks.
    relay.freeze();
    let c2 = RedisTimers::open(&server.url(), "stale", options).unwrap();
    c2.run_handler(2, handler(2, &runs, &gate)).unwrap();
    wait_until("consumer 2 runs b", Duration::from_secs(10), || {
        runs.lock().unwrap().iter().any(|r| r.0 == 2 && r.1 == "b")
    });
    relay.thaw();
    {
        let (open, cv) = &*gate;
        *open.lock().unwrap() = true;
        cv.notify_all();
    }
    std::thread::sleep(Duration::from_millis(1000));
    let runs = runs.lock().unwrap().clone();
    let b2 = runs.iter().find(|r| r.0 == 2 && r.1 == "b").unwrap();
    if let Some(r) = runs.iter().find(|r| r.0 == 1 && r.1 == "b") {
        panic!(
            "consumer 1 ran b on a lapsed claim, {:?} after consumer 2 started it (consumer 2 {})",
            r.2 - b2.2,
            if b2.3.is_none_or(|end| end > r.2) {
                "still running it under a valid lease"
            } else {
                "done"
            }
        );
    }
    drop(c1);
    drop(c2);
}

#[test]
fn close_while_redis_answers_nothing_returns_in_seconds_not_one_timeout_per_ack() {
    let Some(server) = Server::start("close_unanswered") else {
        return;
    };
    // A long window and lease, so that finished tasks wait for their acks (and are
    // renewed meanwhile) across many shards.
    let options = opts()
        .window(Duration::from_secs(2))
        .visibility(Duration::from_secs(9));
    let t = RedisTimers::open(&server.url(), "unanswered", options).unwrap();
    let done = Arc::new(Mutex::new(0));
    {
        let done = Arc::clone(&done);
        t.run_handler(4, move |_| {
            *done.lock().unwrap() += 1;
            Ok::<(), ()>(())
        })
        .unwrap();
    }
    t.schedule_batch((0..48).map(|i| (format!("t{i}"), b"".to_vec(), SystemTime::now())))
        .unwrap();
    wait_until("every task run", Duration::from_secs(10), || {
        *done.lock().unwrap() == 48
    });
    // Let the renewer start a round while the server is stopped.
    server.pause();
    std::thread::sleep(Duration::from_secs(3));
    let (closed_tx, closed) = std::sync::mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        t.close().unwrap();
        let _ = closed_tx.send(());
    });
    let result = closed.recv_timeout(Duration::from_secs(20));
    server.resume();
    assert!(
        result.is_ok(),
        "close took over 20 s with redis stopped ({:?} so far)",
        started.elapsed()
    );
}

#[test]
fn redis_killed_and_restarted_mid_run_still_delivers_every_task_never_early() {
    let Some(mut server) = Server::start("redis_restart_mid_run") else {
        return;
    };
    let log = Arc::new(Mutex::new(HashMap::<String, Vec<SystemTime>>::new()));
    let t = RedisTimers::open(&server.url(), "midrun", opts()).unwrap();
    {
        let log = Arc::clone(&log);
        t.run_handler(2, move |task| {
            log.lock()
                .unwrap()
                .entry(String::from_utf8_lossy(task.id()).into_owned())
                .or_default()
                .push(SystemTime::now());
            Ok::<(), ()>(())
        })
        .unwrap();
    }
    let start = SystemTime::now();
    let due: HashMap<String, SystemTime> = (0..60)
        .map(|i| (format!("m{i}"), start + Duration::from_millis(100 + i * 20)))
        .collect();
    t.schedule_batch(due.iter().map(|(id, d)| (id.clone(), Vec::new(), *d)))
        .unwrap();
    // Mid-run: some delivered, some claimed, most pending.
    std::thread::sleep(Duration::from_millis(400));
    server.crash_and_restart();
    wait_until("every task acked", Duration::from_secs(20), || {
        t.pending().is_ok_and(|n| n == 0)
    });
    let log = log.lock().unwrap();
    assert_eq!(log.len(), due.len(), "tasks lost in the restart");
    for (id, runs) in log.iter() {
        for ran in runs {
            assert!(*ran >= due[id], "{id} ran early");
        }
    }
}

/// The child of [`a_consumer_whose_wall_clock_is_ahead_or_steps_is_never_early_nor_late_by_the_step`]:
/// a consumer run under the clock shim, printing `RAN <id>` as each handler starts. A
/// no-op in a normal run.
#[test]
fn child_skewed_consumer() {
    let Ok(url) = std::env::var("CWR_SKEW_URL") else {
        return;
    };
    let t = RedisTimers::open(&url, "skew", opts()).unwrap();
    t.run_handler(2, |task| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "\nRAN {}", String::from_utf8_lossy(task.id())).unwrap();
        out.flush().unwrap();
        Ok::<(), ()>(())
    })
    .unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn a_consumer_whose_wall_clock_is_ahead_or_steps_is_never_early_nor_late_by_the_step() {
    let Some(server) = Server::start("skewed_consumer") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let shim = dir.path().join("skew_clock.so");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&shim)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/common/skew_clock.c"
        ))
        .arg("-ldl")
        .status();
    if !built.is_ok_and(|s| s.success()) {
        eprintln!("\n!!! skewed_consumer: no C compiler to build the clock shim, SKIPPED.\n");
        return;
    }
    let skew = dir.path().join("skew_ms");
    // The consumer's wall clock runs 2 s ahead of the server's (and this test's).
    std::fs::write(&skew, "2000").unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_skewed_consumer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CWR_SKEW_URL", server.url())
        .env("CWR_SKEW_FILE", &skew)
        .env("LD_PRELOAD", &shim)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, ran) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some((_, id)) = line.split_once("RAN ") {
                let _ = tx.send((id.trim().to_string(), SystemTime::now()));
            }
        }
    });
    let producer = RedisTimers::open(&server.url(), "skew", opts()).unwrap();
    wait_until("the consumer's membership", Duration::from_secs(10), || {
        producer.pending().is_ok() && {
            let mut conn = redis::Client::open(server.url())
                .unwrap()
                .get_connection()
                .unwrap();
            redis::cmd("ZCARD")
                .arg("{skew}:members")
                .query::<u64>(&mut conn)
                .unwrap()
                == 1
        }
    });
    let check = |round: &str| {
        let start = SystemTime::now();
        let due: HashMap<String, SystemTime> = (0..20)
            .map(|i| {
                (
                    format!("{round}{i}"),
                    start + Duration::from_millis(300 + i * 50),
                )
            })
            .collect();
        producer
            .schedule_batch(due.iter().map(|(id, d)| (id.clone(), Vec::new(), *d)))
            .unwrap();
        let mut worst = Duration::ZERO;
        for _ in 0..due.len() {
            let (id, at) = ran
                .recv_timeout(Duration::from_secs(15))
                .expect("a delivery");
            let due = due[&id];
            // Seen after the handler started: a start this much early would show.
            assert!(
                at >= due,
                "{id} ran {:?} early",
                due.duration_since(at).unwrap()
            );
            worst = worst.max(at.duration_since(due).unwrap());
        }
        assert!(
            worst < Duration::from_millis(800),
            "{round}: a task ran {worst:?} late"
        );
    };
    check("ahead");
    // Then its clock steps 5 s further ahead (an NTP step), while it runs.
    std::fs::write(&skew, "7000").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    check("stepped");
    let _ = child.kill();
    let _ = child.wait();
}

/// Claims with `competitor` (a hand-written consumer, as the README offers) until it
/// holds `want` or `give_up` passes, acking anything else; then, for as long as its own
/// lease is valid, watches `running` (the other consumer is inside its handler for
/// `want`). Returns how long both ran at once under the competitor's valid lease.
fn overlap_with_competitor(
    competitor: &RedisTimers,
    want: &[u8],
    running: &std::sync::atomic::AtomicBool,
    give_up: Instant,
) -> Option<Duration> {
    use std::sync::atomic::Ordering::SeqCst;
    let claim = loop {
        if Instant::now() > give_up {
            return None;
        }
        match competitor.claim_next().unwrap() {
            Some(c) if c.task().id() == want => break c,
            Some(c) => {
                let _ = competitor.ack(&c);
            }
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    };
    eprintln!(
        "competitor claimed {:?}, lease until {:?} from now",
        String::from_utf8_lossy(want),
        claim.lease_until().duration_since(SystemTime::now())
    );
    let mut both = Duration::ZERO;
    let mut last = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(2));
        let seen = running.load(SeqCst);
        // Read after the flag: a sample counts only if the lease was still valid when it
        // was taken, since the other consumer may rightly claim the task the moment the
        // lease runs out.
        if SystemTime::now() >= claim.lease_until() {
            break;
        }
        if seen {
            both += last.elapsed();
        }
        last = Instant::now();
    }
    let _ = competitor.ack(&claim);
    Some(both)
}

#[test]
fn close_keeps_renewing_a_running_handler_so_no_other_consumer_runs_it_at_once() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let Some(server) = Server::start("close_renewal") else {
        return;
    };
    // One consumer runs a handler for three leases; close() is called while it runs
    // ("waits for running handlers to finish and ack"). Its renewer must keep the lease
    // until then, or another consumer gets the task while it still runs.
    let running = Arc::new(AtomicBool::new(false));
    let c1 = RedisTimers::open(&server.url(), "closing", opts()).unwrap();
    {
        let running = Arc::clone(&running);
        c1.run_handler(1, move |_| {
            running.store(true, SeqCst);
            std::thread::sleep(VISIBILITY * 3);
            running.store(false, SeqCst);
            Ok::<(), ()>(())
        })
        .unwrap();
    }
    c1.schedule("long", b"", SystemTime::now()).unwrap();
    wait_until("the handler", Duration::from_secs(5), || {
        running.load(SeqCst)
    });
    let closer = std::thread::spawn(move || c1.close());
    let competitor = RedisTimers::open(&server.url(), "closing", opts()).unwrap();
    let both = overlap_with_competitor(
        &competitor,
        b"long",
        &running,
        Instant::now() + VISIBILITY * 3,
    );
    closer.join().unwrap().unwrap();
    if let Some(both) = both {
        assert!(
            both.is_zero(),
            "the closing consumer ran the task for {both:?} while another held a valid lease on it"
        );
    }
}

#[test]
fn a_claim_taken_from_the_ready_queue_late_in_its_lease_is_renewed_before_it_runs() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let Some(server) = Server::start("ready_margin") else {
        return;
    };
    // One handler thread claims a, b, c, d in one sweep (4 per thread), at their due
    // time. "a" runs until just under a lease after that; "b" then leaves the ready queue
    // with ~30 ms of its lease left, before the renew thread's next round (every third of
    // a lease from run_handler; the due time is half a round after it). Either c1 renews
    // b before running it, or b's lease lapses and c1 does not run it: never both at
    // once with another consumer.
    let vis = Duration::from_millis(1500);
    let options = opts().shards(1).visibility(vis);
    let b_running = Arc::new(AtomicBool::new(false));
    let b_ran = Arc::new(AtomicBool::new(false));
    let c1 = RedisTimers::open(&server.url(), "margin", options.clone()).unwrap();
    {
        let (b_running, b_ran) = (Arc::clone(&b_running), Arc::clone(&b_ran));
        c1.run_handler(1, move |task| {
            match task.id() {
                b"a" => {
                    let until = task.due() + vis - Duration::from_millis(30);
                    if let Ok(left) = until.duration_since(SystemTime::now()) {
                        std::thread::sleep(left);
                    }
                }
                b"b" => {
                    b_ran.store(true, SeqCst);
                    b_running.store(true, SeqCst);
                    std::thread::sleep(Duration::from_millis(1500));
                    b_running.store(false, SeqCst);
                }
                _ => {}
            }
            Ok::<(), ()>(())
        })
        .unwrap();
    }
    let due = SystemTime::now() + vis / 6;
    wait_until("c1 owns the shard", Duration::from_secs(5), || {
        c1.owned_shards() == 1
    });
    c1.schedule_batch(["a", "b", "c", "d"].map(|id| (id, b"", due)))
        .unwrap();
    std::thread::sleep(vis / 2);
    let competitor = RedisTimers::open(&server.url(), "margin", options).unwrap();
    match overlap_with_competitor(&competitor, b"b", &b_running, Instant::now() + vis * 3) {
        Some(both) => assert!(
            both.is_zero(),
            "c1 ran b for {both:?} while the competitor held a valid lease on it"
        ),
        None => assert!(b_ran.load(SeqCst), "b ran nowhere"),
    }
    drop(c1);
}

#[test]
fn one_process_never_runs_a_task_twice_at_once_when_it_left_the_ready_queue_late_in_its_lease() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let Some(server) = Server::start("self_overlap") else {
        return;
    };
    // The same with no second consumer and no fault: one process, two handler threads.
    // One sweep claims a1, a2, b, c at their due time. a1 ends just before the lease runs
    // out, so b starts with ~30 ms left; a2 ends just after, and its thread's sweep (the
    // shard is armed at that lease expiry) would claim b again if b's lease had lapsed:
    // b never runs twice at once.
    let vis = Duration::from_millis(1500);
    let options = opts().shards(1).visibility(vis);
    let b_runs = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let t = RedisTimers::open(&server.url(), "self", options).unwrap();
    {
        let (b_runs, most) = (Arc::clone(&b_runs), Arc::clone(&most));
        t.run_handler(2, move |task| {
            let sleep_until = |at: SystemTime| {
                if let Ok(left) = at.duration_since(SystemTime::now()) {
                    std::thread::sleep(left);
                }
            };
            match task.id() {
                b"a1" => sleep_until(task.due() + vis - Duration::from_millis(30)),
                b"a2" => sleep_until(task.due() + vis + Duration::from_millis(30)),
                b"b" => {
                    let now = b_runs.fetch_add(1, SeqCst) + 1;
                    most.fetch_max(now, SeqCst);
                    std::thread::sleep(Duration::from_millis(1000));
                    b_runs.fetch_sub(1, SeqCst);
                }
                _ => {}
            }
            Ok::<(), ()>(())
        })
        .unwrap();
    }
    // Half a renewal round after run_handler started the renewer.
    let due = SystemTime::now() + vis / 6;
    wait_until("owning the shard", Duration::from_secs(5), || {
        t.owned_shards() == 1
    });
    t.schedule_batch(["a1", "a2", "b", "c"].map(|id| (id, b"", due)))
        .unwrap();
    wait_until("every task acked", Duration::from_secs(10), || {
        t.pending().unwrap() == 0 && b_runs.load(SeqCst) == 0
    });
    assert_eq!(
        most.load(SeqCst),
        1,
        "b ran {} times at once in one process",
        most.load(SeqCst)
    );
}

#[test]
fn close_starts_no_handler_on_claims_still_waiting_for_a_thread() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let Some(server) = Server::start("close_ready") else {
        return;
    };
    // close: "Stops delivering and waits for running handlers to finish". One handler
    // thread, four claims in one sweep, close() while the first runs.
    let started: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let first_running = Arc::new(AtomicBool::new(false));
    let t = RedisTimers::open(&server.url(), "closeready", opts().shards(1)).unwrap();
    {
        let (started, first_running) = (Arc::clone(&started), Arc::clone(&first_running));
        t.run_handler(1, move |task| {
            started.lock().unwrap().push((
                String::from_utf8_lossy(task.id()).into_owned(),
                Instant::now(),
            ));
            first_running.store(true, SeqCst);
            std::thread::sleep(Duration::from_millis(150));
            Ok::<(), ()>(())
        })
        .unwrap();
    }
    wait_until("owning the shard", Duration::from_secs(5), || {
        t.owned_shards() == 1
    });
    t.schedule_batch(["a", "b", "c", "d"].map(|id| (id, b"", SystemTime::now())))
        .unwrap();
    wait_until("the first handler", Duration::from_secs(5), || {
        first_running.load(SeqCst)
    });
    let closing = Instant::now();
    t.close().unwrap();
    let after: Vec<String> = started
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.1 > closing)
        .map(|s| s.0.clone())
        .collect();
    assert!(
        after.is_empty(),
        "handlers started after close(): {after:?}"
    );
}

#[test]
fn a_sweep_reply_held_up_past_its_lease_is_not_run_beside_the_consumer_that_took_the_task_over() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let Some(server) = Server::start("reply_held") else {
        return;
    };
    // A one-way stall: c1's sweep reaches the server and claims the task, but the reply
    // (with the lease) comes back only after the lease ran out and a competitor claimed
    // the task. c1 must not start it while the competitor's lease is valid.
    let relay = relay_to(&server);
    // A window long enough that no periodic sweep or heartbeat waits on the stall before
    // the task's own sweep.
    let options = opts().shards(1).window(Duration::from_secs(1));
    let running = Arc::new(AtomicBool::new(false));
    let c1 = RedisTimers::open(&relay.url(), "held", options.clone()).unwrap();
    {
        let running = Arc::clone(&running);
        c1.run_handler(1, move |_| {
            running.store(true, SeqCst);
            std::thread::sleep(Duration::from_millis(200));
            running.store(false, SeqCst);
            Ok::<(), ()>(())
        })
        .unwrap();
    }
    wait_until("c1 owns the shard", Duration::from_secs(5), || {
        c1.owned_shards() == 1
    });
    let due = SystemTime::now() + Duration::from_millis(500);
    c1.schedule("t", b"", due).unwrap();
    std::thread::sleep(
        due.duration_since(SystemTime::now()).unwrap_or_default() - Duration::from_millis(30),
    );
    relay.freeze_replies();
    let frozen_at = Instant::now();
    let competitor = RedisTimers::open(&server.url(), "held", options).unwrap();
    let both = std::thread::scope(|s| {
        let watch = s.spawn(|| {
            // Only once c1's sweep has claimed the task at its due time.
            std::thread::sleep(Duration::from_millis(250));
            overlap_with_competitor(&competitor, b"t", &running, Instant::now() + VISIBILITY * 4)
        });
        std::thread::sleep(
            (Duration::from_millis(30) + VISIBILITY + Duration::from_millis(150))
                .saturating_sub(frozen_at.elapsed()),
        );
        relay.thaw();
        watch.join().unwrap()
    });
    let both = both.expect("the competitor never claimed the task");
    assert!(
        both.is_zero(),
        "c1 ran the task for {both:?} while the competitor held a valid lease on it"
    );
    drop(c1);
}

/// `schedule` is called once; its task is claimed and acked; it must not come back. Here
/// the pooled connection the schedule went out on closes after the server ran it and
/// before the reply arrived: a schedule must not be sent again on a new connection, or
/// the task, already acked, would be back in the queue and delivered a second time.
#[test]
fn a_schedule_whose_reply_is_lost_is_not_resent_after_its_task_was_acked() {
    let Some(server) = Server::start("resent_schedule") else {
        return;
    };
    let relay = relay_to(&server);
    let producer = Arc::new(RedisTimers::open(&relay.url(), "resend", opts().shards(1)).unwrap());
    // Warm: the SCHEDULE script loaded and a connection pooled.
    producer
        .schedule("warm", b"", SystemTime::now() + Duration::from_secs(3600))
        .unwrap();
    producer.cancel("warm").unwrap();
    let consumer = RedisTimers::open(&server.url(), "resend", opts().shards(1)).unwrap();

    relay.freeze_replies();
    // A reply already being read goes through first.
    std::thread::sleep(Duration::from_millis(20));
    let p = Arc::clone(&producer);
    let scheduling = std::thread::spawn(move || {
        p.schedule("once", b"v1", SystemTime::now() - Duration::from_secs(1))
    });
    // The server has run the schedule (its reply is held): claim it and ack it.
    let mut claim = None;
    wait_until("the scheduled task", Duration::from_secs(5), || {
        claim = consumer.claim_next().unwrap();
        claim.is_some()
    });
    let claim = claim.unwrap();
    consumer.ack(&claim).unwrap();
    assert_eq!(consumer.pending().unwrap(), 0);
    // The producer's connection dies before it hears back.
    relay.cut();
    let result = scheduling.join().unwrap();
    eprintln!("schedule returned {result:?}");
    assert_eq!(
        consumer.pending().unwrap(),
        0,
        "a task scheduled once and acked is back in the queue (schedule sent twice)"
    );
    assert!(
        consumer.claim_next().unwrap().is_none(),
        "a task scheduled once and acked is delivered a second time"
    );
}

/// A requeue whose reply is lost with its connection took effect: it must not be run
/// again on a new connection, where no dead letter is left, and report `NotDead`.
#[test]
fn a_requeue_whose_reply_is_lost_is_not_run_again_and_reported_not_dead() {
    let Some(server) = Server::start("resent_requeue") else {
        return;
    };
    let relay = relay_to(&server);
    let o = opts().shards(1).retry(RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    });
    let t = Arc::new(RedisTimers::open(&relay.url(), "requeue", o).unwrap());
    t.schedule("d", b"", SystemTime::now() - Duration::from_secs(1))
        .unwrap();
    let claim = t.claim_next().unwrap().unwrap();
    t.fail(&claim).unwrap();
    assert_eq!(t.dead_letters().unwrap().len(), 1);
    // Loads the REQUEUE script.
    assert!(matches!(t.requeue("none"), Err(Error::NotDead)));

    relay.freeze_replies();
    std::thread::sleep(Duration::from_millis(20));
    let t2 = Arc::clone(&t);
    let requeueing = std::thread::spawn(move || t2.requeue("d"));
    let direct = RedisTimers::open(&server.url(), "requeue", opts().shards(1)).unwrap();
    wait_until("the requeue applied", Duration::from_secs(5), || {
        direct.dead_letters().unwrap().is_empty()
    });
    relay.cut();
    let result = requeueing.join().unwrap();
    assert_eq!(direct.pending().unwrap(), 1, "the requeue took effect");
    assert!(
        !matches!(result, Err(Error::NotDead)),
        "a requeue that took effect returned {result:?}"
    );
}

/// A claim taken from the ready queue with under half its lease left is renewed before
/// it runs. Here the renewal's reply is held up past the lease it granted: by then the
/// lease has lapsed and another consumer holds the task under a valid lease, yet the
/// handler runs it on the strength of the late `Ok`.
#[test]
fn a_renewal_before_running_whose_reply_comes_back_after_its_lease_does_not_run_the_task() {
    let Some(server) = Server::start("late_renew_reply") else {
        return;
    };
    let relay = Arc::new(relay_to(&server));
    let frozen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let victim_ran: Arc<Mutex<Option<SystemTime>>> = Arc::default();
    let a = RedisTimers::open(&relay.url(), "lateren", opts().shards(1)).unwrap();
    {
        let (relay, frozen, victim_ran) = (
            Arc::clone(&relay),
            Arc::clone(&frozen),
            Arc::clone(&victim_ran),
        );
        a.run_handler(1, move |task| {
            match task.id() {
                b"block" => {
                    // Claimed with "victim" in one sweep just now; return when victim
                    // has ~220 ms of its 600 ms lease left, with replies held.
                    std::thread::sleep(Duration::from_millis(360));
                    relay.freeze_replies();
                    frozen.store(true, std::sync::atomic::Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                }
                b"victim" => {
                    victim_ran.lock().unwrap().get_or_insert(SystemTime::now());
                }
                _ => {}
            }
            Ok::<(), ()>(())
        })
        .unwrap();
    }
    wait_until("a owns the shard", Duration::from_secs(5), || {
        a.owned_shards() == 1
    });
    let now = SystemTime::now();
    a.schedule_batch([
        ("block", b"", now - Duration::from_secs(2)),
        ("victim", b"", now - Duration::from_secs(1)),
    ])
    .unwrap();
    wait_until("replies frozen", Duration::from_secs(5), || {
        frozen.load(std::sync::atomic::Ordering::SeqCst)
    });
    // Another consumer, straight to the server, takes victim once its lease lapses.
    let b = RedisTimers::open(&server.url(), "lateren", opts().shards(1)).unwrap();
    let mut held = Vec::new();
    let until = Instant::now() + Duration::from_secs(3);
    let b_claim = loop {
        assert!(Instant::now() < until, "victim's lease never lapsed");
        if let Some(c) = b.claim_next().unwrap() {
            if c.task().id() == b"victim" {
                break c;
            }
            held.push(c);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let b_claimed = SystemTime::now();
    relay.thaw();
    std::thread::sleep(Duration::from_millis(300));
    let ran = *victim_ran.lock().unwrap();
    eprintln!(
        "DEBUG ran {:?} b_claimed {:?} b_until {:?}",
        ran,
        b_claimed,
        b_claim.lease_until()
    );
    drop(a);
    if let Some(ran) = ran {
        assert!(
            !(ran >= b_claimed && ran < b_claim.lease_until()),
            "a ran victim {:?} after b claimed it, {:?} before b's lease ran out",
            ran.duration_since(b_claimed).unwrap(),
            b_claim.lease_until().duration_since(ran).unwrap()
        );
    }
}

#[test]
fn a_task_hinted_while_its_owner_could_not_subscribe_fires_when_it_can_not_a_window_later() {
    let Some(server) = Server::start("hint_while_away") else {
        return;
    };
    // A window of 10 s: only the sweep made on subscribing, not the window's, can fire
    // the task within a few seconds of its due time.
    let options = opts().shards(1).window(Duration::from_secs(10));
    let relay = relay_to(&server);
    let consumer = RedisTimers::open(&relay.url(), "away", options.clone()).unwrap();
    let fired = Arc::new(Mutex::new(Vec::new()));
    {
        let fired = Arc::clone(&fired);
        consumer
            .run_handler(1, move |task| {
                fired
                    .lock()
                    .unwrap()
                    .push((task.id().to_vec(), SystemTime::now()));
                Ok::<(), ()>(())
            })
            .unwrap();
    }
    // Its subscriber drops, and every new one's SUBSCRIBE goes unanswered for a while.
    drop_the_hints_subscriber_with_subscribes_stalled(&server, &relay);
    std::thread::sleep(Duration::from_millis(300));
    let producer = RedisTimers::open(&server.url(), "away", options).unwrap();
    let due = SystemTime::now() + Duration::from_millis(800);
    producer.schedule("x", b"", due).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    relay.resume_subscribes();
    wait_until("x", Duration::from_secs(15), || {
        !fired.lock().unwrap().is_empty()
    });
    let (id, at) = fired.lock().unwrap()[0].clone();
    assert_eq!(id, b"x");
    assert!(at >= due, "fired early");
    let late = at.duration_since(due).unwrap();
    assert!(
        late < Duration::from_secs(3),
        "fired {late:?} late: the hint sent while no one listened waited for the window"
    );
}

fn sleep_until(t: Instant) {
    std::thread::sleep(t.saturating_duration_since(Instant::now()));
}

/// One reply held up by the network (requests still arrive: a one-way stall, or an AOF
/// fsync stall that holds the reply after the script read `TIME`) must not skew the
/// offset the process maps server time to local instants with: the shard's next instant
/// is armed from it, and a task due well after the network recovered would fire late by
/// half the stall were the offset taken from the round trip's middle. (An idle pooled
/// connection gets a `PING` first, which would absorb the stall instead; a busy process's
/// connections do not, so the test keeps one busy until just before.)
#[test]
fn a_task_due_after_a_held_reply_is_not_late_by_half_the_hold() {
    let Some(server) = Server::start("held_reply_skews_arming") else {
        return;
    };
    let relay = relay_to(&server);
    let options = RedisOptions::default()
        .shards(1)
        // Long, so that no periodic sweep falls in the stall: only the claiming one.
        .window(Duration::from_secs(10))
        .visibility(Duration::from_secs(10));
    let consumer = RedisTimers::open(&relay.url(), "skew", options.clone()).unwrap();
    let log: Arc<Mutex<Vec<(String, SystemTime, SystemTime)>>> = Arc::default();
    {
        let log = Arc::clone(&log);
        consumer
            .run_handler(1, move |task| {
                log.lock().unwrap().push((
                    String::from_utf8_lossy(task.id()).into_owned(),
                    task.due(),
                    SystemTime::now(),
                ));
                Ok::<(), ()>(())
            })
            .unwrap();
    }
    wait_until(
        "the consumer owns the shard",
        Duration::from_secs(5),
        || consumer.owned_shards() == 1,
    );
    std::thread::sleep(Duration::from_millis(100));
    let producer = RedisTimers::open(&server.url(), "skew", options).unwrap();
    let (t0, w0) = (Instant::now(), SystemTime::now());
    producer
        .schedule("a", b"", w0 + Duration::from_millis(1000))
        .unwrap();
    producer
        .schedule("b", b"", w0 + Duration::from_millis(3400))
        .unwrap();
    // A busy process: its pooled connections are in use, so a sweep goes out without
    // the PING an idle one gets (here the test keeps one busy until just before `a`).
    while t0.elapsed() < Duration::from_millis(975) {
        consumer.pending().unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    // The sweep that claims `a` at its due time reaches the server; its reply (which
    // also says `b` is next) waits 1.8 s.
    sleep_until(t0 + Duration::from_millis(985));
    relay.freeze_replies();
    sleep_until(t0 + Duration::from_millis(2800));
    relay.thaw();
    // The network is fine for the 600 ms before `b` is due.
    wait_until("b delivered", Duration::from_secs(6), || {
        log.lock().unwrap().iter().any(|(id, _, _)| id == "b")
    });
    let log = log.lock().unwrap().clone();
    for (id, due, ran) in &log {
        eprintln!(
            "{id}: ran {:?} after due, {:?} after t0",
            ran.duration_since(*due),
            ran.duration_since(w0)
        );
    }
    let (_, due, ran) = log.iter().find(|(id, _, _)| id == "b").unwrap();
    let late = ran.duration_since(*due).unwrap_or_default();
    assert!(
        late < Duration::from_millis(400),
        "b, due 600 ms after the network recovered, ran {late:?} late"
    );
}

/// A store on `url` (queue `queue`, one shard, a 300 ms lease) whose one handler thread
/// runs "long" for `hang` the first time and any other task at once; returned once
/// "long", scheduled overdue, runs. The flag says whether it still runs.
fn hang_in_long(
    url: &str,
    server: &Server,
    queue: &str,
    window: Duration,
    hang: Duration,
) -> (RedisTimers, Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let running = Arc::new(AtomicBool::new(false));
    let options = RedisOptions::default()
        .shards(1)
        .window(window)
        .visibility(Duration::from_millis(300));
    let t = RedisTimers::open(url, queue, options).unwrap();
    let first = AtomicBool::new(true);
    let flag = Arc::clone(&running);
    // Its ack refused, the lease having run out, "long" runs again: at once.
    t.run_handler(1, move |task| {
        if task.id() == b"long" && first.swap(false, SeqCst) {
            flag.store(true, SeqCst);
            std::thread::sleep(hang);
            flag.store(false, SeqCst);
        }
        Ok::<(), ()>(())
    })
    .unwrap();
    wait_until("membership", Duration::from_secs(5), || {
        server.live_members(queue) == 1
    });
    t.schedule("long", b"", SystemTime::now() - Duration::from_secs(1))
        .unwrap();
    wait_until("the handler", Duration::from_secs(5), || {
        running.load(SeqCst)
    });
    (t, running)
}

/// [`hang_in_long`] through a relay, returned once a network pause of 800 ms, longer than
/// the lease and shorter than a heartbeat (three `window`s), has let the lease of "long"
/// run out under it (the renewal after the pause is refused).
fn long_run_whose_lease_ran_out(
    server: &Server,
    queue: &str,
    window: Duration,
    hang: Duration,
) -> (RedisTimers, Relay, Arc<std::sync::atomic::AtomicBool>) {
    let relay = relay_to(server);
    let (t, running) = hang_in_long(&relay.url(), server, queue, window, hang);
    relay.freeze();
    std::thread::sleep(Duration::from_millis(800));
    relay.thaw();
    (t, relay, running)
}

/// The only handler thread runs a task whose lease ran out under it. The process is busy
/// with that task, not stuck with work waiting, so it stays a member (before, the run-out
/// lease counted as work waiting for a thread, and the process gave up its membership
/// and shards two windows later).
#[test]
fn a_lease_that_ran_out_under_its_running_handler_is_not_work_waiting() {
    let Some(server) = Server::start("lease_ran_out_under_handler") else {
        return;
    };
    let (t, _relay, running) = long_run_whose_lease_ran_out(
        &server,
        "ranout",
        Duration::from_secs(1),
        Duration::from_secs(7),
    );
    let mut lapsed = 0;
    while running.load(std::sync::atomic::Ordering::SeqCst) {
        if server.live_members("ranout") == 0 {
            lapsed += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(lapsed, 0, "the busy process's membership lapsed");
    t.close().unwrap();
}

/// The other side: the only handler thread hangs on a task whose lease ran out under it,
/// and another task of the same shard comes due. That one is work waiting for a thread,
/// so the process stops renewing its membership and the shard goes to others.
#[test]
fn a_hung_handler_whose_lease_ran_out_still_gives_up_its_shard_when_other_work_waits() {
    let Some(server) = Server::start("hung_lease_ran_out") else {
        return;
    };
    let (t, _relay, running) = long_run_whose_lease_ran_out(
        &server,
        "hidework",
        Duration::from_millis(500),
        Duration::from_secs(9),
    );
    t.schedule("waiting", b"", SystemTime::now()).unwrap();
    let thawed = Instant::now();
    let mut lapsed = false;
    while running.load(std::sync::atomic::Ordering::SeqCst) && !lapsed {
        lapsed = server.live_members("hidework") == 0;
        std::thread::sleep(Duration::from_millis(20));
    }
    let hung_for = thawed.elapsed();
    t.close().unwrap();
    assert!(
        lapsed,
        "with a task waiting behind a hung handler, the process kept its membership for all \
         {hung_for:?} of the hang"
    );
}

/// A claim kept here after its renewal was refused (its task cancelled while it ran) is
/// no longer this process's in Redis: it does not hide another consumer's lease that ran
/// out (that consumer died holding it). That task waits for a thread here, so the
/// process, hung in its only handler, gives up its shard.
#[test]
fn a_hung_handler_whose_task_was_cancelled_does_not_hide_a_dead_consumers_run_out_lease() {
    use std::sync::atomic::Ordering::SeqCst;
    let Some(server) = Server::start("cancelled_hides_run_out") else {
        return;
    };
    let queue = "hidecancel";
    let (t, running) = hang_in_long(
        &server.url(),
        &server,
        queue,
        Duration::from_millis(500),
        Duration::from_secs(9),
    );
    t.cancel("long").unwrap();
    let options = RedisOptions::default()
        .shards(1)
        .visibility(Duration::from_millis(300));
    let other = RedisTimers::open(&server.url(), queue, options).unwrap();
    other
        .schedule("orphan", b"", SystemTime::now() - Duration::from_secs(1))
        .unwrap();
    let claim = other.claim_next().unwrap().expect("orphan claimed");
    assert_eq!(claim.task().id(), b"orphan");
    // The consumer dies holding it: no ack, no renewal.
    std::mem::forget(claim);
    let start = Instant::now();
    let mut lapsed = false;
    while running.load(SeqCst) && !lapsed {
        lapsed = server.live_members(queue) == 0;
        std::thread::sleep(Duration::from_millis(20));
    }
    let hung_for = start.elapsed();
    t.close().unwrap();
    assert!(
        lapsed,
        "with orphan's lease run out behind a hung handler, the process kept its membership \
         for all {hung_for:?} of the hang"
    );
}
