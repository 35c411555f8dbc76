#!/usr/bin/env bash
# Syntax and type check of the CUDA C kernels (kernels/*.cu) with clang, for
# machines without nvcc: kernels/syntax-check.h stands in for the CUDA
# headers. The PTX itself is built by nvcc on a GPU machine
# (scripts/build-ptx.sh) and checked there (scripts/gpu.d/62-reload.sh,
# 64-codec.sh). clang is installed when missing (scripts/install-lib.sh);
# where it cannot be, the syntax check prints SKIP with the reason and the
# emulation still runs.
set -euo pipefail
cd "$(dirname "$0")/.."
clang=""
for c in clang clang-18 clang-17 clang-16 clang-15 clang-14; do
  if command -v "$c" >/dev/null; then clang=$c; break; fi
done
if [ -z "$clang" ]; then
  source scripts/install-lib.sh
  if why=$(vmmw_need_apt clang clang); then
    echo "$why"
    clang=clang
  else
    echo "SKIP kernels' clang syntax check: $why"
  fi
fi
if [ -n "$clang" ]; then
  for f in kernels/*.cu; do
    "$clang" -x cuda --cuda-device-only -nocudainc -nocudalib --cuda-gpu-arch=sm_75 -Xclang -target-feature -Xclang +ptx64 \
      -Wall -Wextra -Werror -include kernels/syntax-check.h -S -o /dev/null "$f"
    echo "check-kernels: $f ok ($clang)"
  done
fi

# The codec kernels run on the CPU (kernels/emu) against the Rust reference.
cxx=$(command -v g++ || command -v clang++ || true)
if [ -z "$cxx" ]; then
  echo "SKIP kernels' CPU emulation: no C++ compiler (g++ or clang++)"
  exit 0
fi
emu=$(mktemp -d)/codec-emu
"$cxx" -std=c++20 -O2 -Wall -Wextra -Werror -o "$emu" kernels/emu/emu.cpp
# --features cli: the test binary 10-rust.sh built, not a second build without it.
VMMW_CODEC_EMU=$emu cargo test --features cli --test all codec::kernels_emulated -- --nocapture
rm -rf "$(dirname "$emu")"
