#!/usr/bin/env bash
# Fetches llama.cpp's source from a registry this machine reaches: the
# llama-cpp-python source distribution on PyPI vendors the whole of llama.cpp
# (server included). The version and its sha256 are pinned here; the archive is
# checked, then vendor/llama.cpp is extracted into .llama/src (git-ignored,
# never committed), without what a server build does not need (models but the
# one vocabulary the benchmark models borrow, docs, tests, the web UI's
# sources), so the tree can travel to the GPU machine (about 12 MB).
#   bash scripts/llama/fetch.sh            # into .llama/src, and packed as .llama/src.tar.xz
#   LLAMA_DEST=/path bash scripts/llama/fetch.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
version=0.3.36
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
dest=${LLAMA_DEST:-.llama/src}
archive=.llama/llama_cpp_python-$version.tar.gz

mkdir -p .llama
if [ ! -f "$archive" ] || ! echo "$sha256  $archive" | sha256sum -c --quiet - 2>/dev/null; then
  rm -f "$archive"
  echo "fetch: llama-cpp-python $version (source distribution) from PyPI"
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
    "llama-cpp-python==$version" -d "$tmp" >/dev/null 2>&1 \
    || python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$tmp"
  mv "$tmp/llama_cpp_python-$version.tar.gz" "$archive"
  rm -rf "$tmp"
fi
echo "$sha256  $archive" | sha256sum -c --quiet - || {
  echo "fetch: $archive does not have the pinned sha256 $sha256; refusing to use it" >&2
  exit 1
}

rm -rf "$dest"
mkdir -p "$dest"
tar xzf "$archive" -C "$dest" --strip-components=3 "llama_cpp_python-$version/vendor/llama.cpp"
# What a CUDA build of llama-server does not read. tools/ui keeps its
# CMake files and templates: the server links a UI library generated from
# them, empty here (no web UI is downloaded or built).
(
  cd "$dest"
  find models -mindepth 1 ! -name ggml-vocab-qwen2.gguf -delete
  rm -rf docs tests media benches pocs examples .devops .github
  for b in cann et hexagon hip metal musa opencl openvino sycl virtgpu vulkan webgpu zdnn zendnn; do
    rm -rf "ggml/src/ggml-$b"
  done
  find tools/ui -mindepth 1 ! -name CMakeLists.txt ! -name "*.in" ! -name sources.cmake -prune -exec rm -rf {} +
  mkdir -p tests examples pocs && touch tests/CMakeLists.txt examples/CMakeLists.txt pocs/CMakeLists.txt
)
echo "$version $sha256" >"$dest/VMMW_SOURCE"
# The same tree packed, for the GPU machine: the run tool carries at most 64 MiB.
tar cJf .llama/src.tar.xz -C "$(dirname "$dest")" "$(basename "$dest")"
echo "fetch: llama.cpp from llama-cpp-python $version in $dest ($(du -sh "$dest" | cut -f1))"
