#!/usr/bin/env bash
# Generates the C headers from src/ffi with cbindgen, adding version macros
# read from Cargo.toml:
#   include/vmmweights.h          the public API (cbindgen.toml)
#   include/vmmweights_testing.h  the host backend's testing hooks (cbindgen-testing.toml)
#   include/vmmw_preload.h        the CUDA runtime interposer's own calls
#                                 (cbindgen-preload.toml, from preload/src/api.rs)
# Usage: scripts/gen-header.sh [OUT [OUT_TESTING [OUT_PRELOAD]]] (defaults: the paths above).
# cbindgen is pinned: its point releases change the output.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-include/vmmweights.h}"
out_testing="${2:-include/vmmweights_testing.h}"
out_preload="${3:-include/vmmw_preload.h}"
want_cbindgen=0.29.4
command -v cbindgen >/dev/null || { echo "cbindgen missing: cargo install cbindgen --version $want_cbindgen --locked" >&2; exit 1; }
have=$(cbindgen --version | awk '{print $2}')
[[ "$have" == "$want_cbindgen" ]] || { echo "cbindgen $have found, the headers are made with $want_cbindgen: cargo install cbindgen --version $want_cbindgen --locked --force" >&2; exit 1; }

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
  printf '#define VMMW_VERSION_STRING "%s"\n' "$version"
  cat <<'C'

/**
 * VMMW_DEPRECATED(msg) marks a declaration that a later major version
 * removes; compilers warn at each use. Define it yourself (empty) before
 * including this header to silence the warnings.
 */
#ifndef VMMW_DEPRECATED
#if defined(__GNUC__) || defined(__clang__)
#define VMMW_DEPRECATED(msg) __attribute__((deprecated(msg)))
#elif defined(_MSC_VER)
#define VMMW_DEPRECATED(msg) __declspec(deprecated(msg))
#else
#define VMMW_DEPRECATED(msg)
#endif
#endif
#ifndef __cplusplus
/**
 * Option structs start with their own size, so a later version can add fields
 * at the end without breaking programs built against this header: the
 * library reads `size` bytes and takes the default (0) for every field past
 * them. Start from these initializers (every other field 0 = default):
 *
 *     vmmw_load_options_t o = VMMW_LOAD_OPTIONS_INIT;
 *     o.strategy = VMMW_COPY_DIRECT;
 *
 * In C++, value-initialize and set size: `vmmw_load_options_t o{}; o.size = sizeof o;`
 * (vmmweights.hpp does this for you).
 */
#define VMMW_POOL_OPTIONS_INIT { .size = sizeof(vmmw_pool_options_t) }
#define VMMW_LOAD_OPTIONS_INIT { .size = sizeof(vmmw_load_options_t) }
#define VMMW_SLEEP_OPTIONS_INIT { .size = sizeof(vmmw_sleep_options_t) }
#define VMMW_SHARE_OPTIONS_INIT { .size = sizeof(vmmw_share_options_t) }
#define VMMW_REPLICA_WAKE_OPTIONS_INIT { .size = sizeof(vmmw_replica_wake_options_t) }
#define VMMW_REPLICA_SLEEP_OPTIONS_INIT { .size = sizeof(vmmw_replica_sleep_options_t) }
#define VMMW_UPDATE_OPTIONS_INIT { .size = sizeof(vmmw_update_options_t) }
#define VMMW_WAKE_OPTIONS_INIT { .size = sizeof(vmmw_wake_options_t) }
#define VMMW_SWAP_OPTIONS_INIT { .size = sizeof(vmmw_swap_options_t) }
#define VMMW_PACK_OPTIONS_INIT { .size = sizeof(vmmw_pack_options_t) }
#endif
C
  printf '"""\n'
  cat cbindgen.toml
} >"$config"
cbindgen --quiet --config "$config" --output "$out" src/ffi/mod.rs
cbindgen --quiet --config cbindgen-testing.toml --output "$out_testing" src/ffi/testing.rs
cbindgen --quiet --config cbindgen-preload.toml --output "$out_preload" preload/src/api.rs
