#!/usr/bin/env bash
# Sleep/wake (issue #5): bench-sleep on ~16 GB of 8B-shaped weights against the
# per-segment pinning reference, with the link measured in the same run; the
# Reload rows use the checkpoint 20-load.sh generated, when it is there; the
# results are drawn as bars in sleep-bench.svg.
# Then the PyTorch sleep test (weights offloaded, kv cache discarded, forward bitwise equal).
set -uo pipefail
source scripts/gpu-lib.sh
rc=0
ckpt="${LOAD_DIR:-/root/vmmw-ckpt-8b}"
reload=()
[ -e "$ckpt" ] && reload=(--reload-checkpoint "$ckpt")
out="$VMMW_GPU_OUT/sleep-bench"
if ! fits "sleep: bench-sleep" $((2 * $(ckpt_mib 36) + 4096)); then
  t=skip
else
  .gpu/vmmw bench-sleep --backend cuda --json "$out.json" --chart "$out.svg" "${reload[@]}" 2>&1 | tee "$out.txt"
  t=${PIPESTATUS[0]}
fi
if [ "$t" = skip ]; then
  :
elif [ "$t" -eq 0 ]; then
  wake=$(grep -E '^ours: wake' "$out.txt" | awk '{print $(NF-4)}')
  result "sleep: bench-sleep" PASS "wake ratio to h2d ${wake:-?}; see sleep-bench.txt"
else
  result "sleep: bench-sleep" FAIL "exit $t"
  rc=1
fi

export PYTHONPATH="python:tests/torch${PYTHONPATH:+:$PYTHONPATH}"
export VMMW_LIB="${VMMW_LIB:-$PWD/.gpu/libvmmweights.so}" VMMW_BACKEND=cuda PYTHONUNBUFFERED=1
if python3 -m pytest -q -s -rs tests/torch/test_sleep_torch.py 2>&1 | tee "$VMMW_GPU_OUT/sleep-torch.txt"; then
  result "sleep: PyTorch model sleep/wake" PASS "$(grep -E 'passed|skipped' "$VMMW_GPU_OUT/sleep-torch.txt" | tail -1)"
else
  result "sleep: PyTorch model sleep/wake" FAIL "see sleep-torch.txt"
  rc=1
fi
exit $rc
