#!/usr/bin/env bash
# The benchmarks, in one command (see docs/benchmarks.md):
#
#   bench/run.sh [--quick] [--only STORE] [--rounds N] [--election]
#
# Builds dlock-bench (RelWithDebInfo like scripts/test.sh, in build-bench/,
# one job, niced), starts private servers the way the tests do
# (tests/servers/*.sh: a free port, no persistence, stopped afterwards), runs
# every scenario on mem://, file:// (tmpfs and disk) and each server's
# store, with the peers (redis-py, kazoo, Go's concurrency.Mutex) and the
# protocol floors on the same servers, prints a table, and writes
# bench/results/latest.json and bench/results/latest.svg.
# --quick: a short run (seconds, small counts), to check that it all works;
# it writes bench/results/quick.{json,svg} and leaves latest.* alone.
# --only STORE (mem, file, redis, zk, etcd): that store alone, and only its
# server is started; writes bench/results/STORE.{json,svg} (quick-STORE.*
# with --quick) and leaves latest.* alone.
# --rounds N: interleaved rounds of the repeated scenarios (default 3).
# --election: only the election's failover and handover (dlock, and on zk
# Curator's LeaderLatch and kazoo's Election); a full run has them too.
# DLOCK_BENCH_BUILD: the build directory (default build-bench/).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DLOCK_BENCH_BUILD:-$root/build-bench}
args=()
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) args+=(--quick) ;;
    --only) only=$2; args+=(--only "$2"); shift ;;
    --rounds) args+=(--rounds "$2"); shift ;;
    --election) args+=(--election-only) ;;
    *) echo "usage: bench/run.sh [--quick] [--only STORE] [--rounds N] [--election]" >&2; exit 2 ;;
  esac
  shift
done
wants() { [ -z "$only" ] || [ "$only" = "$1" ]; }

# The peers need Debian's python3-redis / python3-kazoo: use Debian's python.
python=/usr/bin/python3
[ -x "$python" ] || python=python3

# ccache when there is one (the shared cache makes a fresh build directory cheap).
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
nice cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDLOCK_BUILD_TESTS=OFF "${launcher[@]}" >/dev/null
nice cmake --build "$build" -j1 --target dlock-bench dlock-bench-participant >/dev/null
args+=(--participant "$build/bench/dlock-bench-participant")

# Each server script (tests/servers/*.sh run DIR) starts its server, appends
# its URL to DLOCK_TEST_URLS, runs the rest of the chain under it, and stops
# the server on every exit path.
chain=()
if wants redis && command -v redis-server >/dev/null; then
  chain+=("$root/tests/servers/redis.sh" run "$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench-redis-XXXXXX")")
fi
# ZooKeeper when the zk:// store is built (its C client was found).
if wants zk && grep -q '^DLOCK_ZOOKEEPER_LIBRARY:FILEPATH=/' "$build/CMakeCache.txt" &&
  ! grep -q '^DLOCK_WITH_ZOOKEEPER:STRING=OFF' "$build/CMakeCache.txt"; then
  zkdir=$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench-zk-XXXXXX")
  chain+=("$root/tests/servers/zookeeper.sh" run "$zkdir")
  # Curator's LeaderLatch, the election peer, when Debian's
  # libcurator-recipes-java and a JDK are installed.
  if command -v javac >/dev/null && [ -f /usr/share/java/curator-recipes.jar ]; then
    mkdir -p "$build/bench/java"
    nice javac -nowarn -d "$build/bench/java" -cp /usr/share/java/curator-recipes.jar "$root/bench/peers/CuratorLatch.java"
    cp="$build/bench/java:/usr/share/java/curator-recipes.jar"
    [ -f /usr/share/java/slf4j-nop.jar ] && cp="$cp:/usr/share/java/slf4j-nop.jar"
    args+=(--curator-classpath "$cp")
  fi
fi
# etcd when the etcd:// store is built (its generated API is in the build
# tree) and Debian's etcd-server is installed; one member, data on disk as
# the tests have it.
if wants etcd && [ -d "$build/src/stores/etcd/proto/gen" ] && command -v etcd >/dev/null; then
  chain+=("$root/tests/servers/etcd.sh" run "$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench-etcd-XXXXXX")")
  # The Go peer (concurrency.Mutex), built offline from Debian's
  # golang-etcd-server-dev when Go is installed.
  if command -v go >/dev/null && [ -d /usr/share/gocode/src/go.etcd.io/etcd/clientv3/concurrency ]; then
    mkdir -p "$build/go"
    GO111MODULE=off GOPATH="$build/go:/usr/share/gocode" GOCACHE="$build/go/cache" GOFLAGS= \
      nice go build -o "$build/bench/go-mutex" "$root/bench/peers/go_mutex.go"
    args+=(--go-mutex "$build/bench/go-mutex")
  fi
fi

DLOCK_TEST_URLS="" exec nice "${chain[@]}" "$python" "$root/bench/run_bench.py" \
  --bench "$build/bench/dlock-bench" --command "bench/run.sh" "${args[@]}"
