#!/usr/bin/env bash
# Builds llama-server from .llama/src (scripts/llama/fetch.sh; unpacked from
# .llama/src.tar.xz when only that travelled) into .llama/build, unmodified:
# the stock CMake options, CUDA for Hopper only where nvcc is found (the GPU
# machine: about 3 minutes on 16 cores), the CPU backend otherwise. Shared
# libraries, so libggml-cuda.so links libcudart.so dynamically and the
# interposer (LD_PRELOAD) sees its cudaMalloc calls. No network: the web UI is
# neither downloaded nor built.
#   bash scripts/llama/build.sh     -> .llama/build/bin/llama-server
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -f .llama/src/CMakeLists.txt ]; then
  [ -f .llama/src.tar.xz ] || { echo "build: no .llama/src; run scripts/llama/fetch.sh first" >&2; exit 2; }
  tar xJf .llama/src.tar.xz -C .llama
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
