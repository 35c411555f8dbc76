#!/usr/bin/env bash
# Rust: format, lint (the library as its users build it, then with the `cli`
# feature), the API docs (no broken or private links), unit and integration
# tests on the host backend with the command line, and the Rust example
# (examples/quickstart.rs: open, load, sleep, wake, check) on the host
# backend. VMMW_QUICK=1 runs the tests that need no command line only and
# lints once.
set -euo pipefail
rustup component add rustfmt clippy >/dev/null 2>&1 || true
cargo fmt --all -- --check
if [ "${VMMW_QUICK:-0}" = 1 ]; then
  cargo clippy --all-targets --features cli -- -D warnings
  VMMW_BACKEND=host cargo test --lib --features cli
  VMMW_BACKEND=host cargo run --quiet --example quickstart
  exit 0
fi
cargo clippy --all-targets -- -D warnings
cargo clippy --all-targets --features cli -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps
VMMW_BACKEND=host cargo test --all-targets --features cli
cargo test --doc  # the crate docs' examples compile (three: a few seconds)
VMMW_BACKEND=host cargo run --quiet --example quickstart
