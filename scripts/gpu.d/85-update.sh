#!/usr/bin/env bash
# Updates on one GPU (docs/UPDATES.md):
#   1. tests/all update:: and update_tp:: on the cuda backend: updates from
#      device and host tensors, direct and staged, buckets, failures midway
#      writing nothing, validation, Reload after an update, the version an
#      importer sees, and tensor-parallel worlds 2/4/8 every rank bitwise
#      (the cases that printed `RAN cuda:` are counted); repeated updates
#      (moved sources read again, a changed shape refused, the phases);
#   2. tests/torch/test_update_torch.py: transformers models saved with
#      save_pretrained, loaded with vmmweights.torch.load_, updated with
#      update_ from a trainer model of other values: logits equal the
#      trainer's, bitwise; refused updates change nothing; Reload keeps it;
#   3. the 16.4 GB 8B-shaped checkpoint (LOAD_DIR, from 20-load.sh, generated
#      when absent): `vmmw bench-update` (the core against one device-to-device
#      copy of the same bytes) and tests/torch/bench_update_python.py (update_
#      against torch's own copy_ of the same bytes into the same slices, same
#      run; target >= 0.8), each with where the update's time went (the
#      library's phases; update_'s Python parts).
# Writes update-tests.txt, update-torch.txt, update-cli.json and
# update-python.json to $VMMW_GPU_OUT.
set -uo pipefail
source scripts/gpu-lib.sh
rc=0

log="$VMMW_GPU_OUT/update-tests.txt"
VMMW_BACKEND=cuda .gpu/tests/all update:: update_tp:: update_repeat:: --nocapture --test-threads=1 >"$log" 2>&1
t=$?
tail -25 "$log"
ran=$(grep -c '^RAN cuda: ' "$log")
summary=$(grep -E '^test result:' "$log" | tail -1)
if [ "$t" -ne 0 ]; then
  result "update: Rust tests, cuda" FAIL "exit $t; ${summary:-no summary}; see update-tests.txt"
  rc=1
elif [ "$ran" -lt 10 ]; then
  result "update: Rust tests, cuda" FAIL "$ran backend-parametric tests ran on cuda (10 or more expected); see update-tests.txt"
  rc=1
else
  result "update: Rust tests, cuda" PASS "$ran ran on cuda (TP worlds 2/4/8 bitwise); ${summary#test result: }"
fi

export PYTHONPATH="python:tests/torch${PYTHONPATH:+:$PYTHONPATH}"
export VMMW_LIB="${VMMW_LIB:-$PWD/.gpu/libvmmweights.so}" VMMW_BACKEND=cuda PYTHONUNBUFFERED=1
if ! python3 -c 'import torch, transformers, safetensors, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  result "update: torch" SKIP "PyTorch with CUDA, transformers or safetensors is not available"
  exit $rc
fi
tlog="$VMMW_GPU_OUT/update-torch.txt"
python3 -m pytest -q -s -rs tests/torch/test_update_torch.py >"$tlog" 2>&1
t=$?
cat "$tlog"
last=$(tail -1 "$tlog")
if [ "$t" -ne 0 ]; then
  result "update: transformers models, update_ logits = trainer's" FAIL "exit $t; $last; see update-torch.txt"
  rc=1
elif ! grep -q "passed" <<<"$last"; then
  result "update: transformers models" SKIP "nothing ran: $last"
else
  result "update: transformers models, update_ logits = trainer's, bitwise" PASS "$last"
fi

dir="${LOAD_DIR:-/root/vmmw-ckpt-8b}"
# The benches hold the destinations, the sources and the reference's copy.
fits "update: benches, 16.4 GB" $((3 * $(ckpt_mib 36) + 4096)) || exit $rc
if [ ! -f "$dir/model.safetensors.index.json" ]; then
  echo "generating the checkpoint in $dir"
  python3 -c 'import sys; sys.path.insert(0, "tests/torch"); import bench_load_reference as r; r.generate(sys.argv[1], 36)' "$dir"
fi
cli="$VMMW_GPU_OUT/update-cli.json"
if .gpu/vmmw bench-update "$dir" --preset qwen3 --backend cuda --repeat 5 --json "$cli"; then
  result "update: bench-update (core vs one d2d copy)" INFO "$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); m=lambda k: sorted(p[k] for p in r["update_phases"])[len(r["update_phases"]) // 2] * 1e3; print("%.0f GB/s vs d2d copy %.0f GB/s = %.3f; %d destinations checked bitwise; phases (median ms) plan %.2f, issue %.2f, wait %.2f, bookkeeping %.2f" % (r["update_gbps"], r["copy_gbps"], r["ratio"], r["verified_destinations"], m("plan"), m("issue"), m("wait"), m("bookkeeping")))' "$cli")"
else
  result "update: bench-update" FAIL "vmmw bench-update failed; see the log"
  rc=1
fi
out="$VMMW_GPU_OUT/update-python.json"
python3 tests/torch/bench_update_python.py --dir "$dir" --out "$out"
t=$?
if [ -f "$out" ]; then
  detail=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("update_ %.0f GB/s vs torch copy_ %.0f GB/s over %.1f GB: %.3f (target 0.8); python parts (ms) %s; library phases (ms) %s" % (r["update_gbps"], r["copy_gbps"], r["bytes"] / 1e9, r["ratio"], ", ".join("%s %.2f" % kv for kv in r["update_python_ms"].items()), ", ".join("%s %.2f" % kv for kv in r["update_library_ms"].items())))' "$out")
else
  detail="no result; see the log"
fi
if [ "$t" -eq 0 ]; then
  result "update: update_ vs torch copy_, 16.4 GB" PASS "$detail"
else
  result "update: update_ vs torch copy_, 16.4 GB" FAIL "$detail"
  rc=1
fi
exit $rc
