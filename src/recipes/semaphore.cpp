// Semaphore: Curator's InterProcessSemaphoreV2 algorithm. Acquirers queue on
// an exclusive lock "<name>/locks"; only its holder appends lease entries to
// "<name>/leases" and, while there are more leases than permits, waits for
// any other lease to go. So a returned permit wakes exactly one process, and
// requests are served in the order they reached the lock queue.
#include "dlock/semaphore.hpp"

#include <algorithm>

#include "core/access.hpp"
#include "core/hold_core.hpp"
#include "core/thread_annotations.hpp"
#include "recipes/thread_owned_lock.hpp"

namespace dlock {
namespace {

using internal::Acquired;
using internal::AcquireEntry;
using internal::AcquireRequest;
using internal::ClientCore;
using internal::HeldEntry;
using internal::Verdict;

Verdict AlwaysGranted(const std::vector<Entry>&, std::size_t) { return {true, {}}; }

// What one round on one session came to.
enum class Round { kGranted, kGaveUp, kRetry };

// Gives the acquirers' lock back when a round ends, however it ends.
struct GateRelease {
  ClientCore& core;
  const std::shared_ptr<Session>& session;
  const std::string& queue;
  std::string id;
  ~GateRelease() { core.remove_guaranteed(session, queue, id); }
};

// One round of an acquisition: while it holds the acquirers' lock, an
// acquirer appends its leases on the same session and waits until they fit
// the permits. However the round ends, an exception included, its leases go
// back, unless hand_over() moved them into a Lease.
class LeaseRound {
 public:
  LeaseRound(ClientCore& core, std::shared_ptr<Session> session, const AcquireRequest& gate, std::string leases,
             std::uint32_t count, std::uint32_t permits)
      : core_(core),
        session_(std::move(session)),
        gate_(gate),
        leases_(std::move(leases)),
        count_(count),
        permits_(permits) {}
  LeaseRound(const LeaseRound&) = delete;
  LeaseRound& operator=(const LeaseRound&) = delete;
  ~LeaseRound() { give_back(); }

  // Appends `count` leases; kGranted once all are in.
  Round take_leases() {
    AcquireRequest lease = gate_;
    lease.queue = leases_;
    lease.kind = std::string(entry_kind::kLease);
    lease.rule = AlwaysGranted;  // a lease is never refused; waiting for room is step 3
    lease.session = session_;
    lease.use_gate = false;
    lease.try_only = false;
    while (mine_.size() < count_) {
      auto got = AcquireEntry(core_, lease);
      if (!got.ok() && got.status().code() != ErrorCode::kSessionLost) throw Error(got.status());
      if (!got.ok()) return Round::kRetry;  // the session ended: its leases went with it
      if (!got->has_value()) return Round::kGaveUp;
      mine_.push_back({leases_, (*got)->entry.id, (*got)->entry.sequence});
      token_ = std::max(token_, (*got)->entry.token.value_or(0));
      seen_ = std::move((*got)->queue);
    }
    return Round::kGranted;
  }

  // Waits until there are no more leases than permits; kGranted then.
  Round wait_until_they_fit() {
    while (true) {
      // The first look reuses what the last append read: no second round trip.
      Result<std::vector<Entry>> listed =
          seen_ ? Result<std::vector<Entry>>(std::move(*seen_)) : session_->list(leases_, {}, gate_.deadline);
      seen_.reset();
      if (!listed.ok()) {
        if (back_in_touch(listed.status())) continue;
        return after_failure(listed.status());
      }
      std::vector<std::string> others = others_than(*listed);
      if (listed->size() - others.size() != mine_.size()) return Round::kRetry;  // ours vanished: session ended
      if (listed->size() <= permits_) {
        // A stop request wins over a grant that comes after it.
        return gate_.stop.stop_requested() ? Round::kGaveUp : Round::kGranted;
      }
      if (gate_.try_only || expired()) return Round::kGaveUp;
      Status waited = session_->wait_any_gone(leases_, others, gate_.deadline, gate_.stop);
      if (waited.ok() || back_in_touch(waited)) continue;
      return after_failure(waited);
    }
  }

  bool expired() const { return gate_.stop.stop_requested() || core_.now() >= gate_.deadline; }
  std::uint64_t token() const { return token_; }
  std::vector<HeldEntry> hand_over() { return std::exchange(mine_, {}); }

 private:
  void give_back() noexcept {
    for (auto& e : mine_) core_.remove_guaranteed(session_, leases_, e.id);
    mine_.clear();
  }

  // The ids of the leases that are not ours.
  std::vector<std::string> others_than(const std::vector<Entry>& listed) const {
    std::vector<std::string> others;
    for (const Entry& e : listed) {
      bool ours = std::any_of(mine_.begin(), mine_.end(), [&](const HeldEntry& m) { return m.id == e.id; });
      if (!ours) others.push_back(e.id);
    }
    return others;
  }

