//! [`RedisTimers`]: durable delayed tasks in Redis, one queue shared by many processes.
//!
//! The embedded [`DurableTimers`](crate::DurableTimers) owns its directory; this store
//! lets every instance of a service schedule into, and consume from, one queue. It does
//! not go through the crate's internal `Store` seam: that seam moves journal records for
//! one owning process (the window, tombstones and the Bloom filter live in its memory),
//! while a shared queue needs its state (what is due, who holds what) on the server,
//! changed by atomic scripts. What is shared is the public surface: [`Task`],
//! [`RetryPolicy`], [`Error`], the handler contract, and a corewheel [`Wheel`] per
//! process that fires each task at its due instant.
//!
//! How a task travels: [`schedule`](RedisTimers::schedule) writes it to its shard's
//! `due` sorted set. Each process running handlers registers in the queue's `members`
//! set with a heartbeat (once per [`RedisOptions::window`]) and owns the shards that
//! rendezvous hashing over the live members gives it, so that each shard is armed and
//! claimed by one process, and a member whose heartbeat lapses has its shards taken over.
//! Once per window it sweeps each shard it owns: one script that sends the acks finished
//! since, and returns when the shard next has something claimable (a due time or a lease
//! expiry). That instant is armed in the process's corewheel wheel, one entry per shard.
//! A schedule script whose task is due within two of the longest windows allowed (two
//! days: the scheduler does not know the owner's window) also publishes a hint, so the
//! owner arms it at once rather than at its next sweep; a process sweeps the shards it
//! owns as soon as it (re)subscribes, so a hint sent while it did not listen costs
//! nothing. When the wheel fires for a shard, a handler thread sweeps it again, claiming
//! in one script every task due by the server's clock (up to a batch), each under a fresh
//! token and a lease (expiry = server now + visibility), and learns the shard's next
//! instant. Claims are atomic on the server, so if two processes briefly both think they
//! own a shard (membership changing), each task is still claimed by exactly one. The
//! lease is renewed while the handler runs; an ack (carried by the shard's next sweep,
//! or flushed after a short delay) deletes the task only if the lease is still that
//! token's; a failure puts it back with a backoff, or among the dead letters. A lease
//! that runs out (the consumer died) makes the task claimable again at its expiry.

mod conn;
mod scripts;

use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use corewheel::{TimerKey, Wheel};

use self::conn::{Pool, Resend, Script, array, bytes, int, unexpected};
use crate::clock::{ceil_ms, to_system};
use crate::error::Error;
use crate::options::RetryPolicy;
use crate::task::Task;
use crate::timers::{check_id, check_task, spawn};
use redis::Value;

static SCHEDULE: Script = Script::new(scripts::SCHEDULE, Resend::Never);
static CANCEL: Script = Script::new(scripts::CANCEL, Resend::Safe);
static SWEEP: Script = Script::new(scripts::SWEEP, Resend::Never);
static HEARTBEAT: Script = Script::new(scripts::HEARTBEAT, Resend::Safe);
static CLAIM_NEXT: Script = Script::new(scripts::CLAIM_NEXT, Resend::Never);
static RENEW: Script = Script::new(scripts::RENEW, Resend::Safe);
static ACK: Script = Script::new(scripts::ACK, Resend::Never);
static FAIL: Script = Script::new(scripts::FAIL, Resend::Never);
static REQUEUE: Script = Script::new(scripts::REQUEUE, Resend::Never);
static DEAD_LETTERS: Script = Script::new(scripts::DEAD_LETTERS, Resend::Safe);

/// The most shards a queue may have.
pub const MAX_SHARDS: u32 = 16_384;

/// The longest window accepted: a day.
const MAX_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// How far ahead a schedule or retry is hinted: the horizon of a consumer with the
/// longest window, since the scheduling process cannot know the windows of the shard's
/// owner (each consumer ignores hints beyond its own horizon).
const HINT_HORIZON_MS: u64 = 2 * MAX_WINDOW.as_secs() * 1000;

/// The longest visibility timeout accepted: a year.
const MAX_VISIBILITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// The longest backoff the scripts are given, in ms (about 31 years).
const MAX_BACKOFF_MS: u64 = 1_000_000_000_000;

/// The longest a handler thread sleeps with nothing armed. Every change it waits for
/// (an arm, a finished task, close) is made under the lock and notified, so this only
/// bounds the harm of a missed notification.
const IDLE_WAIT: Duration = Duration::from_secs(1);

/// Tasks of a `schedule_batch` per script: a script holds the whole server while it runs,
/// and this many take it milliseconds, not seconds.
const SCRIPT_TASKS: usize = 1000;

/// How long the hints thread blocks reading its subscription before it looks whether
/// the queue is closing.
const HINT_READ_TIMEOUT: Duration = Duration::from_millis(100);

/// The most a wake is armed after the instant the server's offset gives: a reply held
/// up (its half round trip long) can make a wake late by this much and no more.
const MAX_WAKE_SHIFT_US: u64 = 1000;

/// How long the hints thread waits for its subscription to be confirmed before it
/// tries again on a new connection: until it is subscribed, hints go to no one here.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(1);

/// A member whose heartbeat is older than this many windows is taken for dead.
const HEARTBEAT_WINDOWS: u32 = 3;

/// Options for [`RedisTimers::open`].
#[derive(Clone, Debug)]
pub struct RedisOptions {
    shards: u32,
    window: Duration,
    visibility: Duration,
    retry: RetryPolicy,
    fetch_limit: usize,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            shards: 1,
            window: Duration::from_secs(1),
            visibility: Duration::from_secs(30),
            retry: RetryPolicy::default(),
            fetch_limit: 10_000,
        }
    }
}

impl RedisOptions {
    /// How many shards the queue's tasks are spread over (default 1, at most
    /// [`MAX_SHARDS`]). Each shard's keys share a hash tag, so in a Redis Cluster each
    /// lives on one node. Fixed for a queue's life: opening it with another count is
    /// refused, since ids would map to other shards.
    pub fn shards(mut self, shards: u32) -> Self {
        self.shards = shards;
        self
    }

    /// How often each handling process sweeps the shards it owns and renews its
    /// membership (default one second). A sweep learns when the shard next has something
    /// claimable and arms it if that is within two windows; a task scheduled for sooner
    /// is hinted to the owner at once. An idle queue costs, per window, one round trip
    /// per shard plus one heartbeat per handling process; a member that dies has its
    /// shards taken over after three windows, and so does one whose handler threads have
    /// all been busy for two windows while work waited for them. At least 1 ms and at
    /// most a day.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// How long a claim holds a task before another consumer may take it (default 30 s).
    /// Renewed every third of this while the handler runs, so it bounds how long a dead
    /// consumer's tasks wait, not how long a handler may take. A claimed task still
    /// waiting for a handler thread is not renewed: it goes to another process after
    /// this long. At least 30 ms and at most a year.
    pub fn visibility(mut self, visibility: Duration) -> Self {
        self.visibility = visibility;
        self
    }

