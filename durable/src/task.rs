//! A task as its handler sees it.

use std::time::SystemTime;

use crate::clock::to_system;

/// A due task handed to a handler, or a dead letter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub(crate) id: Box<[u8]>,
    pub(crate) payload: Box<[u8]>,
    pub(crate) due_ms: u64,
    pub(crate) attempt: u32,
    pub(crate) seq: u64,
    pub(crate) bucket: u64,
}

impl Task {
    /// The caller-chosen id: the key for idempotent downstream work, since a task whose
    /// handler was cut short by a crash is delivered again.
    pub fn id(&self) -> &[u8] {
        &self.id
    }

    /// The bytes given at schedule time.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// When the task was due, to the millisecond (a retry's due time is that of the
    /// retry).
    pub fn due(&self) -> SystemTime {
        to_system(self.due_ms)
    }

    /// Which attempt this is, from 1. A redelivery after a crash repeats the attempt
    /// number; a retry after a failure increases it.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}
