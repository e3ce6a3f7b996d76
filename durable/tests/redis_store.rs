//! The Redis store against a real `redis-server`: started per test on a free loopback
//! port, with an append-only file written before each reply, in a temp dir, and killed
//! at the end. No mock. Without `redis-server` every test says so loudly and passes.
#![cfg(feature = "redis")]

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use corewheel_durable::{Error, Failed, RedisOptions, RedisTimers, RetryPolicy};

#[path = "common/redis_server.rs"]
mod redis_server;
use redis_server::Server;

/// Deliveries by id: (wall time the handler ran, due time, attempt).
type Log = Arc<Mutex<HashMap<String, Vec<(SystemTime, SystemTime, u32)>>>>;

fn recording(
    log: &Log,
) -> impl Fn(&corewheel_durable::Task) -> Result<(), String> + Send + Sync + 'static {
    let log = Arc::clone(log);
    move |task| {
        let now = SystemTime::now();
        log.lock()
            .unwrap()
            .entry(String::from_utf8_lossy(task.id()).into_owned())
            .or_default()
            .push((now, task.due(), task.attempt()));
        Ok(())
    }
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `t` rounded up to the millisecond, as due times are stored.
fn ms(t: SystemTime) -> SystemTime {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap();
    std::time::UNIX_EPOCH + Duration::from_millis(d.as_nanos().div_ceil(1_000_000) as u64)
}

fn opts() -> RedisOptions {
    RedisOptions::default()
        .shards(4)
        .window(Duration::from_millis(100))
        .visibility(Duration::from_millis(600))
}

#[test]
fn racing_consumers_claim_each_task_exactly_once_and_never_early() {
    let Some(server) = Server::start("racing_consumers") else {
        return;
    };
    let log: Log = Arc::default();
    // Four instances of the service (threads standing for processes), each with its own
    // wheel, connections and two handler threads, all arming every task.
    let consumers: Vec<RedisTimers> = (0..4)
        .map(|_| {
            let t = RedisTimers::open(&server.url(), "race", opts()).unwrap();
            t.run_handler(2, recording(&log)).unwrap();
            t
        })
        .collect();
    let producer = RedisTimers::open(&server.url(), "race", opts()).unwrap();
    let start = SystemTime::now();
    let tasks: Vec<(String, Vec<u8>, SystemTime)> = (0..400)
        .map(|i| {
            (
                format!("t{i}"),
                vec![],
                start + Duration::from_millis(250 + (i % 40) * 10),
            )
        })
        .collect();
    producer.schedule_batch(tasks.clone()).unwrap();
    wait_until("every task acked", Duration::from_secs(20), || {
        producer.pending().unwrap() == 0
    });
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 400);
    let mut worst = Duration::ZERO;
    for (id, _, due) in &tasks {
        let runs = &log[id];
        assert_eq!(runs.len(), 1, "{id} ran {} times", runs.len());
        let (ran, seen_due, attempt) = runs[0];
        assert_eq!(seen_due, ms(*due));
        assert_eq!(attempt, 1);
        assert!(ran >= *due, "{id} ran {:?} early", due.duration_since(ran));
        worst = worst.max(ran.duration_since(*due).unwrap());
    }
    eprintln!("racing consumers: worst lateness {worst:?}");
    drop(consumers);
}

#[test]
fn a_dead_consumers_lease_runs_out_and_the_task_is_delivered_again() {
    let Some(server) = Server::start("dead_consumer") else {
        return;
    };
    let dead = RedisTimers::open(&server.url(), "lapse", opts()).unwrap();
    dead.schedule("job", b"p", a_second_ago()).unwrap();
    // The consumer claims and then "dies": it never acks, fails or renews.
    let claim = dead.claim_next().unwrap().expect("the due task");
    assert_eq!(claim.task().attempt(), 1);
    let lease_until = claim.lease_until();
    let log: Log = Arc::default();
    let live = RedisTimers::open(&server.url(), "lapse", opts()).unwrap();
    live.run_handler(1, recording(&log)).unwrap();
    wait_until("redelivery", Duration::from_secs(10), || {
        log.lock().unwrap().contains_key("job")
    });
    let runs = log.lock().unwrap()["job"].clone();
    assert_eq!(runs.len(), 1);
    assert!(
        runs[0].0 >= lease_until,
        "redelivered before the lease ran out"
    );
    // A redelivery after a crash repeats the attempt number.
    assert_eq!(runs[0].2, 1);
    wait_until("ack", Duration::from_secs(5), || {
        live.pending().unwrap() == 0
    });
    // The dead consumer's late ack is refused.
    assert!(matches!(dead.ack(&claim), Err(Error::LeaseLost)));
}

#[test]
fn an_ack_after_the_lease_lapsed_is_refused_and_the_task_stays() {
    let Some(server) = Server::start("ack_after_lapse") else {
        return;
    };
    let t = RedisTimers::open(&server.url(), "late-ack", opts()).unwrap();
    t.schedule("job", b"p", a_second_ago()).unwrap();
    let mut first = t.claim_next().unwrap().unwrap();
    // Nothing else is due while it is held.
    assert!(t.claim_next().unwrap().is_none());
    t.renew(&mut first).unwrap();
    std::thread::sleep(Duration::from_millis(700));
    assert!(matches!(t.renew(&mut first), Err(Error::LeaseLost)));
    assert!(matches!(t.ack(&first), Err(Error::LeaseLost)));
    assert!(matches!(t.fail(&first), Err(Error::LeaseLost)));
    assert_eq!(t.pending().unwrap(), 1);
    let second = t.claim_next().unwrap().expect("the lapsed task again");
    assert_eq!(second.task().id(), b"job");
    // The first claim cannot ack over the second's lease either.
    assert!(matches!(t.ack(&first), Err(Error::LeaseLost)));
    t.ack(&second).unwrap();
    assert_eq!(t.pending().unwrap(), 0);
}

#[test]
fn renewal_keeps_a_slow_handler_from_being_raced() {
    let Some(server) = Server::start("renewal") else {
        return;
    };
    // The handler runs for three leases. A renewal every 200 ms leaves 400 ms of slack
    // for a renewal that a loaded machine holds back.
    let runs = Arc::new(Mutex::new(0));
    let consumers: Vec<RedisTimers> = (0..2)
        .map(|_| {
            let t = RedisTimers::open(
                &server.url(),
                "slow",
                opts().visibility(Duration::from_millis(600)),
            )
            .unwrap();
            let runs = Arc::clone(&runs);
            t.run_handler(1, move |_| {
                *runs.lock().unwrap() += 1;
                std::thread::sleep(Duration::from_millis(1800));
                Ok::<(), ()>(())
            })
            .unwrap();
            t
        })
        .collect();
    consumers[0].schedule("slow", b"", a_second_ago()).unwrap();
    wait_until("ack", Duration::from_secs(10), || {
        consumers[0].pending().unwrap() == 0
    });
    assert_eq!(*runs.lock().unwrap(), 1);
}

