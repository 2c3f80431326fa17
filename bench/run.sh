#!/usr/bin/env bash
# The benchmarks, in one command (see docs/benchmarks.md):
#
#   bench/run.sh [--quick]
#
# Builds dlock-bench (RelWithDebInfo like scripts/test.sh, in build-bench/,
# one job, niced), starts private servers the way the tests do
# (tests/servers/*.sh: a free port, no persistence, stopped afterwards), runs
# every scenario on mem://, file:// (tmpfs and disk) and each server's
# store, with the peers (redis-py, kazoo) and the protocol floors on the same
# servers, prints a table, and writes bench/results/latest.json and
# bench/results/latest.svg.
# --quick: a short run (seconds, small counts), to check that it all works;
# it writes bench/results/quick.{json,svg} and leaves latest.* alone.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DLOCK_BENCH_BUILD:-$root/build-bench}
quick=()
[ "${1:-}" = "--quick" ] && quick=(--quick)

# The peers need Debian's python3-redis / python3-kazoo: use Debian's python.
python=/usr/bin/python3
[ -x "$python" ] || python=python3

nice cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDLOCK_BUILD_TESTS=OFF >/dev/null
nice cmake --build "$build" -j1 --target dlock-bench >/dev/null

# Each server script (tests/servers/*.sh run DIR) starts its server, appends
# its URL to DLOCK_TEST_URLS, runs the rest of the chain under it, and stops
# the server on every exit path.
chain=()
if command -v redis-server >/dev/null; then
  chain+=("$root/tests/servers/redis.sh" run "$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench-redis-XXXXXX")")
fi
# ZooKeeper when the zk:// store is built (its C client was found).
if grep -q '^DLOCK_ZOOKEEPER_LIBRARY:FILEPATH=/' "$build/CMakeCache.txt" &&
  ! grep -q '^DLOCK_WITH_ZOOKEEPER:STRING=OFF' "$build/CMakeCache.txt"; then
  zkdir=$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench-zk-XXXXXX")
  chain+=("$root/tests/servers/zookeeper.sh" run "$zkdir")
fi

DLOCK_TEST_URLS="" exec nice "${chain[@]}" "$python" "$root/bench/run_bench.py" \
  --bench "$build/bench/dlock-bench" --command "bench/run.sh" "${quick[@]}"
