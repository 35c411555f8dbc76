#!/usr/bin/env bash
# Python: build the wheel with maturin from this tree, install it into a fresh
# virtual environment, and run the package's tests on the host backend from
# outside the source folder (so the installed package, with the library it
# carries, is what gets imported). The PyTorch tests (tests/torch) run too and
# skip, with the reason, where PyTorch or a GPU is missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v python3 >/dev/null || { echo "python3 is required for this part" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip install --quiet "maturin>=1.5,<2" cffi pytest
echo "--- maturin build"
# python/Cargo.toml re-exports the crate; the shared target dir reuses the dependencies built above.
(cd python && CARGO_TARGET_DIR="$PWD/../target" "$work/venv/bin/maturin" build --interpreter "$py" --out "$work/dist") >"$work/maturin.log" 2>&1 \
  || { cat "$work/maturin.log"; exit 1; }
tail -2 "$work/maturin.log"
wheel=$(ls "$work"/dist/vmmweights-*.whl)
"$py" -c 'import sys, zipfile; n = zipfile.ZipFile(sys.argv[1]).namelist(); sys.exit(0 if "vmmweights/vmmweights/libvmmweights.so" in n else "the wheel lacks libvmmweights.so: %s" % n)' "$wheel"
"$py" -m pip install --quiet "$wheel"
echo "--- installed: $("$py" -c 'import vmmweights as v; print(v.__file__, v.library_path(), v.version())')"
(cd "$work" && env -u VMMW_LIB "$py" -c '
import sys, vmmweights
path = vmmweights.library_path()
assert path.startswith(sys.prefix), f"library {path} is not the one in the installed package"
try:
    import vmmweights.torch
except ImportError as e:
    print("vmmweights.torch needs PyTorch:", e)
')
echo "--- pytest (host backend)"
set +e
(cd "$work" && env -u VMMW_LIB VMMW_BACKEND=host "$py" -m pytest -q -rs -p no:cacheprovider \
  "$OLDPWD/python/tests" "$OLDPWD/tests/torch")
rc=$?
set -e
# 5: no test collected; the torch tests alone may all skip on a machine without PyTorch.
if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
