#!/usr/bin/env bash
# C++ on the GPU (issue #6): builds examples/cpp/main.cpp here with g++ against
# the bundled .gpu/libvmmweights.so and the repo's headers (the C header and
# the C++ wrapper), then runs it on the cuda backend: write a checkpoint
# (CPP_MIB MiB, default 4096), load it into the pool, checksum every tensor,
# sleep (offload weights, discard kv), wake, verify, sleep with reload, wake,
# verify. Writes cpp-roundtrip.{txt,json} to $VMMW_GPU_OUT.
set -uo pipefail
source scripts/gpu-lib.sh
lib="$PWD/.gpu/libvmmweights.so"
if ! command -v g++ >/dev/null; then
  result "cpp: gpu roundtrip" SKIP "no g++ on this machine"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Link against the bundled library under its SONAME, as an installed copy would be.
soname=$(readelf -d "$lib" 2>/dev/null | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
ln -s "$lib" "$work/libvmmweights.so"
[ -n "$soname" ] && ln -s "$lib" "$work/$soname"
if ! g++ -std=c++17 -O2 -Wall -Wextra -Werror -Iinclude -Ibindings/cpp/include \
     examples/cpp/main.cpp -o "$work/gpu_roundtrip" -L"$work" -lvmmweights -Wl,-rpath,"$work"; then
  result "cpp: gpu roundtrip" FAIL "examples/cpp/main.cpp did not compile against the bundle"
  exit 1
fi
txt="$VMMW_GPU_OUT/cpp-roundtrip.txt"
json="$VMMW_GPU_OUT/cpp-roundtrip.json"
VMMW_BACKEND=cuda "$work/gpu_roundtrip" --mib "${CPP_MIB:-4096}" --tensors 32 --require-cuda --json "$json" 2>&1 | tee "$txt"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 0 ]; then
  detail=$(python3 - "$json" <<'PY' 2>/dev/null
import json, sys
j = json.load(open(sys.argv[1]))
print(f"{j['bytes']/2**30:.1f} GiB: load {j['load_gbps']:.1f} GB/s; offload sleep {j['sleep_offload_s']:.3f} s, "
      f"wake {j['wake_offload_s']:.3f} s; reload sleep {j['sleep_reload_s']:.3f} s, wake {j['wake_reload_s']:.3f} s; checksums match")
PY
)
  result "cpp: gpu roundtrip" PASS "${detail:-checksums match after load, offload and reload cycles}"
else
  result "cpp: gpu roundtrip" FAIL "exit $rc; see cpp-roundtrip.txt"
fi
exit "$rc"
