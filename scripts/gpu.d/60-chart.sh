#!/usr/bin/env bash
# Charts on the GPU: the demo on the cuda backend with a checkpoint
# big enough to read (8 layers, hidden 2048: ~0.9 GB), its memory timeline as
# an SVG (demo-timeline.svg) and as JSON (demo.json). To commit it, copy
# demo-timeline.svg to bench/results/demo-timeline.svg and point the README's
# image at it (vmmw report demo.json --chart X.svg redraws it anywhere).
# bench-sleep's results chart comes from 50-sleep.sh (sleep-bench.svg).
set -uo pipefail
source scripts/gpu-lib.sh
svg="$VMMW_GPU_OUT/demo-timeline.svg"
json="$VMMW_GPU_OUT/demo.json"
.gpu/vmmw demo --backend cuda --layers "${CHART_LAYERS:-8}" --hidden "${CHART_HIDDEN:-2048}" \
  --chart "$svg" --json >"$json"
t=$?
if [ "$t" -eq 0 ] && [ -s "$svg" ] && grep -q '</svg>' "$svg"; then
  result "chart: demo timeline (cuda)" PASS "demo-timeline.svg, demo.json"
  exit 0
fi
result "chart: demo timeline (cuda)" FAIL "exit $t; see demo.json"
exit 1
