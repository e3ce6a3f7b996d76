//! The command line, parsed by clap: which workloads and peers run, and at what sizes.

use std::path::PathBuf;

use clap::Parser;

use crate::peers::Subject;
use crate::workloads::Workload;

/// corewheel-perf: the million-timer workload harness.
///
/// Runs corewheel's Wheel, TimerEngine, async layer and KeyedTimers against real peer crates (tokio, tokio-util's
/// DelayQueue, async-io, pingora-timeout, a Mutex<BinaryHeap>) through the same workloads in one run; prints a table
/// per workload and writes the run's results.csv, SVG plots and summary.md into target/perf-runs/<UTC date and time>/
/// (under CARGO_TARGET_DIR where that is set). Nothing in the source tree changes unless --save asks. Every workload
/// but fire-storm and steady-mix reports the median of 3 runs per subject, taken in turns.
#[derive(Debug, Parser)]
#[command(name = "corewheel-perf", version, about, long_about)]
pub struct Options {
    /// Workloads to run, comma-separated (default: all but proxy, which runs only when named: it needs wrk).
    #[arg(long, value_delimiter = ',', default_values_t = Workload::defaults())]
    pub workloads: Vec<Workload>,

    /// Subjects to run, comma-separated; each workload drives those of them it can.
    #[arg(long, value_delimiter = ',', default_values_t = Subject::ALL.to_vec())]
    pub peers: Vec<Subject>,

    /// Application threads for the multi-thread workloads, comma-separated (default: 1 up to the CPU count);
    /// steady-mix and light-load run on the largest.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Vec<u16>,

    /// Requests in flight per thread for engine-arm-cancel, comma-separated (0: arm then cancel at once).
    #[arg(long, value_delimiter = ',', default_values_t = [16, 10_000],
          value_parser = clap::value_parser!(u32).range(0..=10_000_000))]
    pub windows: Vec<u32>,

    /// Timers for live-1m, engine-live-1m, fire-storm, burst-steal and steady-mix (default 1,000,000; --full:
    /// 10,000,000 for the live-1m workloads); `_` or `,` may group digits.
    #[arg(long, value_parser = count::<1, 100_000_000>)]
    pub timers: Option<u64>,

    /// Timers armed per second in steady-mix, all threads together.
    #[arg(long, default_value = "1000000", value_parser = count::<1, 1_000_000_000>)]
    pub mix_rate: u64,

    /// How long steady-mix runs, and light-load at each rate (there split into three runs per subject, taken in
    /// turns).
    #[arg(long, default_value = "10", value_parser = count::<1, 3_600>)]
    pub mix_seconds: u64,

    /// Operations per thread in each async-* run (default 1,000,000; --full: 10,000,000).
    #[arg(long, value_parser = count::<1, 1_000_000_000>)]
    pub async_ops: Option<u64>,

    /// How long each wrk run of the proxy workload lasts.
    #[arg(long, default_value = "8", value_parser = count::<1, 600>)]
    pub wrk_seconds: u64,

    /// Also copy this run's results over DIR's (its CSV, SVG and summary.md files are replaced as one set; subfolders
    /// are left alone): how perf/results is made.
    #[arg(long, value_name = "DIR", value_parser = clap::builder::TypedValueParser::map(clap::builder::NonEmptyStringValueParser::new(), PathBuf::from))]
    pub save: Option<PathBuf>,

    /// Full sizes: 20M arm-cancel operations and engine timers per run, 10M live timers, 20M resets and keyed
    /// operations (default 2M).
    #[arg(long)]
    pub full: bool,
}

/// A whole number in `LOW..=HIGH`, with `_` or `,` allowed between digits.
fn count<const LOW: u64, const HIGH: u64>(text: &str) -> Result<u64, String> {
    let digits: String = text.chars().filter(|c| !matches!(c, '_' | ',')).collect();
    match digits.parse::<u64>() {
        Ok(n) if (LOW..=HIGH).contains(&n) => Ok(n),
        Ok(_) => Err(format!("takes whole numbers from {LOW} to {HIGH}")),
        Err(_) => Err("needs a whole number".to_string()),
    }
}

