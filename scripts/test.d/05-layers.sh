#!/usr/bin/env bash
# Module layers: no import circles in src/, nothing imports a higher layer, only
# src/driver/ uses cudarc (order and rules: docs/ARCHITECTURE.md).
set -euo pipefail
python3 scripts/check-layers.py