    /// Retries and dead-lettering of failed tasks.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The most tasks one sweep claims from a shard (default 10 000; run_handler uses at
    /// most four per handler thread). When a sweep is full the next one comes at once.
    pub fn fetch_limit(mut self, limit: usize) -> Self {
        self.fetch_limit = limit;
        self
    }

    fn validate(&self) -> Result<(), Error> {
        if self.shards == 0 || self.shards > MAX_SHARDS {
            return Err(Error::BadOptions("shards must be 1 to MAX_SHARDS"));
        }
        if self.window < Duration::from_millis(1) || self.window > MAX_WINDOW {
            return Err(Error::BadOptions("window under 1 ms or over a day"));
        }
        if self.visibility < Duration::from_millis(30) || self.visibility > MAX_VISIBILITY {
            return Err(Error::BadOptions("visibility under 30 ms or over a year"));
        }
        if self.retry.max_attempts == 0 {
            return Err(Error::BadOptions("max_attempts must be at least 1"));
        }
        if self.fetch_limit == 0 {
            return Err(Error::BadOptions("fetch_limit of 0 would never deliver"));
        }
        Ok(())
    }
}

/// A task held by one consumer under a lease, from [`RedisTimers::claim_next`].
#[derive(Debug)]
pub struct Claim {
    task: Task,
    shard: usize,
    token: String,
    lease_until_ms: u64,
}

impl Claim {
    /// The claimed task.
    pub fn task(&self) -> &Task {
        &self.task
    }

    /// When the lease runs out, by the server's clock, unless renewed.
    pub fn lease_until(&self) -> SystemTime {
        to_system(self.lease_until_ms)
    }
}

/// What [`RedisTimers::fail`] did with the task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failed {
    /// It is pending again, due after the retry policy's backoff, with the next attempt
    /// number.
    Retrying,
    /// It had its last attempt and is now a dead letter.
    Dead,
}

/// The names of one shard's keys, in the order the scripts take them.
struct ShardKeys([String; 6]);

impl ShardKeys {
    fn new(queue: &str, shard: u32) -> Self {
        let tag = format!("{{{queue}:{shard}}}");
        ShardKeys(
            ["due", "lease", "task", "meta", "token", "dead"].map(|name| format!("{tag}:{name}")),
        )
    }

    fn first(&self, n: usize) -> Vec<&str> {
        self.0[..n].iter().map(String::as_str).collect()
    }
}

/// This process's view of its shards: when each next has something claimable, the
/// claims waiting for a handler thread, and the acks waiting for a sweep.
struct Local {
    /// Fires a shard at the instant it next has something claimable.
    wheel: Wheel<usize>,
    /// Per shard: its armed wheel entry and the local instant it fires at.
    wakes: Vec<Option<(TimerKey, Instant)>>,
    /// Per shard: whether this process owns it, by the last heartbeat.
    owned: Vec<bool>,
    /// Per shard: whether its last sweep found something claimable (by the server's
    /// clock) and claimed nothing. Its own claims' leases do not count: the renewer keeps
    /// them from being claimable.
    claimable: Vec<bool>,
    /// Handler threads started, and how many of them are running a handler now.
    threads: usize,
    busy: usize,
    /// Since when every handler thread has been running a handler, and whether work
    /// waited meanwhile (a claim in `ready`, or a shard with something claimable): both
    /// cleared only when a thread comes back, so that a stuck process stays stalled after
    /// others took its work over.
    all_busy_since: Option<Instant>,
    waited: bool,
    /// Claimed tasks no handler thread has taken yet.
    ready: VecDeque<Claim>,
    /// Per shard: finished claims (id, token) whose ack no sweep has carried yet.
    acks: Vec<Vec<(Box<[u8]>, String)>>,
    /// When the oldest unsent ack finished.
    acks_since: Option<Instant>,
}

struct Inner {
    pool: Pool,
    queue: String,
    keys: Vec<ShardKeys>,
    options: RedisOptions,
    local: Mutex<Local>,
    local_changed: Condvar,
    /// The wheel's instants as wall-clock microseconds: `origin` is `origin_us`.
    origin: Instant,
    origin_us: u64,
    /// The server's clock minus this process's (`local_us`), in µs, as the last sweep
    /// measured it: from when the request left, so at least the true offset however late
    /// the reply came back. A lease judged by it is never thought held after it ran out,
    /// and a reply held up cannot make a wake late (see [`Inner::instant`]).
    offset_us: AtomicI64,
    /// How much later than the offset says a wake is armed: half the last round trip, at
    /// most [`MAX_WAKE_SHIFT_US`].
    wake_shift_us: AtomicU64,
    /// This process's name among the members: random, fresh per open.
    member: String,
    /// `{queue}:members` and `{queue}:hints`.
    members_key: String,
    hint_channel: String,
    stopping: AtomicBool,
    handlers_started: AtomicBool,
    /// Claims whose handler is running, by token, for the renewer.
    active: Mutex<HashMap<String, Held>>,
}

/// A claim this process holds, for the renewer. Only taken claims are renewed: one left
/// waiting behind busy handler threads lapses, so that another process can claim it, and
/// is then dropped here rather than run beside that process.
struct Held {
    shard: usize,
    id: Box<[u8]>,
    /// Lease expiry (server ms) as last granted.
    until_ms: u64,
    /// Whether a handler thread has taken the claim.
    taken: bool,
}

/// A checked task of a schedule call: id, payload, due ms.
type NewTask = (Box<[u8]>, Box<[u8]>, u64);

