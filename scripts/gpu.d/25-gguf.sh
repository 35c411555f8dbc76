#!/usr/bin/env bash
# GGUF loads on the GPU: ~16 GB files written on this machine with the `gguf`
# package (BF16, then Q8_0), each measured in one run by
# tests/torch/bench_load_gguf.py: the link, our load page-cached as a ratio
# of it (target 0.90), a cold load as a ratio of the disk's read rate, and
# the gguf package's own read-and-copy (GGUFReader + torch) as the reference.
# Writes load-gguf.txt and load-gguf-<dtype>.json to $VMMW_GPU_OUT.
#
# The GPU machine has no network: the gguf wheel travels with the bundle.
# Before the run, here:   pip download gguf==0.19.0 --no-deps -d .gguf-wheels
# and carry `.gguf-wheels` (ignored by git) next to `.gpu-pack`. The wheel is
# pure Python; it is unpacked into .gguf-wheels/site and put on PYTHONPATH
# (its imports, numpy and pyyaml, come with PyTorch and transformers there).
# GGUF_DIR (default /root/vmmw-gguf) holds the files; GGUF_TYPES (default
# "bf16 q8_0") picks the files; GGUF_LAYERS overrides the layer count.
set -uo pipefail
source scripts/gpu-lib.sh
export VMMW_LIB="${VMMW_LIB:-$PWD/.gpu/libvmmweights.so}"
export VMMW_BACKEND=cuda PYTHONUNBUFFERED=1
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  result "gguf" SKIP "PyTorch with CUDA is not available on this machine"
  exit 0
fi
if ! python3 -c 'import gguf' 2>/dev/null; then
  wheel=$(ls .gguf-wheels/gguf-*.whl 2>/dev/null | tail -1)
  if [ -z "$wheel" ]; then
    result "gguf" SKIP "no gguf package and no wheel in .gguf-wheels (pip download gguf==0.19.0 --no-deps -d .gguf-wheels, then carry it)"
    exit 0
  fi
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" .gguf-wheels/site
  export PYTHONPATH=".gguf-wheels/site${PYTHONPATH:+:$PYTHONPATH}"
fi
rc=0
log="$VMMW_GPU_OUT/load-gguf.txt"
: >"$log"
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
done
cat "$log"
exit $rc
