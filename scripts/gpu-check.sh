#!/usr/bin/env bash
# Runs ON the GPU machine, from the repo root, with no Rust there: every
# scripts/gpu.d/*.sh in order, on the prebuilt binaries in .gpu/ (made by
# scripts/build-gpu-bundle.sh). Each part appends short result lines (see
# scripts/gpu-lib.sh); the table of them is printed last. Exits non-zero when
# any part failed or reported FAIL.
#   bash scripts/gpu-check.sh            every part
#   bash scripts/gpu-check.sh 10 30      only parts whose names start with 10 or 30
set -uo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .gpu/vmmw ]; then
  echo "gpu-check: no .gpu/ bundle here; run scripts/build-gpu-bundle.sh and carry .gpu" >&2
  exit 2
fi
export VMMW_GPU_OUT="${OUT:-$PWD/.gpu/out}"
mkdir -p "$VMMW_GPU_OUT"
export VMMW_GPU_RESULTS
VMMW_GPU_RESULTS=$(mktemp)
# Never let anything here turn on NVLink multicast (shared hosts, see the device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

echo "=== gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
head -2 .gpu/MANIFEST
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 || true

failed=0
for part in scripts/gpu.d/*.sh; do
  name=${part#scripts/gpu.d/}
  if [ $# -gt 0 ]; then
    wanted=0
    for p in "$@"; do [[ "$name" == "$p"* ]] && wanted=1; done
    [ "$wanted" -eq 1 ] || { echo "=== $name: not selected"; continue; }
  fi
  echo
  echo "=== $name"
  start=$(date +%s)
  bash "$part"
  rc=$?
  secs=$(( $(date +%s) - start ))
  if [ "$rc" -eq 0 ]; then
    printf '%s\tPASS\texit 0 in %ss\n' "$name" "$secs" >>"$VMMW_GPU_RESULTS"
  else
    printf '%s\tFAIL\texit %s in %ss\n' "$name" "$rc" "$secs" >>"$VMMW_GPU_RESULTS"
    failed=1
  fi
done

echo
echo "=== results"
printf '| check | result | detail |\n|---|---|---|\n'
while IFS=$'\t' read -r check status detail; do
  printf '| %s | %s | %s |\n' "$check" "$status" "$detail"
  [ "$status" = FAIL ] && failed=1
done <"$VMMW_GPU_RESULTS"
rm -f "$VMMW_GPU_RESULTS"
exit "$failed"
