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
// What pub/sub cannot tell is that a holder crashed: its entries only stop
// counting when its session's lease runs out on the server, and nothing is
// published then. For that, each waited-on queue has one fallback re-check,
// done by one of its waiters for all of them: it runs when the soonest lease
// among the queue's sessions can have run out (the check script reports it),
// and at the latest one TTL after the last check. Its prune publishes the
// ids it removed, which wakes the other waiters.
//
// Messages published while the subscriber was disconnected are lost, so after
// every re-subscription the queue is re-checked the same way.
#ifndef DLOCK_SRC_STORES_REDIS_REDIS_SUBSCRIBER_HPP_
#define DLOCK_SRC_STORES_REDIS_REDIS_SUBSCRIBER_HPP_

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

// What a check of a queue found.
struct CheckResult {
  std::vector<std::string> gone;     // of the ids asked about
  std::int64_t soonest_ttl_ms = -1;  // smallest lease left among the queue's sessions; -1: none
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

class Subscriber {
 public:
  // `check(queue, ids)` runs the check script (on a command connection).
  using CheckFn = std::function<Result<CheckResult>(const std::string& queue, const std::vector<std::string>& ids)>;
  // kOk while the waiting session lives; kSessionLost once it is lost or closed.
  using SessionFn = std::function<Status()>;

  explicit Subscriber(SubscriberOptions options);
  ~Subscriber();
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  // Blocks until an id of `ids` is gone from `queue` (OK), or `deadline`
  // passes, `stop` is requested, or `session()` reports an error. Keeps waiting
  // while the store is unreachable. `check` runs without mu_; `session` runs
  // with it held, so it must be quick and must not call back into the Subscriber.
  Status wait(const std::string& queue, const std::string& channel, const std::vector<std::string>& ids,
              Clock::time_point deadline, std::stop_token stop, const SessionFn& session, const CheckFn& check)
      DLOCK_EXCLUDES(mu_);

  // Wakes every wait so it re-reads its session (after a state change) and
  // the clock (after a manual advance).
  void poke() DLOCK_EXCLUDES(mu_);

  SubscriberStats stats() const DLOCK_EXCLUDES(mu_);

 private:
  // Waiter and Channel live in channels_ (or on a waiting thread's stack,
  // reachable from channels_): every field of theirs is guarded by mu_. The
  // analysis cannot name an outer class's mutex from a nested struct, so
  // only channels_ carries the annotation.
  struct Waiter;
  struct Channel;
  struct Link;
  struct Plan;
  enum class ChanState { kIdle, kSubscribing, kSubscribed, kUnsubscribing };
  // What the subscriber thread does after one of its steps.
  enum class Step { kGoOn, kRestart, kStop };

  // Waits (see wait()).
  Channel& join(const std::string& queue, const std::string& channel, Waiter& w) DLOCK_REQUIRES(mu_);
  void leave(Channel& ch, Waiter& w) DLOCK_REQUIRES(mu_);
  Status after_first_check(Channel& ch, Waiter& w, const Result<CheckResult>& r) DLOCK_REQUIRES(mu_);
  static std::vector<std::string> claim_recheck(Channel& ch);  // mu_ held
  void after_recheck(Channel& ch, const Result<CheckResult>& r) DLOCK_REQUIRES(mu_);
  void mark_gone(Channel& ch, const std::vector<std::string>& gone) DLOCK_REQUIRES(mu_);
  static void signal_all(Channel& ch);  // mu_ held
  Clock::time_point next_check_at(Clock::time_point now, std::int64_t soonest_ms) const;

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
  SubscriberStats stats_ DLOCK_GUARDED_BY(mu_);
  std::shared_ptr<void> clock_subscription_;  // set by the constructor, reset by the destructor
  std::jthread thread_;                       // last: stopped and joined first
};

}  // namespace dlock::internal::redis

#endif  // DLOCK_SRC_STORES_REDIS_REDIS_SUBSCRIBER_HPP_
