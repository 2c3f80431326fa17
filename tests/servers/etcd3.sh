#!/usr/bin/env bash
# etcd.sh with three members (a cluster on loopback): the same interface, for
# a CTest fixture of its own (server.etcd3) and `dlock-chaos --store etcd3`.
DLOCK_ETCD_MEMBERS=3 exec "$(dirname "$0")/etcd.sh" "$@"
