#!/usr/bin/env bash
# A throwaway standalone ZooKeeper server for tests: Debian's package run with
# `java` directly, loopback only, on a free port, with its data in DIR.
#
# The same interface as every script in tests/servers (see
# dlock_add_server_fixture in tests/CMakeLists.txt):
#
#   zookeeper.sh start DIR [PORT]   start, wait until it answers, write the
#                                   store URL to DIR/url, print the port
#   zookeeper.sh stop DIR           stop it and delete DIR
#   zookeeper.sh run DIR [--suffix /CHROOT] [--param Q] CMD...
#                                   start, run CMD with the URL appended to
#                                   DLOCK_TEST_URLS and DLOCK_TEST_ZK=127.0.0.1:PORT,
#                                   stop (also on errors and signals)
#
# DIR holds zoo.cfg, data/, server.log, pid, port and url. tickTime is 200ms, so
# sessions may be as short as 400ms; the container reaper runs every 200ms so
# that tests can see empty lock directories vanish. All four-letter commands
# are enabled (ruok, srvr, mntr, ...). Every wait is bounded.
set -euo pipefail

ZK_JARS=${ZK_JARS:-/usr/share/java}
JAVA=${JAVA:-java}

die() { echo "zookeeper.sh: $*" >&2; exit 1; }

free_port() {
  # Ask the kernel for an ephemeral port, then let it go.
  python3 - <<'EOF' 2>/dev/null || echo $((20000 + RANDOM % 20000))
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
EOF
}

four_letters() {  # four_letters PORT CMD: the server's answer, or nothing
  timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf '%s' '$2' >&3 && cat <&3" 2>/dev/null || true
}

start() {
  local dir=$1 port=${2:-}
  [ -n "$dir" ] || die "start needs a directory"
  mkdir -p "$dir/data"
  dir=$(cd "$dir" && pwd)
  if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    # Started before (e.g. ctest --repeat runs the fixture's setup again).
    if [ "$(four_letters "$(cat "$dir/port")" ruok)" = "imok" ]; then
      cat "$dir/port"
      return 0
    fi
    die "a server runs in $dir (pid $(cat "$dir/pid")) but does not answer"
  fi
  [ -n "$port" ] || port=$(cat "$dir/port" 2>/dev/null || free_port)
  cat >"$dir/zoo.cfg" <<EOF
tickTime=200
dataDir=$dir/data
clientPort=$port
clientPortAddress=127.0.0.1
maxSessionTimeout=120000
maxClientCnxns=0
4lw.commands.whitelist=*
admin.enableServer=false
EOF
  [ -f "$ZK_JARS/zookeeper.jar" ] || die "no $ZK_JARS/zookeeper.jar (apt-get install zookeeper)"
  # The jar's manifest names its dependencies; slf4j-simple gives it a logger.
  local cp="$ZK_JARS/zookeeper.jar"
  [ -f "$ZK_JARS/slf4j-simple.jar" ] && cp="$cp:$ZK_JARS/slf4j-simple.jar"
  # setsid: the server gets its own process group, so that a test can stop
  # (SIGSTOP) or kill it without touching the test runner.
  setsid "$JAVA" -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    -Dzookeeper.jmx.log4j.disable=true -Dzookeeper.admin.enableServer=false \
    -Dznode.container.checkIntervalMs=200 -Dznode.container.maxPerMinute=100000 \
    -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
    -cp "$cp" org.apache.zookeeper.server.ZooKeeperServerMain "$dir/zoo.cfg" \
    >"$dir/server.log" 2>&1 </dev/null &
  echo $! >"$dir/pid"
  echo "$port" >"$dir/port"
  echo "zk://127.0.0.1:$port" >"$dir/url"
  local i
  for i in $(seq 1 300); do  # up to 60 s: a cold JVM on a busy machine
    if [ "$(four_letters "$port" ruok)" = "imok" ] && four_letters "$port" srvr | grep -q '^Mode: standalone'; then
      echo "$port"
      return 0
    fi
    kill -0 "$(cat "$dir/pid")" 2>/dev/null || { cat "$dir/server.log" >&2; die "the server exited"; }
    sleep 0.2
  done
  cat "$dir/server.log" >&2
  stop_server "$dir"
  die "the server did not answer on port $port"
}

stop_server() {  # leaves DIR in place
  local dir=$1 pid
  [ -f "$dir/pid" ] || return 0
  pid=$(cat "$dir/pid")
  kill -CONT "$pid" 2>/dev/null || true  # a test may have left it stopped
  kill -TERM "$pid" 2>/dev/null || true
  local i
  for i in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$dir/pid"
}

stop() {
  local dir=$1
  [ -n "$dir" ] || die "stop needs a directory"
  [ -d "$dir" ] || return 0
  stop_server "$dir"
  rm -rf "$dir"
}

case "${1:-}" in
  start) start "${2:-}" "${3:-}" ;;
  stop) stop "${2:-}" ;;
  run)
    dir=${2:-}; shift 2 || die "run needs a directory and a command"
    exec "$(dirname "$0")/run-with-url.sh" --server "$0" "$dir" "$@"
    ;;
  *) die "usage: zookeeper.sh start DIR [PORT] | stop DIR | run DIR [--suffix S] [--param Q] CMD..." ;;
esac
