# Sourced by scripts/gpu.d/*.sh (not run on its own): where results go.
#   result NAME STATUS DETAIL   append one line to the table gpu-check.sh prints
#                               last (STATUS: PASS, FAIL, INFO or SKIP)
#   $VMMW_GPU_OUT               folder for logs and JSON worth keeping ($OUT under
#                               the run tool, else .gpu/out); keep to a file or two
#                               per part: the run tool returns at most 8 files
result() {
  printf '%s\t%s\t%s\n' "$1" "$2" "${3:-}" >>"${VMMW_GPU_RESULTS:?run me through scripts/gpu-check.sh}"
}
