#!/usr/bin/env bash
# Packed checkpoints (docs/PACKED.md) on the GPU. First tests/all/packed.rs and
# packed_integrity.rs on the cuda backend (round trips, every rank and
# strategy against the original, conversions, a file packed by the GPU's
# kernels against the reference encoder's, the Reload wake, a corrupt frame
# caught by the decode kernel, hostile headers). Then, in one run, the 16.4 GB bf16 checkpoint of
# 20-load.sh (made here when absent) and a GGUF of the same tensors:
#   - packed on the GPU (`vmmw pack`, source page-cached), timed without and
#     with the sync to disk;
#   - loaded page-cached and cold (page cache dropped, as root), original and
#     packed, with the link and the disk's own read rate measured in the same
#     run (`vmmw bench-load --cold`: the disk rate over the files it reads);
#     every destination of the packed load compared with the original's load
#     on the device (`--same-as`);
#   - Reload wakes from the original and from the packed files (`--reload-wake`).
# Prints the table of ratios: original bytes placed per second over the link
# (page-cached) and over the disk rate (cold), packing GB/s, Reload wake over
# the link. Writes packed.txt (log) and packed.json (every figure) to
# $VMMW_GPU_OUT.
#
# Disk: the machine has 64 GB. The original (16.4 GB; kept when 20-load.sh
# made it, deleted when made here unless PACKED_KEEP=1) plus its packed copy
# (~11.5 GB); the packed copy goes before the GGUF phase, which needs the GGUF
# (16.4 GB) and its packed copy. A phase without room is skipped with the
# reason. Everything under PACKED_DIR (default /root/vmmw-packed) is deleted
# at the end. LOAD_DIR (default /root/vmmw-ckpt-8b) and LOAD_LAYERS (36) as in
# 20-load.sh; PACKED_GGUF=0 skips the GGUF phase.
set -uo pipefail
source scripts/gpu-lib.sh
# PACKED_BACKEND=host runs the same steps on the host backend (a dry run of this script).
export VMMW_BACKEND=${PACKED_BACKEND:-cuda} PYTHONUNBUFFERED=1
rc=0
log="$VMMW_GPU_OUT/packed.txt"
: >"$log"

.gpu/tests/all packed:: packed_integrity:: --nocapture --test-threads=1 >>"$log" 2>&1
t=$?
summary=$(grep -E '^test result:' "$log" | tail -1)
ran=$(grep -c '^RAN cuda' "$log")
if [ "$t" -eq 0 ] && [ "$ran" -gt 0 ]; then
  result "packed: tests, cuda" PASS "${summary#test result: }; $ran ran on cuda"
else
  result "packed: tests, cuda" FAIL "exit $t, $ran ran on cuda; ${summary:-no summary}; see packed.txt"
  rc=1
fi

src=${LOAD_DIR:-/root/vmmw-ckpt-8b}
work=${PACKED_DIR:-/root/vmmw-packed}
made_src=0
cleanup() {
  rm -rf "$work"
  if [ "$made_src" = 1 ] && [ "${PACKED_KEEP:-0}" != 1 ]; then rm -rf "$src"; fi
}
trap cleanup EXIT
rm -rf "$work"
mkdir -p "$work"
free_gb() { df -B1 --output=avail "$1" | tail -1 | awk '{printf "%d", $1 / 1e9}'; }

if [ ! -f "$src/model.safetensors.index.json" ]; then
  if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    result "packed: bench" SKIP "no checkpoint at $src and no PyTorch with CUDA to make one"
    exit $rc
  fi
  mkdir -p "$(dirname "$src")"
  if [ "$(free_gb "$(dirname "$src")")" -lt 32 ]; then
    result "packed: bench" SKIP "$(free_gb "$(dirname "$src")") GB free: the checkpoint and its packed copy need 32"
    exit $rc
  fi
  made_src=1
  echo "making the checkpoint in $src" | tee -a "$log"
  python3 -c 'import sys; sys.path.insert(0, "tests/torch"); import bench_load_reference as b; print("generated", b.generate(sys.argv[1], int(sys.argv[2])), "bytes")' \
    "$src" "${LOAD_LAYERS:-36}" >>"$log" 2>&1 || { result "packed: bench" FAIL "making the checkpoint failed; see packed.txt"; exit 1; }
