#!/usr/bin/env bash
# The CUDA C kernels: clang syntax check and the codec kernels emulated on the
# CPU against the Rust reference (scripts/check-kernels.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec scripts/check-kernels.sh
