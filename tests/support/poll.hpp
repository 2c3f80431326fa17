// Test support: waiting, bounded, for a condition no event announces (a
// thread now blocked in the store, a server's subscription count). Used by
// the tests and by the chaos runner (tools/chaos).
#ifndef DLOCK_TESTS_SUPPORT_POLL_HPP_
#define DLOCK_TESTS_SUPPORT_POLL_HPP_

#include <chrono>
#include <functional>

namespace dlock::testing {

// Calls `cond` every `step` until it holds or `limit` has passed; the last
// call is made after the limit. The limit bounds a failing test only: a
// condition that holds ends the wait at once, so it can be generous.
bool Eventually(const std::function<bool()>& cond, std::chrono::milliseconds limit = std::chrono::seconds(20),
                std::chrono::milliseconds step = std::chrono::milliseconds(2));

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_SUPPORT_POLL_HPP_
