// Semaphore: Curator's InterProcessSemaphoreV2 algorithm. Acquirers queue on
// an exclusive lock "<name>/locks"; only its holder appends lease entries to
// "<name>/leases" and, while there are more leases than permits, waits for
// any other lease to go. So a returned permit wakes exactly one process, and
// requests are served in the order they reached the lock queue.
#include "dlock/semaphore.hpp"

#include <algorithm>

#include "core/access.hpp"
#include "core/hold_core.hpp"
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
  const std::string leases = name_ + "/leases";
  auto request =
      internal::MakeRequest(client_, locks, entry_kind::kLock, internal::ExclusiveRule, timeout, stop, try_only);
  request.thread = "semaphore";
  const Clock::time_point deadline = request.deadline;
  auto expired = [&] { return stop.stop_requested() || core.now() >= deadline; };

  for (int round = 0; round < 1000; ++round) {
    // 1. The acquirers' lock.
    auto gate = AcquireEntry(core, request);
    if (!gate.ok()) throw Error(gate.status());
    if (!gate->has_value()) return std::nullopt;
    const std::shared_ptr<Session> session = (*gate)->session;
    struct ReleaseGate {
      ClientCore& core;
      const std::shared_ptr<Session>& session;
      const std::string& queue;
      std::string id;
      ~ReleaseGate() { core.remove_guaranteed(session, queue, id); }
    } release_gate{core, session, locks, (*gate)->entry.id};

    // 2. Our leases, on the same session.
    std::vector<HeldEntry> mine;
    std::uint64_t token = 0;
    std::optional<std::vector<Entry>> seen;  // the leases as the last append read them
    auto give_back = [&] {
      for (auto& e : mine) core.remove_guaranteed(session, leases, e.id);
      mine.clear();
    };
    // On every way out, an exception included, no lease stays behind
    // unless it went into the Lease (moving it leaves `mine` empty).
    struct GiveBackOnExit {
      const decltype(give_back)& fn;
      ~GiveBackOnExit() { fn(); }
    } give_back_on_exit{give_back};
    Round outcome = Round::kRetry;
    for (std::uint32_t i = 0; i < count; ++i) {
      AcquireRequest lease = request;
      lease.queue = leases;
      lease.kind = std::string(entry_kind::kLease);
      lease.rule = AlwaysGranted;
      lease.session = session;
      lease.use_gate = false;
      lease.try_only = false;
      auto got = AcquireEntry(core, lease);
      if (!got.ok() && got.status().code() != ErrorCode::kSessionLost) {
        give_back();
        throw Error(got.status());
      }
      if (!got.ok() || !got->has_value()) {
        give_back();
        outcome = got.ok() ? Round::kGaveUp : Round::kRetry;
        break;
      }
      mine.push_back({leases, (*got)->entry.id, (*got)->entry.sequence});
      token = std::max(token, (*got)->entry.token.value_or(0));
      seen = std::move((*got)->queue);
    }

    // 3. Wait until the leases fit the permits.
    while (mine.size() == count) {
      // The first look reuses what the last append read: no second round trip.
      Result<std::vector<Entry>> listed =
          seen ? Result<std::vector<Entry>>(std::move(*seen)) : session->list(leases, {}, deadline);
      seen.reset();
      if (!listed.ok()) {
        ErrorCode code = listed.status().code();
        if (code == ErrorCode::kUnavailable && !expired() &&
            core.await_not_suspended(*session, deadline, stop) == SessionState::kConnected) {
          continue;
        }
        give_back();
        if (code == ErrorCode::kSessionLost || code == ErrorCode::kUnavailable) {
          outcome = expired() ? Round::kGaveUp : Round::kRetry;
          break;
        }
        throw Error(listed.status());
      }
      std::vector<std::string> others;
      std::size_t present = 0;
      for (const Entry& e : *listed) {
        bool ours = std::any_of(mine.begin(), mine.end(), [&](const HeldEntry& m) { return m.id == e.id; });
        if (ours) {
          ++present;
        } else {
          others.push_back(e.id);
        }
      }
      if (present != mine.size()) {  // our leases vanished: the session ended
        give_back();
        outcome = Round::kRetry;
        break;
      }
      if (listed->size() <= permits_) {
        // A stop request wins over a grant that comes after it.
        if (stop.stop_requested()) {
          give_back();
          outcome = Round::kGaveUp;
          break;
        }
        return internal::WrapHold(
            internal::HoldCore::Make(internal::CoreOf(client_), session, name_, std::move(mine), token, count));
      }
      if (try_only || expired()) {
        give_back();
        outcome = Round::kGaveUp;
        break;
      }
      Status waited = session->wait_any_gone(leases, others, deadline, stop);
      if (waited.ok()) continue;
      if (waited.code() == ErrorCode::kUnavailable &&
          core.await_not_suspended(*session, deadline, stop) == SessionState::kConnected) {
        continue;
      }
      give_back();
      if (waited.code() == ErrorCode::kSessionLost) {
        outcome = Round::kRetry;
        break;
      }
      if (waited.code() == ErrorCode::kDeadlineExceeded || waited.code() == ErrorCode::kCancelled ||
          waited.code() == ErrorCode::kUnavailable) {
        outcome = Round::kGaveUp;
        break;
      }
      throw Error(waited);
    }
    if (outcome == Round::kGaveUp || expired()) return std::nullopt;
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
    std::lock_guard<std::mutex> g(mu_);
    hold_.release();
  }

  bool lock_for(Clock::duration timeout, std::stop_token stop, bool try_only) {
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
    std::lock_guard<std::mutex> g(mu_);
    hold_ = std::move(*lease);
    locked_ = true;
    return true;
  }

  void unlock() noexcept {
    Hold released;
    bool was_locked;
    {
      std::lock_guard<std::mutex> g(mu_);
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

  std::optional<std::uint64_t> fencing_token() const {
    std::lock_guard<std::mutex> g(mu_);
    if (!locked_) return std::nullopt;
    return hold_.fencing_token();
  }
  std::optional<HoldState> hold_state() const {
    std::lock_guard<std::mutex> g(mu_);
    if (!locked_) return std::nullopt;
    return hold_.state();
  }
  std::stop_token lost_token() const {
    // Outside mu_: requesting the stop runs the application's callbacks.
    std::shared_ptr<HoldCore> core;
    {
      std::lock_guard<std::mutex> g(mu_);
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
  mutable std::mutex mu_;
  bool locked_ = false;  // guarded by mu_
  Hold hold_;            // guarded by mu_
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
