// Test helpers shared by the redis store tests: time, specs, opening stores
// and sessions (polling and the state log are in tests/support).
#ifndef DLOCK_TESTS_REDIS_REDIS_TEST_UTIL_HPP_
#define DLOCK_TESTS_REDIS_REDIS_TEST_UTIL_HPP_

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "dlock/store.hpp"
#include "support/poll.hpp"       // Eventually
#include "support/state_log.hpp"  // StateLog

namespace dlock::testing {

using SteadyTime = std::chrono::steady_clock::time_point;
using std::chrono::milliseconds;
using namespace std::chrono_literals;

inline SteadyTime Now() { return std::chrono::steady_clock::now(); }
inline Clock::time_point In(milliseconds d) { return Now() + d; }
inline long long MsSince(SteadyTime t) { return std::chrono::duration_cast<milliseconds>(Now() - t).count(); }

// `session` waits for any of `ids` in `queue`, on a thread of its own.
inline std::future<Status> WaitInBackground(Session& session, std::string queue, std::vector<std::string> ids,
                                            Clock::time_point deadline, std::stop_token stop = {}) {
  return std::async(std::launch::async, [&session, queue = std::move(queue), ids = std::move(ids), deadline, stop] {
    return session.wait_any_gone(queue, ids, deadline, stop);
  });
}

inline std::string Hex(std::size_t n) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string out;
  while (out.size() < n) out.push_back("0123456789abcdef"[rng() % 16]);
  return out;
}

inline EntrySpec Spec(std::string kind = "lock", std::string attempt = Hex(32)) {
  EntrySpec s;
  s.kind = std::move(kind);
  s.attempt_id = std::move(attempt);
  s.owner.host = "testhost";
  s.owner.pid = ::getpid();
  s.owner.thread = "t1";
  s.owner.label = "redis_store_test";
  s.owner.acquired_unix_ms = 1700000000000;
  return s;
}

inline std::string Channel(const std::string& queue) { return "dlock:{" + queue + "}:c"; }

inline std::shared_ptr<Store> MustOpen(const std::string& url) {
  auto s = OpenStore(url);
  EXPECT_TRUE(s.ok()) << url << ": " << s.status().to_string();
  return s.ok() ? *s : nullptr;
}

inline std::shared_ptr<Session> MustSession(Store& store) {
  auto s = store.open_session(In(5s));
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? *s : nullptr;
}

inline std::vector<std::string> Ids(const std::vector<Entry>& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(e.id);
  return out;
}

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_REDIS_REDIS_TEST_UTIL_HPP_
