#!/usr/bin/env bash
# Installs what is missing, checks the rules a tool can check
# (scripts/lint.sh: clang-format, clang-tidy with clang's -Wthread-safety), builds
# dlock and runs every test: under ASan+UBSan, under TSan, and in the normal
# build.
#
#   scripts/test.sh            everything
#   scripts/test.sh --quick    the normal build only
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1

scripts/install-deps.sh
jobs=$(nproc)

run_suite() {  # run_suite BUILD_DIR CMAKE_ARGS...
  local dir=$1; shift
  echo "==> building $dir" >&2
  cmake -S . -B "$dir" -DDLOCK_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j"$jobs"
  echo "==> testing $dir" >&2
  (cd "$dir" && ctest --output-on-failure -j2 --timeout 600)
}

status=0
if [ $quick -eq 0 ]; then
  echo "==> lint" >&2
  scripts/lint.sh build-clang || status=1
  run_suite build-asan -DCMAKE_BUILD_TYPE=Debug -DDLOCK_SANITIZE=address,undefined || status=1
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    run_suite build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDLOCK_SANITIZE=thread || status=1
fi
# Last, so that its summary closes the output. This build alone also runs the
# packaging tests (ctest -L package): the install tree, the static,
# add_subdirectory and pkg-config consumers, and the .deb, which is installed
# on this machine and removed again; its prefix is /usr, as a Debian
# package's is.
run_suite build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDLOCK_PACKAGE_TESTS=ON -DCMAKE_INSTALL_PREFIX=/usr || status=1
exit $status
