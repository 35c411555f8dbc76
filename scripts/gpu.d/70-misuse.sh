#!/usr/bin/env bash
# C API misuse on the GPU: builds tests/c/test_misuse.c here with
# gcc against the bundled .gpu/libvmmweights.so and runs it with its pools on
# the cuda backend (huge sizes as OUT_OF_MEMORY against the real device size,
# option limits, destinations checked against the pool, sleep/wake storm,
# loader misuse, cancel from another thread). Writes misuse.txt to $VMMW_GPU_OUT.
set -uo pipefail
source scripts/gpu-lib.sh
c_test_on_cuda tests/c/test_misuse.c "misuse: C misuse suite, cuda" "$VMMW_GPU_OUT/misuse.txt" 600 VMMW_MISUSE_BACKEND 'checks passed'
