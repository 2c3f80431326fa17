// Collects an Election observer's reports for a test. The observer's
// function shares them with this object, as election.hpp asks: a report
// already running when the observing handle goes is not waited for, and may
// come after this object is gone (a vector captured by reference was written
// after its test returned: TSan, CI).
#ifndef DLOCK_TESTS_SUPPORT_OBSERVATION_REPORTS_HPP_
#define DLOCK_TESTS_SUPPORT_OBSERVATION_REPORTS_HPP_

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "dlock/dlock.hpp"

namespace dlock::testing {

class ObservationReports {
 public:
  // The function to give Election::observe.
  std::function<void(const Observation&)> fn() const {
    return [shared = shared_](const Observation& o) {
      std::lock_guard<std::mutex> g(shared->mu);
      shared->seen.push_back(o);
      shared->cv.notify_all();
    };
  }
  // Waits (a bounded time, far beyond what any store needs) until there are
  // at least `n` reports; returns them all.
  std::vector<Observation> at_least(std::size_t n, std::chrono::seconds limit = std::chrono::seconds(60)) const {
    std::unique_lock<std::mutex> g(shared_->mu);
    shared_->cv.wait_for(g, limit, [&] { return shared_->seen.size() >= n; });
    return shared_->seen;
  }
  std::vector<Observation> all() const {
    std::lock_guard<std::mutex> g(shared_->mu);
    return shared_->seen;
  }
  std::size_t size() const {
    std::lock_guard<std::mutex> g(shared_->mu);
    return shared_->seen.size();
  }

 private:
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Observation> seen;
  };
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
};

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_SUPPORT_OBSERVATION_REPORTS_HPP_
