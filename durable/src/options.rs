//! How a [`DurableTimers`](crate::DurableTimers) is set up.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{SystemClock, WallClock};
use crate::error::Error;

/// A callback told the id of each task whose ack has become durable.
pub type AckListener = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// When failed tasks are tried again, and when they give up.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; a task that fails this many times becomes a
    /// dead letter.
    pub max_attempts: u32,
    /// The wait after the first failure.
    pub initial_backoff: Duration,
    /// Each further failure multiplies the wait by this.
    pub multiplier: u32,
    /// The longest wait.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            initial_backoff: Duration::from_secs(1),
            multiplier: 2,
            max_backoff: Duration::from_secs(3600),
        }
    }
}

impl RetryPolicy {
    /// The wait before attempt `failed + 1`, after attempt `failed` failed.
    pub fn backoff(&self, failed: u32) -> Duration {
        let factor = self
            .multiplier
            .max(1)
            .saturating_pow(failed.saturating_sub(1));
        self.initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }
}

/// Options for [`DurableTimers::open`](crate::DurableTimers::open).
#[derive(Clone)]
pub struct Options {
    pub(crate) bucket_width: Duration,
    pub(crate) load_ahead: Duration,
    pub(crate) retry: RetryPolicy,
    pub(crate) catch_up_per_sec: Option<u32>,
    pub(crate) clock: Arc<dyn WallClock>,
    pub(crate) expected_pending: usize,
    pub(crate) on_ack: Option<AckListener>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            bucket_width: Duration::from_secs(3600),
            load_ahead: Duration::from_secs(300),
            retry: RetryPolicy::default(),
            catch_up_per_sec: None,
            clock: Arc::new(SystemClock),
            expected_pending: 1 << 20,
            on_ack: None,
        }
    }
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("bucket_width", &self.bucket_width)
            .field("load_ahead", &self.load_ahead)
            .field("retry", &self.retry)
            .field("catch_up_per_sec", &self.catch_up_per_sec)
            .field("expected_pending", &self.expected_pending)
            .finish_non_exhaustive()
    }
}

impl Options {
    /// The span of due times one bucket file holds (default one hour). Fixed for a
    /// directory's life: opening it with another width is refused.
    pub fn bucket_width(mut self, width: Duration) -> Self {
        self.bucket_width = width;
        self
    }

    /// How long before a bucket's first due time it is read into memory (default five
    /// minutes). Memory holds the tasks due within about this plus one bucket width.
    pub fn load_ahead(mut self, ahead: Duration) -> Self {
        self.load_ahead = ahead;
        self
    }

    /// Retries and dead-lettering of failed tasks.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// At most this many overdue tasks (more than a second late when they come due, as
    /// after downtime or a forward clock step) are delivered per second. Unlimited by
    /// default.
    pub fn catch_up_rate(mut self, per_sec: u32) -> Self {
        self.catch_up_per_sec = Some(per_sec);
        self
    }

    /// The wall clock due times are compared with (default [`SystemClock`]).
    pub fn clock(mut self, clock: Arc<dyn WallClock>) -> Self {
        self.clock = clock;
        self
    }

    /// Pending tasks the upsert filter is first sized for (default 2^20); it grows past
    /// this by itself. At most [`MAX_EXPECTED_PENDING`](crate::MAX_EXPECTED_PENDING)
    /// (2^30, about 1.3 GB of filter): larger values make
    /// [`open`](crate::DurableTimers::open) fail with [`Error::BadOptions`].
    pub fn expected_pending(mut self, tasks: usize) -> Self {
        self.expected_pending = tasks;
        self
    }

    /// Calls `listener` with each task's id once its ack is durable: after that the task
    /// is never delivered again. For audits and tests.
    ///
    /// The listener runs on a thread of its own, one id at a time in ack order, shortly
    /// after the ack's group commit (not on the writer thread and not on the handler
    /// thread). So it may call back into the timers, for example
    /// [`schedule`](crate::DurableTimers::schedule) a follow-up, without deadlock; a slow
    /// listener delays only later listener calls. [`close`](crate::DurableTimers::close)
    /// returns after the listener has been called for every ack written; a call it makes
    /// after close began fails with [`Error::Closed`].
    pub fn on_ack(mut self, listener: impl Fn(&[u8]) + Send + Sync + 'static) -> Self {
        self.on_ack = Some(Arc::new(listener));
        self
    }

    pub(crate) fn bucket_ms(&self) -> u64 {
        u64::try_from(self.bucket_width.as_millis()).unwrap_or(u64::MAX)
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.bucket_width < Duration::from_millis(1) {
            return Err(Error::BadOptions("bucket width under 1 ms"));
        }
        if self.retry.max_attempts == 0 {
            return Err(Error::BadOptions("max_attempts must be at least 1"));
        }
        if self.expected_pending > crate::MAX_EXPECTED_PENDING {
            return Err(Error::BadOptions(
                "expected_pending above MAX_EXPECTED_PENDING (2^30)",
            ));
        }
        if self.catch_up_per_sec == Some(0) {
            return Err(Error::BadOptions("catch-up rate of 0 would never deliver"));
        }
        Ok(())
    }
}
