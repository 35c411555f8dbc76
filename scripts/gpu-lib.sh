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
#   gpu_mem_mib [DEV]           total memory of GPU DEV (default 0) in MiB:
#                               nvidia-smi, else PyTorch; 0 when neither answers
#   ckpt_mib LAYERS             the size of the 8B-shaped test checkpoint
#                               (tests/torch/bench_load_reference.py) with
#                               LAYERS layers, in MiB (36 layers: 16.4 GB)
#   fit_layers COPIES EXTRA_MIB the most layers, at most ${LOAD_LAYERS:-36},
#                               such that COPIES copies of that checkpoint plus
#                               EXTRA_MIB fit in 90% of GPU 0's memory (an H100
#                               has 80 GB, an H200 141 GB); 0 when none does
#   fits NAME NEED_MIB          true when NEED_MIB fits in 90% of GPU 0's
#                               memory; else a SKIP row for NAME naming the
#                               need and the card's memory, and false
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

gpu_mem_mib() {
  local dev=${1:-0} mib
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i "$dev" 2>/dev/null | head -1 | tr -dc 0-9)
  if [ -z "$mib" ]; then
    mib=$(python3 -c 'import sys, torch; print(torch.cuda.get_device_properties(int(sys.argv[1])).total_memory >> 20)' "$dev" 2>/dev/null)
  fi
  echo "${mib:-0}"
}
# The checkpoint's size is linear in its layers: "BASE PER_LAYER" in bytes,
# from the shapes the generator writes.
_ckpt_terms() {
  python3 - <<'PY'
import ast, math, pathlib
src = pathlib.Path("tests/torch/bench_load_reference.py").read_text()
consts = {}
for node in ast.parse(src).body:
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple):
        names = [t.id for t in node.targets[0].elts]
        consts.update(zip(names, ast.literal_eval(node.value)))
    if isinstance(node, ast.FunctionDef) and node.name == "shapes":
        shapes_src = ast.get_source_segment(src, node)
ns = dict(consts)
exec(shapes_src, ns)
size = lambda n: sum(2 * math.prod(s) for _, s in ns["shapes"](n))
print(size(0), size(1) - size(0))
PY
}
ckpt_mib() {
  local terms base per
  terms=$(_ckpt_terms) || { echo 0; return 1; }
  read -r base per <<<"$terms"
  echo $(((base + per * $1) >> 20))
}
fit_layers() {
  local copies=$1 extra=$2 max=${LOAD_LAYERS:-36} avail terms base per l
  avail=$(($(gpu_mem_mib) * 9 / 10 - extra))
  terms=$(_ckpt_terms) || { echo 0; return; }
  read -r base per <<<"$terms"
  for ((l = max; l >= 1; l--)); do
    if [ $((copies * ((base + per * l) >> 20))) -le "$avail" ]; then echo "$l"; return; fi
  done
  echo 0
}
fits() {
  local name=$1 need=$2 total
  total=$(gpu_mem_mib)
  if [ "$total" -gt 0 ] && [ "$need" -le $((total * 9 / 10)) ]; then return 0; fi
  result "$name" SKIP "needs about $((need / 1024)) GiB of GPU memory; GPU 0 has $((total / 1024)) GiB (90% usable)"
  return 1
}
