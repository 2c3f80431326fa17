#!/usr/bin/env bash
# The rules a tool can check (CONTRIBUTING.md): clang-format, and clang-tidy
# over src/ and tools/cli/ (cognitive complexity <= 40, naming, and clang's
# own warnings as errors, -Wthread-safety over the annotated locking
# included).
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

# clang-tidy runs clang's front end with each file's compile command, so its
# clang-diagnostic-* checks (.clang-tidy) report what a clang build with
# -Wthread-safety -Werror would, -Wthread-safety included: no separate clang
# build, only the generated headers the sources include.
echo "==> clang-tidy, with clang's warnings (-Wthread-safety) as errors ($dir)" >&2
cmake -S . -B "$dir" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug -DDLOCK_WERROR=ON \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DDLOCK_BUILD_TESTS=OFF -DDLOCK_BUILD_BENCH=OFF \
  -DDLOCK_BUILD_EXAMPLES=OFF >/dev/null
if cmake --build "$dir" --target help | grep dlock_etcd_proto_generated >/dev/null; then
  cmake --build "$dir" --target dlock_etcd_proto_generated || status=1
fi

mapfile -t checked < <(git ls-files 'src/*.cpp' 'tools/cli/*.cpp')
if ! run-clang-tidy -quiet -p "$dir" -j"$(nproc)" "${checked[@]/#/$PWD/}" >"$dir/clang-tidy.log" 2>&1; then
  grep -E 'warning:|error:' -A3 "$dir/clang-tidy.log" >&2 || cat "$dir/clang-tidy.log" >&2
  echo "lint: clang-tidy found the problems above" >&2
  status=1
fi
exit $status
