// The chaos ledger and its checker.
//
// One line per event, appended with a single write(2) by whoever saw it;
// times are CLOCK_MONOTONIC nanoseconds of the host (all processes share it):
//
//   C key=value ...                               the run's settings (runner)
//   B slot pid begin thread lock                  an acquire attempt begins (worker thread)
//   W slot pid begin end outcome thread lock      it ended: ok, timeout, cancelled, error:Code
//   H slot pid token wait_begin start end uncertain lost state obs lock mode thread
//                                                 one hold: writes to the resource happen at
//                                                 start and end; uncertain/lost are when the
//                                                 holder was told (-1: never); state at end;
//                                                 obs: when the last sample of the hold that
//                                                 saw kHeld began (-1: none); mode x
//                                                 (exclusive), w or r (ReadWriteLock)
//                                                 (thread, lock, obs, mode: absent in older
//                                                 ledgers: 0, chaos/lock, -1, x)
//   F kind pid t0 t1 [detail]                     a fault: kill, stop, restart, cut, drop, delay,
//                                                 leader, rollback (detail: the age of the data
//                                                 restored, ms), failover, partition (detail:
//                                                 the role of the server cut off; restart and
//                                                 leader on etcd3: member=N, the one killed)
//                                                 (pid -1 when it hit the server or the network)
//   P pid t0 why                                  a SIGSTOP begins (why: holder, random); its
//                                                 "F stop pid t0 t1" is written when it ends
//   D pid status                                  a worker died on its own (a crash)
//   HUNG pid t                                    a worker did not stop when asked
//   STUCK t text                                  the runner's watchdog found it stuck (the
//                                                 diagnosis is in OUT/stuck.txt and on stderr)
#ifndef DLOCK_TOOLS_CHAOS_LEDGER_HPP_
#define DLOCK_TOOLS_CHAOS_LEDGER_HPP_

#include <cstdint>
#include <ostream>
#include <set>
#include <string>

namespace dlock::chaos {

std::int64_t MonotonicNanos();

// Appends `line` (ending in '\n') to the ledger in one write.
void AppendLine(int fd, const std::string& line);

struct CheckOptions {
  std::int64_t acquire_timeout_ms = 0;      // 0: read from the C line
  std::int64_t liveness_slack_ms = 15'000;  // beyond the timeout a wait may take (round trips, restarts)
  std::int64_t orphans = -1;                // entries left in the store (-1: not checked)
  // Checks whose violations are reported but not counted: failures of the
  // stores that are known and being fixed (fencing, overlaps, token-order,
  // duplicates, hold-level, liveness, crashes, runner, orphans, malformed).
  std::set<std::string> known;
};

// Reads the ledger, writes the report to `out`; returns the number of violations.
int CheckLedger(const std::string& path, const CheckOptions& options, std::ostream& out);

}  // namespace dlock::chaos

#endif  // DLOCK_TOOLS_CHAOS_LEDGER_HPP_
