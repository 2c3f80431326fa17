// File: dlock/mutex.hpp
//
// dlock::Mutex is a reentrant, FIFO-fair lock across threads, processes and
// machines, in the manner of Curator's InterProcessMutex. It satisfies the
// standard Lockable and TimedLockable requirements:
//
//   dlock::Mutex m(client, "billing/nightly");
//   {
//     std::unique_lock lock(m);            // blocks until held
//     charge(*m.fencing_token());
//   }
//   if (std::unique_lock lock(m, 5s); lock) { ... }  // try_lock_for
//
// Ownership is per thread, like std::recursive_mutex: the thread that locked
// must unlock, and may lock again without waiting (the count must be matched
// by as many unlocks). Two Mutex objects with the same name and client are two
// independent contenders. For a hold that any thread can release, use
// acquire(), which returns a dlock::Hold, or SemaphoreMutex.
//
// Waiting: each waiting process has at most one entry per lock in the store,
// watching only the entry just ahead of it; threads of one process wait in a
// local FIFO for their turn to enter the store queue.
//
// Thread-safety: all methods are thread-safe. lock() and the try_lock
// functions block the calling thread (try_lock() for one or two round trips
// at most); they throw dlock::Error when the store fails (kUnavailable,
// kSessionLost with no time left to re-queue, kPermissionDenied, ...).
// unlock() and the destructor never throw.
#ifndef DLOCK_MUTEX_HPP_
#define DLOCK_MUTEX_HPP_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>

#include "dlock/async.hpp"
#include "dlock/client.hpp"
#include "dlock/export.hpp"
#include "dlock/hold.hpp"
#include "dlock/timeout.hpp"

namespace dlock {

namespace internal {
class ThreadOwnedLock;
}  // namespace internal

class DLOCK_EXPORT Mutex {
 public:
  // Throws dlock::Error(kInvalidArgument) if `name` is not a valid lock name.
  Mutex(Client client, std::string name);
  // Releases any holds still open through this object.
  ~Mutex();
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock();
  // Takes the lock only if nobody holds or waits for it.
  bool try_lock();
  template <class Rep, class Period>
  bool try_lock_for(const std::chrono::duration<Rep, Period>& timeout) {
    return lock_for(ToTimeout(timeout), {});
  }
  template <class C, class D>
  bool try_lock_until(const std::chrono::time_point<C, D>& deadline) {
    return lock_for(ToTimeout(deadline), {});
  }
  // Blocks until held, the timeout passes or `stop` is requested.
  bool lock_for(Clock::duration timeout, std::stop_token stop);

  // Releases one level of the calling thread's hold. If the calling thread
  // does not hold the lock this is a no-op reported to on_background_error.
  void unlock() noexcept;

  bool owned_by_current_thread() const;
  // The calling thread's hold: its fencing token, lost signal and state, or
  // nullopt / an empty token if this thread does not hold the lock. (A lock
  // object's token is optional because the caller may not hold it; a Hold's
  // is a plain number: see Hold::fencing_token.)
  std::optional<std::uint64_t> fencing_token() const;
  std::stop_token lost_token() const;
  std::optional<HoldState> hold_state() const;

  // A thread-agnostic, non-reentrant hold: any thread may release it.
  // nullopt if the timeout passed or `stop` was requested.
  std::optional<Hold> acquire(Clock::duration timeout = kForever, std::stop_token stop = {});
  // The asynchronous forms of acquire() (dlock/async.hpp): a callback
  // called exactly once on the client's dlock thread, an awaitable, a future.
  void async_acquire(Clock::duration timeout, std::stop_token stop, AcquireCallback done);
  AcquireAwaitable async_acquire(Clock::duration timeout = kForever, std::stop_token stop = {});
  std::future<std::optional<Hold>> acquire_future(Clock::duration timeout = kForever, std::stop_token stop = {});

  const std::string& name() const noexcept;

 private:
  std::unique_ptr<internal::ThreadOwnedLock> impl_;
};

}  // namespace dlock

#endif  // DLOCK_MUTEX_HPP_
