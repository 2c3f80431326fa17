#!/usr/bin/env bash
# Runs a command on the store a tests/servers script started in DIR, with the
# store's URL appended to DLOCK_TEST_URLS (where the shared suites read it):
#
#   run-with-url.sh DIR [--suffix S] [--param Q] CMD...
#       the server runs already (a CTest fixture started it): the URL is
#       DIR/url, then S (a path: "/3", "/chroot"; "@RUN@" in it becomes a
#       number unique to this run), then "?Q"
#   run-with-url.sh --server SCRIPT DIR [--suffix S] [--param Q] CMD...
#       the same, but SCRIPT starts the server in DIR first and stops it at
#       the end (SCRIPT run DIR ... execs this)
#
# CMD runs in a session and process group of its own; whatever it leaves
# running there (e.g. a child of a process a test killed) is killed when it
# ends, on every exit path. Exits with CMD's status.
set -euo pipefail

die() { echo "run-with-url.sh: $*" >&2; exit 2; }

script=""
if [ "${1:-}" = "--server" ]; then
  script=$2
  shift 2
fi
dir=${1:-}
[ -n "$dir" ] || die "usage: $0 [--server SCRIPT] DIR [--suffix S] [--param Q] CMD..."
shift
suffix=""
param=""
while [ $# -gt 0 ]; do
  case "$1" in
    --suffix) suffix=$2; shift 2 ;;
    --param) param="?$2"; shift 2 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || die "no command"

cmd_pid=""
cleanup() {
  if [ -n "$cmd_pid" ]; then kill -KILL -- "-$cmd_pid" 2>/dev/null || true; fi
  if [ -n "$script" ]; then "$script" stop "$dir" >/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -n "$script" ]; then
  "$script" start "$dir" >/dev/null
fi
[ -f "$dir/url" ] || die "no $dir/url: is the server running? (ctest starts it as a fixture)"
url="$(cat "$dir/url")${suffix//@RUN@/$$}${param}"
export DLOCK_TEST_URLS="${DLOCK_TEST_URLS:+$DLOCK_TEST_URLS }$url"
# The ZooKeeper tests of their own (tests/zookeeper) take host:port instead.
case "$url" in zk://*) export DLOCK_TEST_ZK="127.0.0.1:$(cat "$dir/port")" ;; esac
echo "run-with-url.sh: DLOCK_TEST_URLS=$DLOCK_TEST_URLS" >&2
setsid "$@" &
cmd_pid=$!
set +e
wait "$cmd_pid"
status=$?
set -e
exit $status
