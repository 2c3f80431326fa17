#include "dlock/clock.hpp"

#include "core/listeners.hpp"
#include "core/system_clock.hpp"

#include <algorithm>
#include <atomic>

namespace dlock {
namespace {

class SystemClock final : public Clock {
 public:
  time_point now() const noexcept override { return std::chrono::steady_clock::now(); }

  bool wait_until(std::condition_variable_any& cv, std::unique_lock<std::mutex>& lock, std::stop_token stop,
                  time_point deadline, const std::function<bool()>& ready) const override {
    if (deadline == kNoDeadline) return cv.wait(lock, stop, ready);
    return cv.wait_until(lock, stop, deadline, ready);
  }

  std::shared_ptr<void> on_advance(std::function<void()>) override { return nullptr; }
};

}  // namespace

std::shared_ptr<Clock> Clock::system() { return std::make_shared<SystemClock>(); }

namespace internal {
bool IsSystemClock(const Clock& clock) noexcept { return dynamic_cast<const SystemClock*>(&clock) != nullptr; }
}  // namespace internal

Clock::time_point DeadlineAfter(Clock::time_point now, Clock::duration timeout) noexcept {
  if (timeout <= Clock::duration::zero()) return now;
  if (timeout >= kNoDeadline - now) return kNoDeadline;
  return now + timeout;
}

struct ManualClock::Listeners {
  std::atomic<Clock::time_point::rep> now{0};
  internal::ListenerList<> advanced;
};

ManualClock::ManualClock(time_point start) : listeners_(std::make_shared<Listeners>()) {
  listeners_->now = start.time_since_epoch().count();
}

Clock::time_point ManualClock::now() const noexcept { return time_point(duration(listeners_->now.load())); }

bool ManualClock::wait_until(std::condition_variable_any& cv, std::unique_lock<std::mutex>& lock, std::stop_token stop,
                             time_point deadline, const std::function<bool()>& ready) const {
  // Time moves only in advance(), whose listeners notify `cv`: re-check the
  // deadline on every wake-up instead of timing the wait.
  cv.wait(lock, stop, [&] { return ready() || now() >= deadline; });
  return ready();
}

std::shared_ptr<void> ManualClock::on_advance(std::function<void()> fn) {
  return listeners_->advanced.add(std::move(fn));
}

void ManualClock::advance(duration by) {
  listeners_->now += by.count();
  listeners_->advanced.notify();
}

}  // namespace dlock
