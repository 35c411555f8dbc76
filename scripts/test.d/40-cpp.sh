#!/usr/bin/env bash
# C++: the wrapper's tests (-Wall -Wextra -Werror, ASan+UBSan, two translation
# units), each header compiled alone, then the CMake package: build, install to
# a prefix, and the find_package consumer (examples/cpp) configured against the
# install prefix and against the build tree, run under ctest.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib-env.sh
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
strict=(-std=c++17 -Wall -Wextra -Werror -Wpedantic -Iinclude -Ibindings/cpp/include -Itests/c)
san=(-g -O1 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
link=(-L"$VMMW_LIB_DIR" -lvmmweights -Wl,-rpath,"$VMMW_LIB_DIR")
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1

echo "--- headers alone"
gcc -std=c99 -Wall -Wextra -Werror -Wpedantic -Iinclude -c tests/cpp/header_alone_c.c -o "$out/h1.o"
g++ -x c++ "${strict[@]}" -c tests/cpp/header_alone_c.c -o "$out/h2.o"
g++ "${strict[@]}" -c tests/cpp/header_alone.cpp -o "$out/h3.o"

echo "--- test_wrapper (2 translation units)"
g++ "${strict[@]}" "${san[@]}" tests/cpp/test_wrapper.cpp tests/cpp/tu_a.cpp -o "$out/test_wrapper" "${link[@]}"
"$out/test_wrapper"

echo "--- CMake package: build, install, find_package consumer"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B "$out/build" "${gen[@]}" -DVMMW_CARGO_PROFILE=dev >/dev/null
cmake --build "$out/build" >/dev/null
cmake --install "$out/build" --prefix "$out/prefix" >/dev/null
for pkg in "$out/prefix" "$out/build"; do
  rm -rf "$out/consumer"
  cmake -S examples/cpp -B "$out/consumer" "${gen[@]}" -DCMAKE_PREFIX_PATH="$pkg" | grep "vmmweights "
  cmake --build "$out/consumer" >/dev/null
  ctest --test-dir "$out/consumer" --output-on-failure
done
echo "--- pkg-config from the install prefix"
PKG_CONFIG_PATH="$out/prefix/lib/pkgconfig" pkg-config --exists --print-errors "vmmweights = $(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["packages"][0]["version"])')"
gcc -std=c11 -Wall -Wextra -Werror examples/c/main.c -o "$out/example-c-pc" \
  $(PKG_CONFIG_PATH="$out/prefix/lib/pkgconfig" pkg-config --cflags --libs vmmweights) -Wl,-rpath,"$out/prefix/lib"
"$out/example-c-pc" >/dev/null
