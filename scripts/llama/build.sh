#!/usr/bin/env bash
# Builds llama-server from .llama/src (scripts/llama/fetch.sh; unpacked from
# .llama/src.tar.xz when only that travelled) into .llama/build, unmodified:
# the stock CMake options, CUDA for Hopper only where nvcc is found (the GPU
# machine: about 3 minutes on 16 cores), the CPU backend otherwise. Shared
# libraries, so libggml-cuda.so links libcudart.so dynamically and the
# interposer (LD_PRELOAD) sees its cudaMalloc calls. No network: the web UI is
# neither downloaded nor built.
# A build made on an earlier GPU run can travel instead (the GPU machine is
# scarce; three minutes of it per build count): `--pack DIR` writes
# .llama/build/bin as an xz tar in 15 MB parts (DIR/llama-bin.txz.aa, ...);
# put them alone in .llama/binpack/ here (remove older parts first) and carry
# that folder with .llama/src.tar.xz, and this script unpacks them instead of
# building when it finds nvcc and no build. Never carry .llama/build itself: a
# build made here, without nvcc, is a CPU build.
#   bash scripts/llama/build.sh             -> .llama/build/bin/llama-server
#   bash scripts/llama/build.sh --pack DIR  -> DIR/llama-bin.txz.*
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = "--pack" ]; then
  [ -n "${2:-}" ] && [ -x .llama/build/bin/llama-server ] || { echo "build: --pack DIR needs a build in .llama/build" >&2; exit 2; }
  mkdir -p "$2"
  XZ_OPT=-T0 tar cJf - -C .llama/build bin | split -b 15M - "$2/llama-bin.txz."
  echo "build: packed .llama/build/bin into $2/llama-bin.txz.*"
  exit 0
fi
if [ ! -f .llama/src/CMakeLists.txt ]; then
  [ -f .llama/src.tar.xz ] || { echo "build: no .llama/src; run scripts/llama/fetch.sh first" >&2; exit 2; }
  tar xJf .llama/src.tar.xz -C .llama
fi
if [ ! -x .llama/build/bin/llama-server ] && compgen -G ".llama/binpack/llama-bin.txz.*" >/dev/null \
  && { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  # Into a folder of its own first: a failed unpack leaves no partial build behind.
  rm -rf .llama/build.unpack && mkdir -p .llama/build.unpack .llama/build
  cat .llama/binpack/llama-bin.txz.* | tar xJf - -C .llama/build.unpack
  rm -rf .llama/build/bin && mv .llama/build.unpack/bin .llama/build/bin && rmdir .llama/build.unpack
  echo "build: unpacked an earlier build from .llama/binpack: $(ls .llama/build/bin/llama-server)"
  exit 0
fi
cuda=OFF
arch=()
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda=ON
  export PATH="$PATH:/usr/local/cuda/bin"
  arch=(-DCMAKE_CUDA_ARCHITECTURES="${LLAMA_CUDA_ARCH:-90-real}")
fi
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S .llama/src -B .llama/build "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_CUDA="$cuda" "${arch[@]}" -DBUILD_SHARED_LIBS=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF >/dev/null
cmake --build .llama/build --target llama-server -j "$(nproc)"
echo "build: $(ls .llama/build/bin/llama-server) (CUDA $cuda)"
