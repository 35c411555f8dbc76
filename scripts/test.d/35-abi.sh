#!/usr/bin/env bash
# ABI check (docs/ABI.md): the exported symbols and the header's declarations
# against the committed baseline in abi/. First a self-test: the check must
# fail on a baseline that has a symbol this build lacks and a struct whose
# layout differs, and on one that lacks a function this build has (the
# baseline is kept current: an addition is recorded when it is made), so it
# cannot pass vacuously.
set -euo pipefail
cd "$(dirname "$0")/../.."
fake=$(mktemp -d)
trap 'rm -rf "$fake"' EXIT
cp abi/vmmweights.symbols abi/vmmweights.decls "$fake/"
echo "vmmw_retired_function" >>"$fake/vmmweights.symbols"
sort -o "$fake/vmmweights.symbols" "$fake/vmmweights.symbols"
sed -i 's/uint32_t tags;}vmmw_report_t;/uint64_t tags;}vmmw_report_t;/' "$fake/vmmweights.decls"
if VMMW_ABI_DIR="$fake" bash scripts/check-abi.sh >"$fake/log" 2>&1; then
  cat "$fake/log"; echo "ABI self-test: the check passed a baseline it must reject" >&2; exit 1
fi
grep -q "vmmw_retired_function" "$fake/log" && grep -q "uint64_t tags" "$fake/log" \
  || { cat "$fake/log"; echo "ABI self-test: the failure does not name both breaks" >&2; exit 1; }
echo "ABI self-test: a removed symbol and a changed struct are caught"
# An addition the baseline does not record fails too (the baseline is kept current).
cp abi/vmmweights.symbols abi/vmmweights.decls "$fake/"
sed -i '/^vmmw_version_string$/d' "$fake/vmmweights.symbols"
if VMMW_ABI_DIR="$fake" bash scripts/check-abi.sh >"$fake/log" 2>&1; then
  cat "$fake/log"; echo "ABI self-test: an unrecorded addition passed" >&2; exit 1
fi
grep -q "+ vmmw_version_string" "$fake/log" \
  || { cat "$fake/log"; echo "ABI self-test: the failure does not name the addition" >&2; exit 1; }
echo "ABI self-test: an unrecorded addition is caught"
bash scripts/check-abi.sh
