// Internal: what a dlock::Client shares among its copies and its locks.
#ifndef DLOCK_SRC_CORE_CLIENT_CORE_HPP_
#define DLOCK_SRC_CORE_CLIENT_CORE_HPP_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>

#include "core/thread_annotations.hpp"
#include "dlock/client.hpp"
#include "dlock/store.hpp"

namespace dlock::internal {

// A per-process, per-queue FIFO of threads: at most one of them at a time has
// a *waiting* entry in the store, so a process never adds more than one
// waiter per lock to the store's queue, while store-level order stays FIFO.
class LocalGate {
 public:
  // Blocks until it is the caller's turn. False on deadline or stop.
  bool enter(const Clock& clock, Clock::time_point deadline, std::stop_token stop) DLOCK_EXCLUDES(mu_);
  // Enters only if nobody is inside or waiting; never blocks.
  bool try_enter() noexcept DLOCK_EXCLUDES(mu_);
  // Lets the next thread in. Call once after a successful enter().
  void leave() noexcept DLOCK_EXCLUDES(mu_);
  // Wakes waiters so they re-read a clock that was moved by hand.
  void poke() noexcept DLOCK_EXCLUDES(mu_);
  // Nobody inside and nobody waiting.
  bool idle() noexcept DLOCK_EXCLUDES(mu_);

 private:
  struct Waiter {
    std::condition_variable_any cv;
  };
  // Taken after ClientCore::mu_ where both are held (ClientCore pokes and
  // drops gates under its own mutex).
  Mutex mu_;
  bool busy_ DLOCK_GUARDED_BY(mu_) = false;
  std::list<Waiter*> line_ DLOCK_GUARDED_BY(mu_);
};

class ClientCore : public std::enable_shared_from_this<ClientCore> {
 public:
  ClientCore(std::shared_ptr<Store> store, ClientOptions options);
  ~ClientCore();
  ClientCore(const ClientCore&) = delete;
  ClientCore& operator=(const ClientCore&) = delete;

  Store& store() noexcept { return *store_; }
  const Clock& clock() const noexcept { return *clock_; }
  Clock::time_point now() const noexcept { return clock_->now(); }

  // The live session, or a new one if there is none or it ended.
  Result<std::shared_ptr<Session>> session(Clock::time_point deadline) DLOCK_EXCLUDES(open_mu_, mu_);
  SessionState session_state() const DLOCK_EXCLUDES(mu_);
  void close_session() noexcept DLOCK_EXCLUDES(mu_);

  // Blocks while `session` is kSuspended, until the deadline or stop.
  // Returns the state it ended in.
  SessionState await_not_suspended(Session& session, Clock::time_point deadline, std::stop_token stop);

  // Runs `fn` whenever the injected clock is moved by hand (see
  // Clock::on_advance); the handle unsubscribes.
  std::shared_ptr<void> on_clock_advance(std::function<void()> fn) { return clock_->on_advance(std::move(fn)); }

  // Sleeps on the injected clock until `until` or `stop`.
  void sleep_until(Clock::time_point until, std::stop_token stop);

  // Removes an entry now; if the store cannot be reached, keeps retrying in
  // the background until done or the session ends. Never throws.
  void remove_guaranteed(const std::shared_ptr<Session>& session, const std::string& queue,
                         const std::string& id) noexcept DLOCK_EXCLUDES(mu_);
  // Deletes the entry an append with `attempt_id` may have made although its
  // reply was lost (the acquirer has given up on it).
  void forget_attempt(const std::shared_ptr<Session>& session, const std::string& queue,
                      const std::string& attempt_id) noexcept DLOCK_EXCLUDES(mu_);

  // The gate of `queue`, shared while anyone uses it; hand it back with
  // drop_gate() so idle gates do not pile up.
  std::shared_ptr<LocalGate> gate(const std::string& queue) DLOCK_EXCLUDES(mu_);
  void drop_gate(const std::string& queue, std::shared_ptr<LocalGate> gate) noexcept DLOCK_EXCLUDES(mu_);

  std::string new_attempt_id();
  OwnerRecord owner(std::string thread) const;
  // Calls user code (ClientOptions::on_background_error).
  void report(const Status& status) noexcept DLOCK_EXCLUDES(mu_);

  // How long one store request may take when the caller gave no deadline.
  static constexpr std::chrono::seconds kRequestTimeout{10};

 private:
  struct Pending {
    std::shared_ptr<Session> session;
    std::string queue;
    std::string id;  // empty: find by attempt_id first
    std::string attempt_id;
    int failures = 0;
  };
  // Calls the store.
  bool try_pending(Pending& p) noexcept DLOCK_EXCLUDES(mu_);
  void enqueue(Pending p) DLOCK_EXCLUDES(mu_);  // may throw std::bad_alloc (callers catch)
  void retry_loop(std::stop_token stop) DLOCK_EXCLUDES(mu_);

  // Constant after construction.
  const std::shared_ptr<Store> store_;
  const ClientOptions options_;
  const std::shared_ptr<Clock> clock_;
  std::string host_;
  std::int64_t pid_ = 0;

  Mutex open_mu_ DLOCK_ACQUIRED_BEFORE(mu_);  // held while opening a session
  mutable Mutex mu_;
  std::shared_ptr<Session> session_ DLOCK_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<LocalGate>> gates_ DLOCK_GUARDED_BY(mu_);
  std::deque<Pending> pending_ DLOCK_GUARDED_BY(mu_);
  std::condition_variable_any pending_cv_;
  // Started on first use, under mu_; the destructor (which the analysis does
  // not check) joins it when nobody else can reach this object any more.
  std::jthread retry_thread_ DLOCK_GUARDED_BY(mu_);
  std::shared_ptr<void> clock_subscription_;
};

}  // namespace dlock::internal

#endif  // DLOCK_SRC_CORE_CLIENT_CORE_HPP_
