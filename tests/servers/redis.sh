#!/usr/bin/env bash
# A throwaway redis-server for tests (Debian's): loopback only, on a free
# port, no persistence, its files in DIR. The same interface as every script
# in tests/servers (see dlock_add_server_fixture in tests/CMakeLists.txt):
#
#   redis.sh start DIR        start, wait until PING answers, write the store
#                             URL to DIR/url (and the port to DIR/port), print it
#   redis.sh stop DIR         stop it (also if a test left it SIGSTOPped) and
#                             delete DIR
#   redis.sh run DIR [--param 'ttl=5s'] CMD...
#                             start, run CMD with the URL (plus ?PARAM) appended
#                             to DLOCK_TEST_URLS, stop (also on errors and signals)
#
# Every wait is bounded.
set -euo pipefail

die() { echo "redis.sh: $*" >&2; exit 1; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

ping() {  # ping PORT: true once the server answers PONG
  local cli
  cli=$(command -v redis-cli || true)
  if [ -n "$cli" ]; then
    [ "$(timeout 2 "$cli" -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = "PONG" ]
  else
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf 'PING\r\n' >&3 && head -c 5 <&3" 2>/dev/null |
      grep -q PONG
  fi
}

start() {
  local dir=$1 server port pid up attempt
  [ -n "$dir" ] || die "start needs a directory"
  server=$(command -v redis-server || true)
  [ -n "$server" ] || die "redis-server not found (apt-get install redis-server)"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    # Started before (e.g. ctest --repeat runs the fixture's setup again).
    ping "$(cat "$dir/port")" && { cat "$dir/url"; return 0; }
    die "a server runs in $dir (pid $(cat "$dir/pid")) but does not answer"
  fi
  for attempt in 1 2 3 4 5; do  # the port can be taken between pick and bind
    port=$(free_port)
    # setsid, output to a file: the server outlives this script without
    # holding the test runner's pipes, in a process group of its own.
    setsid "$server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
      --daemonize no --protected-mode no --logfile "$dir/redis.log" >/dev/null 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$dir/pid"
    up=0
    for _ in $(seq 1 200); do  # 10 s at most
      kill -0 "$pid" 2>/dev/null || break
      if ping "$port"; then up=1; break; fi
      sleep 0.05
    done
    if [ $up -eq 1 ]; then
      echo "$port" >"$dir/port"
      echo "redis://127.0.0.1:$port" >"$dir/url"
      cat "$dir/url"
      return 0
    fi
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/pid"
  done
  cat "$dir/redis.log" >&2 || true
  die "redis-server did not start"
}

stop() {
  local dir=$1 pid
  [ -n "$dir" ] || die "stop needs a directory"
  [ -d "$dir" ] || return 0
  if [ -f "$dir/pid" ]; then
    pid=$(cat "$dir/pid")
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}

case "${1:-}" in
  start) start "${2:-}" ;;
  stop) stop "${2:-}" ;;
  run)
    dir=${2:-}; shift 2 || die "run needs a directory and a command"
    exec "$(dirname "$0")/run-with-url.sh" --server "$0" "$dir" "$@"
    ;;
  *) die "usage: redis.sh start DIR | stop DIR | run DIR [--param k=v&...] CMD..." ;;
esac
