#!/usr/bin/env bash
# Builds the stand-in CUDA runtime and the interposer's test program:
#   OUT/libvmmw_standin_cudart.so  the CUDA runtime API on host memory, with
#                                  counters (tests/preload/standin_cudart.h)
#   OUT/preload_twin               tests/preload/twin.c linked against it
#   OUT/preload_late               tests/preload/late.c, which loads the
#                                  runtime late (dlopen), as Python does
#   OUT/standin_model.so           the stand-in llama-server's model
#                                  (examples/go-swap/standin), linked against it
#   OUT/llama-server               runs the stand-in llama-server with that model
#                                  (WEIGHTS_MB of weights, default 16), taking
#                                  llama-server's options, for the GPU harnesses' dry runs
# A program standing in for a CUDA application builds the same way: include
# tests/preload/standin_cudart.h in place of <cuda_runtime_api.h> and link
# against OUT/libvmmw_standin_cudart.so (e.g. `-LOUT -lvmmw_standin_cudart
# -Wl,-rpath,OUT`), then run it under libvmmw_preload.so with
# VMMW_BACKEND=host (docs/PRELOAD.md, "Testing without a GPU").
# Usage: scripts/build-preload-standin.sh OUT
set -euo pipefail
out="${1:?usage: $0 OUT}"
src="$(cd "$(dirname "$0")/.." && pwd)/tests/preload"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cc=${CC:-gcc}
warn=(-Wall -Wextra -Werror)
"$cc" -std=c11 "${warn[@]}" -O2 -g -fPIC -shared -pthread \
  -Wl,-soname,libvmmw_standin_cudart.so \
  "$src/standin_cudart.c" -o "$out/libvmmw_standin_cudart.so"
"$cc" -std=c11 "${warn[@]}" -O2 -g -pthread -I"$src" "$src/twin.c" -o "$out/preload_twin" \
  -L"$out" -lvmmw_standin_cudart -Wl,-rpath,"$out" -ldl
"$cc" -std=c11 "${warn[@]}" -O2 -g "$src/late.c" -o "$out/preload_late" -ldl
standin="$(dirname "$src")/../examples/go-swap/standin"
standin="$(cd "$standin" && pwd)"
"$cc" -std=c11 "${warn[@]}" -O2 -shared -fPIC -I"$src" -o "$out/standin_model.so" \
  "$standin/standin_model.c" -L"$out" -lvmmw_standin_cudart -Wl,-rpath,"$out"
printf '#!/bin/sh\nexec python3 %s --lib %s --weights-mb "${WEIGHTS_MB:-16}" "$@"\n' \
  "$standin/standin_server.py" "$out/standin_model.so" >"$out/llama-server"
chmod +x "$out/llama-server"
echo "$out/libvmmw_standin_cudart.so"
echo "$out/preload_twin"
echo "$out/preload_late"
echo "$out/standin_model.so"
echo "$out/llama-server"
