#!/usr/bin/env bash
# An unmodified llama-server on vmmweights memory (docs/PRELOAD.md):
#   1. llama-server built from the pinned llama.cpp source (scripts/llama/fetch.sh
#      made .llama/src.tar.xz here; scripts/llama/build.sh builds it with CUDA for
#      Hopper into .llama/build, about 3 minutes on 16 cores; kept for later runs
#      on the same machine);
#   2. two GGUF models written with llama.cpp's gguf package
#      (scripts/llama/make_gguf.py): an 8B-shaped one of 16.4 GB and a small one
#      of the same architecture, in LLAMA_DIR (default /root/vmmw-llama), kept;
#   3. tests/llama/proof.py: outputs equal with and without the interposer and
#      after round trips, sleep and wake against the link, 100 cycles with
#      outputs equal and memory flat, an 8k-token prompt served from the KV
#      cache after a round trip, time to first token after idle against
#      llama.cpp's own --sleep-idle-seconds and a process restart.
# LLAMA_PHASES picks the proof's phases (default all); LLAMA_SOAK the cycles.
# Writes llama.txt and llama.json to $VMMW_GPU_OUT.
set -uo pipefail
source scripts/gpu-lib.sh
dir=${LLAMA_DIR:-/root/vmmw-llama}
mkdir -p "$dir"
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  result "llama: llama-server under the interposer" SKIP "PyTorch with CUDA not available (the proof measures the link with it)"
  exit 0
fi
if [ ! -x .llama/build/bin/llama-server ]; then
  t0=$SECONDS
  if ! bash scripts/llama/build.sh >"$dir/build.log" 2>&1; then
    tail -30 "$dir/build.log"
    cp "$dir/build.log" "$VMMW_GPU_OUT/llama-build.txt"
    result "llama: build llama-server" FAIL "see llama-build.txt"
    exit 1
  fi
  result "llama: build llama-server (CUDA, sm_90)" PASS "$((SECONDS - t0)) s, $(cat .llama/src/VMMW_SOURCE | cut -d' ' -f1) of llama-cpp-python"
  # A build made here comes back with the results: put its parts in
  # .llama/binpack/ to carry it next time instead of building (scripts/llama/build.sh).
  if ! grep -q "unpacked an earlier build" "$dir/build.log"; then
    bash scripts/llama/build.sh --pack "$VMMW_GPU_OUT" || true
  fi
fi
# make_gguf.py takes the qwen2 vocabulary and the gguf package from the source.
[ -f .llama/src/CMakeLists.txt ] || tar xJf .llama/src.tar.xz -C .llama
# The build's libraries, wherever the checkout lies on this machine.
export LD_LIBRARY_PATH="$PWD/.llama/build/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The big model needs its weights, a 16k-token KV cache and compute buffers on
# the card (about 20 GB), and the host its page cache and a pinned backup.
mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem_mib:-0}" -lt 40000 ]; then
  result "llama: llama-server under the interposer" SKIP "the card has ${mem_mib} MiB; the 8B-shaped model needs about 20 GB"
  exit 0
fi
export LLAMA_SRC="$PWD/.llama/src"
[ -f "$dir/big.gguf" ] || python3 scripts/llama/make_gguf.py "$dir/big.gguf" || { result "llama: make the 8B-shaped GGUF" FAIL "see the log above"; exit 1; }
[ -f "$dir/small.gguf" ] || python3 scripts/llama/make_gguf.py --small "$dir/small.gguf" || { result "llama: make the small GGUF" FAIL "see the log above"; exit 1; }
# Page-cache both, so every server start reads them from memory.
cat "$dir/big.gguf" "$dir/small.gguf" >/dev/null

txt="$VMMW_GPU_OUT/llama.txt"
PYTHONUNBUFFERED=1 python3 tests/llama/proof.py --server .llama/build/bin/llama-server --vmmw .gpu/vmmw \
  --model "$dir/big.gguf" --small "$dir/small.gguf" --soak "${LLAMA_SOAK:-100}" \
  --phases "${LLAMA_PHASES:-link,outputs,big,ttft}" --logdir "$dir/logs" \
  --out "$VMMW_GPU_OUT/llama.json" 2>&1 | tee "$txt"
t=${PIPESTATUS[0]}
while IFS= read -r line; do
  name=${line#* }; name=${name%%:*}
  case "$line" in
    PASS*|FAIL*|SKIP*) result "llama: $name" "${line%% *}" "${line#*: }" ;;
  esac
done < <(grep -E '^(PASS|FAIL|SKIP) ' "$txt" | grep -v '^[A-Z]* llama proof:')
if [ "$t" -ne 0 ]; then
  tail -40 "$dir/logs/llama-big.log" 2>/dev/null
  exit 1
fi
exit 0
