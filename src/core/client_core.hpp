// Internal: what a dlock::Client shares among its copies and its locks.
#ifndef DLOCK_SRC_CORE_CLIENT_CORE_HPP_
#define DLOCK_SRC_CORE_CLIENT_CORE_HPP_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>

#include "core/executor.hpp"
#include "core/thread_annotations.hpp"
#include "dlock/client.hpp"
#include "dlock/store.hpp"

namespace dlock::internal {

// A per-process, per-queue FIFO of threads: at most one of them at a time has
// the object's lock. What SemaphoreMutex puts in front of the store's lock.
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
  Mutex mu_;
  bool busy_ DLOCK_GUARDED_BY(mu_) = false;
  std::list<Waiter*> line_ DLOCK_GUARDED_BY(mu_);
};

// A per-process, per-queue FIFO of acquisitions, blocking and asynchronous
// alike: at most one of them at a time has a *waiting* entry in the store, so
// a process never adds more than one waiter per lock to the store's queue,
// while store-level order stays FIFO. Thread-safe: the steps of blocking
// acquisitions run on their callers' threads.
class LocalLine {
 public:
  using Ticket = std::uint64_t;
  Ticket new_ticket() DLOCK_EXCLUDES(mu_);
  // Queues `enter` under `ticket`, called when it is this caller's turn
  // (maybe inside this call, or inside another caller's leave()): it must
  // only post the caller's next step, never run it.
  void join(Ticket ticket, std::function<void()> enter) DLOCK_EXCLUDES(mu_);
  // Leaves the line before having been let in: true. False if the caller
  // was let in already (its `enter` was called): it must leave() then.
  bool abandon(Ticket ticket) DLOCK_EXCLUDES(mu_);
  // The one inside leaves; the next one enters.
  void leave() DLOCK_EXCLUDES(mu_);
  bool idle() const noexcept DLOCK_EXCLUDES(mu_);

 private:
  using Waiter = std::pair<Ticket, std::function<void()>>;
  // Takes the next one in, if nobody is inside: to be let_in() once mu_ is
  // released.
  std::optional<Waiter> admit_next() DLOCK_REQUIRES(mu_);
  // Calls its `enter`. If that fails (out of memory), the waiter goes back
  // to the front of the line, for the next join() or leave() to let in, or
  // its own deadline to take out: never stranded as the one inside.
  void let_in(std::optional<Waiter> next) DLOCK_EXCLUDES(mu_);

  mutable Mutex mu_;
  bool busy_ DLOCK_GUARDED_BY(mu_) = false;
  Ticket next_ DLOCK_GUARDED_BY(mu_) = 0;
  std::list<Waiter> line_ DLOCK_GUARDED_BY(mu_);
};

// A client's engine. Two kinds of references lead to it:
//  - the user's: Client copies (and so lock objects and awaitables), the
//    Holds made through it, and acquisitions until they have handed over
//    their outcome. All share one count (the aliasing pointer that
//    make() returns, whose control block is UserRefs in client.cpp);
//  - the engine's own (shared_from_this): the session opener, and what the
//    store threads and the executor keep while they work.
// When the last user reference goes on a thread that is not dlock's, the
// client's threads are stopped and joined before that destructor returns
// (on_last_user_gone): nothing of dlock runs behind a program that has let
// go of everything. From a dlock thread they end when the engine's last
// reference goes instead.
class ClientCore : public std::enable_shared_from_this<ClientCore> {
 public:
  ClientCore(std::shared_ptr<Store> store, ClientOptions options);
  ~ClientCore();
  ClientCore(const ClientCore&) = delete;
  ClientCore& operator=(const ClientCore&) = delete;

  // A new client: the returned pointer is a user reference.
  static std::shared_ptr<ClientCore> make(std::shared_ptr<Store> store, ClientOptions options);
  // Run by the last user reference: see the class comment.
  void on_last_user_gone() noexcept DLOCK_EXCLUDES(mu_);

  Store& store() noexcept { return *store_; }
  const Clock& clock() const noexcept { return *clock_; }
  Clock::time_point now() const noexcept { return clock_->now(); }

