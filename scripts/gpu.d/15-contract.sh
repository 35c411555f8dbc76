#!/usr/bin/env bash
# The driver contract suite (tests/all/driver_contract.rs) on the cuda backend:
# every method of the Driver trait with the arguments its callers use, each
# checked by its bytes. A clause that cannot run here (one GPU: no peer
# copies) prints `SKIP cuda:` and gets a SKIP row of its own; the suite's row
# says how many clauses ran on cuda (`RAN cuda:` lines), so a skip never
# reads as a pass. Writes contract-tests.txt to $VMMW_GPU_OUT.
set -uo pipefail
source scripts/gpu-lib.sh
log="$VMMW_GPU_OUT/contract-tests.txt"
VMMW_BACKEND=cuda .gpu/tests/all driver_contract:: --nocapture --test-threads=4 >"$log" 2>&1
t=$?
cat "$log"
total=$(.gpu/tests/all driver_contract:: --list 2>/dev/null | grep -c ': test$')
ran=$(grep -c '^RAN cuda: ' "$log")
summary=$(grep -E '^test result:' "$log" | tail -1)
while IFS= read -r line; do
  result "contract: ${line#SKIP cuda: }" SKIP "did not run on cuda"
done < <(grep '^SKIP cuda: ' "$log" | sort -u)
if [ "$t" -ne 0 ]; then
  failed=$(grep -E '^test .* FAILED$' "$log" | sed 's/^test \(.*\) \.\.\. FAILED$/\1/' | tr '\n' ' ')
  result "contract: driver suite, cuda" FAIL "exit $t; ${summary:-no summary}; failed: ${failed:-see contract-tests.txt}"
  exit 1
fi
if [ "$ran" -eq 0 ]; then
  result "contract: driver suite, cuda" FAIL "no clause ran on cuda (0 of $total); see contract-tests.txt"
  exit 1
fi
result "contract: driver suite, cuda" PASS "$ran of $total clauses ran on cuda and passed, $((total - ran)) skipped (rows above); ${summary#test result: }"
