#!/usr/bin/env bash
# corewheel's whole test suite, from a fresh machine: unit, integration, property and doc
# tests, the loom models, and Miri. Installs the nightly Miri component when it is missing;
# if that cannot be done, says so loudly and runs the rest.
set -euo pipefail
cd "$(dirname "$0")/.."

log=$(mktemp)
trap 'rm -f "$log"' EXIT
section() { printf '\n==> %s\n' "$*"; }
# Runs a test command, keeping its output for the final count.
run() { "$@" 2>&1 | tee -a "$log"; }

section "Unit, integration, property and doc tests (benches and the perf harness build too)"
run cargo test --workspace --all-targets
run cargo test --workspace --doc

section "loom models (RUSTFLAGS=--cfg loom; separate target dir keeps the normal build cached)"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom run cargo test -p corewheel-loom-tests --release

section "Miri over the library's unit tests"
miri_ok=1
if ! cargo +nightly miri --version >/dev/null 2>&1; then
  echo "Miri is missing: installing the nightly toolchain's miri and rust-src components"
  rustup toolchain install nightly --profile minimal --component miri,rust-src \
    || rustup component add --toolchain nightly miri rust-src \
    || miri_ok=0
fi
if [ "$miri_ok" = 1 ] && cargo +nightly miri --version >/dev/null 2>&1; then
  cargo +nightly miri setup >/dev/null
  run cargo +nightly miri test -p corewheel --lib
else
  cat <<'WARN'

!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
!!  MIRI WAS NOT RUN: the nightly toolchain's miri component could not be installed. !!
!!  The unsafe code's unit tests have NOT been checked for undefined behaviour.      !!
!!  Install it with: rustup component add --toolchain nightly miri rust-src          !!
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
WARN
fi

# One closing line for the whole suite; `set -e` has already stopped on any failure.
awk '/^test result:/ { p += $4; f += $6 } END { printf "\ncorewheel test suite: %d passed, %d failed\n", p, f }' "$log"
