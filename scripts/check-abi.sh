#!/usr/bin/env bash
# ABI check: compares what this build exports and declares with the committed
# baseline in abi/ (docs/ABI.md says what the baseline promises).
#   abi/vmmweights.symbols  vmmw_* functions exported by libvmmweights.so (nm -D)
#   abi/vmmweights.decls    declarations of include/vmmweights.h (scripts/abi-decls.py)
# Fails when a symbol or declaration of the baseline is gone or changed (a
# changed prototype, struct layout or constant shows as one line removed and
# one added), when the library and the header disagree, or when an opaque
# handle type vmmw_X_t has no vmmw_X_free, and when an addition is not yet
# recorded, so the baseline always is this tree's ABI. Symbols declared only
# in include/vmmweights_testing.h are not part of the ABI and are left out.
# Usage: scripts/check-abi.sh [--update]   (--update rewrites the baseline, on purpose)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib-env.sh
lib="$VMMW_LIB_DIR/libvmmweights.so"
abi="${VMMW_ABI_DIR:-abi}"  # the baseline folder (the self-test in 35-abi.sh points it elsewhere)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 scripts/abi-decls.py include/vmmweights.h >"$tmp/decls"
python3 scripts/abi-decls.py include/vmmweights_testing.h >"$tmp/testing-decls"
fn_names() { grep -o 'vmmw_[a-z0-9_]*(' "$1" | tr -d '(' | sort -u; }
fn_names "$tmp/decls" >"$tmp/declared"
fn_names "$tmp/testing-decls" >"$tmp/testing"
nm -D --defined-only "$lib" | awk '$2 == "T" && $3 ~ /^vmmw_/ {print $3}' | sort -u >"$tmp/exported"
comm -23 "$tmp/exported" "$tmp/testing" >"$tmp/symbols"

status=0
# The library and its header agree.
if undeclared=$(comm -23 "$tmp/symbols" "$tmp/declared") && [[ -n "$undeclared" ]]; then
  echo "exported by $lib but declared in no header:" >&2; echo "$undeclared" | sed 's/^/  /' >&2; status=1
fi
if missing=$(comm -13 "$tmp/exported" <(sort -u "$tmp/declared" "$tmp/testing")) && [[ -n "$missing" ]]; then
  echo "declared in a header but not exported by $lib:" >&2; echo "$missing" | sed 's/^/  /' >&2; status=1
fi

# Every opaque handle type vmmw_X_t has its destructor vmmw_X_free.
for t in $(sed -n 's/^typedef struct \(vmmw_[a-z0-9_]*\)_t vmmw_[a-z0-9_]*_t;$/\1/p' "$tmp/decls"); do
  grep -q "^void ${t}_free(" "$tmp/decls" || { echo "handle ${t}_t has no ${t}_free" >&2; status=1; }
done

if [[ "${1:-}" == "--update" ]]; then
  [[ $status == 0 ]] || { echo "not updating abi/: fix the header/library mismatch first" >&2; exit 1; }
  cp "$tmp/symbols" "$abi/vmmweights.symbols"
  cp "$tmp/decls" "$abi/vmmweights.decls"
  echo "abi/ updated: commit it, and say in CHANGELOG.md what changed and why"
  exit 0
fi

for kind in symbols decls; do
  base="$abi/vmmweights.$kind"
  gone=$(comm -23 "$base" "$tmp/$kind")
  added=$(comm -13 "$base" "$tmp/$kind")
  if [[ -n "$gone" ]]; then
    echo "ABI break: these $kind of $base are gone or changed:" >&2
    echo "$gone" | sed 's/^/  - /' >&2
    [[ -z "$added" ]] || { echo "  now:" >&2; echo "$added" | sed 's/^/  + /' >&2; }
    status=1
  elif [[ -n "$added" ]]; then
    echo "ABI additions ($kind) not recorded in $base (compatible; record them with" >&2
    echo "scripts/check-abi.sh --update and a CHANGELOG.md line naming them):" >&2
    echo "$added" | sed 's/^/  + /' >&2
    status=1
  fi
done
if [[ $status != 0 ]]; then
  echo "If the change is intended (before 1.0, or a new major version), run" >&2
  echo "scripts/check-abi.sh --update, commit abi/, and record it in CHANGELOG.md (docs/ABI.md)." >&2
  exit 1
fi
echo "ABI check: $(wc -l <"$tmp/symbols") symbols and $(wc -l <"$tmp/decls") declarations match abi/"
