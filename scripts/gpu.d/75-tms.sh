#!/usr/bin/env bash
# torch_memory_saver and vLLM compatibility, on the GPU machine (no network),
# all from this one tree in this one run:
#   - upstream torch_memory_saver's own test suite against the real package and
#     against our shim, both columns at once (scripts/tms-suite.sh run; needs
#     .tms/ made by `scripts/tms-suite.sh prepare SRC REV` where the upstream
#     mirror and PyPI are: .tms/upstream and the real package's wheel in
#     .tms/wheels); the table names each N/A's reason
#   - vLLM's test_cumem.py, every test that needs no engine, against our
#     CuMemAllocator (scripts/vllm-cumem.sh run; needs .tms/vllm from
#     `scripts/vllm-cumem.sh prepare`)
#   - pause/resume of a 16.4 GB region with a CPU backup (less where the card
#     cannot hold it, said), every cycle: the real package default and retained,
#     the shim default, retained and mmap (tests/torch/bench_tms.py); PASS when
#     the shim's default is at least as fast as both of the real package's modes
#     in every cycle.
# Keeps four files: tms.txt (everything printed), tms-shim.log and tms-real.log
# (the two columns' pytest logs), bench/tms_pause_resume.json. TMS_ONLY=suite,
# vllm or bench runs one of the three.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu-lib.sh
export PYTHONPATH="$PWD/python:$PWD/tests/torch${PYTHONPATH:+:$PYTHONPATH}"
export VMMW_LIB="${VMMW_LIB:-$PWD/.gpu/libvmmweights.so}"
export VMMW_BACKEND=cuda PYTHONUNBUFFERED=1
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  result "tms" SKIP "PyTorch with CUDA is not available on this machine"
  exit 0
fi
rc=0
work=$(mktemp -d)
log="$VMMW_GPU_OUT/tms.txt"
: >"$log"
want() { [ -z "${TMS_ONLY:-}" ] || [ "$TMS_ONLY" = "$1" ]; }
if ! want suite; then
  :
elif [ -d .tms/upstream/test ]; then
  bash scripts/tms-suite.sh run "$work/tms" >"$work/suite.txt" 2>&1
  t=$?
  tee -a "$log" <"$work/suite.txt"
  cp "$work/tms/shim.log" "$VMMW_GPU_OUT/tms-shim.log" 2>/dev/null
  cp "$work/tms/real.log" "$VMMW_GPU_OUT/tms-real.log" 2>/dev/null
  result_of "tms: upstream suite, real vs shim" "$(grep -E '^(PASS|FAIL|SKIP) ' "$work/suite.txt" | tail -1)" tms.txt || rc=1
  [ "$t" -eq 0 ] || rc=1
else
  result "tms: upstream suite, real vs shim" SKIP "no .tms/upstream: run scripts/tms-suite.sh prepare SRC REV and carry .tms"
fi
if want vllm; then
  bash scripts/vllm-cumem.sh run "$work/vllm" >"$work/vllm.txt" 2>&1
  tee -a "$log" <"$work/vllm.txt"
  result_of "tms: vLLM test_cumem.py, engine-free tests" "$(tail -1 "$work/vllm.txt")" tms.txt || rc=1
fi
if ! want bench; then
  rm -rf "$work"
  exit $rc
fi
real=""
wheel=$(ls .tms/wheels/torch_memory_saver-*.whl 2>/dev/null | tail -1)
if [ ! -d .tms/real/torch_memory_saver ] && [ -n "$wheel" ]; then
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" .tms/real
fi
[ -d .tms/real/torch_memory_saver ] && real="$PWD/.tms/real"
mkdir -p "$VMMW_GPU_OUT/bench"
# 16.4 GB, the 8B-shaped weights, or 40% of a smaller card.
gb=$(python3 -c 'import sys; print(round(min(16.4, 0.4 * int(sys.argv[1]) * 2**20 / 1e9), 1))' "$(gpu_mem_mib)")
python3 tests/torch/bench_tms.py --gb "${TMS_BENCH_GB:-$gb}" --real "$real" \
  --out "$VMMW_GPU_OUT/bench/tms_pause_resume.json" >"$work/bench.txt" 2>&1
tee -a "$log" <"$work/bench.txt"
result_of "tms: pause/resume, shim default vs real default and retained, every cycle" "$(grep -E '^(PASS|FAIL|SKIP) ' "$work/bench.txt" | tail -1)" tms.txt || rc=1
rm -rf "$work"
exit $rc
