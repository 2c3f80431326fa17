#!/usr/bin/env python3
"""Peer: kazoo's Lock (the ZooKeeper lock recipe: an ephemeral sequential
node, a watch on the node just ahead). Prints one JSON object shaped like
dlock-bench's.
  kazoo_lock.py --url zk://HOST:PORT --scenario cycles|contend [...]"""
import argparse
import json
import logging
import os
import sys
import urllib.parse

from kazoo.client import KazooClient

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--scenario", required=True, choices=["cycles", "contend"])
    ap.add_argument("--name", default="/dlock-bench-kazoo/lock")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--max-ops", type=int, default=1_000_000)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hold-us", type=int, default=0)
    a = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    u = urllib.parse.urlparse(a.url)

    def make_lock():
        zk = KazooClient(hosts=f"{u.hostname}:{u.port}", timeout=10)
        zk.start(timeout=15)
        return zk.Lock(a.name)

    if a.scenario == "cycles":
        result = common.cycles(make_lock, a.seconds, a.max_ops)
    else:
        result = common.contend(make_lock, a.procs, a.threads, a.seconds, a.hold_us, a.max_ops)
    print(json.dumps({"store": "zk", "scenario": a.scenario, "impl": "kazoo", "result": result}))
    sys.stdout.flush()
    os._exit(0)  # kazoo's threads would otherwise keep the process alive a while


if __name__ == "__main__":
    main()
