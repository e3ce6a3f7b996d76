//! Durable delayed tasks on a [`corewheel`] wheel: business delays (cancel an
//! order unpaid after 30 minutes, confirm a shipment after 7 days, retry in an hour) that
//! survive a crash, fire to the millisecond, and keep millions pending in little memory.
//!
//! ```no_run
//! use corewheel_durable::{DurableTimers, Options};
//! use std::time::{Duration, SystemTime};
//!
//! let timers = DurableTimers::open("/var/lib/orders/timers", Options::default())?;
//! timers.run_handler(4, |task| {
//!     println!("order {} unpaid: cancelling", String::from_utf8_lossy(task.id()));
//!     Ok::<(), std::io::Error>(())
//! })?;
//! timers.schedule("order-42", b"", SystemTime::now() + Duration::from_secs(30 * 60))?;
//! // Paid in time:
//! timers.cancel("order-42")?;
//! # Ok::<(), corewheel_durable::Error>(())
//! ```
//!
//! # Guarantees
//! - **Durable.** When [`schedule`](DurableTimers::schedule),
//!   [`schedule_batch`](DurableTimers::schedule_batch) or
//!   [`cancel`](DurableTimers::cancel) returns `Ok`, its effect survives a crash.
//!   Concurrent calls share one fsync (group commit).
//! - **Never early.** A task is delivered once the wall clock reads its due time (rounded
//!   up to the millisecond), never before.
//! - **At least once, and never again after an ack.** A task is finished only once its
//!   handler returned `Ok` and that ack is durable. A task whose handler was running at a
//!   crash is delivered again after the next open, with the same attempt number; an acked
//!   task never is.
//! - **Retries and dead letters.** A failed task is tried again after the
//!   [`RetryPolicy`]'s backoff; after `max_attempts` it goes to the
//!   [dead letters](DurableTimers::dead_letters), from which it can be
//!   [requeued](DurableTimers::requeue).
//! - **Memory follows the window.** Only buckets within [`Options::load_ahead`] of their
//!   start are in memory, in the wheel; further tasks are on disk, and memory holds only
//!   a Bloom filter of their ids (about 1.2 bytes a task) for upserts.
//!
//! # Wall-clock steps
//! Due times are wall-clock times, so the wall clock is the reference. If it steps
//! forwards, every task due in the skipped span is due at once and is delivered as after
//! downtime (oldest first, at the catch-up rate). If it steps backwards, tasks already
//! delivered stay delivered, and the rest wait until the clock reads their due time
//! again: the wheel's time restarts at the new reading, so nothing fires early by the
//! clock as it now reads. Buckets are only deleted once their span is past by the clock.
//!
//! # Storage
//! An append-only journal cut into time buckets (one folder of segments per
//! [`Options::bucket_width`], an hour by default), with a CRC32 on every record. Each open
//! writes new segments, so a torn tail from a crash is cut where the checksum fails
//! when the segment is read, and is never followed by good records. Bytes damaged
//! inside a segment lose only what they held: the valid records after them are read,
//! and [`DurableTimers::damaged_spans`] counts the damage. A
//! bucket whose tasks are all finished is deleted whole. Cancels and upserts write a
//! tombstone to a control log, dropped once no bucket can hold an older version. A full
//! disk fails the call that needed the write ([`Error::Io`]) and harms nothing
//! acknowledged before.
//!
//! # A queue shared by several processes
//! With the `redis` feature, `RedisTimers` keeps the tasks in Redis instead, where the
//! instances of a service share one queue: each due task is claimed by one consumer under
//! a renewed lease, and comes back if that consumer dies. The crate's README says what it
//! promises and what it does not do yet.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod bloom;
mod clock;
mod consumer;
mod dispatcher;
mod error;
mod journal;
mod loader;
mod options;
mod record;
#[cfg(feature = "redis")]
mod redis_store;
mod shared;
mod store;
mod task;
mod timers;
mod window;
mod writer;

pub use clock::{ManualWallClock, SystemClock, WallClock};
pub use error::Error;
pub use options::{AckListener, Options, RetryPolicy};
#[cfg(feature = "redis")]
pub use redis_store::{Claim, Failed, MAX_SHARDS, RedisOptions, RedisTimers};
pub use task::Task;
pub use timers::DurableTimers;

/// The longest task id, in bytes.
pub const MAX_ID_LEN: usize = 1024;
/// The largest payload, in bytes.
pub const MAX_PAYLOAD_LEN: usize = 1 << 20;
/// The largest [`Options::expected_pending`]: 2^30 ids, a first filter of about 1.3 GB.
/// Larger sizes are refused with [`Error::BadOptions`] rather than risk an allocation
/// that cannot succeed; the filter still grows past this by itself.
pub const MAX_EXPECTED_PENDING: usize = 1 << 30;