fi

# One phase: pack ORIGINAL into PACKED on the GPU, then bench-load both.
# $1 label, $2 original, $3 packed path.
phase() {
  local label=$1 orig=$2 packed=$3 ok=0
  # The source page-cached, so packing is timed on the encoder and the writes.
  cat "$orig" >/dev/null 2>&1 || cat "$orig"/*.safetensors >/dev/null
  echo "+ vmmw pack $orig $packed" >>"$log"
  if ! .gpu/vmmw pack "$orig" "$packed" --json >"$work/pack-$label.json" 2>>"$log"; then
    result "packed $label: pack" FAIL "vmmw pack failed; see packed.txt"
    return 1
  fi
  cat "$work/pack-$label.json" >>"$log"
  .gpu/vmmw inspect "$packed" --json >"$work/inspect-$label.json" 2>>"$log"
  local bench=(bench-load --preset qwen3 --strategies auto,staged,stream,hybrid --repeat 3 --cold --cold-repeat 1 --reload-wake 3)
  echo "+ vmmw ${bench[*]} $orig" >>"$log"
  .gpu/vmmw "${bench[@]}" "$orig" --json "$work/orig-$label.json" >>"$log" 2>&1 || ok=1
  echo "+ vmmw ${bench[*]} $packed --same-as $orig" >>"$log"
  .gpu/vmmw "${bench[@]}" "$packed" --same-as "$orig" --json "$work/packed-$label.json" >>"$log" 2>&1 || ok=1
  if [ "$ok" -ne 0 ]; then
    tail -30 "$log"
    result "packed $label: bench" FAIL "bench-load failed; see packed.txt"
    return 1
  fi
  return 0
}

labels=()
if [ "$(free_gb "$work")" -lt 13 ]; then
  result "packed safetensors" SKIP "$(free_gb "$work") GB free: the packed copy needs 13"
elif phase safetensors "$src" "$work/st"; then
  labels+=(safetensors)
else
  rc=1
fi
rm -rf "$work/st"
if [ "${PACKED_GGUF:-1}" = 0 ]; then
  result "packed gguf" SKIP "PACKED_GGUF=0"
elif [ "$(free_gb "$work")" -lt 31 ]; then
  result "packed gguf" SKIP "$(free_gb "$work") GB free: the GGUF and its packed copy need 31"
else
  if python3 tests/torch/gguf_from_safetensors.py "$src" "$work/model.gguf" >>"$log" 2>&1 \
      && phase gguf "$work/model.gguf" "$work/model.packed.gguf"; then
    labels+=(gguf)
  else
    result "packed gguf" FAIL "the GGUF phase failed; see packed.txt"
    rc=1
  fi
fi

python3 - "$work" "$VMMW_GPU_OUT/packed.json" "${labels[@]}" >"$work/table.txt" 2>>"$log" <<'PY'
import json, statistics, sys
work, out, labels = sys.argv[1], sys.argv[2], sys.argv[3:]
doc = {}
for label in labels:
    load = lambda n: json.load(open(f"{work}/{n}-{label}.json"))
    o, p, pk, ins = load("orig"), load("packed"), load("pack"), load("inspect")
    link = max(o["link_htod_gbps"], p["link_htod_gbps"])
    run = lambda r, cache, s="auto": next((x for x in r["runs"] if x["cache"] == cache and x["label"] == s), None)
    best = lambda r: max((x for x in r["runs"] if x["cache"] == "cached"), key=lambda x: x["gbps"])
    wake = lambda r: (r["reload_wake_bytes"] / statistics.median(r["reload_wake_s"]) / 1e9) if r["reload_wake_s"] else None
    row = {
        "device": p["device"], "original_bytes": p["original_file_bytes"], "packed_bytes": p["file_bytes"],
        "tensor_bytes": p["bytes"], "packed_ratio": ins.get("packed_ratio"), "link_gbps": link,
        "host_cache_memcpy_gbps": max(o["host_cache_memcpy_gbps"], p["host_cache_memcpy_gbps"]),
        "orig_cached_gbps": run(o, "cached")["gbps"], "packed_cached_gbps": run(p, "cached")["gbps"],
        "orig_best": [best(o)["label"], best(o)["gbps"]], "packed_best": [best(p)["label"], best(p)["gbps"]],
        "disk_gbps_orig_files": o.get("disk_read_gbps"), "disk_gbps_packed_files": p.get("disk_read_gbps"),
        "orig_cold_gbps": (run(o, "cold") or {}).get("gbps"), "packed_cold_gbps": (run(p, "cold") or {}).get("gbps"),
        "pack_gbps": pk["gbps"], "pack_seconds": pk["seconds"], "pack_sync_seconds": pk["sync_seconds"],
        "pack_coder": pk["coder"], "orig_reload_wake_gbps": wake(o), "packed_reload_wake_gbps": wake(p),
        "same_as_destinations": p.get("same_as_destinations"),
    }
    doc[label] = row
    r = row
    print(f"{label}: device {r['device']}; link {link:.1f} GB/s; host page-cache memcpy {r['host_cache_memcpy_gbps']:.1f} GB/s")
    print(f"{label}: packed {r['packed_bytes'] / 1e9:.2f} GB of {r['original_bytes'] / 1e9:.2f} GB ({r['packed_bytes'] / r['original_bytes']:.3f}; tensors {r['packed_ratio']:.3f}); "
          f"every destination equal to the original's load: {r['same_as_destinations']}")
    print(f"{label}: pack on the GPU ({r['pack_coder']}): {r['pack_gbps']:.1f} GB/s of original bytes "
          f"({r['pack_seconds']:.2f} s; sync and rename {r['pack_sync_seconds']:.2f} s more: "
          f"{r['original_bytes'] / (r['pack_seconds'] + r['pack_sync_seconds']) / 1e9:.1f} GB/s with it) [target >= 5 GB/s]")
    print(f"{label}: page-cached auto: original {r['orig_cached_gbps']:.1f} GB/s = {r['orig_cached_gbps'] / link:.2f} of link; "
          f"packed {r['packed_cached_gbps']:.1f} GB/s = {r['packed_cached_gbps'] / link:.2f}x the link [target >= 1.35], "
          f"{r['packed_cached_gbps'] / r['orig_cached_gbps']:.2f}x the original; best: original {r['orig_best'][0]} {r['orig_best'][1]:.1f}, packed {r['packed_best'][0]} {r['packed_best'][1]:.1f}")
    d_o, d_p = r["disk_gbps_orig_files"], r["disk_gbps_packed_files"]
    if r["packed_cold_gbps"] and d_p:
        fast = " (the disk reads at page-cache speed here: cold is not disk-bound)" if d_p > 0.5 * r["host_cache_memcpy_gbps"] else ""
        print(f"{label}: cold: disk {d_o:.2f} GB/s (original files), {d_p:.2f} GB/s (packed files){fast}; "
              f"original {r['orig_cold_gbps']:.2f} GB/s = {r['orig_cold_gbps'] / d_o:.2f} of disk; "
              f"packed {r['packed_cold_gbps']:.2f} GB/s of original bytes = {r['packed_cold_gbps'] / d_p:.2f}x the disk [target >= 1.35]")
    else:
        print(f"{label}: cold: not measured (the page cache could not be dropped; see packed.txt)")
    if r["packed_reload_wake_gbps"]:
        print(f"{label}: Reload wake: original {r['orig_reload_wake_gbps']:.1f} GB/s = {r['orig_reload_wake_gbps'] / link:.2f} of link; "
              f"packed {r['packed_reload_wake_gbps']:.1f} GB/s = {r['packed_reload_wake_gbps'] / link:.2f}x the link [target >= 1.3]")
json.dump(doc, open(out, "w"), indent=2)
PY
cat "$work/table.txt" | tee -a "$log"
while IFS= read -r line; do
  [ -n "$line" ] && result "packed ${line%%:*}" INFO "${line#*: }"
done <"$work/table.txt"
for label in "${labels[@]}"; do
  n=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]]["same_as_destinations"] or 0)' "$VMMW_GPU_OUT/packed.json" "$label" 2>/dev/null)
  if [ "${n:-0}" -gt 0 ]; then
    result "packed $label: bitwise against the original's load" PASS "$n destinations, device hash of every byte"
  else
    result "packed $label: bitwise against the original's load" FAIL "not compared; see packed.txt"
    rc=1
  fi
done
exit $rc
