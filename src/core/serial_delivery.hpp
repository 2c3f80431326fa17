// Internal: runs notifications one at a time, in the order they were posted,
// so that listeners hear state changes in order and may call back into the
// code that posts them.
#ifndef DLOCK_SRC_CORE_SERIAL_DELIVERY_HPP_
#define DLOCK_SRC_CORE_SERIAL_DELIVERY_HPP_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>

#include "core/thread_annotations.hpp"

namespace dlock::internal {

// Tasks run on the thread that posts them while no other thread is running
// tasks; otherwise the running thread runs them too, in order. run() returns
// once the caller's task has run, except when called from inside a task on
// the running thread: then it returns at once and the task runs right after
// the current one returns (so a listener that closes its session neither
// deadlocks nor hears the close before the note it is handling). A task that
// throws is skipped. Thread-safe.
class SerialDelivery {
 public:
  void run(std::function<void()> task) DLOCK_EXCLUDES(mu_) { deliver(std::move(task), true); }

  // The same, except that while another thread is running tasks it hands
  // `task` over to that thread and returns at once. For deliveries from
  // several sources to one set of listeners that may call back into those
  // sources: a thread that waited there could wait for itself.
  void post(std::function<void()> task) DLOCK_EXCLUDES(mu_) { deliver(std::move(task), false); }

 private:
  void deliver(std::function<void()> task, bool wait_for_others) DLOCK_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    queue_.push_back(std::move(task));
    const std::uint64_t ticket = ++posted_;
    if (running_) {
      if (runner_ == std::this_thread::get_id() || !wait_for_others) return;  // runs after the current one
      done_cv_.wait(lock.native(), [&] {
        mu_.assert_held();
        return done_ >= ticket;
      });
      return;
    }
    running_ = true;
    runner_ = std::this_thread::get_id();
    while (!queue_.empty()) {
      std::function<void()> next = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      try {
        next();
      } catch (...) {  // a listener's exception must not stop the others
      }
      next = nullptr;  // destroyed outside the lock too
      lock.lock();
      ++done_;
      done_cv_.notify_all();
    }
    running_ = false;
    runner_ = std::thread::id();
  }

  Mutex mu_;
  std::condition_variable done_cv_;
  std::deque<std::function<void()>> queue_ DLOCK_GUARDED_BY(mu_);
  bool running_ DLOCK_GUARDED_BY(mu_) = false;
  std::thread::id runner_ DLOCK_GUARDED_BY(mu_);
  std::uint64_t posted_ DLOCK_GUARDED_BY(mu_) = 0;
  std::uint64_t done_ DLOCK_GUARDED_BY(mu_) = 0;
};

}  // namespace dlock::internal

#endif  // DLOCK_SRC_CORE_SERIAL_DELIVERY_HPP_
