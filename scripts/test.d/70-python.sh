#!/usr/bin/env bash
# Python: build the wheel from this tree as `pip install ./python` does
# (maturin for the command line, python/build.rs for the library), install it with a plain
# `pip install ./python` into a fresh virtual environment, and run the package's tests on the host backend from
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
"$py" -m pip install --quiet pytest mypy "gguf==0.19.0"
echo "--- mypy --strict"
(cd python && "$work/venv/bin/mypy" --strict --cache-dir=/dev/null -p vmmweights)
# What a plain `pip install ./python` runs: python/build_backend.py (maturin's
# hooks, building into the repository's target/ and tagging the wheel with
# the manylinux policy its binaries meet), maturin builds the `vmmw` command
# line (python/Cargo.toml) and python/build.rs the C library the package
# opens (here in the dev profile, so what other parts built is reused).
# Nothing is copied in beforehand: the build makes it.
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
build_env=(env -u CARGO_TARGET_DIR MATURIN_PEP517_ARGS="--profile dev")
echo "--- python/Cargo.toml names the command line's crates as the main crate does"
python3 - <<'PY'
import sys, tomllib
main = tomllib.load(open("Cargo.toml", "rb"))["dependencies"]
py = tomllib.load(open("python/Cargo.toml", "rb"))["dependencies"]
drift = [f"{k}: {py[k]} here, {main[k]} in Cargo.toml" for k in py
         if k != "vmmweights" and {**(main[k] if isinstance(main[k], dict) else {"version": main[k]}), "optional": None}
         != {**(py[k] if isinstance(py[k], dict) else {"version": py[k]}), "optional": None}]
if drift:
    sys.exit("python/Cargo.toml drifted from Cargo.toml: " + "; ".join(drift))
PY
rm -f python/vmmweights/vmmweights/libvmmweights.so
echo "--- pip wheel ./python"
"${build_env[@]}" "$py" -m pip wheel -v --no-deps ./python -w "$work/dist" >"$work/maturin.log" 2>&1 \
  || { cat "$work/maturin.log"; exit 1; }
tail -1 "$work/maturin.log"
wheel=$(ls "$work"/dist/vmmweights-*.whl)
# Built in the repository's target/, not a python/target of its own.
[ ! -d python/target ] || { echo "pip wheel ./python built into python/target, not $target" >&2; exit 1; }
grep -q "Built wheel to $target/wheels/" "$work/maturin.log" \
  || { echo "pip wheel ./python did not build in $target:" >&2; tail -5 "$work/maturin.log" >&2; exit 1; }
# The manylinux tag, and a C library that needs no newer glibc than it says
# (maturin checks the vmmw binary; the library is checked here).
"$py" - "$wheel" "$work/lib.so" <<'PY'
import re, subprocess, sys, zipfile
wheel, lib = sys.argv[1], sys.argv[2]
m = re.search(r"-py3-none-manylinux_2_(\d+)_x86_64\.whl$", wheel)
if not m:
    sys.exit(f"the wheel {wheel} has no manylinux_2_X tag")
with open(lib, "wb") as f:
    f.write(zipfile.ZipFile(wheel).read("vmmweights/vmmweights/libvmmweights.so"))
syms = subprocess.run(["objdump", "-T", lib], check=True, capture_output=True, text=True).stdout
need = max(int(v) for v in re.findall(r"GLIBC_2\.(\d+)", syms))
if need > int(m.group(1)):
    sys.exit(f"libvmmweights.so needs glibc 2.{need}, newer than the wheel's manylinux_2_{m.group(1)}")
print(f"wheel: {wheel.rsplit('/', 1)[-1]} (the C library needs glibc 2.{need} at most)")
PY
"$py" - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for need in ("vmmweights/vmmweights/libvmmweights.so", "vmmweights/__main__.py"):
    if need not in names:
        sys.exit(f"the wheel lacks {need}: {names}")
if not any(n.endswith(".data/scripts/vmmw") for n in names):
    sys.exit(f"the wheel installs no vmmw command: {names}")
# Nothing generated beside the library: it is opened with ctypes.
stray = [n for n in names if "__pycache__" in n or n.endswith(".pyc")
         or n.startswith("vmmweights/vmmweights/") and n != "vmmweights/vmmweights/libvmmweights.so"]
if stray:
    sys.exit(f"the wheel carries files the package never uses: {stray}")
meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
needs = [line for line in zipfile.ZipFile(sys.argv[1]).read(meta).decode().splitlines()
         if line.startswith("Requires-Dist:") and "extra ==" not in line]
if needs:
    sys.exit(f"the wheel requires packages at run time, where it needs none: {needs}")
PY
echo "--- pip install ./python, into the fresh venv"
"${build_env[@]}" "$py" -m pip install --quiet ./python >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
echo "--- the vmmw command and python -m vmmweights, from the fresh venv"
version=$("$py" -c 'import vmmweights; print(vmmweights.version())')
said=$(cd "$work" && env -u VMMW_LIB "$work/venv/bin/vmmw" --version)
[[ "$said" == "vmmw $version" ]] || { echo "vmmw --version says '$said', want 'vmmw $version'" >&2; exit 1; }
said=$(cd "$work" && env -u VMMW_LIB "$py" -m vmmweights --version)
[[ "$said" == "vmmw $version" ]] || { echo "python -m vmmweights --version says '$said'" >&2; exit 1; }
said=$(cd "$work" && env -u VMMW_LIB VMMW_BACKEND=host "$py" -m vmmweights)
grep -q "^backend: *host$" <<<"$said" && grep -q "^device: *0: host" <<<"$said" || { echo "python -m vmmweights diagnosis: $said" >&2; exit 1; }
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
try:
    import vmmweights.torch
except ImportError as e:
    print("vmmweights.torch needs PyTorch:", e)
')
echo "--- pytest (host backend)"
set +e
(cd "$work" && env -u VMMW_LIB VMMW_BACKEND=host "$py" -m pytest -q -rs -p no:cacheprovider \
  "$OLDPWD/python/tests" "$OLDPWD/tests/torch") | tee "$work/pytest.log"
rc=${PIPESTATUS[0]}
set -e
# 5: no test collected; the torch tests alone may all skip on a machine without PyTorch.
if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
# Skipped tests, one summary line per reason (the run's summary shows them).
sed -n 's/^SKIPPED \[\([0-9]*\)\] [^:]*:[0-9]*: \(.*\)$/\1\t\2/p' "$work/pytest.log" \
  | awk -F'\t' '{n[$2] += $1} END {for (r in n) printf "SKIP pytest, %d test(s): %s\n", n[r], r}' | sort
