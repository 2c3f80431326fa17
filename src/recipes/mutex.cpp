#include "dlock/mutex.hpp"

#include "core/access.hpp"
#include "core/hold_core.hpp"
#include "core/thread_annotations.hpp"
#include "recipes/thread_owned_lock.hpp"

namespace dlock {
namespace internal {

Hold MakeHold(const Client& client, const std::string& name, const std::string& queue, const Acquired& acquired,
              std::optional<std::uint64_t> token) {
  std::vector<HeldEntry> entries{{queue, acquired.entry.id, acquired.entry.sequence}};
  return WrapHold(HoldCore::make(CoreOf(client), acquired.session, name, std::move(entries),
                                 token.value_or(acquired.entry.token.value_or(0)), 1));
}

void StartHold(const Client& client, const std::string& name, AcquireRequest request, AcquireCallback done,
               std::optional<std::uint64_t> token) {
  std::string queue = request.queue;
  FailureSink failure = request.failure;
  // The client is let go of before `done`, as the acquisition lets go of
  // its own (see Operation::disarm).
  StartAcquire(CoreOf(client), std::move(request),
               [client = std::optional<Client>(client), name, queue = std::move(queue), done = std::move(done), token,
                failure](AcquireOutcome got) mutable {
                 if (!got.ok()) {
                   client.reset();
                   return done(got.status());
                 }
                 if (!got->has_value()) {
                   client.reset();
                   return done(std::optional<Hold>());
                 }
                 std::optional<Hold> hold;
                 try {
                   hold = MakeHold(*client, name, queue, **got, token);
                 } catch (const std::exception& e) {
                   // The HoldCore, if it was made, released the entry as it went.
                   if (failure) failure->keep(std::current_exception());
                   client.reset();
                   return done(InternalError("making the hold of " + name + ": " + e.what()));
                 }
                 client.reset();
                 done(std::move(hold));
               });
}

std::optional<Hold> AcquireHold(const Client& client, const std::string& name, const AcquireRequest& request,
                                std::optional<std::uint64_t> token) {
  Result<std::optional<Hold>> got =
      WaitFor<std::optional<Hold>>(*CoreOf(client), [&](AcquireCallback done, FailureSink failure) {
        AcquireRequest r = request;
        r.failure = std::move(failure);
        StartHold(client, name, std::move(r), std::move(done), token);
      });
  if (!got.ok()) throw Error(got.status());
  return std::move(got).value();
}

std::function<void(AcquireCallback)> HoldStarter(Client client, std::string name,
                                                 std::function<AcquireRequest()> make_request) {
  return [client = std::move(client), name = std::move(name), make_request = std::move(make_request)](
             AcquireCallback done) { StartHold(client, name, make_request(), std::move(done)); };
}

AcquireRequest MakeRequest(const Client& client, std::string queue, std::string_view kind, GrantRule rule,
                           Clock::duration timeout, std::stop_token stop, bool try_only) {
  AcquireRequest r;
  r.queue = std::move(queue);
  r.kind = std::string(kind);
  r.rule = std::move(rule);
  // A timeout <= 0 is one try, as for the standard TimedLockable.
  try_only = try_only || timeout <= Clock::duration::zero();
  // A try still needs time for its round trips.
  r.deadline = DeadlineAfter(CoreOf(client)->now(), try_only ? Clock::duration(ClientCore::kRequestTimeout) : timeout);
  r.stop = std::move(stop);
  r.try_only = try_only;
  // A try never waits for its turn, so it never queues behind this process's
  // other waiters either: at most it adds an entry that it removes at once.
  r.use_gate = !try_only;
  r.thread = ThisThreadLabel();
  return r;
}

ThreadOwnedLock::ThreadOwnedLock(Client client, std::string name) : client_(std::move(client)), name_(std::move(name)) {
  ThrowIfError(ValidateLockName(name_));
}

ThreadOwnedLock::~ThreadOwnedLock() {
  // Released without mu_: a release may call the application back
  // (on_background_error), and nothing of dlock's is called under its locks.
  decltype(owned_) owned;
  {
    MutexLock g(mu_);
    owned.swap(owned_);
  }
  for (auto& [thread, o] : owned) o.hold.release();
}

bool ThreadOwnedLock::lock_for(Clock::duration timeout, std::stop_token stop, bool try_only) {
  const auto me = std::this_thread::get_id();
  {
    MutexLock g(mu_);
    auto it = owned_.find(me);
    if (it != owned_.end()) {
      if (it->second.hold.state() == HoldState::kLost) {
        throw Error(SessionLostError("this thread's hold on " + name_ + " was lost; unlock it before locking again"));
      }
      ++it->second.count;
      return true;
    }
  }
  auto hold =
      AcquireHold(client_, name_,
                  MakeRequest(client_, name_, entry_kind::kLock, ExclusiveRule, timeout, std::move(stop), try_only));
  if (!hold) return false;
  MutexLock g(mu_);
  owned_[me] = Owned{std::move(*hold), 1};
  return true;
}

void ThreadOwnedLock::unlock() noexcept {
  Hold to_release;
  {
    MutexLock g(mu_);
    auto it = owned_.find(std::this_thread::get_id());
    if (it != owned_.end()) {
      if (--it->second.count > 0) return;
      to_release = std::move(it->second.hold);
      owned_.erase(it);
    }
  }
  // Both outside mu_: the release is a store round trip, and the report
  // runs the application's callback, which may call back into this lock.
  if (!CoreOf(to_release)) {
    CoreOf(client_)->report(FailedPreconditionError("unlock() of " + name_ + " by a thread that does not hold it"));
    return;
  }
  to_release.release();
}

const Hold* ThreadOwnedLock::current() const {
  auto it = owned_.find(std::this_thread::get_id());
  return it == owned_.end() ? nullptr : &it->second.hold;
}

std::optional<Hold> ThreadOwnedLock::acquire(Clock::duration timeout, std::stop_token stop) {
  Result<std::optional<Hold>> got =
      WaitFor<std::optional<Hold>>(*CoreOf(client_), [&](AcquireCallback done, FailureSink failure) {
        async_starter(timeout, std::move(stop), std::move(failure))(std::move(done));
      });
  if (!got.ok()) throw Error(got.status());
  return std::move(got).value();
}

std::function<void(AcquireCallback)> ThreadOwnedLock::async_starter(Clock::duration timeout, std::stop_token stop,
                                                                    FailureSink failure) const {
  return HoldStarter(client_, name_, [client = client_, name = name_, timeout, stop = std::move(stop), failure] {
    auto request = MakeRequest(client, name, entry_kind::kLock, ExclusiveRule, timeout, stop, false);
    request.thread = "hold";
    request.failure = failure;
    return request;
  });
}

bool ThreadOwnedLock::owned_by_current_thread() const {
  MutexLock g(mu_);
  return current() != nullptr;
}

std::optional<std::uint64_t> ThreadOwnedLock::fencing_token() const {
  MutexLock g(mu_);
  const Hold* h = current();
  if (!h) return std::nullopt;
  return h->fencing_token();
}

std::stop_token ThreadOwnedLock::lost_token() const {
  // Read outside mu_: lost_token() may request the stop, which runs the
  // application's stop callbacks, which may call back into this lock.
  std::shared_ptr<HoldCore> core = current_core();
  return core ? core->lost_token() : std::stop_token();
}

std::shared_ptr<HoldCore> ThreadOwnedLock::current_core() const {
  MutexLock g(mu_);
  const Hold* h = current();
  return h ? CoreOf(*h) : nullptr;
}

std::optional<HoldState> ThreadOwnedLock::hold_state() const {
  std::shared_ptr<HoldCore> core = current_core();
  if (!core) return std::nullopt;
  return core->state();
}

}  // namespace internal

Mutex::Mutex(Client client, std::string name)
    : impl_(std::make_unique<internal::ThreadOwnedLock>(std::move(client), std::move(name))) {}
Mutex::~Mutex() = default;

void Mutex::lock() {
  if (!impl_->lock_for(kForever, {}, false)) {
    throw Error(InternalError("lock() of " + impl_->name() + " returned without the lock"));
  }
}
bool Mutex::try_lock() { return impl_->lock_for(Clock::duration::zero(), {}, true); }
bool Mutex::lock_for(Clock::duration timeout, std::stop_token stop) {
  return impl_->lock_for(timeout, std::move(stop), false);
}
void Mutex::unlock() noexcept { impl_->unlock(); }
bool Mutex::owned_by_current_thread() const { return impl_->owned_by_current_thread(); }
std::optional<std::uint64_t> Mutex::fencing_token() const { return impl_->fencing_token(); }
std::stop_token Mutex::lost_token() const { return impl_->lost_token(); }
std::optional<HoldState> Mutex::hold_state() const { return impl_->hold_state(); }
std::optional<Hold> Mutex::acquire(Clock::duration timeout, std::stop_token stop) {
  return impl_->acquire(timeout, std::move(stop));
}
void Mutex::async_acquire(Clock::duration timeout, std::stop_token stop, AcquireCallback done) {
  impl_->async_starter(timeout, std::move(stop))(std::move(done));
}
AcquireAwaitable Mutex::async_acquire(Clock::duration timeout, std::stop_token stop) {
  return AcquireAwaitable(impl_->async_starter(timeout, std::move(stop)));
}
std::future<std::optional<Hold>> Mutex::acquire_future(Clock::duration timeout, std::stop_token stop) {
  return internal::FutureOf(impl_->async_starter(timeout, std::move(stop)));
}
const std::string& Mutex::name() const noexcept { return impl_->name(); }

}  // namespace dlock
