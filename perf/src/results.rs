//! Where a run's results go. Every run writes its CSV, plots and `summary.md` into a folder of its own under the
//! build's target directory, named by the UTC date and time it began, so a run never overwrites another's (nor the
//! committed reference results) and a checkout stays clean. `--save DIR` then copies that one run's files over DIR's,
//! as one set: the reference results in `perf/results/` are only ever written that way.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::workloads::Out;

/// The run's summary (its command line, machine and tables) and the CSV of every figure it measured.
pub const SUMMARY: &str = "summary.md";
pub const CSV: &str = "results.csv";

/// Makes this run's folder, `<target>/perf-runs/<UTC date and time>`, suffixed if that name is taken.
pub fn create() -> io::Result<PathBuf> {
    let (runs, stamp) = (target_dir().join("perf-runs"), utc_stamp(SystemTime::now()));
    fs::create_dir_all(&runs)?;
    let name = |n| match n {
        1 => stamp.clone(),
        n => format!("{stamp}-{n}"),
    };
    let mut tries = (1..1000).map(|n| runs.join(name(n)));
    let free = tries.find_map(|dir| fs::create_dir(&dir).map(|()| dir).ok());
    free.ok_or_else(|| io::Error::other("no free run folder"))
}

/// The target directory this binary was built into, so that `CARGO_TARGET_DIR` is respected.
fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.to_path_buf()))
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// Writes the run's CSV, plots and summary into `run_dir`, then over `save` when asked, and says where each went.
pub fn write(out: &Out, run_dir: &Path, save: Option<&Path>, took: Duration) -> Result<(), String> {
    out.csv.write(&run_dir.join(CSV))?;
    let machine = crate::plots::machine();
    out.plots.write(&out.csv, run_dir, &machine)?;
    let summary = run_dir.join(SUMMARY);
    let written = fs::write(&summary, summary_text(run_dir, &machine, took));
    written.map_err(|error| format!("could not write {}: {error}", summary.display()))?;
    println!("\nresults of this run: {}", run_dir.display());
    println!("  (results.csv, summary.md and the plots; nothing in the source tree changed)");
    if let Some(dest) = save {
        let written = copy_set(run_dir, dest)
            .map_err(|error| format!("could not save to {}: {error}", dest.display()))?;
        let dest = dest.display();
        println!("saved as the reference set: {dest} ({written} files)");
    }
    Ok(())
}

/// The run's `summary.md`: its command line, machine, duration and every table it printed.
fn summary_text(run_dir: &Path, machine: &str, took: Duration) -> String {
    let name = run_dir.file_name().unwrap_or_default().to_string_lossy();
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    let mut command = "cargo run --release -p corewheel-perf".to_string();
    if !args.is_empty() {
        command = format!("{command} -- {}", args.join(" "));
    }
    let (took, transcript) = (took.as_secs_f64(), crate::runner::transcript());
    format!(
        "# corewheel-perf run {name}\n\n- command: `{command}`\n- machine: {machine}, mimalloc\n- took: {took:.0} s\n\n\
         Every figure is in `results.csv` beside this file; the tables as printed:\n\n```text\n{transcript}```\n"
    )
}

/// Replaces the results in `dest` (its CSV, SVG and summary files; subfolders and other files are left alone) with
/// the ones in `run`, so that `dest` holds one run's set. Returns how many files were written.
fn copy_set(run: &Path, dest: &Path) -> io::Result<usize> {
    fs::create_dir_all(dest)?;
    for entry in fs::read_dir(dest)? {
        let path = entry?.path();
        if path.is_file() && is_result_file(&path) {
            fs::remove_file(&path)?;
        }
    }
    let mut written = 0;
    for entry in fs::read_dir(run)? {
        let path = entry?.path();
        if let (true, Some(name)) = (is_result_file(&path), path.file_name()) {
            fs::copy(&path, dest.join(name))?;
            written += 1;
        }
    }
    Ok(written)
}

fn is_result_file(path: &Path) -> bool {
    let (name, extension) = (path.file_name(), path.extension());
    name.is_some_and(|n| n == SUMMARY) || extension.is_some_and(|e| e == "csv" || e == "svg")
}

/// `2026-11-24T18-05-09Z`: sortable, and valid as a file name everywhere.
pub fn utc_stamp(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time)
        .to_string()
        .replace(':', "-")
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::{copy_set, utc_stamp};

    #[test]
    fn stamps_read_as_utc_dates() {
        assert_eq!(utc_stamp(UNIX_EPOCH), "1970-01-01T00-00-00Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_827_696);
        assert_eq!(utc_stamp(leap), "2000-02-29T12-34-56Z");
        let later = UNIX_EPOCH + Duration::from_secs(1_795_478_400);
        assert_eq!(utc_stamp(later), "2026-11-24T00-00-00Z");
    }

    #[test]
    fn a_save_replaces_the_previous_set_and_leaves_the_rest() {
        let root = std::env::temp_dir().join(format!("corewheel-perf-save-{}", std::process::id()));
        let (run, dest) = (root.join("run"), root.join("dest"));
        std::fs::create_dir_all(&run).unwrap();
        std::fs::create_dir_all(dest.join("other-machine")).unwrap();
        for name in ["results.csv", "a.svg", "summary.md"] {
            std::fs::write(run.join(name), "new").unwrap();
        }
        for name in ["results.csv", "stale.svg", "summary.md", "README.txt"] {
            std::fs::write(dest.join(name), "old").unwrap();
        }
        assert_eq!(copy_set(&run, &dest).unwrap(), 3);
        let read = |name: &str| std::fs::read_to_string(dest.join(name)).ok();
        assert_eq!(read("results.csv").as_deref(), Some("new"));
        assert_eq!(read("a.svg").as_deref(), Some("new"));
        assert_eq!(
            read("stale.svg"),
            None,
            "a previous run's plot outlived the save"
        );
        assert_eq!(read("README.txt").as_deref(), Some("old"));
        assert!(dest.join("other-machine").is_dir());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
