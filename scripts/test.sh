#!/usr/bin/env bash
# Installs what is missing, checks the rules a tool can check
# (scripts/lint.sh: clang-format, clang-tidy with clang's -Wthread-safety), builds
# dlock and runs every test: under ASan+UBSan, under TSan, and in the normal
# build.
#
#   scripts/test.sh                    everything
#   scripts/test.sh --quick            the normal build only
#   scripts/test.sh --discard-builds   everything, and each build directory is
#                                      deleted once its tests have run (CI:
#                                      the three builds at once took more disk
#                                      than a CI machine had)
#
# The builds carry line tables only (-g1): enough for the sanitizers' reports
# and gdb's backtraces, at a quarter of the disk and link time of -g. Build by
# hand (README, "Building") for full debug information.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
discard=0
for arg in "$@"; do
  case $arg in
    --quick) quick=1 ;;
    --discard-builds) discard=1 ;;
    *) echo "usage: scripts/test.sh [--quick] [--discard-builds]" >&2; exit 2 ;;
  esac
done

stamp() { printf '==> %s (%dm%02ds)\n' "$1" $((SECONDS / 60)) $((SECONDS % 60)) >&2; }

scripts/install-deps.sh
jobs=$(nproc)

# run_suite BUILD_DIR CMAKE_ARGS...: builds, then tests, and fails if either
# does (a failed build is not tested).
run_suite() {
  local dir=$1 status=0; shift
  stamp "building $dir"
  cmake -S . -B "$dir" -DDLOCK_WERROR=ON -DCMAKE_CXX_FLAGS_DEBUG=-g1 \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" "$@" >/dev/null || return 1
  cmake --build "$dir" -j"$jobs" || return 1
  stamp "testing $dir"
  (cd "$dir" && ctest --output-on-failure -j2 --timeout 600) || status=1
  if [ $discard -eq 1 ]; then
    stamp "deleting $dir ($(du -sh "$dir" | cut -f1))"
    rm -rf "$dir"
  fi
  return $status
}

status=0
if [ $quick -eq 0 ]; then
  stamp lint
  scripts/lint.sh build-clang || status=1
  [ $discard -eq 0 ] || rm -rf build-clang
  # Without ASan's instrumentation of globals: with GCC it pads UBSan's own
  # per-check data as well, which made every test binary 150 MB (5 GB for
  # the tree; 2.2 MB instead of 3.2 MB per object). dlock has no global
  # state for it to guard; heap, stack and use-after-free checks stay.
  run_suite build-asan -DCMAKE_BUILD_TYPE=Debug -DDLOCK_SANITIZE=address,undefined \
    -DCMAKE_CXX_FLAGS=--param=asan-globals=0 || status=1
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    run_suite build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDLOCK_SANITIZE=thread || status=1
fi
# Last, so that its summary closes the output. This build alone also runs the
# packaging tests (ctest -L package): the install tree, the static,
# add_subdirectory and pkg-config consumers, and the .deb, which is installed
# on this machine and removed again; its prefix is /usr, as a Debian
# package's is.
run_suite build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDLOCK_PACKAGE_TESTS=ON -DCMAKE_INSTALL_PREFIX=/usr || status=1
stamp "done, status $status"
exit $status
