#!/usr/bin/env bash
# Features: a crate that depends on vmmweights with default features, as a
# library user's does, pulls in none of the command line's crates (clap,
# indicatif, plotters); with `features = ["cli"]` it does, so the check
# cannot pass by looking at the wrong thing. And the library target is an
# rlib only: cargo builds every crate-type of a dependency, so a cdylib or
# staticlib there would cost every user's build 250 MB it never links
# (scripts/build-clib.sh builds the C library).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
consumer() {  # $1: the dependency's extra TOML
  rm -rf "$work/consumer" && mkdir -p "$work/consumer/src"
  cat >"$work/consumer/Cargo.toml" <<TOML
[package]
name = "consumer"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
vmmweights = { path = "$repo"$1 }
TOML
  echo 'fn main() { let _ = vmmweights::units::parse_bytes("1G"); }' >"$work/consumer/src/main.rs"
  cp "$repo/Cargo.lock" "$work/consumer/Cargo.lock"  # the versions this repository tests
  (cd "$work/consumer" && cargo tree --quiet -e normal,build --prefix none --format '{p}') | awk '{print $1}' | sort -u
}
cli_crates='^(clap|indicatif|plotters)$'
plain=$(consumer "")
if found=$(grep -E "$cli_crates" <<<"$plain"); then
  echo "a default-features dependency on vmmweights pulls in: $(echo $found)" >&2; exit 1
fi
with_cli=$(consumer ', features = ["cli"]')
[[ $(grep -cE "$cli_crates" <<<"$with_cli") == 3 ]] \
  || { echo "with the cli feature, cargo tree lacks clap, indicatif or plotters:" >&2; echo "$with_cli" >&2; exit 1; }
kinds=$(cd "$repo" && cargo metadata --format-version 1 --no-deps | python3 -c '
import json, sys
p = [p for p in json.load(sys.stdin)["packages"] if p["name"] == "vmmweights"][0]
print(" ".join(t for tg in p["targets"] if "lib" in tg["kind"] or "rlib" in tg["kind"] for t in tg["crate_types"]))')
[[ "$kinds" == "lib" || "$kinds" == "rlib" ]] || { echo "the library target builds crate types '$kinds', want rlib only" >&2; exit 1; }
echo "features: a default dependency builds $(wc -l <<<"$plain") crates, none of clap, indicatif, plotters (the cli feature adds them)"
