#!/usr/bin/env bash
# Loader (issue #4) on the GPU: the bitwise-equal forward tests through the Python package
# (vmmweights.torch.load_ into save_pretrained models), then the load benchmark in one
# run: link, reference (safe_open + copy_), ours page-cached per strategy with
# a device-side check of every extent, disk read rate and a cold load.
# Writes load-tests.txt, load.json (+ load.json.vmmw.json) to $VMMW_GPU_OUT.
# LOAD_LAYERS=36 (default) is the 16.4 GB checkpoint; fewer layers for quick runs.
set -uo pipefail
source scripts/gpu-lib.sh
export PYTHONPATH="python:tests/torch${PYTHONPATH:+:$PYTHONPATH}"
export VMMW_LIB="${VMMW_LIB:-$PWD/.gpu/libvmmweights.so}"
export VMMW_BACKEND=cuda PYTHONUNBUFFERED=1
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  result "load" SKIP "PyTorch with CUDA is not available on this machine"
  exit 0
fi
rc=0
log="$VMMW_GPU_OUT/load-tests.txt"
python3 -m pytest -q -rs tests/torch/test_load_torch.py >"$log" 2>&1
t=$?
cat "$log"
if [ "$t" -eq 0 ] && grep -q "skipped" "$log" && ! grep -q "passed" "$log"; then
  result "load: bitwise forward (torch)" SKIP "$(grep -m1 SKIP "$log")"
elif [ "$t" -eq 0 ]; then
  result "load: bitwise forward (torch)" PASS "$(tail -1 "$log")"
else
  result "load: bitwise forward (torch)" FAIL "exit $t; see load-tests.txt"
  rc=1
fi
# The checkpoint goes to local disk (not /dev/shm) so a cold load means the disk.
# The reference's parameters and ours are on the GPU at once: two copies.
out="$VMMW_GPU_OUT/load.json"
if ! fits "load: bench" $((2 * $(ckpt_mib "${LOAD_LAYERS:-36}") + 4096)); then
  :
elif python3 tests/torch/bench_load_reference.py --dir "${LOAD_DIR:-/root/vmmw-ckpt-8b}" \
  --layers "${LOAD_LAYERS:-36}" --vmmw .gpu/vmmw --out "$out" --cold; then
  summary=$(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
o = r["ours"]
link = max(r["link_torch_gbps"], o["link_htod_gbps"])
auto = next(x for x in o["runs"] if x["cache"] == "cached" and x.get("label", x["strategy"]) == "auto")
best = max((x for x in o["runs"] if x["cache"] == "cached"), key=lambda x: x["gbps"])
cold = [x for x in o["runs"] if x["cache"] == "cold"]
s = "link %.1f GB/s; reference %.2f; ours auto %.1f GB/s (%.0f%% of link, target 90%%), best %s %.1f" % (
    link, r["reference_cached_gbps"], auto["gbps"], 100 * auto["gbps"] / link, best.get("label", best["strategy"]), best["gbps"])
if cold and o.get("disk_read_gbps"):
    s += "; cold %.2f GB/s (%.0f%% of disk %.2f)" % (cold[0]["gbps"], 100 * cold[0]["ratio"], o["disk_read_gbps"])
print(s)' "$out")
  result "load: bench" INFO "$summary"
else
  result "load: bench" FAIL "bench_load_reference.py failed"
  rc=1
fi
exit $rc
