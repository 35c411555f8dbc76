#!/usr/bin/env bash
# Several GPUs of one host (issue #12): needs >= 2 GPUs (`nvidia-smi -L`), else SKIP.
# 1. the topology (nvidia-smi topo -m) next to the results;
# 2. the 16.4 GB checkpoint onto every GPU as replicas and as tensor-parallel
#    ranks through vmmw_loader_load_devices, every destination compared with
#    the full tensors sliced in PyTorch (tests/torch/multi_gpu.py load);
# 3. vmmw bench-load --devices: one GPU vs replicas vs ranks in one run, with a
#    device-side check of every extent on every GPU (after the load and again
#    after the replicas' wake), and the wakes: one GPU from its host backup
#    (Offload) vs the replicas from ONE host backup (replicas::sleep +
#    replicas::wake_from_backup: read once, 1/N per link, rest over NVLink),
#    plus the replicas' checkpoint fan-out wake (Discard + replicas::wake_by_reload),
#    and the same two wakes from a compressed backup (OffloadCompressed: one GPU
#    from its own, the replicas from the holder's, every GPU decoding a share of
#    its frames), as ratios to one GPU's raw wake (its link) and to the raw
#    replicas' wake;
# 4. an all-reduce through torch.distributed's NCCL over tensors in our pool;
# 5. peer access of a tag on the real devices (tests/all/gpu_peers.rs);
# 6. replicas slept on one host backup (raw and compressed) and woken on every
#    GPU from it, byte-exact, also retried after injected copy faults mid-wake
#    (tests/all/gpu_replica_wake.rs; the PyTorch check is in multi_gpu.py load).
# NVLink multicast stays off (gpu-check.sh exports NCCL_NVLS_ENABLE=0 and the like).
# Writes multi-topo.txt, multi-tests.txt, multi-replica-wake.txt, multi.json to $VMMW_GPU_OUT.
# LOAD_LAYERS=36 (default) is the 16.4 GB checkpoint; fewer layers for quick runs.
set -uo pipefail
source scripts/gpu-lib.sh
export NCCL_NVLS_ENABLE=0
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
export PYTHONPATH="python:tests/torch${PYTHONPATH:+:$PYTHONPATH}"
export VMMW_LIB="${VMMW_LIB:-$PWD/.gpu/libvmmweights.so}"
export VMMW_BACKEND=cuda PYTHONUNBUFFERED=1
dir="${LOAD_DIR:-/root/vmmw-ckpt-8b}"
layers="${LOAD_LAYERS:-36}"
# Each GPU holds the checkpoint and the full tensors PyTorch slices to compare.
if [ "${gpus:-0}" -ge 1 ] && ! fits "multi-gpu" $((2 * $(ckpt_mib "$layers") + 4096)); then
  exit 0
fi
if [ "${gpus:-0}" -lt 2 ]; then
  result "multi-gpu" SKIP "nvidia-smi -L shows ${gpus:-0} GPU(s); this part needs 2 or more (machine kind nvidia-h200-x2)"
  # One GPU: the same C path and PyTorch check with one device (no peers), as a smoke test.
  if [ "${gpus:-0}" -eq 1 ] && python3 -c 'import torch, safetensors' 2>/dev/null; then
    line=$(python3 tests/torch/multi_gpu.py load --dir "$dir" --layers "$layers" --devices 1 --repeat 1 2>&1 |
      tee "$VMMW_GPU_OUT/multi-tests.txt" | grep -E '^(PASS|FAIL)' | tr '\n' ' ')
    case "$line" in
      *FAIL*|"") result "multi-gpu: one-GPU smoke" FAIL "${line:-no result; see multi-tests.txt}"; exit 1 ;;
      *) result "multi-gpu: one-GPU smoke" PASS "$line" ;;
    esac
  fi
  exit 0
fi
devices=$(seq -s, 0 $((gpus - 1)))
nvidia-smi topo -m >"$VMMW_GPU_OUT/multi-topo.txt" 2>&1
cat "$VMMW_GPU_OUT/multi-topo.txt"
rc=0
if ! python3 -c 'import torch, safetensors, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  result "multi-gpu: torch checks" SKIP "PyTorch with CUDA (and safetensors) is not available"
else
  log="$VMMW_GPU_OUT/multi-tests.txt"
  python3 tests/torch/multi_gpu.py load --dir "$dir" --layers "$layers" --devices "$gpus" >"$log" 2>&1
  t=$?
  cat "$log"
  while read -r line; do
    case "$line" in
      PASS*) result "multi-gpu: ${line:5:40}" PASS "${line:5}" ;;
      FAIL*) result "multi-gpu: ${line:5:40}" FAIL "${line:5}" ;;
    esac
  done <"$log"
  [ "$t" -eq 0 ] || { result "multi-gpu: load checks" FAIL "exit $t; see multi-tests.txt"; rc=1; }
  line=$(python3 tests/torch/multi_gpu.py allreduce --devices "$gpus" 2>&1 | tee -a "$log" | grep -E '^(PASS|FAIL)')
  case "$line" in
    PASS*) result "multi-gpu: all-reduce" PASS "${line:5}" ;;
    *) result "multi-gpu: all-reduce" FAIL "${line:-no result; see multi-tests.txt}"; rc=1 ;;
  esac
