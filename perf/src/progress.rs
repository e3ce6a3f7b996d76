//! Progress while the harness runs: one step per measured run. On a terminal it is a bar
//! with the run's name beside it; everything printed to stdout while the bar is up goes
//! through [`print`], so that table lines and the bar never share a line. When stderr is
//! not a terminal (a log, CI, `| tee`), there is no bar: each run and each workload gets
//! a line on stderr as it starts and as it ends, with the time since the harness began
//! and the time it took, as cargo and criterion print.
//!
//! What goes through [`print`] is also kept, for the run's `summary.md`.

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

static BAR: OnceLock<ProgressBar> = OnceLock::new();

/// Lines mode's state: when the harness began, the steps planned, and the step and
/// workload under way with when each began.
static LINES: Mutex<Lines> = Mutex::new(Lines {
    began: None,
    steps: 0,
    done: 0,
    step: None,
    workload: None,
});

/// Everything printed through [`print`], in order.
static TRANSCRIPT: Mutex<String> = Mutex::new(String::new());

struct Lines {
    began: Option<Instant>,
    steps: u64,
    done: u64,
    step: Option<(String, Instant)>,
    workload: Option<(String, Instant)>,
}

impl Lines {
    fn since_start(&self) -> String {
        let elapsed = self.began.map_or(Duration::ZERO, |began| began.elapsed());
        format!("[{:>7.1}s]", elapsed.as_secs_f64())
    }

    fn end_step(&mut self) {
        if let Some((what, began)) = self.step.take() {
            self.done += 1;
            eprintln!(
                "{} {}/{} done     {what} in {:.1} s",
                self.since_start(),
                self.done,
                self.steps,
                began.elapsed().as_secs_f64()
            );
        }
    }
}

fn lines() -> std::sync::MutexGuard<'static, Lines> {
    LINES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether progress goes to stderr as lines rather than as a bar.
fn as_lines() -> bool {
    BAR.get().is_none_or(ProgressBar::is_hidden)
}

/// Shows the bar, `steps` long, or starts the lines. Later calls do nothing.
pub fn start(steps: u64) {
    {
        let mut lines = lines();
        if lines.began.is_none() {
            lines.began = Some(Instant::now());
            lines.steps = steps;
        }
    }
    BAR.get_or_init(|| {
        let bar = ProgressBar::new(steps);
        if let Ok(style) = ProgressStyle::with_template(
            "{elapsed_precise:.dim} [{bar:32.cyan/blue}] {pos}/{len} runs  {msg}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    });
}

/// A workload begins (lines mode only: the bar names each run).
pub fn workload(name: &str) {
    if !as_lines() {
        return;
    }
    let mut lines = lines();
    end_workload_locked(&mut lines);
    eprintln!("{} started  workload {name}", lines.since_start());
    lines.workload = Some((name.to_string(), Instant::now()));
}

fn end_workload_locked(lines: &mut Lines) {
    lines.end_step();
    if let Some((name, began)) = lines.workload.take() {
        eprintln!(
            "{} finished workload {name} in {:.1} s",
            lines.since_start(),
            began.elapsed().as_secs_f64()
        );
    }
}

/// One more run begins; the one before it, if any, has ended.
pub fn step(what: impl Into<String>) {
    let what = what.into();
    match BAR.get() {
        Some(bar) if !bar.is_hidden() => {
            bar.inc(1);
            bar.set_message(what);
        }
        _ => {
            let mut lines = lines();
            lines.end_step();
            eprintln!(
                "{} {}/{} started  {what}",
                lines.since_start(),
                lines.done + 1,
                lines.steps
            );
            lines.step = Some((what, Instant::now()));
        }
    }
}

/// Prints `text` and a newline to stdout, with the bar out of the way, and keeps it for
/// the summary.
pub fn print(text: &str) {
    {
        let mut transcript = TRANSCRIPT
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        transcript.push_str(text);
        transcript.push('\n');
    }
    match BAR.get() {
        Some(bar) => bar.suspend(|| println!("{text}")),
        None => println!("{text}"),
    }
}

/// Everything printed through [`print`] so far.
pub fn transcript() -> String {
    TRANSCRIPT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone()
}

/// Takes the bar off the terminal, or ends the last lines.
pub fn finish() {
    if as_lines() {
        end_workload_locked(&mut lines());
    }
    if let Some(bar) = BAR.get() {
        bar.finish_and_clear();
    }
}
