// File: dlock/semaphore.hpp
//
// dlock::Semaphore hands out up to N permits of a name across processes and
// machines, in the manner of Curator's InterProcessSemaphoreV2 (and with its
// layout on ZooKeeper: "<name>/locks" serializes acquirers, "<name>/leases"
// holds one entry per permit). Waiters are served in FIFO order; a request for
// several permits is all-or-nothing and is not overtaken by smaller ones.
//
//   dlock::Semaphore sem(client, "deploy/slots", 3);
//   if (auto lease = sem.acquire(1, 30s)) {
//     deploy(lease->fencing_token());
//   }  // the permit is returned here
//
// N is a convention between the users of a name: the store does not record
// it, so every process must pass the same value.
//
// dlock::SemaphoreMutex is a Semaphore of one permit with the Lockable
// interface. Unlike Mutex it is not reentrant and any thread may unlock it.
// Like a std::mutex, the object itself is locked from lock() to unlock(): a
// second lock() through the same object waits for that unlock() even if the
// store session of the first hold was lost meanwhile, so every unlock() ends
// exactly the hold its lock() took, and fencing_token() is always that
// hold's.
//
// Thread-safety: all methods are thread-safe; acquire() blocks the calling
// thread and throws dlock::Error when the store fails.
#ifndef DLOCK_SEMAPHORE_HPP_
#define DLOCK_SEMAPHORE_HPP_

#include <cstdint>
#include <exception>
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
class SemaphoreMutexCore;
}  // namespace internal

class DLOCK_EXPORT Semaphore {
 public:
  // Throws dlock::Error(kInvalidArgument) for a bad name or zero permits.
  Semaphore(Client client, std::string name, std::uint32_t permits);

  // Takes `count` permits (1 <= count <= permits()) before `timeout`, or none.
  // Returns nullopt on timeout or when `stop` is requested.
  std::optional<Lease> acquire(std::uint32_t count = 1, Clock::duration timeout = kForever, std::stop_token stop = {});
  template <class Rep, class Period>
  std::optional<Lease> acquire(std::uint32_t count, const std::chrono::duration<Rep, Period>& timeout,
                               std::stop_token stop = {}) {
    return acquire(count, ToTimeout(timeout), std::move(stop));
  }
  // Takes the permits only if they are free now and nobody waits before us.
  std::optional<Lease> try_acquire(std::uint32_t count = 1);

  // The asynchronous forms of acquire() (dlock/async.hpp): a callback
  // called exactly once on the client's dlock thread, an awaitable, a future.
  void async_acquire(std::uint32_t count, Clock::duration timeout, std::stop_token stop, AcquireCallback done);
  AcquireAwaitable async_acquire(std::uint32_t count = 1, Clock::duration timeout = kForever,
                                 std::stop_token stop = {});
  std::future<std::optional<Lease>> acquire_future(std::uint32_t count = 1, Clock::duration timeout = kForever,
                                                   std::stop_token stop = {});

  std::uint32_t permits() const noexcept { return permits_; }
  const std::string& name() const noexcept { return name_; }

 private:
  std::optional<Lease> acquire_impl(std::uint32_t count, Clock::duration timeout, std::stop_token stop, bool try_only);

  Client client_;
  std::string name_;
  std::uint32_t permits_;
};

class DLOCK_EXPORT SemaphoreMutex {
 public:
  SemaphoreMutex(Client client, std::string name);
  ~SemaphoreMutex();
  SemaphoreMutex(const SemaphoreMutex&) = delete;
  SemaphoreMutex& operator=(const SemaphoreMutex&) = delete;

  void lock();
  bool try_lock();
  template <class Rep, class Period>
  bool try_lock_for(const std::chrono::duration<Rep, Period>& timeout) {
    return lock_for(ToTimeout(timeout), {});
  }
  template <class C, class D>
  bool try_lock_until(const std::chrono::time_point<C, D>& deadline) {
    return lock_for(ToTimeout(deadline), {});
  }
  bool lock_for(Clock::duration timeout, std::stop_token stop);
  // Any thread may unlock. A no-op (reported to on_background_error) if not
  // locked.
  void unlock() noexcept;

  // The current hold's token, state and lost signal; nullopt / empty if
  // unlocked (the convention of every lock object: see Hold::fencing_token).
  std::optional<std::uint64_t> fencing_token() const;
  std::optional<HoldState> hold_state() const;
  std::stop_token lost_token() const;

  // A hold owned by the caller rather than by this object (it does not lock
  // the object).
  std::optional<Hold> acquire(Clock::duration timeout = kForever, std::stop_token stop = {});
  // The asynchronous forms of acquire() (dlock/async.hpp): a callback
  // called exactly once on the client's dlock thread, an awaitable, a future.
  void async_acquire(Clock::duration timeout, std::stop_token stop, AcquireCallback done);
  AcquireAwaitable async_acquire(Clock::duration timeout = kForever, std::stop_token stop = {});
  std::future<std::optional<Hold>> acquire_future(Clock::duration timeout = kForever, std::stop_token stop = {});

 private:
  std::unique_ptr<internal::SemaphoreMutexCore> impl_;
};

}  // namespace dlock

#endif  // DLOCK_SEMAPHORE_HPP_