/// Durable delayed tasks in a Redis queue that many processes share.
///
/// The same calls as [`DurableTimers`](crate::DurableTimers): [`schedule`], [`cancel`],
/// [`run_handler`], [`dead_letters`], [`requeue`]; and, for consumers that manage
/// their own loop, [`claim_next`], [`renew`], [`ack`] and [`fail`]. See the crate's
/// README for what it promises and what it does not do yet.
///
/// [`schedule`]: RedisTimers::schedule
/// [`cancel`]: RedisTimers::cancel
/// [`run_handler`]: RedisTimers::run_handler
/// [`dead_letters`]: RedisTimers::dead_letters
/// [`requeue`]: RedisTimers::requeue
/// [`claim_next`]: RedisTimers::claim_next
/// [`renew`]: RedisTimers::renew
/// [`ack`]: RedisTimers::ack
/// [`fail`]: RedisTimers::fail
pub struct RedisTimers {
    inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl RedisTimers {
    /// Opens the queue named `queue` on the Redis server at `url` (for example
    /// `redis://127.0.0.1:6379/`). The name may not contain `{` or `}`, which would
    /// break the keys' hash tags. The first open records the shard count; a later open
    /// with another count is refused with [`Error::BadOptions`].
    pub fn open(url: &str, queue: &str, options: RedisOptions) -> Result<RedisTimers, Error> {
        options.validate()?;
        if queue.is_empty() || queue.contains(['{', '}']) {
            return Err(Error::BadOptions("queue name empty or containing { or }"));
        }
        let pool = Pool::new(url)?;
        let shards_key = format!("{{{queue}}}:shards");
        let recorded: u32 = pool.with(|conn| {
            redis::cmd("SET")
                .arg(&shards_key)
                .arg(options.shards)
                .arg("NX")
                .query::<()>(conn)?;
            redis::cmd("GET").arg(&shards_key).query(conn)
        })?;
        if recorded != options.shards {
            return Err(Error::BadOptions(
                "the queue was created with another shard count",
            ));
        }
        let keys = (0..options.shards)
            .map(|s| ShardKeys::new(queue, s))
            .collect();
        let origin = Instant::now();
        let origin_us = micros(SystemTime::now());
        Ok(RedisTimers {
            inner: Arc::new(Inner {
                pool,
                queue: queue.into(),
                keys,
                local: Mutex::new(Local {
                    wheel: Wheel::new(Duration::from_millis(1), origin),
                    wakes: vec![None; options.shards as usize],
                    owned: vec![false; options.shards as usize],
                    claimable: vec![false; options.shards as usize],
                    threads: 0,
                    busy: 0,
                    all_busy_since: None,
                    waited: false,
                    ready: VecDeque::new(),
                    acks: vec![Vec::new(); options.shards as usize],
                    acks_since: None,
                }),
                local_changed: Condvar::new(),
                origin,
                origin_us,
                offset_us: AtomicI64::new(0),
                wake_shift_us: AtomicU64::new(0),
                member: new_token(),
                members_key: format!("{{{queue}}}:members"),
                hint_channel: format!("{{{queue}}}:hints"),
                stopping: AtomicBool::new(false),
                handlers_started: AtomicBool::new(false),
                active: Mutex::new(HashMap::new()),
                options,
            }),
            threads: Mutex::new(Vec::new()),
        })
    }

    /// Schedules (or replaces) the task `id` to be delivered at `due`, with `payload`.
    ///
    /// Returns once the server applied it (durable as its append-only file is: see the
    /// README). Scheduling an id that is pending replaces it, from attempt 1; if a
    /// handler holds it, that handler's ack is refused and the new version stays.
    pub fn schedule(
        &self,
        id: impl AsRef<[u8]>,
        payload: impl AsRef<[u8]>,
        due: SystemTime,
    ) -> Result<(), Error> {
        self.schedule_batch([(id, payload, due)])
    }

    /// Schedules many tasks, one script call per shard and per 1,000 tasks: each call is
    /// atomic, the batch as a whole is not (a call that fails leaves the earlier ones
    /// written). Each task is checked first, so a bad one fails the batch before anything
    /// is written. A script holds the server while it runs, so calls are kept short.
    pub fn schedule_batch<I, K, P>(&self, tasks: I) -> Result<(), Error>
    where
        I: IntoIterator<Item = (K, P, SystemTime)>,
        K: AsRef<[u8]>,
        P: AsRef<[u8]>,
    {
        let mut by_shard: HashMap<usize, Vec<NewTask>> = HashMap::new();
        for (id, payload, due) in tasks {
            let (id, payload) = (id.as_ref(), payload.as_ref());
            check_task(id, payload)?;
            by_shard.entry(self.inner.shard_of(id)).or_default().push((
                id.into(),
                payload.into(),
                ceil_ms(due),
            ));
        }
        let horizon = HINT_HORIZON_MS.to_string();
        let chunks = by_shard
            .iter()
            .flat_map(|(&shard, tasks)| tasks.chunks(SCRIPT_TASKS).map(move |c| (shard, c)));
        for (shard, tasks) in chunks {
            let dues: Vec<String> = tasks.iter().map(|t| t.2.to_string()).collect();
            let shard_arg = shard.to_string();
            let mut args: Vec<&[u8]> = Vec::with_capacity(tasks.len() * 3 + 3);
            args.extend([
                self.inner.hint_channel.as_bytes(),
                shard_arg.as_bytes(),
                horizon.as_bytes(),
            ]);
            for (t, due) in tasks.iter().zip(&dues) {
                args.extend([&t.0[..], &t.1[..], due.as_bytes()]);
            }
            self.inner
                .pool
                .eval(&SCHEDULE, &self.inner.keys[shard].first(5), &args)?;
            if let Some(soonest) = tasks.iter().map(|t| t.2).min() {
                self.inner.arm_if_owned(shard, soonest);
            }
        }
        Ok(())
    }

    /// Cancels the task `id`, pending or held. Cancelling an id that is not pending does
    /// nothing. A handler already running is not stopped, but its ack or failure is
    /// refused, so the task is not retried.
    pub fn cancel(&self, id: impl AsRef<[u8]>) -> Result<(), Error> {
        let id = id.as_ref();
        check_id(id)?;
        let shard = self.inner.shard_of(id);
        self.inner
            .pool
            .eval(&CANCEL, &self.inner.keys[shard].first(5), &[id])?;
        Ok(())
    }

    /// Claims the oldest due task of any shard (a task whose lease ran out first), for a
    /// consumer running its own loop: one round trip per shard tried. The caller must
    /// [`ack`](RedisTimers::ack) or [`fail`](RedisTimers::fail) it before its lease runs
    /// out, [`renew`](RedisTimers::renew)ing it if the work takes longer.
    /// [`run_handler`](RedisTimers::run_handler) does all this itself.
    pub fn claim_next(&self) -> Result<Option<Claim>, Error> {
        let shards = self.inner.keys.len();
        let start = fastrand::usize(..shards);
        for i in 0..shards {
            let shard = (start + i) % shards;
            let token = new_token();
            let vis = self.inner.visibility_ms().to_string();
            let reply = self.inner.pool.eval(
                &CLAIM_NEXT,
                &self.inner.keys[shard].first(5),
                &[token.as_bytes(), vis.as_bytes()],
            )?;
            let reply = array(&reply)?;
            if int(reply
                .first()
                .ok_or_else(|| unexpected(&redis::Value::Nil))?)?
                == 1
            {
                let id = bytes(reply.get(5).ok_or_else(|| unexpected(&redis::Value::Nil))?)?;
                return Ok(Some(self.inner.held(shard, id, token, reply)?));
            }
        }
        Ok(None)
    }

    /// Extends the lease of `claim` by the visibility timeout from now.
    /// [`Error::LeaseLost`] if it had run out, or the task was cancelled or replaced.
    pub fn renew(&self, claim: &mut Claim) -> Result<(), Error> {
        self.check_claim(claim)?;
        let until = self
            .inner
            .renew(claim.shard, &claim.task.id, &claim.token)?;
        claim.lease_until_ms = until;
        Ok(())
    }

    /// Finishes the task: it is deleted and never delivered again. [`Error::LeaseLost`]
    /// if the lease had run out (another consumer may be running it), the task was
    /// cancelled or replaced, or the claim came from another queue; then nothing changes.
    pub fn ack(&self, claim: &Claim) -> Result<(), Error> {
        self.check_claim(claim)?;
        self.inner.ack(claim.shard, &claim.task.id, &claim.token)
    }

    /// Records a failed attempt: the task is retried after the retry policy's backoff,
    /// or becomes a dead letter after its last attempt. [`Error::LeaseLost`] as for
    /// [`ack`](RedisTimers::ack).
    pub fn fail(&self, claim: &Claim) -> Result<Failed, Error> {
        self.check_claim(claim)?;
        self.inner.fail(
            claim.shard,
            &claim.task.id,
            &claim.token,
            claim.task.attempt,
        )
    }

    /// A claim from a queue with more shards (another queue's) holds nothing here: its
    /// shard would index past this queue's keys.
    fn check_claim(&self, claim: &Claim) -> Result<(), Error> {
        if claim.shard < self.inner.keys.len() {
            Ok(())
        } else {
            Err(Error::LeaseLost)
        }
    }

    /// Runs `handler` on every due task, on `threads` threads of its own (at least one),
    /// plus a thread that keeps this process's membership alive and sweeps the shards it
    /// owns every window, one that listens for hints of tasks due soon, and one that
    /// renews the leases of claimed tasks. Each handler thread claims, when the wheel
    /// fires for a shard, up to four tasks per handler thread in one script.
    ///
    /// `Ok` acks the task. `Err` or a panic is a failure: retried after the backoff, and
    /// a dead letter after the last attempt. A task whose consumer died, or whose
    /// handler outlived a lease it could not renew, is delivered again (same attempt
    /// number), so the handler should be idempotent, keyed by [`Task::id`]. Call this
    /// once; a second call is refused.
    pub fn run_handler<F, E>(&self, threads: usize, handler: F) -> Result<(), Error>
    where
        F: Fn(&Task) -> Result<(), E> + Send + Sync + 'static,
    {
        if self.inner.handlers_started.swap(true, Ordering::AcqRel) {
            return Err(Error::BadOptions("run_handler was already called"));
        }
        let handler = Arc::new(handler);
        let threads = threads.max(1);
        self.inner.local().threads = threads;
        let batch = threads
            .saturating_mul(4)
            .min(self.inner.options.fetch_limit);
        let mut list = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        // The shards it owns are known, and the hints subscribed, before this returns: a
        // task scheduled just after is hinted to this process.
        if let Err(e) = self.inner.heartbeat() {
            eprintln!("corewheel-durable: heartbeat to redis: {e}");
        }
        let (subscribed, wait) = std::sync::mpsc::sync_channel(1);
        let inner = Arc::clone(&self.inner);
        list.push(spawn("cwr-hints", move || listener(&inner, subscribed))?);
        if wait.recv_timeout(Duration::from_secs(1)).is_err() {
            eprintln!("corewheel-durable: hints not subscribed yet; sweeps still find tasks");
        }
        let inner = Arc::clone(&self.inner);
        list.push(spawn("cwr-members", move || member(&inner))?);
        let inner = Arc::clone(&self.inner);
        list.push(spawn(RENEW_THREAD, move || renewer(&inner))?);
        for i in 0..threads {
            let inner = Arc::clone(&self.inner);
            let handler = Arc::clone(&handler);
            list.push(spawn(&format!("cwr-handler-{i}"), move || {
                consume(&inner, &*handler, batch)
            })?);
        }
        Ok(())
    }

    /// The tasks that failed their last attempt, oldest due first (an id scheduled and
    /// dead again has a dead letter for each death). The attempt is the last one made.
    pub fn dead_letters(&self) -> Result<Vec<Task>, Error> {
        let mut dead = Vec::new();
        for keys in &self.inner.keys {
            let reply = self
                .inner
                .pool
                .eval(&DEAD_LETTERS, &[keys.0[5].as_str()], &[])?;
            for letter in array(&reply)?.chunks(3) {
                let [id, payload, meta] = letter else {
                    return Err(unexpected(&reply));
                };
                let (attempt, due_ms) = parse_meta(bytes(meta)?);
                dead.push(Task {
                    id: bytes(id)?.into(),
                    payload: bytes(payload)?.into(),
                    due_ms,
                    attempt,
                    seq: 0,
                    bucket: 0,
                });
            }
        }
        dead.sort_by(|a, b| (a.due_ms, &a.id).cmp(&(b.due_ms, &b.id)));
        Ok(dead)
    }

    /// Takes the newest dead letter of `id` off the list and schedules it again, due now,
    /// from attempt 1. [`Error::NotDead`] if no dead letter has this id. Like any schedule
    /// of `id`, it replaces a pending task of that id, one an earlier requeue of another
    /// of its letters made too: requeue an id's next letter once the last one has run.
    pub fn requeue(&self, id: impl AsRef<[u8]>) -> Result<(), Error> {
        let id = id.as_ref();
        check_id(id)?;
        let shard = self.inner.shard_of(id);
        let shard_arg = shard.to_string();
        let reply = self.inner.pool.eval(
            &REQUEUE,
            &self.inner.keys[shard].first(6),
            &[id, self.inner.hint_channel.as_bytes(), shard_arg.as_bytes()],
        )?;
        if int(&reply)? == 0 {
            return Err(Error::NotDead);
        }
        self.inner.arm_if_owned(shard, self.inner.server_now_ms());
        Ok(())
    }

    /// Tasks in the queue not yet finished or dead: pending and held, all processes'.
    pub fn pending(&self) -> Result<u64, Error> {
        let mut total = 0;
        for keys in &self.inner.keys {
            let (due, lease): (u64, u64) = self.inner.pool.with(|conn| {
                redis::pipe()
                    .cmd("ZCARD")
                    .arg(&keys.0[0])
                    .cmd("ZCARD")
                    .arg(&keys.0[1])
                    .query(conn)
            })?;
            total += due + lease;
        }
        Ok(total)
    }

    /// What this process holds in memory: shards armed in its wheel (each at the instant
    /// it next has something claimable, within about two windows) plus claimed tasks
    /// waiting for a handler thread.
    pub fn in_memory(&self) -> usize {
        let local = self.inner.local();
        local.wakes.iter().flatten().count() + local.ready.len()
    }

    /// Requests this instance sent to Redis so far, from every thread: each command,
    /// script call or pipeline counts one (a script load too); hints received on the
    /// subscription count nothing.
    pub fn round_trips(&self) -> u64 {
        self.inner.pool.round_trips()
    }

    /// How many shards this process owns, by its last heartbeat (0 before
    /// [`run_handler`](RedisTimers::run_handler)).
    pub fn owned_shards(&self) -> usize {
        self.inner.local().owned.iter().filter(|&&o| o).count()
    }

    /// The queue's name.
    pub fn queue(&self) -> &str {
        &self.inner.queue
    }

    /// Stops delivering and waits for running handlers to finish and ack. Tasks not
    /// acked stay in Redis for other consumers (held ones once their lease runs out).
    pub fn close(self) -> Result<(), Error> {
        self.shutdown();
        Ok(())
    }

    fn shutdown(&self) {
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        let here = std::thread::current().id();
        // Closed from inside a handler: that one never returns before close does.
        let from_handler = threads.iter().any(|thread| thread.thread().id() == here);
        self.inner.stopping.store(true, Ordering::Release);
        // Taken and released so that no waiter is between its look at `stopping` and
        // its wait: the notification cannot be missed.
        drop(self.inner.local());
        self.inner.local_changed.notify_all();
        let stopped = !threads.is_empty();
        for thread in threads {
            // The renew thread keeps the closing handler's lease until it returns, after
            // close does: it is left to end by itself.
            let renewing_for_caller = from_handler && thread.thread().name() == Some(RENEW_THREAD);
            if thread.thread().id() != here && !renewing_for_caller {
                let _ = thread.join();
            }
        }
        if stopped {
            self.inner.leave();
        }
    }
}

impl Drop for RedisTimers {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Inner {
    fn local(&self) -> MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn active(&self) -> MutexGuard<'_, HashMap<String, Held>> {
        self.active.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Whether every handler thread has been running a handler for two windows while
    /// work waited for one: a claim in `ready`, or a shard it owns with something
    /// claimable by the server's clock. A long handler with nothing else to do is busy,
    /// not stalled.
    fn stalled(&self) -> bool {
        let mut local = self.local();
        let Some(since) = local.all_busy_since else {
            return false;
        };
        let waiting = !local.ready.is_empty()
            || (0..local.owned.len()).any(|s| local.owned[s] && local.claimable[s]);
        local.waited |= waiting;
        local.waited && since.elapsed() >= self.options.window.saturating_mul(2)
    }

