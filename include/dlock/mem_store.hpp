// File: dlock/mem_store.hpp
//
// dlock::MemStore: an in-process store (URL "mem://"), for programs that only
// need locks between their own threads, and for tests. It has the semantics of
// a real store, an injectable clock and fault hooks, so that what suspension,
// expiry, lost replies and failed requests do to a recipe can be tested
// deterministically:
//
//   auto clock = std::make_shared<dlock::ManualClock>();
//   dlock::MemStoreOptions options;
//   options.clock = clock;
//   auto store = dlock::MemStore::create(options);
//   auto client = dlock::Client::with_store(store);
//   ...
//   store->expire(client.session()->get()->id());  // holders hear kLost first
//
// Thread-safety: all methods are thread-safe.
#ifndef DLOCK_MEM_STORE_HPP_
#define DLOCK_MEM_STORE_HPP_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "dlock/clock.hpp"
#include "dlock/export.hpp"
#include "dlock/status.hpp"
#include "dlock/store.hpp"

namespace dlock {

struct MemStoreOptions {
  std::shared_ptr<Clock> clock;  // nullptr: Clock::system()
};

class DLOCK_EXPORT MemStore final : public Store, public std::enable_shared_from_this<MemStore> {
 public:
  static std::shared_ptr<MemStore> create(MemStoreOptions options = {});
  ~MemStore() override;

  std::string url() const override;
  Result<std::shared_ptr<Session>> open_session(Clock::time_point deadline) override;

  // --- Fault hooks. `session_id` is Session::id(). Unknown ids are ignored.

  // Contact lost: the session's operations fail with kUnavailable and its
  // listeners hear kSuspended. Its entries stay.
  void suspend(std::string_view session_id);
  // Contact back: listeners hear kConnected.
  void resume(std::string_view session_id);
  // Expiry: listeners hear kLost first; only then are the entries removed and
  // waiters on them woken.
  void expire(std::string_view session_id);

  // The next `count` calls of operation `op` ("append", "list", "wait",
  // "remove", "find_own", "update", "watch_head", "open_session", or "*" for
  // any) fail with `status` without taking effect.
  void fail_next(std::string_view op, Status status, int count = 1);
  // The next `count` calls of `op` take effect but report kUnavailable, as
  // when a reply is lost on the way back.
  void lose_next_reply(std::string_view op, int count = 1);
  // The next `count` calls of `op` wait until the store's clock has moved
  // `by` past their start (a slow network), then proceed.
  void delay_next(std::string_view op, Clock::duration by, int count = 1);

  // --- Observation, for tests.

  // Live entries in all queues.
  std::size_t entry_count() const;
  // How many calls of `op` were made ("append", ...); "wake" counts the
  // wait_any_gone calls that returned because an entry went; "delayed" the
  // calls held back by delay_next.
  std::uint64_t op_count(std::string_view op) const;

 private:
  MemStore() = default;
  struct State;
  class MemSession;
  // Moves a session to `next` and calls its listeners in order, without the
  // store's mutex; then runs `then` under the mutex.
  static void transition(const std::shared_ptr<State>& state, std::string_view id, SessionState next,
                         const std::function<void(State&)>& then = {});
  std::shared_ptr<State> state_;
  std::shared_ptr<void> clock_subscription_;
};

}  // namespace dlock

#endif  // DLOCK_MEM_STORE_HPP_
