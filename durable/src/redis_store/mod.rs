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
//! `due` sorted set. Each process running handlers fetches, once per
//! [`RedisOptions::window`] and per shard, the ids due within two windows, and arms them
//! in its local wheel. When the wheel fires, a handler thread claims the task with one
//! script: it moves the task from `due` to `lease` (expiry = server now + visibility)
//! under a fresh token, but only if the task is due by the server's clock and nobody
//! holds it, so of all the processes that armed it exactly one wins. The lease is renewed
//! while the handler runs; an ack deletes the task only if the lease is still that
//! token's; a failure puts it back with a backoff, or among the dead letters. A lease
//! that runs out (the consumer died) puts the task back at its next fetch.

mod conn;
mod scripts;

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use corewheel::{TimerKey, Wheel};

use self::conn::{Pool, Script, array, bytes, int, unexpected};
use crate::clock::{ceil_ms, floor_ms, to_system};
use crate::error::Error;
use crate::options::RetryPolicy;
use crate::task::Task;
use crate::timers::{check_id, check_task, spawn};

static SCHEDULE: Script = Script::new(scripts::SCHEDULE);
static CANCEL: Script = Script::new(scripts::CANCEL);
static FETCH: Script = Script::new(scripts::FETCH);
static CLAIM: Script = Script::new(scripts::CLAIM);
static CLAIM_NEXT: Script = Script::new(scripts::CLAIM_NEXT);
static RENEW: Script = Script::new(scripts::RENEW);
static ACK: Script = Script::new(scripts::ACK);
static FAIL: Script = Script::new(scripts::FAIL);
static REQUEUE: Script = Script::new(scripts::REQUEUE);

/// The most shards a queue may have.
pub const MAX_SHARDS: u32 = 16_384;

/// The longest backoff the scripts are given, in ms (about 31 years).
const MAX_BACKOFF_MS: u64 = 1_000_000_000_000;

