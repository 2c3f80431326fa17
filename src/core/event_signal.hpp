// Internal: an eventfd one thread signals and another polls (a stop request,
// a clock advance, new work), owned like a UniqueFd.
#ifndef DLOCK_SRC_CORE_EVENT_SIGNAL_HPP_
#define DLOCK_SRC_CORE_EVENT_SIGNAL_HPP_

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/unique_fd.hpp"
#include "dlock/status.hpp"

namespace dlock::internal {

class EventSignal {
 public:
  // A non-blocking, close-on-exec eventfd; kUnavailable if the process is out
  // of descriptors.
  static Result<EventSignal> create() {
    UniqueFd fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!fd.valid()) return UnavailableError(std::string("eventfd: ") + std::strerror(errno));
    return EventSignal(std::move(fd));
  }

  // For poll(2): readable once signalled, until drained.
  int fd() const noexcept { return fd_.get(); }
  // Safe from any thread, and from a signal handler. Never blocks: a counter
  // that is already huge stays readable, which is all a waiter needs.
  void signal() const noexcept {
    std::uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(fd_.get(), &one, sizeof one);
  }
  // Makes it unreadable until the next signal.
  void drain() const noexcept {
    std::uint64_t value;
    [[maybe_unused]] ssize_t n = ::read(fd_.get(), &value, sizeof value);
  }

 private:
  explicit EventSignal(UniqueFd fd) noexcept : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

}  // namespace dlock::internal

#endif  // DLOCK_SRC_CORE_EVENT_SIGNAL_HPP_
