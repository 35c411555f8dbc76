#!/usr/bin/env bash
# Rust: format, lint, unit and integration tests on the host backend.
set -euo pipefail
rustup component add rustfmt clippy >/dev/null 2>&1 || true
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
VMMW_BACKEND=host cargo test --all-targets
