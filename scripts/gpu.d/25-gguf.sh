#!/usr/bin/env bash
# GGUF loads on the GPU: first tests/all/loader_gguf.rs on the cuda backend
# (raw-byte loads, every metadata type, splits, block-exact slices, Reload
# and Offload sleep/wake, the hostile set with nothing written); then
# ~16 GB files written on this machine with the `gguf`
# package (BF16, then Q8_0), each measured in one run by
# tests/torch/bench_load_gguf.py: the link, our load page-cached as a ratio
# of it (target 0.90), a cold load as a ratio of the disk's read rate, and
# the gguf package's own read-and-copy (GGUFReader + torch) as the reference.
# Writes load-gguf.txt (tests and bench log) and load-gguf-<dtype>.json to
# $VMMW_GPU_OUT.
#
# The GPU machine has no network: the gguf wheel travels with the bundle.
# Before the run, here:   pip download gguf==0.19.0 --no-deps -d .gguf-wheels
# and carry `.gguf-wheels` (ignored by git) next to `.gpu-pack`. The wheel is
# pure Python; it is unpacked into .gguf-wheels/site and put on PYTHONPATH
# (its imports, numpy and pyyaml, come with PyTorch and transformers there).
# GGUF_DIR (default /root/vmmw-gguf) holds the files; GGUF_TYPES (default
# "bf16 q8_0") picks the files; GGUF_LAYERS overrides the layer count; each
# file is deleted after its run unless GGUF_KEEP=1 (disk space).
set -uo pipefail
source scripts/gpu-lib.sh
export VMMW_LIB="${VMMW_LIB:-$PWD/.gpu/libvmmweights.so}"
export VMMW_BACKEND=cuda PYTHONUNBUFFERED=1
rc=0
tlog="$VMMW_GPU_OUT/load-gguf.txt"
.gpu/tests/all loader_gguf:: --nocapture --test-threads=1 >"$tlog" 2>&1
t=$?
summary=$(grep -E '^test result:' "$tlog" | tail -1)
ran=$(grep -c '^RAN cuda' "$tlog")
if [ "$t" -eq 0 ] && [ "$ran" -gt 0 ]; then
  result "gguf: loader_gguf tests, cuda" PASS "${summary#test result: }; $ran ran on cuda"
else
  result "gguf: loader_gguf tests, cuda" FAIL "exit $t, $ran ran on cuda; ${summary:-no summary}; see load-gguf.txt"
  rc=1
fi
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  result "gguf: bench" SKIP "PyTorch with CUDA is not available on this machine"
  exit $rc
fi
if ! python3 -c 'import gguf' 2>/dev/null; then
  wheel=$(ls .gguf-wheels/gguf-*.whl 2>/dev/null | tail -1)
  if [ -z "$wheel" ]; then
    result "gguf: bench" SKIP "no gguf package and no wheel in .gguf-wheels (pip download gguf==0.19.0 --no-deps -d .gguf-wheels, then carry it)"
    exit $rc
  fi
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" .gguf-wheels/site
  export PYTHONPATH=".gguf-wheels/site${PYTHONPATH:+:$PYTHONPATH}"
fi
log="$tlog"
# Each file is about the 36-layer checkpoint's size (its layers are chosen so);
# ours and the reference's copy are on the GPU at once.
if ! fits "gguf: bench" $((2 * $(ckpt_mib 36) + 4096)); then
  exit $rc
fi
for dtype in ${GGUF_TYPES:-bf16 q8_0}; do
  out="$VMMW_GPU_OUT/load-gguf-$dtype.json"
  if python3 tests/torch/bench_load_gguf.py --vmmw .gpu/vmmw --dtype "$dtype" --dir "${GGUF_DIR:-/root/vmmw-gguf}" \
      --layers "${GGUF_LAYERS:-0}" --out "$out" >>"$log" 2>&1; then
    summary=$(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
s = "%.1f GB file: ours %.2f of link (%.1f GB/s, target 0.90), gguf reference %.2f of link, ours %.1fx it" % (
    r["file_bytes"] / 1e9, r["ours_cached_of_link"], r["ours_cached_gbps"], r["reference_of_link"], r["ours_over_reference"])
if "cold_of_disk" in r:
    s += "; cold %.2f of disk (%s)" % (r["cold_of_disk"], r["cold_method"])
print(s)' "$out")
    result "gguf $dtype: load" INFO "$summary"
  else
    tail -20 "$log"
    result "gguf $dtype: load" FAIL "bench_load_gguf.py failed; see load-gguf.txt"
    rc=1
  fi
  rm -f "$out.vmmw.json" "$out.cold.json"
  # The disk holds 64 GiB on one-GPU machines, and 20-load.sh's checkpoint stays.
  [ "${GGUF_KEEP:-0}" = 1 ] || rm -f "${GGUF_DIR:-/root/vmmw-gguf}"/model-"$dtype"-*.gguf
done
cat "$log"
exit $rc
