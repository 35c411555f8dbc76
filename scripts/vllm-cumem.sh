#!/usr/bin/env bash
# vLLM's tests/basic_correctness/test_cumem.py, every test in it that needs no
# engine, against vmmweights' CuMemAllocator: `vllm` is bound to
# scripts/vllm-cumem/ (the allocator is ours; the engine names only let the
# file import, and a test that makes an engine is skipped, so which tests run
# is the file's, not a list here). vLLM's file stays out of our tree: it is
# copied into .tms/vllm (ignored by git).
#
#   scripts/vllm-cumem.sh prepare SRC [REV]   SRC: a vLLM git mirror or checkout
#                                             (REV: the commit) or the file itself
#   scripts/vllm-cumem.sh run [OUT]           run them (needs CUDA and PyTorch);
#                                             prints PASS/FAIL as its last line,
#                                             naming the tests that ran
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
      python3 -m pytest -v -rA -p no:cacheprovider "$rel" >"$out/vllm-cumem.log" 2>&1)
    rc=$?
    set -e
    cat "$out/vllm-cumem.log"
    names() { grep "^$1 " "$out/vllm-cumem.log" | sed 's/^[A-Z]* [^:]*:://; s/ .*//' | paste -sd, - ; }
    passed=$(grep -c '^PASSED ' "$out/vllm-cumem.log" || true)
    failed=$(grep -cE '^(FAILED|ERROR) ' "$out/vllm-cumem.log" || true)
    engine=$(grep -c '^SKIPPED .*needs a vLLM engine' "$out/vllm-cumem.log" || true)
    if [ "$rc" -eq 0 ] && [ "$passed" -gt 0 ] && [ "$failed" -eq 0 ]; then
      echo "PASS $passed of $passed engine-free tests of vLLM's test_cumem.py ($(cat "$dest/SOURCE")) with our CuMemAllocator: $(names PASSED); $engine need an engine (skipped)"
    else
      echo "FAIL $passed engine-free tests passed, $failed failed ($(names FAILED)$(names ERROR)), $engine need an engine (pytest exit $rc)"
      exit 1
    fi
    ;;
  *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
