#!/usr/bin/env python3
"""Failover and handover of an election, for run_bench.py (docs/benchmarks.md,
"Failover and handover").

Every participant, whatever its language, is a process that writes
  STARTED <ns>   LEADER <ns> [...]   RESIGN <ns>
to stdout, stamped with CLOCK_MONOTONIC (bench/election_participant.cpp,
bench/peers/CuratorLatch.java, bench/peers/kazoo_election.py). One clock for
every process of the machine makes their stamps comparable:

- failover: PROCS participants hold their term until killed. Once all have
  started (and a moment more, for their entries to exist), the leader is
  SIGKILLed; the time from the kill to the next LEADER line is one sample.
  It is bound below by the session timeout (the store must notice the
  death), the same for every client of the run.
- handover: PROCS participants lead ROUNDS terms of HOLD_MS each and resign;
  the time from a RESIGN line to the next LEADER line is one sample.
"""
import os
import queue
import signal
import subprocess
import threading
import time

from peers import common  # bench/ is on the path of every caller


def summary(samples_ns, started_ns):
    us = [x / 1000 for x in samples_ns]
    return {"handoff_us": {"p50": common.percentile(us, 50) if us else None,
                           "p90": common.percentile(us, 90) if us else None, "max": max(us) if us else None},
            "times_ms": [round(x / 1000, 3) for x in us],
            "count": len(us),
            "total_seconds": (time.monotonic_ns() - started_ns) / 1e9}


class Participants:
    """The processes and one queue of (index, words) from all their stdouts."""

    def __init__(self, argvs):
        self.events = queue.Queue()
        self.procs = []
        for i, argv in enumerate(argvs):
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                 start_new_session=True)
            self.procs.append(p)
            threading.Thread(target=self._read, args=(i, p), daemon=True).start()

    def _read(self, i, p):
        for line in p.stdout:
            words = line.split()
            if words and words[0] in ("STARTED", "LEADER", "RESIGN"):
                self.events.put((i, words[0], int(words[1])))
        self.events.put((i, "EXIT", time.monotonic_ns()))

    def next(self, timeout):
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def kill(self, i):
        try:
            os.killpg(self.procs[i].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self):
        for i in range(len(self.procs)):
            self.kill(i)
        for p in self.procs:
            p.wait()


def failover(argv_of, procs, deadline_s, settle_s=1.0):
    """argv_of(i, rounds, hold_ms) -> argv. Kills each leader in turn."""
    started_ns = time.monotonic_ns()
    ps = Participants([argv_of(i, 1, -1) for i in range(procs)])
    samples, started, dead = [], set(), set()
    leader, killed_at = None, None
    all_started_at = None
    end = time.monotonic() + deadline_s
    try:
        while len(samples) < procs - 1 and time.monotonic() < end:
            ev = ps.next(0.02)
            if ev:
                i, kind, ns = ev
                if kind == "STARTED":
                    started.add(i)
                    if len(started) == procs:
                        all_started_at = time.monotonic()
                elif kind == "LEADER" and i not in dead:
                    if killed_at is not None:
                        samples.append(ns - killed_at)
                    leader, killed_at = i, None
                elif kind == "EXIT" and i not in dead:
                    raise RuntimeError(f"participant {i} exited: {ps.procs[i].wait()}")
            settled = all_started_at is not None and time.monotonic() >= all_started_at + settle_s
            if leader is not None and killed_at is None and settled:
                dead.add(leader)
                killed_at = time.monotonic_ns()
                ps.kill(leader)
    finally:
        ps.close()
    if len(samples) < procs - 1:
        raise RuntimeError(f"failover: {len(samples)} of {procs - 1} samples within {deadline_s}s")
    return summary(samples, started_ns)


def handover(argv_of, procs, rounds, hold_ms, deadline_s):
    """Every participant leads `rounds` terms; samples resign -> next leader."""
    started_ns = time.monotonic_ns()
    ps = Participants([argv_of(i, rounds, hold_ms) for i in range(procs)])
    events, exited = [], set()
    end = time.monotonic() + deadline_s
    try:
        while len(exited) < procs and time.monotonic() < end:
            ev = ps.next(0.1)
            if not ev:
                continue
            i, kind, ns = ev
            if kind == "EXIT":
                exited.add(i)
                if ps.procs[i].wait() != 0:
                    raise RuntimeError(f"participant {i} exited with {ps.procs[i].returncode}")
            else:
                events.append((ns, kind, i))
    finally:
        ps.close()
    if len(exited) < procs:
        raise RuntimeError(f"handover: {procs - len(exited)} participants still running after {deadline_s}s")
    return summary(handover_samples(events), started_ns)


def handover_samples(events):
    """RESIGN -> next LEADER times from (ns, kind, participant) events; raises
    if a participant was told it leads while another still did."""
    samples, leading, resigned = [], None, None
    for ns, kind, i in sorted(events):
        if kind == "RESIGN":
            leading, resigned = None, ns
        elif kind == "LEADER":
            if leading is not None:
                raise RuntimeError(f"two leaders: participant {i} was told it leads while {leading} did")
            leading = i
            if resigned is not None:
                samples.append(ns - resigned)
                resigned = None
    return samples
