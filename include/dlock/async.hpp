// File: dlock/async.hpp
//
// Asynchronous acquisition: any number of acquires pending without a thread
// each. Every lock class (Mutex, SemaphoreMutex, Semaphore,
// ReadWriteLock::Reader and ::Writer) offers the same three forms beside its
// blocking ones, all over the one acquisition engine that the blocking forms
// use too:
//
//   // 1. a callback, called exactly once
//   mutex.async_acquire(5s, stop, [](dlock::Result<std::optional<dlock::Hold>> r) { ... });
//   // 2. a future
//   std::future<std::optional<dlock::Hold>> f = mutex.acquire_future(5s);
//   // 3. a coroutine (any coroutine type: the awaitable needs nothing from it)
//   std::optional<dlock::Hold> h = co_await mutex.async_acquire(5s);
//
// (With Asio, dlock/asio.hpp adds Asio's completion tokens: the handler then
// runs on its own executor rather than on dlock's thread.)
//
// The outcome is the Hold (the caller owns it: it is released when
// destroyed), std::nullopt (the timeout passed or `stop` was requested; nothing
// of the acquire is left in the store), or an error (the future and the
// awaitable throw it as dlock::Error). A timeout <= 0 is one try.
//
// Threads: the callback runs, and the coroutine resumes, on the client's
// dlock thread (one per Client, shared by every lock of that client), never
// inside the call that starts the acquire. It must not block: the other
// acquires of the client wait while it runs. An exception it throws is
// caught and dropped (a Hold it was given is released as it goes). A blocking lock call (lock(),
// acquire(), ...) made on that thread is refused with dlock::Error
// (kFailedPrecondition), because it would wait for the thread it runs on;
// releasing a Hold there is fine (one store round trip). Arguments that are
// wrong (a semaphore count of 0) throw dlock::Error at the call.
//
// Order: asynchronous and blocking acquires of one process queue together, in
// the order they were made, behind at most one store entry per lock and
// process, as blocking ones always did. A pending acquire keeps its Client
// working (and alive) until it completes; cancel it through `stop` to end it
// early.
//
// Reentrancy: an asynchronous acquire returns a thread-agnostic Hold, like
// Mutex::acquire(); it is never reentrant (a coroutine may resume on another
// thread than the one it started on, so "the thread that holds the lock"
// means nothing to it). An acquire made while this process already holds the
// lock waits for that hold to be released, like any other contender.
#ifndef DLOCK_ASYNC_HPP_
#define DLOCK_ASYNC_HPP_

#include <coroutine>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <utility>

#include "dlock/hold.hpp"
#include "dlock/status.hpp"

namespace dlock {

// dlock::Awaitable<T>
//
// What `co_await` of an asynchronous dlock call awaits (an acquire's
// AcquireAwaitable below; an election's campaign, later): the call starts
// when the coroutine suspends, and the coroutine resumes on the client's
// dlock thread with the outcome; an error is thrown as dlock::Error at the
// co_await. Await it once, and do not destroy a coroutine while it is
// suspended here (nothing cancels the call when the frame goes: request the
// stop instead, and let the coroutine resume with its "not done" outcome).
template <typename T>
class [[nodiscard]] Awaitable {
 public:
  using Callback = std::function<void(Result<T>)>;

  explicit Awaitable(std::function<void(Callback)> start) : start_(std::move(start)) {}

  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> waiting) {
    // The coroutine may resume, and destroy this object, on another thread
    // before start() returns: nothing of this object is used after it.
    auto start = std::move(start_);
    start([this, waiting](Result<T> outcome) {
      outcome_.emplace(std::move(outcome));
      waiting.resume();
    });
  }
  T await_resume() {
    if (!outcome_->ok()) throw Error(outcome_->status());
    return std::move(*outcome_).value();
  }

 private:
  std::function<void(Callback)> start_;
  std::optional<Result<T>> outcome_;
};

// What an asynchronous acquire delivers: a Hold (or Lease), std::nullopt, or
// an error.
using AcquireCallback = Awaitable<std::optional<Hold>>::Callback;

// What `co_await lock.async_acquire(timeout)` awaits: the Hold, or
// std::nullopt (timed out, or stopped).
using AcquireAwaitable = Awaitable<std::optional<Hold>>;

namespace internal {

// The future form over the callback form.
template <typename T>
std::future<T> FutureOf(const std::function<void(typename Awaitable<T>::Callback)>& start) {
  auto promise = std::make_shared<std::promise<T>>();
  std::future<T> future = promise->get_future();
  start([promise](Result<T> outcome) {
    if (outcome.ok()) {
      promise->set_value(std::move(outcome).value());
    } else {
      promise->set_exception(std::make_exception_ptr(Error(outcome.status())));
    }
  });
  return future;
}

inline std::future<std::optional<Hold>> FutureOf(const std::function<void(AcquireCallback)>& start) {
  return FutureOf<std::optional<Hold>>(start);
}

}  // namespace internal

}  // namespace dlock

#endif  // DLOCK_ASYNC_HPP_
