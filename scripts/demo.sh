#!/usr/bin/env bash
# Installs what is missing, builds dlock, and runs the demo: several
# processes contend for one lock on the embedded file:// store.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target dlock-demo >/dev/null
exec build/tools/dlock-demo "$@"
