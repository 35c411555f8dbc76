#!/usr/bin/env bash
# vLLM's tests/basic_correctness/test_cumem.py, its tests that need no engine
# (test_python_error, test_basic_cumem, test_cumem_with_cudagraph), against
# vmmweights' CuMemAllocator: `vllm` is bound to scripts/vllm-cumem/ (the
# allocator is ours; the engine names only let the file import). vLLM's file
# stays out of our tree: it is copied into .tms/vllm (ignored by git).
#
#   scripts/vllm-cumem.sh prepare SRC [REV]   SRC: a vLLM git mirror or checkout
#                                             (REV: the commit) or the file itself
#   scripts/vllm-cumem.sh run [OUT]           run them (needs CUDA and PyTorch);
#                                             prints PASS/FAIL as its last line
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dest="$root/.tms/vllm"
rel=tests/basic_correctness/test_cumem.py

case "${1:-}" in
  prepare)
    src=${2:?usage: vllm-cumem.sh prepare SRC [REV]}
    mkdir -p "$dest"
    if [ -f "$src" ]; then
      cp "$src" "$dest/test_cumem.py"
      echo "file $src" >"$dest/SOURCE"
    else
      gd=$(git --git-dir="$src" rev-parse --git-dir 2>/dev/null || git -C "$src" rev-parse --absolute-git-dir)
      rev=$(git --git-dir="$gd" rev-parse --verify "${3:-HEAD}^{commit}")
      git --git-dir="$gd" show "$rev:$rel" >"$dest/test_cumem.py"
      echo "$rev" >"$dest/SOURCE"
    fi
    echo "vLLM's test_cumem.py ($(cat "$dest/SOURCE")) in .tms/vllm"
    ;;
  run)
    out=${2:-$dest/out}
    [ -f "$dest/test_cumem.py" ] || { echo "SKIP no .tms/vllm/test_cumem.py: run scripts/vllm-cumem.sh prepare SRC first"; exit 0; }
    mkdir -p "$out"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/tests/basic_correctness"
    touch "$work/tests/__init__.py" "$work/tests/basic_correctness/__init__.py"
    cp "$root/scripts/vllm-cumem/harness_utils.py" "$work/tests/utils.py"
    cp "$dest/test_cumem.py" "$work/$rel"
    set +e
    (cd "$work" && PYTHONPATH="$root/scripts/vllm-cumem:$root/python${PYTHONPATH:+:$PYTHONPATH}" \
      python3 -m pytest -v -rA -p no:cacheprovider "$rel" \
      -k "test_python_error or test_basic_cumem or test_cumem_with_cudagraph" >"$out/vllm-cumem.log" 2>&1)
    rc=$?
    set -e
    cat "$out/vllm-cumem.log"
    passed=$(grep -c '^PASSED ' "$out/vllm-cumem.log" || true)
    if [ "$rc" -eq 0 ] && [ "$passed" -eq 3 ]; then
      echo "PASS 3 of 3 engine-free tests of vLLM's test_cumem.py ($(cat "$dest/SOURCE")) with our CuMemAllocator"
    else
      echo "FAIL $passed of 3 engine-free tests passed (pytest exit $rc)"
      exit 1
    fi
    ;;
  *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