  // A store out of touch for a moment: wait (within the deadline) for the
  // session to be connected again, and look once more; its leases are still
  // there unless the session ended.
  bool back_in_touch(const Status& failed) {
    return failed.code() == ErrorCode::kUnavailable && !expired() &&
           core_.await_not_suspended(*session_, gate_.deadline, gate_.stop) == SessionState::kConnected;
  }

  // How a round ends on a failed look or wait: a session that ended (or a
  // store still out of touch) starts a new round on a new session within the
  // deadline, a deadline or stop gives up, a refusal throws.
  Round after_failure(const Status& failed) {
    switch (failed.code()) {
      case ErrorCode::kSessionLost:
      case ErrorCode::kUnavailable: return expired() ? Round::kGaveUp : Round::kRetry;
      case ErrorCode::kDeadlineExceeded:
      case ErrorCode::kCancelled: return Round::kGaveUp;
      default: throw Error(failed);
    }
  }

  ClientCore& core_;
  const std::shared_ptr<Session> session_;
  const AcquireRequest& gate_;  // deadline, stop and try_only of the whole acquisition
  const std::string leases_;
  const std::uint32_t count_;
  const std::uint32_t permits_;
  std::vector<HeldEntry> mine_;
  std::uint64_t token_ = 0;
  std::optional<std::vector<Entry>> seen_;  // the leases as the last append read them
};

// Rounds before an acquisition gives up on a store whose sessions keep ending.
constexpr int kMaxRounds = 1000;

}  // namespace

Semaphore::Semaphore(Client client, std::string name, std::uint32_t permits)
    : client_(std::move(client)), name_(std::move(name)), permits_(permits) {
  ThrowIfError(ValidateLockName(name_));
  if (permits_ == 0) throw Error(InvalidArgumentError("semaphore " + name_ + " needs at least one permit"));
}

std::optional<Lease> Semaphore::try_acquire(std::uint32_t count) {
  return acquire_impl(count, Clock::duration::zero(), {}, true);
}

std::optional<Lease> Semaphore::acquire(std::uint32_t count, Clock::duration timeout, std::stop_token stop) {
  return acquire_impl(count, timeout, std::move(stop), false);
}

std::optional<Lease> Semaphore::acquire_impl(std::uint32_t count, Clock::duration timeout, std::stop_token stop,
                                             bool try_only) {
  try_only = try_only || timeout <= Clock::duration::zero();  // one try, as for a TimedLockable
  if (count == 0 || count > permits_) {
    throw Error(InvalidArgumentError("cannot take " + std::to_string(count) + " of the " + std::to_string(permits_) +
                                     " permits of " + name_));
  }
  ClientCore& core = *internal::CoreOf(client_);
  const std::string locks = name_ + "/locks";
  auto request =
      internal::MakeRequest(client_, locks, entry_kind::kLock, internal::ExclusiveRule, timeout, stop, try_only);
  request.thread = "semaphore";

  for (int round = 0; round < kMaxRounds; ++round) {
    // 1. The acquirers' lock: one acquirer at a time appends leases, so a
    //    returned permit wakes exactly one of them.
    auto gate = AcquireEntry(core, request);
    if (!gate.ok()) throw Error(gate.status());
    if (!gate->has_value()) return std::nullopt;
    const std::shared_ptr<Session> session = (*gate)->session;
    GateRelease release_gate{core, session, locks, (*gate)->entry.id};
    // 2. Our leases, on the same session; 3. room for them. Destroyed before
    //    release_gate: the leases go back before the next acquirer comes in.
    LeaseRound leases(core, session, request, name_ + "/leases", count, permits_);
    Round outcome = leases.take_leases();
    if (outcome == Round::kGranted) outcome = leases.wait_until_they_fit();
    if (outcome == Round::kGranted) {
      return internal::WrapHold(internal::HoldCore::make(internal::CoreOf(client_), session, name_, leases.hand_over(),
                                                         leases.token(), count));
    }
    if (outcome == Round::kGaveUp || leases.expired()) return std::nullopt;
    // kRetry: the session ended under us; start over on a new one.
  }
  throw Error(AbortedError("semaphore " + name_ + ": too many sessions lost while acquiring"));
}

// ------------------------------------------------------------ SemaphoreMutex

namespace internal {

// The object's own lock (gate_, entered in lock() and left in unlock()) sits
// in front of the store's: one hold at a time per object, so an unlock can
// only end the hold it belongs to, even when the previous hold was lost and
// another thread wants the lock again before its owner has unlocked.
class SemaphoreMutexCore {
 public:
  SemaphoreMutexCore(Client client, std::string name)
      : semaphore_(client, std::move(name), 1), client_(std::move(client)) {
    // A clock moved by hand must re-check the deadlines of local waiters.
    std::weak_ptr<LocalGate> weak = gate_;
    clock_subscription_ = CoreOf(client_)->on_clock_advance([weak] {
      if (auto gate = weak.lock()) gate->poke();
    });
  }
  ~SemaphoreMutexCore() {
    // Released without mu_: a release may call the application back.
    Hold hold;
    {
      MutexLock g(mu_);
      hold = std::move(hold_);
    }
    hold.release();
  }

