#!/usr/bin/env bash
# Sleep/wake/load hazards on the cuda backend: a checkpoint
# rewritten in place and one truncated while its tag sleeps with Reload (the
# wake is refused with VMMW_CHECKPOINT_INVALID, no signal, then the tag wakes
# another way, is loaded again and a device kernel checks the weights); a
# sleep asked from the load's progress callback (VMMW_LOAD_IN_PROGRESS, the
# load completes, weights checked); and the latency of 4 KiB alloc+free in
# another tag during a 16 GiB Offload wake (VMMW_HAZARD_WAKE_BYTES to change).
# The 16.4 GB checkpoint of 20-load.sh is used for the load case when present
# (LOAD_DIR). Then the PyTorch twin (tests/torch/test_hazards_torch.py): a
# transformers model in a tag, Reload keeping its buffers and later tensors,
# a rewritten checkpoint refused then a forward pass after a new load, and a
# sleep from the load's progress refused. Writes hazards.txt and
# hazards-torch.txt to $VMMW_GPU_OUT.
set -uo pipefail
source scripts/gpu-lib.sh
log="$VMMW_GPU_OUT/hazards.txt"
export LOAD_DIR="${LOAD_DIR:-/root/vmmw-ckpt-8b}"
# The wake measured under other-tag allocations: 16 GiB, or a quarter of a
# smaller card; the load case holds the checkpoint beside it.
mem=$(gpu_mem_mib)
wake_mib=$((mem / 4 < 16384 ? mem / 4 : 16384))
export VMMW_HAZARD_WAKE_BYTES="${VMMW_HAZARD_WAKE_BYTES:-$((wake_mib << 20))}"
fits "hazards: cuda" $((wake_mib + $(ckpt_mib 36) + 4096)) || exit 0
VMMW_BACKEND=cuda .gpu/tests/all gpu_hazards:: --nocapture --test-threads=1 >"$log" 2>&1
t=$?
cat "$log"
summary=$(grep -E '^test result:' "$log" | tail -1)
lat=$(grep -E 'alloc\+free of 4 KiB' "$log" | sed 's/.*during it: //')
wake=$(grep -oE 'wake [0-9.]+ s \([0-9.]+ GB/s\)' "$log" | head -1)
rc=0
if [ "$t" -eq 0 ]; then
  result "hazards: changed/truncated checkpoint, sleep during load, other-tag alloc during wake" PASS \
    "${summary#test result: }; $wake; other-tag alloc ${lat:-?}"
else
  result "hazards: cuda" FAIL "exit $t; ${summary:-no summary}; see hazards.txt"
  rc=1
fi

export PYTHONPATH="python:tests/torch${PYTHONPATH:+:$PYTHONPATH}"
export VMMW_LIB="${VMMW_LIB:-$PWD/.gpu/libvmmweights.so}" PYTHONUNBUFFERED=1
tlog="$VMMW_GPU_OUT/hazards-torch.txt"
VMMW_BACKEND=cuda python3 -m pytest -q -s -rs tests/torch/test_hazards_torch.py >"$tlog" 2>&1
t=$?
cat "$tlog"
if [ "$t" -eq 0 ] && grep -q "passed" "$tlog"; then
  result "hazards: PyTorch model (Reload keeps buffers, changed checkpoint, sleep during load)" PASS "$(tail -1 "$tlog")"
elif [ "$t" -eq 0 ]; then
  result "hazards: PyTorch model" SKIP "$(grep -m1 -i skip "$tlog")"
else
  result "hazards: PyTorch model" FAIL "exit $t; see hazards-torch.txt"
  rc=1
fi
exit $rc
