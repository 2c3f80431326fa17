// Internal: the per-thread, reentrant bookkeeping behind dlock::Mutex.
#ifndef DLOCK_SRC_RECIPES_THREAD_OWNED_LOCK_HPP_
#define DLOCK_SRC_RECIPES_THREAD_OWNED_LOCK_HPP_

#include <map>
#include <optional>
#include <string>
#include <thread>

#include "core/thread_annotations.hpp"
#include "dlock/client.hpp"
#include "dlock/hold.hpp"
#include "recipes/acquire.hpp"

namespace dlock::internal {

// Builds the Hold for an entry acquired in `queue`, with the entry's token
// or `token` if given.
Hold MakeHold(const Client& client, const std::string& name, const std::string& queue, const Acquired& acquired,
              std::optional<std::uint64_t> token = std::nullopt);

// Starts acquiring a Hold named `name`: `done` as for StartAcquire, with the
// Hold built on the entry (its token, or `token` if given).
void StartHold(const Client& client, const std::string& name, AcquireRequest request, AcquireCallback done,
               std::optional<std::uint64_t> token = std::nullopt);

// StartHold, waited for; errors are thrown as dlock::Error.
std::optional<Hold> AcquireHold(const Client& client, const std::string& name, const AcquireRequest& request,
                                std::optional<std::uint64_t> token = std::nullopt);

// A start function for the awaitable and future forms: builds the request
// (`make_request`) when the acquire starts, so the deadline counts from then.
std::function<void(AcquireCallback)> HoldStarter(Client client, std::string name,
                                                 std::function<AcquireRequest()> make_request);

// AcquireRequest for `queue` with a deadline `timeout` from now.
AcquireRequest MakeRequest(const Client& client, std::string queue, std::string_view kind, GrantRule rule,
                           Clock::duration timeout, std::stop_token stop, bool try_only);

class ThreadOwnedLock {
 public:
  ThreadOwnedLock(Client client, std::string name);
  ~ThreadOwnedLock();

  // All of these call the store or the application's callbacks (or both)
  // and take mu_ themselves.
  bool lock_for(Clock::duration timeout, std::stop_token stop, bool try_only) DLOCK_EXCLUDES(mu_);
  void unlock() noexcept DLOCK_EXCLUDES(mu_);
  // The calling thread's hold; valid while mu_ is held.
  const Hold* current() const DLOCK_REQUIRES(mu_);
  // The same, shared, for use outside mu_.
  std::shared_ptr<HoldCore> current_core() const DLOCK_EXCLUDES(mu_);
  std::optional<Hold> acquire(Clock::duration timeout, std::stop_token stop) DLOCK_EXCLUDES(mu_);
  // What acquire() does, without blocking: starts it when called.
  std::function<void(AcquireCallback)> async_starter(Clock::duration timeout, std::stop_token stop,
                                                     FailureSink failure = nullptr) const;

  bool owned_by_current_thread() const DLOCK_EXCLUDES(mu_);
  std::optional<std::uint64_t> fencing_token() const DLOCK_EXCLUDES(mu_);
  std::stop_token lost_token() const DLOCK_EXCLUDES(mu_);
  std::optional<HoldState> hold_state() const DLOCK_EXCLUDES(mu_);
  const std::string& name() const noexcept { return name_; }

 private:
  struct Owned {
    Hold hold;
    int count = 0;
  };
  const Client client_;
  const std::string name_;
  mutable Mutex mu_;
  std::map<std::thread::id, Owned> owned_ DLOCK_GUARDED_BY(mu_);
};

}  // namespace dlock::internal

#endif  // DLOCK_SRC_RECIPES_THREAD_OWNED_LOCK_HPP_
