#!/usr/bin/env bash
# MSRV: Cargo.toml's rust-version against what every locked dependency
# declares (scripts/check-msrv.py); then that toolchain (installed when
# missing, minimal profile) checks what a user of the crate compiles with
# it: the library with every feature, the `vmmw` command line and the
# examples (the tests are this repository's own, built with stable).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/install-lib.sh
python3 scripts/check-msrv.py --self-test
msrv=$(vmmw_msrv)
if [ "${VMMW_QUICK:-0}" = 1 ]; then
  echo "SKIP cargo +$msrv check: quick mode"
  exit 0
fi
if ! vmmw_need_toolchain "$msrv"; then
  echo "SKIP cargo +$msrv check: the toolchain could not be installed (rustup toolchain install $msrv --profile minimal)"
  exit 0
fi
CARGO_TARGET_DIR=target/msrv cargo "+$msrv" check --locked --all-features --lib --bins --examples --quiet
echo "MSRV: cargo +$msrv check passed (all features: the library, vmmw, the examples)"
