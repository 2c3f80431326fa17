// Internal: the one thread of a client on which asynchronous acquisitions
// advance, with one timer queue for all of their deadlines and pauses.
#ifndef DLOCK_SRC_CORE_EXECUTOR_HPP_
#define DLOCK_SRC_CORE_EXECUTOR_HPP_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <utility>

#include "core/thread_annotations.hpp"
#include "dlock/clock.hpp"

namespace dlock::internal {

// Runs posted tasks one at a time, in the order they were posted, and timed
// tasks when the injected clock reaches their time (re-checked whenever a
// hand-moved clock advances). The thread starts with the first task. A task
// that throws is dropped. Thread-safe.
//
// Tasks are the engine's small steps: they must not block for long, and
// never wait for another task (the thread would wait for itself).
class Executor {
 public:
  using TimerId = std::uint64_t;

  explicit Executor(std::shared_ptr<Clock> clock);
  // Stops the thread; tasks not yet run are destroyed without running. From
  // a task of this executor, the thread is detached instead of joined.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Stops the thread now, as the destructor does; later tasks are dropped.
  void shut_down() noexcept;

  void post(std::function<void()> task);
  // Runs `task` at `when` (at once if it has passed), unless cancelled first.
  TimerId at(Clock::time_point when, std::function<void()> task);
  // Drops a timer that has not started; a no-op for one that has.
  void cancel(TimerId id) noexcept;

  // True on the executor's own thread.
  bool in_executor() const noexcept;

  const Clock& clock() const noexcept;

  // Shared with the thread, which may outlive the Executor when the last
  // owner of the Executor goes inside one of its tasks. (Named here only so
  // that executor.cpp can give the thread an entry point of internal
  // linkage: std::thread's type-erased state for a lambda of this class was
  // exported from libdlock.so.)
  class Queue;

 private:
  std::shared_ptr<Queue> queue_;
  std::shared_ptr<void> advanced_;
};

}  // namespace dlock::internal

#endif  // DLOCK_SRC_CORE_EXECUTOR_HPP_
