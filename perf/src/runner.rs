//! The one runner every workload goes through: it measures each cell of a plan (a subject at a setting) a number of
//! times, the cells taking turns so that a slow spell of the machine hits them alike, and counts each run on the
//! progress display (an indicatif bar on a terminal, stderr lines elsewhere). All plans are made first, so the count
//! ends at N/N. Everything printed through [`print`] is also kept for the run's `summary.md`.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use crate::peers::Subject;
use crate::workloads::Workload;

/// Runs per cell where a workload repeats its measurements.
pub const RUNS: usize = 3;

/// One measurement of a plan: a subject, on a number of application threads, at a setting whose meaning the workload
/// gives (a window, a rate, a tick, whether stealing is on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell {
    pub subject: Subject,
    pub threads: usize,
    pub param: u64,
}

/// What a workload will measure: its cells, each `runs` times; `param` names a cell's setting in progress lines.
#[derive(Debug, Clone)]
pub struct Plan {
    pub workload: Workload,
    pub cells: Vec<Cell>,
    pub runs: usize,
    pub param: &'static str,
}

impl Plan {
    /// Runs this plan will make: its share of the progress total.
    pub fn steps(&self) -> u64 {
        (self.cells.len() * self.runs) as u64
    }

    fn label(&self, cell: &Cell, run: usize) -> String {
        let param = match self.param {
            "" => String::new(),
            name => format!(", {name} {}", cell.param),
        };
        let (workload, subject) = (self.workload.name(), cell.subject.name());
        let (threads, run) = (cell.threads, run + 1);
        format!("{workload}/{subject} ({threads} threads{param}, run {run})")
    }
}

/// The progress display: the bar (`None`: lines on stderr), when the runs began, the runs planned and made, and
/// everything printed, for the summary.
#[derive(Default)]
struct State(Option<ProgressBar>, Option<Instant>, u64, u64, String);

static STATE: Mutex<State> = Mutex::new(State(None, None, 0, 0, String::new()));

fn state() -> MutexGuard<'static, State> {
    lock(&STATE)
}

/// Locks `mutex`; a poisoned lock only means a thread panicked while holding it, which the run reports.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts the progress display for `total` runs: a bar on a terminal, lines elsewhere.
pub fn start(total: u64) {
    let bar = ProgressBar::new(total);
    let template = "{elapsed_precise:.dim} [{bar:32.cyan/blue}] {pos}/{len} runs  {msg}";
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let mut state = state();
    state.0 = (!bar.is_hidden()).then_some(bar);
    (state.1, state.2) = (Some(Instant::now()), total);
}

/// Prints `text` and a newline to stdout, with the bar out of the way, and keeps it for the summary.
pub fn print(text: &str) {
    let mut state = state();
    state.4.push_str(&format!("{text}\n"));
    match &state.0 {
        Some(bar) => bar.suspend(|| println!("{text}")),
        None => println!("{text}"),
    }
}

/// Everything printed through [`print`] so far.
pub fn transcript() -> String {
    state().4.clone()
}

/// A line on stderr in lines mode, stamped with the time since the start.
fn line(state: &State, text: &str) {
    if let (None, Some(began)) = (&state.0, state.1) {
        eprintln!("[{:>7.1}s] {text}", began.elapsed().as_secs_f64());
    }
}

/// Says a workload begins or ends (lines mode only: the bar names each run).
pub fn workload(text: &str) {
    line(&state(), text);
}

/// Counts one run as ended (it began at `ran`) or skipped, and says so.
fn step(what: &str, ran: Option<Instant>) {
    let mut state = state();
    state.3 += 1;
    let (done, total) = (state.3, state.2);
    let text = match ran.map(|began| began.elapsed().as_secs_f64()) {
        Some(took) => format!("{done}/{total} done     {what} in {took:.1} s"),
        None => format!("{done}/{total} skipped  {what}"),
    };
    match &state.0 {
        Some(bar) => {
            bar.inc(1);
            bar.set_message(what.to_string());
        }
        None => line(&state, &text),
    }
}

