#!/usr/bin/env bash
# corewheel's whole test suite, from a fresh machine: unit, integration, real-clock soak,
# property and doc tests, the benchmarks run once each, the loom models, Miri, and the
# durable timers' tests when that crate is there. Installs the nightly Miri component when
# it is missing; if that cannot be done, says so loudly and runs the rest. Installs
# redis-server (Debian, as root) for the durable stage when it is missing; if that cannot be
# done, says so loudly.
#
#   ./scripts/test-all.sh              every stage
#   ./scripts/test-all.sh loom miri    only those stages, in the order given
#
# Stages: unit integration proxy property doc benches soak loom miri durable. Every stage
# runs even when an earlier one failed; the script ends with a table of what each stage ran
# and exits non-zero if any stage failed. A CARGO_TARGET_DIR you set is respected (the loom
# build goes to its loom/ subfolder, so that its RUSTFLAGS do not invalidate the normal
# build).
#
# The root crate's integration tests are one binary per subject (tests/<subject>/main.rs,
# helpers in tests/support/). The `soak` binary (long real-time stress loops) has a stage
# of its own; the `wheel` binary's model-based property tests (its `model` module) are the
# property stage, and the rest of it is in the integration stage.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

all_stages=(unit integration proxy property doc benches soak loom miri durable)
if [ $# -gt 0 ]; then
  stages=("$@")
else
  stages=("${all_stages[@]}")
fi
for stage in "${stages[@]}"; do
  case " ${all_stages[*]} " in
    *" $stage "*) ;;
    *) echo "unknown stage '$stage'; the stages are: ${all_stages[*]}" >&2; exit 2 ;;
  esac
done

