#!/usr/bin/env bash
# A throwaway etcd for tests (Debian's etcd-server): loopback only, free
# client and peer ports, its data in DIR. The same interface as every script
# in tests/servers (see dlock_add_server_fixture in tests/CMakeLists.txt):
#
#   etcd.sh start DIR          one member; once it answers (a linearizable read
#                              succeeds), write the store URL
#                              etcd://127.0.0.1:PORT to DIR/url and print it
#   etcd.sh start-cluster DIR  three members on loopback, each with its own
#                              ports and data directory (DIR/m1, m2, m3); the
#                              URL lists all three client endpoints:
#                              etcd://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3
#   etcd.sh stop DIR           stop every member (also one a test left
#                              SIGSTOPped) and delete DIR
#   etcd.sh run DIR [--suffix /PREFIX] [--param 'ttl=5s'] CMD...
#   etcd.sh run-cluster DIR [...] CMD...
#                              start (one member or three), run CMD with the
#                              URL appended to DLOCK_TEST_URLS, stop (also on
#                              errors and signals)
#
# DLOCK_ETCD_MEMBERS=3 makes `start` and `run` start a cluster too (what
# tests/servers/etcd3.sh sets, for a CTest fixture of its own).
# DLOCK_ETCD_ARGS adds flags to every member (e.g. "--auth-token-ttl 1").
# DLOCK_ETCD_TLS=1 serves clients over TLS with client certificates: a CA,
# a server certificate for 127.0.0.1 and a client certificate are made with
# openssl in DIR/tls (ca.pem, client.pem, client-key.pem), the endpoints are
# https://, and DIR/url carries ?ca=...&cert=...&key=... (so --param and
# --suffix do not apply).
#
#   etcd.sh exec-member MEMBER_DIR NAME CLIENT_PORT PEER_PORT INITIAL_CLUSTER TOKEN [PEER_URL]
#                              become one member (exec): the same command line,
#                              for tests/support/etcd_server.cpp
#
# DIR (one member) or each DIR/mN (cluster) holds data/, etcd.log, pid,
# port (client), peer_port and name; DIR holds url, and endpoints (the
# client URLs as etcdctl takes them: http://127.0.0.1:P1,...). Every wait is
# bounded; a start that fails stops whatever it started.
set -euo pipefail

ETCD=${ETCD:-etcd}
ETCDCTL=${ETCDCTL:-etcdctl}

