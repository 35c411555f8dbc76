#!/usr/bin/env bash
# Builds the C library, libvmmweights.so (with its SONAME, and a link of
# that name to it) and
# libvmmweights.a, into <target>/<profile dir>/. The crate's manifest lists
# only the rlib, so a Rust crate that depends on vmmweights builds neither
# (a debug build would write a 70 MB shared and a 180 MB static library it
# never links); the C artifacts are asked for here, by every build that
# ships or tests them (CMake, scripts/lib-env.sh, the GPU bundle).
# Usage: scripts/build-clib.sh [cargo options, e.g. --release or --profile dev]
# ($CARGO, when set, is the cargo to run.)
#
# The SONAME carries the ABI line programs record: before 1.0 each minor
# version is its own ABI (libvmmweights.so.0.1), from 1.0 the major
# (libvmmweights.so.1).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n '/^\[package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml | head -n1)
IFS=. read -r major minor _ <<<"$version"
if [[ $major == 0 ]]; then soname="libvmmweights.so.0.$minor"; else soname="libvmmweights.so.$major"; fi
"${CARGO:-cargo}" rustc --lib --crate-type cdylib,staticlib "$@" -- -C "link-arg=-Wl,-soname,$soname"

# The SONAME is the name programs linked against the library look for at
# run time: a link of that name beside it, so they run without a hand-made one.
profile=debug target=${CARGO_TARGET_DIR:-}
while [ $# -gt 0 ]; do
  case $1 in
    --release | -r) profile=release ;;
    --profile) profile=$2; shift ;;
    --profile=*) profile=${1#--profile=} ;;
    --target-dir) target=$2; shift ;;
    --target-dir=*) target=${1#--target-dir=} ;;
  esac
  shift
done
[ "$profile" = dev ] && profile=debug
[ -n "$target" ] || target=$("${CARGO:-cargo}" metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
if [ -f "$target/$profile/libvmmweights.so" ]; then
  ln -sf libvmmweights.so "$target/$profile/$soname"
fi
