#!/usr/bin/env bash
# Header drift test: regenerates the header into a temp file and fails, showing
# the diff, when it differs from the committed include/vmmweights.h.
set -euo pipefail
cd "$(dirname "$0")/.."
fresh=$(mktemp --suffix=.h)
trap 'rm -f "$fresh"' EXIT
bash scripts/gen-header.sh "$fresh"
if ! diff -u include/vmmweights.h "$fresh"; then
  echo "include/vmmweights.h drifted from src/ffi: run scripts/gen-header.sh and commit it" >&2
  exit 1
fi
echo "header drift check: include/vmmweights.h matches src/ffi"