impl Options {
    /// Parses the process's arguments, keeping the first of any repeated list item; the thread counts default to 1
    /// up to the CPU count.
    pub fn from_args() -> Self {
        Self::parse().normalized()
    }

    fn normalized(mut self) -> Self {
        dedup(&mut self.workloads);
        dedup(&mut self.peers);
        dedup(&mut self.threads);
        dedup(&mut self.windows);
        if self.threads.is_empty() {
            self.threads = (1..=crate::peers::engine::cpus().min(1024) as u16).collect();
        }
        self
    }

    /// How big each workload runs, full sizes ten times the default: operations per run of arm-cancel and
    /// engine-arm-cancel, and resets (and keyed operations) per run; live-1m's timers; storm and mix timers; and
    /// operations per thread in each async run.
    pub fn sizes(&self) -> [u64; 4] {
        let scale = if self.full { 10 } else { 1 };
        let live = self.timers.unwrap_or(1_000_000 * scale);
        let storm = self.timers.unwrap_or(1_000_000);
        let async_ops = self.async_ops.unwrap_or(1_000_000 * scale);
        [2_000_000 * scale, live, storm, async_ops]
    }
}

/// Keeps the first occurrence of each item, in order.
pub fn dedup<T: PartialEq + Copy>(items: &mut Vec<T>) {
    let mut seen = Vec::with_capacity(items.len());
    items.retain(|item| {
        let new = !seen.contains(item);
        seen.push(*item);
        new
    });
}

#[cfg(test)]
mod tests {
    use super::Options;
    use crate::peers::Subject;
    use crate::workloads::Workload;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Options::try_parse_from(std::iter::once("corewheel-perf").chain(args.iter().copied()))
            .map(Options::normalized)
    }

    #[test]
    fn defaults_and_flags() {
        let defaults = parse(&[]).expect("no arguments run");
        let figures = (
            defaults.threads[0],
            defaults.sizes()[1],
            &defaults.windows[..],
        );
        assert_eq!(figures, (1, 1_000_000, &[16, 10_000][..]));
        assert_eq!(
            (defaults.workloads, defaults.peers),
            (Workload::defaults(), Subject::ALL.to_vec())
        );
        let args = "--workloads fire-storm,arm-cancel,fire-storm --peers=corewheel --timers 100_000 --full --threads=1,2,4 --windows 0,16 --mix-rate=2,000 --async-ops=5,000 --save perf/results";
        let options = parse(&args.split(' ').collect::<Vec<_>>()).expect("valid");
        assert_eq!(
            (options.mix_rate, options.sizes()[3], options.timers),
            (2_000, 5_000, Some(100_000))
        );
        let chosen = (options.workloads, options.peers);
        assert_eq!(
            chosen,
            (
                vec![Workload::FireStorm, Workload::ArmCancel],
                vec![Subject::Corewheel]
            )
        );
        let lists = (options.threads, options.windows, options.save);
        assert_eq!(
            lists,
            (vec![1, 2, 4], vec![0, 16], Some("perf/results".into()))
        );
    }

    #[test]
    fn bad_input_is_a_clap_error_not_a_panic() {
        for args in [
            &["--bogus"][..],
            &["extra"],
            &["--timers"],
            &["--timers", "0"],
            &["--timers", "lots"],
            &["--timers", "999999999999"],
            &["--workloads", "nope"],
            &["--peers", "pingora"],
            &["--full=yes"],
            &["--threads", "0"],
            &["--windows", "-1"],
            &["--mix-seconds", "100000"],
            &["--save="],
        ] {
            assert!(parse(args).is_err(), "{args:?} should be rejected");
        }
    }
}
