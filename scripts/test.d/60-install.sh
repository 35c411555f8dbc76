#!/usr/bin/env bash
# The installed package, used the way each ecosystem expects, from a folder
# outside the repository:
#   - cmake --install --strip to a prefix: no debug info left in the
#     libraries and vmmw, symbols kept; file modes (shared library and vmmw 0755,
#     headers 0644); the testing header is not installed;
#   - the installed `vmmw` command on PATH inspects a checkpoint;
#   - a C program (shared) and a C++ program (static) built with
#     find_package(vmmweights) against the prefix load it and run;
#   - a Go program importing github.com/vmmweights/vmmweights/bindings/go/vmmw
#     builds with only PKG_CONFIG_PATH set (plus a go.mod replace to the local
#     module, since nothing is published) and runs without LD_LIBRARY_PATH;
#   - a parent project using add_subdirectory() links vmmweights::vmmweights
#     and installs none of vmmweights' files.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
source scripts/lib-env.sh
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
version=$(sed -n 's/^#define VMMW_VERSION_STRING "\(.*\)"/\1/p' include/vmmweights.h)

echo "--- cmake --install --strip to $out/prefix"
cmake -S . -B "$out/build" "${gen[@]}" -DVMMW_CARGO_PROFILE=dev >/dev/null
cmake --build "$out/build" >/dev/null
cmake --install "$out/build" --prefix "$out/prefix" --strip >/dev/null
prefix="$out/prefix"
for f in "lib/libvmmweights.so.$version" lib/libvmmweights.a bin/vmmw; do
  sections=$(readelf -S "$prefix/$f")
  if grep -q '\.debug_info' <<<"$sections"; then
    echo "$f keeps debug info after cmake --install --strip" >&2; exit 1
  fi
done
symbols=$(nm -D --defined-only "$prefix/lib/libvmmweights.so.$version")
grep -q ' vmmw_pool_new$' <<<"$symbols" || { echo "the stripped library lost vmmw_pool_new" >&2; exit 1; }
pc_libs=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --libs vmmweights)
[[ "$pc_libs" == *"-Wl,-rpath,$prefix/lib"* && "$pc_libs" != *"/.."* && "$pc_libs" != *"//"* ]] \
  || { echo "pkg-config --libs says '$pc_libs', want plain paths under $prefix" >&2; exit 1; }
mode() { stat -c %a "$1"; }
[[ $(mode "$prefix/lib/libvmmweights.so.$version") == 755 ]] || { echo "shared library mode $(mode "$prefix/lib/libvmmweights.so.$version"), want 755" >&2; exit 1; }
[[ $(mode "$prefix/bin/vmmw") == 755 ]] || { echo "vmmw mode $(mode "$prefix/bin/vmmw"), want 755" >&2; exit 1; }
for f in include/vmmweights.h include/vmmweights.hpp lib/libvmmweights.a lib/pkgconfig/vmmweights.pc; do
  [[ $(mode "$prefix/$f") == 644 ]] || { echo "$f mode $(mode "$prefix/$f"), want 644" >&2; exit 1; }
done
if find "$prefix" -name 'vmmweights_testing.h' | grep -q .; then
  echo "the testing header was installed" >&2; exit 1
fi

# A clean environment: only what a user of the prefix would set.
run_clean() { env -i HOME="$HOME" PATH="$prefix/bin:/usr/local/go/bin:/usr/local/bin:/usr/bin:/bin" \
  GOCACHE="${GOCACHE:-$(go env GOCACHE)}" GOMODCACHE="$(go env GOMODCACHE)" GOFLAGS=-mod=mod \
  GOTOOLCHAIN=local VMMW_BACKEND=host "$@"; }

