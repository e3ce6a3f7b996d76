//! What the two live-1m workloads (the single-owner `live-1m` and the engine's
//! `engine-live-1m`) share: each subject measured in a fresh child process, run after run;
//! a run's readings as named values, which a child prints and its parent reads back, and
//! whose median over runs the tables show; and a harness vector whose pages are touched
//! before the first RSS reading.

use std::mem::MaybeUninit;

use crate::child;
use crate::peers::Subject;
use crate::repeat::{in_turns, median};

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

/// Where no child process can be started, what a workload does instead: measure in this
/// process (`Some`), or give up on that subject (`None`).
pub type InProcess<R> = Option<fn(Subject, u64) -> Result<R, String>>;

/// Measures workload `name` for every subject, each run in a child process of its own, the
/// subjects taking turns; `decode` reads what a child printed. Returns each subject's runs,
/// and the subjects that were measured in this process instead.
pub fn in_children<R>(
    name: &str,
    subjects: &[Subject],
    timers: u64,
    decode: fn(&str) -> Result<R, String>,
    in_process: InProcess<R>,
) -> (Vec<Result<Vec<R>, String>>, Vec<Subject>) {
    let mut measured_here = Vec::new();
    let runs = in_turns(subjects, |subject, run| {
        crate::progress::step(format!(
            "{name}/{} (run {}, own process)",
            subject.name(),
            run + 1
        ));
        match child::run(name, subject, timers) {
            Ok(out) => decode(&out),
            Err(child::Error::Failed(error)) => Err(error),
            Err(child::Error::Spawn(error)) => match in_process {
                Some(measure) => {
                    if !measured_here.contains(&subject) {
                        eprintln!("could not start a child process ({error}); measuring here");
                        measured_here.push(subject);
                    }
                    measure(subject, timers)
                }
                None => Err(format!(
                    "could not start a child process ({error}); this workload measures only in one"
                )),
            },
        }
    });
    (runs, measured_here)
}

/// A run's readings as named values, `None` where a reading is missing; required fields
/// refuse `None` when read back.
pub trait Readings: Sized {
    /// The readings' names, in the order of [`values`](Self::values).
    const FIELDS: &'static [&'static str];

    fn values(&self) -> Vec<Option<f64>>;

    fn from_values(values: &[Option<f64>]) -> Result<Self, String>;
}

/// The value of `values[index]`, which the reading named `FIELDS[index]` must have.
pub fn required<R: Readings>(values: &[Option<f64>], index: usize) -> Result<f64, String> {
    values
        .get(index)
        .copied()
        .flatten()
        .ok_or_else(|| format!("the child reported no {}", R::FIELDS[index]))
}

/// One `name value` line per reading, `-` for a missing one: what a child prints.
pub fn encode<R: Readings>(readings: &R) -> String {
    R::FIELDS
        .iter()
        .zip(readings.values())
        .map(|(name, value)| match value {
            Some(value) => format!("{name} {value}\n"),
            None => format!("{name} -\n"),
        })
        .collect()
}

/// Reads back what [`encode`] printed.
pub fn decode<R: Readings>(text: &str) -> Result<R, String> {
    let mut values = Vec::with_capacity(R::FIELDS.len());
    for name in R::FIELDS {
        let value = text
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .ok_or_else(|| format!("the child process reported no {name}"))?;
        values.push(match value {
            "-" => None,
            value => Some(
                value
                    .parse()
                    .map_err(|_| format!("the child process reported a bad {name}"))?,
            ),
        });
    }
    R::from_values(&values)
}

/// Each reading's median over several runs (missing if any run misses it).
pub fn median_of<R: Readings>(runs: &[R]) -> Result<R, String> {
    let columns: Vec<Vec<Option<f64>>> = runs.iter().map(Readings::values).collect();
    let values: Vec<Option<f64>> = (0..R::FIELDS.len())
        .map(|i| {
            let column: Option<Vec<f64>> = columns.iter().map(|run| run[i]).collect();
            column.filter(|column| !column.is_empty()).map(median)
        })
        .collect();
    R::from_values(&values)
}