    /// Whether the claim with `token` has lost its lease, as far as this process knows:
    /// a renewal was refused, or its last granted expiry has passed by the server's clock.
    fn lapsed(&self, token: &str) -> bool {
        self.active()
            .get(token)
            .is_none_or(|held| held.until_ms <= self.server_latest_ms())
    }

    /// Renews `claim`'s lease now if less than half of it is left, since the renew
    /// thread's next round may come only a third of a lease later; whether the lease is
    /// held for long enough. A renewal whose reply came back after the lease it granted
    /// ran out holds nothing: another consumer may have claimed the task since.
    fn renewed_if_late(&self, claim: &Claim) -> bool {
        let left = self.active().get(&claim.token).map_or(0, |held| {
            held.until_ms.saturating_sub(self.server_latest_ms())
        });
        if left >= self.visibility_ms() / 2 {
            return true;
        }
        match self.renew_held(claim.shard, &claim.task.id, &claim.token) {
            Ok(()) => !self.lapsed(&claim.token),
            Err(e) => {
                if !matches!(e, Error::LeaseLost) {
                    eprintln!("corewheel-durable: renewing a claim before its handler: {e}");
                }
                false
            }
        }
    }

    /// The shard of an id: a CRC32 of its bytes, so every process agrees.
    fn shard_of(&self, id: &[u8]) -> usize {
        crc32fast::hash(id) as usize % self.keys.len()
    }

