#!/usr/bin/env bash
# Lines of src/engine/ without its unit-test modules (everything from a file's first
# `#[cfg(test)]` or `#[cfg(all(test, ...))]` line on is a test module by this crate's layout).
cd "$(dirname "$0")/.."
total=0
for f in src/engine/*.rs; do
  n=$(awk '/^#\[cfg\((all\()?test/ { exit } { n++ } END { print n + 0 }' "$f")
  printf '%6d %s\n' "$n" "$f"
  total=$((total + n))
done
printf '%6d total\n' "$total"
