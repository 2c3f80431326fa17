#include "support/state_log.hpp"

namespace dlock::testing {

void StateLog::attach(Session& session) {
  subscription_ = session.subscribe([this](SessionState state) {
    std::lock_guard<std::mutex> g(mu_);
    events_.emplace_back(state, std::chrono::steady_clock::now());
    cv_.notify_all();
  });
}

std::optional<StateLog::Time> StateLog::FindLocked(SessionState state) const {
  for (const auto& [s, t] : events_) {
    if (s == state) return t;
  }
  return std::nullopt;
}

std::optional<StateLog::Time> StateLog::when(SessionState state) {
  std::lock_guard<std::mutex> g(mu_);
  return FindLocked(state);
}

std::optional<StateLog::Time> StateLog::WaitFor(SessionState state, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  std::optional<Time> at;
  cv_.wait_for(lk, timeout, [&] { return (at = FindLocked(state)).has_value(); });
  return at;
}

std::vector<SessionState> StateLog::states() {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<SessionState> out;
  for (const auto& e : events_) out.push_back(e.first);
  return out;
}

}  // namespace dlock::testing
