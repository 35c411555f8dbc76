#!/usr/bin/env bash
# Syntax and type check of the CUDA C kernels (kernels/*.cu) with clang, for
# machines without nvcc: kernels/syntax-check.h stands in for the CUDA
# headers. The PTX itself is built by nvcc on a GPU machine
# (scripts/build-ptx.sh) and checked there (scripts/gpu.d/62-reload.sh,
# 64-codec.sh). Skips (exit 0) when no clang with CUDA support is found.
set -euo pipefail
cd "$(dirname "$0")/.."
clang=""
for c in clang clang-18 clang-17 clang-16 clang-15 clang-14; do
  if command -v "$c" >/dev/null; then clang=$c; break; fi
done
if [ -z "$clang" ]; then
  echo "check-kernels: SKIP (no clang)"
  exit 0
fi
for f in kernels/*.cu; do
  "$clang" -x cuda --cuda-device-only -nocudainc -nocudalib --cuda-gpu-arch=sm_75 -Xclang -target-feature -Xclang +ptx64 \
    -Wall -Wextra -Werror -include kernels/syntax-check.h -S -o /dev/null "$f"
  echo "check-kernels: $f ok ($clang)"
done

# The codec kernels run on the CPU (kernels/emu) against the Rust reference.
cxx=$(command -v g++ || command -v clang++ || true)
if [ -z "$cxx" ]; then
  echo "check-kernels: emulation SKIP (no C++ compiler)"
  exit 0
fi
emu=$(mktemp -d)/codec-emu
"$cxx" -std=c++20 -O2 -Wall -Wextra -Werror -o "$emu" kernels/emu/emu.cpp
VMMW_CODEC_EMU=$emu cargo test --test all codec::kernels_emulated -- --nocapture
rm -rf "$(dirname "$emu")"