    fn visibility_ms(&self) -> u64 {
        u64::try_from(self.options.visibility.as_millis()).unwrap_or(u64::MAX)
    }

    fn window_ms(&self) -> u64 {
        u64::try_from(self.options.window.as_millis()).unwrap_or(u64::MAX)
    }

    /// How far ahead a shard's next instant is armed, and a hint taken: two windows.
    fn horizon_ms(&self) -> u64 {
        self.window_ms().saturating_mul(2)
    }

    /// The local instant at which the server's clock reads `server_ms`: by the offset,
    /// which is never behind the server, moved later by the request's likely way there
    /// (half the round trip, at most [`MAX_WAKE_SHIFT_US`]), so that a wake does not come
    /// a whisker early and cost a sweep that finds nothing due yet.
    fn instant(&self, server_ms: u64) -> Instant {
        let local_us = server_ms
            .saturating_mul(1000)
            .saturating_add_signed(-self.offset_us.load(Ordering::Relaxed))
            .saturating_add(self.wake_shift_us.load(Ordering::Relaxed));
        self.origin + Duration::from_micros(local_us.saturating_sub(self.origin_us))
    }

    /// This process's clock in wall-clock µs: the wall clock read once at open, moved on
    /// by the monotonic clock since, so that a step of the wall clock (an NTP step)
    /// changes neither the server's offset nor the instants the wheel fires at.
    fn local_us(&self) -> u64 {
        let since = u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.origin_us.saturating_add(since)
    }

    /// The server's clock now, as this process estimates it (never behind it).
    fn server_now_ms(&self) -> u64 {
        self.server_now_us() / 1000
    }

    /// The same in µs, unrounded.
    fn server_now_us(&self) -> u64 {
        self.local_us()
            .saturating_add_signed(self.offset_us.load(Ordering::Relaxed))
    }

    /// Records the server's clock as a reply read it (`server_us`), for a request that
    /// left at `before` (local wall µs): the server read it after that, so the offset
    /// taken is at least the true one, whenever the reply came back. (The round trip's
    /// middle would be nearer on a symmetric network, but a reply held up would make it
    /// late by half the hold: wakes then late, leases thought held after they ran out.)
    fn measured(&self, before: u64, after: u64, server_us: i64) {
        let sent = i64::try_from(before).unwrap_or(i64::MAX);
        self.offset_us
            .store(server_us.saturating_sub(sent), Ordering::Relaxed);
        let half_trip = after.saturating_sub(before) / 2;
        self.wake_shift_us
            .store(half_trip.min(MAX_WAKE_SHIFT_US), Ordering::Relaxed);
    }

    /// The latest the server's clock can read now, rounded up: for judging whether a
    /// lease has run out, where guessing early is the safe side.
    fn server_latest_ms(&self) -> u64 {
        self.server_now_us().div_ceil(1000)
    }

    /// Arms `shard` to fire at `at` (server ms), unless it fires by then already.
    /// Compared as local instants, so that a wake armed under an older measure of the
    /// server's offset is armed again when a newer one puts it sooner.
    fn arm(&self, local: &mut Local, shard: usize, at: u64) {
        let when = self.instant(at);
        if let Some((key, armed)) = local.wakes[shard] {
            if armed <= when {
                return;
            }
            local.wheel.cancel(key);
        }
        let key = local.wheel.insert(when, shard);
        local.wakes[shard] = Some((key, when));
    }

    /// Arms `shard` for `at` if this process handles tasks, owns the shard, and `at` is
    /// within the horizon (a later one is found by a sweep).
    fn arm_if_owned(&self, shard: usize, at: u64) {
        if !self.handlers_started.load(Ordering::Acquire)
            || at > self.server_now_ms().saturating_add(self.horizon_ms())
        {
            return;
        }
        let mut local = self.local();
        if local.owned[shard] {
            self.arm(&mut local, shard, at);
            drop(local);
            self.local_changed.notify_all();
        }
    }

    /// A hint `"<shard> <due ms>"` from another process's schedule.
    fn hinted(&self, hint: &[u8]) {
        let text = String::from_utf8_lossy(hint);
        if let Some((shard, due)) = text.split_once(' ')
            && let (Ok(shard), Ok(due)) = (shard.parse::<usize>(), due.parse::<u64>())
            && shard < self.keys.len()
        {
            self.arm_if_owned(shard, due);
        }
    }