  bool lock_for(Clock::duration timeout, std::stop_token stop, bool try_only) DLOCK_EXCLUDES(mu_) {
    try_only = try_only || timeout <= Clock::duration::zero();
    const Clock::time_point deadline = DeadlineAfter(CoreOf(client_)->now(), timeout);
    if (try_only ? !gate_->try_enter() : !gate_->enter(CoreOf(client_)->clock(), deadline, stop)) return false;
    std::optional<Lease> lease;
    try {
      if (try_only) {
        lease = semaphore_.try_acquire(1);
      } else {
        Clock::duration left = deadline == kNoDeadline ? kForever : deadline - CoreOf(client_)->now();
        lease = semaphore_.acquire(1, std::max(left, Clock::duration::zero()), std::move(stop));
      }
    } catch (...) {
      gate_->leave();
      throw;
    }
    if (!lease) {
      gate_->leave();
      return false;
    }
    MutexLock g(mu_);
    hold_ = std::move(*lease);
    locked_ = true;
    return true;
  }

  void unlock() noexcept DLOCK_EXCLUDES(mu_) {
    Hold released;
    bool was_locked;
    {
      MutexLock g(mu_);
      was_locked = locked_;
      locked_ = false;
      released = std::move(hold_);
    }
    // Outside mu_: the application's callback may call back in.
    if (!was_locked) {
      CoreOf(client_)->report(
          FailedPreconditionError("unlock() of SemaphoreMutex " + semaphore_.name() + ", which is not locked"));
      return;
    }
    released.release();  // outside mu_: one store round trip
    gate_->leave();      // the next lock() of this object may go to the store now
  }

  std::optional<std::uint64_t> fencing_token() const DLOCK_EXCLUDES(mu_) {
    MutexLock g(mu_);
    if (!locked_) return std::nullopt;
    return hold_.fencing_token();
  }
  std::optional<HoldState> hold_state() const DLOCK_EXCLUDES(mu_) {
    MutexLock g(mu_);
    if (!locked_) return std::nullopt;
    return hold_.state();
  }
  std::stop_token lost_token() const DLOCK_EXCLUDES(mu_) {
    // Outside mu_: requesting the stop runs the application's callbacks.
    std::shared_ptr<HoldCore> core;
    {
      MutexLock g(mu_);
      if (locked_) core = CoreOf(hold_);
    }
    return core ? core->lost_token() : std::stop_token();
  }

  Semaphore& semaphore() noexcept { return semaphore_; }

 private:
  Semaphore semaphore_;
  const Client client_;
  const std::shared_ptr<LocalGate> gate_ = std::make_shared<LocalGate>();
  std::shared_ptr<void> clock_subscription_;
  mutable Mutex mu_;
  bool locked_ DLOCK_GUARDED_BY(mu_) = false;
  Hold hold_ DLOCK_GUARDED_BY(mu_);
};

}  // namespace internal

SemaphoreMutex::SemaphoreMutex(Client client, std::string name)
    : impl_(std::make_unique<internal::SemaphoreMutexCore>(std::move(client), std::move(name))) {}

SemaphoreMutex::~SemaphoreMutex() = default;

void SemaphoreMutex::lock() {
  if (!impl_->lock_for(kForever, {}, false)) throw Error(InternalError("lock() returned without the lock"));
}

bool SemaphoreMutex::try_lock() { return impl_->lock_for(Clock::duration::zero(), {}, true); }

bool SemaphoreMutex::lock_for(Clock::duration timeout, std::stop_token stop) {
  return impl_->lock_for(timeout, std::move(stop), false);
}

void SemaphoreMutex::unlock() noexcept { impl_->unlock(); }

std::optional<std::uint64_t> SemaphoreMutex::fencing_token() const { return impl_->fencing_token(); }

std::optional<HoldState> SemaphoreMutex::hold_state() const { return impl_->hold_state(); }

std::stop_token SemaphoreMutex::lost_token() const { return impl_->lost_token(); }

std::optional<Hold> SemaphoreMutex::acquire(Clock::duration timeout, std::stop_token stop) {
  return impl_->semaphore().acquire(1, timeout, std::move(stop));
}

}  // namespace dlock
