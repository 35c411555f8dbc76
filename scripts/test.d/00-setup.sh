#!/usr/bin/env bash
# What a fresh machine lacks, installed once, before the parts that use it
# (each of them installs what it needs as well when run alone):
# clang (the CUDA kernels' syntax check), cbindgen (the header drift check),
# and for the full run the MSRV toolchain, nightly with miri and rust-src,
# and cargo-fuzz. Nothing is installed twice; each install is named here.
# Installing on a fresh machine takes minutes (the README's table), once.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/install-lib.sh
# A failed install is not fatal here: the part that needs the tool tries
# again and fails, or prints SKIP with the reason, in the run's summary.
vmmw_need_apt clang clang || true
vmmw_need_cargo_tool cbindgen cbindgen 0.29.4 || true
if [ "${VMMW_QUICK:-0}" != 1 ]; then
  vmmw_need_toolchain "$(vmmw_msrv)" || true
  vmmw_need_toolchain nightly miri rust-src || true
  vmmw_need_cargo_tool cargo-fuzz cargo-fuzz 0.13.2 || true
fi
