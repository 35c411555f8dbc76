#!/usr/bin/env bash
# Fuzzing: each cargo-fuzz target in fuzz/ runs for a bounded time
# (VMMW_FUZZ_SECONDS per target, default 15: the whole test command stays
# under 20 minutes on 2 cores; 0 skips) starting from the seed
# corpus (fuzz/corpus/<target>/) and every crash kept (fuzz/regressions/<target>/).
# Inputs the run discovers go to a scratch folder, so the committed corpus
# only changes by hand. A crash fails this part; libFuzzer leaves the input in
# fuzz/artifacts/<target>/ — fix the bug, then copy the input into
# fuzz/regressions/<target>/ so tests/all/fuzz_corpus.rs replays it on stable.
# Needs the nightly toolchain and cargo-fuzz, installed when missing (skips
# with the reason when they cannot be).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${VMMW_FUZZ_SECONDS:-15}
if [ "$secs" = 0 ]; then
  echo "SKIP fuzz: VMMW_FUZZ_SECONDS=0"
  exit 0
fi
source scripts/install-lib.sh
if ! vmmw_need_toolchain nightly || ! vmmw_need_cargo_tool cargo-fuzz cargo-fuzz 0.13.2; then
  echo "SKIP fuzz: nightly or cargo-fuzz could not be installed;" \
    "the corpus and regressions still replay on stable in tests/all/fuzz_corpus.rs"
  exit 0
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cargo +nightly fuzz build --fuzz-dir fuzz
for t in safetensors_header gguf_header gguf_metadata index rules planner share_manifest share_client share_server codec_frame packed_header; do
  mkdir -p "$scratch/$t"
  dirs=("fuzz/corpus/$t")
  [ -d "fuzz/regressions/$t" ] && dirs+=("fuzz/regressions/$t")
  log="$scratch/$t.log"
  if ! cargo +nightly fuzz run --fuzz-dir fuzz "$t" "$scratch/$t" "${dirs[@]}" -- \
      -max_total_time="$secs" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz target $t FAILED; the input is in fuzz/artifacts/$t/" >&2
    exit 1
  fi
  runs=$(awk '/^stat::number_of_executed_units/ {print $2}' "$log")
  cov=$(awk '/DONE/ {for (i = 1; i < NF; i++) if ($i == "cov:") c = $(i + 1)} END {print c}' "$log")
  echo "fuzz $t: ${runs:-?} inputs in ${secs}s, no crash (coverage ${cov:-?} edges, corpus $(ls "$scratch/$t" | wc -l) new)"
done
