#!/usr/bin/env bash
# The file:// store's "server": a scratch directory. The same interface as
# every script in tests/servers (see dlock_add_server_fixture in
# tests/CMakeLists.txt), so that the shared suites run on file:// as they
# run on the server stores:
#
#   file.sh start DIR         make DIR/store, write file://DIR/store to DIR/url
#   file.sh stop DIR          delete DIR
#   file.sh run DIR [--param 'k=v'] CMD...
#                             start, run CMD with the URL appended to
#                             DLOCK_TEST_URLS, stop (also on errors and signals)
set -euo pipefail

die() { echo "file.sh: $*" >&2; exit 1; }

case "${1:-}" in
  start)
    dir=${2:-}; [ -n "$dir" ] || die "start needs a directory"
    mkdir -p "$dir/store"
    dir=$(cd "$dir" && pwd)
    echo "file://$dir/store" >"$dir/url"
    cat "$dir/url"
    ;;
  stop)
    dir=${2:-}; [ -n "$dir" ] || die "stop needs a directory"
    rm -rf "$dir"
    ;;
  run)
    dir=${2:-}; shift 2 || die "run needs a directory and a command"
    exec "$(dirname "$0")/run-with-url.sh" --server "$0" "$dir" "$@"
    ;;
  *) die "usage: file.sh start DIR | stop DIR | run DIR [--param k=v&...] CMD..." ;;
esac
