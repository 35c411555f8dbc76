#!/usr/bin/env bash
# Generates the C header from src/ffi with cbindgen, adding version macros read
# from Cargo.toml. Usage: scripts/gen-header.sh [OUT] (default include/vmmweights.h).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-include/vmmweights.h}"
command -v cbindgen >/dev/null || { echo "cbindgen missing: cargo install cbindgen --locked" >&2; exit 1; }

version=$(sed -n '/^\[package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml | head -n1)
IFS=. read -r major minor patch <<<"${version%%-*}"
[[ -n "$major" && -n "$minor" && -n "$patch" ]] || { echo "cannot parse version '$version' from Cargo.toml" >&2; exit 1; }

config=$(mktemp)
trap 'rm -f "$config"' EXIT
# after_includes must be a top-level key, so it goes before the first table.
{
  printf 'after_includes = """\n'
  printf '/** Version of the header (compare with vmmw_version_string() at run time). */\n'
  printf '#define VMMW_VERSION_MAJOR %s\n#define VMMW_VERSION_MINOR %s\n#define VMMW_VERSION_PATCH %s\n' "$major" "$minor" "$patch"
  printf '#define VMMW_VERSION_STRING "%s"\n"""\n' "$version"
  cat cbindgen.toml
} >"$config"
cbindgen --quiet --config "$config" --output "$out" src/ffi/mod.rs
