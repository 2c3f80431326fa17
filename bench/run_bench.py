#!/usr/bin/env python3
"""Runs every benchmark scenario on every store and peer, prints a table and
writes the JSON and the SVG plot. Called by bench/run.sh, under the scripts
that start the servers (tests/servers/*.sh put their URLs in DLOCK_TEST_URLS).

  run_bench.py --bench PATH/dlock-bench [--quick] [--only STORE] [--rounds N]
               [--go-mutex PATH/go-mutex] [--out DIR] [--command TEXT]
               [--participant PATH/dlock-bench-participant] [--curator-classpath CP]
               [--election-only] [--session-ms MS]
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import election  # noqa: E402
import plot  # noqa: E402


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:  # noqa: BLE001 - metadata only
        return ""


def machine():
    model = ""
    for line in sh("lscpu").splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
    try:
        import redis
        redis_py = redis.__version__
    except ImportError:
        redis_py = None
    try:
        import kazoo.version
        kazoo_v = kazoo.version.__version__
    except ImportError:
        kazoo_v = None
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "kernel": platform.release(),
        "os": sh(". /etc/os-release && echo $PRETTY_NAME"),
        "gcc": sh("gcc --version | head -1"),
        "redis_server": sh("redis-server --version"),
        "zookeeper": sh("dpkg-query -W -f '${Version}' zookeeper"),
        "hiredis": sh("dpkg-query -W -f '${Version}' libhiredis-dev"),
        "etcd": sh("dpkg-query -W -f '${Version}' etcd-server"),
        "grpc": sh("dpkg-query -W -f '${Version}' libgrpc++-dev"),
        "go": sh("go version"),
        "golang_etcd": sh("dpkg-query -W -f '${Version}' golang-etcd-server-dev"),
        "redis_py": redis_py,
        "kazoo": kazoo_v,
        "python": platform.python_version(),
        "dlock_commit": sh(f"git -C {HERE} rev-parse --short HEAD"),
        "load_at_start": sh("cat /proc/loadavg"),
    }


class Runner:
    def __init__(self, bench, quick):
        self.bench = bench
        self.quick = quick
        self.runs = []
        self.store_label = ""

    def run(self, label, argv, timeout):
        """Runs one scenario process; keeps its JSON (or the error) under `label`."""
        print(f"  {label}: {' '.join(argv[1:]) if argv[0] == self.bench else ' '.join(argv)}", file=sys.stderr)
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
            lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
            rec = json.loads(lines[-1]) if lines else {"error": f"exit {p.returncode}: {p.stderr.strip()[-500:]}"}
            if p.returncode != 0 and "error" not in rec:
                rec["error"] = f"exit {p.returncode}: {p.stderr.strip()[-500:]}"
        except subprocess.TimeoutExpired:
            rec = {"error": f"timed out after {timeout}s"}
        rec["label"] = label
        rec["argv"] = argv[1:]
        rec["store"] = self.store_label
        if "error" in rec:
            print(f"    ERROR: {rec['error']}", file=sys.stderr)
        self.runs.append(rec)
        return rec

    def dlock(self, label, url, scenario, *args, timeout=300):
        return self.run(label, [self.bench, "--url", url, "--scenario", scenario, *map(str, args)], timeout)

    def measure(self, label, impl, fn):
        """Runs one scenario that run_bench.py drives itself (election.py)."""
        print(f"  {label}: {impl}", file=sys.stderr)
        rec = {"label": label, "store": self.store_label, "impl": impl}
        try:
            rec["result"] = fn()
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
            rec["error"] = str(e)
            print(f"    ERROR: {rec['error']}", file=sys.stderr)
        self.runs.append(rec)
        return rec

    def peer(self, label, script, url, scenario, *args, timeout=300):
        script, *extra = script  # (script, its own arguments...)
        return self.run(label, [sys.executable, os.path.join(HERE, "peers", script), *extra, "--url", url,
                                "--scenario", scenario, *map(str, args)], timeout)


def with_session(url, store, session_ms):
    """The store URL with a session timeout of session_ms (file:// has none:
    a session lives as long as its process)."""
    key = {"zk": "session_timeout", "redis": "ttl", "etcd": "ttl"}.get(store)
    if not key:
        return url
    return url + ("&" if "?" in url else "?") + f"{key}={session_ms}ms"


def election_participants(a, url, store):
    """(impl, argv_of) pairs: argv_of(name) returns the participant i's argv
    for (i, rounds, hold_ms). Curator's LeaderLatch and kazoo's Election on zk."""
    ms = a.session_ms
    out = [("dlock", lambda name: lambda i, n, h: [
        a.participant, "--url", with_session(url, store, ms), "--name", name, "--value", f"p{i}",
        "--rounds", str(n), "--hold-ms", str(h)])]
    if store == "zk":
        hostport = url[len("zk://"):].split("/")[0].split("?")[0]
        if a.curator_classpath:
            out.append(("curator", lambda name: lambda i, n, h: [
                "java", "-cp", a.curator_classpath, "CuratorLatch", hostport, "/" + name, f"p{i}", str(n), str(h),
                str(ms)]))
        out.append(("kazoo", lambda name: lambda i, n, h: [
            sys.executable, os.path.join(HERE, "peers", "kazoo_election.py"), "--url", url, "--name", "/" + name,
            "--value", f"p{i}", "--rounds", str(n), "--hold-ms", str(h), "--session-ms", str(ms)]))
    return out


def run_elections(r, a, url, store, quick):
    """Failover and handover (election.py) for dlock and the peers, the same
    shapes and session timeout for all."""
    procs, rounds, hold_ms = (3, 2, 50) if quick else (4, 5, 50)
    for impl, argv_for in election_participants(a, url, store):
        tag = f"bench/election-{os.getpid()}-{time.monotonic_ns()}"
        r.measure("failover", impl, lambda: election.failover(argv_for(tag + "-f"), procs, deadline_s=120))
        r.measure("handover", impl, lambda: election.handover(argv_for(tag + "-h"), procs, rounds, hold_ms,
                                                              deadline_s=120))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--command", default="bench/run.sh")
    ap.add_argument("--only", help="one store (mem, file, redis, zk, etcd): writes STORE.json, not latest.json")
    ap.add_argument("--rounds", type=int, help="interleaved rounds of cycles, handoff, contended (default 3)")
    ap.add_argument("--go-mutex", help="the Go peer's binary (bench/peers/go_mutex.go), for etcd")
    ap.add_argument("--participant", help="dlock-bench-participant, for the election scenarios")
    ap.add_argument("--curator-classpath", help="CuratorLatch's compiled class and Curator's jars (zk)")
    ap.add_argument("--election-only", action="store_true", help="only failover and handover")
    ap.add_argument("--session-ms", type=int, default=2000, help="session timeout of every participant (election)")
    a = ap.parse_args()

    q = a.quick
    secs = 0.5 if q else 3
    rounds = a.rounds or (1 if q else 3)
    waiter_counts = [10, 100] if q else [10, 100, 1000]
    footprint_locks = 50 if q else 1000
    # async-footprint: acquires pending on many locks / on one lock. file://
    # keeps descriptors per pending entry, so it gets fewer locks.
    async_locks = {"file": 50 if q else 1000}
    async_default_locks = 50 if q else 10000
    async_on_one = 50 if q else 1000
    # Scenario shapes (the same for every store and peer).
    handoff = dict(procs=2, threads=1, hold_us=100)
    contended = dict(procs=4, threads=4, hold_us=20)

    # file:// on tmpfs (where the default file:// lives, $XDG_RUNTIME_DIR) and
    # on the disk's file system: its metadata journal costs several times more.
    tmps = [tempfile.mkdtemp(prefix="dlock-bench-", dir=d) for d in ("/dev/shm", None)
            if d is None or os.path.isdir(d)]
    urls = ["mem://"] + [f"file://{t}/locks" for t in tmps] + os.environ.get("DLOCK_TEST_URLS", "").split()
    if os.environ.get("DLOCK_TEST_ZK") and not any(u.startswith("zk://") for u in urls):  # a server by hand
        urls.append("zk://" + os.environ["DLOCK_TEST_ZK"])
    if a.only:
        urls = [u for u in urls if u.split(":", 1)[0] == a.only]
    r = Runner(a.bench, q)
    started = datetime.datetime.now(datetime.timezone.utc)
    try:
        for url in urls:
            store = url.split(":", 1)[0]
            r.store_label = store
            if store == "file":
                r.store_label = "file(" + sh(f"df --output=fstype {url[len('file://'):].rsplit('/', 1)[0]} | tail -1") + ")"
            print(f"{r.store_label}: {url}", file=sys.stderr)
            multi = store != "mem"  # mem:// lives in one process
            peer = {"redis": ("redis_py_lock.py",), "zk": ("kazoo_lock.py",),
                    "etcd": ("go_mutex.py", "--bin", a.go_mutex) if a.go_mutex else None}.get(store)
            # The machine is shared: rounds interleave dlock, the floors and
            # the peer, so a burst of someone else's load hits them alike;
            # the table shows the median round.
            shape = lambda sh_: ("--procs", sh_["procs"], "--threads", sh_["threads"],  # noqa: E731
                                 "--hold-us", sh_["hold_us"])
            if a.participant and multi:
                run_elections(r, a, url, store, q)
            if a.election_only:
                continue
            for _ in range(rounds):
                r.dlock("cycles", url, "cycles", "--seconds", secs)
                if store in ("redis", "zk", "file", "etcd"):
                    r.dlock("cycles", url, "floor", "--seconds", secs)
                if store == "etcd":
                    r.dlock("cycles", url, "floor", "--floor", "dlock-txns", "--seconds", secs)
                if store == "redis":
                    r.dlock("cycles", url, "floor", "--floor", "setnx", "--seconds", secs)
                if store == "file":
                    r.dlock("cycles", url, "floor", "--floor", "flock", "--seconds", secs)
                if peer:
                    r.peer("cycles", peer, url, "cycles", "--seconds", secs)
            for _ in range(rounds):
                if multi:
                    r.dlock("handoff", url, "contend", "--seconds", secs, *shape(handoff))
                if peer:
                    r.peer("handoff", peer, url, "contend", "--seconds", secs, *shape(handoff))
            for _ in range(rounds):
                r.dlock("contended", url, "contend", "--seconds", secs, *shape(contended))
                if peer:
                    r.peer("contended", peer, url, "contend", "--seconds", secs, *shape(contended))
            for w in waiter_counts:
                r.dlock(f"waiters/{w}", url, "waiters", "--waiters", w, "--procs", 4, "--pool", 10, "--hold-us", 20,
                        "--name", f"bench/waiters-{w}")
            if multi:
                r.dlock("footprint", url, "footprint", "--locks", footprint_locks, "--seconds", secs)
                r.dlock("async-footprint", url, "async-footprint", "--locks",
                        async_locks.get(store, async_default_locks), "--on-one", async_on_one, timeout=1500)
    finally:
        for t in tmps:
            shutil.rmtree(t, ignore_errors=True)

    doc = {
        "command": a.command + (" --quick" if q else "") + (f" --only {a.only}" if a.only else "")
        + (f" --rounds {a.rounds}" if a.rounds else ""),
        "started": started.isoformat(timespec="seconds"),
        "machine": machine(),
        "shapes": {"seconds": secs, "cycle_rounds": rounds, "handoff": handoff, "contended": contended,
                   "waiters": {"counts": waiter_counts, "procs": 4, "pool": 10, "hold_us": 20},
                   "footprint_locks": footprint_locks,
                   "election": {"session_ms": a.session_ms, "procs": 3 if q else 4, "rounds": 2 if q else 5,
                                "hold_ms": 50},
                   "async_footprint": {"locks": async_locks, "locks_default": async_default_locks,
                                       "on_one": async_on_one}},
        "runs": r.runs,
    }
    rows = plot.table_rows(doc)
    doc["table"] = rows
    os.makedirs(a.out, exist_ok=True)
    # A --quick run is a check, not a result: it must not replace the last real run.
    # So must a run of one store (--only): it writes STORE.json.
    # So must a run of the election alone (--election-only): election.json.
    name = "-".join(filter(None, ["election" if a.election_only else None, a.only])) or "latest"
    base = os.path.join(a.out, f"quick-{name}" if q and name != "latest" else "quick" if q else name)
    with open(base + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    with open(base + ".svg", "w") as f:
        f.write(plot.svg(doc))
    print(plot.format_table(rows))
    print(f"\nwrote {base}.json and {base}.svg", file=sys.stderr)
    errors = [x for x in r.runs if "error" in x]
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