#[test]
fn a_handler_running_for_many_windows_keeps_its_process_a_member() {
    let Some(server) = Server::start("long_handler") else {
        return;
    };
    // The only handler thread runs one task for ten windows and three leases, while
    // nothing else is due: the process is busy, not stuck, and its own renewed lease is
    // not work waiting. It stays a member the whole time. (A heartbeat lives three
    // windows, 600 ms: slack for a loaded machine.)
    let running = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let t = RedisTimers::open(
        &server.url(),
        "long",
        opts()
            .window(Duration::from_millis(200))
            .visibility(Duration::from_millis(600)),
    )
    .unwrap();
    {
        let running = Arc::clone(&running);
        t.run_handler(1, move |_| {
            running.store(true, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(2000));
            running.store(false, std::sync::atomic::Ordering::SeqCst);
            Ok::<(), ()>(())
        })
        .unwrap();
    }
    wait_until("membership", Duration::from_secs(5), || {
        server.live_members("long") == 1
    });
    t.schedule("long", b"", a_second_ago()).unwrap();
    wait_until("the handler", Duration::from_secs(5), || {
        running.load(std::sync::atomic::Ordering::SeqCst)
    });
    let mut lapsed = 0;
    while running.load(std::sync::atomic::Ordering::SeqCst) {
        if server.live_members("long") == 0 {
            lapsed += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(lapsed, 0, "the busy process's membership lapsed");
    wait_until("ack", Duration::from_secs(5), || t.pending().unwrap() == 0);
}

#[test]
fn failures_back_off_then_dead_letter_and_requeue() {
    let Some(server) = Server::start("retries") else {
        return;
    };
    let policy = RetryPolicy {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(100),
        multiplier: 2,
        max_backoff: Duration::from_secs(1),
    };
    let t = RedisTimers::open(&server.url(), "retry", opts().retry(policy)).unwrap();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let healed = Arc::new(Mutex::new(false));
    {
        let (attempts, healed) = (Arc::clone(&attempts), Arc::clone(&healed));
        t.run_handler(1, move |task| {
            attempts
                .lock()
                .unwrap()
                .push((Instant::now(), task.attempt()));
            if *healed.lock().unwrap() {
                Ok(())
            } else {
                Err("downstream down")
            }
        })
        .unwrap();
    }
    t.schedule("flaky", b"payload", SystemTime::now()).unwrap();
    wait_until("dead letter", Duration::from_secs(10), || {
        !t.dead_letters().unwrap().is_empty()
    });
    let dead = t.dead_letters().unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id(), b"flaky");
    assert_eq!(dead[0].payload(), b"payload");
    assert_eq!(dead[0].attempt(), 3);
    assert_eq!(t.pending().unwrap(), 0);
    let seen = attempts.lock().unwrap().clone();
    assert_eq!(seen.iter().map(|s| s.1).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert!(seen[1].0 - seen[0].0 >= Duration::from_millis(100));
    assert!(seen[2].0 - seen[1].0 >= Duration::from_millis(200));
    assert!(matches!(t.requeue("nope"), Err(Error::NotDead)));
    *healed.lock().unwrap() = true;
    t.requeue("flaky").unwrap();
    assert!(t.dead_letters().unwrap().is_empty());
    wait_until("requeued ack", Duration::from_secs(5), || {
        t.pending().unwrap() == 0 && attempts.lock().unwrap().len() == 4
    });
    assert_eq!(attempts.lock().unwrap()[3].1, 1);
}

#[test]
fn an_id_that_dies_twice_keeps_both_dead_letters_and_requeue_takes_the_newest_first() {
    let Some(server) = Server::start("dies_twice") else {
        return;
    };
    let policy = RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    };
    let t = RedisTimers::open(&server.url(), "twice", opts().retry(policy)).unwrap();
    // Bytes MessagePack must carry as they are: NUL, invalid UTF-8, a quote.
    let id: &[u8] = b"order\0\xff\"7";
    let first: &[u8] = b"first\0\xfe";
    let second: &[u8] = b"second\xc1";
    let die = |payload: &[u8]| {
        t.schedule(id, payload, a_second_ago()).unwrap();
        let claim = t.claim_next().unwrap().expect("the due task");
        assert_eq!(claim.task().payload(), payload);
        assert_eq!(t.fail(&claim).unwrap(), Failed::Dead);
    };
    die(first);
    die(second);
    let dead = t.dead_letters().unwrap();
    let payloads: Vec<&[u8]> = dead.iter().map(|d| d.payload()).collect();
    assert_eq!(
        payloads,
        [first, second],
        "both deaths are kept, oldest first"
    );
    assert!(dead.iter().all(|d| d.id() == id && d.attempt() == 1));
    for (payload, left) in [(second, 1), (first, 0)] {
        t.requeue(id).unwrap();
        assert_eq!(t.dead_letters().unwrap().len(), left);
        let claim = t.claim_next().unwrap().expect("the requeued task");
        assert_eq!(
            claim.task().payload(),
            payload,
            "the newest is requeued first"
        );
        t.ack(&claim).unwrap();
    }
    assert!(matches!(t.requeue(id), Err(Error::NotDead)));
    assert_eq!(t.pending().unwrap(), 0);
}

#[test]
fn cancel_and_upsert_take_effect_across_processes() {
    let Some(server) = Server::start("cancel_upsert") else {
        return;
    };
    let log: Log = Arc::default();
    let consumer = RedisTimers::open(&server.url(), "cu", opts()).unwrap();
    consumer.run_handler(2, recording(&log)).unwrap();
    let producer = RedisTimers::open(&server.url(), "cu", opts()).unwrap();
    let now = SystemTime::now();
    producer
        .schedule("gone", b"", now + Duration::from_millis(400))
        .unwrap();
    producer
        .schedule("moved", b"old", now + Duration::from_millis(400))
        .unwrap();
    // Both are armed in the consumer's wheel by now.
    std::thread::sleep(Duration::from_millis(250));
    producer.cancel("gone").unwrap();
    let later = now + Duration::from_millis(900);
    producer.schedule("moved", b"new", later).unwrap();
    wait_until("moved delivered", Duration::from_secs(5), || {
        log.lock().unwrap().contains_key("moved")
    });
    std::thread::sleep(Duration::from_millis(200));
    let log = log.lock().unwrap();
    assert!(!log.contains_key("gone"), "a cancelled task ran");
    assert_eq!(log["moved"].len(), 1);
    assert!(
        log["moved"][0].0 >= later,
        "the upsert's new due time was not kept"
    );
    assert_eq!(log["moved"][0].1, ms(later));
}

#[test]
fn tasks_survive_a_redis_crash_and_a_consumer_restart() {
    let Some(mut server) = Server::start("restart") else {
        return;
    };
    let due = SystemTime::now() + Duration::from_millis(500);
    {
        let t = RedisTimers::open(&server.url(), "durable", opts()).unwrap();
        t.schedule_batch((0..50).map(|i| (format!("r{i}"), b"x".to_vec(), due)))
            .unwrap();
        t.close().unwrap();
    }
    server.crash_and_restart();
    let log: Log = Arc::default();
    let t = RedisTimers::open(&server.url(), "durable", opts()).unwrap();
    assert_eq!(t.pending().unwrap(), 50);
    t.run_handler(2, recording(&log)).unwrap();
    wait_until("all delivered", Duration::from_secs(10), || {
        t.pending().unwrap() == 0
    });
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 50);
    assert!(log.values().all(|runs| runs.len() == 1 && runs[0].0 >= due));
}

