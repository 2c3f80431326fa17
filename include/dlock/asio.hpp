// File: dlock/asio.hpp
//
// Asio completion tokens for dlock's asynchronous acquisition. An optional
// header: it needs standalone Asio (Debian's libasio-dev, 1.22 or later),
// which dlock itself does not, and it is not included by dlock/dlock.hpp.
// Any completion token works: a handler, asio::use_awaitable,
// asio::use_future, asio::experimental::deferred, the operators of
// asio::experimental::awaitable_operators.
//
//   asio::awaitable<void> Work(dlock::Mutex& mutex) {
//     std::optional<dlock::Hold> hold =
//         co_await dlock::async_acquire(mutex, 5s, asio::use_awaitable);
//     if (!hold) co_return;                     // timed out (or cancelled)
//     co_await Update(hold->fencing_token());   // the hold goes with the frame
//   }
//
//   dlock::async_acquire(semaphore, 2, 5s, asio::bind_executor(io,
//       [](std::exception_ptr error, std::optional<dlock::Lease> lease) { ... }));
//
// Completion signature: void(std::exception_ptr, std::optional<dlock::Hold>).
// The Hold (the handler owns it), std::nullopt (the timeout passed or the
// operation was cancelled; nothing of it is left in the store), or a
// dlock::Error in the exception_ptr (asio::use_awaitable throws it at the
// co_await, asio::use_future from get()). Wrong arguments (a semaphore
// count of 0) come the same way, never as an exception from the call. A
// timeout <= 0 is one try.
//
// Threads: the handler runs on its associated executor (for a coroutine,
// the one it runs on), never on dlock's thread and never inside the call
// that starts the acquire: dlock's callback only posts it there. A plain
// lambda's executor is Asio's system executor (its own thread pool): bind
// one (asio::bind_executor) to run it on your io_context. Until the handler
// has run, the operation counts as outstanding work of that executor (an
// io_context::run() does not return under it).
//
// Shutdown: if the handler's execution context shuts down first (an
// io_context destroyed, stopped or not, while the acquire waits), the
// acquire is told to stop and the handler is destroyed there, as Asio does
// with its own operations' handlers; a Hold granted meanwhile is released.
//
// Cancellation: per-operation cancellation (a cancellation slot bound to
// the token: asio::bind_cancellation_slot, `||` of awaitable_operators, a
// coroutine's cancellation) requests the acquire's stop, for every
// cancellation type. The handler then gets std::nullopt, or the Hold if the
// grant came first (it owns it then, as with a std::stop_token). Pass a
// std::stop_token of your own through the overloads that take one.
//
// The lock object must live until the operation starts: at the call for a
// handler or asio::use_future, at the co_await for asio::use_awaitable, at
// each launch for a deferred operation. The acquire does not need it
// afterwards. Order, fairness and reentrancy are those of the other
// asynchronous forms (dlock/async.hpp).
#ifndef DLOCK_ASIO_HPP_
#define DLOCK_ASIO_HPP_

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>

#include <asio/execution.hpp>
#include <asio/execution_context.hpp>
#include <asio/query.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stop_token>
#include <type_traits>
#include <utility>

#include "dlock/async.hpp"
#include "dlock/hold.hpp"
#include "dlock/semaphore.hpp"
#include "dlock/status.hpp"
#include "dlock/timeout.hpp"

namespace dlock {

// The completion signature of every dlock operation started with a token.
using AsioAcquireSignature = void(std::exception_ptr, std::optional<Hold>);

namespace asio_internal {

// One pending operation: what dlock's callback, the handler's executor and
// the handler's execution context (PendingAcquires) share. mu orders them.
struct PendingBase {
  virtual ~PendingBase() = default;
  // Under mu, when the execution context shuts down: the handler goes now,
  // while the context still stands.
  virtual void drop_handler() = 0;

  std::mutex mu;
  bool abandoned = false;  // the context shut down: nothing is posted to it any more
  std::stop_source stop;
};

// A service of the handler's execution context (io_context's destructor
// shuts its services down). Asio destroys its own pending operations' handlers
// there; dlock's operations are not Asio's, so this does it for them: each
// pending acquire is told to stop and its handler goes, and an outcome that
// comes later only releases its Hold.
class PendingAcquires final : public asio::execution_context::service {
 public:
  static inline asio::execution_context::id id;
  explicit PendingAcquires(asio::execution_context& context) : asio::execution_context::service(context) {}

