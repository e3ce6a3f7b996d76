//! What the operating system says about this process and the machine: CPU time (the calling thread's, the process's,
//! and that of threads named with a prefix), context switches, resident memory, huge pages, and how busy other
//! processes kept the CPUs. Linux only; elsewhere every reading is `None` and the tables say `n/a`. Wall time says
//! nothing of work that sleeps or that other threads do (an engine's workers), so the workloads read CPU time.

use std::time::{Duration, Instant};

fn clock(id: libc::clockid_t) -> Option<Duration> {
    // SAFETY: an all-zero timespec is a valid value, and `now` is valid and writable for the whole call.
    let mut now: libc::timespec = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::clock_gettime(id, &mut now) };
    (rc == 0).then(|| Duration::new(now.tv_sec as u64, now.tv_nsec as u32))
}

pub fn thread_cpu_time() -> Option<Duration> {
    clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time of every thread of this process so far, those that have exited included.
pub fn process_cpu_time() -> Option<Duration> {
    clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// `later - earlier`, when both readings exist.
pub fn cpu_between(earlier: Option<Duration>, later: Option<Duration>) -> Option<Duration> {
    Some(later?.saturating_sub(earlier?))
}

/// Whether a thread name is `prefix` followed by a number (`corewheel-0`), which `corewheel-perf` is not.
pub fn is_numbered(name: &str, prefix: &str) -> bool {
    let rest = name.strip_prefix(prefix);
    rest.is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()))
}

/// Each live thread of process `pid` (`self` for this one): its name and a file of its `/proc` folder.
fn tasks(pid: &str, file: &str) -> Vec<(String, String)> {
    let read = |task: std::fs::DirEntry| {
        let read = |name| std::fs::read_to_string(task.path().join(name)).ok();
        Some((read("comm")?.trim_end().to_string(), read(file)?))
    };
    let entries = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter();
    entries.flatten().flatten().filter_map(read).collect()
}

/// Summed CPU time (from `schedstat`) of process `pid`'s live threads whose name passes `keep`; `None` where that is
/// missing or no thread passes.
pub fn threads_cpu_time(pid: &str, keep: impl Fn(&str) -> bool) -> Option<Duration> {
    let kept = tasks(pid, "schedstat").into_iter().filter(|(n, _)| keep(n));
    let times: Vec<u64> = kept
        .filter_map(|(_, stat)| stat.split_whitespace().next()?.parse().ok())
        .collect();
    (!times.is_empty()).then(|| Duration::from_nanos(times.iter().sum()))
}

/// The summed CPU time of this process's live threads named `prefix` and a number.
pub fn named_threads_cpu_time(prefix: &str) -> Option<Duration> {
    threads_cpu_time("self", |name| is_numbered(name, prefix))
}

/// Context switches (voluntary and not) of this process's live threads so far.
pub fn process_context_switches() -> Option<u64> {
    let tasks = tasks("self", "status");
    let lines = tasks.iter().flat_map(|(_, status)| status.lines());
    let switches = lines.filter(|line| line.contains("ctxt_switches"));
    let switches = switches.filter_map(|line| line.split_whitespace().last()?.parse::<u64>().ok());
    (!tasks.is_empty()).then(|| switches.sum())
}

/// Resident bytes now, from `/proc/self/statm`.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads a configuration value and touches no memory of ours.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096))
}

/// Bytes of this process's anonymous memory on transparent huge pages: on a virtual machine whether a structure
/// landed on them can change a cache-missing operation's cost several times over, and the kernel decides it.
pub fn huge_page_bytes() -> Option<u64> {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = rollup
        .lines()
        .find_map(|line| line.strip_prefix("AnonHugePages:"))?;
    Some(line.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()? * 1024)
}

/// Waits until the CPU clock `cpu` advances by less than 5% of `interval` over one `interval` (at most `limit`): the
/// threads it counts have done what was left them, which no count shows. Returns its reading then.
pub fn wait_until_quiet(
    cpu: fn() -> Option<Duration>,
    interval: Duration,
    limit: Duration,
) -> Option<Duration> {
    let (started, mut last) = (Instant::now(), cpu()?);
    loop {
        std::thread::sleep(interval);
        let now = cpu()?;
        if now.saturating_sub(last) < interval / 20 || started.elapsed() > limit {
            return Some(now);
        }
        last = now;
    }
}

