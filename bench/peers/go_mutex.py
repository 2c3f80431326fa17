#!/usr/bin/env python3
"""Peer: Go's concurrency.Mutex on etcd (go.etcd.io/etcd/clientv3/concurrency,
etcd 3.4: one Txn to enqueue and read the owner, a watch on the key just
ahead when contended, a plain Delete to release). The lock itself runs in
the Go program bench/peers/go_mutex.go (built by bench/run.sh); this script
speaks the same command line and prints the same JSON as the other peers,
and computes the statistics with common.py. The server's gRPC counters
(etcd's /metrics) give the requests per operation, as dlock-bench reads them.
  go_mutex.py --bin PATH/go-mutex --url etcd://HOST:PORT --scenario cycles|contend [...]"""
import argparse
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def grpc_counts(hostport):
    """etcd's gRPC messages received, per method ("Watch (stream)" for streams)."""
    try:
        text = urllib.request.urlopen(f"http://{hostport}/metrics", timeout=10).read().decode()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        if not line.startswith("grpc_server_msg_received_total{") or 'grpc_service="etcdserverpb.' not in line:
            continue
        labels, value = line.rsplit(" ", 1)
        method = labels.split('grpc_method="', 1)[1].split('"', 1)[0]
        if 'grpc_type="unary"' not in labels:
            method += " (stream)"
        out[method] = out.get(method, 0) + int(float(value))
    return out


def requests(before, after, ops):
    """The shape dlock-bench's Requests() gives for etcd: every gRPC message
    the server received per operation, and the unary calls (round trips)."""
    if not before or not after or ops <= 0:
        return None
    by = {k: (after[k] - before.get(k, 0)) / ops for k in after if after[k] != before.get(k, 0)}
    total = sum(after[k] - before.get(k, 0) for k in after)
    unary = sum(after[k] - before.get(k, 0) for k in after if not k.endswith(" (stream)"))
    return {"commands": total, "commands_per_op": total / ops, "scripts_per_op": unary / ops, "by_command_per_op": by}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="the go-mutex binary (bench/peers/go_mutex.go)")
    ap.add_argument("--url", required=True)
    ap.add_argument("--scenario", required=True, choices=["cycles", "contend"])
    ap.add_argument("--name", default="bench/go-mutex")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--max-ops", type=int, default=1_000_000)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hold-us", type=int, default=0)
    ap.add_argument("--watch-from-next", action="store_true",
                    help="diagnostic: waits watch from their Get's revision + 1 (go_mutex.go)")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    hostport = f"{u.hostname}:{u.port or 2379}"
    base = [a.bin, "-endpoint", hostport, "-name", a.name, "-seconds", str(a.seconds), "-max-ops", str(a.max_ops)]
    if a.watch_from_next:
        base.append("-watch-from-next")

    if a.scenario == "cycles":
        # The counters around the whole process include its connect, session
        # and 10 warm-up cycles: a few requests, against thousands of cycles.
        before = grpc_counts(hostport)
        p = subprocess.run(base + ["-scenario", "cycles"], capture_output=True, text=True, timeout=a.seconds + 120)
        if p.returncode != 0:
            sys.exit(f"go-mutex: exit {p.returncode}: {p.stderr.strip()[-500:]}")
        result = json.loads(p.stdout)
        result["requests"] = requests(before, grpc_counts(hostport), result["cycles"])
    else:
        # As common.contend: every process connected by start_at (Go starts
        # faster than Python; its clients connect within the same 2 s).
        start_at = time.monotonic_ns() + 2_000_000_000
        ps = [subprocess.Popen(base + ["-scenario", "worker", "-proc", str(i), "-threads", str(a.threads),
                                       "-hold-us", str(a.hold_us), "-start-at", str(start_at)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for i in range(a.procs)]
        while time.monotonic_ns() < start_at - 200_000_000:
            time.sleep(0.01)
        before = grpc_counts(hostport)
        recs = []
        for p in ps:
            out, err = p.communicate(timeout=a.seconds + 120)
            if p.returncode != 0:
                sys.exit(f"go-mutex: exit {p.returncode}: {err.strip()[-500:]}")
            recs += [tuple(r) for r in json.loads(out)]
        after = grpc_counts(hostport)
        result = common.analyze(recs)
        result.update({"procs": a.procs, "threads": a.threads, "hold_us": a.hold_us})
        # Includes each worker's session close (a LeaseRevoke per goroutine).
        result["requests"] = requests(before, after, len(recs))
    impl = "go-mutex(watch-from-next)" if a.watch_from_next else "go-mutex"
    print(json.dumps({"store": "etcd", "scenario": a.scenario, "impl": impl, "result": result}))


if __name__ == "__main__":
    main()
