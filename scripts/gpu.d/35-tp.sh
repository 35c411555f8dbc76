#!/usr/bin/env bash
# Tensor-parallel loads on the GPU, bitwise:
#   1. tests/all/loader_tp.rs on the cuda backend: llama, qwen2 and qwen3 shaped
#      checkpoints, worlds 1/2/4/8, every rank, every copy strategy through the
#      Rust API and every VMMW_COPY_* through the C API, each destination
#      compared with slices of the full tensors (the cases that printed
#      `RAN cuda:` are counted; none counts as a failure, not a pass);
#   2. tests/torch/test_tp_torch.py: transformers models saved with
#      save_pretrained, loaded by vmmweights.torch.load_ into fused
#      destinations in our pool for worlds 1/2/4/8 and each strategy, compared
#      with torch slices of the full tensors.
# Writes tp-tests.txt and tp-torch.txt to $VMMW_GPU_OUT.
set -uo pipefail
source scripts/gpu-lib.sh
rc=0

log="$VMMW_GPU_OUT/tp-tests.txt"
VMMW_BACKEND=cuda .gpu/tests/all loader_tp:: --nocapture >"$log" 2>&1
t=$?
tail -20 "$log"
ran=$(grep -c '^RAN cuda: ' "$log")
summary=$(grep -E '^test result:' "$log" | tail -1)
if [ "$t" -ne 0 ]; then
  result "tp: Rust + C API, cuda" FAIL "exit $t; ${summary:-no summary}; see tp-tests.txt"
  rc=1
elif [ "$ran" -lt 2 ]; then
  result "tp: Rust + C API, cuda" FAIL "$ran of the 2 backend-parametric tests ran on cuda; see tp-tests.txt"
  rc=1
else
  result "tp: Rust + C API, cuda" PASS "3 presets x worlds 1/2/4/8 x every rank: 9 strategies (Rust API), 5 (C API), bitwise; ${summary#test result: }"
fi

export PYTHONPATH="python:tests/torch${PYTHONPATH:+:$PYTHONPATH}"
export VMMW_LIB="${VMMW_LIB:-$PWD/.gpu/libvmmweights.so}"
export VMMW_BACKEND=cuda PYTHONUNBUFFERED=1
if ! python3 -c 'import torch, transformers, safetensors, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  result "tp: load_ vs torch slices" SKIP "PyTorch with CUDA, transformers or safetensors is not available"
  exit $rc
fi
log="$VMMW_GPU_OUT/tp-torch.txt"
python3 -m pytest -q -rs tests/torch/test_tp_torch.py >"$log" 2>&1
t=$?
cat "$log"
last=$(tail -1 "$log")
if [ "$t" -ne 0 ]; then
  result "tp: load_ vs torch slices" FAIL "exit $t; $last; see tp-torch.txt"
  rc=1
elif ! grep -q "passed" <<<"$last"; then
  result "tp: load_ vs torch slices" SKIP "nothing ran: $last"
else
  result "tp: load_ vs torch slices" PASS "qwen2/llama/qwen3 x worlds 1/2/4/8 x auto/direct/staged/read/simple, every rank bitwise; $last"
  if grep -q "skipped" <<<"$last"; then
    result "tp: load_ vs torch slices, skipped cases" SKIP "$(grep -m1 '^SKIPPED' "$log")"
  fi
fi
exit $rc
