#!/usr/bin/env bash
# A throwaway three-server ZooKeeper ensemble on loopback, for tests that kill
# its leader. Debian's package run with `java` directly, like zookeeper.sh.
#
#   zookeeper-ensemble.sh start DIR     start, wait for a quorum, print the hosts list
#   zookeeper-ensemble.sh leader DIR    print N (1..3) of the current leader
#   zookeeper-ensemble.sh kill DIR N    SIGKILL server N
#   zookeeper-ensemble.sh stop DIR      stop every server and delete DIR
#   zookeeper-ensemble.sh run DIR CMD...  start, run CMD with DLOCK_ZK_ENSEMBLE_DIR=DIR
#                                       and DLOCK_TEST_ZK_ENSEMBLE=HOSTS, stop (also on
#                                       errors and signals)
#
# DIR/sN holds server N's zoo.cfg, myid, data, log, pid and client port;
# DIR/hosts the connection string. Every wait is bounded.
#
# ZK_TICK_TIME (ms, default 200) and ZK_SYNC_LIMIT (ticks, default 10) tune
# the servers. With ZK_PEER_PROXIES=1 every server reaches every other one
# through a TCP proxy that the test runs, so that it can cut one server off
# from another while their clients stay connected: each server gets its own
# zoo.cfg, in which the other servers' quorum and election ports are proxy
# ports, and DIR/links lists the proxies, one per line:
#   FROM TO quorum|election LISTEN_PORT TARGET_PORT
# start then launches the servers and returns at once (printing the hosts):
# they form a quorum only once the test has started the proxies. (Election
# connections may bypass a proxy: a server answers a peer on the address the
# peer announces. A follower's connection to its leader never does.)
set -euo pipefail

ZK_JARS=${ZK_JARS:-/usr/share/java}
JAVA=${JAVA:-java}

die() { echo "zookeeper-ensemble.sh: $*" >&2; exit 1; }

free_ports() {  # free_ports N: N distinct ephemeral ports, held together while chosen
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
EOF
}

four_letters() {  # four_letters PORT CMD: the server's answer, or nothing
  timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf '%s' '$2' >&3 && cat <&3" 2>/dev/null || true
}

mode() { four_letters "$(cat "$1/s$2/port")" srvr | sed -n 's/^Mode: //p'; }

leader() {
  local dir=$1 n
  for n in 1 2 3; do
    [ "$(mode "$dir" "$n")" = leader ] && { echo "$n"; return 0; }
  done
  return 1
}

start() {
  local dir=$1 n
  [ -n "$dir" ] || die "start needs a directory"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [ -f "$ZK_JARS/zookeeper.jar" ] || die "no $ZK_JARS/zookeeper.jar (apt-get install zookeeper)"
  local cp="$ZK_JARS/zookeeper.jar"
  [ -f "$ZK_JARS/slf4j-simple.jar" ] && cp="$cp:$ZK_JARS/slf4j-simple.jar"
  local proxied=${ZK_PEER_PROXIES:-0} nports=9
  [ "$proxied" = 1 ] && nports=21  # and two per ordered pair of servers
  read -r -a p <<<"$(free_ports $nports)"
  [ "${#p[@]}" -eq "$nports" ] || die "could not find free ports"
  local hosts="" next=9 m kind
  declare -A line  # line[N.M]: server M's address in server N's zoo.cfg
  rm -f "$dir/links"
  for n in 1 2 3; do
    hosts+="${hosts:+,}127.0.0.1:${p[$((3 * n - 3))]}"
    for m in 1 2 3; do
      local q=${p[$((3 * m - 2))]} e=${p[$((3 * m - 1))]}
      if [ "$proxied" = 1 ] && [ "$n" != "$m" ]; then
        for kind in quorum election; do
          local target=$q
          [ "$kind" = election ] && target=$e
          echo "$n $m $kind ${p[$next]} $target" >>"$dir/links"
          if [ "$kind" = quorum ]; then q=${p[$next]}; else e=${p[$next]}; fi
          next=$((next + 1))
        done
      fi
      line[$n.$m]="server.$m=127.0.0.1:$q:$e"
    done
  done
  for n in 1 2 3; do
    local s="$dir/s$n"
    mkdir -p "$s/data"
    echo "$n" >"$s/data/myid"
    echo "${p[$((3 * n - 3))]}" >"$s/port"
    cat >"$s/zoo.cfg" <<EOF
tickTime=${ZK_TICK_TIME:-200}
initLimit=50
syncLimit=${ZK_SYNC_LIMIT:-10}
dataDir=$s/data
clientPort=${p[$((3 * n - 3))]}
clientPortAddress=127.0.0.1
maxSessionTimeout=120000
maxClientCnxns=0
4lw.commands.whitelist=*
admin.enableServer=false
${line[$n.1]}
${line[$n.2]}
${line[$n.3]}
EOF
    # setsid: its own process group, so that killing it spares the test runner.
    setsid "$JAVA" -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
      -Dzookeeper.jmx.log4j.disable=true -Dzookeeper.admin.enableServer=false \
      -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
      -cp "$cp" org.apache.zookeeper.server.quorum.QuorumPeerMain "$s/zoo.cfg" \
      >"$s/server.log" 2>&1 </dev/null &
    echo $! >"$s/pid"
  done
  echo "$hosts" >"$dir/hosts"
  if [ "$proxied" = 1 ]; then  # the test starts the proxies, then waits for the quorum
    echo "$hosts"
    return 0
  fi
  local i ok
  for i in $(seq 1 450); do  # up to 90 s: three cold JVMs on a busy machine
    ok=0
    for n in 1 2 3; do
      case "$(mode "$dir" "$n")" in leader | follower) ok=$((ok + 1)) ;; esac
    done
    if [ "$ok" -eq 3 ] && leader "$dir" >/dev/null; then
      echo "$hosts"
      return 0
    fi
    sleep 0.2
  done
  for n in 1 2 3; do tail -20 "$dir/s$n/server.log" >&2 || true; done
  stop "$dir"
  die "the ensemble did not form"
}

kill_server() {
  local dir=$1 n=$2 pid
  pid=$(cat "$dir/s$n/pid" 2>/dev/null) || return 0
  kill -KILL "$pid" 2>/dev/null || true
  local i
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  rm -f "$dir/s$n/pid"
}

stop() {
  local dir=$1 n
  [ -n "$dir" ] || die "stop needs a directory"
  [ -d "$dir" ] || return 0
  for n in 1 2 3; do kill_server "$dir" "$n"; done
  rm -rf "$dir"
}

case "${1:-}" in
  start) start "${2:-}" ;;
  leader) leader "${2:-}" ;;
  kill) kill_server "${2:-}" "${3:-}" ;;
  stop) stop "${2:-}" ;;
  run)
    dir=${2:-}; shift 2 || die "run needs a directory and a command"
    # A directory left by a run killed outright (whose servers the runner
    # killed with it) is stale: start afresh.
    rm -rf "$dir"
    trap 'stop "$dir"' EXIT INT TERM
    hosts=$(start "$dir")
    DLOCK_ZK_ENSEMBLE_DIR=$dir DLOCK_TEST_ZK_ENSEMBLE=$hosts "$@"
    ;;
  *) die "usage: zookeeper-ensemble.sh start DIR | leader DIR | kill DIR N | stop DIR | run DIR CMD..." ;;
esac
