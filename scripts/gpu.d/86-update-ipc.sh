#!/usr/bin/env bash
# Updates from another process on the same GPU (the IPC transport).
# 1. tests/all update_transport on the cuda backend: a sender process's ring
#    of device memory exported once, and a direct update out of the sender's
#    pool memory, each imported by the receiver, bitwise for world 1 and a
#    rank of world 2 (the host-only cases run there too).
# 2. The engine loads the 16.4 GB 8B-shaped checkpoint (LOAD_DIR, as
#    20-load.sh; made here when absent), or fewer layers of it where five
#    copies do not fit the card (an H100: 31 of 36 layers, made in
#    LOAD_DIR-<layers>l and removed after), a trainer process sends its negated
#    tensors: directly out of its pool, UPDATE_ROUNDS (5) times from one
#    sender into one receiver on the documented path (the trainer offers its
#    tensors once, the engine attaches before the first update), new values
#    each round (the PASS row: the first update's whole receive_ call, and
#    the median of all, >= 0.8 of PyTorch's copy_ of the same bytes into the
#    same destinations just before it; no update attaches anything; bitwise
#    every round; the attach's own time reported), gathered into its pool
#    first, and through the ring at 256 MiB and 1 GiB buckets (INFO rows).
#    At most 4x the checkpoint on the card (66 GB): an H100 holds it.
# 3. `vmmw bench-update --transport ipc-direct` on the same checkpoint: the
#    kept-imports path without Python, against one device-to-device copy
#    (an INFO row).
# Writes update-transport-tests.txt, update-ipc.txt, update-ipc.json and
# update-ipc-cli.json to $VMMW_GPU_OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu-lib.sh
export PYTHONPATH="python:tests/torch${PYTHONPATH:+:$PYTHONPATH}"
export VMMW_LIB="${VMMW_LIB:-$PWD/.gpu/libvmmweights.so}"
export VMMW_BACKEND=cuda PYTHONUNBUFFERED=1
rc=0
tlog="$VMMW_GPU_OUT/update-transport-tests.txt"
VMMW_BACKEND=cuda .gpu/tests/all update_transport --nocapture --test-threads=1 >"$tlog" 2>&1
t=$?
tail -15 "$tlog"
ran=$(grep -c '^RAN cuda: ' "$tlog")
summary=$(grep -E '^test result:' "$tlog" | tail -1)
if [ "$t" -ne 0 ] || [ "$ran" -lt 1 ]; then
  result "update: transport Rust tests, cuda" FAIL "exit $t, $ran ran on cuda; ${summary:-no summary}; see update-transport-tests.txt"
  rc=1
else
  result "update: transport Rust tests, cuda" PASS "$ran ran on cuda (another process, VMM IPC ring and direct, bitwise); ${summary#test result: }"
fi
if ! python3 -c 'import torch, safetensors, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  result "update: another process, same GPU" SKIP "PyTorch with CUDA, or safetensors, is not available here"
  exit $rc
fi
log="$VMMW_GPU_OUT/update-ipc.txt"
# On the GPU at once: the engine's destinations and their originals, the
# trainer's tensors, their copy in its pool and the gathered copy (five
# copies of the checkpoint), ring slots and two processes' contexts.
dir="${LOAD_DIR:-/root/vmmw-ckpt-8b}"
layers=$(fit_layers 5 4096)
scaled=""
if [ "$layers" -eq 0 ]; then
  result "update: another process, same GPU, direct" SKIP "five copies of even a one-layer checkpoint do not fit GPU 0 ($(($(gpu_mem_mib) / 1024)) GiB)"
  exit $rc
elif [ "$layers" -lt "${LOAD_LAYERS:-36}" ]; then
  scaled="${dir%/}-${layers}l"
  dir=$scaled
  result "update: another process, same GPU, size" INFO "$layers of ${LOAD_LAYERS:-36} layers ($(($(ckpt_mib "$layers") >> 10)) GiB): five copies of the full checkpoint do not fit GPU 0's $(($(gpu_mem_mib) >> 10)) GiB"
fi
line=$(timeout 1200 python3 tests/torch/update_ipc.py --dir "$dir" \
  --layers "$layers" --rounds "${UPDATE_ROUNDS:-5}" --out "$VMMW_GPU_OUT/update-ipc.json" 2>&1 | tee "$log" | grep -E '^(PASS|FAIL)' | tail -1)
cat "$log"
while IFS= read -r info; do
  result "update: another process, same GPU, ${info%%:*}" INFO "${info#*: }"
done < <(grep -E '^INFO ' "$log" | sed 's/^INFO //')
result_of "update: another process, same GPU, direct, from the first update" "$line" update-ipc.txt || rc=1
[ -n "$scaled" ] && rm -rf "$scaled"
cli="$VMMW_GPU_OUT/update-ipc-cli.json"
# The sender's pool copy, the receiver's destinations and the check's copy.
fits "update: bench-update ipc-direct" $((3 * $(ckpt_mib "${LOAD_LAYERS:-36}") + 4096)) || exit $rc
if .gpu/vmmw bench-update "${LOAD_DIR:-/root/vmmw-ckpt-8b}" --preset qwen3 --backend cuda \
  --transport ipc-direct --repeat 10 --json "$cli"; then
  result "update: bench-update ipc-direct (core vs one d2d copy)" INFO "$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); m=lambda v: sorted(v)[len(v) // 2]; print("%.3f of the d2d copy (whole update, median of %d); setup %.2f ms median; %d of %d recognized the manifest; %d destinations checked bitwise" % (r["ratio"], len(r["update_seconds"]), m(r["setup_ms"]), sum(r["recognized"]), len(r["recognized"]), r["verified_destinations"]))' "$cli")"
else
  result "update: bench-update ipc-direct" FAIL "vmmw bench-update --transport ipc-direct failed; see the log"
  rc=1
fi
exit $rc
