#!/usr/bin/env bash
# C ABI: header drift check, C tests under ASan+UBSan (as C and as C++), and
# the C example.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/install-lib.sh
vmmw_need_cargo_tool cbindgen cbindgen 0.29.4
bash scripts/check-header.sh

source scripts/lib-env.sh
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
san=(-g -O1 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
link=(-L"$VMMW_LIB_DIR" -lvmmweights -Wl,-rpath,"$VMMW_LIB_DIR")
warn=(-Wall -Wextra -Werror)
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
for t in tests/c/test_*.c; do
  name=$(basename "$t" .c)
  gcc -std=c11 "${warn[@]}" -Wpedantic "${san[@]}" -Iinclude "$t" -o "$out/$name-c" "${link[@]}"
  g++ -x c++ -std=c++17 "${warn[@]}" "${san[@]}" -Iinclude "$t" -o "$out/$name-cxx" "${link[@]}"
  echo "--- $name (C)";   "$out/$name-c"
  echo "--- $name (C++)"; "$out/$name-cxx"
done

# Host-memory misuse cases: a plain build (the sanitizers reserve terabytes
# of address space) under an address-space limit, so running out of host
# memory is real and must come back as VMMW_HOST_OUT_OF_MEMORY, not a kill.
gcc -std=c11 "${warn[@]}" -g -O1 -Iinclude tests/c/test_misuse.c -o "$out/test_misuse-plain" "${link[@]}"
echo "--- test_misuse memory (plain build, ulimit -v 3 GiB)"
(ulimit -v $((3 << 20)); "$out/test_misuse-plain" memory)

echo "--- examples/c"
gcc -std=c11 "${warn[@]}" "${san[@]}" -Iinclude examples/c/main.c -o "$out/example-c" "${link[@]}"
"$out/example-c"

echo "--- examples/gguf-runtime"
gcc -std=c11 "${warn[@]}" -Wpedantic "${san[@]}" -Iinclude examples/gguf-runtime/main.c -o "$out/example-gguf-runtime" "${link[@]}"
"$out/example-gguf-runtime"

echo "--- examples/share (two processes)"
bash examples/share/run.sh
