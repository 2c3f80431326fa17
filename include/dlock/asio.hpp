// File: dlock/asio.hpp
//
// Asio completion tokens for dlock's asynchronous acquisition. An optional
// header: it needs standalone Asio (Debian's libasio-dev, 1.22 or later),
// which dlock itself does not, and it is not included by dlock/dlock.hpp.
// Any completion token works: a callback, asio::use_awaitable,
// asio::use_future, asio::deferred, asio::experimental's operators.
//
//   asio::awaitable<void> Work(dlock::Mutex& mutex) {
//     std::optional<dlock::Hold> hold =
//         co_await dlock::async_acquire(mutex, 5s, asio::use_awaitable);
//     if (!hold) co_return;                 // timed out (or cancelled)
//     co_await Update(hold->token());       // the hold goes with the frame
//   }
//
//   dlock::async_acquire(semaphore, 2, 5s, [](std::exception_ptr error,
//                                             std::optional<dlock::Lease> lease) { ... });
//
// Completion signature: void(std::exception_ptr, std::optional<dlock::Hold>).
// The Hold (the handler owns it), std::nullopt (the timeout passed or the
// operation was cancelled; nothing of it is left in the store), or a
// dlock::Error in the exception_ptr (asio::use_awaitable throws it at the
// co_await, asio::use_future from get()). A timeout <= 0 is one try.
//
// Threads: the handler runs on its associated executor (for a coroutine,
// the one it runs on), never on dlock's thread and never inside the call
// that starts the acquire: dlock's callback only posts it there. Until the
// handler has run, the operation counts as outstanding work of that
// executor (an io_context::run() does not return under it), and, as for
// any Asio operation, the executor's context (the io_context) must outlive
// it. A handler destroyed without running (its io_context stopped and
// destroyed first) releases the Hold it would have been given.
//
// Cancellation: per-operation cancellation (a cancellation slot bound to
// the token: asio::bind_cancellation_slot, `||` of asio::experimental,
// a coroutine's cancellation) requests the acquire's stop, for every
// cancellation type. The handler then gets std::nullopt, or the Hold if the
// grant came first (it owns it then, as with a std::stop_token). Pass a
// std::stop_token of your own through the overloads that take one.
//
// The lock object is used only while the operation is started (at the call,
// or for a deferred token when it is launched); the acquire does not need
// it afterwards. Order, fairness and reentrancy are those of the other
// asynchronous forms (dlock/async.hpp).
#ifndef DLOCK_ASIO_HPP_
#define DLOCK_ASIO_HPP_

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <stop_token>
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

// Starts one acquire, `start(stop, callback)`, for `handler`: the stop is
// requested by the handler's cancellation slot (or by `user_stop`), and the
// outcome is posted to the handler's executor.
template <class Handler, class Start>
void Launch(Handler&& handler, std::stop_token user_stop, Start&& start) {
  using Decayed = std::decay_t<Handler>;
  // dlock's callbacks are std::functions (copyable): the handler, which may
  // be move-only, lives behind a shared pointer until it is posted.
  auto held = std::make_shared<std::optional<Decayed>>(std::forward<Handler>(handler));
  auto stop = std::make_shared<std::stop_source>();
  auto slot = asio::get_associated_cancellation_slot(**held);
  if (slot.is_connected()) {
    slot.assign([stop](asio::cancellation_type) { stop->request_stop(); });
  }
  // A stop_token of the caller's own: forwarded into the acquire's source.
  auto forward = std::make_shared<std::optional<std::stop_callback<std::function<void()>>>>();
  if (user_stop.stop_possible()) forward->emplace(user_stop, std::function<void()>([stop] { stop->request_stop(); }));
  auto work = std::make_shared<asio::executor_work_guard<asio::associated_executor_t<Decayed>>>(
      asio::make_work_guard(asio::get_associated_executor(**held)));
  auto deliver = [held, work, forward](Result<std::optional<Hold>> outcome) mutable {
    auto executor = work->get_executor();
    // On the handler's executor: the slot is cleared on the thread that may
    // emit to it, then the handler runs with what it owns now.
    asio::post(executor, [held, work, forward, outcome = std::move(outcome)]() mutable {
      Decayed to_call = std::move(**held);
      held->reset();
      auto its_slot = asio::get_associated_cancellation_slot(to_call);
      if (its_slot.is_connected()) its_slot.clear();
      forward->reset();
      work->reset();
      std::exception_ptr error;
      std::optional<Hold> hold;
      if (outcome.ok()) {
        hold = std::move(outcome).value();
      } else {
        error = std::make_exception_ptr(Error(outcome.status()));
      }
      std::move(to_call)(std::move(error), std::move(hold));
    });
  };
  try {
    std::forward<Start>(start)(stop->get_token(), std::move(deliver));
  } catch (...) {  // refused at the call (a wrong argument): the slot lets go of our stop
    if (slot.is_connected()) slot.clear();
    throw;
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
