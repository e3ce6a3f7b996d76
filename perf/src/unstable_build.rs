//! The copy of this harness built with `--cfg tokio_unstable`, for the tokio-alt subject.
//!
//! tokio compiles its alternative timer (`Builder::enable_alt_timer`, tokio 1.49 and later)
//! only when `--cfg tokio_unstable` reaches tokio's own build, and cargo has no stable way
//! to give one dependency a cfg: the flag goes in RUSTFLAGS, for every crate of the build.
//! Rather than build the whole workspace that way (its tests and the other subjects would
//! then measure a tokio_unstable tokio), the harness builds a second copy of itself, from
//! the same sources and Cargo.lock, into a target directory of its own
//! (`<target>/tokio-unstable`), with RUSTFLAGS plus `--cfg tokio_unstable`; and runs each
//! tokio-alt measurement in that copy as a child process (see [`crate::child`]). cargo
//! builds it on the first run that needs it (a minute or two) and finds it up to date after
//! that, so a fresh checkout needs no step of its own.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// What the cfg adds to the flags.
const CFG: [&str; 2] = ["--cfg", "tokio_unstable"];

/// The copy's executable, built once per run; the error says why it could not be built.
static EXE: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// The executable to run tokio-alt measurements in: this one if it was built with
/// `--cfg tokio_unstable`, else the copy, built (or found up to date) on the first call.
pub fn exe() -> Result<PathBuf, String> {
    if cfg!(tokio_unstable) {
        return std::env::current_exe()
            .map_err(|error| format!("could not find this executable: {error}"));
    }
    EXE.get_or_init(build).clone()
}

/// Whether the copy has been asked for already in this run (so the caller knows whether a
/// call to [`exe`] may take minutes).
pub fn ready() -> bool {
    cfg!(tokio_unstable) || EXE.get().is_some()
}

/// `flags` with the cfg added, in the form of the variable they came from: RUSTFLAGS is
/// split on whitespace, CARGO_ENCODED_RUSTFLAGS on the 0x1f separator.
pub fn with_cfg(flags: &str, encoded: bool) -> String {
    let separator = if encoded { "\u{1f}" } else { " " };
    let mut parts: Vec<&str> = if encoded {
        flags
            .split('\u{1f}')
            .filter(|part| !part.is_empty())
            .collect()
    } else {
        flags.split_whitespace().collect()
    };
    let has_cfg =
        parts.windows(2).any(|pair| pair == CFG) || parts.contains(&"--cfg=tokio_unstable");
    if !has_cfg {
        parts.extend(CFG);
    }
    parts.join(separator)
}

/// The cargo profile of this build, as `cargo build` takes it.
fn profile_args() -> &'static [&'static str] {
    if cfg!(debug_assertions) {
        &[]
    } else {
        &["--release"]
    }
}

/// The folder the copy is built into.
pub fn target_dir() -> PathBuf {
    crate::run_folder::target_dir().join("tokio-unstable")
}

fn build() -> Result<PathBuf, String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let target = target_dir();
    // `cargo run` tells the program it runs which cargo it is.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut command = Command::new(&cargo);
    command
        .arg("build")
        .args(profile_args())
        .args(["--quiet", "-p", "corewheel-perf", "--bin", "corewheel-perf"])
        .arg("--manifest-path")
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", &target)
        .stdin(Stdio::null());
    // Keep whatever flags the parent was built with, and add the cfg to them.
    match std::env::var("CARGO_ENCODED_RUSTFLAGS") {
        Ok(flags) if !flags.is_empty() => {
            command.env("CARGO_ENCODED_RUSTFLAGS", with_cfg(&flags, true));
        }
        _ => {
            let flags = std::env::var("RUSTFLAGS").unwrap_or_default();
            command
                .env_remove("CARGO_ENCODED_RUSTFLAGS")
                .env("RUSTFLAGS", with_cfg(&flags, false));
        }
    }
    let output = command.output().map_err(|error| {
        format!(
            "could not run {} to build the tokio_unstable copy: {error}",
            Path::new(&cargo).display()
        )
    })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(12).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!(
            "building the tokio_unstable copy into {} failed ({}): {}",
            target.display(),
            output.status,
            tail.join(" | ")
        ));
    }
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let exe = target
        .join(profile)
        .join(format!("corewheel-perf{}", std::env::consts::EXE_SUFFIX));
    if exe.is_file() {
        Ok(exe)
    } else {
        Err(format!(
            "cargo built the tokio_unstable copy, but {} is not there",
            exe.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::with_cfg;

    #[test]
    fn the_cfg_is_added_once_to_either_form() {
        assert_eq!(with_cfg("", false), "--cfg tokio_unstable");
        assert_eq!(
            with_cfg("-C target-cpu=native", false),
            "-C target-cpu=native --cfg tokio_unstable"
        );
        assert_eq!(
            with_cfg("--cfg tokio_unstable -Cdebuginfo=1", false),
            "--cfg tokio_unstable -Cdebuginfo=1"
        );
        assert_eq!(
            with_cfg("--cfg=tokio_unstable", false),
            "--cfg=tokio_unstable"
        );
        assert_eq!(
            with_cfg("-C\u{1f}target-cpu=native", true),
            "-C\u{1f}target-cpu=native\u{1f}--cfg\u{1f}tokio_unstable"
        );
        assert_eq!(with_cfg("", true), "--cfg\u{1f}tokio_unstable");
    }
}
