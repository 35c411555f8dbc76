#!/usr/bin/env bash
# Go: vet, go test -race, go test with GOGC=1 (finalizers and KeepAlive under
# constant collection), a vendored build, the Go example, and the go-swap
# service (its test builds it with -race and drives it over HTTP; its proxy
# mode's tests need vmmw and the interposer, built here), and the GPU swap
# bench (examples/go-swap/bench/llama_swap_bench.py) run dry on stand-in
# servers, so the harness part 89 runs is known to work. The package
# finds the library through pkg-config, as it does for users; here a .pc file
# points at the repository's header and the freshly built library.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v go >/dev/null || { echo "go is required for this part (apt-get install golang-go)" >&2; exit 1; }
source scripts/lib-env.sh
pc=$(mktemp -d)
trap 'rm -rf "$pc"' EXIT
cat >"$pc/vmmweights.pc" <<PC
Name: vmmweights
Description: vmmweights from the source tree
Version: $(sed -n 's/^#define VMMW_VERSION_STRING "\(.*\)"/\1/p' include/vmmweights.h)
Libs: -L$VMMW_LIB_DIR -lvmmweights -Wl,-rpath,$VMMW_LIB_DIR
Cflags: -I$PWD/include
PC
export CGO_ENABLED=1 PKG_CONFIG_PATH="$pc"
# -tags vmmw_testing adds the host backend's testing hooks (vmmweights_testing.h);
# the plain vet proves the package builds without them, as users get it.
(cd bindings/go && go vet ./... && go vet -tags vmmw_testing ./... \
  && go test -tags vmmw_testing -race -count=1 ./... && GOGC=1 go test -tags vmmw_testing -count=1 ./...)
(cd examples/go && go vet ./... && go run .)
echo "--- the model-swapping service, built and driven as a process (host backend)"
# Its proxy mode runs stand-in servers under the interposer with `vmmw exec`
# (the same build as 32-preload.sh's, so one after the other builds once).
cargo build -p vmmweights -p vmmw-preload --features vmmweights/cli --quiet
export VMMW_BIN="$VMMW_LIB_DIR/vmmw" VMMW_PRELOAD_LIB="$VMMW_LIB_DIR/libvmmw_preload.so"
(cd examples/go-swap && go vet ./... && go test -count=1 ./...)
echo "--- the GPU swap bench's harness on stand-in servers (a dry run: every pair of policies, requests during swaps, prompt caches)"
(cd examples/go-swap && go build -o "$pc/go-swap" .)
bash scripts/build-preload-standin.sh "$pc/standin" >/dev/null
head -c 1048576 /dev/zero >"$pc/standin.gguf"
VMMW_BACKEND=host python3 examples/go-swap/bench/llama_swap_bench.py --service "$pc/go-swap" --vmmw "$VMMW_BIN" \
  --llama-server "$pc/standin/llama-server" --gguf "$pc/standin.gguf" --assume-link 20:20:80e9 --out "$pc/llama-swap.json" \
  | grep -vE "^[0-9]{4}/[0-9]{2}/[0-9]{2} "
echo "--- without cgo: one error that names the fix"
if said=$(cd bindings/go && CGO_ENABLED=0 go build ./... 2>&1); then
  echo "the package built with CGO_ENABLED=0" >&2; exit 1
fi
grep -q "requires_cgo" <<<"$said" || { echo "CGO_ENABLED=0 build says: $said" >&2; exit 1; }
echo "--- go doc shows the constants' values"
said=$(cd bindings/go && go doc -all ./vmmw)
if grep -n "= C\." <<<"$said"; then echo "go doc shows C expressions instead of values" >&2; exit 1; fi
echo "--- vendored: the example builds from a vendor/ copy of the module"
cp -r examples/go "$pc/example" && rm -f "$pc/example/go.sum"
sed -i "s|=> ../../bindings/go|=> $PWD/bindings/go|" "$pc/example/go.mod"
(cd "$pc/example" && go mod vendor && go build -mod=vendor -o "$pc/example-bin" . && "$pc/example-bin" >/dev/null)
