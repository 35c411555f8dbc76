#!/usr/bin/env bash
# Miri: the library's unit tests that need no driver (no mmap,
# memfd or CUDA) under the Miri interpreter, which reports undefined behaviour
# in the unsafe code they reach: element conversion, the C buffer contract,
# the panic boundary, block split/merge, tags, dtypes, the GGUF parser and
# the metadata C functions,
# errors and reports. Installs the nightly toolchain with miri and rust-src
# when missing (skips with the reason when they cannot be installed);
# VMMW_MIRI=0 skips it. Bounded by a timeout (VMMW_MIRI_SECONDS, default 1200).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${VMMW_MIRI:-1}" = 0 ]; then
  echo "SKIP miri: VMMW_MIRI=0"
  exit 0
fi
source scripts/install-lib.sh
if ! vmmw_need_toolchain nightly miri rust-src; then
  echo "SKIP miri: nightly with miri and rust-src could not be installed" \
    "(rustup +nightly component add miri rust-src)"
  exit 0
fi
tests=(
  driver::convert::
  ffi::buffer::
  ffi::boundary::
  ffi::status::
  pool::block::
  tag::
  loader::dtype::
  loader::ggml_type::
  loader::gguf::
  ffi::metadata::
  error::
  report::
)
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation}"
# Not here: loader::copy::slot_copy (non-temporal stores and sfence, which
# Miri cannot run) and everything that maps memory.
timeout "${VMMW_MIRI_SECONDS:-1200}" cargo +nightly miri test --lib -- "${tests[@]}"
