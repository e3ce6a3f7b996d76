//! corewheel-perf: the million-timer workload harness.
//!
//! Runs each workload against corewheel's `Wheel` and real peer crates in one process run,
//! prints a table per workload, and writes the run's CSV, plots and summary into a folder
//! of its own (see `run_folder`). This file holds the command line and the order things
//! run in; each workload lives in its own file.

mod allocator;
mod child;
mod cpu_time;
mod load;
mod peers;
mod plots;
mod profile;
mod progress;
mod proxy_process;
mod repeat;
mod report;
mod rng;
mod rss;
mod run_folder;
mod unstable_build;
mod workloads;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use peers::Subject;
use report::{Csv, thousands};
use workloads::{
    Sizes, Workload, arm_cancel, async_timers, burst_steal, engine_arm_cancel, engine_live_1m,
    engine_reset, fire_storm, keyed, live_1m, proxy, reset_heavy, steady_mix,
};

/// More than this would not fit a 24 GiB machine in any subject, and a mistyped zero should
/// not turn into an out-of-memory kill.
const MAX_TIMERS: u64 = 100_000_000;

/// Most application threads the engine workloads take.
const MAX_THREADS: usize = 1024;

/// Largest window of requests in flight per thread.
const MAX_WINDOW: usize = 10_000_000;

/// Most timers a second steady-mix may be asked to arm, and most seconds it may run.
const MAX_MIX_RATE: usize = 1_000_000_000;
const MAX_MIX_SECONDS: usize = 3_600;

/// Most operations per thread an async workload's run may be asked for.
const MAX_ASYNC_OPS: usize = 1_000_000_000;

const HELP: &str = "\
corewheel-perf: the million-timer workload harness

Runs corewheel's Wheel and its peers (tokio-util DelayQueue, std BinaryHeap) through the
same single-thread workloads, and corewheel's multi-core TimerEngine against tokio's sleep
and timeout(), pingora-timeout and a Mutex<BinaryHeap> shared by all threads through the
engine-* workloads from 1..N threads and steady-mix, and corewheel's async layer against
tokio (its default timer and its alternative timer), async-io and pingora-timeout through
the async-* workloads from 1..N threads, in one run; prints a table per workload and writes the run's results.csv, SVG plots and summary.md into a folder of its
own, target/perf-runs/<UTC date and time>/ (under CARGO_TARGET_DIR where that is set),
whose path it prints at the end. Nothing in the source tree changes unless --save asks.

USAGE:
    cargo run --release -p corewheel-perf -- [OPTIONS]

OPTIONS:
    --workloads LIST   comma-separated, default all but proxy:
                       arm-cancel, engine-arm-cancel, live-1m, engine-live-1m,
                       reset-heavy, engine-reset, fire-storm, burst-steal, steady-mix,
                       light-load,
                       async-sleep, async-timeout, async-reset,
                       keyed-set-remove, keyed-set-over, keyed-move, and proxy (only
                       when named: corewheel-proxy under load on loopback, on
                       corewheel-async and tokio, in about two minutes; save it with
                       --save perf/results/proxy)
    --peers LIST       comma-separated subjects, default all:
                       corewheel, delay-queue, binary-heap (single-thread workloads),
                       engine (also fire-storm), tokio-sleep (engine-* workloads, steady-mix, light-load),
                       mutex-heap (engine-arm-cancel, engine-reset, steady-mix, light-load),
                       tokio-timeout, pingora-timeout (engine-arm-cancel only),
                       corewheel-async, tokio, tokio-alt, async-io, pingora-timeout
                       (async-* workloads; tokio-alt runs in a copy of the harness that
                       the run builds with --cfg tokio_unstable under
                       <target>/tokio-unstable, a minute or two the first time),
                       keyed, mutex-map, delay-queue-map, dashmap, scc (keyed-*)
    --threads LIST     application threads for engine-arm-cancel, engine-reset, the
                       async-* and the keyed-* workloads, comma-separated (default 1 up to the CPU count)
    --windows LIST     requests in flight per thread for engine-arm-cancel, comma-separated
                       (default 16,10000; 0 = arm then cancel at once)
    --timers N         timers for live-1m, engine-live-1m, fire-storm and steady-mix (default
                       1,000,000; --full: 10,000,000 for live-1m and engine-live-1m)
    --mix-rate N       timers armed per second in steady-mix, all threads together
                       (default 1,000,000); it runs on the largest --threads count
    --mix-seconds N    how long steady-mix runs, and light-load at each rate (there split
                       into three runs per subject, taken in turns) (default 10)
    --async-ops N      operations per thread in each async-* run (default 1,000,000;
                       --full: 10,000,000)
    --allocator NAME   the global allocator for the whole run: mimalloc (default) or system
    --save DIR         also copy this run's results over DIR's (its CSV, SVG and summary.md
                       files are replaced as one set; subfolders are left alone): how the
                       reference results in perf/results are made
    --full             full sizes: 20M arm-cancel ops and engine-arm-cancel timers per run,
                       10M live timers, 20M resets and keyed-* operations (default 2M)
    -h, --help         this text

