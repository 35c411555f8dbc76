#!/usr/bin/env bash
# Reliability on the GPU: out of memory at wake made real (the
# device filled by another allocation, then wake: a clear error, the tag still
# asleep with its backup, a later wake bitwise equal), and a soak of
# sleep/wake cycles with a forward pass (device bf16->f32 conversion) between,
# outputs bitwise equal and free memory / pinned bytes flat. The fault matrix
# through the cuda backend's fault table (tests/all/fault_device.rs). Then the
# fault table, file-read faults, pool free faults and the concurrency tests on
# the host backend of the same build.
# Writes reliability.txt to $VMMW_GPU_OUT. Cycles and size:
# VMMW_SOAK_CYCLES (default 3000, stopped after VMMW_SOAK_MAX_SECONDS, default
# 120), VMMW_SOAK_MIB (default 256).
set -uo pipefail
source scripts/gpu-lib.sh
rc=0
log="$VMMW_GPU_OUT/reliability.txt"
export VMMW_SOAK_MAX_SECONDS="${VMMW_SOAK_MAX_SECONDS:-120}" VMMW_SOAK_CYCLES="${VMMW_SOAK_CYCLES:-3000}" VMMW_SOAK_MIB="${VMMW_SOAK_MIB:-256}" VMMW_OOM_MIB="${VMMW_OOM_MIB:-1024}"
VMMW_BACKEND=cuda timeout 170 .gpu/tests/all device_reliability:: --nocapture --test-threads=1 >"$log" 2>&1
t=$?
cat "$log"
oom=$(grep -E '^wake with a full device' "$log" | head -1 | cut -c1-160)
soak=$(grep -E '^soak:' "$log" | head -1 | cut -c1-200)
if [ "$t" -eq 0 ]; then
  result "reliability: wake OOM, cuda" PASS "${oom:-?}"
  result "reliability: soak, cuda" PASS "${soak:-?}"
else
  result "reliability: device tests, cuda" FAIL "exit $t; see reliability.txt"
  rc=1
fi
# The fault matrix through the cuda backend's own fault table (every driver
# step and the loader's file reads, 1st and 2nd call, in 8 phases).
VMMW_BACKEND=cuda timeout 300 .gpu/tests/all fault_device:: --nocapture --test-threads=1 >>"$log" 2>&1
t=$?
matrix=$(grep -E '^fault matrix \(' "$log" | tail -1 | cut -c1-160)
if [ "$t" -eq 0 ] && grep -q '^fault matrix (cuda)' "$log"; then
  result "reliability: fault matrix, cuda" PASS "${matrix:-?}"
elif [ "$t" -eq 0 ]; then
  result "reliability: fault matrix, cuda" FAIL "did not run on cuda: $(grep -E 'fault_device: skipped' "$log" | tail -1 | cut -c1-160)"
  rc=1
else
  result "reliability: fault matrix, cuda" FAIL "exit $t; see reliability.txt (${matrix:-no summary})"
  rc=1
fi
# The same through PyTorch: a transformers model, forward after every wake.
export PYTHONPATH="python:tests/torch${PYTHONPATH:+:$PYTHONPATH}"
export VMMW_LIB="${VMMW_LIB:-$PWD/.gpu/libvmmweights.so}"
line=$(VMMW_BACKEND=cuda timeout 200 python3 tests/torch/soak_torch.py --max-seconds "${VMMW_TORCH_SOAK_SECONDS:-90}" 2>&1 |
  tee -a "$log" | grep -E '^(PASS|FAIL|SKIP)' | tail -1)
result_of "reliability: soak through PyTorch" "$line" reliability.txt || rc=1
# Modules of the one test binary, then `concurrency`, a binary of its own (it
# sets VMMW_BACKEND for its process).
for t in fault_table fault_file_read pool_free_faults concurrency; do
  if [ "$t" = concurrency ]; then run=(.gpu/tests/concurrency); else run=(.gpu/tests/all "$t::"); fi
  if VMMW_BACKEND=host "${run[@]}" --nocapture >>"$log" 2>&1; then
    result "reliability: $t (host backend, release build)" PASS "$(grep -E '^(fault table|file-read faults|mixed|same tag|torch|test result)' "$log" | tail -3 | tr '\n' ' ' | cut -c1-200)"
  else
    result "reliability: $t (host backend, release build)" FAIL "see reliability.txt"
    rc=1
  fi
done
exit $rc
