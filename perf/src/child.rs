//! Measurements that run in a fresh child process of this same binary.
//!
//! A fresh process starts with an allocator that holds no freed pages, so its RSS delta is
//! the structure's own. The parent starts the child with `COREWHEEL_PERF_CHILD` naming the
//! measurement; the child prints its result on stdout and its progress on stderr.

use std::process::{Command, ExitCode, Stdio};

use crate::peers::Subject;
use crate::workloads::engine_live_1m::{self, EngineLiveResult};
use crate::workloads::live_1m::{self, LiveResult};

/// Set in a child's environment to the measurement it is to make.
pub const ENV: &str = "COREWHEEL_PERF_CHILD";

pub enum Error {
    /// No child could be started; the caller may measure in its own process instead.
    Spawn(String),
    /// The child ran and failed.
    Failed(String),
}

/// Measures live-1m for one subject in a child process.
pub fn run_live_1m(subject: Subject, timers: u64) -> Result<LiveResult, Error> {
    let stdout = run(live_1m::NAME, subject, timers)?;
    LiveResult::decode(&stdout).map_err(Error::Failed)
}

/// Measures engine-live-1m for one subject in a child process.
pub fn run_engine_live_1m(subject: Subject, timers: u64) -> Result<EngineLiveResult, Error> {
    let stdout = run(engine_live_1m::NAME, subject, timers)?;
    EngineLiveResult::decode(&stdout).map_err(Error::Failed)
}

/// Runs the measurement `workload` names for `subject` in a child process, and returns
/// what it printed.
fn run(workload: &str, subject: Subject, timers: u64) -> Result<String, Error> {
    let exe = std::env::current_exe().map_err(|error| Error::Spawn(error.to_string()))?;
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

/// The child's side: makes the measurement `spec` names and prints the result.
pub fn main(spec: &str) -> ExitCode {
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
    let result = match workload {
        live_1m::NAME => live_1m::measure_here(subject, timers).map(|result| result.encode()),
        engine_live_1m::NAME => {
            engine_live_1m::measure_here(subject, timers).map(|result| result.encode())
        }
        _ => {
            eprintln!("corewheel-perf: {ENV}={spec:?} names no measurement");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(encoded) => {
            print!("{encoded}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("corewheel-perf: {workload} {}: {error}", subject.name());
            ExitCode::FAILURE
        }
    }
}
