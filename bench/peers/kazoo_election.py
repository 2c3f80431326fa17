#!/usr/bin/env python3
"""Peer: kazoo's Election (built on kazoo's Lock), one participant of the
election benchmark (bench/election.py). The same lines as
bench/election_participant.cpp, stamped with time.monotonic_ns:
  STARTED <ns> / LEADER <ns> / RESIGN <ns>
  kazoo_election.py --url zk://HOST:PORT --name PATH --rounds N --hold-ms MS --session-ms MS
--hold-ms -1 holds the first term until the process is killed."""
import argparse
import logging
import os
import sys
import time
import urllib.parse

from kazoo.client import KazooClient


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--name", default="/dlock-bench-kazoo/election")
    ap.add_argument("--value", default="kazoo")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--hold-ms", type=int, default=100)
    ap.add_argument("--session-ms", type=int, default=10000)
    a = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    u = urllib.parse.urlparse(a.url)
    zk = KazooClient(hosts=f"{u.hostname}:{u.port}", timeout=a.session_ms / 1000)
    zk.start(timeout=30)
    say(f"STARTED {time.monotonic_ns()}")

    def lead():
        say(f"LEADER {time.monotonic_ns()}")
        if a.hold_ms < 0:
            time.sleep(3600)
            os._exit(0)
        time.sleep(a.hold_ms / 1000)
        say(f"RESIGN {time.monotonic_ns()}")
        # returning ends the term: Election.run releases its lock node

    for _ in range(a.rounds):
        zk.Election(a.name, a.value).run(lead)
    os._exit(0)  # kazoo's threads would otherwise keep the process alive a while


if __name__ == "__main__":
    main()
