//! loom models of corewheel's concurrent protocols.
//!
//! The models live in `tests/` and compile only with `RUSTFLAGS="--cfg loom"`, which also
//! switches corewheel's `sync` shim to loom's atomics, so the models explore the library's
//! real code. `scripts/test-all.sh` runs them.