#[test]
fn bad_input_is_a_typed_error() {
    let Some(server) = Server::start("bad_input") else {
        return;
    };
    let t = RedisTimers::open(&server.url(), "bad", opts()).unwrap();
    assert!(matches!(
        t.schedule("", b"", SystemTime::now()),
        Err(Error::BadId { len: 0 })
    ));
    let big = vec![0u8; corewheel_durable::MAX_PAYLOAD_LEN + 1];
    assert!(matches!(
        t.schedule("x", &big, SystemTime::now()),
        Err(Error::PayloadTooLarge { .. })
    ));
    assert!(matches!(
        t.cancel(vec![1u8; 2000]),
        Err(Error::BadId { .. })
    ));
    assert!(matches!(
        RedisTimers::open(&server.url(), "a{b}", opts()),
        Err(Error::BadOptions(_))
    ));
    assert!(matches!(
        RedisTimers::open(&server.url(), "bad", opts().shards(8)),
        Err(Error::BadOptions(_))
    ));
    assert!(matches!(
        RedisTimers::open(&server.url(), "q", opts().shards(0)),
        Err(Error::BadOptions(_))
    ));
    assert!(matches!(
        RedisTimers::open("redis://127.0.0.1:1/", "q", opts()),
        Err(Error::Redis(_))
    ));
    assert!(matches!(
        t.run_handler(1, |_| Ok::<(), ()>(()))
            .and_then(|_| t.run_handler(1, |_| Ok::<(), ()>(()))),
        Err(Error::BadOptions(_))
    ));
}

/// The child process of [`a_consumer_killed_while_holding_leases_loses_them`]: claims
/// what it can, says how many it holds, and waits to be killed. A no-op in a normal run.
#[test]
fn child_lease_holder() {
    let Ok(url) = std::env::var("CWR_CHILD_URL") else {
        return;
    };
    let t = RedisTimers::open(&url, "procs", opts()).unwrap();
    let mut held = Vec::new();
    let until = Instant::now() + Duration::from_secs(5);
    while held.len() < 20 && Instant::now() < until {
        match t.claim_next().unwrap() {
            Some(claim) => held.push(claim),
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    // Straight to the pipe: the test harness captures `println!`.
    let mut out = std::io::stdout().lock();
    let first_lapse = held
        .iter()
        .map(|c| c.lease_until())
        .min()
        .unwrap_or(SystemTime::now());
    let first_lapse = first_lapse
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    writeln!(out, "\nHOLDING {} {first_lapse}", held.len()).unwrap();
    out.flush().unwrap();
    drop(out);
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn a_consumer_killed_while_holding_leases_loses_them() {
    let Some(server) = Server::start("kill_9") else {
        return;
    };
    let producer = RedisTimers::open(&server.url(), "procs", opts()).unwrap();
    producer
        .schedule_batch((0..100).map(|i| (format!("p{i}"), b"".to_vec(), SystemTime::now())))
        .unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_lease_holder",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CWR_CHILD_URL", server.url())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (held, first_lapse): (usize, u64) = loop {
        let line = lines.next().expect("child output").unwrap();
        // The harness prints "test child_lease_holder ... " on the same line.
        if let Some((_, rest)) = line.split_once("HOLDING ") {
            let (n, lapse) = rest.trim().split_once(' ').unwrap();
            break (n.parse().unwrap(), lapse.parse().unwrap());
        }
    };
    let first_lapse = std::time::UNIX_EPOCH + Duration::from_millis(first_lapse);
    assert_eq!(held, 20);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let log: Log = Arc::default();
    let consumer = RedisTimers::open(&server.url(), "procs", opts()).unwrap();
    consumer.run_handler(4, recording(&log)).unwrap();
    wait_until("every task acked", Duration::from_secs(10), || {
        producer.pending().unwrap() == 0
    });
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 100);
    assert!(log.values().all(|runs| runs.len() == 1));
    // The killed child's 20 came back only once their leases ran out (server time, on
    // this same machine's clock).
    let late = log.values().filter(|runs| runs[0].0 >= first_lapse).count();
    assert!(late >= 20, "only {late} deliveries waited for a lease");
}

#[test]
fn absurd_window_and_visibility_are_refused_not_a_thread_panic() {
    let Some(server) = Server::start("absurd_options") else {
        return;
    };
    // Duration::MAX as a window made the members thread panic adding it to an Instant
    // (and a member with a window that long would hold its shards for ever once dead).
    for options in [
        opts().window(Duration::MAX),
        opts().window(Duration::from_secs(u64::MAX / 4)),
        opts().visibility(Duration::MAX),
        opts().shards(1_000_000_000),
        opts().fetch_limit(0),
    ] {
        assert!(
            matches!(
                RedisTimers::open(&server.url(), "absurd", options.clone()),
                Err(Error::BadOptions(_))
            ),
            "{options:?} was accepted"
        );
    }
    // The largest accepted ones (a day, a year, as documented) still run: a task due now is delivered.
    let t = RedisTimers::open(
        &server.url(),
        "absurd",
        opts()
            .window(Duration::from_secs(24 * 3600))
            .visibility(Duration::from_secs(365 * 24 * 3600)),
    )
    .unwrap();
    let log: Log = Arc::default();
    t.run_handler(1, recording(&log)).unwrap();
    t.schedule("now", b"", SystemTime::now()).unwrap();
    wait_until("delivery", Duration::from_secs(5), || {
        log.lock().unwrap().contains_key("now")
    });
    // Its ack waits for a sweep (a day away) or close, which sends it.
    let checker = RedisTimers::open(&server.url(), "absurd", opts()).unwrap();
    t.close().unwrap();
    assert_eq!(checker.pending().unwrap(), 0);
}

#[test]
fn a_url_that_is_not_redis_is_a_typed_error_not_a_hang() {
    // A listener that accepts and never answers, and URLs of other schemes.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}/", silent.local_addr().unwrap());
    let started = Instant::now();
    assert!(matches!(
        RedisTimers::open(&url, "q", opts()),
        Err(Error::Redis(_))
    ));
    assert!(started.elapsed() < Duration::from_secs(15));
    for url in ["http://127.0.0.1:1/", "not a url", ""] {
        assert!(
            matches!(RedisTimers::open(url, "q", opts()), Err(Error::Redis(_))),
            "{url:?}"
        );
    }
}

#[test]
fn due_times_before_the_epoch_and_in_year_9999_are_kept_not_a_panic() {
    let Some(server) = Server::start("extreme_due") else {
        return;
    };
    let t = RedisTimers::open(&server.url(), "extreme", opts()).unwrap();
    let epoch = std::time::UNIX_EPOCH;
    let y9999 = epoch + Duration::from_secs(253_402_300_799);
    t.schedule("before", b"", epoch - Duration::from_secs(10))
        .unwrap();
    t.schedule("far", b"", y9999).unwrap();
    t.schedule("farthest", b"", epoch + Duration::from_secs(u64::MAX / 2))
        .unwrap();
    let log: Log = Arc::default();
    t.run_handler(1, recording(&log)).unwrap();
    wait_until("the past one", Duration::from_secs(5), || {
        log.lock().unwrap().contains_key("before")
    });
    std::thread::sleep(Duration::from_millis(300));
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log["before"][0].1, epoch);
    assert_eq!(t.pending().unwrap(), 2);
}

