#!/usr/bin/env bash
# Destination identity on the GPU: builds tests/c/test_identity.c here with
# gcc against the bundled .gpu/libvmmweights.so and runs it with its pools on
# the cuda backend (a destination freed and handed to a new owner at the same
# address refused with VMMW_UNKNOWN_POINTER, the new owner's bytes intact,
# also after a Reload wake and, with two devices, by a multi-device load; a
# 2^56-byte arena as VMMW_OUT_OF_MEMORY). Writes identity.txt to $VMMW_GPU_OUT.
set -uo pipefail
source scripts/gpu-lib.sh
c_test_on_cuda tests/c/test_identity.c "identity: C destination identity, cuda" "$VMMW_GPU_OUT/identity.txt" 300 VMMW_IDENTITY_BACKEND 'SKIP|checks passed'