  // False once the context has shut down.
  bool add(const std::shared_ptr<PendingBase>& op) {
    std::lock_guard<std::mutex> g(mu_);
    if (shut_) return false;
    ops_.insert(op);
    return true;
  }
  void remove(const std::shared_ptr<PendingBase>& op) {
    std::lock_guard<std::mutex> g(mu_);
    ops_.erase(op);
  }

 private:
  void shutdown() override {
    std::set<std::shared_ptr<PendingBase>> ops;
    {
      std::lock_guard<std::mutex> g(mu_);
      shut_ = true;
      ops.swap(ops_);
    }
    for (const auto& op : ops) {
      {
        std::lock_guard<std::mutex> g(op->mu);  // waits for a post in progress
        op->abandoned = true;
        op->drop_handler();
      }
      op->stop.request_stop();
    }
  }

  std::mutex mu_;
  bool shut_ = false;
  std::set<std::shared_ptr<PendingBase>> ops_;
};

// The execution context behind `executor`, where it has one (use_future's
// executor has none: it runs the handler where it is posted).
template <class Executor>
asio::execution_context* ContextOf(const Executor& executor) {
  if constexpr (asio::can_query<Executor, asio::execution::context_t>::value) {
    return &asio::query(executor, asio::execution::context);
  } else if constexpr (requires { executor.context(); }) {
    return &executor.context();
  } else {
    return nullptr;
  }
}

template <class Handler>
struct Pending final : PendingBase {
  using Executor = asio::associated_executor_t<Handler>;

  explicit Pending(Handler h)
      : handler(std::move(h)), work(asio::make_work_guard(asio::get_associated_executor(*handler))) {}

  void drop_handler() override {
    if (!handler) return;
    auto slot = asio::get_associated_cancellation_slot(*handler);
    if (slot.is_connected()) slot.clear();
    handler.reset();
    work.reset();
  }

