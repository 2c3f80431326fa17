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

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "core/client_core.hpp"
#include "core/hold_core.hpp"
#include "dlock/store.hpp"
#include "recipes/caller_steps.hpp"

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
  // The entry's published value (an election candidate's).
  std::optional<std::string> value;
  FailureSink failure;
};

struct Acquired {
  std::shared_ptr<Session> session;
  Entry entry;               // with its token
  OwnerRecord owner;         // the record it was appended with
  std::vector<Entry> queue;  // the queue as it was read when the entry was granted
};

using AcquireOutcome = Result<std::optional<Acquired>>;
using AcquireDone = std::function<void(AcquireOutcome)>;

// Starts acquiring. `done` runs exactly once, never inside this call, on the
// client's executor thread (or, with request.failure, on the blocking
// caller's own), with: the granted entry (the caller owns
// it), nullopt (the deadline passed, `stop` was requested, or try_only found
// the lock taken; nothing of ours is left in the store), or an error (the
// store failed in a way waiting cannot fix).
void StartAcquire(const std::shared_ptr<ClientCore>& client, AcquireRequest request, AcquireDone done);

// Blocks until `start(done, caller)` has called `done`, running the steps of
// what it started on this thread meanwhile, and rethrows what the engine
// kept by `caller->keep()`; refused on the executor thread of `client`
// (whose timers it needs). Shared by every blocking recipe call.
template <class T>
Result<T> WaitFor(ClientCore& client, const std::function<void(std::function<void(Result<T>)>, FailureSink)>& start);

template <class T>
Result<T> WaitFor(ClientCore& client, const std::function<void(std::function<void(Result<T>)>, FailureSink)>& start) {
  if (client.executor().in_executor()) {
    return FailedPreconditionError(
        "a blocking lock call on a dlock callback thread would wait for itself; use async_acquire there");
  }
  auto caller = std::make_shared<BlockingCaller>(client.shared_from_this());
  auto outcome = std::make_shared<std::optional<Result<T>>>();
  try {
    start(
        [outcome, caller](Result<T> r) {
          outcome->emplace(std::move(r));  // before finish(): run() reads it after
          caller->seal();                  // an exception from now on is not this call's
          caller->steps.finish();
        },
        caller);
  } catch (...) {  // what it queued goes to the executor: no operation is left unrun
    caller->steps.finish();
    caller->steps.run();
    throw;
  }
  caller->steps.run();
  if (std::exception_ptr failure = caller->take_failure()) std::rethrow_exception(failure);
  if (!*outcome) return InternalError("a blocking call ended without an outcome");
  return std::move(**outcome);
}

// Thread label for owner records: "thread <id>".
std::string ThisThreadLabel();

}  // namespace dlock::internal

#endif  // DLOCK_SRC_RECIPES_ACQUIRE_HPP_
