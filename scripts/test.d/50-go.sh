#!/usr/bin/env bash
# Go: vet, go test -race, go test with GOGC=1 (finalizers and KeepAlive under
# constant collection), and the Go example.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v go >/dev/null || { echo "go is required for this part (apt-get install golang-go)" >&2; exit 1; }
source scripts/lib-env.sh
export CGO_ENABLED=1 CGO_LDFLAGS="-L$VMMW_LIB_DIR -Wl,-rpath,$VMMW_LIB_DIR"
(cd bindings/go && go vet ./... && go test -race -count=1 ./... && GOGC=1 go test -count=1 ./...)
(cd examples/go && go vet ./... && go run .)
