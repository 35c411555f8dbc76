#!/usr/bin/env bash
# Soak of `vmmw serve` (host backend, loopback only, bounded in time):
# importers cycling, slow importers, junk clients and SIGHUP reloads; checks
# the server's descriptors, threads and RSS stay flat, every importer reads the
# current bytes or gets a revoke, and the server's CPU is idle between events.
# SOAK_SECONDS (default 600), SOAK_IMPORTERS (default 16), SOAK_OUT (JSON file).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --bin vmmw
exec python3 scripts/soak-serve.py target/debug/vmmw \
  --seconds "${SOAK_SECONDS:-600}" --importers "${SOAK_IMPORTERS:-16}" \
  ${SOAK_OUT:+--out "$SOAK_OUT"}
