#!/usr/bin/env bash
# Module layers: no import circles in src/, nothing imports a higher layer, only
# src/driver/ uses cudarc (order and rules: docs/ARCHITECTURE.md). The self-test
# first shows each rule failing on a tree that breaks it.
set -euo pipefail
python3 scripts/check-layers.py --self-test
python3 scripts/check-layers.py
