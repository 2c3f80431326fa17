// Internal: the one pub/sub connection of a redis:// store, and the waits
// that listen on it.
//
// One background thread owns the subscriber connection. It SUBSCRIBEs to the
// channel of every queue somebody waits on (and keeps the subscription a few
// seconds after the last waiter left, so that a lock loop that waits again
// does not pay a SUBSCRIBE each time), reads the messages, and hands each one
// to the waits registered for its channel. A message is the list of entry ids
// removed from the queue; a wait whose ids are among them is done.
//
// A wait is an object, not a thread: start() registers it and returns a
// handle; the subscriber thread completes it (its `done` runs there), and
// destroying the handle cancels it on the destroying thread. The same thread
// runs the waits' checks: once a channel's subscription is confirmed, one
// check of the queue for the ids of every waiter not yet checked (a release
// from then on is published to us; one before is seen by the check).
//
// What pub/sub cannot tell is that a holder crashed: its entries only stop
// counting when its session's lease runs out on the server, and nothing is
// published then. For that, each waited-on queue has one fallback re-check
// for all its waiters: it runs when the soonest lease among the queue's
// sessions can have run out (the check script reports it), and at the latest
// one TTL after the last check. Its prune publishes the ids it removed.
//
// Messages published while the subscriber was disconnected are lost, so after
// every re-subscription the queue is re-checked the same way.
//
// Head watches (Session::async_watch_head) are waits of the same kind on the
// queue's head channel: any message there settles them, and so does a check
// (the read-head script) that finds a head other than the one they saw. The
// fallback re-check is what tells them of a crashed head: its prune removes
// the entry and moves the head on.
#ifndef DLOCK_SRC_STORES_REDIS_REDIS_SUBSCRIBER_HPP_
#define DLOCK_SRC_STORES_REDIS_REDIS_SUBSCRIBER_HPP_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "core/event_signal.hpp"
#include "core/thread_annotations.hpp"
#include "dlock/clock.hpp"
#include "dlock/status.hpp"
#include "stores/redis/redis_conn.hpp"

