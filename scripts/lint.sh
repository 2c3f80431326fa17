#!/usr/bin/env bash
# The rules a tool can check (CONTRIBUTING.md): clang-format, a clang build
# with -Wthread-safety -Werror over the annotated locking, and clang-tidy
# (cognitive complexity <= 40, naming) over src/ and tools/cli/.
#
#   scripts/lint.sh [BUILD_DIR]     default build-clang
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-clang}
status=0

echo "==> clang-format" >&2
mapfile -t sources < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.cc')
if ! clang-format --dry-run --Werror "${sources[@]}"; then
  echo "lint: run clang-format -i on the files above" >&2
  status=1
fi

echo "==> clang build with -Wthread-safety -Werror ($dir)" >&2
cmake -S . -B "$dir" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug -DDLOCK_WERROR=ON \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DDLOCK_BUILD_TESTS=OFF -DDLOCK_BUILD_BENCH=OFF \
  -DDLOCK_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$dir" -j"$(nproc)" || status=1

echo "==> clang-tidy" >&2
mapfile -t checked < <(git ls-files 'src/*.cpp' 'tools/cli/*.cpp')
if ! run-clang-tidy -quiet -p "$dir" -j"$(nproc)" "${checked[@]/#/$PWD/}" >"$dir/clang-tidy.log" 2>&1; then
  grep -E 'warning:|error:' -A3 "$dir/clang-tidy.log" >&2 || cat "$dir/clang-tidy.log" >&2
  echo "lint: clang-tidy found the problems above" >&2
  status=1
fi
exit $status
