#!/usr/bin/env bash
# The GPU parts (scripts/gpu.d/, run on the GPU machine by
# scripts/gpu-check.sh) checked here, without a GPU: each parses (bash -n),
# and their sizing (scripts/gpu-lib.sh) on both cards the GPU machines come
# with, nvidia-smi stubbed: an H100 (81559 MiB) and an H200 (143771 MiB).
# The checkpoint size comes from the generator's own shapes (16.4 GB at 36
# layers); the trainer/engine update test (five copies) must shrink to fit an
# H100 and run whole on an H200; what every other part needs must fit both.
set -euo pipefail
cd "$(dirname "$0")/../.."
for f in scripts/gpu-check.sh scripts/gpu-lib.sh scripts/gpu.d/*.sh; do
  bash -n "$f"
done
export VMMW_GPU_RESULTS
VMMW_GPU_RESULTS=$(mktemp)
trap 'rm -f "$VMMW_GPU_RESULTS"' EXIT
on_card() {  # $1: MiB the stubbed nvidia-smi reports; $2: a command
  bash -c 'source scripts/gpu-lib.sh; nvidia-smi() { echo "$VMMW_STUB_MIB"; }; '"$2" \
    </dev/null 2>&1 | tail -1
}
ck=$(on_card 0 'ckpt_mib 36')
[ "$ck" -gt 15000 ] && [ "$ck" -lt 16000 ] || { echo "ckpt_mib 36 = $ck MiB, want the 16.4 GB checkpoint" >&2; exit 1; }
for card in H100:81559 H200:143771; do
  export VMMW_STUB_MIB=${card#*:}
  five=$(on_card "$VMMW_STUB_MIB" 'fit_layers 5 4096')
  case "${card%%:*}" in
    H100) [ "$five" -ge 24 ] && [ "$five" -lt 36 ] || { echo "H100: the update test would run $five layers" >&2; exit 1; } ;;
    H200) [ "$five" = 36 ] || { echo "H200: the update test would run $five layers, want 36" >&2; exit 1; } ;;
  esac
  # The largest need of the other parts: four copies (an NCCL pair's rank).
  fits=$(on_card "$VMMW_STUB_MIB" "fits probe \$((4 * $ck + 4096)) && echo yes || echo no")
  [ "$fits" = yes ] || { echo "${card%%:*}: four copies of the checkpoint do not fit: $(cat "$VMMW_GPU_RESULTS")" >&2; exit 1; }
  echo "gpu sizes, ${card%%:*} ($VMMW_STUB_MIB MiB): update test $five of 36 layers; four copies (the largest other need) fit"
done
# A card too small says SKIP with both numbers, not a failure.
VMMW_STUB_MIB=16384 on_card 16384 "fits probe \$((2 * $ck)) || true" >/dev/null
grep -q $'^probe\tSKIP\tneeds about 30 GiB of GPU memory; GPU 0 has 16 GiB' "$VMMW_GPU_RESULTS" \
  || { echo "a card too small gave: $(cat "$VMMW_GPU_RESULTS")" >&2; exit 1; }
echo "gpu scripts: $(ls scripts/gpu.d/*.sh | wc -l) parts parse; a card too small gets SKIP rows"
