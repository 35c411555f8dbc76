# Sourced by the C, C++ and Go test parts: builds the C library (debug
# profile, scripts/build-clib.sh) and exports where it is.
#   VMMW_LIB_DIR  directory holding libvmmweights.so/.a
# The shared library's SONAME (libvmmweights.so.0.1) is a link there (made by
# build-clib.sh), so programs linked against it find it through -rpath.
bash "$(dirname "${BASH_SOURCE[0]}")/build-clib.sh" --quiet
VMMW_LIB_DIR="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug"
soname=$(readelf -d "$VMMW_LIB_DIR/libvmmweights.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[[ -n "$soname" ]] || { echo "libvmmweights.so has no SONAME" >&2; exit 1; }
[[ -L "$VMMW_LIB_DIR/$soname" ]] || { echo "build-clib.sh made no $soname link" >&2; exit 1; }
export VMMW_LIB_DIR
export VMMW_BACKEND=host
