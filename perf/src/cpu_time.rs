//! CPU time: the calling thread's, the whole process's, and that of the threads whose name
//! starts with a prefix (the engine's workers).
//!
//! fire-storm spends most of its wall time asleep waiting for deadlines, so wall time says
//! nothing about cost there. Every fire-storm subject runs its driving loop on the calling
//! thread (the tokio runtime included, as current_thread), so this thread's CPU time is the
//! whole cost of firing for each of them.
//!
//! The engine workloads run on several threads, some of them the engine's own workers, so
//! they report process CPU time beside wall time: what the work cost the machine in all,
//! whichever thread did it.

use std::time::Duration;

#[cfg(target_os = "linux")]
fn clock(id: libc::clockid_t) -> Option<Duration> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec for the whole call.
    let rc = unsafe { libc::clock_gettime(id, &mut now) };
    if rc != 0 {
        return None;
    }
    Some(Duration::new(
        u64::try_from(now.tv_sec).ok()?,
        u32::try_from(now.tv_nsec).ok()?,
    ))
}

/// This thread's CPU time so far, or `None` where the clock is not available.
#[cfg(target_os = "linux")]
pub fn thread_cpu_time() -> Option<Duration> {
    clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// This thread's CPU time so far, or `None` where the clock is not available.
#[cfg(not(target_os = "linux"))]
pub fn thread_cpu_time() -> Option<Duration> {
    None
}

/// CPU time of every thread of this process so far, those that have exited included.
#[cfg(target_os = "linux")]
pub fn process_cpu_time() -> Option<Duration> {
    clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// CPU time of every thread of this process so far; `None` off Linux.
#[cfg(not(target_os = "linux"))]
pub fn process_cpu_time() -> Option<Duration> {
    None
}

/// Whether a thread name is `prefix` followed by a number (`corewheel-0`), which the
/// harness's own threads (`corewheel-perf`, and unnamed threads, which inherit it) are not.
pub fn is_numbered(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()))
}

/// The summed CPU time of this process's live threads named `prefix` and a number, from
/// `/proc/self/task/*/schedstat` (nanoseconds on the CPU). `None` where that is missing or
/// no thread matches.
#[cfg(target_os = "linux")]
pub fn named_threads_cpu_time(prefix: &str) -> Option<Duration> {
    let mut total = 0u64;
    let mut found = false;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let path = task.path();
        let Ok(name) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        if !is_numbered(name.trim_end(), prefix) {
            continue;
        }
        let Ok(schedstat) = std::fs::read_to_string(path.join("schedstat")) else {
            continue;
        };
        if let Some(ns) = schedstat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
        {
            total += ns;
            found = true;
        }
    }
    found.then(|| Duration::from_nanos(total))
}

/// The summed CPU time of this process's threads named `prefix` and a number; `None` off
/// Linux.
#[cfg(not(target_os = "linux"))]
pub fn named_threads_cpu_time(_prefix: &str) -> Option<Duration> {
    None
}

/// Context switches (voluntary and not) of this process's live threads so far, from
/// `/proc/self/task/*/status`: how often its threads went to sleep or were put off the
/// CPU, which at light load is mostly how often they woke. `None` where that is missing.
#[cfg(target_os = "linux")]
pub fn process_context_switches() -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        total += status
            .lines()
            .filter(|line| line.contains("ctxt_switches"))
            .filter_map(|line| line.split_whitespace().last()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    Some(total)
}

/// Context switches of this process's threads; `None` off Linux.
#[cfg(not(target_os = "linux"))]
pub fn process_context_switches() -> Option<u64> {
    None
}

/// `later - earlier`, when both readings exist.
pub fn cpu_between(earlier: Option<Duration>, later: Option<Duration>) -> Option<Duration> {
    Some(later?.saturating_sub(earlier?))
}

#[cfg(test)]
mod tests {
    use super::{is_numbered, named_threads_cpu_time, process_cpu_time, thread_cpu_time};

    #[test]
    fn numbered_names() {
        assert!(is_numbered("corewheel-0", "corewheel-"));
        assert!(is_numbered("corewheel-15", "corewheel-"));
        assert!(!is_numbered("corewheel-perf", "corewheel-"));
        assert!(!is_numbered("corewheel-", "corewheel-"));
    }

    /// The spinner spins for 20 ms of its own CPU time, not of wall time, and says when it
    /// is done: on a loaded machine 20 ms of wall time may hold almost no CPU time.
    #[cfg(target_os = "linux")]
    #[test]
    fn named_threads_are_found_and_their_time_counted() {
        let before = process_cpu_time().expect("a process CPU clock");
        let (spun_tx, spun) = std::sync::mpsc::channel();
        let spinner = std::thread::Builder::new()
            .name("cpu-time-test-1".to_string())
            .spawn(move || {
                let mut x = 0u64;
                while thread_cpu_time().expect("a thread CPU clock")
                    < std::time::Duration::from_millis(20)
                {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                spun_tx.send(()).expect("the main thread waits");
                // Stay alive (and named) until the main thread has looked.
                std::thread::park();
                x
            })
            .expect("a thread");
        spun.recv_timeout(std::time::Duration::from_secs(60))
            .expect("the spinner got 20 ms of CPU within a minute");
        let named = named_threads_cpu_time("cpu-time-test-").expect("the named thread");
        assert!(named >= std::time::Duration::from_millis(5), "{named:?}");
        assert!(named_threads_cpu_time("no-such-thread-name").is_none());
        spinner.thread().unpark();
        spinner.join().expect("joined");
        assert!(process_cpu_time().expect("a process CPU clock") > before);
    }
}
