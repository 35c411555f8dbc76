#!/usr/bin/env bash
# Swaps that use both directions of the link, on the GPU:
# - `vmmw bench-swap`: two bf16 models of about 5 GB (at most 28% of the
#   card each: fits 80 GB and 141 GB cards), every pair of policies (the one
#   the waking model slept with x the one the other sleeps with) as one
#   library swap and as a sleep then a wake, against the link measured in the
#   same run (host to device, device to host, and both at once); every woken
#   model's bytes hashed against its load. Targets, one row per pair: swap
#   <= 1.1x the link's time for the larger side's bytes from Offload to
#   Offload, <= 1.2x on every other pair; a pair with an OffloadCompressed
#   side (bound by its codec, about 1.4x the link alone) <= 1.2x its slower
#   side alone, its ratio to the link shown;
# - the go-swap service's bench (examples/go-swap, through 80-swap.sh, unless
#   gpu-check.sh ran that part in this run already), whose /activate is one
#   library swap: swap / link per swap kind, 1.2x target.
# Writes swap-duplex.txt and swap-duplex.json to $VMMW_GPU_OUT (the go-swap
# part its swap.txt and swap.json). SWAP_BENCH_DIR (default
# /root/vmmw-swap-bench) keeps the two checkpoints for later runs;
# SWAP_BENCH_MIB sizes each model (default: about 5 GB); SWAP_BENCH_ROUNDS
# the timed rounds per pair (default 3); SKIP_GO_SWAP=1 leaves the service out.
set -uo pipefail
source scripts/gpu-lib.sh
rc=0

txt="$VMMW_GPU_OUT/swap-duplex.txt"
json="$VMMW_GPU_OUT/swap-duplex.json"
args=(--backend cuda --rounds "${SWAP_BENCH_ROUNDS:-3}" --dir "${SWAP_BENCH_DIR:-/root/vmmw-swap-bench}" --json "$json")
[ -n "${SWAP_BENCH_MIB:-}" ] && args+=(--model-mib "$SWAP_BENCH_MIB")
mkdir -p "${SWAP_BENCH_DIR:-/root/vmmw-swap-bench}"
# Disk: two models of up to 5 GB each.
avail=$(df -Pk "${SWAP_BENCH_DIR:-/root/vmmw-swap-bench}" | awk 'NR==2 {print $4}')
if [ -n "$avail" ] && [ "$avail" -lt $((12 * 1024 * 1024)) ] && [ -z "${SWAP_BENCH_MIB:-}" ]; then
  args+=(--model-mib 1024)
  echo "swap-duplex: under 12 GB free on disk: models of 1 GiB"
fi
timeout 360 .gpu/vmmw bench-swap "${args[@]}" 2>&1 | tee "$txt"
t=${PIPESTATUS[0]}
if [ "$t" -ne 0 ] || [ ! -s "$json" ]; then
  result "swap-duplex: vmmw bench-swap" FAIL "exit $t; see swap-duplex.txt"
  rc=1
else
  while IFS=$'\t' read -r name status detail; do
    result "$name" "$status" "$detail"
    [ "$status" = FAIL ] && rc=1
  done < <(python3 - "$json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
l = doc["link"]
print(f"swap-duplex: link\tINFO\th2d {l['h2d_gbps']:.1f}, d2h {l['d2h_gbps']:.1f}, both at once "
      f"{l['duplex_h2d_gbps']:.1f} + {l['duplex_d2h_gbps']:.1f} = {l['duplex_total_gbps']:.1f} GB/s; "
      f"models {doc['model_bytes'] / 1e9:.2f} GB")
print("| waking slept with | sleeping with | out GB | in GB | swap s | sequential s | link s | swap / link | seq / link | swap / duplex | swap / slower side |",
      file=sys.stderr)
print("|---|---|---|---|---|---|---|---|---|---|---|", file=sys.stderr)
for r in doc["rows"]:
    w, s = r["waking"], r["sleeping"]
    ratio = r["swap_over_link"]
    fmt = lambda x: "-" if x is None else f"{x:.2f}x"
    print(f"| {w} | {s} | {r['out_bytes'] / 1e9:.2f} | {r['in_bytes'] / 1e9:.2f} | {r['swap_s']:.3f} | "
          f"{r['sequential_s']:.3f} | {r['link_s']:.3f} | {fmt(ratio)} | {fmt(r['sequential_over_link'])} | "
          f"{fmt(r['swap_over_duplex'])} | {r['swap_over_slower_side']:.2f}x |", file=sys.stderr)
    if ratio is None:
        continue
    detail = (f"swap {r['swap_s']:.3f} s = {ratio:.2f}x the link's {r['link_s']:.3f} s; sleep then wake "
              f"{fmt(r['sequential_over_link'])}; {fmt(r['swap_over_duplex'])} the duplex link; "
              f"{r['swap_over_slower_side']:.2f}x the slower side alone")
    if "offload_compressed" in (w, s):
        # Bound by the codec (about 1.4x the link on its own), not the
        # link: judged by how well the two sides overlap.
        ok = r["swap_over_slower_side"] <= 1.2
        print(f"swap-duplex: {w} wakes while {s} sleeps\t{'PASS' if ok else 'FAIL'}\t{detail} (target: 1.2x the slower side)")
    else:
        target = 1.1 if (w, s) == ("offload", "offload") else 1.2
        ok = ratio <= target
        print(f"swap-duplex: {w} wakes while {s} sleeps\t{'PASS' if ok else 'FAIL'}\t{detail} (target {target}x the link)")
verified = doc["verified_bytes"]
woken = [r for r in doc["rows"] if r["waking"] != "discard"]
ok = verified > 0 and all(r["verified_bytes"] > 0 for r in woken)
print(f"swap-duplex: woken models' bytes = their loads\t{'PASS' if ok else 'FAIL'}\t{verified} bytes hashed equal")
PY
  )
fi

if [ "${SKIP_GO_SWAP:-0}" = 1 ]; then
  result "swap-duplex: go-swap service" SKIP "SKIP_GO_SWAP=1"
elif grep -q '^80-swap.sh' "$VMMW_GPU_RESULTS"; then
  # gpu-check.sh ran 80-swap.sh in this run already: its rows are above.
  result "swap-duplex: go-swap service" INFO "run by 80-swap.sh in this run (swap.txt)"
else
  bash scripts/gpu.d/80-swap.sh || rc=1
fi
exit $rc
