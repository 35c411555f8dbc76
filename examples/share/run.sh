#!/usr/bin/env bash
# Two processes, one copy of the weights: build examples/share/share.c, write
# a small checkpoint, serve it from one process, attach from another, and
# check both see the same bytes. Usage: bash examples/share/run.sh
# (from the repository root; builds the library first).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib-env.sh
dir=$(mktemp -d)
owner=
cleanup() {
  exec 3>&- 2>/dev/null || true
  [ -n "$owner" ] && wait "$owner" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
gcc -std=c11 -Wall -Wextra -Werror -Iinclude examples/share/share.c -o "$dir/share" \
  -L"$VMMW_LIB_DIR" -lvmmweights -Wl,-rpath,"$VMMW_LIB_DIR"
python3 - "$dir/model.safetensors" <<'PY'
import json, struct, sys
tensors = {"embed.weight": (64, 32), "layer.0.weight": (32, 32), "norm.weight": (32,)}
header, blobs, off = {}, [], 0
for i, (name, shape) in enumerate(tensors.items()):
    n = 1
    for d in shape:
        n *= d
    data = struct.pack(f"<{n}f", *[(i + 1) * 0.5 + k * 0.001 for k in range(n)])
    header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(data)]}
    blobs.append(data)
    off += len(data)
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
mkfifo "$dir/ctl"
"$dir/share" serve "$dir/model.safetensors" "$dir/w.sock" <"$dir/ctl" >"$dir/owner.txt" &
owner=$!
exec 3>"$dir/ctl"
for _ in $(seq 200); do grep -q '^serving' "$dir/owner.txt" && break; sleep 0.05; done
cat "$dir/owner.txt"
"$dir/share" attach "$dir/w.sock" | tee "$dir/importer.txt"
# The same from Python (the vmmweights package, ctypes), hashing in the same order.
VMMW_LIB="$VMMW_LIB_DIR/libvmmweights.so" PYTHONPATH=python python3 - "$dir/w.sock" <<'PY' | tee "$dir/python.txt"
import sys
from vmmweights import share
with share.attach(sys.argv[1]) as s:
    h = 0xcbf29ce484222325
    for name in s.names():
        for b in name.encode() + s.read(name):
            h = ((h ^ b) * 0x100000001b3) % (1 << 64)
    print(f"python attached {len(s.names())} tensors, version {s.version} sum={h:016x}")
PY
exec 3>&-
wait "$owner"
owner=
a=$(sed -n 's/.*sum=\([0-9a-f]*\).*/\1/p' "$dir/owner.txt")
b=$(sed -n 's/.*sum=\([0-9a-f]*\).*/\1/p' "$dir/importer.txt")
c=$(sed -n 's/.*sum=\([0-9a-f]*\).*/\1/p' "$dir/python.txt")
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] ||
  { echo "checksums differ: owner $a, importer $b, python $c" >&2; exit 1; }
echo "share example: owner, C importer and Python importer read the same bytes ($a)"
