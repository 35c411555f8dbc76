#!/usr/bin/env bash
# The go-swap service (examples/go-swap) on the GPU: three models of about
# 5 GB (bf16 safetensors written with torch in SWAP_DIR, default
# /root/vmmw-swap, kept for later runs), swaps among them timed against the
# link measured in the same run and against the service's own load of the same
# model from page cache, then every model's device bytes hashed against its
# file. The service binary comes from the bundle (.gpu/go-swap, built with cgo
# by scripts/build-gpu-bundle.sh: this machine has no Go toolchain).
# Writes swap.txt and swap.json to $VMMW_GPU_OUT.
# SWAP_GB (default 5) sizes each model; SWAP_ROUNDS (default 3) the timed rounds.
set -uo pipefail
source scripts/gpu-lib.sh
if [ ! -x .gpu/go-swap ]; then
  result "swap: go-swap service" SKIP "no .gpu/go-swap in the bundle (built where go was missing?)"
  exit 0
fi
if ! python3 -c 'import torch, safetensors, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  result "swap: go-swap service" SKIP "PyTorch with CUDA (and safetensors) not available on this machine"
  exit 0
fi
# The service links libvmmweights under its SONAME, as an installed copy is found.
libdir=$(mktemp -d)
trap 'rm -rf "$libdir"' EXIT
lib="$PWD/.gpu/libvmmweights.so"
soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
ln -s "$lib" "$libdir/${soname:-libvmmweights.so}"
txt="$VMMW_GPU_OUT/swap.txt"
# Three models of SWAP_GB each, counted as if all were on the GPU at once.
fits "swap: go-swap service" $(python3 -c 'import sys; print(int(3 * float(sys.argv[1]) * 1e9) >> 20)' "${SWAP_GB:-5}") || exit 0
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONUNBUFFERED=1 \
  python3 examples/go-swap/bench/swap_bench.py --service .gpu/go-swap --dir "${SWAP_DIR:-/root/vmmw-swap}" \
  --gb "${SWAP_GB:-5}" --rounds "${SWAP_ROUNDS:-3}" --out "$VMMW_GPU_OUT/swap.json" 2>&1 | tee "$txt"
t=${PIPESTATUS[0]}
result_of "swap: go-swap, 3 x ${SWAP_GB:-5} GB, swap vs link and page-cache load" "$(grep -E '^(PASS|FAIL|SKIP)' "$txt" | tail -1)" swap.txt || exit 1
exit "$t"
