#!/usr/bin/env bash
# Loader on the GPU: the bitwise-equal forward test through the C API, then the
# load benchmark (link, reference, ours page-cached and cold, disk) in one run.
# Needs .gpu/libvmmweights.so and .gpu/vmmw (prebuilt; no Rust toolchain here).
# LOAD_LAYERS=36 (default) is the 16.4 GB checkpoint; fewer layers for quick runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="examples/torch${PYTHONPATH:+:$PYTHONPATH}"
export VMMW_LIB="${VMMW_LIB:-.gpu/libvmmweights.so}"
export VMMW_BACKEND=cuda PYTHONUNBUFFERED=1
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "SKIP 20-load: PyTorch with CUDA is not available on this machine"
  exit 0
fi
python3 -m pytest -q -s tests/torch/test_load_bitwise.py
out="${OUT:-.}/bench/results"
mkdir -p "$out"
# The checkpoint goes to local disk (not /dev/shm) so a cold load means the disk.
python3 tests/torch/bench_load_reference.py --dir "${LOAD_DIR:-/root/vmmw-ckpt-8b}" \
  --layers "${LOAD_LAYERS:-36}" --vmmw .gpu/vmmw --out "$out/load.json" --cold
