#include "support/poll.hpp"

#include <thread>

namespace dlock::testing {

bool Eventually(const std::function<bool()>& cond, std::chrono::milliseconds limit, std::chrono::milliseconds step) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(step);
  }
  return cond();
}

}  // namespace dlock::testing
