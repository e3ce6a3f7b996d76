//! corewheel-perf: the million-timer workload harness.
//!
//! Runs each workload against corewheel's `Wheel` and real peer crates in one process run,
//! and prints a table per workload plus `perf/results/latest.csv`. This file holds the
//! command line and the order things run in; each workload lives in its own file.

mod allocator;
mod child;
mod cpu_time;
mod peers;
mod repeat;
mod report;
mod rng;
mod rss;
mod workloads;

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use peers::Subject;
use report::{Csv, thousands};
use workloads::{Sizes, Workload, arm_cancel, fire_storm, live_1m, not_yet, reset_heavy};

/// More than this would not fit a 24 GiB machine in any subject, and a mistyped zero should
/// not turn into an out-of-memory kill.
const MAX_TIMERS: u64 = 100_000_000;

const HELP: &str = "\
corewheel-perf: the million-timer workload harness

Runs corewheel's Wheel and its peers (tokio-util DelayQueue, std BinaryHeap) through the
same workloads in one run, prints a table per workload and writes perf/results/latest.csv.

USAGE:
    cargo run --release -p corewheel-perf -- [OPTIONS]

OPTIONS:
    --workloads LIST   comma-separated, default all:
                       arm-cancel, live-1m, reset-heavy, fire-storm, burst-steal, steady-mix
    --peers LIST       comma-separated subjects, default all:
                       corewheel, delay-queue, binary-heap
                       (tokio-sleep and pingora-timeout: not yet, they need the multi-core engine)
    --timers N         timers for live-1m and fire-storm (default 1,000,000;
                       --full: 10,000,000 for live-1m)
    --full             full sizes: 20M arm-cancel ops, 10M live-1m timers, 20M resets
    -h, --help         this text

arm-cancel, live-1m and reset-heavy report the median of 3 runs per subject; live-1m
runs each in a fresh child process so that RSS deltas are the subject's own.
Build with --features system-alloc to measure on the system allocator instead of mimalloc.
";

#[derive(Debug, PartialEq)]
struct Options {
    workloads: Vec<Workload>,
    subjects: Vec<Subject>,
    timers: Option<u64>,
    full: bool,
}

#[derive(Debug, PartialEq)]
enum Command {
    Run(Options),
    Help,
}

fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<Command, String> {
    let mut options = Options {
        workloads: Workload::ALL.to_vec(),
        subjects: Subject::ALL.to_vec(),
        timers: None,
        full: false,
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let arg = arg
            .into_string()
            .map_err(|arg| format!("argument {arg:?} is not valid UTF-8"))?;
        // Accept both `--flag value` and `--flag=value`.
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_string(), Some(value.to_string()))
            }
            _ => (arg, None),
        };
        let mut value = |flag: &str| -> Result<String, String> {
            match inline.clone() {
                Some(value) => Ok(value),
                None => args
                    .next()
                    .ok_or_else(|| format!("{flag} needs a value"))?
                    .into_string()
                    .map_err(|value| format!("{flag} value {value:?} is not valid UTF-8")),
            }
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--full" if inline.is_some() => return Err("--full takes no value".to_string()),
            "--full" => options.full = true,
            "--workloads" => {
                options.workloads = parse_list(&value("--workloads")?, "workload", parse_workload)?
            }
            "--peers" => options.subjects = parse_list(&value("--peers")?, "peer", parse_subject)?,
            "--timers" => options.timers = Some(parse_timers(&value("--timers")?)?),
            _ if flag.starts_with('-') => return Err(format!("unknown option {flag}")),
            _ => return Err(format!("unexpected argument {flag:?}")),
        }
    }
    Ok(Command::Run(options))
}

/// Parses a comma-separated list, keeping the first occurrence of each name.
fn parse_list<T: PartialEq>(
    list: &str,
    what: &str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    let mut items = Vec::new();
    for name in list
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
    {
        let item = parse(name)?;
        if !items.contains(&item) {
            items.push(item);
        }
    }
    if items.is_empty() {
        return Err(format!("the {what} list is empty"));
    }
    Ok(items)
}

fn parse_workload(name: &str) -> Result<Workload, String> {
    Workload::parse(name).ok_or_else(|| {
        let known: Vec<&str> = Workload::ALL
            .iter()
            .map(|workload| workload.name())
            .collect();
        format!("unknown workload {name:?} (known: {})", known.join(", "))
    })
}

fn parse_subject(name: &str) -> Result<Subject, String> {
    if let Some((_, what)) = peers::NOT_YET.iter().find(|(peer, _)| *peer == name) {
        return Err(format!(
            "peer {name:?} ({what}) is not measured yet: its multi-thread workloads come with the multi-core engine"
        ));
    }
    Subject::parse(name).ok_or_else(|| {
        let known: Vec<&str> = Subject::ALL.iter().map(|subject| subject.name()).collect();
        format!("unknown peer {name:?} (known: {})", known.join(", "))
    })
}

