#!/usr/bin/env python3
"""Peer: redis-py's Lock (SET NX PX + a compare-and-delete script; a blocked
acquire polls every `sleep` seconds, 0.1 by default). Prints one JSON object
shaped like dlock-bench's.
  redis_py_lock.py --url redis://HOST:PORT --scenario cycles|contend [...]"""
import argparse
import json
import os
import sys
import urllib.parse

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--scenario", required=True, choices=["cycles", "contend"])
    ap.add_argument("--name", default="bench/redis-py")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--max-ops", type=int, default=1_000_000)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hold-us", type=int, default=0)
    ap.add_argument("--sleep", type=float, default=0.1, help="Lock's polling interval (its default: 0.1)")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)

    def make_lock():
        r = redis.Redis(host=u.hostname, port=u.port)
        return r.lock(a.name, timeout=30, sleep=a.sleep)

    if a.scenario == "cycles":
        result = common.cycles(make_lock, a.seconds, a.max_ops)
    else:
        result = common.contend(make_lock, a.procs, a.threads, a.seconds, a.hold_us, a.max_ops)
    impl = "redis-py" if a.sleep == 0.1 else f"redis-py(sleep={a.sleep:g})"
    print(json.dumps({"store": "redis", "scenario": a.scenario, "impl": impl, "result": result}))


if __name__ == "__main__":
    main()
