#!/usr/bin/env bash
# Build the committed PTX of every CUDA C kernel with nvcc (on a machine that
# has it: the GPU machine), in place:
#   kernels/hash.cu  -> src/driver/cuda/hash.ptx   (Reload's range hashes)
#   kernels/codec.cu -> src/driver/cuda/codec.ptx  (the backup codec)
# Commit the results; the driver loads them at run time, so building the
# crate needs no CUDA. scripts/gpu.d/62-reload.sh and 64-codec.sh fail when
# a committed PTX differs from what this makes.
#   scripts/build-ptx.sh [OUT_DIR]   (default: src/driver/cuda)
# The GPU machine's nvcc is release 13.0 (V13.0.88). Without a GPU, the same
# compiler from PyPI makes the same bytes: unpack the wheels
# nvidia-cuda-nvcc==13.0.88, nvidia-nvvm==13.0.88, nvidia-cuda-crt==13.0.88
# and nvidia-cuda-runtime==13.0.96 into one folder (python3 -m zipfile -e)
# and put its nvidia/cu13/bin first on PATH. The GPU check stays the judge.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-src/driver/cuda}"
nvcc=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
if [ ! -x "$nvcc" ]; then
  echo "build-ptx: no nvcc (set CUDA_HOME or PATH)" >&2
  exit 1
fi
mkdir -p "$out"
for k in hash codec; do
  "$nvcc" -ptx -arch=compute_75 -O3 -o "$out/$k.ptx" "kernels/$k.cu"
  echo "build-ptx: $out/$k.ptx ($(wc -c <"$out/$k.ptx") bytes, $("$nvcc" --version | tail -1))"
done