#[test]
fn requeued_and_hand_failed_tasks_are_hinted_not_left_for_the_next_window() {
    let Some(server) = Server::start("hinted_retries") else {
        return;
    };
    // A long window, and a lease longer than two of them, so that only a hint (or a
    // sweep a window later) can arm what becomes due.
    let options = opts()
        .shards(1)
        .window(Duration::from_secs(3))
        .visibility(Duration::from_secs(10))
        .retry(RetryPolicy {
            max_attempts: 2,
            initial_backoff: Duration::from_millis(100),
            multiplier: 1,
            max_backoff: Duration::from_millis(100),
        });
    let producer = RedisTimers::open(&server.url(), "hinted", options.clone()).unwrap();
    producer.schedule("manual", b"", a_second_ago()).unwrap();
    let claim = producer.claim_next().unwrap().expect("the due task");
    let seen: Arc<Mutex<Vec<(String, u32, Instant)>>> = Arc::default();
    let consumer = RedisTimers::open(&server.url(), "hinted", options).unwrap();
    {
        let seen = Arc::clone(&seen);
        consumer
            .run_handler(1, move |task| {
                let id = String::from_utf8_lossy(task.id()).into_owned();
                let fail = id == "doomed";
                seen.lock()
                    .unwrap()
                    .push((id, task.attempt(), Instant::now()));
                if fail { Err("doomed") } else { Ok(()) }
            })
            .unwrap();
    }
    // The consumer's first sweep has run by now; its next is three seconds away.
    std::thread::sleep(Duration::from_millis(300));
    let seen_of = |id: &str, attempt: u32| {
        seen.lock()
            .unwrap()
            .iter()
            .find(|s| s.0 == id && s.1 == attempt)
            .map(|s| s.2)
    };
    // A hand-written consumer fails its claim: the retry, 100 ms later, is the
    // handling process's to run.
    let failed_at = Instant::now();
    assert_eq!(producer.fail(&claim).unwrap(), Failed::Retrying);
    wait_until("the retry", Duration::from_secs(5), || {
        seen_of("manual", 2).is_some()
    });
    let late = seen_of("manual", 2).unwrap() - failed_at;
    assert!(
        late < Duration::from_secs(1),
        "retry delivered {late:?} after fail"
    );
    // A dead letter requeued by another process.
    producer.schedule("doomed", b"", SystemTime::now()).unwrap();
    wait_until("the dead letter", Duration::from_secs(5), || {
        !producer.dead_letters().unwrap().is_empty()
    });
    let requeued_at = Instant::now();
    producer.requeue("doomed").unwrap();
    wait_until("the requeued task", Duration::from_secs(5), || {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|s| s.0 == "doomed")
            .count()
            == 3
    });
    let late = seen.lock().unwrap().last().unwrap().2 - requeued_at;
    assert!(
        late < Duration::from_secs(1),
        "requeue delivered {late:?} after"
    );
}

#[test]
fn a_handler_that_blocks_for_ever_does_not_strand_the_shards_its_process_owns() {
    let Some(server) = Server::start("stuck_handler") else {
        return;
    };
    let options = opts().shards(8);
    let log: Log = Arc::default();
    // Consumer 1's only handler thread blocks on "stuck" (for ever, as far as the queue
    // can tell).
    let (stuck, release) = stuck_process(&server, "stuck", options.clone(), &log, |t| {
        t.schedule("stuck", b"", SystemTime::now()).unwrap();
    });
    let healthy = RedisTimers::open(&server.url(), "stuck", options).unwrap();
    healthy.run_handler(2, recording(&log)).unwrap();
    wait_until("both members own shards", Duration::from_secs(5), || {
        healthy.owned_shards() > 0 && healthy.owned_shards() < 8
    });
    healthy
        .schedule_batch((0..40).map(|i| (format!("t{i}"), b"".to_vec(), SystemTime::now())))
        .unwrap();
    let delivered = || {
        (0..40)
            .filter(|i| log.lock().unwrap().contains_key(&format!("t{i}")))
            .count()
    };
    let until = Instant::now() + Duration::from_secs(5);
    while delivered() < 40 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let n = delivered();
    drop(release);
    assert_eq!(
        n, 40,
        "tasks in the stuck process's shards were not delivered"
    );
    wait_until("the stuck task's ack", Duration::from_secs(5), || {
        healthy.pending().unwrap() == 0
    });
    drop(stuck);
    let log = log.lock().unwrap();
    assert!(log.values().all(|runs| runs.len() == 1), "{log:?}");
}

#[test]
fn a_producer_with_a_shorter_window_than_the_consumer_still_hints_its_tasks() {
    let Some(server) = Server::start("mixed_windows") else {
        return;
    };
    let log: Log = Arc::default();
    let consumer = RedisTimers::open(
        &server.url(),
        "mixed",
        opts().window(Duration::from_secs(3)),
    )
    .unwrap();
    consumer.run_handler(1, recording(&log)).unwrap();
    // The consumer's first sweep has run; its next is three seconds away.
    std::thread::sleep(Duration::from_millis(300));
    let producer = RedisTimers::open(
        &server.url(),
        "mixed",
        opts().window(Duration::from_millis(10)),
    )
    .unwrap();
    let due = SystemTime::now() + Duration::from_millis(500);
    producer.schedule("soon", b"", due).unwrap();
    wait_until("delivery", Duration::from_secs(5), || {
        log.lock().unwrap().contains_key("soon")
    });
    let ran = log.lock().unwrap()["soon"][0].0;
    let late = ran.duration_since(due).unwrap();
    assert!(late < Duration::from_millis(500), "{late:?} late");
}

