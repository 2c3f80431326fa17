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
#include "recipes/operation.hpp"
#include "recipes/thread_owned_lock.hpp"

namespace dlock {
namespace {

using internal::AcquireOutcome;
using internal::AcquireRequest;
using internal::ClientCore;
using internal::HeldEntry;
using internal::Verdict;

Verdict AlwaysGranted(const std::vector<Entry>&, std::size_t) { return {true, {}}; }

// Rounds before an acquisition gives up on a store whose sessions keep ending.
constexpr int kMaxRounds = 1000;

// How one round ended.
enum class Round { kGranted, kGaveUp, kRetry };

// One semaphore acquisition (see operation.hpp for how its steps run), in
// rounds. A round: (1) the acquirers' lock "<name>/locks", so that one
// acquirer at a time appends leases and a returned permit wakes exactly one
// of them; (2) our leases in "<name>/leases", on the same session; (3) wait
// until there are no more leases than permits. However a round ends, the
// leases go back (unless they became the Lease), then the acquirers' lock.
class SemaphoreAcquisition : public internal::Operation<SemaphoreAcquisition> {
 public:
  using Done = std::function<void(Result<std::optional<Lease>>)>;

  SemaphoreAcquisition(std::shared_ptr<ClientCore> core, std::string name, AcquireRequest gate, std::uint32_t count,
                       std::uint32_t permits, Done done)
      : Operation(std::move(core), gate.deadline, gate.stop, gate.failure),
        name_(std::move(name)),
        leases_(name_ + "/leases"),
        gate_(std::move(gate)),
        count_(count),
        permits_(permits),
        done_(std::move(done)) {}

  // On the calling thread. The first round's acquirers' lock is asked for
  // here, not in a step, so that one thread's acquisitions queue in the
  // order it made them (as Acquisition::start); arm() goes first, and
  // round() touches nothing arm() or an interrupt does.
  void start() {
    post(step([](SemaphoreAcquisition& s) { s.arm(); }));
    try {
      round();
    } catch (const std::exception& e) {  // out of memory: never an operation without an outcome
      keep(std::current_exception());
      post(step([what = std::string(e.what())](SemaphoreAcquisition& s) { s.abort(what.c_str()); }));
    }
  }

 private:
  friend class internal::Operation<SemaphoreAcquisition>;

  // (1) The acquirers' lock.
  void round() {
    if (++rounds_ > kMaxRounds) {
      return finish(AbortedError("semaphore " + name_ + ": too many sessions lost while acquiring"));
    }
    internal::StartAcquire(client_, gate_, then<AcquireOutcome>([](SemaphoreAcquisition& s, AcquireOutcome got) {
                             s.on_gate(std::move(got));
                           }));
  }

  void on_gate(AcquireOutcome got) {
    if (!got.ok()) return finish(got.status());
    if (!got->has_value()) return finish(std::optional<Lease>());
    session_ = (*got)->session;
    gate_entry_ = (*got)->entry.id;
    take_lease();
  }

  // (2) Our leases, one at a time, on the gate's session.
  void take_lease() {
    if (mine_.size() == count_) return fit();
    AcquireRequest lease = gate_;
    lease.queue = leases_;
    lease.kind = std::string(entry_kind::kLease);
    lease.rule = AlwaysGranted;  // a lease is never refused; waiting for room is step 3
    lease.session = session_;
    lease.use_gate = false;
    lease.try_only = false;
    internal::StartAcquire(client_, std::move(lease),
                           then<AcquireOutcome>([](SemaphoreAcquisition& s, AcquireOutcome got) {
                             if (!got.ok() && got.status().code() != ErrorCode::kSessionLost) {
                               return s.end_round_with(got.status());
                             }
                             if (!got.ok()) return s.end_round(Round::kRetry);  // its leases went with the session
                             if (!got->has_value()) return s.end_round(Round::kGaveUp);
                             const internal::Acquired& a = **got;
                             s.mine_.push_back({s.leases_, a.entry.id, a.entry.sequence});
                             s.token_ = std::max(s.token_, a.entry.token.value_or(0));
                             s.seen_ = a.queue;
                             s.take_lease();
                           }));
  }