    /// Keeps this process among the queue's members and recomputes the shards it owns:
    /// each shard goes to the live member that rendezvous hashing ranks first for it.
    fn heartbeat(&self) -> Result<(), Error> {
        let ttl = self
            .window_ms()
            .saturating_mul(u64::from(HEARTBEAT_WINDOWS))
            .to_string();
        let reply = self.pool.eval(
            &HEARTBEAT,
            &[&self.members_key],
            &[self.member.as_bytes(), ttl.as_bytes()],
        )?;
        let members = array(&reply)?
            .iter()
            .map(bytes)
            .collect::<Result<Vec<&[u8]>, Error>>()?;
        let owned: Vec<bool> = (0..self.keys.len())
            .map(|shard| {
                members
                    .iter()
                    .max_by_key(|m| (rendezvous(m, shard), **m))
                    .is_some_and(|m| *m == self.member.as_bytes())
            })
            .collect();
        let mut local = self.local();
        for (shard, &mine) in owned.iter().enumerate() {
            if !mine {
                local.claimable[shard] = false;
                if let Some((key, _)) = local.wakes[shard].take() {
                    local.wheel.cancel(key);
                }
            }
        }
        local.owned = owned;
        Ok(())
    }

    /// On close: sends the acks no sweep carried, and leaves the members, so that the
    /// others take this process's shards at their next heartbeat.
    fn leave(&self) {
        let shards: Vec<usize> = {
            let local = self.local();
            (0..self.keys.len())
                .filter(|&s| !local.acks[s].is_empty())
                .collect()
        };
        for shard in shards {
            if let Err(e) = self.sweep(shard, 0) {
                // The server is not answering: each further call would wait out its own
                // timeout. The acks not sent are redelivered once their leases lapse,
                // and the membership lapses by itself.
                eprintln!("corewheel-durable: acking on close: {e}");
                return;
            }
        }
        let left = self.pool.with(|conn| {
            redis::cmd("ZREM")
                .arg(&self.members_key)
                .arg(&self.member)
                .query::<()>(conn)
        });
        if let Err(e) = left {
            eprintln!("corewheel-durable: leaving the members: {e}");
        }
    }

    /// One sweep of `shard`: sends its unsent acks, claims up to `limit` tasks claimable
    /// now into the ready queue, and arms the shard's next instant if this process owns
    /// it. Returns how many it claimed.
    fn sweep(&self, shard: usize, limit: usize) -> Result<usize, Error> {
        let acks = {
            let mut local = self.local();
            let acks = std::mem::take(&mut local.acks[shard]);
            if local.acks.iter().all(Vec::is_empty) {
                local.acks_since = None;
            }
            acks
        };
        let vis = self.visibility_ms().to_string();
        let limit_arg = limit.to_string();
        let base = new_token();
        let nacks = acks.len().to_string();
        let mut args: Vec<&[u8]> = vec![
            vis.as_bytes(),
            limit_arg.as_bytes(),
            base.as_bytes(),
            nacks.as_bytes(),
        ];
        for (id, token) in &acks {
            args.extend([&id[..], token.as_bytes()]);
        }
        // Claims held here: a task running here whose lease ran out is not work waiting
        // for a thread here. Redis judges, by its own clock, which have run out and are
        // still this process's.
        let own: Vec<(Box<[u8]>, String)> = self
            .active()
            .iter()
            .filter(|(_, held)| held.shard == shard)
            .map(|(token, held)| (held.id.clone(), token.clone()))
            .collect();
        let nown = own.len().to_string();
        args.push(nown.as_bytes());
        for (id, token) in &own {
            args.extend([&id[..], token.as_bytes()]);
        }
        let before = self.local_us();
        let reply = match self.pool.eval(&SWEEP, &self.keys[shard].first(5), &args) {
            Ok(reply) => reply,
            Err(e) => {
                // Perhaps applied, perhaps not: sent again, an applied ack is refused
                // harmlessly.
                let mut local = self.local();
                local.acks[shard].extend(acks);
                local.acks_since.get_or_insert_with(Instant::now);
                return Err(e);
            }
        };
        let parts = array(&reply)?;
        let field = |i: usize| parts.get(i).ok_or_else(|| unexpected(&reply));
        let now = int(field(0)?)?;
        let sub_ms = int(field(4)?)?;
        let after = self.local_us();
        self.measured(
            before,
            after,
            now.saturating_mul(1000).saturating_add(sub_ms),
        );
        let wake = int(field(2)?)?;
        let n = usize::try_from(int(field(3)?)?).unwrap_or(0);
        let due_now = int(field(5)?)?;
        let run_out = usize::try_from(int(field(6)?)?).unwrap_or(0);
        if parts.len() != 7 + 5 * n {
            return Err(unexpected(&reply));
        }
        let mut claims = Vec::with_capacity(n);
        for (i, record) in parts[7..].chunks(5).enumerate() {
            let [id, payload, attempt, due, until] = record else {
                return Err(unexpected(&reply));
            };
            claims.push(Claim {
                task: Task {
                    id: bytes(id)?.into(),
                    payload: bytes(payload)?.into(),
                    due_ms: u64::try_from(int(due)?).unwrap_or(0),
                    attempt: u32::try_from(int(attempt)?).unwrap_or(1),
                    seq: 0,
                    bucket: 0,
                },
                shard,
                token: format!("{base}:{}", i + 1),
                lease_until_ms: u64::try_from(int(until)?).unwrap_or(0),
            });
        }
        let now = u64::try_from(now).unwrap_or(0);
        {
            // Acked or refused, the claim is no longer this process's to renew.
            let mut active = self.active();
            for (_, token) in &acks {
                active.remove(token);
            }
            for claim in &claims {
                active.insert(
                    claim.token.clone(),
                    Held {
                        shard,
                        id: claim.task.id.clone(),
                        until_ms: claim.lease_until_ms,
                        taken: false,
                    },
                );
            }
        }
        let mut local = self.local();
        local.ready.extend(claims);
        local.claimable[shard] = n == 0 && (due_now > 0 || run_out > 0);
        if let Ok(wake) = u64::try_from(wake)
            && local.owned[shard]
            && wake <= now.saturating_add(self.horizon_ms())
        {
            self.arm(&mut local, shard, wake.max(now));
        }
        drop(local);
        self.local_changed.notify_all();
        Ok(n)
    }

    /// A claim from a `{1, payload, attempt, due, lease expiry, ...}` reply.
    fn held(
        &self,
        shard: usize,
        id: &[u8],
        token: String,
        parts: &[Value],
    ) -> Result<Claim, Error> {
        let field = |i: usize| parts.get(i).ok_or_else(|| unexpected(&Value::Nil));
        let payload = bytes(field(1)?)?;
        let attempt = u32::try_from(int(field(2)?)?).unwrap_or(1);
        let due_ms = u64::try_from(int(field(3)?)?).unwrap_or(0);
        Ok(Claim {
            task: Task {
                id: id.into(),
                payload: payload.into(),
                due_ms,
                attempt,
                seq: 0,
                bucket: 0,
            },
            shard,
            token,
            lease_until_ms: u64::try_from(int(field(4)?)?).unwrap_or(0),
        })
    }

