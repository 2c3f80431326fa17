// Internal: whether a Clock is the one Clock::system() returns (real time,
// steady_clock), so that a wait may hand its deadline to the kernel
// (poll's timeout) instead of following the clock's on_advance().
#ifndef DLOCK_SRC_CORE_SYSTEM_CLOCK_HPP_
#define DLOCK_SRC_CORE_SYSTEM_CLOCK_HPP_

#include "dlock/clock.hpp"

namespace dlock::internal {

bool IsSystemClock(const Clock& clock) noexcept;

}  // namespace dlock::internal

#endif  // DLOCK_SRC_CORE_SYSTEM_CLOCK_HPP_
