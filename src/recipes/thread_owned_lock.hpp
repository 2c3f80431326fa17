// Internal: the per-thread, reentrant bookkeeping behind dlock::Mutex.
#ifndef DLOCK_SRC_RECIPES_THREAD_OWNED_LOCK_HPP_
#define DLOCK_SRC_RECIPES_THREAD_OWNED_LOCK_HPP_

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "dlock/client.hpp"
#include "dlock/hold.hpp"
#include "recipes/acquire.hpp"

namespace dlock::internal {

// Builds the Hold for an entry acquired in `queue`, with the entry's token
// or `token` if given.
Hold MakeHold(const Client& client, const std::string& name, const std::string& queue, const Acquired& acquired,
              std::optional<std::uint64_t> token = std::nullopt);

// Runs AcquireEntry and turns errors into dlock::Error.
std::optional<Hold> AcquireHold(const Client& client, const std::string& name, const AcquireRequest& request,
                                std::optional<std::uint64_t> token = std::nullopt);

// AcquireRequest for `queue` with a deadline `timeout` from now.
AcquireRequest MakeRequest(const Client& client, std::string queue, std::string_view kind, GrantRule rule,
                           Clock::duration timeout, std::stop_token stop, bool try_only);

class ThreadOwnedLock {
 public:
  ThreadOwnedLock(Client client, std::string name);
  ~ThreadOwnedLock();

  bool lock_for(Clock::duration timeout, std::stop_token stop, bool try_only);
  void unlock() noexcept;
  const Hold* current() const;                     // the calling thread's hold; guarded use only
  std::shared_ptr<HoldCore> current_core() const;  // the same, shared, for use outside mu_
  std::optional<Hold> acquire(Clock::duration timeout, std::stop_token stop);

  bool owned_by_current_thread() const;
  std::optional<std::uint64_t> fencing_token() const;
  std::stop_token lost_token() const;
  std::optional<HoldState> hold_state() const;
  const std::string& name() const noexcept { return name_; }

 private:
  struct Owned {
    Hold hold;
    int count = 0;
  };
  const Client client_;
  const std::string name_;
  mutable std::mutex mu_;
  std::map<std::thread::id, Owned> owned_;  // guarded by mu_
};

}  // namespace dlock::internal

#endif  // DLOCK_SRC_RECIPES_THREAD_OWNED_LOCK_HPP_
