//! The seam between the timer logic and where records live.
//!
//! [`Journal`](crate::journal::Journal) is the embedded implementation. The seam is narrow
//! (append and fsync pre-encoded records, read a bucket back, drop a finished bucket) so
//! that another backend, such as a Redis store shared by several processes, can slot in
//! without touching the window, the writer or the consumers.

use std::collections::BTreeMap;
use std::io;

use crate::record::Record;

/// Where a record goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Target {
    /// The time bucket starting at this many milliseconds after the Unix epoch.
    Bucket(u64),
    /// The cancel and upsert log (tombstones).
    Control,
    /// The dead-letter log.
    Dead,
}

/// A bucket found at open.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BucketInfo {
    pub start_ms: u64,
    /// No task record in the bucket has a smaller sequence number.
    pub min_seq: u64,
}

/// Durable storage for the records of one timer directory.
pub(crate) trait Store: Send + Sync {
    /// This open's number: sequence numbers of this run start at `epoch << SEQ_BITS`.
    fn epoch(&self) -> u64;
    /// The buckets on disk when the store was opened.
    fn buckets(&self) -> io::Result<Vec<BucketInfo>>;
    /// Hands every valid record of a bucket to `each`, in the order written per segment,
    /// without holding the bucket in memory.
    fn read_bucket(&self, start_ms: u64, each: &mut dyn FnMut(Record)) -> io::Result<()>;
    /// Every valid record of the control or dead-letter log.
    fn read_log(&self, target: Target) -> io::Result<Vec<Record>>;
    /// Appends the encoded records to their targets and makes them durable. Returns how
    /// many files were fsynced. On error, the records of this call may or may not be
    /// durable, and everything appended before is intact.
    fn append(&self, writes: &BTreeMap<Target, Vec<u8>>) -> io::Result<usize>;
    /// Deletes a bucket whose tasks are all finished.
    fn delete_bucket(&self, start_ms: u64) -> io::Result<()>;
    /// Deletes control segments whose tombstones all have sequence numbers below `seq`.
    fn prune_control(&self, seq: u64) -> io::Result<()>;
    /// Replaces the dead-letter log with `live` (its dead letters not requeued), in one
    /// step a crash cannot cut: after it, the old log or the new one. Only before the
    /// writer starts.
    fn rewrite_dead(&self, live: &[Record]) -> io::Result<()>;
    /// Damaged spans in segments that reads have passed over since open.
    fn damaged_spans(&self) -> u64;
}

/// Low bits of a sequence number that count within one open; the high bits are the epoch.
pub(crate) const SEQ_BITS: u32 = 40;
