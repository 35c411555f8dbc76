#!/usr/bin/env bash
# Reload never reverts a write, on the cuda backend:
# - the committed range-hash PTX (src/driver/cuda/hash.ptx) is what nvcc makes
#   of kernels/hash.cu (a differing build is written to hash.ptx here);
# - tests/all/reload_writes.rs on cuda: the device hash equals the host reference
#   on every alignment and length, and in-place writes, reused blocks, marked
#   ranges and a new load come back right from a Reload cycle;
# - tests/torch/test_reload_update_torch.py: transformers models updated in
#   place after load_ (copy_, load_state_dict + mark_written, a block reused by
#   the caching allocator): after a Reload sleep and wake the logits equal the
#   updated model's, bitwise.
# The cost on the 16.4 GB checkpoint is in 50-sleep.sh's Reload rows.
set -uo pipefail
source scripts/gpu-lib.sh
rc=0

nvcc=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
if [ -x "$nvcc" ]; then
  built="$VMMW_GPU_OUT/hash.ptx"
  "$nvcc" -ptx -arch=compute_75 -O3 -o "$built" kernels/hash.cu
  if cmp -s "$built" src/driver/cuda/hash.ptx; then
    result "reload: committed hash PTX = nvcc kernels/hash.cu" PASS "$("$nvcc" --version | tail -1)"
    rm -f "$built"
  else
    result "reload: committed hash PTX = nvcc kernels/hash.cu" FAIL "differs; nvcc's build is hash.ptx"
    rc=1
  fi
else
  result "reload: committed hash PTX" SKIP "no nvcc on this machine"
fi

log="$VMMW_GPU_OUT/reload-tests.txt"
VMMW_BACKEND=cuda .gpu/tests/all reload_writes:: --test-threads=1 >"$log" 2>&1
t=$?
cat "$log"
summary=$(grep -E '^test result:' "$log" | tail -1)
if [ "$t" -eq 0 ]; then
  result "reload: writes after a load survive (cuda), device hash = reference" PASS "${summary#test result: }"
else
  result "reload: writes after a load (cuda)" FAIL "exit $t; ${summary:-no summary}; see reload-tests.txt"
  rc=1
fi

export PYTHONPATH="python:tests/torch${PYTHONPATH:+:$PYTHONPATH}"
export VMMW_LIB="${VMMW_LIB:-$PWD/.gpu/libvmmweights.so}" VMMW_BACKEND=cuda PYTHONUNBUFFERED=1
tlog="$VMMW_GPU_OUT/reload-torch.txt"
python3 -m pytest -q -s -rs tests/torch/test_reload_update_torch.py >"$tlog" 2>&1
t=$?
cat "$tlog"
if [ "$t" -eq 0 ] && grep -q "passed" "$tlog"; then
  result "reload: transformers models updated after load_, logits bitwise" PASS "$(tail -1 "$tlog")"
elif [ "$t" -eq 0 ]; then
  result "reload: transformers models" SKIP "$(grep -m1 -i skip "$tlog")"
else
  result "reload: transformers models updated after load_" FAIL "exit $t; see reload-torch.txt"
  rc=1
fi
exit $rc