/// The longest a handler thread sleeps between looks at its wheel, so that close is
/// noticed promptly.
const IDLE_WAIT: Duration = Duration::from_millis(20);

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

    /// How often each handling process fetches what is due soon, per shard (default one
    /// second); it fetches two windows ahead, so a task is armed in the wheel before it
    /// is due. An idle queue costs one round trip per shard per window.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// How long a claim holds a task before another consumer may take it (default 30 s).
    /// Renewed every third of this while the handler runs, so it bounds how long a dead
    /// consumer's tasks wait, not how long a handler may take.
    pub fn visibility(mut self, visibility: Duration) -> Self {
        self.visibility = visibility;
        self
    }

    /// Retries and dead-lettering of failed tasks.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The most tasks one fetch returns per shard (default 10 000). When a fetch is full
    /// the next one comes without waiting a window.
    pub fn fetch_limit(mut self, limit: usize) -> Self {
        self.fetch_limit = limit;
        self
    }

    fn validate(&self) -> Result<(), Error> {
        if self.shards == 0 || self.shards > MAX_SHARDS {
            return Err(Error::BadOptions("shards must be 1 to MAX_SHARDS"));
        }
        if self.window < Duration::from_millis(1) {
            return Err(Error::BadOptions("window under 1 ms"));
        }
        if self.visibility < Duration::from_millis(30) {
            return Err(Error::BadOptions("visibility under 30 ms"));
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

/// The outcome of one claim attempt by id.
enum Claimed {
    Held(Claim),
    /// Due only in this many milliseconds by the server's clock.
    Early(u64),
    /// Cancelled, acked, or held by another consumer.
    Gone,
}

/// The names of one shard's keys, in the order the scripts take them.
struct ShardKeys([String; 7]);

impl ShardKeys {
    fn new(queue: &str, shard: u32) -> Self {
        let tag = format!("{{{queue}:{shard}}}");
        ShardKeys(
            ["due", "lease", "task", "meta", "token", "dead", "deadmeta"]
                .map(|name| format!("{tag}:{name}")),
        )
    }

    fn first(&self, n: usize) -> Vec<&str> {
        self.0[..n].iter().map(String::as_str).collect()
    }
}

/// This process's wheel of tasks due soon: ids only, since the claim fetches the
/// payload.
struct Local {
    wheel: Wheel<Box<[u8]>>,
    /// Each armed id's wheel key and due time (server ms), so that a fetch arms an id
    /// once and re-arms it if its due time moved.
    armed: HashMap<Box<[u8]>, (TimerKey, u64)>,
}

struct Inner {
    pool: Pool,
    queue: String,
    keys: Vec<ShardKeys>,
    options: RedisOptions,
    local: Mutex<Local>,
    local_changed: Condvar,
    /// The wheel's instants as wall-clock milliseconds: `origin` is `origin_ms`.
    origin: Instant,
    origin_ms: u64,
    /// The server's clock minus this machine's, in ms, as the last fetch measured it.
    offset_ms: AtomicI64,
    stopping: AtomicBool,
    handlers_started: AtomicBool,
    /// Claims whose handler is running, by token, for the renewer.
    active: Mutex<HashMap<String, Held>>,
}

/// A running handler's claim, for the renewer: its shard and task id.
type Held = (usize, Box<[u8]>);

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
        let origin_ms = floor_ms(SystemTime::now());
        Ok(RedisTimers {
            inner: Arc::new(Inner {
                pool,
                queue: queue.into(),
                keys,
                options,
                local: Mutex::new(Local {
                    wheel: Wheel::new(Duration::from_millis(1), origin),
                    armed: HashMap::new(),
                }),
                local_changed: Condvar::new(),
                origin,
                origin_ms,
                offset_ms: AtomicI64::new(0),
                stopping: AtomicBool::new(false),
                handlers_started: AtomicBool::new(false),
                active: Mutex::new(HashMap::new()),
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

    /// Schedules many tasks, one script call per shard: atomic within a shard, not across
    /// shards. Each is checked first, so a bad one fails the call before anything is
    /// written.
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
        for (shard, tasks) in by_shard {
            let dues: Vec<String> = tasks.iter().map(|t| t.2.to_string()).collect();
            let mut args: Vec<&[u8]> = Vec::with_capacity(tasks.len() * 3);
            for (t, due) in tasks.iter().zip(&dues) {
                args.extend([&t.0[..], &t.1[..], due.as_bytes()]);
            }
            self.inner
                .pool
                .eval(&SCHEDULE, &self.inner.keys[shard].first(5), &args)?;
            for (id, _, due) in tasks {
                self.inner.arm_if_soon(id, due);
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
        let until = self
            .inner
            .renew(claim.shard, &claim.task.id, &claim.token)?;
        claim.lease_until_ms = until;
        Ok(())
    }

    /// Finishes the task: it is deleted and never delivered again. [`Error::LeaseLost`]
    /// if the lease had run out (another consumer may be running it) or the task was
    /// cancelled or replaced; then nothing changes.
    pub fn ack(&self, claim: &Claim) -> Result<(), Error> {
        self.inner.ack(claim.shard, &claim.task.id, &claim.token)
    }

    /// Records a failed attempt: the task is retried after the retry policy's backoff,
    /// or becomes a dead letter after its last attempt. [`Error::LeaseLost`] as for
    /// [`ack`](RedisTimers::ack).
    pub fn fail(&self, claim: &Claim) -> Result<Failed, Error> {
        self.inner.fail(
            claim.shard,
            &claim.task.id,
            &claim.token,
            claim.task.attempt,
        )
    }

    /// Runs `handler` on every due task, on `threads` threads of its own (at least one),
    /// plus a thread that fetches what is due soon into this process's wheel and one that
    /// renews the leases of running handlers.
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
        let mut list = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        let inner = Arc::clone(&self.inner);
        list.push(spawn("cwr-fetch", move || fetcher(&inner))?);
        let inner = Arc::clone(&self.inner);
        list.push(spawn("cwr-renew", move || renewer(&inner))?);
        for i in 0..threads.max(1) {
            let inner = Arc::clone(&self.inner);
            let handler = Arc::clone(&handler);
            list.push(spawn(&format!("cwr-handler-{i}"), move || {
                consume(&inner, &*handler)
            })?);
        }
        Ok(())
    }

    /// The tasks that failed their last attempt, oldest due first. The attempt is the
    /// last one made.
    pub fn dead_letters(&self) -> Result<Vec<Task>, Error> {
        let mut dead = Vec::new();
        for keys in &self.inner.keys {
            type Map = HashMap<Vec<u8>, Vec<u8>>;
            let (payloads, metas): (Map, Map) = self.inner.pool.with(|conn| {
                redis::pipe()
                    .atomic()
                    .cmd("HGETALL")
                    .arg(&keys.0[5])
                    .cmd("HGETALL")
                    .arg(&keys.0[6])
                    .query(conn)
            })?;
            for (id, payload) in payloads {
                let (attempt, due_ms) = metas.get(&id).map(|m| parse_meta(m)).unwrap_or((1, 0));
                dead.push(Task {
                    id: id.into(),
                    payload: payload.into(),
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

    /// Takes the dead letter `id` off the list and schedules it again, due now, from
    /// attempt 1. [`Error::NotDead`] if no dead letter has this id.
    pub fn requeue(&self, id: impl AsRef<[u8]>) -> Result<(), Error> {
        let id = id.as_ref();
        check_id(id)?;
        let shard = self.inner.shard_of(id);
        let reply = self
            .inner
            .pool
            .eval(&REQUEUE, &self.inner.keys[shard].first(7), &[id])?;
        if int(&reply)? == 0 {
            return Err(Error::NotDead);
        }
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

    /// Tasks armed in this process's wheel: those due within about two windows.
    pub fn in_memory(&self) -> usize {
        self.inner.local().armed.len()
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
        self.inner.stopping.store(true, Ordering::Release);
        self.inner.local_changed.notify_all();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for thread in threads {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
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

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
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

    /// The local instant at which the server's clock reads `server_ms`.
    fn instant(&self, server_ms: u64) -> Instant {
        let local_ms = server_ms.saturating_add_signed(-self.offset_ms.load(Ordering::Relaxed));
        self.origin + Duration::from_millis(local_ms.saturating_sub(self.origin_ms))
    }

    /// The server's clock now, as this process estimates it.
    fn server_now_ms(&self) -> u64 {
        floor_ms(SystemTime::now()).saturating_add_signed(self.offset_ms.load(Ordering::Relaxed))
    }

    /// Arms `id` in the wheel for `due` (server ms), unless it is armed for that already.
    fn arm(&self, local: &mut Local, id: Box<[u8]>, due: u64) {
        if let Some((key, armed_due)) = local.armed.get(&id) {
            if *armed_due == due {
                return;
            }
            local.wheel.cancel(*key);
        }
        let key = local.wheel.insert(self.instant(due), id.clone());
        local.armed.insert(id, (key, due));
    }

    /// A task this process scheduled for within the fetch horizon is armed at once, so
    /// that it is not a window late; other processes' tasks wait for the next fetch.
    fn arm_if_soon(&self, id: Box<[u8]>, due: u64) {
        if self.handlers_started.load(Ordering::Acquire)
            && due <= self.server_now_ms().saturating_add(2 * self.window_ms())
        {
            let mut local = self.local();
            self.arm(&mut local, id, due);
            drop(local);
            self.local_changed.notify_all();
        }
    }

    fn claim(&self, id: &[u8]) -> Result<Claimed, Error> {
        let shard = self.shard_of(id);
        let token = new_token();
        let vis = self.visibility_ms().to_string();
        let reply = self.pool.eval(
            &CLAIM,
            &self.keys[shard].first(5),
            &[id, token.as_bytes(), vis.as_bytes()],
        )?;
        let parts = array(&reply)?;
        match parts.first().map(int).transpose()? {
            Some(1) => Ok(Claimed::Held(self.held(shard, id, token, parts)?)),
            Some(-1) => {
                let wait = parts.get(1).map(int).transpose()?.unwrap_or(1);
                Ok(Claimed::Early(u64::try_from(wait).unwrap_or(1)))
            }
            Some(0) => Ok(Claimed::Gone),
            _ => Err(unexpected(&reply)),
        }
    }

    /// A claim from a `{1, payload, attempt, due, lease expiry, ...}` reply.
    fn held(
        &self,
        shard: usize,
        id: &[u8],
        token: String,
        parts: &[redis::Value],
    ) -> Result<Claim, Error> {
        let field = |i: usize| parts.get(i).ok_or_else(|| unexpected(&redis::Value::Nil));
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

    fn fail(&self, shard: usize, id: &[u8], token: &str, attempt: u32) -> Result<Failed, Error> {
        // Capped at about 31 years: Lua numbers are doubles, and a due time past 2^53 ms
        // would no longer print as the integer the scripts parse back.
        let backoff = u64::try_from(self.options.retry.backoff(attempt).as_millis())
            .unwrap_or(u64::MAX)
            .min(MAX_BACKOFF_MS)
            .to_string();
        let max = self.options.retry.max_attempts.to_string();
        let reply = self.pool.eval(
            &FAIL,
            &self.keys[shard].first(7),
            &[id, token.as_bytes(), backoff.as_bytes(), max.as_bytes()],
        )?;
        match int(&reply)? {
            1 => Ok(Failed::Retrying),
            2 => Ok(Failed::Dead),
            _ => Err(Error::LeaseLost),
        }
    }

    /// One fetch of a shard: arms what is due within two windows. Returns whether the
    /// fetch was full, so more may be due.
    fn fetch(&self, shard: usize) -> Result<bool, Error> {
        let ahead = self.window_ms().saturating_mul(2).to_string();
        let limit = self.options.fetch_limit.to_string();
        let before = floor_ms(SystemTime::now());
        let reply = self.pool.eval(
            &FETCH,
            &self.keys[shard].first(5),
            &[ahead.as_bytes(), limit.as_bytes()],
        )?;
        let after = floor_ms(SystemTime::now());
        let parts = array(&reply)?;
        let server_now = parts.first().map(int).transpose()?.unwrap_or(0);
        // The server read its clock about halfway through the round trip.
        let local_mid = i64::try_from(before / 2 + after / 2).unwrap_or(i64::MAX);
        self.offset_ms
            .store(server_now.saturating_sub(local_mid), Ordering::Relaxed);
        let mut local = self.local();
        let mut count = 0;
        for pair in parts[1..].chunks(2) {
            let [id, due] = pair else {
                return Err(unexpected(&reply));
            };
            let due = u64::try_from(int(due)?).unwrap_or(0);
            self.arm(&mut local, bytes(id)?.into(), due);
            count += 1;
        }
        drop(local);
        self.local_changed.notify_all();
        Ok(count >= self.options.fetch_limit)
    }

    /// Waits up to `wait`, or until close.
    fn pause(&self, wait: Duration) {
        let local = self.local();
        if !self.stopping() {
            let _ = self.local_changed.wait_timeout(local, wait);
        }
    }
}

/// The fetch thread: every window, arms what each shard has due within two windows.
fn fetcher(inner: &Inner) {
    while !inner.stopping() {
        let mut full = false;
        for shard in 0..inner.keys.len() {
            match inner.fetch(shard) {
                Ok(f) => full |= f,
                Err(e) => eprintln!("corewheel-durable: fetching from redis: {e}"),
            }
        }
        let wait = if full {
            Duration::from_millis(1)
        } else {
            inner.options.window
        };
        let until = Instant::now() + wait;
        while !inner.stopping() && Instant::now() < until {
            inner.pause(until.saturating_duration_since(Instant::now()));
        }
    }
}

/// The renew thread: every third of the visibility timeout, renews the lease of every
/// running handler's task, so a live consumer keeps what it holds.
fn renewer(inner: &Inner) {
    let period = inner.options.visibility / 3;
    while !inner.stopping() {
        let until = Instant::now() + period;
        while !inner.stopping() && Instant::now() < until {
            inner.pause(until.saturating_duration_since(Instant::now()));
        }
        let active: Vec<(String, usize, Box<[u8]>)> = inner
            .active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(token, (shard, id))| (token.clone(), *shard, id.clone()))
            .collect();
        for (token, shard, id) in active {
            // A lost lease is left for the handler's ack to find out.
            if let Err(Error::Redis(e)) = inner.renew(shard, &id, &token) {
                eprintln!("corewheel-durable: renewing a lease: {e}");
            }
        }
    }
}

/// A handler thread: takes what its wheel fires, claims it, runs the handler, and acks
/// or fails it.
fn consume<E>(inner: &Inner, handler: &(dyn Fn(&Task) -> Result<(), E> + Send + Sync)) {
    while let Some(id) = next_fired(inner) {
        let claim = match inner.claim(&id) {
            Ok(Claimed::Held(claim)) => claim,
            Ok(Claimed::Early(ms)) => {
                // Our estimate of the server's clock ran ahead: wait the rest in the
                // wheel. A task now due much later is left for a later fetch.
                if ms <= inner.window_ms().saturating_mul(2) {
                    let due = inner.server_now_ms().saturating_add(ms);
                    let mut local = inner.local();
                    let key = local
                        .wheel
                        .insert(Instant::now() + Duration::from_millis(ms), id.clone());
                    // A fetch may have armed it again meanwhile: one wheel entry per id.
                    if let Some((stale, _)) = local.armed.insert(id, (key, due)) {
                        local.wheel.cancel(stale);
                    }
                }
                continue;
            }
            Ok(Claimed::Gone) => continue,
            Err(e) => {
                // Not claimed as far as we know: another process's wheel, or our next
                // fetch, delivers it.
                eprintln!("corewheel-durable: claiming a task: {e}");
                continue;
            }
        };
        inner
            .active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(claim.token.clone(), (claim.shard, claim.task.id.clone()));
        let ok = matches!(
            catch_unwind(AssertUnwindSafe(|| handler(&claim.task))),
            Ok(Ok(()))
        );
        inner
            .active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&claim.token);
        let done = if ok {
            inner.ack(claim.shard, &claim.task.id, &claim.token)
        } else {
            inner
                .fail(
                    claim.shard,
                    &claim.task.id,
                    &claim.token,
                    claim.task.attempt,
                )
                .map(|_| ())
        };
        match done {
            // Cancelled, replaced, or the lease lapsed: the task is someone else's now.
            Ok(()) | Err(Error::LeaseLost) => {}
            Err(e) => eprintln!("corewheel-durable: finishing a task: {e}"),
        }
    }
}

/// The next id the wheel fires, or `None` once closing.
fn next_fired(inner: &Inner) -> Option<Box<[u8]>> {
    let mut local = inner.local();
    loop {
        if inner.stopping() {
            return None;
        }
        let now = Instant::now();
        if let Some(id) = local.wheel.poll_expired(now) {
            local.armed.remove(&id);
            return Some(id);
        }
        let wait = local
            .wheel
            .next_deadline()
            .map_or(IDLE_WAIT, |at| at.saturating_duration_since(now))
            .clamp(Duration::from_micros(100), IDLE_WAIT);
        local = inner
            .local_changed
            .wait_timeout(local, wait)
            .map(|(guard, _)| guard)
            .unwrap_or_else(|p| p.into_inner().0);
    }
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