target_dir="${CARGO_TARGET_DIR:-target}"
# No incremental build (unless the caller asks for one): from an empty build folder, as CI
# starts, it only costs, splitting each optimised test binary into many more codegen units
# (perf/results/test-all/incremental.txt).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# The integration test binaries (tests/<name>/main.rs), but the soak binary, each a --test
# flag; the wheel binary's property tests (module `model`) are left to the property stage.
soak_binary=soak
property_binary=wheel
property_filter=model::
integration_binaries=()
integration_flags=()
for file in tests/*/main.rs; do
  name=$(basename "$(dirname "$file")")
  case $name in
    "$soak_binary" | "$property_binary") ;;
    *) integration_binaries+=("$name") integration_flags+=(--test "$name") ;;
  esac
done

# cargo-nextest runs each test in a process of its own, several at once: most of these tests
# wait on the real clock, and tests that measure the whole process (its CPU time, its
# workers' wake-ups) no longer have to take turns inside one binary. Without it the same
# tests run under `cargo test`, one binary after another, several times slower.
have_nextest=0
# Whether the installed cargo-nextest reads .config/nextest.toml's test priorities (0.9.91).
nextest_is_recent() {
  local version
  version=$(cargo nextest --version 2>/dev/null | awk 'NR == 1 { print $2 }') || return 1
  [ -n "$version" ] && [ "$(printf '%s\n0.9.91\n' "$version" | sort -V | head -1)" = 0.9.91 ]
}
ensure_nextest() {
  if nextest_is_recent; then
    have_nextest=1
    return
  fi
  echo "cargo-nextest is missing or older than 0.9.91: installing its prebuilt binary into ${CARGO_HOME:-$HOME/.cargo}/bin"
  mkdir -p "${CARGO_HOME:-$HOME/.cargo}/bin"
  curl -LsSf https://get.nexte.st/latest/linux | tar zxf - -C "${CARGO_HOME:-$HOME/.cargo}/bin" \
    || cargo install cargo-nextest --locked || true
  if nextest_is_recent; then
    have_nextest=1
    return
  fi
  cat <<'WARN'

!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
!!  CARGO-NEXTEST IS MISSING and could not be installed: the tests run under plain   !!
!!  `cargo test` instead, one binary at a time. Nothing is skipped, but the suite     !!
!!  takes several times longer. Install it with: cargo install cargo-nextest --locked !!
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
WARN
}
# Tests at once under nextest: most wait on the clock rather than use a core.
test_threads=6
# Under nextest every stage picks its tests out of one build of the whole workspace with
# every feature on (the first stage builds it), so that each crate is compiled once rather
# than once per feature set that a stage's packages happen to ask for. The loom models,
# built with other flags, are apart.
workspace=(--workspace --exclude corewheel-loom-tests --all-features)
# run_tests EXPR [cargo test's target flags] [--skip PATTERN | --only PATTERN]: under
# nextest, the tests of the workspace build that the filterset EXPR selects; without it,
# `cargo test` with the target flags and the test-name filter.
run_tests() {
  local expr=$1 targets=() skip="" only=""
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --skip) skip=$2; shift 2 ;;
      --only) only=$2; shift 2 ;;
      *) targets+=("$1"); shift ;;
    esac
  done
  if [ "$have_nextest" = 1 ]; then
    cargo nextest run --no-fail-fast --test-threads "$test_threads" "${workspace[@]}" -E "$expr"
  else
    local args=()
    [ -n "$skip" ] && args=(--skip "$skip")
    [ -n "$only" ] && args=("$only")
    cargo test --no-fail-fast "${targets[@]}" -- "${args[@]}"
  fi
}

model_tests="binary($property_binary) & test(/^${property_filter}/)"
stage_unit() {
  if [ "$have_nextest" = 1 ]; then
    run_tests 'package(corewheel) & kind(lib) | package(corewheel-perf) & kind(bin)'
  else
    run_tests '' -p corewheel --lib && run_tests '' -p corewheel-perf --bins
  fi
}
stage_integration() {
  if [ "$have_nextest" = 1 ]; then
    run_tests "package(corewheel) & kind(test) & !binary($soak_binary) & !($model_tests)"
  else
    local status=0
    run_tests '' -p corewheel "${integration_flags[@]}" || status=$?
    run_tests '' -p corewheel --test "$property_binary" --skip "$property_filter" || status=$?
    return "$status"
  fi
}
# Long real-time stress loops, apart so that the stages before them report quickly.
stage_soak() { run_tests "package(corewheel) & binary($soak_binary)" -p corewheel --test "$soak_binary"; }
# The reverse proxy on corewheel (proxy/): its unit tests and its loopback tests.
stage_proxy() { run_tests 'package(corewheel-proxy)' -p corewheel-proxy; }
stage_property() {
  run_tests "package(corewheel) & $model_tests" -p corewheel --test "$property_binary" \
    --only "$property_filter"
}
stage_doc() {
  if [ "$have_nextest" = 1 ]; then cargo test "${workspace[@]}" --doc; else cargo test -p corewheel --doc; fi
}
# criterion runs each benchmark once, as a check that it works, when run under cargo test.
stage_benches() {
  if [ "$have_nextest" = 1 ]; then
    cargo test "${workspace[@]}" --bench '*'
  else
    cargo test -p corewheel --bench '*'
  fi
}
# The loom build: its own flags and folder, so that it does not invalidate the main build.
# Optimised, but with debug assertions: the wheel's list invariants (a list's length never
# going below zero) are what catch a timer unlinked from a list the wheel no longer holds.
# Line tables only, as in the test profile: a failing model's backtrace keeps its lines.
loom_cargo() {
  RUSTFLAGS="--cfg loom -C debug-assertions" CARGO_TARGET_DIR="$target_dir/loom" \
    CARGO_PROFILE_RELEASE_DEBUG=line-tables-only cargo "$@"
}
loom_targets=(-p corewheel-loom-tests --release --tests)
# When the loom stage comes later, its build starts with the first of the stages that
# mostly wait rather than compute (the proxy's loopback tests, the property, doc and
# benchmark checks, the soaks) and runs beside them: their tests assert only what holds
# on a loaded machine, and the soaks last as long as they last whatever the load (each
# spins hogs of its own).
loom_build_beside=(proxy property doc benches soak)
loom_build_pid=""
loom_build_log=""
start_loom_build() {
  loom_build_log=$(mktemp)
  loom_cargo test --no-run "${loom_targets[@]}" >"$loom_build_log" 2>&1 &
  loom_build_pid=$!
  # A background job ignores Ctrl-C in a script: stopped with the script instead.
  trap '[ -n "$loom_build_pid" ] && kill "$loom_build_pid" 2>/dev/null' EXIT
}
# Waits, in the main shell (a stage runs in a pipeline's subshell), for that build.
loom_built=""
wait_loom_build() {
  [ -n "$loom_build_pid" ] || return 0
  loom_built=0
  wait "$loom_build_pid" || loom_built=$?
  loom_build_pid=""
}
stage_loom() {
  if [ -n "$loom_built" ] && [ -f "$loom_build_log" ]; then
    echo "(built beside the stages before)"
    cat "$loom_build_log"
    rm -f "$loom_build_log"
    [ "$loom_built" = 0 ] || return "$loom_built"
  fi
  # Two models at once (the cores); the longest model then runs beside all the others.
  local runner=(test)
  [ "$have_nextest" = 1 ] && runner=(nextest run --test-threads 2)
  loom_cargo "${runner[@]}" --no-fail-fast "${loom_targets[@]}"
}
stage_miri() {
  if ! cargo +nightly miri --version >/dev/null 2>&1; then
    echo "Miri is missing: installing the nightly toolchain's miri and rust-src components"
    rustup toolchain install nightly --profile minimal --component miri,rust-src \
      || rustup component add --toolchain nightly miri rust-src \
      || true
  fi
  if ! cargo +nightly miri --version >/dev/null 2>&1; then
    cat <<'WARN'

!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
!!  MIRI WAS NOT RUN: the nightly toolchain's miri component could not be installed. !!
!!  The unsafe code's unit tests have NOT been checked for undefined behaviour.      !!
!!  Install it with: rustup component add --toolchain nightly miri rust-src          !!
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
WARN
    return 3
  fi
  cargo +nightly miri setup >/dev/null || return 1
  cargo +nightly miri test -p corewheel --lib --no-run || return 1
  # The interpreter is single-threaded: two processes use both cores, each taking about
  # half of the tests by time (these modules, and every other test). Not a process per
  # test, as nextest would: the interpreter takes over a second to start each one.
  local half=(wheel:: sync:: time:: keyed:: future:: engine::tests::)
  local skips=() module
  for module in "${half[@]}"; do skips+=(--skip "$module"); done
  local half_log rest_log status=0
  half_log=$(mktemp)
  rest_log=$(mktemp)
  cargo +nightly miri test -p corewheel --lib -- "${half[@]}" >"$half_log" 2>&1 &
  local first=$!
  trap 'kill "$first" 2>/dev/null' EXIT
  cargo +nightly miri test -p corewheel --lib -- "${skips[@]}" >"$rest_log" 2>&1 || status=$?
  wait "$first" || status=$?
  cat "$half_log" "$rest_log"
  rm -f "$half_log" "$rest_log"
  return "$status"
}

# redis-server, for the durable timers' tests: installed with apt-get (Debian, as root) when
# it is missing. Says loudly when it cannot be had, and returns non-zero; the caller decides.
ensure_redis_server() {
  if command -v redis-server >/dev/null 2>&1; then
    return 0
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "redis-server is missing: installing it with apt-get"
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server; } || true
  fi
  if ! command -v redis-server >/dev/null 2>&1; then
    cat <<'WARN'

!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
!!  REDIS-SERVER IS MISSING and could not be installed (needs Debian's apt-get, as   !!
!!  root). The durable timers' tests that need a Redis server cannot run.            !!
!!  Install it with: apt-get install -y redis-server                                 !!
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
WARN
    return 1
  fi
}
# The durable timers (durable/), when that crate is in the tree.
stage_durable() {
  if [ ! -f durable/Cargo.toml ]; then
    echo "the durable crate (durable/Cargo.toml) is absent: nothing to test"
    return 0
  fi
  ensure_redis_server
  run_tests 'package(corewheel-durable)' -p corewheel-durable --all-features
}

describe() {
  case $1 in
    unit) echo "unit tests: the library's and the perf harness's" ;;
    integration) echo "integration tests (tests/<subject>/main.rs: ${integration_binaries[*]} $property_binary, but its property tests)" ;;
    soak) echo "real-clock soaks (tests/$soak_binary: long real-time stress loops)" ;;
    proxy) echo "the reverse proxy's tests (corewheel-proxy: timeouts and bad input on loopback)" ;;
    property) echo "property tests (the $property_binary binary's $property_filter module)" ;;
    doc) echo "doc tests, the README's examples among them" ;;
    benches) echo "criterion benchmarks, each run once as a check" ;;
    loom) echo "loom models (RUSTFLAGS='--cfg loom -C debug-assertions', target $target_dir/loom)" ;;
    miri) echo "Miri over the library's unit tests" ;;
    durable) echo "the durable timers' tests (corewheel-durable, with redis-server), if the crate is there" ;;
  esac
}

ensure_nextest
rows=()
failed_stages=0
for stage in "${stages[@]}"; do
  printf '\n==> %s: %s\n' "$stage" "$(describe "$stage")"
  if [ -z "$loom_build_log" ] && [[ " ${loom_build_beside[*]} " == *" $stage "* ]] \
    && [[ " ${stages[*]} " == *" $stage "*" loom "* ]]; then
    start_loom_build
  fi
  log=$(mktemp)
  started=$(date +%s)
  [ "$stage" = loom ] && wait_loom_build
  "stage_$stage" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  seconds=$(($(date +%s) - started))
  # libtest's and nextest's summaries; criterion's test mode prints one "Success" per
  # benchmark. nextest counts the tests a filter left out as skipped, not ignored.
  read -r passed failed ignored < <(awk '
    /^test result:/ { p += $4; f += $6; i += $8 }
    /^ *Summary \[/ {
      for (k = 1; k <= NF; k++) {
        word = $(k + 1); sub(/[,)]+$/, "", word)
        if (word == "passed") p += $k
        if (word == "failed") f += $k
      }
    }
    /^Success$/ { p += 1 }
    END { printf "%d %d %d\n", p, f, i }' "$log")
  rm -f "$log"
  case $status in
    0) outcome=ok ;;
    3) [ "$stage" = miri ] && outcome="NOT RUN" || outcome="FAILED (exit 3)" ;;
    *) outcome="FAILED (exit $status)" ;;
  esac
  # Miri that cannot be installed was announced loudly above; the rest still decides.
  case $outcome in ok | "NOT RUN") ;; *) failed_stages=$((failed_stages + 1)) ;; esac
  rows+=("$stage $passed $failed $ignored $seconds $outcome")
done

printf '\n==> corewheel test suite\n'
printf '%-12s %8s %8s %8s %8s  %s\n' stage passed failed ignored seconds result
total=(0 0 0 0)
for row in "${rows[@]}"; do
  read -r stage passed failed ignored seconds outcome <<<"$row"
  printf '%-12s %8d %8d %8d %8d  %s\n' "$stage" "$passed" "$failed" "$ignored" "$seconds" "$outcome"
  total=($((total[0] + passed)) $((total[1] + failed)) $((total[2] + ignored)) $((total[3] + seconds)))
done
printf '%-12s %8d %8d %8d %8d  %s\n' total "${total[@]}" \
  "$([ "$failed_stages" = 0 ] && echo ok || echo "$failed_stages stage(s) failed")"
echo "(Miri runs the library's unit tests again, under the interpreter: those count in both rows.)"
[ "$failed_stages" = 0 ]
