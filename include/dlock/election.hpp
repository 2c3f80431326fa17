// File: dlock/election.hpp
//
// dlock::Election elects one leader among any number of participants, in
// threads, processes and machines (docs/election.md has the design and each
// store's layout):
//
//   dlock::Election election(client, "billing/scheduler");
//   std::optional<dlock::Leadership> lead = election.campaign("10.0.0.7:8080");
//   while (lead && !lead->lost_token().stop_requested()) {
//     schedule(lead->term());          // let the resource fence by term
//   }                                  // the destructor resigns
//
// The leader is the participant whose entry is first in the election's
// queue: at most one at any point of the store's order of events. Its term is
// that entry's fencing token, so it grows with every new leader, and a
// resource that remembers the largest term it has seen refuses a deposed
// leader. A participant is told it lost leadership (kLost) no later than the
// moment the store could let another lead, by the same rule as a Hold.
//
// Observers (Election::observe) are told every change of leader, including
// "no leader", from readings of the store, and "unknown" while contact is
// lost.
//
// On etcd:// the candidates are the keys of Go's concurrency.Election (and
// `etcdctl elect`) on the same name: they elect one leader together.
//
// Thread-safety: every class here is thread-safe. The calls that wait for
// leadership or for the store to confirm (campaign(), proclaim()) throw
// dlock::Error as Mutex::acquire() does, and are refused (kFailedPrecondition)
// on a dlock callback thread. leader() and participants() are one reading
// and may be called anywhere, but on a dlock callback thread they hold that
// thread (and the client's other callbacks) for that round trip.
#ifndef DLOCK_ELECTION_HPP_
#define DLOCK_ELECTION_HPP_

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "dlock/async.hpp"
#include "dlock/client.hpp"
#include "dlock/export.hpp"
#include "dlock/hold.hpp"
#include "dlock/status.hpp"
#include "dlock/store.hpp"
#include "dlock/timeout.hpp"

namespace dlock {

namespace internal {
class LeadershipCore;
struct Access;
}  // namespace internal

// What the store says of one candidate (the leader, or a participant waiting
// its turn), whichever client made it.
struct LeaderInfo {
  std::string value;                 // dlock's value; Go's proposal on etcd ("" if none)
  std::uint64_t term = 0;            // the entry's fencing token
  std::string entry;                 // the entry id, as `dlock status` shows it
  std::optional<OwnerRecord> owner;  // for dlock participants, where the store keeps one
  // When it was told it leads, if it recorded it (dlock participants write
  // it just after they are told, so it may be missing for a moment).
  std::optional<std::int64_t> elected_unix_ms;
  // When its entry was made, where known: a dlock participant's record, or
  // the store's own time of the entry (zk: the node's ctime, so also for
  // Curator's and kazoo's participants).
  std::optional<std::int64_t> candidate_since_unix_ms;
};

// dlock::Leadership
//
// Won leadership, owned by no thread in particular, like dlock::Hold, with
// the same states and meanings: kHeld (leader), kUncertain (contact with the
// store lost: nobody else can lead until the session expires, but this
// process can no longer be sure), kLost (another may lead now), kReleased
// (resigned). Destroying it resigns.
class DLOCK_EXPORT Leadership {
 public:
  // Empty: not leader, state kReleased, term 0.
  Leadership() noexcept = default;
  Leadership(Leadership&&) noexcept = default;
  Leadership& operator=(Leadership&& other) noexcept;
  Leadership(const Leadership&) = delete;
  Leadership& operator=(const Leadership&) = delete;
  ~Leadership();

  // kHeld or kUncertain.
  bool held() const noexcept;
  explicit operator bool() const noexcept { return held(); }
  // Folds in the session's own clock, as Hold::state().
  HoldState state() const noexcept;

  // The fencing token of our entry: larger than every earlier leader's of
  // this election in this store. Unchanged by proclaim(); readable after
  // resign(); 0 when empty.
  std::uint64_t term() const noexcept;
  std::uint64_t fencing_token() const noexcept { return term(); }
  const std::string& name() const noexcept;
  // The value the store last confirmed: the campaign's, or a proclaimed one.
  std::string value() const;

  // As Hold::lost_token() and Hold::on_state_change().
  std::stop_token lost_token() const noexcept;
  std::shared_ptr<void> on_state_change(std::function<void(HoldState)> fn) const;

  // Publishes `value` in place of the current one, keeping leadership and
  // term: one store round trip, more only while contact is lost. Errors:
  // kFailedPrecondition ("not leader": the state is kLost or kReleased, or
  // the entry is gone); kUnavailable (not confirmed within `timeout`: the
  // new value may or may not be published, value() keeps the old one, and
  // proclaiming again is safe); kInvalidArgument (not UTF-8 text, or longer
  // than 64 KiB). Proclaims of one Leadership are applied in the order they
  // were called. The blocking form throws dlock::Error only where
  // Mutex::acquire() would (the callback thread); it returns the rest.
  // On zk:// a proclaim is a setData on our node, which Curator 5.4's
  // LeaderLatch does not survive: a latch right behind us takes the data
  // change for its one-shot watch and then misses our removal (until it
  // reconnects). Do not proclaim in an election shared with Curator.
  Status proclaim(std::string value, Clock::duration timeout = std::chrono::seconds(10));
  // `done` is called exactly once, on the client's dlock thread.
  void async_proclaim(std::string value, Clock::duration timeout, std::function<void(Status)> done);

