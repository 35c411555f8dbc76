#!/usr/bin/env bash
# Builds, here, everything the GPU machine runs (it has no Rust toolchain) and
# copies it into .gpu/ (git-ignored), which the `run` tool carries:
#   .gpu/vmmw                     the command line
#   .gpu/libvmmw_preload.so       the CUDA runtime interposer (scripts/gpu.d/88-preload.sh;
#                                 its test program is built there from tests/preload)
#   .gpu/libvmmweights.so         the cdylib (for C/C++/Go/PyTorch checks; the
#                                 Python package runs from the tree's python/
#                                 with VMMW_LIB pointing here: the GPU machine
#                                 has neither maturin nor a network)
#   .gpu/tests/<target>           every test executable (integration tests by
#                                 name: `all` holds most as modules, so
#                                 `.gpu/tests/all segment::` runs one; the
#                                 library's unit tests as `lib`, the command
#                                 line's as `bin-vmmw`)
#   .gpu/go-swap                  the Go model-swapping service (examples/go-swap),
#                                 cgo-linked to the cdylib under its SONAME (the
#                                 GPU machine has no Go toolchain); left out, with
#                                 a note, where this machine has no `go`
#   .gpu/MANIFEST                 commit, build time, file list
# Debug info is stripped from the copies to keep the carried tree small;
# symbols stay, so backtraces still name functions.
# The run tool carries at most 64 MiB with the working tree, so the bundle also
# travels packed: .gpu-pack/gpu.tar.gz (carry ".gpu-pack", then on the GPU
# machine: tar xzf .gpu-pack/gpu.tar.gz && bash scripts/gpu-check.sh).
# Then on the GPU machine, from the repo root: bash scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

bash scripts/build-clib.sh --release
cargo build --release --features cli --bins
# The interposer, over the same vmmweights build as the command line.
cargo build --release -p vmmweights -p vmmw-preload --features vmmweights/cli --lib
json=$(cargo test --release --features cli --no-run --message-format=json)

rm -rf .gpu
mkdir -p .gpu/tests
cp target/release/vmmw target/release/libvmmweights.so target/release/libvmmw_preload.so .gpu/

# One executable per test target; the JSON names each and where it was built.
echo "$json" | python3 -c '
import json, sys
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    if not m.get("profile", {}).get("test"):
        continue
    t = m["target"]
    kinds = t["kind"]
    name = "lib" if "lib" in kinds or "cdylib" in kinds else t["name"]
    if "bin" in kinds:
        name = "bin-" + t["name"]
    print(name + "\t" + m["executable"])
' | while IFS=$'\t' read -r name exe; do
  cp "$exe" ".gpu/tests/$name"
done

# The Go service, linked as a user links it: pkg-config names the release
# library and the repository's header. At run time it needs libvmmweights
# under its SONAME on the library path (scripts/gpu.d/80-swap.sh arranges it).
if command -v go >/dev/null; then
  pc=$(mktemp -d)
  cat >"$pc/vmmweights.pc" <<PC
Name: vmmweights
Description: vmmweights from the source tree (release)
Version: $(sed -n 's/^#define VMMW_VERSION_STRING "\(.*\)"/\1/p' include/vmmweights.h)
Libs: -L$PWD/target/release -lvmmweights
Cflags: -I$PWD/include
PC
  (cd examples/go-swap && CGO_ENABLED=1 PKG_CONFIG_PATH="$pc" go build -trimpath -ldflags="-s -w" -o ../../.gpu/go-swap .)
  rm -rf "$pc"
else
  echo "note: no go on this machine: the bundle has no go-swap (scripts/gpu.d/80-swap.sh will skip)" >&2
fi

strip --strip-debug .gpu/vmmw .gpu/libvmmweights.so .gpu/libvmmw_preload.so .gpu/tests/*
{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(rustc --version)"
  (cd .gpu && find . -type f ! -name MANIFEST | sort | xargs ls -l | awk '{print $5, $9}')
} > .gpu/MANIFEST
cat .gpu/MANIFEST
echo "bundle: $(du -sh .gpu | cut -f1) in .gpu/"
rm -rf .gpu-pack
mkdir -p .gpu-pack
tar czf .gpu-pack/gpu.tar.gz .gpu
echo "packed: $(du -sh .gpu-pack/gpu.tar.gz | cut -f1) in .gpu-pack/ (carry it; unpack with tar xzf .gpu-pack/gpu.tar.gz)"