  // (3) Until there are no more leases than permits. The first look reuses
  // what the last append read: no second round trip.
  void fit() {
    if (seen_) return check(std::exchange(seen_, std::nullopt).value());
    request<Result<std::vector<Entry>>>([&] { return session_->list(leases_, {}, deadline_); },
                                        [&](auto done) { session_->async_list(leases_, {}, deadline_, done); },
                                        [](SemaphoreAcquisition& s, Result<std::vector<Entry>> r) {
                                          if (r.ok()) return s.check(std::move(r).value());
                                          s.after_failure(r.status());
                                        });
  }

  void check(const std::vector<Entry>& listed) {
    std::vector<std::string> others = others_than(listed);
    if (listed.size() - others.size() != mine_.size()) return end_round(Round::kRetry);  // ours vanished
    // A stop request wins over a grant that comes after it.
    if (listed.size() <= permits_) return end_round(stopped() ? Round::kGaveUp : Round::kGranted);
    if (gate_.try_only || expired()) return end_round(Round::kGaveUp);
    wait_any_gone(*session_, leases_, others, [](SemaphoreAcquisition& s, Status waited) {
      s.wait_.reset();
      s.on_interrupt_ = nullptr;
      if (waited.ok()) return s.fit();
      s.after_failure(waited);
    });
  }

