#!/usr/bin/env bash
# Destination identity on the GPU: builds tests/c/test_identity.c here with
# gcc against the bundled .gpu/libvmmweights.so and runs it with its pools on
# the cuda backend (a destination freed and handed to a new owner at the same
# address refused with VMMW_UNKNOWN_POINTER, the new owner's bytes intact,
# also after a Reload wake and, with two devices, by a multi-device load; a
# 2^56-byte arena as VMMW_OUT_OF_MEMORY). Writes identity.txt to $VMMW_GPU_OUT.
set -uo pipefail
source scripts/gpu-lib.sh
lib="$PWD/.gpu/libvmmweights.so"
if ! command -v gcc >/dev/null; then
  result "identity: C destination identity, cuda" SKIP "no gcc on this machine"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
soname=$(readelf -d "$lib" 2>/dev/null | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
ln -s "$lib" "$work/libvmmweights.so"
[ -n "$soname" ] && ln -s "$lib" "$work/$soname"
if ! gcc -std=c11 -O1 -g -Wall -Wextra -Werror -Iinclude tests/c/test_identity.c \
     -o "$work/test_identity" -L"$work" -lvmmweights -Wl,-rpath,"$work"; then
  result "identity: C destination identity, cuda" FAIL "tests/c/test_identity.c did not compile against the bundle"
  exit 1
fi
log="$VMMW_GPU_OUT/identity.txt"
VMMW_IDENTITY_BACKEND=cuda timeout 300 "$work/test_identity" >"$log" 2>&1
rc=$?
tail -5 "$log"
if [ "$rc" -eq 0 ]; then
  result "identity: C destination identity, cuda" PASS "$(grep -E 'SKIP|checks passed' "$log" | tr '\n' ' ')"
else
  result "identity: C destination identity, cuda" FAIL "exit $rc; see identity.txt"
fi
exit $rc
