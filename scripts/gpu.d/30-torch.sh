#!/usr/bin/env bash
# PyTorch on the GPU: a transformers model built inside our MemPool (report vs
# torch and device counters, forward pass, memory back after trim), then the
# cached alloc+free benchmark against PyTorch's caching allocator.
# Needs .gpu/libvmmweights.so and .gpu/vmmw (prebuilt; no Rust toolchain here).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="examples/torch${PYTHONPATH:+:$PYTHONPATH}"
export VMMW_LIB="${VMMW_LIB:-.gpu/libvmmweights.so}"
export VMMW_BACKEND=cuda
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "SKIP 30-torch: PyTorch with CUDA is not available on this machine"
  exit 0
fi
python3 -m pytest -q -s tests/torch/test_pool_torch.py
out="${OUT:-.}/bench/results"
mkdir -p "$out"
python3 tests/torch/bench_pool.py --vmmw .gpu/vmmw --out "$out/pool_alloc_free.json"