die() { echo "etcd.sh: $*" >&2; exit 1; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

tls_dir=""  # set by start when DLOCK_ETCD_TLS=1

ctl() {  # ctl ENDPOINTS ARGS...: etcdctl, bounded
  local endpoints=$1 tls=()
  shift
  [ -z "$tls_dir" ] || tls=(--cacert "$tls_dir/ca.pem" --cert "$tls_dir/client.pem" --key "$tls_dir/client-key.pem")
  ETCDCTL_API=3 timeout 5 "$ETCDCTL" --endpoints="$endpoints" --dial-timeout=2s --command-timeout=3s "${tls[@]}" "$@"
}

make_certs() {  # make_certs DIR: a CA, a server certificate for 127.0.0.1, a client certificate
  local d=$1
  mkdir -p "$d"
  (
    cd "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=dlock-test-ca" \
      -keyout ca-key.pem -out ca.pem
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout server-key.pem -out server.csr
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 2 \
      -extfile server.ext -out server.pem
    openssl req -newkey rsa:2048 -nodes -subj "/CN=root" -keyout client-key.pem -out client.csr
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    openssl x509 -req -in client.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 2 \
      -extfile client.ext -out client.pem
  ) >/dev/null 2>&1 || die "openssl could not make the test certificates in $d"
}

healthy() {  # healthy ENDPOINTS: every member answers a linearizable read (so there is a leader)
  local e
  for e in ${1//,/ }; do
    ctl "$e" endpoint health >/dev/null 2>&1 || return 1
  done
}

alive() {  # alive PID: the process exists and is not a zombie (a member's parent,
  # the start that launched it, has exited: init reaps it, maybe late)
  kill -0 "$1" 2>/dev/null || return 1
  [ "$(ps -o stat= -p "$1" 2>/dev/null | cut -c1)" != "Z" ]
}

running() {  # running DIR: some member's pid is alive
  local f
  for f in "$1"/pid "$1"/m*/pid; do
    [ -f "$f" ] && alive "$(cat "$f")" && return 0
  done
  return 1
}

kill_members() {  # kill_members DIR: stop every member started in DIR, leave the files
  local f pid pids=()
  for f in "$1"/pid "$1"/m*/pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill -CONT "$pid" 2>/dev/null || true  # a test may have left it stopped
    kill -TERM "$pid" 2>/dev/null || true
    pids+=("$pid")
    rm -f "$f"
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  # 2 s at most, then SIGKILL: the data is thrown away, and a cluster's leader
  # stopped with its peers would otherwise spend seconds trying to transfer
  # its leadership to them.
  for _ in $(seq 1 40); do
    local live=0
    for pid in "${pids[@]}"; do alive "$pid" && live=1; done
    [ $live -eq 0 ] && return 0
    sleep 0.05
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

member_args() {  # member_args MEMBER_DIR NAME CLIENT_PORT PEER_PORT INITIAL_CLUSTER TOKEN [PEER_URL]:
  # sets `args`, etcd's command line for one member (also what exec-member
  # runs, for tests/support/etcd_server.cpp). PEER_URL: the peer URL the
  # member advertises, when its peers should dial another address (a proxy)
  # than the one it listens on.
  local mdir=$1 name=$2 cport=$3 pport=$4 initial=$5 token=$6 peer_url=${7:-http://127.0.0.1:$4}
  local scheme=http tls=()
  if [ -n "$tls_dir" ]; then
    scheme=https
    tls=(--cert-file "$tls_dir/server.pem" --key-file "$tls_dir/server-key.pem"
      --trusted-ca-file "$tls_dir/ca.pem" --client-cert-auth)
  fi
  # shellcheck disable=SC2206 # DLOCK_ETCD_ARGS is a list of flags
  args=(--name "$name" --data-dir "$mdir/data" "${tls[@]}"
    --listen-client-urls "$scheme://127.0.0.1:$cport" --advertise-client-urls "$scheme://127.0.0.1:$cport"
    --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "$peer_url"
    --initial-cluster "$initial" --initial-cluster-state new --initial-cluster-token "$token"
    --logger zap --log-outputs stderr --log-level warn ${DLOCK_ETCD_ARGS:-})
}

launch() {  # launch MEMBER_DIR NAME CLIENT_PORT PEER_PORT INITIAL_CLUSTER
  local mdir=$1 name=$2 cport=$3 pport=$4 initial=$5 args
  mkdir -p "$mdir/data"
  chmod 700 "$mdir/data"
  echo "$cport" >"$mdir/port"
  echo "$pport" >"$mdir/peer_port"
  echo "$name" >"$mdir/name"
  member_args "$mdir" "$name" "$cport" "$pport" "$initial" "dlock-test-$$"
  # setsid, output to a file: the member outlives this script without holding
  # the test runner's pipes, in a process group of its own (a test can stop
  # or kill it without touching the runner).
  setsid "$ETCD" "${args[@]}" >"$mdir/etcd.log" 2>&1 </dev/null &
  echo $! >"$mdir/pid"
}

start_members() {  # start_members DIR COUNT: true once all answer
  local dir=$1 count=$2 i initial="" endpoints="" url="" mdirs=() cports=() pports=() scheme=http
  [ -z "$tls_dir" ] || scheme=https
  for i in $(seq 1 "$count"); do
    cports+=("$(free_port)")
    pports+=("$(free_port)")
    if [ "$count" -eq 1 ]; then mdirs+=("$dir"); else mdirs+=("$dir/m$i"); fi
    initial="${initial:+$initial,}m$i=http://127.0.0.1:${pports[$((i - 1))]}"
    endpoints="${endpoints:+$endpoints,}$scheme://127.0.0.1:${cports[$((i - 1))]}"
    url="${url:+$url,}127.0.0.1:${cports[$((i - 1))]}"
  done
  for i in $(seq 0 $((count - 1))); do
    launch "${mdirs[$i]}" "m$((i + 1))" "${cports[$i]}" "${pports[$i]}" "$initial"
  done
  echo "$endpoints" >"$dir/endpoints"
  # Until start_deadline, by the clock (a health check of a hung member takes
  # its whole timeout): a cluster elects its leader on a busy machine.
  while [ $SECONDS -lt "$start_deadline" ]; do
    for i in $(seq 0 $((count - 1))); do
      alive "$(cat "${mdirs[$i]}/pid")" || return 1  # exited: a port was taken, say
    done
    if healthy "$endpoints"; then
      if [ -n "$tls_dir" ]; then
        url="$url?ca=$tls_dir/ca.pem&cert=$tls_dir/client.pem&key=$tls_dir/client-key.pem"
      fi
      echo "etcd://$url" >"$dir/url"
      return 0
    fi
    sleep 0.2
  done
  return 1
}

start() {  # start DIR COUNT
  local dir=$1 count=$2 attempt
  [ -n "$dir" ] || die "start needs a directory"
  command -v "$ETCD" >/dev/null || die "etcd not found (apt-get install etcd-server)"
  command -v "$ETCDCTL" >/dev/null || die "etcdctl not found (apt-get install etcd-client)"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if [ "${DLOCK_ETCD_TLS:-0}" = 1 ]; then
    tls_dir=$dir/tls
    [ -f "$tls_dir/ca.pem" ] || make_certs "$tls_dir"
  fi
  if running "$dir"; then
    # Started before (e.g. ctest --repeat runs the fixture's setup again).
    if [ -f "$dir/url" ] && healthy "$(cat "$dir/endpoints")"; then
      cat "$dir/url"
      return 0
    fi
    die "etcd runs in $dir but does not answer"
  fi
  # Whatever this start launched is stopped if it fails or is interrupted.
  trap 'kill_members "$dir"' EXIT
  trap 'exit 130' INT TERM
  # 90 s for all attempts (the CTest fixture allows 120 s).
  start_deadline=$((SECONDS + 90))
  for attempt in 1 2 3; do  # a port can be taken between pick and bind
    rm -rf "$dir"/data "$dir"/m[0-9]* "$dir"/url
    if start_members "$dir" "$count"; then
      trap - EXIT INT TERM
      cat "$dir/url"
      return 0
    fi
    echo "etcd.sh: attempt $attempt failed; the log:" >&2
    tail -n 20 "$dir"/etcd.log "$dir"/m*/etcd.log >&2 2>/dev/null || true
    kill_members "$dir"
  done
  die "etcd did not start in $dir"
}

stop() {
  local dir=$1
  [ -n "$dir" ] || die "stop needs a directory"
  [ -d "$dir" ] || return 0
  kill_members "$dir"
  rm -rf "$dir"
}

members=${DLOCK_ETCD_MEMBERS:-1}
case "${1:-}" in
  start) start "${2:-}" "$members" ;;
  start-cluster) start "${2:-}" 3 ;;
  stop) stop "${2:-}" ;;
  exec-member)
    # exec-member MEMBER_DIR NAME CLIENT_PORT PEER_PORT INITIAL_CLUSTER TOKEN [PEER_URL]:
    # becomes that member (exec, same pid), in the foreground, its log on
    # stderr: for a launcher that starts and watches each member itself
    # (tests/support/etcd_server.cpp: it dies with its parent). A member
    # directory with data restarts the member from it.
    [ $# -ge 7 ] || die "exec-member needs MEMBER_DIR NAME CLIENT_PORT PEER_PORT INITIAL_CLUSTER TOKEN"
    mkdir -p "$2/data"
    chmod 700 "$2/data"
    member_args "${@:2}"
    exec "$ETCD" "${args[@]}"
    ;;
  run | run-cluster)
    [ "$1" = run-cluster ] && export DLOCK_ETCD_MEMBERS=3
    dir=${2:-}; shift 2 || die "run needs a directory and a command"
    exec "$(dirname "$0")/run-with-url.sh" --server "$0" "$dir" "$@"
    ;;
  *) die "usage: etcd.sh start DIR | start-cluster DIR | stop DIR | run DIR [--suffix S] [--param Q] CMD... | run-cluster DIR ... | exec-member MEMBER_DIR NAME CLIENT_PORT PEER_PORT INITIAL_CLUSTER TOKEN [PEER_URL]" ;;
esac
