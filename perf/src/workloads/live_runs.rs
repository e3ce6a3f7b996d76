//! What the two live-1m workloads (the single-owner `live-1m` and the engine's
//! `engine-live-1m`) share: each run of a subject is made in a fresh child process of this
//! binary, so that its RSS delta is its own (in one process, a subject measured after
//! another would reuse the pages the first one freed, and the allocator's retention would
//! decide the comparison). A run's readings are named values, which the child prints as
//! `name value` lines and the parent reads back; tables show each reading's median.

use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::process::{Command, ExitCode, Stdio};

use crate::peers::Subject;
use crate::runner::{self, Plan, median, spread};
use crate::workloads::Workload;

/// Set in a child's environment to the measurement it is to make: `workload subject timers`.
pub const ENV: &str = "COREWHEEL_PERF_CHILD";

/// A run's readings by name; a reading the platform or the subject lacks is absent.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Readings(BTreeMap<String, f64>);

impl Readings {
    /// Sets reading `name`, if there is one.
    pub fn set(&mut self, name: &str, value: Option<f64>) {
        if let Some(value) = value {
            self.0.insert(name.to_string(), value);
        }
    }

    /// Reading `name`, if there is one.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.0.get(name).copied()
    }

    /// Reading `name` less the reading `base`.
    pub fn above(&self, name: &str, base: &str) -> Option<f64> {
        Some(self.get(name)? - self.get(base)?)
    }

    fn encode(&self) -> String {
        self.0.iter().map(|(name, value)| format!("{name} {value}\n")).collect()
    }

    fn decode(text: &str) -> Result<Self, String> {
        let mut readings = Self::default();
        for line in text.lines() {
            let (name, value) =
                line.split_once(' ').ok_or_else(|| format!("the child printed {line:?}"))?;
            let value = value.parse().map_err(|_| format!("the child printed {line:?}"))?;
            readings.0.insert(name.to_string(), value);
        }
        Ok(readings)
    }

    /// Each reading's median over runs (absent if any run lacks it).
    fn median_of(runs: &[Readings]) -> Self {
        let Some(first) = runs.first() else {
            return Self::default();
        };
        let mut out = Self::default();
        for name in first.0.keys() {
            let values: Option<Vec<f64>> = runs.iter().map(|run| run.get(name)).collect();
            out.set(name, values.map(median));
        }
        out
    }
}

/// A vector for `n` of the harness's own values (keys, handles, sleeps) with its pages
/// touched, so that an RSS delta read afterwards is the structure's alone.
pub fn touched_vec<T>(n: usize) -> Vec<T> {
    let mut values: Vec<T> = Vec::with_capacity(n);
    for slot in values.spare_capacity_mut() {
        *slot = MaybeUninit::zeroed();
    }
    std::hint::black_box(values.as_mut_ptr());
    values
}

/// Measures every cell of `plan`, each run in a child process of its own, through the
/// runner. Returns each cell's median readings, and the range of `key` over its runs.
pub fn in_children(
    plan: &Plan,
    timers: u64,
    keys: [&str; 2],
) -> Vec<Result<(Readings, String), String>> {
    let exe = std::env::current_exe().map_err(|error| format!("no harness executable: {error}"));
    let runs = runner::in_turns(plan, |cell| {
        let exe = exe.as_ref().map_err(Clone::clone)?;
        let output = Command::new(exe)
            .env(ENV, format!("{} {} {timers}", plan.workload.name(), cell.subject.name()))
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .map_err(|error| format!("could not start a child process: {error}"))?;
        if !output.status.success() {
            return Err(format!("the child process failed ({})", output.status));
        }
        Readings::decode(&String::from_utf8_lossy(&output.stdout))
    });
    runs.into_iter()
        .map(|runs| {
            let runs = runs?;
            let range = |key: &str| spread(runs.iter().filter_map(|run| run.get(key)));
            Ok((Readings::median_of(&runs), format!("{} / {}", range(keys[0]), range(keys[1]))))
        })
        .collect()
}

/// The child's side: makes the measurement `spec` names and prints its readings.
pub fn child_main(spec: &str) -> ExitCode {
    let words: Vec<&str> = spec.split_whitespace().collect();
    let parsed = match words[..] {
        [workload, subject, timers] => Workload::ALL
            .into_iter()
            .find(|w| w.name() == workload)
            .zip(Subject::ALL.into_iter().find(|s| s.name() == subject))
            .zip(timers.parse::<u64>().ok()),
        _ => None,
    };
    let result = match parsed {
        Some(((Workload::Live1m, subject), timers)) => {
            super::live_1m::measure_here(subject, timers)
        }
        Some(((Workload::EngineLive1m, subject), timers)) => {
            super::engine_live_1m::measure_here(subject, timers)
        }
        _ => Err(format!("{ENV}={spec:?} names no measurement")),
    };
    match result {
        Ok(readings) => {
            print!("{}", readings.encode());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("corewheel-perf: {spec}: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Readings;

    #[test]
    fn readings_round_trip_and_take_medians() {
        let mut one = Readings::default();
        one.set("ns_per_insert", Some(12.5));
        one.set("rss_live", Some(52_428_800.0));
        one.set("missing", None);
        assert_eq!(Readings::decode(&one.encode()), Ok(one.clone()));
        assert!(Readings::decode("ns_per_insert x\n").is_err());
        let mut two = one.clone();
        two.set("ns_per_insert", Some(10.5));
        let mut three = one.clone();
        three.set("ns_per_insert", Some(20.0));
        three.0.remove("rss_live");
        let median = Readings::median_of(&[one, two, three]);
        assert_eq!(median.get("ns_per_insert"), Some(12.5));
        assert_eq!(median.get("rss_live"), None);
    }
}