namespace dlock::internal::redis {

// A queue's head as a head watch compares it (Session::async_watch_head).
struct HeadMark {
  std::string id;  // empty: the queue was empty
  std::uint64_t value_version = 0;
  std::int64_t position = 0;  // the queue's head stamp (redis_scripts.hpp)
  bool operator==(const HeadMark&) const = default;
};

// What a check of a queue found.
struct CheckResult {
  std::vector<std::string> gone;     // of the ids asked about
  std::int64_t soonest_ttl_ms = -1;  // smallest lease left among the queue's sessions; -1: none
  std::optional<HeadMark> head;      // a head watch's check: the head now
};

struct SubscriberOptions {
  Endpoint endpoint;
  std::shared_ptr<Clock> clock;
  std::chrono::milliseconds ttl{30'000};          // the fallback re-check period
  std::chrono::milliseconds io_timeout{10'000};   // connect and reply timeout
  std::chrono::milliseconds retry_interval{500};  // between reconnection attempts
  std::chrono::milliseconds linger{5'000};        // keep a subscription after its last waiter
};

// Counters, for tests and diagnostics.
struct SubscriberStats {
  std::uint64_t connects = 0;         // successful (re)connections
  std::uint64_t subscribes = 0;       // SUBSCRIBE commands sent
  std::uint64_t messages = 0;         // messages received
  std::uint64_t checks = 0;           // check scripts run by waits (first checks and re-checks)
  std::uint64_t fallback_checks = 0;  // of those, the shared per-queue re-checks
};

// The thread holds a reference to its Subscriber (see RequestLoop).
class Subscriber : public std::enable_shared_from_this<Subscriber> {
 public:
  // `check(queue, ids)` runs the check script (on a command connection).
  using CheckFn = std::function<Result<CheckResult>(const std::string& queue, const std::vector<std::string>& ids)>;
  // kOk while the waiting session lives; kSessionLost once it is lost or closed.
  using SessionFn = std::function<Status()>;

  struct WaitSpec {
    std::string queue;
    std::string channel;
    std::vector<std::string> ids;
    // The session waiting (for quiesce()); `session` and `check` call into it.
    const void* owner = nullptr;
    // Runs with mu_ held: must be quick and must not call back into the Subscriber.
    SessionFn session;
    // Runs on the subscriber thread without mu_.
    CheckFn check;
    // Called exactly once, without mu_: OK (an id is gone), the session's
    // error, a check's error other than kUnavailable, or kCancelled.
    std::function<void(Status)> done;
    // For Session::async_wait_turn: the waiter's own entry, watched with
    // `ids` (its removal wakes the wait too), the entries ahead of it, and
    // where to say, before `done` runs, whether an OK outcome vouches that
    // `own` was still there when an id and every entry of `ahead` were seen
    // gone. It is vouched for by a check that covered this waiter and found
    // an id and every entry of `ahead` gone and `own` there (one atomic read
    // of all of them: each check asks for every entry of `ahead`), or by the
    // message that told an id gone, if it came on the subscription under
    // which this waiter's last check ran and every entry of `ahead` was told
    // gone since that subscription began (by its messages or a check): the
    // server publishes every removal on the queue's channel from inside the
    // script that makes it, one script at a time, so a removal of `own`
    // before it would have come first. A removal told before is not trusted:
    // a server that lost data since (a restart from an older snapshot) may
    // have the entry again, and a check may reach that server before the
    // subscription has noticed the restart (a half-open connection).
    std::string own;
    std::vector<std::string> ahead;
    std::shared_ptr<std::atomic<bool>> own_intact;
    // For Session::async_watch_head, instead of `ids`: the head as the
    // watcher's reading found it. Any message on `channel` (the queue's head
    // channel) settles the wait OK, and so does a check that finds another.
    std::optional<HeadMark> head;
  };

  // A Subscriber with its thread running; its owner must call shut_down().
  static std::shared_ptr<Subscriber> start(SubscriberOptions options);
  ~Subscriber();
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  // Ends the thread: joins it, except from the thread itself (inside a
  // wait's `done` or check), which then ends when that returns.
  void shut_down() noexcept;

  // Registers a wait; destroying the returned handle cancels it (`done` has
  // run when the destructor returns, unless it runs inside that `done`).
  // Keeps waiting while the store is unreachable. The handle must not
  // outlive the Subscriber.
  std::shared_ptr<void> start(WaitSpec spec) DLOCK_EXCLUDES(mu_);

  // Wakes the subscriber thread so it re-reads every waiting session (after
  // a state change) and the clock (after a manual advance).
  void poke() const;

  // Before the session `owner` goes away: its waits still registered end
  // with kSessionLost, and no check of its runs any more when this returns.
  void quiesce(const void* owner) DLOCK_EXCLUDES(mu_);

  SubscriberStats stats() const DLOCK_EXCLUDES(mu_);

 private:
  // Waiter and Channel live in channels_ (a Waiter also in its handle):
  // every field of theirs that changes is guarded by mu_. The analysis
  // cannot name an outer class's mutex from a nested struct, so only
  // channels_ carries the annotation.
  struct Waiter;
  struct Channel;
  struct Link;
  struct Plan;
  struct CheckJob;
  class Handle;
  enum class ChanState { kIdle, kSubscribing, kSubscribed, kUnsubscribing };
  // What the subscriber thread does after one of its steps.
  enum class Step { kGoOn, kRestart, kStop };

  // Waits.
  void leave(Channel& ch, Waiter& w) DLOCK_REQUIRES(mu_);
  void settle(const std::shared_ptr<Waiter>& w, Status s) DLOCK_REQUIRES(mu_);
  void flush() DLOCK_EXCLUDES(mu_);
  void cancel(const std::shared_ptr<Waiter>& w) DLOCK_EXCLUDES(mu_);
  void settle_ended_sessions() DLOCK_REQUIRES(mu_);
  std::optional<CheckJob> next_job(Clock::time_point now) DLOCK_REQUIRES(mu_);
  void after_check(const CheckJob& job, const Result<CheckResult>& r) DLOCK_REQUIRES(mu_);
  void serve_waits() DLOCK_EXCLUDES(mu_);
  IoClock::time_point next_wait_event(IoClock::time_point io_now) DLOCK_EXCLUDES(mu_);
  // `job`: the check that found `gone` (nullptr: a message).
  void mark_gone(Channel& ch, const std::vector<std::string>& gone, const CheckJob* job) DLOCK_REQUIRES(mu_);
  // `now`: the head a check found (nullopt: a message on the head channel).
  void mark_head_moved(Channel& ch, const std::optional<HeadMark>& now, const CheckJob* job) DLOCK_REQUIRES(mu_);
  Clock::time_point next_check_at(Clock::time_point now, std::int64_t soonest_ms) const;

  explicit Subscriber(SubscriberOptions options);
  // The subscriber thread (see run()).
  void run(std::stop_token st) DLOCK_EXCLUDES(mu_);
  Plan plan(bool connected, IoClock::time_point now) DLOCK_EXCLUDES(mu_);
  Step connect(Link& link, IoClock::time_point now, IoClock::time_point& wake_at) DLOCK_EXCLUDES(mu_);
  Step ping(Link& link, IoClock::time_point& wake_at) DLOCK_EXCLUDES(mu_);
  Step await_input(Link& link, IoClock::time_point wake_at) DLOCK_EXCLUDES(mu_);
  void read_replies(Link& link) DLOCK_EXCLUDES(mu_);
  void handle_reply(Link& link, const Reply& reply) DLOCK_EXCLUDES(mu_);
  void fail_waiters(const Status& s, bool only_subscribing) DLOCK_EXCLUDES(mu_);
  void on_subscribed(const std::string& name) DLOCK_REQUIRES(mu_);
  void on_unsubscribed(const std::string& name) DLOCK_REQUIRES(mu_);
  void dispatch(const std::string& channel, std::string_view payload) DLOCK_REQUIRES(mu_);
  void drop(Link& link) DLOCK_EXCLUDES(mu_);
  void wake() const;

  const SubscriberOptions opt_;
  // Both made by the constructor and never changed (empty if the process was
  // out of descriptors: then nobody is woken early, as with no eventfd).
  const std::optional<EventSignal> wake_;  // "look at the channel table again"
  const std::optional<EventSignal> stop_;  // "shut down", interrupts the connection's I/O

  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<Channel>> channels_ DLOCK_GUARDED_BY(mu_);
  // Settled waits whose `done` has not been claimed yet (see flush()).
  std::vector<std::shared_ptr<Waiter>> ready_ DLOCK_GUARDED_BY(mu_);
  // The session whose check the subscriber thread is running, if any.
  const void* checking_owner_ DLOCK_GUARDED_BY(mu_) = nullptr;
  // A `done` returned, or a check ended (with mu_).
  std::condition_variable changed_;
  SubscriberStats stats_ DLOCK_GUARDED_BY(mu_);
  Mutex thread_mu_;
  std::shared_ptr<void> clock_subscription_ DLOCK_GUARDED_BY(thread_mu_);  // set by start(), reset by shut_down()
  std::jthread thread_ DLOCK_GUARDED_BY(thread_mu_);
  // Set by start() before anyone else can see this object, never changed.
  std::thread::id thread_id_;
};

}  // namespace dlock::internal::redis

#endif  // DLOCK_SRC_STORES_REDIS_REDIS_SUBSCRIBER_HPP_
