#!/usr/bin/env bash
# Runs every test (Rust, C, C++, Go, Python) after installing what a fresh
# machine lacks (scripts/test.d/00-setup.sh). Each part lives in
# scripts/test.d/NN-name.sh and runs in order; the first failure stops the run.
# The summary at the end lists every part with its time and PASS, or SKIP
# with each reason a part gave (a line `SKIP what: why` in its output; the
# cuda halves of backend-parametric tests, `SKIP cuda: ...`, as one count).
# How long each part takes is in the README's table, the one place those
# times are written.
#
# VMMW_QUICK=1 is the quick mode (README says what it skips): the Rust
# integration tests, the second clippy pass, the MSRV toolchain build, fuzzing
# and Miri. Everything else (C, C++, Go, Python, ABI, install) runs as in full.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
if [ "${VMMW_QUICK:-0}" = 1 ]; then
  export VMMW_FUZZ_SECONDS=0 VMMW_MIRI=0
  echo "=== quick mode (VMMW_QUICK=1); the README's table gives each part's time"
else
  echo "=== full run; the README's table gives each part's time (VMMW_QUICK=1 for the quick mode)"
fi
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
summary=()
start=$SECONDS
report() {  # $1: the last part's status, when it failed
  echo
  echo "=== summary (load average now: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?'))"
  for line in "${summary[@]}"; do echo "$line"; done
  [ -n "${1:-}" ] && echo "$1"
  echo "=== total: $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"
}
for part in scripts/test.d/*.sh; do
  name=${part#scripts/test.d/}
  echo "=== $name"
  t0=$SECONDS
  set +e
  bash "$part" 2>&1 | tee "$logs/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  took=$((SECONDS - t0))
  if [ "$rc" != 0 ]; then
    report "$(printf '%-18s %4d s  FAIL (exit %d)' "$name" "$took" "$rc")"
    exit "$rc"
  fi
  echo "=== $name: $took s"
  # Backend-parametric Rust tests print `SKIP cuda: NAME: why` for their
  # cuda half without a GPU (scripts/gpu.d runs it there): one line for all.
  skips=$(sed -n 's/^SKIP \(.*\)$/\1/p' "$logs/$name.log" | { grep -v '^cuda: ' || true; } | sort -u)
  cuda=$(grep -c '^SKIP cuda: ' "$logs/$name.log" || true)
  if [ "$cuda" -gt 0 ]; then
    skips=$(printf '%s\n%s' "cuda halves of $cuda backend-parametric tests: no CUDA here (scripts/gpu-check.sh runs them on a GPU)" "$skips" | sed '/^$/d')
  fi
  if [ -z "$skips" ]; then
    summary+=("$(printf '%-18s %4d s  PASS' "$name" "$took")")
  else
    first=1
    while IFS= read -r s; do
      if [ $first = 1 ]; then
        summary+=("$(printf '%-18s %4d s  SKIP %s' "$name" "$took" "$s")")
        first=0
      else
        summary+=("$(printf '%-18s %6s  SKIP %s' "" "" "$s")")
      fi
    done <<<"$skips"
  fi
done
report
echo "=== all test parts passed"
