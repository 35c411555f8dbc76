# Sourced by scripts/gpu.d/*.sh (not run on its own): where results go.
#   result NAME STATUS DETAIL   append one line to the table gpu-check.sh prints
#                               last (STATUS: PASS, FAIL, INFO or SKIP)
#   result_of NAME LINE LOG     the result of a check that prints one line
#                               starting with PASS, SKIP or FAIL: LINE (that
#                               line, or empty) as NAME's row; returns 1 unless
#                               it passed or skipped (LOG named when no line came)
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
