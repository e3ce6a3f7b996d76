//! The share of a process's CPU spent in timer code, from a sampled profile: `perf record`
//! attached to the process, each sample's symbol classified as timer code or not.
//!
//! The share is of all the samples the kernel lets this user take: user space and kernel
//! for root (or with `perf_event_paranoid` at 1 or less), user space only otherwise, when
//! the kernel's part of the CPU (sockets, wakeups) is left out; [`TimerShare::kernel`] says
//! which it was. A timer function inlined into its caller counts as its caller (hyper's,
//! the proxy's), so the share is a lower bound.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Symbols that are timer code: corewheel's crate, tokio's timer (its time driver and its
/// `time` module) and hyper-util's adapters of tokio's timer to hyper's.
const TIMER_SYMBOLS: [&str; 5] = [
    "corewheel::",
    "tokio::runtime::time::",
    "tokio::time::",
    "hyper_util::rt::tokio::TokioTimer",
    "hyper_util::rt::tokio::TokioSleep",
];

/// A profile's samples, and how many of them were in timer code.
#[derive(Debug, Clone, Copy)]
pub struct TimerShare {
    pub samples: u64,
    pub timer: u64,
    /// Samples in the kernel: 0 where only user space could be sampled.
    pub kernel: u64,
}

impl TimerShare {
    /// The timer's share of the samples, in percent.
    pub fn percent(self) -> f64 {
        100.0 * self.timer as f64 / self.samples.max(1) as f64
    }

    /// The kernel's share of the samples, in percent.
    pub fn kernel_percent(self) -> f64 {
        100.0 * self.kernel as f64 / self.samples.max(1) as f64
    }
}

/// Whether a (demangled) symbol is timer code.
pub fn is_timer_symbol(symbol: &str) -> bool {
    TIMER_SYMBOLS.iter().any(|pattern| symbol.contains(pattern))
}

/// Whether a sample's address (hex, as perf prints it) is in the kernel's half of the
/// x86-64 / AArch64 address space.
fn is_kernel_address(address: &str) -> bool {
    u64::from_str_radix(address, 16).is_ok_and(|address| address >= 0xffff_8000_0000_0000)
}

/// Samples process `pid` for `length` with `perf record`, and classifies the samples.
/// Fails with the reason when `perf` is missing or not allowed to attach.
pub fn timer_share(pid: u32, length: Duration) -> Result<TimerShare, String> {
    let data = data_file(pid);
    let recorded = Command::new("perf")
        .args(["record", "--quiet", "-F", "1999", "-e", "cpu-clock", "-p"])
        .arg(pid.to_string())
        .arg("-o")
        .arg(&data)
        .args(["--", "sleep"])
        .arg(format!("{:.3}", length.as_secs_f64()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("perf could not be run: {e}"))?;
    if !recorded.status.success() {
        let _ = std::fs::remove_file(&data);
        return Err(format!(
            "perf record failed ({}): {}",
            recorded.status,
            String::from_utf8_lossy(&recorded.stderr).trim()
        ));
    }
    let script = Command::new("perf")
        // `sym` alone prints nothing on some perf versions; with `ip` it is `ADDRESS SYMBOL`.
        .args(["script", "-F", "ip,sym", "-i"])
        .arg(&data)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let _ = std::fs::remove_file(&data);
    let script = script.map_err(|e| format!("perf script could not be run: {e}"))?;
    if !script.status.success() {
        return Err(format!("perf script failed ({})", script.status));
    }
    let mut share = TimerShare {
        samples: 0,
        timer: 0,
        kernel: 0,
    };
    for line in String::from_utf8_lossy(&script.stdout).lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let (address, symbol) = line.split_once(' ').unwrap_or((line, ""));
        share.samples += 1;
        if is_kernel_address(address) {
            share.kernel += 1;
        } else if is_timer_symbol(symbol) {
            share.timer += 1;
        }
    }
    if share.samples == 0 {
        return Err("perf recorded no samples".to_string());
    }
    Ok(share)
}

/// A scratch file for the samples, under the target directory (never the source tree).
fn data_file(pid: u32) -> PathBuf {
    crate::run_folder::target_dir().join(format!("perf-proxy-{pid}.data"))
}

#[cfg(test)]
mod tests {
    use super::is_timer_symbol;

    #[test]
    fn timer_symbols() {
        assert!(is_timer_symbol(
            "<corewheel::future::sleep::Sleep as core::future::future::Future>::poll"
        ));
        assert!(is_timer_symbol(
            "core::ptr::drop_in_place<corewheel::future::sleep::Sleep>"
        ));
        assert!(is_timer_symbol(
            "tokio::runtime::time::wheel::Wheel::insert"
        ));
        assert!(is_timer_symbol(
            "<hyper_util::rt::tokio::TokioSleep as core::future::future::Future>::poll"
        ));
        assert!(!is_timer_symbol(
            "<corewheel_proxy::idle_io::IdleIo<S,T> as tokio::io::async_read::AsyncRead>::poll_read"
        ));
        assert!(!is_timer_symbol("hyper_util::rt::tokio::TokioIo<T>::new"));
        assert!(!is_timer_symbol("[unknown]"));
    }

    #[test]
    fn kernel_addresses() {
        assert!(super::is_kernel_address("ffffffff816d6b9c"));
        assert!(!super::is_kernel_address("7f92f5674350"));
        assert!(!super::is_kernel_address("[unknown]"));
    }
}
