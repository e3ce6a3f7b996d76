//! Where a run's results go. Every run writes its CSV, plots and `summary.md` into a folder
//! of its own under the build's target directory, named by the UTC date and time it began,
//! so a run never overwrites another's (nor the committed reference results) and a
//! checkout stays clean. `--save DIR` then copies that one run's files over DIR's, as one
//! set: the reference results in `perf/results/` are only ever written that way.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The file names a run writes, by extension: everything a save replaces in its folder.
const RESULT_EXTENSIONS: [&str; 2] = ["csv", "svg"];

/// The run's summary: its command line, machine and tables.
pub const SUMMARY: &str = "summary.md";

/// The CSV of every figure the run measured.
pub const CSV: &str = "results.csv";

/// Makes a fresh folder for this run: `<target>/perf-runs/<UTC date and time>`, with a
/// suffix if a run that began in the same second already has that name.
pub fn create() -> io::Result<PathBuf> {
    let runs = target_dir().join("perf-runs");
    fs::create_dir_all(&runs)?;
    let stamp = utc_stamp(SystemTime::now());
    for attempt in 1..=1000 {
        let name = if attempt == 1 {
            stamp.clone()
        } else {
            format!("{stamp}-{attempt}")
        };
        let dir = runs.join(name);
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(error),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("every run folder name for {stamp} is taken"),
    ))
}

/// The target directory this binary was built into (`<target>/<profile>/corewheel-perf`),
/// so that `CARGO_TARGET_DIR` is respected; the workspace's `target/` if that cannot be told.
pub fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.to_path_buf()))
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// Replaces the results in `dest` (its CSV, SVG and summary files; subfolders and other
/// files are left alone) with the ones in `run`, so that `dest` holds one run's set.
/// Returns the files written.
pub fn save(run: &Path, dest: &Path) -> io::Result<Vec<PathBuf>> {
    fs::create_dir_all(dest)?;
    for entry in fs::read_dir(dest)? {
        let path = entry?.path();
        if path.is_file() && is_result_file(&path) {
            fs::remove_file(&path)?;
        }
    }
    let mut written = Vec::new();
    let mut files: Vec<PathBuf> = fs::read_dir(run)?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<io::Result<_>>()?;
    files.sort();
    for path in files.into_iter().filter(|path| is_result_file(path)) {
        if let Some(name) = path.file_name() {
            let to = dest.join(name);
            fs::copy(&path, &to)?;
            written.push(to);
        }
    }
    Ok(written)
}

fn is_result_file(path: &Path) -> bool {
    path.file_name().is_some_and(|name| name == SUMMARY)
        || path
            .extension()
            .and_then(|extension| extension.to_str())
            .is_some_and(|extension| RESULT_EXTENSIONS.contains(&extension))
}

/// `2026-11-24T18-05-09Z`: sortable, and valid as a file name everywhere.
pub fn utc_stamp(time: SystemTime) -> String {
    let seconds = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let (year, month, day) = civil_from_days((seconds / 86_400) as i64);
    let of_day = seconds % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}-{:02}-{:02}Z",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::{save, utc_stamp};

    #[test]
    fn stamps_read_as_utc_dates() {
        assert_eq!(utc_stamp(UNIX_EPOCH), "1970-01-01T00-00-00Z");
        // 2000-02-29 (a leap day) 12:34:56 UTC.
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
        for (name, text) in [
            ("results.csv", "new"),
            ("a.svg", "new"),
            ("summary.md", "new"),
        ] {
            std::fs::write(run.join(name), text).unwrap();
        }
        for name in ["results.csv", "stale.svg", "summary.md", "README.txt"] {
            std::fs::write(dest.join(name), "old").unwrap();
        }
        let written = save(&run, &dest).unwrap();
        assert_eq!(written.len(), 3);
        let read = |name: &str| std::fs::read_to_string(dest.join(name)).ok();
        assert_eq!(read("results.csv").as_deref(), Some("new"));
        assert_eq!(read("a.svg").as_deref(), Some("new"));
        assert_eq!(read("summary.md").as_deref(), Some("new"));
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
