//! The process's resident set size, read from `/proc/self/statm`.
//!
//! RSS counts the pages the allocator has touched and not given back, so it shows what a
//! structure really costs the machine, slack and fragmentation included. It also depends on
//! the allocator's policy for returning memory, which is why live-1m measures each subject
//! in a fresh process and names the allocator beside the numbers.

/// Resident bytes now, or `None` where `/proc` is missing (any OS but Linux).
#[cfg(target_os = "linux")]
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_size())
}

/// Resident bytes now, or `None` where `/proc` is missing (any OS but Linux).
#[cfg(not(target_os = "linux"))]
pub fn resident_bytes() -> Option<u64> {
    None
}

#[cfg(target_os = "linux")]
fn page_size() -> u64 {
    // SAFETY: sysconf reads a configuration value and touches no memory of ours.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    // statm counts in pages of this size; 4 KiB is the answer on every platform we run on,
    // should sysconf ever fail.
    u64::try_from(size)
        .ok()
        .filter(|&size| size > 0)
        .unwrap_or(4096)
}

/// Bytes of this process's anonymous memory that sit on transparent huge pages, from
/// `/proc/self/smaps_rollup`.
///
/// On a virtual machine a TLB miss costs a two-dimensional page walk, so whether a
/// structure's memory landed on 2 MiB pages can change a cache-missing operation's cost
/// several times over. The kernel decides that, not the structure, so the output reports it.
#[cfg(target_os = "linux")]
pub fn huge_page_bytes() -> Option<u64> {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = rollup
        .lines()
        .find_map(|line| line.strip_prefix("AnonHugePages:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024)
}

/// Bytes of this process's anonymous memory on transparent huge pages; `None` off Linux.
#[cfg(not(target_os = "linux"))]
pub fn huge_page_bytes() -> Option<u64> {
    None
}
