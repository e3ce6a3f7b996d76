//! The progress bar on the terminal while the harness runs: one step per measured run, with
//! the run's name beside it. Everything printed to stdout while the bar is up goes through
//! [`print`], so that table lines and the bar never share a line. When stderr is not a
//! terminal (a log, CI), there is no bar, and each step is one line on stderr instead.

use std::sync::OnceLock;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

static BAR: OnceLock<ProgressBar> = OnceLock::new();

/// Shows the bar, `steps` long. Later calls do nothing.
pub fn start(steps: u64) {
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

/// One more run begins.
pub fn step(what: impl Into<String>) {
    let what = what.into();
    match BAR.get() {
        Some(bar) if !bar.is_hidden() => {
            bar.inc(1);
            bar.set_message(what);
        }
        _ => eprintln!("running {what} ..."),
    }
}

/// Prints `text` and a newline to stdout, with the bar out of the way.
pub fn print(text: &str) {
    match BAR.get() {
        Some(bar) => bar.suspend(|| println!("{text}")),
        None => println!("{text}"),
    }
}

/// Takes the bar off the terminal.
pub fn finish() {
    if let Some(bar) = BAR.get() {
        bar.finish_and_clear();
    }
}
