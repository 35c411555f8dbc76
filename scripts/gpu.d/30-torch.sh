#!/usr/bin/env bash
# PyTorch through the Python package (python/ from the tree, the library from
# .gpu/libvmmweights.so; the GPU machine has no maturin and no network):
#   - models in our MemPool (report vs torch and device counters, memory back after trim)
#   - the torch_memory_saver and vLLM CuMemAllocator shims running unchanged usage
#   - load_ of the 16.4 GB 8B-shaped checkpoint vs the CLI and the link, same run
#     (the checkpoint 20-load.sh made, or generated here; LOAD_LAYERS for quick runs)
#   - the cached alloc+free benchmark against PyTorch's caching allocator.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu-lib.sh
export PYTHONPATH="python:tests/torch${PYTHONPATH:+:$PYTHONPATH}"
export VMMW_LIB="${VMMW_LIB:-$PWD/.gpu/libvmmweights.so}"
export VMMW_BACKEND=cuda PYTHONUNBUFFERED=1
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  result "torch" SKIP "PyTorch with CUDA is not available on this machine"
  exit 0
fi
rc=0
log="$VMMW_GPU_OUT/torch-tests.txt"
python3 -m pytest -q -s -rs tests/torch/test_pool_torch.py tests/torch/test_shims.py >"$log" 2>&1
t=$?
cat "$log"
if [ "$t" -eq 0 ]; then
  result "torch: pool + shims" PASS "$(tail -1 "$log")"
else
  result "torch: pool + shims" FAIL "exit $t; see torch-tests.txt"
  rc=1
fi
out="$VMMW_GPU_OUT/load-python.json"
if ! fits "torch: load_ bench" $((2 * $(ckpt_mib "${LOAD_LAYERS:-36}") + 4096)); then
  :
elif python3 tests/torch/bench_load_python.py --dir "${LOAD_DIR:-/root/vmmw-ckpt-8b}" \
  --layers "${LOAD_LAYERS:-36}" --vmmw .gpu/vmmw --out "$out"; then
  result "torch: load_ bench" PASS "$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("load_ %.1f GB/s = %.3f of link, %.3f of CLI" % (r["python_gbps"], r["python_of_link"], r["python_of_cli"]))' "$out")"
else
  result "torch: load_ bench" FAIL "bench_load_python.py failed or load_ < 0.9 of the CLI"
  rc=1
fi
mkdir -p "$VMMW_GPU_OUT/bench"
python3 tests/torch/bench_pool.py --vmmw .gpu/vmmw --out "$VMMW_GPU_OUT/bench/pool_alloc_free.json" || rc=1
exit $rc
