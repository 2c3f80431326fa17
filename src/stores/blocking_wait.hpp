// Internal: Session::wait_any_gone over a store's async_wait_any_gone (file,
// Redis, etcd). The caller blocks until the wait's outcome, the deadline (on
// the store's clock: a hand-moved clock wakes it through on_advance) or
// `stop`; then the wait is cancelled by dropping its handle.
#ifndef DLOCK_SRC_STORES_BLOCKING_WAIT_HPP_
#define DLOCK_SRC_STORES_BLOCKING_WAIT_HPP_

#include <condition_variable>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>

#include "core/thread_annotations.hpp"
#include "dlock/clock.hpp"
#include "dlock/status.hpp"

namespace dlock::internal {

// `start(done)` starts the asynchronous wait and returns its handle.
inline Status AwaitAsyncWait(Clock& clock, std::string_view queue, Clock::time_point deadline, std::stop_token stop,
                             const std::function<std::shared_ptr<void>(std::function<void(Status)>)>& start) {
  struct Box {
    Mutex mu;
    std::condition_variable_any cv;
    std::optional<Status> outcome DLOCK_GUARDED_BY(mu);
  };
  auto box = std::make_shared<Box>();
  std::shared_ptr<void> handle = start([box](Status s) {
    MutexLock lk(box->mu);
    box->outcome = std::move(s);
    box->cv.notify_all();
  });
  std::shared_ptr<void> advanced = clock.on_advance([box] {
    MutexLock lk(box->mu);
    box->cv.notify_all();
  });
  {
    MutexLock lk(box->mu);
    clock.wait_until(box->cv, lk.native(), stop, deadline, [&] {
      box->mu.assert_held();  // the predicate runs under the lock
      return box->outcome.has_value();
    });
    if (box->outcome) return *box->outcome;
  }
  handle.reset();  // kCancelled, unless an outcome came first
  MutexLock lk(box->mu);
  if (box->outcome && box->outcome->code() != ErrorCode::kCancelled) return *box->outcome;
  if (stop.stop_requested()) return CancelledError("waiting in queue " + std::string(queue) + " was cancelled");
  return DeadlineExceededError("deadline passed waiting for an entry of queue " + std::string(queue) + " to go");
}

}  // namespace dlock::internal

#endif  // DLOCK_SRC_STORES_BLOCKING_WAIT_HPP_