#[test]
fn a_panicking_handler_is_a_failure_and_the_task_is_retried() {
    let Some(server) = Server::start("panicking_handler") else {
        return;
    };
    let policy = RetryPolicy {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(50),
        multiplier: 1,
        max_backoff: Duration::from_millis(50),
    };
    let t = RedisTimers::open(&server.url(), "panics", opts().retry(policy)).unwrap();
    let log: Log = Arc::default();
    {
        let record = recording(&log);
        t.run_handler(1, move |task| {
            record(task)?;
            if task.attempt() == 1 {
                panic!("a handler bug");
            }
            Ok::<(), String>(())
        })
        .unwrap();
    }
    t.schedule("p", b"", SystemTime::now()).unwrap();
    wait_until("the retry acked", Duration::from_secs(5), || {
        t.pending().unwrap() == 0
    });
    let attempts: Vec<u32> = log.lock().unwrap()["p"].iter().map(|r| r.2).collect();
    assert_eq!(attempts, vec![1, 2]);
    assert!(t.dead_letters().unwrap().is_empty());
}

#[test]
fn dropping_the_store_from_inside_its_own_handler_returns() {
    let Some(server) = Server::start("drop_in_handler") else {
        return;
    };
    let slot: Arc<Mutex<Option<RedisTimers>>> = Arc::default();
    let (dropped_tx, dropped) = std::sync::mpsc::channel();
    let t = RedisTimers::open(&server.url(), "selfdrop", opts()).unwrap();
    {
        let (slot, dropped_tx) = (Arc::clone(&slot), Mutex::new(dropped_tx));
        t.run_handler(2, move |_| {
            let taken = slot.lock().unwrap().take();
            drop(taken);
            let _ = dropped_tx.lock().unwrap().send(());
            Ok::<(), ()>(())
        })
        .unwrap();
    }
    {
        let mut slot = slot.lock().unwrap();
        t.schedule("x", b"", SystemTime::now()).unwrap();
        *slot = Some(t);
    }
    assert!(
        dropped.recv_timeout(Duration::from_secs(15)).is_ok(),
        "drop inside the handler hung"
    );
    assert!(slot.lock().unwrap().is_none());
}

#[test]
fn a_fetch_limit_of_one_still_drains_a_backlog_due_at_open() {
    let Some(server) = Server::start("fetch_limit_one") else {
        return;
    };
    let producer = RedisTimers::open(&server.url(), "limit", opts()).unwrap();
    let past = SystemTime::now() - Duration::from_secs(3600);
    producer
        .schedule_batch((0..100).map(|i| (format!("b{i}"), b"".to_vec(), past)))
        .unwrap();
    let log: Log = Arc::default();
    let t = RedisTimers::open(&server.url(), "limit", opts().fetch_limit(1)).unwrap();
    t.run_handler(3, recording(&log)).unwrap();
    wait_until("the backlog drained", Duration::from_secs(10), || {
        producer.pending().unwrap() == 0
    });
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 100);
    assert!(log.values().all(|runs| runs.len() == 1));
}

#[test]
fn a_claim_acked_through_another_queue_is_refused_not_a_panic() {
    let Some(server) = Server::start("foreign_claim") else {
        return;
    };
    let wide = RedisTimers::open(&server.url(), "wide", opts().shards(64)).unwrap();
    let narrow = RedisTimers::open(&server.url(), "narrow", opts().shards(1)).unwrap();
    // Ids until one lands past shard 0 of the wide queue.
    wide.schedule_batch((0..8).map(|i| (format!("w{i}"), b"".to_vec(), SystemTime::now())))
        .unwrap();
    let mut claims = Vec::new();
    while let Some(claim) = wide.claim_next().unwrap() {
        claims.push(claim);
    }
    assert_eq!(claims.len(), 8);
    for mut claim in claims {
        assert!(matches!(narrow.ack(&claim), Err(Error::LeaseLost)));
        assert!(matches!(narrow.fail(&claim), Err(Error::LeaseLost)));
        assert!(matches!(narrow.renew(&mut claim), Err(Error::LeaseLost)));
        wide.ack(&claim).unwrap();
    }
    assert_eq!(wide.pending().unwrap(), 0);
}

/// A due time already passed by the server's clock too: a task due "now" is stored at
/// the next whole millisecond, so a claim within the same millisecond finds nothing.
fn a_second_ago() -> SystemTime {
    SystemTime::now() - Duration::from_secs(1)
}

/// A process on `queue` whose only handler thread blocks on the task `stuck` (scheduled
/// by `schedule`, with whatever else it schedules) until the returned sender is dropped
/// or a minute passes, and records every task it finishes. Returns once it is blocked.
fn stuck_process(
    server: &Server,
    queue: &str,
    options: RedisOptions,
    log: &Log,
    schedule: impl FnOnce(&RedisTimers),
) -> (RedisTimers, std::sync::mpsc::Sender<()>) {
    let (release, released) = std::sync::mpsc::channel::<()>();
    let released = Mutex::new(released);
    let blocked = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (record, flag) = (recording(log), Arc::clone(&blocked));
    let stuck = RedisTimers::open(&server.url(), queue, options).unwrap();
    schedule(&stuck);
    stuck
        .run_handler(1, move |task: &corewheel_durable::Task| {
            if task.id() == b"stuck" {
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
                let _ = released
                    .lock()
                    .unwrap()
                    .recv_timeout(Duration::from_secs(60));
            }
            record(task)
        })
        .unwrap();
    wait_until("the stuck handler", Duration::from_secs(5), || {
        blocked.load(std::sync::atomic::Ordering::SeqCst)
    });
    (stuck, release)
}

