# Sourced by scripts/gpu.d/*.sh (not run on its own): where results go.
#   result NAME STATUS DETAIL   append one line to the table gpu-check.sh prints
#                               last (STATUS: PASS, FAIL, INFO or SKIP)
#   result_of NAME LINE LOG     the result of a check that prints one line
#                               starting with PASS, SKIP or FAIL: LINE (that
#                               line, or empty) as NAME's row; returns 1 unless
#                               it passed or skipped (LOG named when no line came)
#   c_test_on_cuda SRC LABEL LOG SECS ENV SUMMARY
#                               build the C test SRC with gcc against the
#                               bundled .gpu/libvmmweights.so, run it with
#                               ENV=cuda for at most SECS into LOG; LABEL's row
#                               holds the log's lines matching SUMMARY (an
#                               ERE); returns its exit status (0 on a SKIP row)
#   $VMMW_GPU_OUT               folder for logs and JSON worth keeping ($OUT under
#                               the run tool, else .gpu/out); keep to a file or two
#                               per part: the run tool returns at most 8 files
result() {
  printf '%s\t%s\t%s\n' "$1" "$2" "${3:-}" >>"${VMMW_GPU_RESULTS:?run me through scripts/gpu-check.sh}"
}
result_of() {
  case "$2" in
    PASS*) result "$1" PASS "${2:5}" ;;
    SKIP*) result "$1" SKIP "${2:5}" ;;
    *) result "$1" FAIL "${2:-no result; see $3}"; return 1 ;;
  esac
}
c_test_on_cuda() {
  local src=$1 label=$2 log=$3 secs=$4 env=$5 summary=$6
  local lib="$PWD/.gpu/libvmmweights.so" work soname rc
  if ! command -v gcc >/dev/null; then
    result "$label" SKIP "no gcc on this machine"
    return 0
  fi
  work=$(mktemp -d)
  soname=$(readelf -d "$lib" 2>/dev/null | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
  ln -s "$lib" "$work/libvmmweights.so"
  [ -n "$soname" ] && ln -s "$lib" "$work/$soname"
  local bin="$work/$(basename "$src" .c)"
  if ! gcc -std=c11 -O1 -g -Wall -Wextra -Werror -Iinclude "$src" \
       -o "$bin" -L"$work" -lvmmweights -Wl,-rpath,"$work"; then
    result "$label" FAIL "$src did not compile against the bundle"
    rm -rf "$work"
    return 1
  fi
  env "$env=cuda" timeout "$secs" "$bin" >"$log" 2>&1
  rc=$?
  rm -rf "$work"
  tail -5 "$log"
  if [ "$rc" -eq 0 ]; then
    result "$label" PASS "$(grep -E "$summary" "$log" | tr '\n' ' ')"
  else
    result "$label" FAIL "exit $rc; see $(basename "$log")"
  fi
  return "$rc"
}
