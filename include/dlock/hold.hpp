// File: dlock/hold.hpp
//
// dlock::Hold is one acquired lock, semaphore lease or read/write hold, owned
// by no thread in particular: it can be moved to a thread pool, an async
// callback or another thread and released there. Destroying it releases it.
//
//   std::optional<dlock::Hold> hold = mutex.acquire(5s);
//   if (!hold) return;                       // timed out
//   storage.write(data, hold->fencing_token());  // let the resource fence
//   if (hold->lost_token().stop_requested()) ... // stop work: see below
//
// What the states mean for a holder:
//  - kHeld: the store confirms the session that owns the hold is alive.
//  - kUncertain: contact with the store is lost (session suspended). Nobody
//    else can get the lock until the session expires on the server, but this
//    process can no longer be sure it holds it. Stop touching the protected
//    resource, or continue only with fencing. If contact comes back before
//    expiry, the state returns to kHeld.
//  - kLost: the session expired or was closed. Another holder may already
//    have the lock. The hold is over; release() is still fine to call.
//  - kReleased: release() was called.
//
// dlock declares kLost from its own monotonic clock no later than the moment
// the store could give the lock to someone else (where the store allows it:
// see each store's notes), so a holder hears it first. Because a process can
// be paused at any instant (GC, SIGSTOP, swap), a holder that must never
// overlap with the next one has to let the resource check fencing tokens.
//
// Thread-safety: all methods are thread-safe, including release() racing with
// a state change.
#ifndef DLOCK_HOLD_HPP_
#define DLOCK_HOLD_HPP_

#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>

#include "dlock/export.hpp"

namespace dlock {

enum class HoldState { kHeld, kUncertain, kLost, kReleased };
DLOCK_EXPORT std::string_view HoldStateName(HoldState state) noexcept;

namespace internal {
class HoldCore;
struct Access;  // defined only inside the library
}  // namespace internal

class DLOCK_EXPORT Hold {
 public:
  // An empty hold: holds nothing, released() is true.
  Hold() noexcept = default;
  Hold(Hold&&) noexcept = default;
  Hold& operator=(Hold&& other) noexcept;
  Hold(const Hold&) = delete;
  Hold& operator=(const Hold&) = delete;
  ~Hold();

  // True while the state is kHeld or kUncertain.
  bool held() const noexcept;
  explicit operator bool() const noexcept { return held(); }
  // The state now. It reads the session's own clock at the moment of the
  // call: a process that was paused past its session's end reads kLost at
  // once, before any dlock thread has had time to notice and tell the
  // on_state_change listeners.
  HoldState state() const noexcept;

  // The fencing token: larger than that of every earlier hold of the same
  // lock in the same store (a read hold made by downgrading a write hold
  // continues it, and keeps its token). It stays readable after release();
  // 0 for an empty Hold.
  //
  // The convention across dlock: a Hold (or Lease) is one hold, so its token
  // is a plain number (0, never a real token, once it is empty). The lock
  // objects that a thread locks and unlocks (Mutex, SemaphoreMutex,
  // ReadWriteLock::Reader and ::Writer) may or may not be held by the caller
  // at any moment, so theirs is std::optional: std::nullopt when the calling
  // thread (SemaphoreMutex: the object) does not hold the lock.
  std::uint64_t fencing_token() const noexcept;

  // The lock name, and how many semaphore permits this hold has (1 for locks).
  const std::string& name() const noexcept;
  std::uint32_t permits() const noexcept;

  // Requested the first time the hold becomes kUncertain or kLost, and never
  // reset: pass it to the work done under the lock. Like state(), this call
  // checks the session's clock, and requests the stop itself if the hold is
  // already uncertain or lost (a std::stop_callback on the token then runs
  // on the calling thread; otherwise on a dlock thread).
  std::stop_token lost_token() const noexcept;

  // Calls `fn(state)` on every later state change (kUncertain, kHeld again,
  // kLost; not kReleased), in order, one call at a time, on a dlock thread
  // (or the thread that closed the session), with no lock of dlock's held:
  // `fn` may call into dlock, release() and Client::close_session()
  // included. It must be quick and must not block. An exception it throws is
  // caught and dropped. The returned handle unsubscribes when destroyed; it
  // does not wait for a call already running, so capture what `fn` uses by
  // value or weak reference.
  std::shared_ptr<void> on_state_change(std::function<void(HoldState)> fn) const;

  // Gives the lock back. Never throws and never blocks for longer than one
  // store round trip; if the store cannot be reached, the removal is retried
  // in the background until it succeeds or the session ends. Idempotent.
  void release() noexcept;

 private:
  friend struct internal::Access;
  explicit Hold(std::shared_ptr<internal::HoldCore> core) noexcept : core_(std::move(core)) {}
  std::shared_ptr<internal::HoldCore> core_;
};

// A semaphore lease is a Hold of one or more permits.
using Lease = Hold;

}  // namespace dlock

#endif  // DLOCK_HOLD_HPP_
