#!/usr/bin/env bash
# Builds the stand-in CUDA runtime and the interposer's test program:
#   OUT/libvmmw_standin_cudart.so  the CUDA runtime API on host memory, with
#                                  counters (tests/preload/standin_cudart.h)
#   OUT/preload_twin               tests/preload/twin.c linked against it
#   OUT/preload_late               tests/preload/late.c, which loads the
#                                  runtime late (dlopen), as Python does
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
echo "$out/libvmmw_standin_cudart.so"
echo "$out/preload_twin"
echo "$out/preload_late"