fi
# Peer access of a tag on the real devices: kept across sleep/wake, revoked.
if VMMW_BACKEND=cuda .gpu/tests/all gpu_peers:: --nocapture >>"$VMMW_GPU_OUT/multi-tests.txt" 2>&1; then
  if grep -q '^SKIP' "$VMMW_GPU_OUT/multi-tests.txt"; then
    result "multi-gpu: peer access across sleep/wake" SKIP "$(grep -m1 '^SKIP' "$VMMW_GPU_OUT/multi-tests.txt")"
  else
    result "multi-gpu: peer access across sleep/wake" PASS "granted, read over NVLink after offload/discard/offload wakes, new segment granted, revoked (tests/all/gpu_peers.rs)"
  fi
else
  result "multi-gpu: peer access across sleep/wake" FAIL "see multi-tests.txt"
  rc=1
fi
# Replicas asleep on one host backup, woken on every GPU from it, byte-exact.
wlog="$VMMW_GPU_OUT/multi-replica-wake.txt"
if VMMW_BACKEND=cuda .gpu/tests/all gpu_replica_wake:: --nocapture >"$wlog" 2>&1; then
  if grep -q '^SKIP' "$wlog"; then
    result "multi-gpu: replicas woken from one backup" SKIP "$(grep -m1 '^SKIP' "$wlog")"
  else
    result "multi-gpu: replicas woken from one backup" PASS "byte-exact on every GPU from a raw and a compressed backup, with and without peer copies, and retried after a host copy, a peer copy and a decode failed mid-wake on the last GPU (all stayed asleep): $(grep -m1 '^round 1' "$wlog"); $(grep -m1 '^compressed round 1' "$wlog") (tests/all/gpu_replica_wake.rs)"
  fi
else
  result "multi-gpu: replicas woken from one backup" FAIL "see multi-replica-wake.txt"
  rc=1
fi
out="$VMMW_GPU_OUT/multi.json"
if .gpu/vmmw bench-load --backend cuda "$dir" --preset qwen3 --devices "$devices" \
  --verify --repeat 3 --json "$out"; then
  summary=$(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
one, rep, ranks = r["one_device"], r["replicas"], r.get("ranks")
s = "one GPU %.1f GB/s; replicas %.1f GB/s delivered (%.2fx, target >= 110 GB/s)" % (
    one["aggregate_gbps"], rep["aggregate_gbps"], r["replicas_speedup"])
if ranks:
    s += "; ranks %.3f s (target <= 0.22 s for two)" % ranks["median_s"]
w1, wn = r["one_device_wake"], r["replicas_wake"]
s += "; wake one GPU from its backup %.1f GB/s, replicas from one backup %.1f GB/s (%.2fx, target 1.8x)" % (
    w1["aggregate_gbps"], wn["aggregate_gbps"], wn["aggregate_gbps"] / w1["aggregate_gbps"])
lw = wn.get("last_wake") or {}
if lw:
    s += " [host %.1f GB read, %.1f GB over peers, %d direct pairs, %d rows verified]" % (
        lw["host_bytes"] / 1e9, lw["peer_bytes"] / 1e9, lw["direct_pairs"], wn["verified_rows"])
wc = r.get("replicas_wake_checkpoint")
if wc:
    s += "; replicas from the checkpoint %.1f GB/s" % wc["aggregate_gbps"]
print(s)' "$out")
  result "multi-gpu: bench" INFO "$summary"
  csum=$(python3 -c '
import json, sys
c = json.load(open(sys.argv[1])).get("compressed")
if not c:
    print("SKIP no compressed rows (the codec kernels are missing)")
    sys.exit()
w1, wn = c["one_device_wake"], c["replicas_wake"]
lw = wn.get("last_wake") or {}
print("INFO backup %.1f%% of raw; wake one GPU from its compressed backup %.1f GB/s raw (%.2fx its link); "
      "replicas from one compressed backup %.1f GB/s delivered (%.2fx one GPU link, %.2fx the raw replicas; "
      "target about the raw ratio times the codec) [host %.1f GB encoded read, %.1f GB decoded, %.1f GB over peers, "
      "%d direct pairs, %d rows verified]" % (
    100 * c["backup_ratio"], w1["aggregate_gbps"], c["one_device_over_link"], wn["aggregate_gbps"],
    c["replicas_over_link"], c["replicas_over_raw_replicas"], lw.get("host_bytes", 0) / 1e9,
    lw.get("decoded_bytes", 0) / 1e9, lw.get("peer_bytes", 0) / 1e9, lw.get("direct_pairs", 0),
    wn["verified_rows"]))' "$out")
  result "multi-gpu: bench compressed" "${csum%% *}" "${csum#* }"
else
  result "multi-gpu: bench" FAIL "vmmw bench-load --devices $devices failed"
  rc=1
fi
exit $rc