  // Removes our entry, so the next candidate leads at once. The state is
  // kReleased before the removal is sent. Never throws; at most one round
  // trip, then retried in the background, as Hold::release(). Idempotent.
  void resign() noexcept;

 private:
  friend struct internal::Access;
  explicit Leadership(std::shared_ptr<internal::LeadershipCore> core) noexcept : core_(std::move(core)) {}
  std::shared_ptr<internal::LeadershipCore> core_;
};

// What an asynchronous campaign delivers: Leadership, std::nullopt (timed
// out or stopped; nothing of the campaign is left in the store), or an error.
using CampaignCallback = Awaitable<std::optional<Leadership>>::Callback;
using CampaignAwaitable = Awaitable<std::optional<Leadership>>;

// What an observer is told (Election::observe).
enum class LeaderState {
  kLeader,    // `leader` leads
  kNoLeader,  // no candidate
  kUnknown,   // contact with the store is lost: `leader` is the last one reported, if any, and may be stale
};
DLOCK_EXPORT std::string_view LeaderStateName(LeaderState state) noexcept;

struct Observation {
  LeaderState state = LeaderState::kUnknown;
  std::optional<LeaderInfo> leader;
  std::uint64_t number = 0;  // 1, 2, ...: the report's place in its subscription
};

class DLOCK_EXPORT Election {
 public:
  // Throws dlock::Error(kInvalidArgument) if `name` is not a valid lock name.
  Election(Client client, std::string name);

  // Campaigns with `value` until leader, the timeout passes or `stop` is
  // requested (std::nullopt). A timeout <= 0 is one try: leader now, or
  // nullopt. Each campaign is a participant of its own, with its own entry,
  // also within one process (unlike locks, there is no local line: every
  // candidate is visible to participants() and to other clients). `value`
  // must be UTF-8 text of at most 64 KiB (dlock::Error(kInvalidArgument) at
  // the call otherwise). Throws dlock::Error as Mutex::acquire() does; on a
  // store that keeps no values, kUnimplemented.
  std::optional<Leadership> campaign(std::string value, Clock::duration timeout = kForever, std::stop_token stop = {});
  // The asynchronous forms (dlock/async.hpp's rules: the callback runs, and
  // the coroutine resumes, on the client's dlock thread).
  void async_campaign(std::string value, Clock::duration timeout, std::stop_token stop, CampaignCallback done);
  CampaignAwaitable async_campaign(std::string value, Clock::duration timeout = kForever, std::stop_token stop = {});
  std::future<std::optional<Leadership>> campaign_future(std::string value, Clock::duration timeout = kForever,
                                                         std::stop_token stop = {});

  // One consistent reading: the leader, or std::nullopt if there is none.
  // Errors as Client::list_entries (kUnavailable, kPermissionDenied, ...).
  Result<std::optional<LeaderInfo>> leader() const;
  // Every candidate, leader first, in queue order, from one reading.
  Result<std::vector<LeaderInfo>> participants() const;

  // Calls `fn` with the current state, then after every change of leader
  // or of the leader's value, in the store's order, including "no leader".
  // Every report comes from a reading of the store, never from an event
  // alone, so none is staler than the reading it came from; a state that
  // begins and ends between a wake-up and the next reading may not be
  // reported (docs/election.md, §3.4). Woken by the store (watches,
  // pub/sub, the kernel), never by polling. While contact is lost it reports
  // kUnknown once; when contact is back, or a new session is open, it reads
  // again and reports the current state, even if unchanged.
  //
  // `fn` runs on the client's dlock thread, one call at a time, and must not
  // block (rules as Hold::on_state_change). The returned handle
  // unsubscribes when destroyed: no call starts after that, but one already
  // running is not waited for. The subscription keeps the client working.
  // observe() itself never waits for the store. On a store that keeps no
  // values (none in this repository) it reports kUnknown once and tells
  // ClientOptions::on_background_error (kUnimplemented).
  [[nodiscard]] std::shared_ptr<void> observe(std::function<void(const Observation&)> fn) const;

  const std::string& name() const noexcept { return name_; }

 private:
  std::function<void(CampaignCallback)> campaign_starter(std::string value, Clock::duration timeout,
                                                         std::stop_token stop) const;

  Client client_;
  std::string name_;
};

}  // namespace dlock

#endif  // DLOCK_ELECTION_HPP_
