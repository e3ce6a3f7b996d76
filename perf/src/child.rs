//! Measurements that run in a fresh child process of this same binary.
//!
//! A fresh process starts with an allocator that holds no freed pages, so its RSS delta is
//! the structure's own. The parent starts the child with `COREWHEEL_PERF_CHILD` naming the
//! measurement; the child prints its result on stdout and its progress on stderr.

//!
//! This module knows no workload: the parent names one and decodes what the child printed,
//! and the child's side is handed the function that makes the measurement.

use std::path::Path;
use std::process::{Command, ExitCode, Stdio};

use crate::peers::Subject;

/// Set in a child's environment to the measurement it is to make.
pub const ENV: &str = "COREWHEEL_PERF_CHILD";

pub enum Error {
    /// No child could be started; the caller may measure in its own process instead.
    Spawn(String),
    /// The child ran and failed.
    Failed(String),
}

/// Runs the measurement `workload` names for `subject` in a child process, and returns
/// what it printed.
pub fn run(workload: &str, subject: Subject, timers: u64) -> Result<String, Error> {
    let exe = std::env::current_exe().map_err(|error| Error::Spawn(error.to_string()))?;
    run_in(&exe, workload, subject, timers)
}

/// As [`run`], in the executable `exe` (another build of this harness).
pub fn run_in(exe: &Path, workload: &str, subject: Subject, timers: u64) -> Result<String, Error> {
    let output = Command::new(exe)
        .env(ENV, format!("{workload} {} {timers}", subject.name()))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|error| Error::Spawn(error.to_string()))?;
    if !output.status.success() {
        return Err(Error::Failed(format!(
            "the child process failed ({})",
            output.status
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// What a child makes: the encoded result of the measurement a workload names for a
/// subject and a size, `None` when no workload of that name measures in a child.
pub type Measure = fn(&str, Subject, u64) -> Option<Result<String, String>>;

/// The child's side: makes the measurement `spec` names with `measure` and prints the
/// result.
pub fn main(spec: &str, measure: Measure) -> ExitCode {
    let mut words = spec.split_whitespace();
    let (Some(workload), Some(subject), Some(timers), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        eprintln!("corewheel-perf: {ENV}={spec:?} names no measurement");
        return ExitCode::from(2);
    };
    let (Some(subject), Ok(timers)) = (Subject::parse(subject), timers.parse()) else {
        eprintln!("corewheel-perf: {ENV}={spec:?} names no measurement");
        return ExitCode::from(2);
    };
    match measure(workload, subject, timers) {
        None => {
            eprintln!("corewheel-perf: {ENV}={spec:?} names no measurement");
            ExitCode::from(2)
        }
        Some(Ok(encoded)) => {
            print!("{encoded}");
            ExitCode::SUCCESS
        }
        Some(Err(error)) => {
            eprintln!("corewheel-perf: {workload} {}: {error}", subject.name());
            ExitCode::FAILURE
        }
    }
}

/// Whether this process is a child the harness started to make one measurement.
pub fn is_child() -> bool {
    std::env::var_os(ENV).is_some()
}
