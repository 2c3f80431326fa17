"""Shared by the peer scripts: the same statistics dlock-bench computes
(see Analyze() in bench/dlock_bench.cpp), over (acq_ns, rel_ns, proc, thread)
records taken with time.monotonic_ns(), i.e. CLOCK_MONOTONIC like the driver."""
import math
import multiprocessing as mp
import threading
import time


def percentile(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    return float(v[min(len(v) - 1, math.ceil(p / 100 * len(v)) - 1)])


def inversions(seq):
    """Pairs out of order (merge sort)."""
    if len(seq) < 2:
        return seq, 0
    mid = len(seq) // 2
    left, a = inversions(seq[:mid])
    right, b = inversions(seq[mid:])
    out, i, j, n = [], 0, 0, a + b
    while i < len(left) and j < len(right):
        if right[j] < left[i]:
            n += len(left) - i
            out.append(right[j])
            j += 1
        else:
            out.append(left[i])
            i += 1
    return out + left[i:] + right[j:], n


def analyze(recs):
    """recs: (acq_ns, rel_ns, proc, thread, req_ns)."""
    recs = sorted(recs)
    out = {"holds": len(recs)}
    if len(recs) < 2:
        return out
    gaps, cross, same, overlaps, changes, per = [], [], 0, 0, 0, {}
    per[(recs[0][2], recs[0][3])] = 1
    for prev, cur in zip(recs, recs[1:]):
        per[(cur[2], cur[3])] = per.get((cur[2], cur[3]), 0) + 1
        overlaps += cur[0] < prev[1]
        if (cur[2], cur[3]) == (prev[2], prev[3]):
            same += 1
            continue
        changes += 1
        if cur[4] > prev[1]:
            continue  # not waiting when the lock was let go: not a handoff
        gaps.append(cur[0] - prev[1])
        if cur[2] != prev[2]:
            cross.append(cur[0] - prev[1])
    span = (recs[-1][1] - recs[0][0]) / 1e9
    counts = list(per.values())
    out.update({
        "seconds": span,
        "holds_per_sec": len(recs) / span,
        "handoffs_per_sec": changes / span,
        "overlaps": overlaps,
        "holders": len(per),
        "fairness_jain": sum(counts) ** 2 / (len(counts) * sum(c * c for c in counts)),
        "holds_min": min(counts),
        "holds_max": max(counts),
        "reacquire_fraction": same / (len(recs) - 1),
        "overtakes_per_hold": inversions([r[4] for r in recs])[1] / len(recs),
        "handoff_us": {"n": len(gaps), "p50": percentile(gaps, 50) / 1e3, "p90": percentile(gaps, 90) / 1e3,
                       "p99": percentile(gaps, 99) / 1e3, "max": percentile(gaps, 100) / 1e3},
        "cross_process_handoff_us": {"n": len(cross), "p50": percentile(cross, 50) / 1e3,
                                     "p99": percentile(cross, 99) / 1e3},
    })
    return out


def spin(us):
    until = time.monotonic_ns() + us * 1000
    while time.monotonic_ns() < until:
        pass


def cycles(make_lock, seconds, max_ops):
    """Scenario 1: one client, acquire then release, in a loop."""
    lock = make_lock()
    for _ in range(10):
        lock.acquire()
        lock.release()
    n, start = 0, time.monotonic()
    while n < max_ops and time.monotonic() - start < seconds:
        lock.acquire()
        lock.release()
        n += 1
    s = time.monotonic() - start
    return {"cycles": n, "seconds": s, "cycles_per_sec": n / s}


def _contend_worker(make_lock, proc, threads, seconds, hold_us, max_ops, start_at, out):
    recs = []

    def run(thread):
        lock = make_lock()  # a lock object (and connection) per thread, as the peers intend
        while time.monotonic() < start_at:
            time.sleep(0.001)
        while time.monotonic() < start_at + seconds and len(recs) < max_ops:
            req = time.monotonic_ns()
            lock.acquire()
            acq = time.monotonic_ns()
            spin(hold_us)
            rel = time.monotonic_ns()
            lock.release()
            recs.append((acq, rel, proc, thread, req))

    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put(recs)


def contend(make_lock, procs, threads, seconds, hold_us, max_ops):
    """Scenarios 2/3: processes (with threads) taking turns on one lock."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    start_at = time.monotonic() + 2.0  # every process has connected by then
    ps = [ctx.Process(target=_contend_worker,
                      args=(make_lock, i, threads, seconds, hold_us, max_ops, start_at, q))
          for i in range(procs)]
    for p in ps:
        p.start()
    recs = []
    for _ in ps:
        recs += q.get(timeout=seconds + 120)
    for p in ps:
        p.join()
    out = analyze(recs)
    out.update({"procs": procs, "threads": threads, "hold_us": hold_us})
    return out
