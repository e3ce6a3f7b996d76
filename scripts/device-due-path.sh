#!/usr/bin/env bash
# The due path's runs on a lent many-core machine, which has no Rust toolchain: build the
# harness here, then run this script there with the binary, in one call.
#
#   here:   ./scripts/device-due-path.sh build        # writes target/device/perf-bin (stripped)
#   there:  ./scripts/device-due-path.sh run OUT_DIR  # about 4 minutes on 16 cores
#
# target/device is ignored by git, so the device tool must carry it: carry ["target/device"].
# The binary keeps its runs under target/perf-runs there, as `cargo run` would.
#
# PERF_ARGS adds arguments to both harness runs: PERF_ARGS="--timers 20000 --mix-seconds 1"
# makes a smoke run of the script in under a minute.
#
# `run` sweeps burst-steal over 2, 4, 8 and 16 workers (the bursts' hand-outs are what
# should make the last fire fall with the worker count), then the rest of the due-path
# set at the machine's default worker count, each saved as a folder under OUT_DIR with the
# machine's facts beside it. Copy those folders to perf/results/16-core/ and say in its
# README which commit the binary was built from.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  build)
    cargo build --release -p corewheel-perf
    mkdir -p target/device
    strip -o target/device/perf-bin "${CARGO_TARGET_DIR:-target}/release/corewheel-perf"
    git rev-parse --short HEAD > target/device/commit
    echo "built target/device/perf-bin from $(cat target/device/commit)"
    ;;
  run)
    out="${2:?usage: $0 run OUT_DIR}"
    mkdir -p "$out"
    {
      echo "commit: $(cat target/device/commit 2>/dev/null || echo unknown)"
      echo "date: $(date -u +%FT%TZ)"
      echo "cpus: $(nproc)"
      grep -m1 'model name' /proc/cpuinfo || true
      uname -r
    } > "$out/machine.txt"
    # shellcheck disable=SC2086 # PERF_ARGS is a list of arguments.
    ./target/device/perf-bin --workloads burst-steal --threads 2,4,8,16 ${PERF_ARGS:-} --save "$out/burst-steal"
    # shellcheck disable=SC2086
    ./target/device/perf-bin --workloads fire-storm,engine-live-1m,steady-mix,light-load ${PERF_ARGS:-} \
      --save "$out/due-path"
    ;;
  *)
    echo "usage: $0 build | run OUT_DIR" >&2
    exit 2
    ;;
esac
