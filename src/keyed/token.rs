//! Tokens that tell a key's timers apart: each `set` that arms a timer gives it a number no
//! other `set` in the process has had, stored in the key's slot and carried by the timer's
//! callback, so that a fire takes only its own slot.
//!
//! A thread reserves tokens in blocks from one process-wide counter and hands them out
//! from its block, so the counter's cache line is touched once per [`BLOCK`] sets, not per
//! set. Tokens run out after 2^64 sets in all, which no process reaches.

use std::cell::Cell;

use crate::sync::unmodelled::{AtomicU64, Ordering};

/// Tokens a thread reserves at a time.
const BLOCK: u64 = 1 << 20;

/// The next unreserved token, process-wide.
static NEXT_BLOCK: AtomicU64 = AtomicU64::new(0);

std::thread_local! {
    /// This thread's next token and the end of its block.
    static RESERVED: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// A token no other call has returned in this process.
pub(crate) fn fresh() -> u64 {
    let reserve = || {
        let start = NEXT_BLOCK.fetch_add(BLOCK, Ordering::Relaxed);
        (start, start.wrapping_add(BLOCK))
    };
    // A thread whose locals are gone (a destructor during thread exit) takes a block of
    // its own for this one token.
    RESERVED
        .try_with(|reserved| {
            let (mut next, mut end) = reserved.get();
            if next == end {
                (next, end) = reserve();
            }
            reserved.set((next + 1, end));
            next
        })
        .unwrap_or_else(|_| reserve().0)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::fresh;
    use std::collections::HashSet;

    #[test]
    #[cfg_attr(miri, ignore = "three million tokens; no unsafe code here")]
    fn tokens_are_unique_across_threads_and_blocks() {
        let per_thread = (super::BLOCK + 10) as usize;
        let threads: Vec<_> = (0..3)
            .map(|_| {
                std::thread::spawn(move || (0..per_thread).map(|_| fresh()).collect::<Vec<_>>())
            })
            .collect();
        let mut seen = HashSet::new();
        for thread in threads {
            for token in thread.join().unwrap() {
                assert!(seen.insert(token), "token {token} handed out twice");
            }
        }
        assert_eq!(seen.len(), 3 * per_thread);
    }
}
