// Internal: the completion of one asynchronous wait (Session::
// async_wait_any_gone), called exactly once whoever gets there first: the
// store (OK, kSessionLost, an error) or the handle's destructor (kCancelled).
#ifndef DLOCK_SRC_STORES_ONE_OUTCOME_HPP_
#define DLOCK_SRC_STORES_ONE_OUTCOME_HPP_

#include <condition_variable>
#include <functional>
#include <thread>
#include <utility>

#include "core/thread_annotations.hpp"
#include "dlock/status.hpp"

namespace dlock::internal {

class OneOutcome {
 public:
  explicit OneOutcome(std::function<void(Status)> done) : done_(std::move(done)) {}
  OneOutcome(const OneOutcome&) = delete;
  OneOutcome& operator=(const OneOutcome&) = delete;

  // Calls `done(status)` on this thread, without any lock held, unless an
  // outcome was claimed before. Returns whether this call delivered it.
  bool complete(Status status) DLOCK_EXCLUDES(mu_) {
    std::function<void(Status)> done;
    {
      MutexLock lock(mu_);
      if (phase_ != Phase::kPending) return false;
      phase_ = Phase::kRunning;
      runner_ = std::this_thread::get_id();
      done = std::move(done_);
    }
    try {
      done(std::move(status));
    } catch (...) {  // `done` must not throw; one that does must not end the store's thread
    }
    done = nullptr;  // its captures go outside the lock too
    MutexLock lock(mu_);
    phase_ = Phase::kDone;
    finished_.notify_all();
    return true;
  }

  // For the handle's destructor: kCancelled if nothing came first, and in any
  // case `done` has returned when this returns, unless it is running on this
  // very thread (the handle dropped inside `done`), which must not wait.
  void cancel() DLOCK_EXCLUDES(mu_) {
    if (complete(CancelledError("the wait was cancelled (its handle was destroyed)"))) return;
    MutexLock lock(mu_);
    if (phase_ == Phase::kRunning && runner_ == std::this_thread::get_id()) return;
    finished_.wait(lock.native(), [&] {
      mu_.assert_held();  // the predicate runs under the lock
      return phase_ == Phase::kDone;
    });
  }

 private:
  enum class Phase { kPending, kRunning, kDone };
  Mutex mu_;
  std::condition_variable finished_;
  Phase phase_ DLOCK_GUARDED_BY(mu_) = Phase::kPending;
  std::thread::id runner_ DLOCK_GUARDED_BY(mu_);
  std::function<void(Status)> done_ DLOCK_GUARDED_BY(mu_);
};

}  // namespace dlock::internal

#endif  // DLOCK_SRC_STORES_ONE_OUTCOME_HPP_
