#!/usr/bin/env bash
# Runs every test (Rust, C, C++, Go, Python) after installing what a fresh machine lacks.
# Each part lives in scripts/test.d/NN-name.sh and runs in order; the first failure stops the run.
#
# VMMW_QUICK=1 is the quick mode (README says what it skips): the Rust
# integration tests, the second clippy pass, the MSRV toolchain build, fuzzing
# and Miri. Everything else (C, C++, Go, Python, ABI, install) runs as in full.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
if [ "${VMMW_QUICK:-0}" = 1 ]; then
  export VMMW_FUZZ_SECONDS=0 VMMW_MIRI=0
  echo "=== quick mode (VMMW_QUICK=1): about 8 minutes on 2 cores from a fresh clone"
else
  echo "=== full run: about 11 minutes on 2 cores from a fresh clone, 6 of them fuzzing (README; VMMW_QUICK=1 for the quick mode)"
fi
start=$SECONDS
for part in scripts/test.d/*.sh; do
  echo "=== ${part#scripts/test.d/}"
  t0=$SECONDS
  bash "$part"
  echo "=== ${part#scripts/test.d/}: $((SECONDS - t0)) s"
done
echo "=== all test parts passed in $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"
