#!/usr/bin/env bash
# bench.smoke: every scenario of dlock-bench runs for a moment on mem://,
# file:// and (when redis-server is installed) redis://, and prints valid
# JSON without an "error". It checks that the benchmark runs, never a speed.
#   bench/smoke.sh PATH/TO/dlock-bench
set -euo pipefail
bench=$1
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench-smoke-XXXXXX")
trap 'rm -rf "$dir"' EXIT

check() {  # check ARGS...: runs one scenario, fails unless the JSON is clean
  local out
  out=$("$bench" --seconds 0.2 "$@") || { echo "FAILED: $* -> $out" >&2; exit 1; }
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit("error" in d or "result" not in d)' "$out" \
    || { echo "BAD JSON: $* -> $out" >&2; exit 1; }
  echo "ok: $*"
}

# The election's failover and handover (bench/election.py) with two
# dlock-bench-participant processes: each must produce its samples.
elect() {  # elect URL
  python3 - "$here" "$(dirname "$bench")/dlock-bench-participant" "$1" <<'PY' || { echo "FAILED: election on $1" >&2; exit 1; }
import sys
sys.path.insert(0, sys.argv[1])
import election
participant, url = sys.argv[2], sys.argv[3]
argv = lambda name: lambda i, n, h: [participant, "--url", url, "--name", name, "--value", f"p{i}",
                                     "--rounds", str(n), "--hold-ms", str(h)]
assert election.failover(argv("smoke/failover"), 2, deadline_s=120)["count"] == 1
assert election.handover(argv("smoke/handover"), 2, 2, 10, deadline_s=120)["count"] == 3
PY
  echo "ok: election on $1"
}

run_store() {  # run_store URL [multi-process]
  check --url "$1" --scenario cycles --max-ops 200
  check --url "$1" --scenario contend --procs 2 --threads 2 --max-ops 200
  check --url "$1" --scenario waiters --procs 2 --waiters 40 --pool 4
  if [ "${2:-}" = multi ]; then
    check --url "$1" --scenario footprint --locks 20
    check --url "$1" --scenario async-footprint --locks 20 --on-one 20
    elect "$1"
  fi
}

if [ "${DLOCK_SMOKE_INNER:-}" = 1 ]; then  # under tests/servers/redis.sh
  for url in $DLOCK_TEST_URLS; do
    run_store "$url" multi
    check --url "$url" --scenario floor --max-ops 200
    check --url "$url" --scenario floor --floor setnx --max-ops 200
  done
  exit 0
fi
run_store mem://
run_store "file://$dir/locks" multi
if command -v redis-server >/dev/null; then
  DLOCK_SMOKE_INNER=1 DLOCK_TEST_URLS="" "$here/../tests/servers/redis.sh" run "$dir/redis" --param ttl=3s "$0" "$bench"
fi
echo "bench.smoke: OK"