#[test]
fn claims_waiting_behind_a_stuck_handler_reach_another_process() {
    let Some(server) = Server::start("ready_strand") else {
        return;
    };
    // One shard; the stuck process's only handler thread claims four tasks in one sweep,
    // blocks on the first, and leaves three waiting for it. They are not renewed while
    // they wait, the process counts as stalled, and the other process takes them.
    let options = opts().shards(1);
    let log: Log = Arc::default();
    let (stuck, release) = stuck_process(&server, "strand", options.clone(), &log, |t| {
        let now = SystemTime::now();
        t.schedule("stuck", b"", now - Duration::from_secs(2))
            .unwrap();
        t.schedule_batch(["a", "b", "c"].map(|id| (id, b"", now - Duration::from_secs(1))))
            .unwrap();
    });
    let healthy = RedisTimers::open(&server.url(), "strand", options).unwrap();
    healthy.run_handler(2, recording(&log)).unwrap();
    wait_until(
        "a, b and c through the healthy process",
        Duration::from_secs(15),
        || {
            ["a", "b", "c"]
                .iter()
                .all(|id| log.lock().unwrap().contains_key(*id))
        },
    );
    drop(release);
    drop(stuck);
    let log = log.lock().unwrap();
    assert!(
        ["a", "b", "c"].iter().all(|id| log[*id].len() == 1),
        "{log:?}"
    );
}

