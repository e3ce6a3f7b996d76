//! CPU time the calling thread has used.
//!
//! fire-storm spends most of its wall time asleep waiting for deadlines, so wall time says
//! nothing about cost there. Every fire-storm subject runs its driving loop on the calling
//! thread (the tokio runtime included, as current_thread), so this thread's CPU time is the
//! whole cost of firing for each of them.

use std::time::Duration;

/// This thread's CPU time so far, or `None` where the clock is not available.
#[cfg(target_os = "linux")]
pub fn thread_cpu_time() -> Option<Duration> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec for the whole call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    if rc != 0 {
        return None;
    }
    Some(Duration::new(
        u64::try_from(now.tv_sec).ok()?,
        u32::try_from(now.tv_nsec).ok()?,
    ))
}

/// This thread's CPU time so far, or `None` where the clock is not available.
#[cfg(not(target_os = "linux"))]
pub fn thread_cpu_time() -> Option<Duration> {
    None
}
