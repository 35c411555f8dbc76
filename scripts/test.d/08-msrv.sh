#!/usr/bin/env bash
# MSRV: Cargo.toml's rust-version against what every locked dependency
# declares (scripts/check-msrv.py); then that toolchain (installed when
# missing, minimal profile) checks the crate with every feature and its
# tests, which covers this crate's own code too.
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
CARGO_TARGET_DIR=target/msrv cargo "+$msrv" check --locked --all-features --all-targets --quiet
echo "MSRV: cargo +$msrv check passed (all features, all targets)"