#[test]
fn a_stuck_process_does_not_rejoin_and_retake_its_shards() {
    let Some(server) = Server::start("flap") else {
        return;
    };
    // Once the others have taken a stuck process's work, its sweeps find nothing
    // claimable; it must still stay out of the members until a handler thread is free,
    // or it takes its shards back and strands what lands there again.
    let options = opts().shards(8);
    let log: Log = Arc::default();
    let (stuck, release) = stuck_process(&server, "flap", options.clone(), &log, |t| {
        t.schedule("stuck", b"", a_second_ago()).unwrap();
    });
    let healthy = RedisTimers::open(&server.url(), "flap", options).unwrap();
    healthy.run_handler(2, recording(&log)).unwrap();
    // A task due now every 50 ms, over every shard, for 4 s.
    let mut members = Vec::new();
    let start = Instant::now();
    let mut ids = Vec::new();
    while start.elapsed() < Duration::from_secs(4) {
        let id = format!("s{}", ids.len());
        healthy.schedule(&id, b"", SystemTime::now()).unwrap();
        ids.push(id);
        if ids.len() % 4 == 0 {
            members.push(server.live_members("flap"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_until("every task", Duration::from_secs(10), || {
        ids.iter().all(|id| log.lock().unwrap().contains_key(id))
    });
    drop(release);
    // Once out (one live member), never back while stuck.
    let out = members.iter().position(|&m| m == 1);
    assert!(out.is_some(), "the stuck process never left: {members:?}");
    assert!(
        members[out.unwrap()..].iter().all(|&m| m == 1),
        "the stuck process rejoined: {members:?}"
    );
    drop(stuck);
    let log = log.lock().unwrap();
    assert!(log.values().all(|runs| runs.len() == 1), "{log:?}");
}

#[test]
fn a_schedule_right_after_redis_restarted_succeeds() {
    let Some(mut server) = Server::start("schedule_after_restart") else {
        return;
    };
    let t = RedisTimers::open(&server.url(), "restarted", opts()).unwrap();
    t.schedule("before", b"", SystemTime::now() + Duration::from_secs(60))
        .unwrap();
    server.crash_and_restart();
    // The server is back and answers; the pooled connection is the old one. A schedule
    // is never sent twice (the first may have run), so the pool checks a connection
    // idle for 100 ms or more before it: a restart here takes less than that, in
    // deployments seconds.
    std::thread::sleep(Duration::from_millis(150));
    let result = t.schedule("after", b"", SystemTime::now() + Duration::from_secs(60));
    assert!(
        result.is_ok(),
        "schedule to a restarted, answering server failed: {result:?}"
    );
}

#[test]
fn the_hand_written_consumer_api_refuses_every_misuse() {
    let Some(server) = Server::start("misuse") else {
        return;
    };
    let t = RedisTimers::open(&server.url(), "misuse", opts()).unwrap();
    let other = RedisTimers::open(&server.url(), "misuse2", opts()).unwrap();
    t.schedule("j", b"", a_second_ago()).unwrap();
    other.schedule("j", b"", a_second_ago()).unwrap();
    let mut claim = t.claim_next().unwrap().unwrap();
    let mut theirs = other.claim_next().unwrap().unwrap();
    // Another queue's claim on the same id and shard.
    assert!(matches!(t.ack(&theirs), Err(Error::LeaseLost)));
    assert!(matches!(t.renew(&mut theirs), Err(Error::LeaseLost)));
    assert!(matches!(t.fail(&theirs), Err(Error::LeaseLost)));
    t.ack(&claim).unwrap();
    assert!(matches!(t.ack(&claim), Err(Error::LeaseLost)));
    assert!(matches!(t.renew(&mut claim), Err(Error::LeaseLost)));
    assert!(matches!(t.fail(&claim), Err(Error::LeaseLost)));
    assert_eq!(t.pending().unwrap(), 0);
    assert!(t.dead_letters().unwrap().is_empty());
    other.ack(&theirs).unwrap();
    // Odd ids: binary, spaces, braces, a 1-byte NUL.
    for id in [&b"{x} y"[..], b"\0", b"\xff\xfe", b"1 2"] {
        t.schedule(id, b"\0p", a_second_ago()).unwrap();
        let c = t.claim_next().unwrap().expect("the odd id");
        assert_eq!(c.task().id(), id);
        assert_eq!(c.task().payload(), b"\0p");
        t.ack(&c).unwrap();
    }
    // The largest payload round-trips.
    let big = vec![7u8; corewheel_durable::MAX_PAYLOAD_LEN];
    t.schedule("big", &big, a_second_ago()).unwrap();
    let c = t.claim_next().unwrap().unwrap();
    assert_eq!(c.task().payload().len(), big.len());
    t.ack(&c).unwrap();
    // Due at the epoch itself.
    t.schedule("epoch", b"", std::time::UNIX_EPOCH).unwrap();
    let c = t.claim_next().unwrap().unwrap();
    assert_eq!(c.task().due(), std::time::UNIX_EPOCH);
    t.ack(&c).unwrap();
}

#[test]
fn consumers_joining_and_leaving_mid_run_deliver_every_task_once_and_never_two_at_once() {
    let Some(server) = Server::start("churn") else {
        return;
    };
    // (instance, start, end) per id.
    type Runs = Arc<Mutex<HashMap<String, Vec<(usize, Instant, Instant)>>>>;
    let runs: Runs = Arc::default();
    let options = opts().shards(8);
    let start_consumer = |n: usize| {
        let t = RedisTimers::open(&server.url(), "churn", options.clone()).unwrap();
        let runs = Arc::clone(&runs);
        t.run_handler(2, move |task| {
            let started = Instant::now();
            std::thread::sleep(Duration::from_millis(fastrand::u64(5..20)));
            runs.lock()
                .unwrap()
                .entry(String::from_utf8_lossy(task.id()).into_owned())
                .or_default()
                .push((n, started, Instant::now()));
            Ok::<(), ()>(())
        })
        .unwrap();
        t
    };
    let mut live: VecDeque<RedisTimers> = (0..3).map(start_consumer).collect();
    let producer = RedisTimers::open(&server.url(), "churn", options.clone()).unwrap();
    let start = SystemTime::now();
    let due: HashMap<String, SystemTime> = (0..400)
        .map(|i| {
            (
                format!("c{i}"),
                start + Duration::from_millis(100 + (i * 13) % 4000),
            )
        })
        .collect();
    producer
        .schedule_batch(due.iter().map(|(id, d)| (id.clone(), Vec::new(), *d)))
        .unwrap();
    let mut closers = Vec::new();
    for n in 3..13 {
        std::thread::sleep(Duration::from_millis(350));
        let leaving = live.pop_front().unwrap();
        closers.push(std::thread::spawn(move || leaving.close().unwrap()));
        live.push_back(start_consumer(n));
    }
    wait_until("every task acked", Duration::from_secs(20), || {
        producer.pending().unwrap() == 0
    });
    for c in closers {
        c.join().unwrap();
    }
    let runs = runs.lock().unwrap();
    let missing: Vec<&String> = due.keys().filter(|id| !runs.contains_key(*id)).collect();
    assert!(missing.is_empty(), "never delivered: {missing:?}");
    for (id, r) in runs.iter() {
        assert_eq!(r.len(), 1, "{id} delivered {} times: {r:?}", r.len());
    }
    drop(live);
}

#[test]
fn redis_stopped_longer_than_a_lease_mid_run_loses_nothing_and_fires_nothing_early() {
    let Some(server) = Server::start("sigstop") else {
        return;
    };
    let log: Log = Arc::default();
    let consumers: Vec<RedisTimers> = (0..2)
        .map(|_| {
            let t = RedisTimers::open(&server.url(), "stopped", opts()).unwrap();
            let record = recording(&log);
            t.run_handler(2, move |task| {
                record(task)?;
                std::thread::sleep(Duration::from_millis(20));
                Ok::<(), String>(())
            })
            .unwrap();
            t
        })
        .collect();
    let producer = RedisTimers::open(&server.url(), "stopped", opts()).unwrap();
    let start = SystemTime::now();
    let tasks: Vec<(String, Vec<u8>, SystemTime)> = (0..200)
        .map(|i| {
            (
                format!("s{i}"),
                vec![],
                start + Duration::from_millis(200 + i * 15),
            )
        })
        .collect();
    producer.schedule_batch(tasks.clone()).unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    server.pause();
    std::thread::sleep(Duration::from_millis(2000));
    server.resume();
    let resumed = Instant::now();
    wait_until("every task acked", Duration::from_secs(30), || {
        producer.pending().is_ok_and(|n| n == 0)
    });
    eprintln!("drained {:?} after SIGCONT", resumed.elapsed());
    let log = log.lock().unwrap();
    for (id, _, due) in &tasks {
        let runs = log
            .get(id)
            .unwrap_or_else(|| panic!("{id} never delivered"));
        for (ran, _, _) in runs {
            assert!(ran >= due, "{id} ran early");
        }
    }
    let redelivered = log.values().filter(|r| r.len() > 1).count();
    eprintln!("{redelivered} tasks delivered more than once");
    drop(consumers);
}

#[test]
fn one_large_schedule_batch_does_not_block_the_server_for_every_other_client() {
    let Some(server) = Server::start("big_batch") else {
        return;
    };
    // A script holds the whole server while it runs: a batch is sent in short scripts, so
    // another client (a renewal, a claim, a heartbeat) waits milliseconds, not seconds.
    let t = RedisTimers::open(&server.url(), "big", opts().shards(1)).unwrap();
    let later = SystemTime::now() + Duration::from_secs(3600);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pinger = {
        let (url, stop) = (server.url(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
            let mut worst = Duration::ZERO;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let sent = Instant::now();
                let _: String = redis::cmd("PING").query(&mut conn).unwrap();
                worst = worst.max(sent.elapsed());
                std::thread::sleep(Duration::from_millis(5));
            }
            worst
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    let started = Instant::now();
    t.schedule_batch((0..300_000).map(|i| (format!("b{i}"), Vec::new(), later)))
        .unwrap();
    let took = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let worst = pinger.join().unwrap();
    eprintln!("batch of 300k took {took:?}; worst PING from another client {worst:?}");
    assert!(
        worst < Duration::from_millis(600),
        "another client waited {worst:?} for a PING: longer than a 600 ms lease"
    );
}

#[test]
fn the_smallest_window_and_visibility_allowed_still_deliver_everything() {
    let Some(server) = Server::start("tiny_window") else {
        return;
    };
    let options = RedisOptions::default()
        .shards(16)
        .window(Duration::from_millis(1))
        .visibility(Duration::from_millis(30));
    let log: Log = Arc::default();
    let consumers: Vec<RedisTimers> = (0..2)
        .map(|_| {
            let t = RedisTimers::open(&server.url(), "tiny", options.clone()).unwrap();
            let record = recording(&log);
            t.run_handler(2, move |task| {
                record(task)?;
                std::thread::sleep(Duration::from_millis(fastrand::u64(0..50)));
                Ok::<(), String>(())
            })
            .unwrap();
            t
        })
        .collect();
    let start = SystemTime::now();
    consumers[0]
        .schedule_batch((0..200).map(|i| {
            (
                format!("t{i}"),
                Vec::new(),
                start + Duration::from_millis(100 + i * 10),
            )
        }))
        .unwrap();
    wait_until("every task acked", Duration::from_secs(30), || {
        consumers[0].pending().unwrap() == 0
    });
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 200);
    let dup = log.values().filter(|r| r.len() > 1).count();
    eprintln!("tiny window: {dup} of 200 delivered more than once");
    drop(consumers);
}

#[test]
fn a_retry_is_never_delivered_before_its_backoff_has_passed_since_the_failure() {
    let Some(server) = Server::start("retry_early") else {
        return;
    };
    // A retry is due `backoff` after the failure by the server's clock, rounded up to the
    // millisecond: never before `backoff` has passed since the attempt began.
    let backoff = Duration::from_millis(20);
    let policy = RetryPolicy {
        max_attempts: 1000,
        initial_backoff: backoff,
        multiplier: 1,
        max_backoff: backoff,
    };
    let t = RedisTimers::open(&server.url(), "retry_early", opts().retry(policy)).unwrap();
    let failed_at: Arc<Mutex<Vec<(u32, SystemTime, SystemTime)>>> = Arc::default();
    {
        let failed_at = Arc::clone(&failed_at);
        t.run_handler(1, move |task| {
            // Started at; the Err below is the failure, right after.
            failed_at
                .lock()
                .unwrap()
                .push((task.attempt(), SystemTime::now(), task.due()));
            Err::<(), ()>(())
        })
        .unwrap();
    }
    t.schedule("r", b"", SystemTime::now()).unwrap();
    wait_until("40 attempts", Duration::from_secs(20), || {
        failed_at.lock().unwrap().len() >= 40
    });
    let runs = failed_at.lock().unwrap().clone();
    let mut early = Vec::new();
    for pair in runs.windows(2) {
        // The retry's due time, as delivered, against the instant the previous attempt
        // started (its failure came after that).
        let (_, started, _) = pair[0];
        let (attempt, _, due) = pair[1];
        if due < started + backoff {
            early.push((attempt, (started + backoff).duration_since(due).unwrap()));
        }
    }
    assert!(
        early.is_empty(),
        "retries due before `backoff` after the failed attempt began: {early:?}"
    );
}

/// A handler that closes its own store and then returns `Ok` has acked its task: the
/// task must not stay in the queue, nor be delivered again.
#[test]
fn a_handler_that_closes_its_store_then_returns_ok_has_its_task_acked() {
    let Some(server) = Server::start("close_in_handler_ack") else {
        return;
    };
    let slot: Arc<Mutex<Option<RedisTimers>>> = Arc::default();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (done_tx, done) = std::sync::mpsc::channel();
    let t = RedisTimers::open(&server.url(), "closeack", opts().shards(1)).unwrap();
    {
        let (slot, runs, done_tx) = (Arc::clone(&slot), Arc::clone(&runs), Mutex::new(done_tx));
        t.run_handler(1, move |_| {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if let Some(t) = slot.lock().unwrap().take() {
                t.close().unwrap();
            }
            let _ = done_tx.lock().unwrap().send(());
            Ok::<(), ()>(())
        })
        .unwrap();
    }
    {
        let mut slot = slot.lock().unwrap();
        t.schedule("job", b"", a_second_ago()).unwrap();
        *slot = Some(t);
    }
    done.recv_timeout(Duration::from_secs(10))
        .expect("the handler ran");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Well past a lease, an ack window and a sweep.
    std::thread::sleep(Duration::from_millis(1500));
    let checker = RedisTimers::open(&server.url(), "closeack", opts().shards(1)).unwrap();
    assert_eq!(
        checker.pending().unwrap(),
        0,
        "the handler returned Ok, yet its task is still in the queue"
    );
    assert!(
        checker.claim_next().unwrap().is_none(),
        "a task whose handler returned Ok is delivered again"
    );
}

/// `close` keeps renewing the leases of handlers still running: a handler that closes its
/// own store and goes on working is one, so no other consumer may claim its task while it
/// runs (the renew thread is not joined by that close and ends when the handler returns).
#[test]
fn a_handler_that_closes_its_own_store_keeps_its_lease_while_it_finishes() {
    let Some(server) = Server::start("close_in_handler_lease") else {
        return;
    };
    let vis = Duration::from_millis(300);
    let options = RedisOptions::default()
        .shards(1)
        .window(Duration::from_millis(100))
        .visibility(vis);
    let slot: Arc<Mutex<Option<RedisTimers>>> = Arc::default();
    let running = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let closed_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let t = RedisTimers::open(&server.url(), "closelease", options.clone()).unwrap();
    {
        let (slot, running, closed_at) = (
            Arc::clone(&slot),
            Arc::clone(&running),
            Arc::clone(&closed_at),
        );
        t.run_handler(1, move |_| {
            running.store(true, std::sync::atomic::Ordering::SeqCst);
            if let Some(t) = slot.lock().unwrap().take() {
                t.close().unwrap();
            }
            *closed_at.lock().unwrap() = Some(Instant::now());
            // Finishing up after asking to stop: five leases.
            std::thread::sleep(Duration::from_millis(1500));
            running.store(false, std::sync::atomic::Ordering::SeqCst);
            Ok::<(), ()>(())
        })
        .unwrap();
    }
    {
        let mut slot = slot.lock().unwrap();
        t.schedule("job", b"", SystemTime::now()).unwrap();
        *slot = Some(t);
    }
    wait_until(
        "the handler closed its store",
        Duration::from_secs(5),
        || closed_at.lock().unwrap().is_some(),
    );
    let other = RedisTimers::open(&server.url(), "closelease", options).unwrap();
    let until = Instant::now() + Duration::from_millis(1300);
    let mut taken_while_running = None;
    while Instant::now() < until && running.load(std::sync::atomic::Ordering::SeqCst) {
        if let Some(claim) = other.claim_next().unwrap() {
            if running.load(std::sync::atomic::Ordering::SeqCst) {
                taken_while_running = Some(claim.task().attempt());
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        taken_while_running.is_none(),
        "another consumer claimed the task while the handler that closed its store was \
         still running it: that handler's lease was no longer renewed after close"
    );
}

/// Dead letters are MessagePack arrays in one hash field per id: binary ids and payloads
/// at every string-length boundary of the format, several deaths of one id, a requeue
/// between deaths.
#[test]
fn dead_letters_keep_binary_payloads_at_every_msgpack_length_boundary() {
    let Some(server) = Server::start("dead_binary") else {
        return;
    };
    let options = RedisOptions::default()
        .shards(2)
        .window(Duration::from_millis(50))
        .visibility(Duration::from_secs(5))
        .retry(RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        });
    let t = RedisTimers::open(&server.url(), "deadbin", options).unwrap();
    let id: Vec<u8> = vec![0, 0xff, b' ', b'\n', 0xc1, 0x90];
    let lens = [0usize, 1, 31, 32, 255, 256, 65535, 65536, 70000];
    let payload = |n: usize| -> Vec<u8> { (0..n).map(|i| (i * 7 + n) as u8).collect() };
    for &n in &lens {
        t.schedule(&id, payload(n), SystemTime::now() - Duration::from_secs(1))
            .unwrap();
        let claim = t.claim_next().unwrap().expect("due");
        assert_eq!(claim.task().payload(), &payload(n)[..]);
        t.fail(&claim).unwrap();
    }
    let dead = t.dead_letters().unwrap();
    assert_eq!(dead.len(), lens.len());
    let mut got: Vec<Vec<u8>> = dead.iter().map(|d| d.payload().to_vec()).collect();
    let mut want: Vec<Vec<u8>> = lens.iter().map(|&n| payload(n)).collect();
    got.sort();
    want.sort();
    assert!(got == want, "a dead letter's payload changed");
    assert!(dead.iter().all(|d| d.id() == &id[..]));
    // Requeue takes the newest each time.
    for &n in lens.iter().rev() {
        t.requeue(&id).unwrap();
        let claim = t.claim_next().unwrap().expect("requeued");
        assert_eq!(claim.task().payload().len(), n);
        t.ack(&claim).unwrap();
    }
    assert!(t.dead_letters().unwrap().is_empty());
}
