#!/usr/bin/env bash
# C API misuse (issue 18) on the GPU: builds tests/c/test_misuse.c here with
# gcc against the bundled .gpu/libvmmweights.so and runs it with its pools on
# the cuda backend (huge sizes as OUT_OF_MEMORY against the real device size,
# option limits, destinations checked against the pool, sleep/wake storm,
# loader misuse, cancel from another thread). Writes misuse.txt to $VMMW_GPU_OUT.
set -uo pipefail
source scripts/gpu-lib.sh
lib="$PWD/.gpu/libvmmweights.so"
if ! command -v gcc >/dev/null; then
  result "misuse: C misuse suite, cuda" SKIP "no gcc on this machine"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
soname=$(readelf -d "$lib" 2>/dev/null | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
ln -s "$lib" "$work/libvmmweights.so"
[ -n "$soname" ] && ln -s "$lib" "$work/$soname"
if ! gcc -std=c11 -O1 -g -Wall -Wextra -Werror -Iinclude tests/c/test_misuse.c \
     -o "$work/test_misuse" -L"$work" -lvmmweights -Wl,-rpath,"$work"; then
  result "misuse: C misuse suite, cuda" FAIL "tests/c/test_misuse.c did not compile against the bundle"
  exit 1
fi
log="$VMMW_GPU_OUT/misuse.txt"
VMMW_MISUSE_BACKEND=cuda timeout 600 "$work/test_misuse" >"$log" 2>&1
rc=$?
tail -5 "$log"
if [ "$rc" -eq 0 ]; then
  result "misuse: C misuse suite, cuda" PASS "$(grep -E 'checks passed' "$log" | tail -1)"
else
  result "misuse: C misuse suite, cuda" FAIL "exit $rc; see misuse.txt"
fi
exit $rc