Every workload but fire-storm and steady-mix reports the median of 3 runs per subject;
live-1m and engine-live-1m run each in a fresh child process so that RSS deltas are the
subject's own. Plots of throughput against threads and of the fire storm's lateness go
beside the CSV. When stderr is not a terminal, progress is one line per run and per
workload as it starts and ends, instead of a bar.
";

#[derive(Debug, PartialEq)]
struct Options {
    workloads: Vec<Workload>,
    subjects: Vec<Subject>,
    timers: Option<u64>,
    full: bool,
    threads: Vec<usize>,
    windows: Vec<usize>,
    mix_rate: u64,
    mix_seconds: u64,
    /// Operations per thread in the async workloads, when asked for.
    async_ops: Option<u64>,
    /// `mimalloc` or `system`, when asked for.
    allocator: Option<&'static str>,
    /// Where to copy the run's results as the reference set, when asked.
    save: Option<PathBuf>,
}

impl Options {
    /// The chosen subjects that `workload` drives, in the order given.
    fn subjects_for(&self, workload: Workload) -> Vec<Subject> {
        self.subjects
            .iter()
            .copied()
            .filter(|&subject| workload.drives(subject))
            .collect()
    }
}

/// 1, 2, ... up to the CPUs this process may use.
fn default_threads() -> Vec<usize> {
    (1..=peers::engine::cpus()).collect()
}

#[derive(Debug, PartialEq)]
enum Command {
    Run(Options),
    Help,
}

fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<Command, String> {
    let mut options = Options {
        workloads: Workload::defaults(),
        subjects: Subject::ALL.to_vec(),
        timers: None,
        full: false,
        threads: default_threads(),
        windows: engine_arm_cancel::DEFAULT_WINDOWS.to_vec(),
        mix_rate: steady_mix::DEFAULT_RATE,
        mix_seconds: steady_mix::DEFAULT_SECONDS,
        async_ops: None,
        allocator: None,
        save: None,
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
            "--threads" => {
                options.threads = parse_list(&value("--threads")?, "thread", |name| {
                    parse_count(name, "--threads", 1, MAX_THREADS)
                })?
            }
            "--windows" => {
                options.windows = parse_list(&value("--windows")?, "window", |name| {
                    parse_count(name, "--windows", 0, MAX_WINDOW)
                })?
            }
            "--allocator" => {
                options.allocator = match value("--allocator")?.as_str() {
                    "mimalloc" => Some("mimalloc"),
                    "system" => Some("system"),
                    other => {
                        return Err(format!(
                            "--allocator takes mimalloc or system, not {other:?}"
                        ));
                    }
                }
            }
            "--save" => {
                let dir = value("--save")?;
                if dir.is_empty() {
                    return Err("--save needs a folder".to_string());
                }
                options.save = Some(PathBuf::from(dir));
            }
            "--mix-rate" => {
                options.mix_rate =
                    parse_count(&value("--mix-rate")?, "--mix-rate", 1, MAX_MIX_RATE)? as u64
            }
            "--mix-seconds" => {
                options.mix_seconds = parse_count(
                    &value("--mix-seconds")?,
                    "--mix-seconds",
                    1,
                    MAX_MIX_SECONDS,
                )? as u64
            }
            "--async-ops" => {
                options.async_ops =
                    Some(
                        parse_count(&value("--async-ops")?, "--async-ops", 1, MAX_ASYNC_OPS)?
                            as u64,
                    )
            }
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

/// A whole number in `low..=high`, written with `_` or `,` separators if wanted.
fn parse_count(text: &str, flag: &str, low: usize, high: usize) -> Result<usize, String> {
    let digits: String = text.chars().filter(|c| !matches!(c, '_' | ',')).collect();
    match digits.parse::<usize>() {
        Ok(n) if (low..=high).contains(&n) => Ok(n),
        Ok(_) => Err(format!(
            "{flag} takes whole numbers from {low} to {}, not {text}",
            thousands(high as u64)
        )),
        Err(_) => Err(format!("{flag} needs whole numbers, not {text:?}")),
    }
}

fn parse_subject(name: &str) -> Result<Subject, String> {
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

/// The run's header: what it runs, on what, and where its results go.
fn header(options: &Options, run_dir: &Path) -> String {
    use std::fmt::Write as _;
    // Writing to a String cannot fail, hence the `let _`.
    let mut out = String::new();
    let cpus = std::thread::available_parallelism()
        .map_or_else(|_| "unknown".to_string(), |cpus| cpus.get().to_string());
    let _ = writeln!(out, "corewheel-perf: the million-timer workload harness");
    let _ = writeln!(out, "machine:   {cpus} CPUs available to this process");
    let _ = writeln!(out, "allocator: {}", allocator::name());
    let _ = writeln!(out, "results:   {}", run_dir.display());
    if cfg!(debug_assertions) {
        let _ = writeln!(
            out,
            "WARNING:   debug build: the numbers mean nothing; use cargo run --release"
        );
    }
    let _ = writeln!(
        out,
        "sizes:     {} (--full for the full sizes, --timers N for live-1m, engine-live-1m, fire-storm and steady-mix)",
        if options.full { "full" } else { "default" }
    );
    if options.workloads.iter().any(|w| w.is_engine()) {
        let list = |items: &[usize]| {
            items
                .iter()
                .map(|n| thousands(*n as u64))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "threads:   {} (engine-arm-cancel, engine-reset, async-*; steady-mix runs on the largest; --threads)",
            list(&options.threads)
        );
        let _ = writeln!(
            out,
            "windows:   {} requests in flight per thread (engine-arm-cancel; --windows)",
            list(&options.windows)
        );
    }
    let _ = writeln!(out, "subjects:");
    for subject in &options.subjects {
        let _ = writeln!(out, "  {:<19}{}", subject.name(), subject.describe());
    }
    let _ = writeln!(out, "workloads:");
    for workload in &options.workloads {
        let _ = writeln!(out, "  {:<19}{}", workload.name(), workload.summary());
    }
    out
}

fn main() -> ExitCode {
    if let Ok(spec) = std::env::var(proxy_process::ENV) {
        return proxy_process::main(&spec);
    }
    if let Ok(spec) = std::env::var(child::ENV) {
        return child::main(&spec, workloads::measure_in_child);
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
    if let Some(wanted) = options.allocator.filter(|&w| w != allocator::short_name()) {
        return run_with_allocator(wanted);
    }
    let mut sizes = Sizes::new(options.full, options.timers);
    if let Some(ops) = options.async_ops {
        sizes.async_ops = ops;
    }
    let run_dir = match run_folder::create() {
        Ok(dir) => dir,
        Err(error) => {
            eprintln!("corewheel-perf: could not make a folder for the results: {error}");
            return ExitCode::FAILURE;
        }
    };
    let began = std::time::Instant::now();
    progress::print(&header(&options, &run_dir));

    let (threads, windows) = (&options.threads, &options.windows);
    let mut csv = Csv::default();
    let mut plots = plots::Plots::default();
    let mut async_summary = async_timers::Summary::default();
    prepare_alt_timer(&options);
    progress::start(planned_runs(&options));
    for &workload in &options.workloads {
        let subjects = &options.subjects_for(workload);
        if subjects.is_empty() {
            progress::print(&format!(
                "{}: skipped: none of the chosen peers is one it drives\n",
                workload.name()
            ));
            continue;
        }
        progress::workload(workload.name());
        let meter = load::LoadMeter::start();
        match workload {
            Workload::ArmCancel => arm_cancel::run(subjects, sizes.arm_cancel_ops, &mut csv),
            Workload::EngineArmCancel => {
                engine_arm_cancel::run(subjects, threads, windows, sizes.arm_cancel_ops, &mut csv)
            }
            Workload::Live1m => live_1m::run(subjects, sizes.live_timers, &mut csv),
            Workload::EngineLive1m => engine_live_1m::run(subjects, sizes.live_timers, &mut csv),
            Workload::ResetHeavy => reset_heavy::run(subjects, sizes.reset_ops, &mut csv),
            Workload::EngineReset => {
                engine_reset::run(subjects, threads, sizes.reset_ops, &mut csv)
            }
            Workload::FireStorm => {
                fire_storm::run(subjects, sizes.storm_timers, &mut csv, &mut plots)
            }
            Workload::SteadyMix => steady_mix::run(
                subjects,
                steady_mix::Config {
                    threads: threads.iter().copied().max().unwrap_or(1),
                    live: sizes.storm_timers,
                    rate: options.mix_rate,
                    duration: Duration::from_secs(options.mix_seconds),
                },
                &mut csv,
            ),
            Workload::LightLoad => steady_mix::run_light(
                subjects,
                threads.iter().copied().max().unwrap_or(1),
                Duration::from_secs(options.mix_seconds),
                &mut csv,
            ),
            Workload::BurstSteal => burst_steal::run(threads, sizes.storm_timers, &mut csv),
            Workload::Proxy => proxy::run(subjects, &mut csv),
            Workload::AsyncSleep | Workload::AsyncTimeout | Workload::AsyncReset => {
                let kind = async_timers::Kind::parse(workload.name())
                    .expect("every async workload is a kind");
                async_timers::run(
                    kind,
                    subjects,
                    threads,
                    sizes.async_ops,
                    &mut csv,
                    &mut async_summary,
                )
            }
            Workload::KeyedSetRemove | Workload::KeyedSetOver | Workload::KeyedMove => {
                let kind = [
                    keyed::Kind::SetRemove,
                    keyed::Kind::SetOver,
                    keyed::Kind::Move,
                ]
                .into_iter()
                .find(|kind| kind.name() == workload.name())
                .expect("every keyed workload is a kind");
                keyed::run(kind, subjects, threads, sizes.reset_ops, &mut csv)
            }
        }
        if let Some(note) = meter.note() {
            progress::print(&format!("{}: {note}\n", workload.name()));
        }
        if let Some(share) = meter.others_share() {
            csv.push(report::CsvRow {
                workload: workload.name().to_string(),
                subject: "machine".to_string(),
                threads: 0,
                timers: 0,
                metric: "other_processes_cpu_share",
                value: share * 100.0,
                unit: "%",
            });
        }
    }

    if let Some(table) = async_summary.table() {
        table.print();
    }
    progress::finish();

    match write_results(&options, &csv, &plots, &run_dir, began.elapsed()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("corewheel-perf: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Writes the run's CSV, plots and summary into `run_dir`, then over the `--save` folder
/// when asked, and says where each went.
fn write_results(
    options: &Options,
    csv: &Csv,
    plots: &plots::Plots,
    run_dir: &Path,
    took: Duration,
) -> Result<(), String> {
    let path = run_dir.join(run_folder::CSV);
    csv.write(&path)
        .map_err(|error| format!("could not write {}: {error}", path.display()))?;
    let machine = format!("{}, {}", plots::machine(), allocator::short_name());
    plots.write(csv, run_dir, &machine)?;
    let summary = run_dir.join(run_folder::SUMMARY);
    std::fs::write(&summary, summary_text(run_dir, &machine, took))
        .map_err(|error| format!("could not write {}: {error}", summary.display()))?;
    println!();
    println!("results of this run: {}", run_dir.display());
    println!("  (results.csv, summary.md and the plots; nothing in the source tree changed)");
    if let Some(dest) = &options.save {
        let written = run_folder::save(run_dir, dest)
            .map_err(|error| format!("could not save to {}: {error}", dest.display()))?;
        println!(
            "saved as the reference set: {} ({} files)",
            dest.display(),
            written.len()
        );
    }
    Ok(())
}

/// The run's `summary.md`: its command line, machine, duration and every table it printed.
fn summary_text(run_dir: &Path, machine: &str, took: Duration) -> String {
    let name = run_dir
        .file_name()
        .map_or_else(String::new, |name| name.to_string_lossy().into_owned());
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    let command = if args.is_empty() {
        "cargo run --release -p corewheel-perf".to_string()
    } else {
        format!(
            "cargo run --release -p corewheel-perf -- {}",
            args.join(" ")
        )
    };
    format!(
        "# corewheel-perf run {name}\n\n\
         - command: `{command}`\n\
         - machine: {machine}\n\
         - took: {:.0} s\n\n\
         Every figure is in `results.csv` beside this file; the tables as printed:\n\n\
         ```text\n{}```\n",
        took.as_secs_f64(),
        progress::transcript()
    )
}

/// Runs the harness again, with the same arguments, in a child process whose allocator is
/// `wanted`: this process chose its allocator at its first allocation, long before it read
/// its arguments.
fn run_with_allocator(wanted: &str) -> ExitCode {
    if !allocator::CAN_SWITCH {
        eprintln!("corewheel-perf: --allocator system needs a Unix platform");
        return ExitCode::from(2);
    }
    let status = std::env::current_exe().and_then(|exe| {
        std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env(allocator::ENV, wanted)
            .status()
    });
    match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => ExitCode::from(status.code().map_or(1, |code| code.clamp(1, 255) as u8)),
        Err(error) => {
            eprintln!("corewheel-perf: could not run again with the {wanted} allocator: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Builds (or finds up to date) the tokio_unstable copy of the harness before the run, when
/// an async workload is to measure tokio-alt, so that the build is not inside a workload.
fn prepare_alt_timer(options: &Options) {
    let wanted = options.workloads.iter().any(|&workload| {
        workload.drives(Subject::TokioAlt) && options.subjects.contains(&Subject::TokioAlt)
    });
    if !wanted || unstable_build::ready() {
        return;
    }
    progress::print(&format!(
        "tokio-alt: building the harness with --cfg tokio_unstable into {} (a minute or two the first time; up to date after that)",
        unstable_build::target_dir().display()
    ));
    let began = std::time::Instant::now();
    match unstable_build::exe() {
        Ok(exe) => progress::print(&format!(
            "tokio-alt: {} ready after {:.1} s\n",
            exe.display(),
            began.elapsed().as_secs_f64()
        )),
        Err(error) => progress::print(&format!(
            "tokio-alt: ERROR: {error}; its rows will show the error\n"
        )),
    }
}

/// How many measured runs `options` asks for: the progress bar's length.
fn planned_runs(options: &Options) -> u64 {
    let runs = repeat::RUNS as u64;
    let threads = options.threads.len() as u64;
    options
        .workloads
        .iter()
        .map(|&workload| {
            let subjects = options.subjects_for(workload).len() as u64;
            subjects
                * match workload {
                    Workload::ArmCancel
                    | Workload::Live1m
                    | Workload::EngineLive1m
                    | Workload::ResetHeavy => runs,
                    Workload::EngineArmCancel => runs * threads * options.windows.len() as u64,
                    Workload::EngineReset
                    | Workload::KeyedSetRemove
                    | Workload::KeyedSetOver
                    | Workload::KeyedMove
                    | Workload::AsyncSleep
                    | Workload::AsyncTimeout
                    | Workload::AsyncReset => runs * threads,
                    Workload::FireStorm | Workload::SteadyMix => 1,
                    Workload::LightLoad => steady_mix::LIGHT_RATES.len() as u64,
                    Workload::Proxy => proxy::steps(1),
                    // Stealing on and off, at each worker count above one.
                    Workload::BurstSteal => {
                        runs * 2 * options.threads.iter().filter(|&&n| n > 1).count() as u64
                    }
                }
        })
        .sum()
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
        assert_eq!(options.workloads, Workload::defaults());
        assert!(!options.workloads.contains(&Workload::Proxy));
        assert_eq!(options.subjects, Subject::ALL);
        assert_eq!(options.timers, None);
        assert!(!options.full);
        assert_eq!(options.threads[0], 1);
        assert_eq!(options.windows, [16, 10_000]);
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
                "--full",
                "--threads=1,2,4",
                "--windows",
                "0,16",
                "--mix-rate=2,000",
                "--mix-seconds",
                "3",
                "--allocator=system",
                "--save",
                "perf/results",
                "--async-ops=5,000"
            ]),
            Ok(Command::Run(Options {
                workloads: vec![Workload::FireStorm, Workload::ArmCancel],
                subjects: vec![Subject::Corewheel],
                timers: Some(100_000),
                full: true,
                threads: vec![1, 2, 4],
                windows: vec![0, 16],
                mix_rate: 2_000,
                mix_seconds: 3,
                async_ops: Some(5_000),
                allocator: Some("system"),
                save: Some("perf/results".into()),
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
            &["--peers", "pingora"],
            &["--full=yes"],
            &["--threads", "0"],
            &["--threads", "two"],
            &["--windows", ""],
            &["--windows", "-1"],
            &["--mix-rate", "0"],
            &["--allocator", "jemalloc"],
            &["--mix-seconds", "100000"],
            &["--save"],
            &["--save="],
            &["--async-ops", "0"],
            &["--async-ops"],
        ] {
            assert!(parse(args).is_err(), "{args:?} should be rejected");
        }
    }
}