echo "--- a checkpoint, inspected by the installed vmmw"
ckpt="$out/model.safetensors"
python3 - "$ckpt" <<'PY'
import json, struct, sys
n = 3000
hdr = json.dumps({"embed.weight": {"dtype": "F32", "shape": [n // 256 + 1, 256],
                  "data_offsets": [0, (n // 256 + 1) * 256 * 4]}}).encode()
hdr += b" " * (-len(hdr) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(hdr)) + hdr)
    f.write(b"".join(struct.pack("<f", i * 0.5) for i in range((n // 256 + 1) * 256)))
PY
# (captured, not piped into grep -q: an early exit would SIGPIPE the command)
said=$(run_clean vmmw --version)
[[ "$said" == "vmmw $version" ]] || { echo "installed vmmw --version says '$said', want 'vmmw $version'" >&2; exit 1; }
said=$(run_clean vmmw inspect --tensors "$ckpt")
grep -q "embed.weight" <<<"$said" || { echo "vmmw inspect did not list embed.weight: $said" >&2; exit 1; }

echo "--- C and C++ consumers: find_package(vmmweights) against the prefix"
mkdir "$out/consumer"
cp tests/install/CMakeLists.txt "$out/consumer/"
cp examples/c/main.c "$out/consumer/main.c"
cp examples/cpp/main.cpp "$out/consumer/main.cpp"
said=$(run_clean cmake -S "$out/consumer" -B "$out/consumer/build" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix")
grep "vmmweights " <<<"$said"
run_clean cmake --build "$out/consumer/build" >/dev/null
said=$(run_clean "$out/consumer/build/consumer_c" "$ckpt") && tail -n 2 <<<"$said"
said=$(run_clean "$out/consumer/build/consumer_cpp" --mib 4) && tail -n 2 <<<"$said"

echo "--- pkg-config --static: Libs.private is enough to link libvmmweights.a"
pc_static=$(run_clean PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --static --cflags --libs vmmweights)
# shellcheck disable=SC2086 # word splitting of the flags is intended
run_clean gcc -std=c11 examples/c/main.c "$prefix/lib/libvmmweights.a" ${pc_static//-lvmmweights/} \
  -o "$out/consumer/static_c"
if readelf -d "$out/consumer/static_c" | grep -q 'libvmmweights.so'; then
  echo "static_c links libvmmweights.so, not the static library" >&2; exit 1
fi
said=$(run_clean "$out/consumer/static_c" "$ckpt") && tail -n 1 <<<"$said"

echo "--- Go consumer: the module by its path, the library through PKG_CONFIG_PATH only"
mkdir "$out/go"
cp tests/install/go/main.go "$out/go/"
sed "s|@VMMW_GO_MODULE@|$repo/bindings/go|" tests/install/go/go.mod.in >"$out/go/go.mod"
(cd "$out/go" && run_clean PKG_CONFIG_PATH="$prefix/lib/pkgconfig" CGO_ENABLED=1 go build -o install-check .)
run_clean "$out/go/install-check" "$ckpt"

echo "--- add_subdirectory(): the same targets, no install rules"
mkdir "$out/subdir"
cp tests/install/subdir/CMakeLists.txt "$out/subdir/"
cp examples/c/main.c "$out/subdir/main.c"
cmake -S "$out/subdir" -B "$out/subdir/build" "${gen[@]}" -DVMMW_SOURCE_DIR="$repo" \
  -DVMMW_CARGO_PROFILE=dev >/dev/null
cmake --build "$out/subdir/build" >/dev/null
"$out/subdir/build/subdir_c" "$ckpt" >/dev/null
"$out/subdir/build/subdir_c_static" "$ckpt" >/dev/null
cmake --install "$out/subdir/build" --prefix "$out/subdir-prefix" >/dev/null
installed=$(cd "$out/subdir-prefix" && find . -type f -o -type l | sort | tr '\n' ' ')
[[ "$installed" == "./bin/subdir_c " ]] || { echo "add_subdirectory parent installed: $installed" >&2; exit 1; }
echo "install check: prefix, vmmw, C, C++, Go and add_subdirectory consumers all ran"