  // The live session, or a new one if there is none or it ended.
  Result<std::shared_ptr<Session>> session(Clock::time_point deadline) DLOCK_EXCLUDES(open_mu_, mu_);
  SessionState session_state() const DLOCK_EXCLUDES(mu_);
  // The session, if there is one that has not ended (connected or
  // suspended); null otherwise. Never opens one, never blocks.
  std::shared_ptr<Session> live_session() const DLOCK_EXCLUDES(mu_);
  void close_session() noexcept DLOCK_EXCLUDES(mu_);

  // The live session or a new one, to `done` on the executor thread; a new
  // one is opened on a thread of its own (one at a time), so the executor
  // never waits for a connection.
  void async_session(Clock::time_point deadline, std::function<void(Result<std::shared_ptr<Session>>)> done)
      DLOCK_EXCLUDES(mu_);

  // The thread on which acquisitions advance and their callbacks run.
  Executor& executor() noexcept { return *executor_; }

  // Runs `fn` whenever the injected clock is moved by hand (see
  // Clock::on_advance); the handle unsubscribes.
  std::shared_ptr<void> on_clock_advance(std::function<void()> fn) { return clock_->on_advance(std::move(fn)); }

  // Removes an entry now; if the store cannot be reached, keeps retrying in
  // the background until done or the session ends. Never throws.
  void remove_guaranteed(const std::shared_ptr<Session>& session, const std::string& queue,
                         const std::string& id) noexcept DLOCK_EXCLUDES(mu_);
  // The same without blocking: `then` runs on the executor once the first
  // try has come back (a failed one goes on in the background).
  void remove_async(const std::shared_ptr<Session>& session, const std::string& queue, const std::string& id,
                    std::function<void()> then) noexcept DLOCK_EXCLUDES(mu_);
  // Deletes, in the background, the entry an append with `attempt_id` may
  // have made although its reply was lost (the acquirer has given up on it).
  void forget_attempt(const std::shared_ptr<Session>& session, const std::string& queue,
                      const std::string& attempt_id) noexcept DLOCK_EXCLUDES(mu_);

  // The local line of `queue`, shared while anyone uses it; hand it back
  // with drop_line() so idle lines do not pile up.
  std::shared_ptr<LocalLine> line(const std::string& queue) DLOCK_EXCLUDES(lines_mu_);
  void drop_line(const std::string& queue, std::shared_ptr<LocalLine> line) noexcept DLOCK_EXCLUDES(lines_mu_);

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
  // Calls the store, blocking.
  bool try_pending(Pending& p) noexcept DLOCK_EXCLUDES(mu_);
  // Calls the store without blocking; `done(finished)` on the executor.
  void try_pending_async(std::shared_ptr<Pending> p, std::function<void(bool)> done) noexcept;
  // Retries `p` on the executor's timer until it is done or its session ends.
  void retry_later(Pending p) noexcept DLOCK_EXCLUDES(mu_);
  void open_sessions() DLOCK_EXCLUDES(mu_);
  std::shared_ptr<Session> live_locked() const DLOCK_REQUIRES(mu_);

  // Constant after construction.
  const std::shared_ptr<Store> store_;
  const ClientOptions options_;
  const std::shared_ptr<Clock> clock_;
  std::string host_;
  std::int64_t pid_ = 0;

  Mutex open_mu_ DLOCK_ACQUIRED_BEFORE(mu_);  // held while opening a session
  mutable Mutex mu_;
  std::shared_ptr<Session> session_ DLOCK_GUARDED_BY(mu_);
  // Acquisitions waiting for a session to be opened for them.
  std::vector<std::pair<Clock::time_point, std::function<void(Result<std::shared_ptr<Session>>)>>> openers_
      DLOCK_GUARDED_BY(mu_);
  // Opens sessions for async_session(); started when needed, under mu_; it
  // holds a reference to this object while it works.
  std::jthread opener_thread_ DLOCK_GUARDED_BY(mu_);
  bool opener_running_ DLOCK_GUARDED_BY(mu_) = false;
  Mutex lines_mu_;
  std::map<std::string, std::shared_ptr<LocalLine>> lines_ DLOCK_GUARDED_BY(lines_mu_);
  // Last: stopped first, before anything its tasks use goes.
  std::unique_ptr<Executor> executor_;
};

}  // namespace dlock::internal

#endif  // DLOCK_SRC_CORE_CLIENT_CORE_HPP_
