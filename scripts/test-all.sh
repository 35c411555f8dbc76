#!/usr/bin/env bash
# Runs every test (Rust, C, C++, Go, Python) after installing what a fresh machine lacks.
# Each part lives in scripts/test.d/NN-name.sh and runs in order; the first failure stops the run.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
for part in scripts/test.d/*.sh; do
  echo "=== ${part#scripts/test.d/}"
  bash "$part"
done
echo "=== all test parts passed"
