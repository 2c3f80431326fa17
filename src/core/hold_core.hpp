// Internal: the shared state of one dlock::Hold.
#ifndef DLOCK_SRC_CORE_HOLD_CORE_HPP_
#define DLOCK_SRC_CORE_HOLD_CORE_HPP_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stop_token>
#include <string>
#include <vector>

#include "core/access.hpp"
#include "core/client_core.hpp"
#include "core/listeners.hpp"
#include "core/serial_delivery.hpp"
#include "core/thread_annotations.hpp"
#include "dlock/hold.hpp"
#include "dlock/store.hpp"

namespace dlock::internal {

struct HeldEntry {
  std::string queue;
  std::string id;
  std::int64_t sequence = 0;
};

class HoldCore : public std::enable_shared_from_this<HoldCore> {
 public:
  // Makes a hold and starts following its session's state. `entries` are
  // removed on release.
  static std::shared_ptr<HoldCore> make(std::shared_ptr<ClientCore> client, std::shared_ptr<Session> session,
                                        std::string name, std::vector<HeldEntry> entries, std::uint64_t token,
                                        std::uint32_t permits);
  ~HoldCore();

  HoldState state() const noexcept DLOCK_EXCLUDES(mu_);
  std::uint64_t token() const noexcept { return token_; }
  const std::string& name() const noexcept { return name_; }
  std::uint32_t permits() const noexcept { return permits_; }
  // Both fold in the session's state at the moment they are read (see
  // hold.hpp); lost_token() requests the stop itself if need be.
  std::stop_token lost_token() const noexcept DLOCK_EXCLUDES(mu_);
  const std::shared_ptr<Session>& session() const noexcept { return session_; }
  const std::vector<HeldEntry>& entries() const noexcept { return entries_; }

  std::shared_ptr<void> on_state_change(std::function<void(HoldState)> fn);
  // Calls the client and store, and clears listeners: never under mu_.
  void release() noexcept DLOCK_EXCLUDES(mu_);

 private:
  HoldCore(std::shared_ptr<ClientCore> client, std::shared_ptr<Session> session, std::string name,
           std::vector<HeldEntry> entries, std::uint64_t token, std::uint32_t permits);
  // Tells listeners.
  void on_session_state(SessionState s) DLOCK_EXCLUDES(mu_);
  // Moves to `next` and tells listeners; run through delivery_ only, so
  // that the session's notes and our own entries' removal are told in
  // order, one at a time. delivery_.post, not run: a listener may close the
  // session, whose store thread then tells us kClosed and must not wait for
  // that listener (it is waiting for the store thread). A note is handed
  // over to another thread only while that thread is delivering for this
  // hold: a listener closing the session (it hears kLost once it returns),
  // a removal of our entry (the hold is lost already), or make() (no
  // listener yet).
  void apply(HoldState next) DLOCK_EXCLUDES(mu_);
  // Watches our own entries: one removed by anyone else (an operator's
  // `dlock break`, a Redis client pruning) ends the hold.
  void watch_entries() DLOCK_EXCLUDES(mu_);
  // One queue's watch; `round` counts the watches of it that failed before.
  void watch_queue(const std::string& queue, const std::vector<std::string>& ids, int round) DLOCK_EXCLUDES(mu_);
  // What ended a watch: a removal (kLost), our release or the session (the
  // end of it), or store trouble: the watch is set again after a pause, or
  // a later removal would go untold (review finding).
  void on_entry_watch(const std::string& queue, const std::vector<std::string>& ids, int round, const Status& waited)
      DLOCK_EXCLUDES(mu_);

  // Constant after construction.
  const std::shared_ptr<ClientCore> client_;
  const std::shared_ptr<Session> session_;
  const std::string name_;
  const std::vector<HeldEntry> entries_;
  const std::uint64_t token_;
  const std::uint32_t permits_;
  mutable std::stop_source lost_;  // requested from lost_token() too
  ListenerList<HoldState> listeners_;
  SerialDelivery delivery_;

  mutable Mutex mu_;
  HoldState state_ DLOCK_GUARDED_BY(mu_) = HoldState::kHeld;
  std::shared_ptr<void> subscription_ DLOCK_GUARDED_BY(mu_);
  // By queue: the live watch, and the round it belongs to (a late store
  // answer of an older round must not replace a newer watch).
  std::map<std::string, std::pair<int, std::shared_ptr<void>>> entry_watches_ DLOCK_GUARDED_BY(mu_);
};

}  // namespace dlock::internal

#endif  // DLOCK_SRC_CORE_HOLD_CORE_HPP_
