// File: dlock/leader_latch.hpp
//
// dlock::LeaderLatch is a participant for services, in the shape of
// Curator's LeaderLatch: from start() until close() it campaigns in the
// background (dlock::Election's asynchronous campaign, on the client's dlock
// thread: no thread of its own), and again after every loss, each time with
// a new entry and so a new term. It says when it becomes and stops being
// leader:
//
//   dlock::LeaderLatch latch(client, "billing/scheduler", "10.0.0.7:8080");
//   auto sub = latch.on_change([](dlock::LatchEvent e, std::uint64_t term) { ... });
//   latch.start();
//   if (latch.await_leadership(30s)) schedule(*latch.term());
//   ...
//   latch.close();  // or the destructor: hands over at once
//
// The promise, as for dlock::Hold: kNoLongerLeader is delivered, and
// has_leadership() reads false, before any other participant can become
// leader (docs/election.md §3.2). has_leadership() reads the session's own
// clock, so it is false from the moment the leadership is uncertain (with
// LatchOptions::suspended_is_not_leader) or lost, even before a dlock thread
// has told the listeners. Listeners are called one at a time: a listener that
// blocks holds back the next event, never has_leadership(). So the event
// comes in time only if listeners return quickly; has_leadership() is the
// answer that never comes late.
//
// After a loss the latch campaigns again with a new entry at once; if the
// store could not be reached to remove the old entry, that one stays ahead
// of the new one until the store expires the old session (as any waiter's
// would), so for that while the latch has two entries.
//
// Campaign failures (the store down, a refused request) are reported to
// ClientOptions::on_background_error and retried with a backoff (100 ms
// doubling to 5 s); a latch never stops by itself.
//
// Thread-safety: all methods are thread-safe. await_leadership() and
// proclaim() block, and are refused on the client's dlock thread (as
// Mutex::acquire()); close() and the destructor may be called anywhere,
// from inside the latch's own listener included.
#ifndef DLOCK_LEADER_LATCH_HPP_
#define DLOCK_LEADER_LATCH_HPP_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>

#include "dlock/client.hpp"
#include "dlock/export.hpp"
#include "dlock/status.hpp"
#include "dlock/timeout.hpp"

namespace dlock {

namespace internal {
class LatchCore;
}  // namespace internal

enum class LatchEvent { kBecameLeader, kNoLongerLeader };

struct LatchOptions {
  // true (Curator's default error policy): leadership counts as given up as
  // soon as contact with the store is lost (kUncertain): kNoLongerLeader,
  // and kBecameLeader again with the same term if the session survives,
  // without a new campaign. false: only at kLost.
  bool suspended_is_not_leader = true;
};

class DLOCK_EXPORT LeaderLatch {
 public:
  // Throws dlock::Error(kInvalidArgument) for an invalid name, or a value
  // that is not UTF-8 text of at most 64 KiB. Nothing is sent before start().
  LeaderLatch(Client client, std::string name, std::string value, LatchOptions options = {});
  LeaderLatch(const LeaderLatch&) = delete;
  LeaderLatch& operator=(const LeaderLatch&) = delete;
  // close(). From another thread than the one running a listener of this
  // latch, it waits for that listener to return, so that nothing the
  // listeners capture is used afterwards; from inside a listener it does not
  // wait (the events left are dropped after it returns).
  ~LeaderLatch();

  // Starts campaigning. Idempotent; a no-op after close().
  void start();
  // Stops for good: stops the campaign, and if leader delivers
  // kNoLongerLeader, then resigns (the next candidate leads at once: at
  // most one store round trip, retried in the background as
  // Hold::release()). has_leadership() reads false from the call on. Waits
  // for a listener running on another thread (see the destructor); from
  // inside a listener, the rest happens right after that listener returns.
  // Never throws. Idempotent. Two latches whose listeners close each other
  // can deadlock (each close() waits for the other's running listener).
  void close() noexcept;

  // True while this latch leads: won and kHeld (or kUncertain, without
  // suspended_is_not_leader), read from the session's clock at the call.
  // It may be true a moment before kBecameLeader is delivered, and a
  // leadership that ends in that moment is never announced (no event).
  bool has_leadership() const noexcept;
  // The term (the leader entry's fencing token) while has_leadership().
  std::optional<std::uint64_t> term() const noexcept;

  // Waits until has_leadership(), the timeout passes (by the client's
  // clock), `stop` is requested or the latch is closed; true if leader.
  // Throws dlock::Error(kFailedPrecondition) on the client's dlock thread.
  bool await_leadership(Clock::duration timeout = kForever, std::stop_token stop = {});

  // Calls `fn(event, term)` on every later change: kBecameLeader and
  // kNoLongerLeader strictly alternate (the first is kBecameLeader), in
  // order, one call at a time, on a dlock thread (or the thread whose call
  // caused the change: close(), a store's session thread), with no lock of
  // dlock's held: `fn` may call close(). It must be quick and must not
  // block. An exception it throws is dropped. The handle unsubscribes when
  // destroyed; it does not wait for a call already running. A handle
  // destroyed before the latch (declared after it) misses the last
  // kNoLongerLeader of the destructor: close() first, or keep it longer.
  [[nodiscard]] std::shared_ptr<void> on_change(std::function<void(LatchEvent, std::uint64_t term)> fn);

  // Makes `value` the value of every later campaign and, if leader, of the
  // current term (Leadership::proclaim, whose errors it returns). When not
  // leader: OkStatus (a campaign waiting its turn is proclaimed to once it
  // wins). Throws dlock::Error(kInvalidArgument) for a value that is not
  // UTF-8 text of at most 64 KiB.
  Status proclaim(std::string value, Clock::duration timeout = std::chrono::seconds(10));

  const std::string& name() const noexcept;
  // The value of the next campaign (the last proclaimed).
  std::string value() const;

 private:
  std::shared_ptr<internal::LatchCore> core_;
};

}  // namespace dlock

#endif  // DLOCK_LEADER_LATCH_HPP_
