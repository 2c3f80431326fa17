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
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

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
  // while the store is unreachable.
  Status Wait(const std::string& queue, const std::string& channel, const std::vector<std::string>& ids,
              Clock::time_point deadline, std::stop_token stop, const SessionFn& session, const CheckFn& check);

  // Wakes every wait so it re-reads its session (after a state change) and
  // the clock (after a manual advance).
  void Poke();

  SubscriberStats stats() const;

 private:
  struct Waiter;
  struct Channel;
  enum class ChanState { kIdle, kSubscribing, kSubscribed, kUnsubscribing };

  void Run(std::stop_token st);
  void Wake();
  void Dispatch(const std::string& channel, std::string_view payload);  // mu_ held
  void MarkGone(Channel& ch, const std::vector<std::string>& gone);     // mu_ held
  Clock::time_point NextCheck(Clock::time_point now, std::int64_t soonest_ms) const;
  void DropConnection();  // mu_ held

  const SubscriberOptions opt_;
  int wake_fd_ = -1;  // eventfd: "look at the channel table again"
  int stop_fd_ = -1;  // eventfd: "shut down", interrupts the connection's I/O

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Channel>> channels_;
  bool connected_ = false;
  SubscriberStats stats_;
  std::shared_ptr<void> clock_subscription_;
  std::jthread thread_;  // last: stopped and joined first
};

}  // namespace dlock::internal::redis

#endif  // DLOCK_SRC_STORES_REDIS_REDIS_SUBSCRIBER_HPP_
