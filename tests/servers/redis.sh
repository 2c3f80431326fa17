#!/usr/bin/env bash
# Runs a command next to a private redis-server (Debian's), for the suites
# that take store URLs from DLOCK_TEST_URLS:
#
#   tests/servers/redis.sh [--param 'ttl=5s'] COMMAND [ARGS...]
#
# Starts redis-server on 127.0.0.1 and a free port the script picks, with no
# persistence, in a scratch directory; waits until PING answers; runs COMMAND
# with DLOCK_TEST_URLS="redis://127.0.0.1:PORT[?PARAM]" (appended to any URLs
# already there), in its own process group; then stops the server, kills what
# is left of that group and removes the directory, on every exit path; and
# exits with COMMAND's status.
set -euo pipefail

param=""
if [ "${1:-}" = "--param" ]; then
  param="?$2"
  shift 2
fi
[ $# -ge 1 ] || { echo "usage: $0 [--param k=v&...] COMMAND [ARGS...]" >&2; exit 2; }

server=$(command -v redis-server || true)
cli=$(command -v redis-cli || true)
[ -n "$server" ] || { echo "redis.sh: redis-server not found (apt-get install redis-server)" >&2; exit 2; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/dlock-redis-XXXXXX")
pid=""
cmd_pid=""
cleanup() {
  # Whatever the command left running in its process group (e.g. a child
  # of a process a test killed) goes too.
  if [ -n "$cmd_pid" ]; then kill -KILL -- "-$cmd_pid" 2>/dev/null || true; fi
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -CONT "$pid" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

ping() {  # ping PORT: true once the server answers PONG
  if [ -n "$cli" ]; then
    [ "$("$cli" -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = "PONG" ]
  else
    python3 -c "import redis,sys; sys.exit(0 if redis.Redis(port=$1, socket_timeout=1).ping() else 1)" 2>/dev/null
  fi
}

port=""
for attempt in 1 2 3 4 5; do  # the port can be taken between pick and bind
  port=$(free_port)
  "$server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
    --daemonize no --protected-mode no --logfile "$dir/redis.log" &
  pid=$!
  up=0
  for _ in $(seq 1 200); do  # 10s at most
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    if ping "$port"; then up=1; break; fi
    sleep 0.05
  done
  [ $up -eq 1 ] && break
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=""
done
if [ -z "$pid" ]; then
  echo "redis.sh: redis-server did not start; log:" >&2
  cat "$dir/redis.log" >&2 || true
  exit 1
fi

url="redis://127.0.0.1:${port}${param}"
export DLOCK_TEST_URLS="${DLOCK_TEST_URLS:+$DLOCK_TEST_URLS }$url"
echo "redis.sh: $url (pid $pid)" >&2
# In its own session and process group (see cleanup).
setsid "$@" &
cmd_pid=$!
set +e
wait "$cmd_pid"
status=$?
set -e
exit $status
