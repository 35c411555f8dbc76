#!/usr/bin/env bash
# MSRV: Cargo.toml's rust-version against what every locked dependency
# declares (scripts/check-msrv.py); then, where that toolchain is installed
# (rustup toolchain install <version> --profile minimal), the crate with every
# feature and its tests checked by it, which covers this crate's own code too.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 scripts/check-msrv.py --self-test
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
[[ $msrv == *.*.* ]] || msrv="$msrv.0"  # rustup names toolchains 1.88.0
if [ "${VMMW_QUICK:-0}" = 1 ]; then
  echo "SKIP cargo +$msrv check: quick mode"
elif rustup run "$msrv" cargo --version >/dev/null 2>&1; then
  CARGO_TARGET_DIR=target/msrv cargo "+$msrv" check --locked --all-features --all-targets --quiet
  echo "MSRV: cargo +$msrv check passed (all features, all targets)"
else
  echo "SKIP cargo +$msrv check: toolchain $msrv not installed (rustup toolchain install $msrv --profile minimal)"
fi
