// Internal: the one acquisition loop every recipe is built on.
//
// A recipe is a grant rule over a store queue: given the sorted queue and the
// position of our entry, either we hold the lock, or we name the few entries
// whose departure could change that (one, for a mutex: the entry just ahead).
// AcquireEntry appends our entry, applies the rule, waits for exactly those
// entries, and repeats; it re-queues after a session loss and removes its
// entry when it gives up.
#ifndef DLOCK_SRC_RECIPES_ACQUIRE_HPP_
#define DLOCK_SRC_RECIPES_ACQUIRE_HPP_

#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "core/client_core.hpp"
#include "core/hold_core.hpp"
#include "dlock/store.hpp"

namespace dlock::internal {

struct Verdict {
  bool granted = false;
  std::vector<std::string> wait_for;  // entry ids; non-empty unless granted
};

using GrantRule = std::function<Verdict(const std::vector<Entry>& queue, std::size_t ours)>;

// First in the queue, whatever the kinds ahead (Mutex, writer, internal
// semaphore mutex). Waits for the entry just ahead.
Verdict ExclusiveRule(const std::vector<Entry>& queue, std::size_t ours);
// No exclusive entry (anything but "read") ahead. Waits for the nearest one.
Verdict SharedRule(const std::vector<Entry>& queue, std::size_t ours);

struct AcquireRequest {
  std::string queue;
  std::string kind;
  GrantRule rule;
  Clock::time_point deadline = kNoDeadline;
  std::stop_token stop;
  std::string thread;  // for the owner record
  // Take this sequence (downgrade), and do not consult the rule: the caller
  // already holds what makes the entry granted.
  std::optional<std::int64_t> sequence;
  // Use this session and fail with kSessionLost rather than re-queue on a
  // new one (entries that must share a session with entries already held).
  std::shared_ptr<Session> session;
  // Give up at once if not granted on the first look.
  bool try_only = false;
  // Queue behind this process's other waiters for the same queue first.
  bool use_gate = true;
};

struct Acquired {
  std::shared_ptr<Session> session;
  Entry entry;               // with its token
  std::vector<Entry> queue;  // the queue as it was read when the entry was granted
};

// nullopt: the deadline passed, `stop` was requested, or try_only found the
// lock taken. Errors: the store failed in a way waiting cannot fix.
Result<std::optional<Acquired>> AcquireEntry(ClientCore& client, const AcquireRequest& request);

// Thread label for owner records: "thread <id>".
std::string ThisThreadLabel();

}  // namespace dlock::internal

#endif  // DLOCK_SRC_RECIPES_ACQUIRE_HPP_
