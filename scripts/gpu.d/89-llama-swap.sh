#!/usr/bin/env bash
# go-swap's proxy mode with real llama-server processes on one GPU: three
# models under the interposer (`vmmw exec`), one awake, the others asleep in
# host memory; a swap for every pair of sleep policies timed against the
# link measured in the same run (H2D and D2H with torch), requests sent
# during each swap answered after it (none lost, answers unchanged where the
# memory was kept), and the prompt cache surviving a swap.
#   LLAMA_SERVER  path of a CUDA build of llama-server [default: .llama/build/bin/llama-server,
#                 built with scripts/llama/build.sh when missing, as 90-llama.sh does]
#   LLAMA_GGUF    one GGUF (8B-shaped, ~16 GB F16/BF16) that the three share [default:
#                 $LLAMA_DIR/big.gguf (LLAMA_DIR default /root/vmmw-llama), written with
#                 scripts/llama/make_gguf.py when missing, as 90-llama.sh does],
#   LLAMA_GGUFS   or several, separated by ':' (model i takes GGUF i mod n)
#   LLAMA_EXTRA   more llama-server options (optional)
# Writes llama-swap.txt and llama-swap.json to $VMMW_GPU_OUT (the service log's tail goes
# into the txt when something failed).
set -uo pipefail
source scripts/gpu-lib.sh
name="llama-swap: go-swap proxy, 3 llama-server models, swap vs link"
for f in .gpu/go-swap .gpu/vmmw; do
  [ -x "$f" ] || { result "$name" SKIP "no $f in the bundle"; exit 0; }
done
if ! .gpu/vmmw exec --help >/dev/null 2>&1; then
  result "$name" SKIP ".gpu/vmmw has no exec command (the interposer is not in this bundle)"
  exit 0
fi
if [ ! -f .gpu/libvmmw_preload.so ] && [ -z "${VMMW_PRELOAD_LIB:-}" ]; then
  result "$name" SKIP "no .gpu/libvmmw_preload.so in the bundle (and VMMW_PRELOAD_LIB unset)"
  exit 0
fi
dir=${LLAMA_DIR:-/root/vmmw-llama}
if [ -z "${LLAMA_SERVER:-}" ]; then
  LLAMA_SERVER=.llama/build/bin/llama-server
  if [ ! -x "$LLAMA_SERVER" ] && { [ -f .llama/src/CMakeLists.txt ] || [ -f .llama/src.tar.xz ]; }; then
    mkdir -p "$dir"
    t0=$SECONDS
    if ! bash scripts/llama/build.sh >"$dir/build.log" 2>&1; then
      tail -30 "$dir/build.log"
      result "$name" FAIL "building llama-server failed (scripts/llama/build.sh; $dir/build.log)"
      exit 1
    fi
    echo "built llama-server in $((SECONDS - t0)) s"
  fi
fi
if [ ! -x "${LLAMA_SERVER}" ]; then
  result "$name" SKIP "no llama-server: set LLAMA_SERVER, or carry .llama (scripts/llama/fetch.sh) to build one"
  exit 0
fi
# A shared-library build finds its libraries beside it, wherever it lies here.
export LD_LIBRARY_PATH="$(dirname "$(realpath "$LLAMA_SERVER")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ggufs=()
if [ -n "${LLAMA_GGUFS:-}" ]; then
  IFS=: read -r -a ggufs <<<"$LLAMA_GGUFS"
elif [ -n "${LLAMA_GGUF:-}" ]; then
  ggufs=("$LLAMA_GGUF")
else
  if [ ! -f "$dir/big.gguf" ]; then
    mkdir -p "$dir"
    # make_gguf.py takes the qwen2 vocabulary and the gguf package from the source.
    [ -f .llama/src/CMakeLists.txt ] || [ ! -f .llama/src.tar.xz ] || tar xJf .llama/src.tar.xz -C .llama
    if [ -d .llama/src ]; then export LLAMA_SRC="$PWD/.llama/src"; fi
    python3 scripts/llama/make_gguf.py "$dir/big.gguf" || { result "$name" FAIL "writing $dir/big.gguf failed"; exit 1; }
  fi
  ggufs=("$dir/big.gguf")
fi
args=()
for g in "${ggufs[@]}"; do
  [ -f "$g" ] || { result "$name" FAIL "GGUF $g does not exist"; exit 1; }
  args+=(--gguf "$(realpath "$g")")
  cat "$g" >/dev/null  # page-cached: every cold start reads it from memory
done
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  result "$name" SKIP "PyTorch with CUDA (for the link measurement) not available"
  exit 0
fi
# The service links libvmmweights under its SONAME, as an installed copy is found.
libdir=$(mktemp -d)
trap 'rm -rf "$libdir"' EXIT
lib="$PWD/.gpu/libvmmweights.so"
soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
ln -s "$lib" "$libdir/${soname:-libvmmweights.so}"
# The run tool allows 10 minutes a command: what building and writing left.
left=$((570 - SECONDS))
if [ "$left" -lt 240 ]; then
  result "$name" SKIP "only ${left} s left after building llama-server and writing the GGUF (both kept): run it again"
  exit 0
fi
txt="$VMMW_GPU_OUT/llama-swap.txt"
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONUNBUFFERED=1 timeout "$left" \
  python3 examples/go-swap/bench/llama_swap_bench.py --service "$PWD/.gpu/go-swap" --vmmw "$PWD/.gpu/vmmw" \
  --llama-server "$(realpath "$LLAMA_SERVER")" "${args[@]}" --extra-args "${LLAMA_EXTRA:-}" \
  --out "$VMMW_GPU_OUT/llama-swap.json" 2>&1 | tee "$txt"
t=${PIPESTATUS[0]}
result_of "$name" "$(grep -E '^(PASS|FAIL|SKIP)' "$txt" | tail -1)" llama-swap.txt || exit 1
exit "$t"
