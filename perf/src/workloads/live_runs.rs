//! What the two live-1m workloads (the single-owner `live-1m` and the engine's
//! `engine-live-1m`) share: each subject measured in a fresh child process, run after run,
//! and a harness vector whose pages are touched before the first RSS reading.

use std::mem::MaybeUninit;

use crate::child;
use crate::peers::Subject;
use crate::repeat::in_turns;

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
