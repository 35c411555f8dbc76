#!/usr/bin/env bash
# Header drift test: regenerates the headers into temp files and fails,
# showing the diff, when either differs from the committed one.
set -euo pipefail
cd "$(dirname "$0")/.."
fresh=$(mktemp -d)
trap 'rm -rf "$fresh"' EXIT
bash scripts/gen-header.sh "$fresh/vmmweights.h" "$fresh/vmmweights_testing.h" "$fresh/vmmw_preload.h"
status=0
for h in vmmweights.h vmmweights_testing.h vmmw_preload.h; do
  if ! diff -u "include/$h" "$fresh/$h"; then
    echo "include/$h drifted from src/ffi: run scripts/gen-header.sh and commit it" >&2
    status=1
  fi
done
[[ $status == 0 ]] && echo "header drift check: include/vmmweights.h, include/vmmweights_testing.h and include/vmmw_preload.h match their sources"
exit $status
