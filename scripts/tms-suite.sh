#!/usr/bin/env bash
# torch_memory_saver's own test suite, run twice side by side: against the
# real package and with `import torch_memory_saver` bound to our shim
# (vmmweights/torch/alias first on PYTHONPATH). Upstream's tests stay out of
# our tree: they are exported into .tms/ (ignored by git).
#
#   scripts/tms-suite.sh prepare SRC REV   export REV's test/ from SRC (a bare git
#                                          mirror or a checkout; REV ignored for a
#                                          plain directory) into .tms/upstream, and
#                                          download the real package's cp312
#                                          manylinux x86_64 wheel into .tms/wheels
#                                          (needs PyPI; TMS_VERSION, default 0.0.10)
#   scripts/tms-suite.sh run [OUT]         run .tms/upstream/test with both at once, in
#                                          one run of this tree (the real column only
#                                          where .tms/wheels holds the wheel or
#                                          torch_memory_saver is installed); junit XML
#                                          and logs into OUT (default .tms/out), the
#                                          table on stdout
#
# The two columns run at the same time; the tests that measure the whole
# device's memory (TMS_SUITE_EXCLUSIVE, the list below by default) run one at
# a time across both (scripts/tms_suite/tms_suite_lock.py). The table marks
# N/A, with the reason, only tests of upstream's release tooling and of other
# platforms (scripts/tms-suite-na.txt). `run` exits 1 when a test passing with
# the real package does not pass with the shim and is not N/A (each column
# stops after TMS_SUITE_TIMEOUT seconds, 280 by default: then pytest is
# interrupted and reports the tests it ran). TMS_SUITE_K selects tests by
# pytest's -k expression in both columns. Needs CUDA and PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tms="$root/.tms"

prepare() {
  local src=${1:?usage: tms-suite.sh prepare SRC REV} rev=${2:-}
  rm -rf "$tms/upstream"
  mkdir -p "$tms/upstream" "$tms/wheels"
  if git --git-dir="$src" rev-parse --git-dir >/dev/null 2>&1 || git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
    local gd
    gd=$(git --git-dir="$src" rev-parse --git-dir 2>/dev/null || git -C "$src" rev-parse --absolute-git-dir)
    [ -n "$rev" ] || { echo "tms-suite: name the upstream commit to export from $src" >&2; exit 2; }
    local full
    full=$(git --git-dir="$gd" rev-parse --verify "$rev^{commit}")
    # test/ and the one script its packaging test loads by path (../scripts).
    git --git-dir="$gd" archive "$full" test scripts/merge_cuda_wheels.py | tar -x -C "$tms/upstream"
    echo "$full" >"$tms/upstream/COMMIT"
  elif [ -d "$src/test" ]; then
    cp -r "$src/test" "$tms/upstream/test"
    if [ -f "$src/scripts/merge_cuda_wheels.py" ]; then
      mkdir -p "$tms/upstream/scripts" && cp "$src/scripts/merge_cuda_wheels.py" "$tms/upstream/scripts/"
    fi
    echo "directory $src" >"$tms/upstream/COMMIT"
  else
    echo "tms-suite: $src is neither a git repository nor a folder with test/" >&2
    exit 2
  fi
  echo "exported test/ of $(cat "$tms/upstream/COMMIT") into .tms/upstream/test"
  local v=${TMS_VERSION:-0.0.10}
  if python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
      --platform manylinux2014_x86_64 --implementation cp -d "$tms/wheels" "torch_memory_saver==$v"; then
    echo "real package: $(ls "$tms"/wheels/torch_memory_saver-"$v"-*.whl)"
  else
    echo "tms-suite: no wheel of torch_memory_saver $v downloaded; the real column will be empty" >&2
  fi
}

