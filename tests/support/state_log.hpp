// Test support: a record of the states a session goes through, with the
// (steady) time each was reported.
#ifndef DLOCK_TESTS_SUPPORT_STATE_LOG_HPP_
#define DLOCK_TESTS_SUPPORT_STATE_LOG_HPP_

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "dlock/store.hpp"

namespace dlock::testing {

class StateLog {
 public:
  using Time = std::chrono::steady_clock::time_point;

  StateLog() = default;
  explicit StateLog(Session& session) { attach(session); }
  StateLog(const StateLog&) = delete;
  StateLog& operator=(const StateLog&) = delete;

  // Starts recording `session`'s changes (one session per log).
  void attach(Session& session);
  // When `state` was first reported, if it was.
  std::optional<Time> when(SessionState state);
  // The same, waiting at most `timeout` for it.
  std::optional<Time> WaitFor(SessionState state, std::chrono::milliseconds timeout);
  // Every state reported so far, in order.
  std::vector<SessionState> states();

 private:
  std::optional<Time> FindLocked(SessionState state) const;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<SessionState, Time>> events_;
  std::shared_ptr<void> subscription_;  // last: unsubscribed first
};

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_SUPPORT_STATE_LOG_HPP_