fn parse_timers(text: &str) -> Result<u64, String> {
    // Allow 1_000_000 and 1,000,000 as people write them.
    let digits: String = text.chars().filter(|c| !matches!(c, '_' | ',')).collect();
    match digits.parse::<u64>() {
        Ok(timers) if (1..=MAX_TIMERS).contains(&timers) => Ok(timers),
        Ok(_) => Err(format!(
            "--timers must be between 1 and {}, not {text}",
            thousands(MAX_TIMERS)
        )),
        Err(_) => Err(format!("--timers needs a whole number, not {text:?}")),
    }
}

fn print_header(options: &Options) {
    let cpus = std::thread::available_parallelism()
        .map_or_else(|_| "unknown".to_string(), |cpus| cpus.get().to_string());
    println!("corewheel-perf: the million-timer workload harness");
    println!("machine:   {cpus} CPUs available to this process");
    println!("allocator: {}", allocator::NAME);
    if cfg!(debug_assertions) {
        println!("WARNING:   debug build: the numbers mean nothing; use cargo run --release");
    }
    println!(
        "sizes:     {} (--full for the full sizes, --timers N for live-1m and fire-storm)",
        if options.full { "full" } else { "default" }
    );
    println!("subjects:");
    for subject in &options.subjects {
        println!("  {:<16}{}", subject.name(), subject.describe());
    }
    for (peer, what) in peers::NOT_YET {
        println!(
            "  {peer:<16}not yet: {what}; multi-thread and async workloads come with the multi-core engine"
        );
    }
    println!("workloads:");
    for workload in &options.workloads {
        println!("  {:<16}{}", workload.name(), workload.summary());
    }
    println!();
}

fn main() -> ExitCode {
    if let Ok(spec) = std::env::var(child::ENV) {
        return child::main(&spec);
    }
    let options = match parse_args(std::env::args_os().skip(1)) {
        Ok(Command::Run(options)) => options,
        Ok(Command::Help) => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("corewheel-perf: {message}");
            eprintln!("Try --help for the options.");
            return ExitCode::from(2);
        }
    };
    let sizes = Sizes::new(options.full, options.timers);
    print_header(&options);

    let subjects = &options.subjects;
    let mut csv = Csv::default();
    for workload in &options.workloads {
        match workload {
            Workload::ArmCancel => arm_cancel::run(subjects, sizes.arm_cancel_ops, &mut csv),
            Workload::Live1m => live_1m::run(subjects, sizes.live_timers, &mut csv),
            Workload::ResetHeavy => reset_heavy::run(subjects, sizes.reset_ops, &mut csv),
            Workload::FireStorm => fire_storm::run(subjects, sizes.storm_timers, &mut csv),
            Workload::BurstSteal => not_yet::burst_steal(),
            Workload::SteadyMix => not_yet::steady_mix(),
        }
    }

    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("results")
        .join("latest.csv");
    match csv.write(&path) {
        Ok(()) => {
            println!("CSV: {}", path.display());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!(
                "corewheel-perf: could not write {}: {error}",
                path.display()
            );
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Command, Options, parse_args};
    use crate::peers::Subject;
    use crate::workloads::Workload;

    fn parse(args: &[&str]) -> Result<Command, String> {
        parse_args(args.iter().map(|arg| arg.into()))
    }

    #[test]
    fn defaults_run_everything() {
        let Ok(Command::Run(options)) = parse(&[]) else {
            panic!("no arguments should run");
        };
        assert_eq!(options.workloads, Workload::ALL);
        assert_eq!(options.subjects, Subject::ALL);
        assert_eq!(options.timers, None);
        assert!(!options.full);
    }

    #[test]
    fn lists_sizes_and_flags() {
        assert_eq!(
            parse(&[
                "--workloads",
                "fire-storm,arm-cancel",
                "--peers=corewheel",
                "--timers",
                "100_000",
                "--full"
            ]),
            Ok(Command::Run(Options {
                workloads: vec![Workload::FireStorm, Workload::ArmCancel],
                subjects: vec![Subject::Corewheel],
                timers: Some(100_000),
                full: true,
            }))
        );
        assert_eq!(parse(&["--full", "-h"]), Ok(Command::Help));
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        for args in [
            &["--bogus"][..],
            &["extra"],
            &["--timers"],
            &["--timers", "0"],
            &["--timers", "lots"],
            &["--timers", "999999999999"],
            &["--workloads", "nope"],
            &["--workloads", ","],
            &["--peers", "tokio-sleep"],
            &["--full=yes"],
        ] {
            assert!(parse(args).is_err(), "{args:?} should be rejected");
        }
    }
}