run() {
  local out=${1:-$tms/out}
  local suite="$tms/upstream/test"
  [ -d "$suite" ] || { echo "tms-suite: no $suite; run 'scripts/tms-suite.sh prepare SRC REV' first" >&2; exit 2; }
  rm -rf "$out"
  mkdir -p "$out"
  # The real package: the wheel unpacked into .tms/real (a wheel is a zip), else an installed one.
  local real_path=""
  local wheel
  wheel=$(ls "$tms"/wheels/torch_memory_saver-*.whl 2>/dev/null | tail -1 || true)
  if [ -n "$wheel" ]; then
    rm -rf "$tms/real"
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$tms/real"
    real_path="$tms/real"
  elif python3 -c 'import torch_memory_saver' 2>/dev/null; then
    real_path="installed"
  fi
  local alias_dir="$root/python/vmmweights/torch/alias"
  # Interrupted (SIGINT), pytest still writes the junit report of what ran.
  local limit=(timeout -s INT -k 30 "${TMS_SUITE_TIMEOUT:-280}")
  local select=()
  [ -z "${TMS_SUITE_K:-}" ] || select=(-k "$TMS_SUITE_K")
  local base="${PYTHONPATH:-}"
  # Both columns run at once; the tests that measure the whole device's
  # memory run one at a time across both (scripts/tms_suite/tms_suite_lock.py).
  export TMS_SUITE_LOCK="$out/device.lock"
  export TMS_SUITE_EXCLUSIVE="${TMS_SUITE_EXCLUSIVE:-$exclusive}"
  local plugin=(-p tms_suite_lock)
  local started=$SECONDS real_pid=""
  if [ -n "$real_path" ]; then
    local pp="$root/scripts/tms_suite${base:+:$base}"
    [ "$real_path" = installed ] || pp="$real_path:$pp"
    (cd "$suite" && PYTHONPATH="$pp" "${limit[@]}" python3 -m pytest "${plugin[@]}" "${select[@]}" -v -rA -p no:cacheprovider \
      --continue-on-collection-errors --junitxml="$out/real.xml" . >"$out/real.log" 2>&1) &
    real_pid=$!
  fi
  (cd "$suite" && PYTHONPATH="$alias_dir:$root/python:$root/scripts/tms_suite${base:+:$base}" "${limit[@]}" \
    python3 -m pytest "${plugin[@]}" "${select[@]}" -v -rA -p no:cacheprovider --continue-on-collection-errors \
    --junitxml="$out/shim.xml" . >"$out/shim.log" 2>&1) || true
  [ -z "$real_pid" ] || wait "$real_pid" || true
  echo "--- both columns in $((SECONDS - started)) s, one run of this tree ($(head -1 "$root/.gpu/MANIFEST" 2>/dev/null || git -C "$root" rev-parse --short HEAD 2>/dev/null || echo "tree unknown"))"
  if [ -n "$real_path" ]; then
    echo "--- real package ($real_path)"
    tail -3 "$out/real.log"
  else
    echo "--- real package: not available (no wheel in .tms/wheels, not installed)"
  fi
  echo "--- shim (import torch_memory_saver -> vmmweights.torch.memory_saver)"
  tail -3 "$out/shim.log"
  sed -n '/short test summary info/,$p' "$out/shim.log" | grep -v '^PASSED' || true
  python3 "$root/scripts/tms-suite-table.py" --na "$root/scripts/tms-suite-na.txt" \
    --commit "$(cat "$tms/upstream/COMMIT")" --tree "$(head -1 "$root/.gpu/MANIFEST" 2>/dev/null || git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)" \
    --real "$out/real.xml" --shim "$out/shim.xml"
}

# Tests that read the whole device's memory (NVML or cudaMemGetInfo) and so
# must not run while the other column allocates.
exclusive="test_examples.py::test_simple*,test_examples.py::test_cuda_graph*,test_examples.py::test_rl_example*"
exclusive+=",test_examples.py::test_nested_region,test_examples.py::test_training_engine,test_examples.py::test_multi_device*"

case "${1:-}" in
  prepare) shift; prepare "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,28p' "$0" >&2; exit 2 ;;
esac
