#!/usr/bin/env bash
# The backup codec on the cuda backend:
# - the committed codec PTX (src/driver/cuda/codec.ptx) is what nvcc makes of
#   kernels/codec.cu (scripts/build-ptx.sh; a differing or missing build is
#   written to codec.ptx here, for the lead to commit);
# - the driver contract's codec clause and the OffloadCompressed sleep tests
#   on cuda: the device's frames equal the Rust reference byte for byte,
#   decode gives the bytes back, corrupt frames are refused;
# - with BENCH=1: `vmmw bench-codec` against raw Offload on the link measured
#   in the same run (bf16 from the checkpoint 20-load.sh generated, in
#   LOAD_DIR, plus synthetic bf16 N(0, 0.02^2), fp16, fp32 and random bytes)
#   and its sweep of frame size x ring depth; the targets as PASS/FAIL rows.
set -uo pipefail
source scripts/gpu-lib.sh
rc=0

nvcc=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
if [ -x "$nvcc" ]; then
  built="$VMMW_GPU_OUT/codec.ptx"
  "$nvcc" -ptx -arch=compute_75 -O3 -o "$built" kernels/codec.cu
  if cmp -s "$built" src/driver/cuda/codec.ptx; then
    result "codec: committed PTX = nvcc kernels/codec.cu" PASS "$("$nvcc" --version | tail -1)"
    rm -f "$built"
  else
    result "codec: committed PTX = nvcc kernels/codec.cu" FAIL "differs or is empty; nvcc's build is codec.ptx"
    rc=1
  fi
else
  result "codec: committed PTX" SKIP "no nvcc on this machine"
fi

if [ ! -s src/driver/cuda/codec.ptx ]; then
  result "codec: contract and sleep on cuda" FAIL "src/driver/cuda/codec.ptx is empty: run scripts/build-ptx.sh, commit, rebuild the bundle"
  exit 1
fi

log="$VMMW_GPU_OUT/codec-tests.txt"
VMMW_BACKEND=cuda .gpu/tests/all driver_contract::codec sleep_compressed:: --nocapture --test-threads=1 >"$log" 2>&1
t=$?
cat "$log"
summary=$(grep -E '^test result:' "$log" | tail -1)
# Tests that need the host backend's fault injection skip on cuda, each with
# a row; the contract clause must run.
while IFS= read -r line; do
  result "codec: ${line#SKIP cuda: }" SKIP "did not run on cuda"
done < <(grep '^SKIP cuda: ' "$log" | grep -v 'codec_frames_equal_the_reference' | sort -u)
if grep -q '^SKIP cuda: codec_frames_equal_the_reference' "$log"; then
  result "codec: contract and sleep on cuda" FAIL "the contract clause skipped: $(grep -m1 '^SKIP cuda: codec_frames' "$log")"
  rc=1
elif [ "$t" -eq 0 ] && grep -q '^RAN cuda: codec_frames_equal_the_reference' "$log"; then
  result "codec: contract and sleep on cuda, frames = reference" PASS "${summary#test result: }"
else
  result "codec: contract and sleep on cuda" FAIL "exit $t; ${summary:-no summary}; see codec-tests.txt"
  rc=1
fi

if [ "${BENCH:-0}" = 1 ] && fits "codec: bench" $((2 * $(ckpt_mib 36) + 8192)); then
  ckpt="${LOAD_DIR:-/root/vmmw-ckpt-8b}"
  args=()
  [ -e "$ckpt" ] && args=(--checkpoint "$ckpt")
  # Real trained weights, when the Hugging Face cache holds any (no network
  # here): the two largest safetensors files of at least 50 MB.
  hub="${HF_HOME:-$HOME/.cache/huggingface}/hub"
  if [ -d "$hub" ]; then
    while IFS= read -r f; do
      args+=(--checkpoint "$f")
      echo "codec bench: trained weights from the HF cache: $f"
    done < <(find -L "$hub" -name '*.safetensors' -size +50M -printf '%s %p\n' 2>/dev/null |
      sort -rn | head -2 | cut -d' ' -f2-)
  fi
  [ ${#args[@]} -le 2 ] && echo "codec bench: no trained weights in the HF cache ($hub)" 
  out="$VMMW_GPU_OUT/codec-bench"
  # --sweep: frame 16/32/64 MiB x ring 2/3/4 on synthetic bf16 and random
  # data after the main rows, into the same text and JSON.
  .gpu/vmmw bench-codec --backend cuda --sweep --json "$out.json" "${args[@]}" 2>&1 | tee "$out.txt"
  t=${PIPESTATUS[0]}
  if [ "$t" -eq 0 ]; then
    # The targets, one row each: on bf16 (checkpoints coded as bf16 and the
    # synthetic bf16) wake >= 1.3x and sleep >= 1.2x the link and the backup
    # <= 75% of raw; on random bytes sleep and wake within 3% of Offload.
    while IFS=$'\t' read -r name status detail; do
      result "$name" "$status" "$detail"
      [ "$status" = FAIL ] && rc=1
    done < <(python3 - "$out.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
def row(name, ok, detail):
    print(f"{name}\t{'PASS' if ok else 'FAIL'}\t{detail}")
for r in doc["rows"]:
    d = r["dataset"]
    if d.startswith("random"):
        row("codec: random bytes within 3% of Offload",
            r["sleep_vs_offload"] >= 0.97 and r["wake_vs_offload"] >= 0.97,
            f"sleep {r['sleep_vs_offload']:.3f}x, wake {r['wake_vs_offload']:.3f}x Offload (>= 0.97)")
    elif r["layout"] == "half" and ("BF16" in d or "bf16" in d):
        short = d.split(" (")[0][-60:]
        row(f"codec: {short}: wake >= 1.3x link", r["wake_vs_link"] >= 1.3, f"{r['wake_vs_link']:.3f}x")
        row(f"codec: {short}: sleep >= 1.2x link", r["sleep_vs_link"] >= 1.2, f"{r['sleep_vs_link']:.3f}x")
        row(f"codec: {short}: backup <= 75%", r["backup_ratio"] <= 0.75, f"{100 * r['backup_ratio']:.1f}%")
    # A sleep into an empty arena pins its backup (the median of three per
    # policy): compressed must not lose to Offload there.
    row(f"codec: {d.split(' (')[0][-60:]}: first sleep not slower than Offload's",
        r["first_sleep_vs_offload"] >= 0.97,
        f"{r['first_sleep_vs_link']:.3f}x link, Offload {r['first_sleep_offload_vs_link']:.3f}x "
        f"({r['first_sleep_vs_offload']:.3f}x Offload, >= 0.97)")
PY
    )
    result "codec: bench rows" INFO "$(grep -E '^(checkpoint|synthetic|random)' "$out.txt" | cut -c1-160 | tr '\n' ' ')"
    result "codec: sweep (frame MiB x ring)" INFO "$(grep -E '^sweep (best|chosen)' "$out.txt" | tr '\n' ' ')"
  else
    result "codec: bench against raw Offload" FAIL "exit $t; see codec-bench.txt"
    rc=1
  fi
fi
exit $rc