  std::optional<Handler> handler;
  std::optional<asio::executor_work_guard<Executor>> work;           // until the handler runs or goes
  std::optional<std::stop_callback<std::function<void()>>> forward;  // a caller's stop_token
  PendingAcquires* service = nullptr;
};

// Posts the outcome to the handler's executor, unless its context shut down
// (then `hold`, if any, is released here as this returns). Under op.mu, so
// that the context cannot shut down while the post is in progress, and the
// handler (which takes op.mu first) cannot end the work, and with it let
// io_context::run() return, before the post has returned.
template <class Handler>
void Deliver(const std::shared_ptr<Pending<Handler>>& op, std::exception_ptr error, std::optional<Hold> hold) {
  std::lock_guard<std::mutex> g(op->mu);
  if (op->abandoned || !op->handler) return;
  asio::post(op->work->get_executor(), [op, error = std::move(error), hold = std::move(hold)]() mutable {
    std::unique_lock<std::mutex> lk(op->mu);
    if (!op->handler) return;
    Handler to_call = std::move(*op->handler);
    op->handler.reset();
    // On the handler's executor: the slot is cleared on the thread that may
    // emit to it.
    auto slot = asio::get_associated_cancellation_slot(to_call);
    if (slot.is_connected()) slot.clear();
    op->forward.reset();
    lk.unlock();
    if (op->service != nullptr) op->service->remove(op);
    std::move(to_call)(std::move(error), std::move(hold));
    lk.lock();
    op->work.reset();  // after the call, which is work of the executor too
  });
}

// Starts one acquire, `start(stop, callback)`, for `handler`: the stop is
// requested by the handler's cancellation slot, by `user_stop` or by the
// shutdown of the handler's execution context, and the outcome is posted to
// the handler's executor. A start that throws (a wrong argument) delivers
// the exception to the handler the same way.
template <class Handler, class Start>
void Launch(Handler&& handler, std::stop_token user_stop, Start&& start) {
  using Decayed = std::decay_t<Handler>;
  auto op = std::make_shared<Pending<Decayed>>(std::forward<Handler>(handler));
  if (asio::execution_context* context = ContextOf(op->work->get_executor())) {
    op->service = &asio::use_service<PendingAcquires>(*context);
  }
  if (op->service != nullptr && !op->service->add(op)) {
    // The context has shut down already: nothing will ever run there.
    op->drop_handler();
    return;
  }
  auto slot = asio::get_associated_cancellation_slot(*op->handler);
  if (slot.is_connected()) {
    slot.assign([weak = std::weak_ptr<Pending<Decayed>>(op)](asio::cancellation_type) {
      if (auto o = weak.lock()) o->stop.request_stop();
    });
  }
  if (user_stop.stop_possible()) {
    op->forward.emplace(user_stop, std::function<void()>([weak = std::weak_ptr<Pending<Decayed>>(op)] {
                          if (auto o = weak.lock()) o->stop.request_stop();
                        }));
  }
  try {
    std::forward<Start>(start)(op->stop.get_token(), [op](Result<std::optional<Hold>> outcome) {
      if (outcome.ok()) return Deliver(op, nullptr, std::move(outcome).value());
      Deliver(op, std::make_exception_ptr(Error(outcome.status())), std::nullopt);
    });
  } catch (...) {  // refused at the call: told through the handler, as any outcome
    Deliver(op, std::current_exception(), std::nullopt);
  }
}

}  // namespace asio_internal

// dlock::async_acquire (Mutex, SemaphoreMutex, ReadWriteLock::Reader and
// ::Writer)
//
// Acquires `lock` within `timeout`, completing with `token`; see above.
template <class Lock, class Rep, class Period, class CompletionToken>
requires requires(Lock& lock, AcquireCallback done) {
  lock.async_acquire(Clock::duration{}, std::stop_token{}, std::move(done));
}
auto async_acquire(Lock& lock, std::chrono::duration<Rep, Period> timeout, std::stop_token stop,
                   CompletionToken&& token) {
  return asio::async_initiate<CompletionToken, AsioAcquireSignature>(
      [&lock, wait = ToTimeout(timeout), stop](auto&& handler) {
        asio_internal::Launch(std::forward<decltype(handler)>(handler), stop,
                              [&lock, wait](std::stop_token acquire_stop, AcquireCallback done) {
                                lock.async_acquire(wait, std::move(acquire_stop), std::move(done));
                              });
      },
      token);
}

template <class Lock, class Rep, class Period, class CompletionToken>
requires requires(Lock& lock, AcquireCallback done) {
  lock.async_acquire(Clock::duration{}, std::stop_token{}, std::move(done));
}
auto async_acquire(Lock& lock, std::chrono::duration<Rep, Period> timeout, CompletionToken&& token) {
  return async_acquire(lock, timeout, std::stop_token{}, std::forward<CompletionToken>(token));
}

// dlock::async_acquire (Semaphore)
//
// Acquires `count` permits of `semaphore` within `timeout` as one Lease.
template <class Rep, class Period, class CompletionToken>
auto async_acquire(Semaphore& semaphore, std::uint32_t count, std::chrono::duration<Rep, Period> timeout,
                   std::stop_token stop, CompletionToken&& token) {
  return asio::async_initiate<CompletionToken, AsioAcquireSignature>(
      [&semaphore, count, wait = ToTimeout(timeout), stop](auto&& handler) {
        asio_internal::Launch(std::forward<decltype(handler)>(handler), stop,
                              [&semaphore, count, wait](std::stop_token acquire_stop, AcquireCallback done) {
                                semaphore.async_acquire(count, wait, std::move(acquire_stop), std::move(done));
                              });
      },
      token);
}

template <class Rep, class Period, class CompletionToken>
auto async_acquire(Semaphore& semaphore, std::uint32_t count, std::chrono::duration<Rep, Period> timeout,
                   CompletionToken&& token) {
  return async_acquire(semaphore, count, timeout, std::stop_token{}, std::forward<CompletionToken>(token));
}

}  // namespace dlock

#endif  // DLOCK_ASIO_HPP_
