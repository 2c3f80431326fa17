// File: dlock/clock.hpp
//
// The monotonic clock that every deadline, lease and session timer in dlock
// reads. It is injected (ClientOptions::clock, MemStoreOptions::clock) so that
// tests can move time by hand instead of sleeping. dlock never reads the wall
// clock for a decision; wall time appears only in owner records, for people.
#ifndef DLOCK_CLOCK_HPP_
#define DLOCK_CLOCK_HPP_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <vector>

#include "dlock/export.hpp"

namespace dlock {

// dlock::Clock
//
// Thread-safe. Implementations must be monotonic.
class DLOCK_EXPORT Clock {
 public:
  using duration = std::chrono::steady_clock::duration;
  using time_point = std::chrono::steady_clock::time_point;

  virtual ~Clock() = default;

  virtual time_point now() const noexcept = 0;

  // Blocks on `cv` (whose mutex `lock` holds) until `ready()` is true, `stop`
  // is requested, or `deadline` passes on this clock. Returns `ready()`.
  // Whoever changes what `ready()` reads must notify `cv` under the mutex.
  virtual bool wait_until(std::condition_variable_any& cv, std::unique_lock<std::mutex>& lock, std::stop_token stop,
                          time_point deadline, const std::function<bool()>& ready) const = 0;

  // Registers `fn` to run after the clock jumps forward by hand; returns a
  // handle that unregisters it when destroyed. Clocks driven by real time never
  // call it and may return nullptr. `fn` runs on the thread that moved the
  // clock and must not block.
  virtual std::shared_ptr<void> on_advance(std::function<void()> fn) = 0;

  // A clock reading std::chrono::steady_clock. Stateless; each call returns a
  // new handle to the same time source.
  static std::shared_ptr<Clock> system();
};

// The latest representable time: "no deadline".
inline constexpr Clock::time_point kNoDeadline = Clock::time_point::max();

// Adds `timeout` to `now` without overflowing: a huge timeout means none.
DLOCK_EXPORT Clock::time_point DeadlineAfter(Clock::time_point now, Clock::duration timeout) noexcept;

// dlock::ManualClock
//
// A clock that stands still until `advance()` moves it. For tests. Waiters
// blocked in `wait_until` on a store that registered through `on_advance` are
// re-checked on every advance. Thread-safe.
class DLOCK_EXPORT ManualClock final : public Clock {
 public:
  explicit ManualClock(time_point start = time_point(std::chrono::hours(1)));

  time_point now() const noexcept override;
  bool wait_until(std::condition_variable_any& cv, std::unique_lock<std::mutex>& lock, std::stop_token stop,
                  time_point deadline, const std::function<bool()>& ready) const override;
  std::shared_ptr<void> on_advance(std::function<void()> fn) override;

  void advance(duration by);

 private:
  struct Listeners;
  std::shared_ptr<Listeners> listeners_;
};

}  // namespace dlock

#endif  // DLOCK_CLOCK_HPP_
