// Internal: the steps of a blocking call, run by the calling thread itself.
//
// A blocking lock call is the asynchronous acquisition waited for (WaitFor,
// acquire.hpp). If its steps ran on the client's executor, every store
// completion would cross two threads to reach the caller (store thread ->
// executor -> caller, and the same on the way out); run by the caller, who
// waits anyway, it crosses one. Its store requests (append, list, find_own)
// cross none: they are made with the store's blocking forms on its thread
// (Operation::request), e.g. a synchronous gRPC call on etcd, a pooled
// connection on Redis. Waits stay asynchronous (a deadline or stop cuts
// them short through the engine), except on a store whose blocking wait
// sleeps in the calling thread (file://, real clocks only: Operation::
// wait_any_gone), which takes the deadline and stop token itself. Timers
// (deadlines, pauses) stay on the executor, which posts what they start
// here.
#ifndef DLOCK_SRC_RECIPES_CALLER_STEPS_HPP_
#define DLOCK_SRC_RECIPES_CALLER_STEPS_HPP_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <thread>

#include "core/client_core.hpp"
#include "core/thread_annotations.hpp"

namespace dlock::internal {

// A queue of tasks that one thread runs while it waits for an outcome. Until
// the outcome is there, posted tasks run on that thread, one at a time, in
// the order they were posted; from then on (closed), what is still queued and
// everything posted later goes to the client's executor, in the same order,
// so an operation's later steps (a clean-up after a grant nobody waits for
// any more) still run one at a time. Thread-safe.
class CallerSteps {
 public:
  explicit CallerSteps(std::shared_ptr<ClientCore> client) : client_(std::move(client)) {}
  CallerSteps(const CallerSteps&) = delete;
  CallerSteps& operator=(const CallerSteps&) = delete;

  void post(std::function<void()> task) DLOCK_EXCLUDES(mu_);
  // The outcome is there: run() returns (on any thread; once).
  void finish() DLOCK_EXCLUDES(mu_);
  // Runs posted tasks on this thread until finish(), then closes. A task
  // that throws is dropped, as the executor drops one.
  void run() DLOCK_EXCLUDES(mu_);
  // Whether the calling thread is the one running the steps now (inside
  // run(), before the outcome): a step can then block it, as the caller
  // waits anyway.
  bool on_running_thread() const noexcept {
    return running_.load(std::memory_order_acquire) == std::this_thread::get_id();
  }

 private:
  const std::shared_ptr<ClientCore> client_;  // for its executor, once closed
  Mutex mu_;
  std::condition_variable_any cv_;
  std::deque<std::function<void()>> tasks_ DLOCK_GUARDED_BY(mu_);
  bool finished_ DLOCK_GUARDED_BY(mu_) = false;
  bool closed_ DLOCK_GUARDED_BY(mu_) = false;
  std::atomic<std::thread::id> running_{};  // set for the time of run()
};

// What a blocking caller lends the engine: the thread that runs its
// operations' steps, and a place for the first exception thrown inside the
// engine (std::bad_alloc, at worst), which the caller rethrows as it is
// (asynchronous callers get kInternal instead).
class BlockingCaller {
 public:
  explicit BlockingCaller(std::shared_ptr<ClientCore> client) : steps(std::move(client)) {}

  CallerSteps steps;

  // Keeps `e` unless an exception is kept already or the outcome is there
  // (sealed). Any thread: a step left over after the outcome runs on the
  // executor, where it may throw while the caller reads (out of memory);
  // such an exception is not the caller's, who has its outcome.
  void keep(std::exception_ptr e) DLOCK_EXCLUDES(mu_) {
    MutexLock g(mu_);
    if (!sealed_ && !failure_) failure_ = std::move(e);
  }
  // The outcome is there: later exceptions are dropped. Called by the
  // outcome's receiver before it lets the caller go.
  void seal() DLOCK_EXCLUDES(mu_) {
    MutexLock g(mu_);
    sealed_ = true;
  }
  // The exception kept before the seal, if any.
  std::exception_ptr take_failure() DLOCK_EXCLUDES(mu_) {
    MutexLock g(mu_);
    sealed_ = true;
    return std::move(failure_);
  }

 private:
  Mutex mu_;
  std::exception_ptr failure_ DLOCK_GUARDED_BY(mu_);
  bool sealed_ DLOCK_GUARDED_BY(mu_) = false;
};

// How the engine's functions take a blocking caller: the operations started
// for it run their steps on its thread and keep an exception for it there.
// Null for asynchronous callers, whose steps run on the executor.
using FailureSink = std::shared_ptr<BlockingCaller>;

}  // namespace dlock::internal

#endif  // DLOCK_SRC_RECIPES_CALLER_STEPS_HPP_
