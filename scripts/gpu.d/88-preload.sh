#!/usr/bin/env bash
# The CUDA runtime interposer (libvmmw_preload.so, docs/PRELOAD.md) against
# the REAL libcudart: the test program of the host twin (tests/preload/twin.c)
# built here with gcc against the toolkit's libcudart.so (dynamically, as
# libggml-cuda links it), run with `vmmw exec --backend cuda` and driven by
# tests/preload/twin.py, the same checks as scripts/test.d/32-preload.sh:
#   - the control socket before any allocation; bad requests refused;
#   - cudaMalloc from 4 threads, cudaMallocPitch, runtime-made, managed and
#     pinned allocations passed through; cudaMemGetInfo moving with the pool;
#   - sleep/wake with offload (twice), offload-compressed and discard through
#     the socket, every byte compared at the same address after each wake,
#     the memory unmapped while asleep (cuPointerGetAttribute MAPPED);
#   - vmmw ctl, in-process vmmw_preload_sleep/wake, a wake without room
#     refused with every backup intact, a wake that waits for memory;
#   - frees: ours released at once, the runtime's passed on, a double free refused;
#   - region scope, exit codes and signals through vmmw exec.
# Sized from the card: the process holds min(17 GiB, a quarter of the card,
# a third of the host's available memory), about llama-server's resident
# weights and KV cache. Figures (FIGURE lines) as ratios against the link
# measured in the same run: each cycle's sleep and wake GB/s over the pinned
# device->host and host->device rates, the first (pinning the backup) and the
# later ones; cudaMalloc/cudaFree median times under the interposer against
# the runtime's own, same sizes, same run.
# Writes preload.txt to $VMMW_GPU_OUT.
set -uo pipefail
source scripts/gpu-lib.sh
name="preload: interposer on the real libcudart"
lib="$PWD/.gpu/libvmmw_preload.so"
if [ ! -f "$lib" ]; then
  result "$name" FAIL "no .gpu/libvmmw_preload.so in the bundle (scripts/build-gpu-bundle.sh builds it)"
  exit 1
fi
if ! command -v gcc >/dev/null; then
  result "$name" SKIP "no gcc on this machine"
  exit 0
fi
cuda=""
for c in "${CUDA_HOME:-}" "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")")" /usr/local/cuda; do
  if [ -n "$c" ] && [ -f "$c/include/cuda_runtime_api.h" ]; then cuda=$c; break; fi
done
if [ -z "$cuda" ]; then
  result "$name" SKIP "no CUDA toolkit headers found (CUDA_HOME, nvcc, /usr/local/cuda)"
  exit 0
fi
libdir=""
for d in "$cuda/lib64" "$cuda/targets/x86_64-linux/lib" "$cuda/lib"; do
  if [ -e "$d/libcudart.so" ]; then libdir=$d; break; fi
done
if [ -z "$libdir" ]; then
  result "$name" SKIP "no libcudart.so under $cuda"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! gcc -std=c11 -O2 -g -Wall -pthread -DVMMW_TWIN_CUDA -isystem "$cuda/include" \
     tests/preload/twin.c -o "$work/preload_twin" -L"$libdir" -lcudart -Wl,-rpath,"$libdir" -ldl; then
  result "$name" FAIL "tests/preload/twin.c did not build against $libdir/libcudart.so"
  exit 1
fi
echo "twin built against $(readelf -d "$work/preload_twin" | grep -o 'libcudart[^]]*') in $libdir"

# Size from the card and the host.
gpu_total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null | head -1)
avail_kb=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
bytes=$((17 << 30))
if [ -n "$gpu_total" ]; then
  quarter=$((gpu_total * 1024 * 1024 / 4))
  [ "$quarter" -lt "$bytes" ] && bytes=$quarter
fi
third=$((avail_kb * 1024 / 3))
[ "$third" -lt "$bytes" ] && bytes=$third
if [ "$bytes" -lt $((1 << 30)) ]; then
  result "$name" SKIP "under 1 GiB to spare (card ${gpu_total:-?} MiB, host ${avail_kb} KiB available)"
  exit 0
fi
echo "the process holds about $((bytes >> 20)) MiB (card ${gpu_total:-?} MiB, host $((avail_kb >> 10)) MiB available)"

txt="$VMMW_GPU_OUT/preload.txt"
PYTHONUNBUFFERED=1 timeout 540 python3 tests/preload/twin.py --backend cuda --vmmw .gpu/vmmw --lib "$lib" \
  --twin "$work/preload_twin" --workdir "$work/run" --bytes "$bytes" 2>&1 | tee "$txt"
t=${PIPESTATUS[0]}
passed=$(grep -c '^PASS ' "$txt")
failed=$(grep -c '^FAIL ' "$txt")
skipped=$(grep -c '^SKIP ' "$txt")
if [ "$t" -eq 0 ] && [ "$failed" -eq 0 ] && [ "$passed" -ge 55 ]; then
  result "$name" PASS "$passed checks passed, $skipped skipped, $((bytes >> 20)) MiB held; see preload.txt"
else
  result "$name" FAIL "exit $t; $passed passed, $failed failed ($(grep '^FAIL ' "$txt" | head -3 | cut -c1-120 | tr '\n' ';')); see preload.txt"
fi
while IFS= read -r line; do
  line=${line#FIGURE }
  result "preload: ${line%%: *}" INFO "${line#*: }"
done < <(grep '^FIGURE ' "$txt")
[ "$t" -eq 0 ] && [ "$failed" -eq 0 ]
