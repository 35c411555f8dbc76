#!/usr/bin/env bash
# The CUDA runtime interposer (libvmmw_preload.so, docs/PRELOAD.md) on the host
# backend: the preload crate's lint and unit tests; what the library exports
# (the CUDA entry points it owns and the vmmw_preload_* calls of
# include/vmmw_preload.h, nothing else); then the end-to-end twin of
# scripts/gpu.d/88-preload.sh: the test program (tests/preload/twin.c), linked
# against the stand-in CUDA runtime, run with `vmmw exec` and slept and woken
# through its control socket, its bytes, addresses and memory checked at each
# step (tests/preload/twin.py prints one line per check); and a dry run of the
# llama-server proof's harness on the stand-in server. About 50 s once the
# crates are built.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo clippy -p vmmw-preload --all-targets -- -D warnings
cargo test -p vmmw-preload --quiet
# One build for both: the command line's crate and the interposer share the
# vmmweights library built with `cli`, as the Rust part built it.
cargo build -p vmmweights -p vmmw-preload --features vmmweights/cli --quiet
target="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug"
lib="$target/libvmmw_preload.so"

echo "--- exports of libvmmw_preload.so"
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRV]$/ {print $3}' | sort)
# torch_memory_saver's C names (preload/src/tms.rs) are upstream's, kept as its
# binary exports them for the shim's preload mode.
declared=$( (printf '%s\n' cudaFree cudaMalloc cudaMallocPitch cudaMemGetInfo;
  grep -o 'vmmw_preload_[a-z_]*(' include/vmmw_preload.h | tr -d '(';
  grep -o 'extern "C" fn tms_[a-z_]*' preload/src/tms.rs | sed 's/.* fn //') | sort -u)
if [[ "$exported" != "$declared" ]]; then
  echo "libvmmw_preload.so exports what it should not, or lacks a declared call:" >&2
  diff <(echo "$declared") <(echo "$exported") >&2 || true
  exit 1
fi
echo "exports: $(echo $exported)"

echo "--- the host twin"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bash scripts/build-preload-standin.sh "$out" >/dev/null
python3 tests/preload/twin.py --backend host --vmmw "$target/vmmw" --lib "$lib" \
  --twin "$out/preload_twin" --late "$out/preload_late" --workdir "$out/work"

# The GPU proof's harness (tests/llama/proof.py, scripts/gpu.d/90-llama.sh) on
# the stand-in llama-server under the interposer: every check it makes of
# what the server computed (outputs across round trips, the soak, the prompt
# cache, a cached prompt after a wake against one recomputed after
# llama-server's own idle sleep); its timings are reported, not judged.
echo "--- the llama-server proof's harness on the stand-in server (a dry run)"
WEIGHTS_MB=64 VMMW_BACKEND=host VMMW_PRELOAD_LIB="$lib" python3 tests/llama/proof.py --server "$out/llama-server" \
  --vmmw "$target/vmmw" --model standin-big --small standin-small --assume-link 20:20 \
  --soak 20 --long-tokens 2000 --ctx 4096 --idle 1 --logdir "$out/llama-logs" --out "$out/proof.json" \
  || { tail -40 "$out"/llama-logs/*.log >&2; exit 1; }
