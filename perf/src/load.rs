//! How busy the machine was with other processes while a workload ran.
//!
//! On a small shared machine, another process that takes a CPU turns a timed loop's
//! nanoseconds into the scheduler's milliseconds (a thread that loses its CPU for a 4 ms
//! time slice in the middle of a run), so each workload's output says how much of the
//! machine other processes used meanwhile: the CPU the kernel counted busy, less this
//! process's and its children's.

use std::time::{Duration, Instant};

/// A reading at the start of a workload.
pub struct LoadMeter {
    started: Instant,
    busy: Option<Duration>,
    own: Option<Duration>,
}

impl LoadMeter {
    pub fn start() -> Self {
        Self {
            started: Instant::now(),
            busy: machine_busy(),
            own: own_cpu(),
        }
    }

    /// CPUs' worth of time other processes used since `start`, as a share of all the CPUs
    /// (0 to 1); `None` where `/proc/stat` or `getrusage` is missing.
    pub fn others_share(&self) -> Option<f64> {
        let wall = self.started.elapsed().as_secs_f64();
        let busy = machine_busy()?.saturating_sub(self.busy?).as_secs_f64();
        let own = own_cpu()?.saturating_sub(self.own?).as_secs_f64();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        (wall > 0.0).then(|| ((busy - own).max(0.0) / (wall * cpus)).min(1.0))
    }

    /// A line for under a workload's output.
    pub fn note(&self) -> Option<String> {
        let share = self.others_share()?;
        let warning = if share > 0.1 {
            ": the machine was shared, so these figures are slower and noisier than on a quiet one"
        } else {
            ""
        };
        Some(format!(
            "(other processes used {:.0}% of the CPUs while this workload ran{warning})",
            share * 100.0
        ))
    }
}

/// Busy time of all CPUs together since boot, from the first line of `/proc/stat`.
#[cfg(target_os = "linux")]
fn machine_busy() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .map(|field| field.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal ...: everything but idle and iowait.
    let busy: u64 = fields
        .iter()
        .enumerate()
        .take(8)
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, ticks)| ticks)
        .sum();
    // SAFETY: sysconf reads a configuration value and touches no memory of ours.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|&hz| hz > 0)?;
    Some(Duration::from_nanos(busy * (1_000_000_000 / hz)))
}

#[cfg(not(target_os = "linux"))]
fn machine_busy() -> Option<Duration> {
    None
}

/// CPU time of this process and of its children that have been waited for.
#[cfg(target_os = "linux")]
fn own_cpu() -> Option<Duration> {
    let usage = |who| {
        // SAFETY: an all-zero rusage is a valid value for getrusage to overwrite.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `usage` is valid and writable for the whole call.
        let rc = unsafe { libc::getrusage(who, &mut usage) };
        (rc == 0).then(|| {
            let time = |t: libc::timeval| {
                Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
            };
            time(usage.ru_utime) + time(usage.ru_stime)
        })
    };
    Some(usage(libc::RUSAGE_SELF)? + usage(libc::RUSAGE_CHILDREN)?)
}

#[cfg(not(target_os = "linux"))]
fn own_cpu() -> Option<Duration> {
    None
}

#[cfg(test)]
mod tests {
    use super::LoadMeter;

    #[cfg(target_os = "linux")]
    #[test]
    fn share_is_a_fraction() {
        let meter = LoadMeter::start();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let share = meter.others_share().expect("a reading on Linux");
        assert!((0.0..=1.0).contains(&share), "{share}");
    }
}
