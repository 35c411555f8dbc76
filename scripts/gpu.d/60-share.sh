#!/usr/bin/env bash
# Sharing across processes: the owner loads the 16.4 GB 8B-shaped
# checkpoint (the one 20-load.sh generates; synthetic tensors of the same
# shapes when it is absent) and serves it; a second process attaches through
# CUDA VMM IPC (POSIX file descriptors over a Unix socket), checksums every
# tensor and reports its attach time (target <= 50 ms). With two GPUs, again
# with the importer on GPU 1 reading GPU 0's memory over NVLink.
# Then the transformers forward over shared weights (tests/torch/test_share_torch.py):
# process B's logits bitwise equal to process A's, B on GPU 0 and, with two
# GPUs, on GPU 1. Then `vmmw serve` with a Python importer
# (tests/torch/serve_check.py). Writes share.txt and share-torch.txt to $VMMW_GPU_OUT.
set -uo pipefail
source scripts/gpu-lib.sh
export VMMW_BACKEND=cuda
ckpt="${LOAD_DIR:-/root/vmmw-ckpt-8b}"
[ -e "$ckpt/model.safetensors.index.json" ] && export VMMW_SHARE_CKPT="$ckpt"
log="$VMMW_GPU_OUT/share.txt"
: >"$log"
rc=0
bench() { # $1: label, $2: importer device
  # The owner's copy of the checkpoint (the importer maps the same memory).
  fits "share: $1" $(($(ckpt_mib 36) + 4096)) || return
  VMMW_SHARE_IMPORT_DEVICE="$2" .gpu/tests/all --exact \
    share_attach_bench::owner_serves_and_importer_checksums_equal --nocapture --test-threads=1 >>"$log" 2>&1
  local t=$?
  local line
  # libtest may print the test's name before the line on the same line.
  line=$(grep -o 'share-bench {.*}' "$log" | tail -1)
  if [ "$t" -ne 0 ] || [ -z "$line" ]; then
    if grep -q 'SKIP: ' "$log"; then
      result "share: $1" SKIP "$(grep -o -m1 'SKIP: .*' "$log")"
    else
      result "share: $1" FAIL "exit $t; see share.txt"
      rc=1
    fi
    return
  fi
  local summary
  summary=$(python3 -c '
import json, sys
r = json.loads(sys.argv[1].split(" ", 1)[1])
ok = float(r["attach_ms"]) <= 50
print(("PASS" if ok else "FAIL") + "\t%s, %.2f GB, %d tensors, %s chunks: attach %s ms (target <= 50; handshake %s, receive+import+map %s, access %s), again in the same process %s ms, detach %s ms, checksums equal; load %.1f s" % (
    r["source"], r["bytes"] / 1e9, r["tensors"], r["chunks"], r["attach_ms"], r["handshake_ms"], r["import_map_ms"],
    r["access_ms"], r["again_ms"], r["detach_ms"], r["load_s"]))' "$line")
  result "share: $1" "${summary%%$'\t'*}" "${summary#*$'\t'}"
  [[ "$summary" == PASS* ]] || rc=1
}
bench "attach, same GPU" 0
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "${ngpu:-0}" -ge 2 ]; then
  bench "attach, importer on GPU 1" 1
else
  result "share: attach, importer on GPU 1" SKIP "one GPU on this machine"
fi
# The forward over shared weights, through the Python package (python/ from the
# tree, the library from .gpu/, as 30-torch.sh).
tlog="$VMMW_GPU_OUT/share-torch.txt"
if ! python3 -c 'import torch, transformers, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  result "share: forward over shared weights (torch)" SKIP "PyTorch with CUDA, or transformers, is not available here"
else
  PYTHONPATH="python:tests/torch${PYTHONPATH:+:$PYTHONPATH}" VMMW_LIB="${VMMW_LIB:-$PWD/.gpu/libvmmweights.so}" \
    PYTHONUNBUFFERED=1 python3 -m pytest -q -s -rs tests/torch/test_share_torch.py >"$tlog" 2>&1
  t=$?
  cat "$tlog"
  if [ "$t" -eq 0 ] && ! grep -q "passed" "$tlog"; then
    result "share: forward over shared weights (torch)" SKIP "$(grep -m1 -o 'SKIPPED.*' "$tlog")"
  elif [ "$t" -eq 0 ]; then
    result "share: forward over shared weights (torch)" PASS \
      "B's logits bitwise equal to A's; $(grep -c '^share forward' "$tlog") runs ($(grep -o 'B on cuda:[0-9]' "$tlog" | sort -u | tr '\n' ' '| sed 's/ $//')); $(tail -1 "$tlog")"
  else
    result "share: forward over shared weights (torch)" FAIL "exit $t; see share-torch.txt"
    rc=1
  fi
fi
# vmmw serve on the GPU: attached from Python on the last GPU, every tensor
# compared with the file, SIGHUP seen as version 2, SIGTERM clean.
line=$(PYTHONPATH="python:tests/torch${PYTHONPATH:+:$PYTHONPATH}" VMMW_LIB="${VMMW_LIB:-$PWD/.gpu/libvmmweights.so}" \
  timeout 300 python3 tests/torch/serve_check.py --vmmw .gpu/vmmw --dir "$ckpt" 2>&1 | tee -a "$log" | grep -E '^(PASS|FAIL|SKIP)' | tail -1)
result_of "share: vmmw serve + Python attach" "$line" share.txt || rc=1
cat "$log"
exit $rc