  // A failed look or wait: a store out of touch for a moment is waited for
  // (within the deadline) and looked at again; a session that ended starts
  // a new round on a new session within the deadline; a deadline or stop
  // gives up; a refusal is the acquisition's error.
  void after_failure(const Status& failed) {
    switch (failed.code()) {
      case ErrorCode::kUnavailable:
        if (expired()) return end_round(Round::kGaveUp);
        return recover(session_, [](SemaphoreAcquisition& s, bool connected) {
          // Paced: a request that fails at once although the session says
          // it is connected must not spin on the executor.
          if (connected && !s.expired()) return s.pause([](SemaphoreAcquisition& t) { t.fit(); });
          s.end_round(s.expired() ? Round::kGaveUp : Round::kRetry);
        });
      case ErrorCode::kSessionLost: return end_round(expired() ? Round::kGaveUp : Round::kRetry);
      case ErrorCode::kDeadlineExceeded:
      case ErrorCode::kCancelled: return end_round(Round::kGaveUp);
      default: return end_round_with(failed);
    }
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

  // Ends a round: the leases go back (unless granted), then the acquirers'
  // lock, then the outcome or the next round.
  void end_round(Round outcome) {
    std::optional<Lease> lease;
    if (outcome == Round::kGranted) {
      lease = internal::WrapHold(
          internal::HoldCore::make(user_, session_, name_, std::exchange(mine_, {}), token_, count_));
    }
    give_back([outcome, lease = std::make_shared<std::optional<Lease>>(std::move(lease))](SemaphoreAcquisition& s) {
      if (outcome == Round::kRetry && !s.expired()) return s.next_round();
      s.finish(std::move(*lease));
    });
  }
  void end_round_with(Status error) {
    give_back([error = std::move(error)](SemaphoreAcquisition& s) { s.finish(error); });
  }

  void next_round() {
    session_.reset();
    gate_entry_.clear();
    token_ = 0;
    seen_.reset();
    round();
  }

  // Removes our leases, then the gate entry; `then` afterwards.
  void give_back(Step next) {
    if (!mine_.empty()) {
      HeldEntry e = mine_.back();
      mine_.pop_back();
      return client_->remove_async(
          session_, leases_, e.id,
          then(Step([next = std::move(next)](SemaphoreAcquisition& s) { s.give_back(next); })));
    }
    if (!gate_entry_.empty()) {
      return client_->remove_async(session_, gate_.queue, std::exchange(gate_entry_, {}),
                                   then(Step([next = std::move(next)](SemaphoreAcquisition& s) { next(s); })));
    }
    next(*this);
  }

  void finish(Result<std::optional<Lease>> outcome) {
    disarm();
    wait_.reset();
    Done done = std::move(done_);
    try {
      done(std::move(outcome));
    } catch (...) {  // the caller's
    }
  }

  void abort(const char* what) {
    if (finished_) return;
    for (const auto& e : mine_) client_->remove_guaranteed(session_, leases_, e.id);
    if (!gate_entry_.empty()) client_->remove_guaranteed(session_, gate_.queue, gate_entry_);
    mine_.clear();
    gate_entry_.clear();
    finish(InternalError(std::string("acquiring semaphore ") + name_ + ": " + what));
  }

  const std::string name_;
  const std::string leases_;
  const AcquireRequest gate_;  // the acquirers' lock; deadline, stop and try_only of the whole acquisition
  const std::uint32_t count_;
  const std::uint32_t permits_;
  Done done_;
  int rounds_ = 0;
  std::shared_ptr<Session> session_;  // this round's
  std::string gate_entry_;            // ours in "<name>/locks", while held
  std::vector<HeldEntry> mine_;
  std::uint64_t token_ = 0;
  std::optional<std::vector<Entry>> seen_;  // the leases as the last append read them
};

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

namespace {

// Starts a semaphore acquisition from copies: an awaitable may start after its
// Semaphore is gone.
void StartSemaphore(const Client& client, const std::string& name, std::uint32_t permits, std::uint32_t count,
                    Clock::duration timeout, std::stop_token stop, bool try_only, AcquireCallback done,
                    internal::FailureSink failure) {
  try_only = try_only || timeout <= Clock::duration::zero();  // one try, as for a TimedLockable
  if (count == 0 || count > permits) {
    throw Error(InvalidArgumentError("cannot take " + std::to_string(count) + " of the " + std::to_string(permits) +
                                     " permits of " + name));
  }
  auto request = internal::MakeRequest(client, name + "/locks", entry_kind::kLock, internal::ExclusiveRule, timeout,
                                       std::move(stop), try_only);
  request.thread = "semaphore";
  request.failure = std::move(failure);
  std::make_shared<SemaphoreAcquisition>(internal::CoreOf(client), name, std::move(request), count, permits,
                                         std::move(done))
      ->start();
}

}  // namespace

void Semaphore::async_acquire(std::uint32_t count, Clock::duration timeout, std::stop_token stop,
                              AcquireCallback done) {
  StartSemaphore(client_, name_, permits_, count, timeout, std::move(stop), false, std::move(done), nullptr);
}

AcquireAwaitable Semaphore::async_acquire(std::uint32_t count, Clock::duration timeout, std::stop_token stop) {
  return AcquireAwaitable([client = client_, name = name_, permits = permits_, count, timeout,
                           stop = std::move(stop)](AcquireCallback done) {
    StartSemaphore(client, name, permits, count, timeout, stop, false, std::move(done), nullptr);
  });
}

std::future<std::optional<Lease>> Semaphore::acquire_future(std::uint32_t count, Clock::duration timeout,
                                                            std::stop_token stop) {
  return internal::FutureOf([&](AcquireCallback done) {
    StartSemaphore(client_, name_, permits_, count, timeout, std::move(stop), false, std::move(done), nullptr);
  });
}

std::optional<Lease> Semaphore::acquire_impl(std::uint32_t count, Clock::duration timeout, std::stop_token stop,
                                             bool try_only) {
  Result<std::optional<Lease>> got = internal::WaitFor<std::optional<Lease>>(
      *internal::CoreOf(client_), [&](AcquireCallback done, internal::FailureSink failure) {
        StartSemaphore(client_, name_, permits_, count, timeout, std::move(stop), try_only, std::move(done),
                       std::move(failure));
      });
  if (!got.ok()) throw Error(got.status());
  return std::move(got).value();
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
void SemaphoreMutex::async_acquire(Clock::duration timeout, std::stop_token stop, AcquireCallback done) {
  impl_->semaphore().async_acquire(1, timeout, std::move(stop), std::move(done));
}
AcquireAwaitable SemaphoreMutex::async_acquire(Clock::duration timeout, std::stop_token stop) {
  return impl_->semaphore().async_acquire(1, timeout, std::move(stop));
}
std::future<std::optional<Hold>> SemaphoreMutex::acquire_future(Clock::duration timeout, std::stop_token stop) {
  return impl_->semaphore().acquire_future(1, timeout, std::move(stop));
}

}  // namespace dlock
