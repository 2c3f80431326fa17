// Internal: the request loop of a redis:// store.
//
// One thread and one command connection carry the asynchronous requests of
// every session of the store (async_append, async_list, async_remove,
// async_find_own): each request is a
// pipeline of commands, written as it comes and answered in order, so any
// number of them can be on the wire at once without a thread each. The
// blocking requests keep the pool (redis_store.cpp).
//
// A request whose connection fails is sent once more on a new one, unless it
// was already on a fresh connection or its own deadline passed (every
// request dlock makes is idempotent; see redis_scripts.hpp). A deadline that
// passes breaks the connection: the request's outcome is unknown, as for a
// blocking one that timed out.
#ifndef DLOCK_SRC_STORES_REDIS_REDIS_LOOP_HPP_
#define DLOCK_SRC_STORES_REDIS_REDIS_LOOP_HPP_

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <thread>
#include <vector>

#include "core/event_signal.hpp"
#include "core/thread_annotations.hpp"
#include "dlock/status.hpp"
#include "stores/redis/redis_conn.hpp"

namespace dlock::internal::redis {

//
// The thread holds a reference to its loop, so a `done` may drop the last
// reference to whatever owns the loop: shut_down() then lets the thread end
// on its own once that `done` returns, instead of joining itself.
class RequestLoop : public std::enable_shared_from_this<RequestLoop> {
 public:
  // One reply per command, or why there are none (kUnavailable).
  using Done = std::function<void(Result<std::vector<Reply>>)>;

  // A loop with its thread running; its owner must call shut_down().
  static std::shared_ptr<RequestLoop> start(Endpoint endpoint, std::chrono::milliseconds connect_timeout);
  ~RequestLoop();
  RequestLoop(const RequestLoop&) = delete;
  RequestLoop& operator=(const RequestLoop&) = delete;

  // Ends the thread; what is still queued or unanswered fails with
  // kUnavailable. Joins the thread, except from the thread itself (inside a
  // `done`): it then ends when that `done` returns.
  void shut_down() noexcept;

  // Queues `cmds`; `done` runs once, on the loop thread (no lock held), or
  // at once after shut_down().
  void submit(std::vector<Command> cmds, IoClock::time_point deadline, Done done) DLOCK_EXCLUDES(mu_);

 private:
  struct Job {
    std::vector<Command> cmds;
    IoClock::time_point deadline;
    Done done;
    std::vector<Reply> replies;
    bool retried = false;  // already sent once more
    bool fresh = false;    // sent on a connection opened for it
  };

  RequestLoop(Endpoint endpoint, std::chrono::milliseconds connect_timeout);
  void run(std::stop_token st) DLOCK_EXCLUDES(mu_);
  bool send_queued(std::deque<Job>& inflight) DLOCK_EXCLUDES(mu_);
  void read_replies(std::deque<Job>& inflight);
  void drop(std::deque<Job>& inflight, bool deadline_passed);
  static void fail(Job& job, const Status& s);

  const Endpoint endpoint_;
  const std::chrono::milliseconds connect_timeout_;
  const std::optional<EventSignal> wake_;
  const std::optional<EventSignal> stop_;
  Mutex mu_;
  std::deque<Job> queue_ DLOCK_GUARDED_BY(mu_);
  bool ended_ DLOCK_GUARDED_BY(mu_) = false;  // the thread has returned: submit() fails at once
  std::unique_ptr<Conn> conn_;                // the loop thread's only
  Mutex thread_mu_;
  std::jthread thread_ DLOCK_GUARDED_BY(thread_mu_);
};

}  // namespace dlock::internal::redis

#endif  // DLOCK_SRC_STORES_REDIS_REDIS_LOOP_HPP_
