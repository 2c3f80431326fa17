// File: dlock/timeout.hpp
//
// Converts the standard library's durations and time points into the
// relative timeouts dlock's acquire calls take, without overflow: a
// `time_point::max()` or a huge duration means "no timeout".
#ifndef DLOCK_TIMEOUT_HPP_
#define DLOCK_TIMEOUT_HPP_

#include <chrono>

#include <string_view>

#include "dlock/clock.hpp"
#include "dlock/export.hpp"
#include "dlock/status.hpp"

namespace dlock {

inline constexpr Clock::duration kForever = Clock::duration::max();

template <class Rep, class Period>
constexpr Clock::duration ToTimeout(const std::chrono::duration<Rep, Period>& d) noexcept {
  using Wide = std::chrono::duration<long double, std::nano>;
  const Wide wide = std::chrono::duration_cast<Wide>(d);
  if (wide <= Wide::zero()) return Clock::duration::zero();
  if (wide >= Wide(static_cast<long double>(kForever.count()))) return kForever;
  return std::chrono::duration_cast<Clock::duration>(d);
}

template <class C, class D>
Clock::duration ToTimeout(const std::chrono::time_point<C, D>& tp) {
  if (tp == std::chrono::time_point<C, D>::max()) return kForever;
  return ToTimeout(tp - C::now());
}

// Parses "500ms", "10s", "2m", "1h", "250us": a number and a unit. A bare
// number ("10") is refused, since it could mean any unit. kInvalidArgument
// names what is wrong and shows the accepted forms.
DLOCK_EXPORT Result<std::chrono::milliseconds> ParseDuration(std::string_view text);

}  // namespace dlock

#endif  // DLOCK_TIMEOUT_HPP_
