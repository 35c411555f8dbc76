#!/usr/bin/env bash
# Miri: the library's unit tests that need no driver (no mmap,
# memfd or CUDA) under the Miri interpreter, which reports undefined behaviour
# in the unsafe code they reach: element conversion, the C buffer contract,
# the panic boundary, block split/merge, tags, dtypes, the GGUF parser and
# the metadata C functions,
# errors and reports. Skips with a message when the nightly toolchain or its
# miri component is missing (rustup +nightly component add miri rust-src);
# VMMW_MIRI=0 skips it too. Bounded by a timeout (VMMW_MIRI_SECONDS, default 1200).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${VMMW_MIRI:-1}" = 0 ]; then
  echo "SKIP miri: VMMW_MIRI=0"
  exit 0
fi
if ! rustup run nightly cargo miri --version >/dev/null 2>&1; then
  echo "SKIP miri: the nightly miri component is not installed" \
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
