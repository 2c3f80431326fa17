#!/usr/bin/env bash
# Installs what is missing, builds dlock, and runs the demo: several
# processes contend for one lock on the embedded file:// store. Says what it
# is doing at each step: on a fresh machine the first two take a few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "==> $*" >&2; }

step "checking for the Debian packages dlock needs (scripts/install-deps.sh)"
scripts/install-deps.sh
step "configuring the build in build/"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
step "building dlock-demo (a few minutes the first time; the whole log is build/demo-build.log)"
set +e
cmake --build build -j"$(nproc)" --target dlock-demo 2>&1 | tee build/demo-build.log |
  grep --line-buffered -E '^\[ *[0-9]+%\] (Building|Linking)' | sed -u 's/^/    /'
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  tail -n 40 build/demo-build.log >&2
  step "the build failed (exit $rc); the whole log is build/demo-build.log"
  exit "$rc"
fi
step "running build/tools/dlock-demo $*"
exec build/tools/dlock-demo "$@"
