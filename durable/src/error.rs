//! The crate's error type.

use std::fmt;
use std::io;

/// Why an operation on [`DurableTimers`](crate::DurableTimers) failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The id is empty or longer than [`MAX_ID_LEN`](crate::MAX_ID_LEN) bytes.
    BadId {
        /// The id's length in bytes.
        len: usize,
    },
    /// The payload is longer than [`MAX_PAYLOAD_LEN`](crate::MAX_PAYLOAD_LEN) bytes.
    PayloadTooLarge {
        /// The payload's length in bytes.
        len: usize,
    },
    /// Another process (or another `DurableTimers` in this one) holds the directory.
    Locked,
    /// The directory was created with another bucket width; a journal's buckets cannot be
    /// re-cut without rewriting it.
    BucketWidthMismatch {
        /// The width the directory was created with, in milliseconds.
        on_disk_ms: u64,
        /// The width the options asked for, in milliseconds.
        requested_ms: u64,
    },
    /// The directory holds a file this version cannot read.
    BadFormat(String),
    /// An option is out of range.
    BadOptions(&'static str),
    /// No dead letter has this id.
    NotDead,
    /// The timers were closed.
    Closed,
    /// The lease of a claimed task ran out (or the task was cancelled or replaced) before
    /// this ack, fail or renewal: another consumer may have it now, so the call changed
    /// nothing. Only the Redis store has leases.
    #[cfg(feature = "redis")]
    LeaseLost,
    /// The Redis server refused a command or could not be reached. A write that failed
    /// this way may or may not have been applied.
    #[cfg(feature = "redis")]
    Redis(redis::RedisError),
    /// The disk refused a write or an fsync (a full disk among them). Nothing acknowledged
    /// before is harmed; the records of the failed call may or may not survive a crash.
    Io(io::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadId { len } => write!(
                f,
                "task id of {len} bytes: ids must be 1 to {} bytes",
                crate::MAX_ID_LEN
            ),
            Error::PayloadTooLarge { len } => write!(
                f,
                "payload of {len} bytes exceeds {} bytes",
                crate::MAX_PAYLOAD_LEN
            ),
            Error::Locked => f.write_str("the directory is in use by another DurableTimers"),
            Error::BucketWidthMismatch {
                on_disk_ms,
                requested_ms,
            } => write!(
                f,
                "directory uses {on_disk_ms} ms buckets, options ask for {requested_ms} ms"
            ),
            Error::BadFormat(what) => write!(f, "unreadable journal: {what}"),
            Error::BadOptions(what) => write!(f, "bad options: {what}"),
            Error::NotDead => f.write_str("no dead letter with this id"),
            Error::Closed => f.write_str("the durable timers are closed"),
            #[cfg(feature = "redis")]
            Error::LeaseLost => f.write_str("the task's lease ran out before this call"),
            #[cfg(feature = "redis")]
            Error::Redis(e) => write!(f, "redis: {e}"),
            Error::Io(e) => write!(f, "journal I/O: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            #[cfg(feature = "redis")]
            Error::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

/// Copies an error for every waiter of a failed group commit (`io::Error` is not `Clone`).
pub(crate) fn share(e: &Error) -> Error {
    match e {
        Error::Io(io) => Error::Io(io::Error::new(io.kind(), io.to_string())),
        Error::Closed => Error::Closed,
        other => Error::BadFormat(other.to_string()),
    }
}

#[cfg(feature = "redis")]
impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(e)
    }
}
