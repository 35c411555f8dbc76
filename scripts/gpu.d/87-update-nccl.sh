#!/usr/bin/env bash
# NCCL broadcast updates (NCCL from PyTorch's install, opened at run time).
# One GPU: libnccl opens, a world of one rank broadcasts the 16.4 GB
# checkpoint's update into its fused destinations, bitwise, and an
# RDMA-capable tag registered with its communicator is registered again
# from the remap callback after sleep/wake. Two GPUs or more
# (nvidia-h200-x2): the full weights rank 0 -> 1 against
# torch.distributed.broadcast bus bandwidth in the same run (target >= 0.8),
# TP=2 ranks each keeping their slices, and an RDMA-capable tag registered
# with ncclCommRegister surviving sleep/wake through the remap callback;
# then the checkpoint load through the same ring (rank 0 reads, both ranks
# apply, bitwise against a local load, the rate against
# torch.distributed.broadcast and the local load; TP=2 with two readers).
# NVLink multicast stays off. Writes update-nccl.txt to $VMMW_GPU_OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu-lib.sh
export NCCL_NVLS_ENABLE=0
export PYTHONPATH="python:tests/torch${PYTHONPATH:+:$PYTHONPATH}"
export VMMW_LIB="${VMMW_LIB:-$PWD/.gpu/libvmmweights.so}"
export VMMW_BACKEND=cuda PYTHONUNBUFFERED=1
if ! python3 -c 'import torch, safetensors, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  result "update: NCCL" SKIP "PyTorch with CUDA, or safetensors, is not available here"
  exit 0
fi
# PyTorch's wheel ships libnccl.so.2 under nvidia/nccl/lib; torch itself
# loads it, and this names it for any process that has not imported torch.
if [ -z "${VMMW_NCCL_LIBRARY:-}" ]; then
  lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
  [ -n "$lib" ] && [ -e "$lib" ] && export VMMW_NCCL_LIBRARY="$lib"
fi
log="$VMMW_GPU_OUT/update-nccl.txt"
: >"$log"
dir="${LOAD_DIR:-/root/vmmw-ckpt-8b}"
rc=0
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
# world1 holds the checkpoint's tensors, the destinations and their
# originals; a pair rank also a flat buffer of the whole: 3 and 4 copies.
ck=$(ckpt_mib "${LOAD_LAYERS:-36}")
fits "update: NCCL world of 1" $((3 * ck + 4096)) || exit 0
line=$(timeout 900 python3 tests/torch/update_nccl.py world1 --dir "$dir" --layers "${LOAD_LAYERS:-36}" 2>&1 |
  tee -a "$log" | grep -E '^(PASS|FAIL)' | tail -1)
result_of "update: NCCL world of 1 (libnccl opens)" "$line" update-nccl.txt || rc=1
result_of "update: RDMA tag registered with NCCL, world of 1, through sleep/wake" \
  "$(grep -E '^(PASS|FAIL|SKIP) RDMA tag on rank 0' "$log" | tail -1)" update-nccl.txt || rc=1
if [ "${gpus:-0}" -ge 2 ] && ! fits "update: NCCL rank 0 -> 1, TP=2, RDMA tag" $((4 * ck + 4096)); then
  :
elif [ "${gpus:-0}" -lt 2 ]; then
  result "update: NCCL rank 0 -> 1, TP=2, RDMA tag" SKIP "nvidia-smi -L shows ${gpus:-0} GPU(s); these need 2 or more (machine kind nvidia-h200-x2)"
else
  timeout 1500 python3 tests/torch/update_nccl.py pair --dir "$dir" --layers "${LOAD_LAYERS:-36}" >>"$log" 2>&1
  t=$?
  n=0
  while IFS= read -r l; do
    n=$((n + 1))
    result_of "update: NCCL pair $n" "$l" update-nccl.txt || rc=1
  done < <(grep -E '^(PASS|FAIL|SKIP)' "$log" | tail -n +2)
  if [ "$t" -ne 0 ] || [ "$n" -eq 0 ]; then
    result "update: NCCL pair" FAIL "exit $t; see update-nccl.txt"
    rc=1
  fi
  # The checkpoint load through the same ring: rank 0 reads, both apply;
  # then TP=2 with two readers.
  part=$(mktemp)
  timeout 1500 python3 tests/torch/load_broadcast.py --dir "$dir" --layers "${LOAD_LAYERS:-36}" >"$part" 2>&1
  t=$?
  cat "$part" >>"$log"
  n=0
  while IFS= read -r l; do
    n=$((n + 1))
    result_of "load: broadcast $n" "$l" update-nccl.txt || rc=1
  done < <(grep -E '^(PASS|FAIL)' "$part")
  rm -f "$part"
  if [ "$t" -ne 0 ] || [ "$n" -eq 0 ]; then
    result "load: broadcast" FAIL "exit $t; see update-nccl.txt"
    rc=1
  fi
fi
cat "$log"
exit $rc