/// Takes the bar off the terminal and says how many runs were made.
pub fn finish() {
    let state = state();
    if let Some(bar) = &state.0 {
        bar.finish_and_clear();
    }
    line(&state, &format!("finished: {}/{} runs", state.3, state.2));
}

/// Measures every cell of `plan` `plan.runs` times, in turns: every cell once, then every cell again. A cell whose
/// measurement fails once counts as failed, and its later runs are counted as skipped.
pub fn in_turns<R>(
    plan: &Plan,
    mut measure: impl FnMut(&Cell) -> Result<R, String>,
) -> Vec<Result<Vec<R>, String>> {
    let mut results: Vec<Result<Vec<R>, String>> =
        plan.cells.iter().map(|_| Ok(Vec::new())).collect();
    for run in 0..plan.runs {
        for (cell, result) in plan.cells.iter().zip(results.iter_mut()) {
            let label = plan.label(cell, run);
            let Ok(runs) = result else {
                step(&label, None);
                continue;
            };
            let state = state();
            let (next, total) = (state.3 + 1, state.2);
            line(&state, &format!("{next}/{total} started  {label}"));
            drop(state);
            let began = Instant::now();
            let measured = measure(cell);
            step(&label, Some(began));
            match measured {
                Ok(value) => runs.push(value),
                Err(error) => *result = Err(error),
            }
        }
    }
    results
}

/// `plan`'s cells with their results, in groups of one setting each, in the plan's order.
pub fn by_param<'a, R>(plan: &'a Plan, results: &'a [R]) -> Vec<Vec<(&'a Cell, &'a R)>> {
    let mut groups: Vec<Vec<(&Cell, &R)>> = Vec::new();
    for (cell, result) in plan.cells.iter().zip(results) {
        match groups.last_mut() {
            Some(group) if group[0].0.param == cell.param => group.push((cell, result)),
            _ => groups.push(vec![(cell, result)]),
        }
    }
    groups
}

/// The median (the upper middle for an even count); `NaN` when there is none.
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.into_iter().collect();
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// `min-max` of the values, for the notes under a table.
pub fn spread(values: impl IntoIterator<Item = f64>) -> String {
    let fold = |(lo, hi): (f64, f64), v: f64| (lo.min(v), hi.max(v));
    let start = (f64::INFINITY, f64::NEG_INFINITY);
    let (min, max) = values.into_iter().fold(start, fold);
    format!("{min:.1}-{max:.1}")
}

#[cfg(test)]
mod tests {
    use super::{Cell, Plan, in_turns, median, spread};
    use crate::peers::Subject;
    use crate::workloads::Workload;

    #[test]
    fn median_and_spread() {
        let figures = (
            median([3.0, 1.0, 2.0]),
            median([4.0, 1.0]),
            spread([3.0, 1.24, 2.0]),
        );
        assert_eq!(figures, (2.0, 4.0, "1.2-3.0".into()));
        assert!(median([]).is_nan());
    }

    /// Every cell is measured once per run, cells in turns; a failed cell stops there and its other runs are still
    /// counted.
    #[test]
    fn cells_take_turns_and_failures_stop_their_cell() {
        let cell = |subject| Cell {
            subject,
            threads: 1,
            param: 0,
        };
        let cells = vec![cell(Subject::Corewheel), cell(Subject::BinaryHeap)];
        let plan = Plan {
            workload: Workload::ArmCancel,
            cells,
            runs: 3,
            param: "",
        };
        assert_eq!(plan.steps(), 6);
        let mut order = Vec::new();
        let results = in_turns(&plan, |cell| {
            order.push(cell.subject);
            match cell.subject {
                Subject::BinaryHeap => Err("broke".to_string()),
                _ => Ok(order.len()),
            }
        });
        let corewheel = Subject::Corewheel;
        assert_eq!(
            order,
            [corewheel, Subject::BinaryHeap, corewheel, corewheel]
        );
        assert_eq!(results, [Ok(vec![1, 3, 4]), Err("broke".to_string())]);
    }
}