/// Busy time of all CPUs together since boot, from the first line of `/proc/stat`: every field but idle and iowait.
fn machine_busy() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let fields = line.split_whitespace().take(8).enumerate();
    let busy = fields
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, ticks)| ticks.parse::<u64>().ok());
    let busy = busy.sum::<Option<u64>>()?;
    // SAFETY: sysconf reads a configuration value (the clock ticks a second /proc counts in) and touches no memory.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|&hz| hz > 0)?;
    Some(Duration::from_nanos(busy * (1_000_000_000 / hz)))
}

/// CPU time of this process and of its children that have been waited for.
fn own_cpu() -> Option<Duration> {
    let usage = |who| {
        // SAFETY: an all-zero rusage is a valid value for getrusage to overwrite, valid and writable for the call.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::getrusage(who, &mut usage) };
        let time = |t: libc::timeval| {
            Duration::new(t.tv_sec as u64, 0) + Duration::from_micros(t.tv_usec as u64)
        };
        (rc == 0).then(|| time(usage.ru_utime) + time(usage.ru_stime))
    };
    Some(usage(libc::RUSAGE_SELF)? + usage(libc::RUSAGE_CHILDREN)?)
}

/// How busy other processes kept the machine while a workload ran: on a small shared machine another process that
/// takes a CPU turns a timed loop's nanoseconds into the scheduler's milliseconds, so each workload's output says so.
pub struct LoadMeter(Instant, Option<Duration>, Option<Duration>);

impl LoadMeter {
    pub fn start() -> Self {
        Self(Instant::now(), machine_busy(), own_cpu())
    }

    /// CPU time other processes used since `start`, as a share of all the CPUs (0 to 1).
    pub fn others_share(&self) -> Option<f64> {
        let wall = self.0.elapsed().as_secs_f64();
        let busy = machine_busy()?.saturating_sub(self.1?).as_secs_f64();
        let own = own_cpu()?.saturating_sub(self.2?).as_secs_f64();
        let cpus = crate::peers::engine::cpus() as f64;
        (wall > 0.0).then(|| ((busy - own).max(0.0) / (wall * cpus)).min(1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads named with a prefix and a number are found and their CPU time counted (the spinner spins for 20 ms of
    /// its own CPU time: on a loaded machine 20 ms of wall time may hold almost none); the harness's own are not.
    #[test]
    fn named_threads_are_found_and_their_time_counted() {
        assert!(
            is_numbered("corewheel-15", "corewheel-")
                && !is_numbered("corewheel-perf", "corewheel-")
        );
        assert!(!is_numbered("corewheel-", "corewheel-"));
        let (before, meter) = (
            process_cpu_time().expect("a process CPU clock"),
            LoadMeter::start(),
        );
        let (spun_tx, spun) = std::sync::mpsc::channel();
        let spin = move || {
            while thread_cpu_time().expect("a thread CPU clock") < Duration::from_millis(20) {
                std::hint::spin_loop();
            }
            spun_tx.send(()).expect("the main thread waits");
            std::thread::park();
        };
        let spinner = std::thread::Builder::new()
            .name("cpu-time-test-1".to_string())
            .spawn(spin);
        let spinner = spinner.expect("a thread");
        spun.recv_timeout(Duration::from_secs(60))
            .expect("20 ms of CPU within a minute");
        let named = named_threads_cpu_time("cpu-time-test-").expect("the named thread");
        assert!(
            named >= Duration::from_millis(5)
                && named_threads_cpu_time("no-such-thread-name").is_none()
        );
        spinner.thread().unpark();
        spinner.join().expect("joined");
        assert!(process_cpu_time().expect("a process CPU clock") > before);
        assert!((0.0..=1.0).contains(&meter.others_share().expect("a reading on Linux")));
    }
}