    fn renew(&self, shard: usize, id: &[u8], token: &str) -> Result<u64, Error> {
        let vis = self.visibility_ms().to_string();
        let reply = self.pool.eval(
            &RENEW,
            &[&self.keys[shard].0[1], &self.keys[shard].0[4]],
            &[id, token.as_bytes(), vis.as_bytes()],
        )?;
        match int(&reply)? {
            0 => Err(Error::LeaseLost),
            until => Ok(u64::try_from(until).unwrap_or(0)),
        }
    }

    fn ack(&self, shard: usize, id: &[u8], token: &str) -> Result<(), Error> {
        let reply = self
            .pool
            .eval(&ACK, &self.keys[shard].first(5), &[id, token.as_bytes()])?;
        match int(&reply)? {
            1 => Ok(()),
            _ => Err(Error::LeaseLost),
        }
    }

    /// The backoff before retry `attempt + 1`, in ms. Capped at about 31 years: Lua
    /// numbers are doubles, and a due time past 2^53 ms would no longer print as the
    /// integer the scripts parse back.
    fn backoff_ms(&self, attempt: u32) -> u64 {
        u64::try_from(self.options.retry.backoff(attempt).as_millis())
            .unwrap_or(u64::MAX)
            .min(MAX_BACKOFF_MS)
    }

    fn fail(&self, shard: usize, id: &[u8], token: &str, attempt: u32) -> Result<Failed, Error> {
        let backoff = self.backoff_ms(attempt).to_string();
        let max = self.options.retry.max_attempts.to_string();
        let (shard_arg, horizon) = (shard.to_string(), HINT_HORIZON_MS.to_string());
        let reply = self.pool.eval(
            &FAIL,
            &self.keys[shard].first(6),
            &[
                id,
                token.as_bytes(),
                backoff.as_bytes(),
                max.as_bytes(),
                self.hint_channel.as_bytes(),
                shard_arg.as_bytes(),
                horizon.as_bytes(),
            ],
        )?;
        match int(&reply)? {
            1 => Ok(Failed::Retrying),
            2 => Ok(Failed::Dead),
            _ => Err(Error::LeaseLost),
        }
    }

    /// Waits up to `wait`, or until close.
    fn pause(&self, wait: Duration) {
        self.pause_until(wait, |_| self.stopping());
    }

