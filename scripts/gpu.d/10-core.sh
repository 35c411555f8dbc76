#!/usr/bin/env bash
# Core (issue #2): the segment tests on the cuda backend, the demo, then bench-alloc.
# Writes core-tests.txt and alloc-bench.{txt,json} to $VMMW_GPU_OUT.
set -uo pipefail
source scripts/gpu-lib.sh
rc=0

log="$VMMW_GPU_OUT/core-tests.txt"
VMMW_BACKEND=cuda .gpu/tests/all segment:: --nocapture --test-threads=4 >"$log" 2>&1
t=$?
cat "$log"
summary=$(grep -E '^test result:' "$log" | tail -1)
skips=$(grep -c '^SKIP cuda' "$log")
if [ "$t" -eq 0 ]; then
  result "core: segment tests, cuda" PASS "${summary#test result: }; $skips cuda skips (host-only checks)"
else
  result "core: segment tests, cuda" FAIL "exit $t; ${summary:-no summary}; see core-tests.txt"
  rc=1
fi

if .gpu/vmmw demo --backend cuda; then
  result "core: vmmw demo --backend cuda" PASS "allocate, verify, unmap/map, free"
else
  result "core: vmmw demo --backend cuda" FAIL "see the log above"
  rc=1
fi

bench="$VMMW_GPU_OUT/alloc-bench"
.gpu/vmmw bench-alloc --backend cuda --iters 20 --json "$bench.json" 2>&1 | tee "$bench.txt"
t=${PIPESTATUS[0]}
if [ "$t" -eq 0 ]; then
  line=$(grep -E '^\| 4 GiB \| segment, 1 chunk' "$bench.txt" | awk -F'|' '{print $7 "us, " $8}')
  result "core: bench-alloc" PASS "4 GiB segment alloc+free median${line:+:$line} vs cuMemAlloc"
else
  result "core: bench-alloc" FAIL "exit $t"
  rc=1
fi
exit $rc
