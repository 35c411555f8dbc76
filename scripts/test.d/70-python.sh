#!/usr/bin/env bash
# Python: build the wheel with maturin from this tree, install it into a fresh
# virtual environment, and run the package's tests on the host backend from
# outside the source folder (so the installed package, with the library it
# carries, is what gets imported). The PyTorch tests (tests/torch) run too and
# skip, with the reason, where PyTorch or a GPU is missing. The wheel carries
# the `vmmw` command line: the installed `vmmw` console script and
# `python -m vmmweights` run it, and the package passes mypy --strict.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v python3 >/dev/null || { echo "python3 is required for this part" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install --quiet --upgrade pip
# gguf: llama.cpp's GGUF writer and reader, the test data of python/tests/test_gguf.py.
"$py" -m pip install --quiet "maturin>=1.5,<2" cffi pytest mypy "gguf==0.19.0"
echo "--- mypy --strict"
(cd python && "$work/venv/bin/mypy" --strict --cache-dir=/dev/null -p vmmweights)
echo "--- vmmw for the wheel"
cargo build --quiet --features cli --bin vmmw
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
mkdir -p python/vmmweights/bin
install -m 755 "$target/debug/vmmw" python/vmmweights/bin/vmmw
echo "--- maturin build"
# python/Cargo.toml re-exports the crate; the shared target dir reuses the dependencies built above.
(cd python && CARGO_TARGET_DIR="$PWD/../target" "$work/venv/bin/maturin" build --interpreter "$py" --out "$work/dist") >"$work/maturin.log" 2>&1 \
  || { cat "$work/maturin.log"; exit 1; }
tail -2 "$work/maturin.log"
wheel=$(ls "$work"/dist/vmmweights-*.whl)
"$py" - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for need in ("vmmweights/vmmweights/libvmmweights.so", "vmmweights/bin/vmmw", "vmmweights/__main__.py"):
    if need not in names:
        sys.exit(f"the wheel lacks {need}: {names}")
stray = [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
if stray:
    sys.exit(f"the wheel carries files the package never uses: {stray}")
if not any(n.endswith("entry_points.txt") for n in names):
    sys.exit("the wheel declares no console script")
PY
"$py" -m pip install --quiet "$wheel"
echo "--- the vmmw console script and python -m vmmweights, from the fresh venv"
version=$("$py" -c 'import vmmweights; print(vmmweights.version())')
said=$(cd "$work" && env -u VMMW_LIB "$work/venv/bin/vmmw" --version)
[[ "$said" == "vmmw $version" ]] || { echo "vmmw --version says '$said', want 'vmmw $version'" >&2; exit 1; }
said=$(cd "$work" && env -u VMMW_LIB "$py" -m vmmweights --version)
[[ "$said" == "vmmw $version" ]] || { echo "python -m vmmweights --version says '$said'" >&2; exit 1; }
said=$(cd "$work" && env -u VMMW_LIB VMMW_BACKEND=host "$py" -m vmmweights)
grep -q "^backend: *host" <<<"$said" || { echo "python -m vmmweights diagnosis: $said" >&2; exit 1; }
echo "$said" | sed 's/^/  /'
# A reader that goes away early: exit 0, nothing on stderr.
set +e
(cd "$work" && env -u VMMW_LIB VMMW_BACKEND=host "$work/venv/bin/vmmw" demo 2>"$work/pipe.err" | head -1 >/dev/null; exit "${PIPESTATUS[0]}")
rc=$?
set -e
[[ $rc == 0 && ! -s "$work/pipe.err" ]] || { echo "vmmw demo | head -1: exit $rc, stderr: $(cat "$work/pipe.err")" >&2; exit 1; }
echo "--- installed: $("$py" -c 'import vmmweights as v; print(v.__file__, v.library_path(), v.version())')"
(cd "$work" && env -u VMMW_LIB "$py" -c '
import sys, vmmweights
path = vmmweights.library_path()
assert path.startswith(sys.prefix), f"library {path} is not the one in the installed package"
import vmmweights.vmmweights  # the loader maturin generates imports too
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