    /// Waits up to `wait`, or until `done` holds, looked at under the local lock each time
    /// `local_changed` is notified (close notifies it after setting `stopping`).
    fn pause_until(&self, wait: Duration, done: impl Fn(&Local) -> bool) {
        let until = Instant::now() + wait;
        let mut local = self.local();
        while !done(&local) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            local = self
                .local_changed
                .wait_timeout(local, left)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// Renews the lease of the held claim `token` and records its new expiry.
    fn renew_held(&self, shard: usize, id: &[u8], token: &str) -> Result<(), Error> {
        let until = self.renew(shard, id, token)?;
        if let Some(held) = self.active().get_mut(token) {
            held.until_ms = until;
        }
        Ok(())
    }
}

/// Rendezvous hashing's rank of `member` for `shard`: every process computes the same.
fn rendezvous(member: &[u8], shard: usize) -> u64 {
    // SplitMix64's finalizer over the member's CRC32 and the shard.
    let mut x = (u64::from(crc32fast::hash(member)) << 32) ^ shard as u64;
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The members thread: every window, a heartbeat (which recomputes the shards owned),
/// then a sweep of each owned shard that sends its acks and arms its next instant. It
/// claims nothing itself, so that what a sweep finds due is claimed by a handler thread
/// through the wheel.
///
/// While every handler thread has been running a handler for two windows with work
/// waiting ([`Inner::stalled`]), it skips the heartbeat, so that its membership lapses and
/// the others take over its shards rather than leave their tasks to wait for a thread here.
fn member(inner: &Inner) {
    while !inner.stopping() {
        if inner.stalled() {
            eprintln!(
                "corewheel-durable: every handler thread busy for two windows; not renewing membership"
            );
        } else if let Err(e) = inner.heartbeat() {
            eprintln!("corewheel-durable: heartbeat to redis: {e}");
        }
        let owned: Vec<usize> = {
            let local = inner.local();
            (0..inner.keys.len()).filter(|&s| local.owned[s]).collect()
        };
        for shard in owned {
            if inner.stopping() {
                return;
            }
            if let Err(e) = inner.sweep(shard, 0) {
                eprintln!("corewheel-durable: sweeping a shard: {e}");
            }
        }
        inner.pause(inner.options.window);
    }
}

/// The hints thread: subscribed to the queue's hint channel, arms what other processes
/// schedule for soon in the shards this process owns. Reconnects after an error. Once
/// subscribed it arms every shard it owns at once: the sweep that follows finds what was
/// hinted while no one listened here (before, or while reconnecting). Says so on
/// `subscribed` the first time.
fn listener(inner: &Inner, subscribed: std::sync::mpsc::SyncSender<()>) {
    let mut first = Some(subscribed);
    while !inner.stopping() {
        let mut conn = match inner.pool.connect() {
            Ok(conn) => conn,
            Err(e) => {
                eprintln!("corewheel-durable: connecting for hints: {e}");
                inner.pause(inner.options.window);
                continue;
            }
        };
        let mut pubsub = conn.as_pubsub();
        inner.pool.count(1);
        let ready = pubsub
            .set_read_timeout(Some(SUBSCRIBE_TIMEOUT))
            .and_then(|()| pubsub.subscribe(&inner.hint_channel))
            .and_then(|()| pubsub.set_read_timeout(Some(HINT_READ_TIMEOUT)));
        if let Err(e) = ready {
            // Connected, so the server answers: tried again soon, not a window later.
            eprintln!("corewheel-durable: subscribing to hints: {e}");
            inner.pause(HINT_READ_TIMEOUT);
            continue;
        }
        let now = inner.server_now_ms();
        for shard in 0..inner.keys.len() {
            inner.arm_if_owned(shard, now);
        }
        if let Some(tx) = first.take() {
            let _ = tx.send(());
        }
        while !inner.stopping() {
            match pubsub.get_message() {
                Ok(msg) => inner.hinted(msg.get_payload_bytes()),
                Err(e) if e.is_timeout() => {}
                Err(e) => {
                    eprintln!("corewheel-durable: hints connection: {e}");
                    break;
                }
            }
        }
    }
}

/// The renew thread's name.
const RENEW_THREAD: &str = "cwr-renew";

/// The renew thread: every third of the visibility timeout, renews the lease of every
/// claim this process holds (waiting, running, or finished and not yet acked), so a live
/// consumer keeps what it holds.
fn renewer(inner: &Inner) {
    let period = inner.options.visibility / 3;
    // Handlers still running at close keep their leases until they return, one that
    // called close itself too (close does not wait for this thread then).
    let done = |local: &Local| inner.stopping() && local.busy == 0;
    while !done(&inner.local()) {
        inner.pause_until(period, done);
        let active: Vec<(String, usize, Box<[u8]>)> = inner
            .active()
            .iter()
            .filter(|(_, held)| held.taken)
            .map(|(token, held)| (token.clone(), held.shard, held.id.clone()))
            .collect();
        for (token, shard, id) in active {
            if done(&inner.local()) {
                return;
            }
            // A lost lease is left for the ack to find out. Its claim stays held until
            // its handler returns: the task runs here, and a sweep that finds its lease
            // run out must not count it as work waiting for a thread.
            match inner.renew_held(shard, &id, &token) {
                Ok(()) | Err(Error::LeaseLost) => {}
                Err(e @ Error::Redis(_)) => {
                    // Not answering: the rest would each wait out a timeout. The next
                    // round, a third of a lease later, tries again.
                    eprintln!("corewheel-durable: renewing a lease: {e}");
                    break;
                }
                Err(e) => eprintln!("corewheel-durable: renewing a lease: {e}"),
            }
        }
    }
}

/// What a handler thread does next.
enum Work {
    /// Run the handler on a claimed task.
    Run(Claim),
    /// Sweep a shard whose instant came: claim what is due.
    Sweep(usize),
    /// Send the acks that waited too long for a sweep, from these shards.
    Flush(Vec<usize>),
}

/// A handler thread: runs claimed tasks, sweeps shards when the wheel fires, and sends
/// acks no sweep carried in time.
fn consume<E>(
    inner: &Inner,
    handler: &(dyn Fn(&Task) -> Result<(), E> + Send + Sync),
    batch: usize,
) {
    let mut ran = false;
    while let Some(work) = next_work(inner, std::mem::take(&mut ran)) {
        let shards = match work {
            Work::Run(claim) => {
                ran = true;
                if inner.lapsed(&claim.token) || !inner.renewed_if_late(&claim) {
                    // Its lease ran out while it waited behind busy threads, or could
                    // not be renewed: another consumer may hold it now, so it is not
                    // run here.
                    inner.active().remove(&claim.token);
                    continue;
                }
                run(inner, claim, handler);
                continue;
            }
            Work::Sweep(shard) => vec![shard],
            Work::Flush(shards) => shards,
        };
        for shard in shards {
            // Not claimed as far as we know: the next sweep finds it again. After an
            // error the other shards' acks wait for the next flush rather than each
            // wait out a timeout now.
            if let Err(e) = inner.sweep(shard, batch) {
                eprintln!("corewheel-durable: claiming from redis: {e}");
                break;
            }
        }
    }
}

/// Runs the handler on `claim`; an ack waits for a sweep of its shard, a failure is
/// sent at once. Once closing, the ack is sent at once too: no sweep comes any more (a
/// handler may have closed the store itself).
fn run<E>(inner: &Inner, claim: Claim, handler: &(dyn Fn(&Task) -> Result<(), E> + Send + Sync)) {
    let ok = matches!(
        catch_unwind(AssertUnwindSafe(|| handler(&claim.task))),
        Ok(Ok(()))
    );
    let Claim {
        task, shard, token, ..
    } = claim;
    if ok && inner.stopping() {
        inner.active().remove(&token);
        match inner.ack(shard, &task.id, &token) {
            Ok(()) | Err(Error::LeaseLost) => {}
            Err(e) => eprintln!("corewheel-durable: acking on close: {e}"),
        }
        return;
    }
    if ok {
        let mut local = inner.local();
        local.acks[shard].push((task.id, token));
        local.acks_since.get_or_insert_with(Instant::now);
        drop(local);
        inner.local_changed.notify_all();
        return;
    }
    inner.active().remove(&token);
    match inner.fail(shard, &task.id, &token, task.attempt) {
        Ok(Failed::Retrying) => {
            // Armed here even if another process owns the shard: this one knows now.
            let at = inner
                .server_now_ms()
                .saturating_add(inner.backoff_ms(task.attempt));
            if at <= inner.server_now_ms().saturating_add(inner.horizon_ms()) {
                let mut local = inner.local();
                inner.arm(&mut local, shard, at);
                drop(local);
                inner.local_changed.notify_all();
            }
        }
        // Dead, or cancelled, replaced, or the lease lapsed: someone else's now.
        Ok(Failed::Dead) | Err(Error::LeaseLost) => {}
        Err(e) => eprintln!("corewheel-durable: failing a task: {e}"),
    }
}

/// The next thing for a handler thread to do, or `None` once closing and no claimed
/// task waits. `ran`: the thread comes back from a claim it took.
fn next_work(inner: &Inner, ran: bool) -> Option<Work> {
    // The longest a finished task waits for a sweep of its shard to carry its ack (a
    // claim there, or the members thread's sweep each window) before it is sent alone:
    // a window, or a quarter of the visibility timeout if that is shorter, so the lease
    // cannot lapse first.
    let ack_delay = inner.options.window.min(inner.options.visibility / 4);
    let mut local = inner.local();
    if ran {
        local.busy -= 1;
        local.all_busy_since = None;
        local.waited = false;
        if inner.stopping() {
            // The renew thread, once closing, waits for the last handler to return.
            inner.local_changed.notify_all();
        }
    }
    loop {
        if inner.stopping() {
            // Closing: claims still waiting for a thread are not started; their leases
            // lapse and another consumer takes them.
            for claim in local.ready.drain(..) {
                inner.active().remove(&claim.token);
            }
            return None;
        }
        if let Some(claim) = local.ready.pop_front() {
            if let Some(held) = inner.active().get_mut(&claim.token) {
                held.taken = true;
            }
            local.busy += 1;
            if local.busy == local.threads {
                local.all_busy_since = Some(Instant::now());
            }
            return Some(Work::Run(claim));
        }
        let now = Instant::now();
        if let Some(shard) = local.wheel.poll_expired(now) {
            local.wakes[shard] = None;
            return Some(Work::Sweep(shard));
        }
        let mut wait = IDLE_WAIT;
        if let Some(since) = local.acks_since {
            let flush_at = since + ack_delay;
            if flush_at <= now {
                local.acks_since = None;
                let shards = (0..local.acks.len())
                    .filter(|&s| !local.acks[s].is_empty())
                    .collect();
                return Some(Work::Flush(shards));
            }
            wait = wait.min(flush_at - now);
        }
        if let Some(at) = local.wheel.next_deadline() {
            wait = wait.min(at.saturating_duration_since(now));
        }
        local = inner
            .local_changed
            .wait_timeout(local, wait.max(Duration::from_micros(100)))
            .map(|(guard, _)| guard)
            .unwrap_or_else(|p| p.into_inner().0);
    }
}

/// Microseconds since the Unix epoch (0 before it).
fn micros(t: SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A lease token: 128 random bits, so no two claims share one.
fn new_token() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

/// `"<attempt> <due ms>"`.
fn parse_meta(meta: &[u8]) -> (u32, u64) {
    let text = String::from_utf8_lossy(meta);
    let mut parts = text.split(' ');
    let attempt = parts.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let due = parts.next().and_then(|d| d.parse().ok()).unwrap_or(0);
    (attempt, due)
}
