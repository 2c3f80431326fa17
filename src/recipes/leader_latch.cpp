// LeaderLatch: Election's asynchronous campaign in a loop, a Leadership
// while it leads, and events that say so. The events are a reconciliation:
// each change of the leadership's state posts one task to a SerialDelivery,
// and that task tells the listeners what is true when it runs (read from
// the session's clock, as has_leadership() does), if it differs from what
// they were told last. So events alternate, are in order, and never say
// "leader" of a leadership already known to be gone; "no longer leader" runs
// on the thread that learnt of the change, behind nothing but a listener
// already running.
#include "dlock/leader_latch.hpp"

#include <algorithm>
#include <condition_variable>
#include <utility>

#include "core/access.hpp"
#include "core/client_core.hpp"
#include "core/listeners.hpp"
#include "core/serial_delivery.hpp"
#include "core/thread_annotations.hpp"
#include "dlock/election.hpp"
#include "stores/entry_value.hpp"

namespace dlock {
namespace internal {

class LatchCore : public std::enable_shared_from_this<LatchCore> {
 public:
  LatchCore(Client client, std::string name, std::string value, LatchOptions options)
      : client_(CoreOf(client)),
        election_(std::move(client), std::move(name)),
        options_(options),
        value_(std::move(value)) {
    ThrowIfError(CheckEntryValue(value_));
  }

  const std::string& name() const noexcept { return election_.name(); }

  std::string value() const DLOCK_EXCLUDES(mu_) {
    MutexLock g(mu_);
    return value_;
  }

  void start() DLOCK_EXCLUDES(mu_) {
    {
      MutexLock g(mu_);
      if (started_ || closed_) return;
      started_ = true;
    }
    campaign();
  }

  void close() noexcept DLOCK_EXCLUDES(mu_) {
    std::shared_ptr<Leadership> leadership;
    std::shared_ptr<void> subscription;
    std::stop_source stop;
    {
      MutexLock g(mu_);
      if (!closed_) {
        closed_ = true;
        ++generation_;  // a campaign answering late is stale
        leadership = std::move(leadership_);
        subscription = std::move(hold_subscription_);
        stop = campaign_stop_;
      }
    }
    wake_waiters();
    stop.request_stop();  // a waiting campaign ends, leaving nothing behind
    subscription.reset();
    // Through the delivery: "no longer leader" is told after the events
    // before it and before the resignation lets anyone else lead. From
    // another thread, run() also waits for a listener running now (a second
    // close, the destructor's, waits too).
    std::shared_ptr<LatchCore> self = shared_from_this();
    try {
      delivery_.run([self, leadership] {
        self->tell_closed();
        if (leadership) leadership->resign();
      });
    } catch (...) {  // no memory for the task: still hand over
      if (leadership) leadership->resign();
    }
  }

  bool has_leadership() const noexcept DLOCK_EXCLUDES(mu_) {
    MutexLock g(mu_);
    return leads_now();
  }

  std::optional<std::uint64_t> term() const noexcept DLOCK_EXCLUDES(mu_) {
    MutexLock g(mu_);
    if (!leads_now()) return std::nullopt;
    return leadership_->term();
  }

  bool await_leadership(Clock::duration timeout, const std::stop_token& stop) DLOCK_EXCLUDES(mu_) {
    if (client_->executor().in_executor()) {
      throw Error(FailedPreconditionError("await_leadership() on a dlock callback thread would wait for itself"));
    }
    const Clock::time_point deadline = DeadlineAfter(client_->now(), timeout);
    // A hand-moved clock wakes nobody by itself: re-check on every move.
    std::shared_ptr<void> advancing = client_->on_clock_advance([weak = weak_from_this()] {
      if (auto self = weak.lock()) self->wake_waiters();
    });
    MutexLock lock(mu_);
    client_->clock().wait_until(cv_, lock.native(), stop, deadline, [this] {
      mu_.assert_held();  // run by wait_until under the lock
      return closed_ || leads_now();
    });
    return leads_now();
  }

  std::shared_ptr<void> on_change(std::function<void(LatchEvent, std::uint64_t)> fn) {
    return listeners_.add(std::move(fn));
  }

  Status proclaim(std::string value, Clock::duration timeout) DLOCK_EXCLUDES(mu_) {
    ThrowIfError(CheckEntryValue(value));
    std::shared_ptr<Leadership> leadership;
    {
      MutexLock g(mu_);
      value_ = value;
      leadership = leadership_;
    }
    // Not leader: the value waits for the next win (on_campaign).
    if (!leadership || !leadership->held()) return OkStatus();
    return leadership->proclaim(std::move(value), timeout);
  }

 private:
  static constexpr Clock::duration kFirstPause = std::chrono::milliseconds(100);
  static constexpr Clock::duration kLongestPause = std::chrono::seconds(5);

  // Leading now: won, not closed, and the leadership's state (which folds in
  // the session's clock) counts as leading.
  bool leads_now() const DLOCK_REQUIRES(mu_) {
    if (closed_ || !leadership_) return false;
    const HoldState s = leadership_->state();
    return s == HoldState::kHeld || (s == HoldState::kUncertain && !options_.suspended_is_not_leader);
  }

  // Starts one campaign, a new participant with a new entry.
  void campaign() DLOCK_EXCLUDES(mu_) {
    std::uint64_t generation = 0;
    std::string value;
    std::stop_token stop;
    {
      MutexLock g(mu_);
      if (closed_) return;
      generation = ++generation_;
      campaign_stop_ = std::stop_source();
      stop = campaign_stop_.get_token();
      value = value_;
    }
    std::weak_ptr<LatchCore> weak = weak_from_this();
    try {
      election_.async_campaign(value, kForever, stop,
                               [weak, generation, value](Result<std::optional<Leadership>> got) mutable {
                                 // Without the latch, a won Leadership resigns as it goes.
                                 if (auto self = weak.lock()) self->on_campaign(generation, value, std::move(got));
                               });
    } catch (const std::exception& e) {
      client_->report(InternalError("starting a campaign of the leader latch " + name() + ": " + e.what()));
      retry_later(generation);
    }
  }

  // On the executor: what a campaign ended with.
  void on_campaign(std::uint64_t generation, const std::string& value, Result<std::optional<Leadership>> got)
      DLOCK_EXCLUDES(mu_) {
    if (!got.ok()) {
      client_->report(Status(got.status().code(), "campaign of the leader latch " + name() +
                                                      " failed (retried): " + got.status().message()));
      return retry_later(generation);
    }
    if (!got->has_value()) return retry_later(generation);  // stopped: closed (retry_later sees it)
    auto leadership = std::make_shared<Leadership>(std::move(**got));
    if (!publish(generation, value, leadership)) return leadership->resign();
    wake_waiters();
    follow(generation, leadership);
  }

  // Makes a won leadership the latch's, once the value proclaimed while it
  // waited (if any) is queued on it: a proclaim() that sees the leadership
  // queues behind that one, so the latest value is the term's. Queued
  // outside mu_ (an update may complete inline and change the leadership's
  // state, whose listener takes mu_), so the value is checked again under
  // it. False if the campaign is stale (closed, or superseded).
  bool publish(std::uint64_t generation, std::string queued, const std::shared_ptr<Leadership>& leadership)
      DLOCK_EXCLUDES(mu_) {
    while (true) {
      std::string wanted;
      {
        MutexLock g(mu_);
        if (closed_ || generation != generation_) return false;
        if (value_ == queued) {
          leadership_ = leadership;
          failures_ = 0;
          return true;
        }
        wanted = value_;
      }
      leadership->async_proclaim(wanted, ClientCore::kRequestTimeout, [](Status) {});
      queued = std::move(wanted);
    }
  }

  // Listens to the won leadership's state, then reads it once: it may have
  // changed before the listener was there.
  void follow(std::uint64_t generation, const std::shared_ptr<Leadership>& leadership) DLOCK_EXCLUDES(mu_) {
    std::weak_ptr<LatchCore> weak = weak_from_this();
    std::shared_ptr<void> subscription = leadership->on_state_change([weak, generation](HoldState s) {
      if (auto self = weak.lock()) self->on_hold_state(generation, s);
    });
    {
      MutexLock g(mu_);
      if (!closed_ && generation == generation_) std::swap(hold_subscription_, subscription);
    }
    subscription.reset();  // a stale one, outside mu_
    on_hold_state(generation, leadership->state());
  }

  void wake_waiters() DLOCK_EXCLUDES(mu_) {
    {
      MutexLock g(mu_);  // a waiter is either before its check or asleep
    }
    cv_.notify_all();
  }

  // A state of the leadership of `generation`: tell the listeners (at once,
  // unless a listener is running), wake the waiters, and campaign again
  // after a loss.
  void on_hold_state(std::uint64_t generation, HoldState s) DLOCK_EXCLUDES(mu_) {
    wake_waiters();
    std::shared_ptr<LatchCore> self = shared_from_this();
    delivery_.post([self] { self->reconcile(); });
    if (s == HoldState::kLost) recampaign(generation);
  }

  // Run by delivery_ only: tells the listeners what is true now, if it is
  // not what they were told last.
  void reconcile() DLOCK_EXCLUDES(mu_) {
    LatchEvent event = LatchEvent::kNoLongerLeader;
    std::uint64_t term = 0;
    {
      MutexLock g(mu_);
      if (closed_) return;  // tell_closed() says the last word
      const bool leads = leads_now();
      if (leads == told_leader_) return;
      told_leader_ = leads;
      if (leads) {
        told_term_ = leadership_->term();
        event = LatchEvent::kBecameLeader;
      }
      term = told_term_;
    }
    listeners_.notify(event, term);
  }

  // Run by delivery_ only, once, at close().
  void tell_closed() DLOCK_EXCLUDES(mu_) {
    bool was_leader = false;
    std::uint64_t term = 0;
    {
      MutexLock g(mu_);
      was_leader = std::exchange(told_leader_, false);
      term = told_term_;
    }
    if (was_leader) listeners_.notify(LatchEvent::kNoLongerLeader, term);
    listeners_.clear();
  }

  // After a loss: the old entry goes (a lost session's is gone already; a
  // broken one's removal is one round trip), and a new participant joins,
  // both on the executor rather than on the thread that told us.
  void recampaign(std::uint64_t generation) DLOCK_EXCLUDES(mu_) {
    std::shared_ptr<Leadership> old;
    std::shared_ptr<void> subscription;
    {
      MutexLock g(mu_);
      if (closed_ || generation != generation_ || !leadership_) return;  // told twice, or closed
      old = std::move(leadership_);
      subscription = std::move(hold_subscription_);
    }
    subscription.reset();
    client_->executor().post([self = shared_from_this(), old = std::move(old)] {
      old->resign();
      self->campaign();
    });
  }

  void retry_later(std::uint64_t generation) DLOCK_EXCLUDES(mu_) {
    Clock::duration pause{};
    {
      MutexLock g(mu_);
      if (closed_ || generation != generation_) return;
      pause = std::min<Clock::duration>(kFirstPause * (1 << std::min(failures_, 6)), kLongestPause);
      ++failures_;
    }
    std::weak_ptr<LatchCore> weak = weak_from_this();
    client_->executor().at(DeadlineAfter(client_->now(), pause), [weak] {
      if (auto self = weak.lock()) self->campaign();
    });
  }

  // Constant after construction.
  const std::shared_ptr<ClientCore> client_;
  Election election_;  // its calls are thread-safe
  const LatchOptions options_;

  ListenerList<LatchEvent, std::uint64_t> listeners_;
  SerialDelivery delivery_;

  mutable Mutex mu_;
  std::condition_variable_any cv_;  // has_leadership() may have become true, or closed
  std::string value_ DLOCK_GUARDED_BY(mu_);
  bool started_ DLOCK_GUARDED_BY(mu_) = false;
  bool closed_ DLOCK_GUARDED_BY(mu_) = false;
  // Counts campaigns (and close()): an answer of an older one is stale.
  std::uint64_t generation_ DLOCK_GUARDED_BY(mu_) = 0;
  std::stop_source campaign_stop_ DLOCK_GUARDED_BY(mu_);
  int failures_ DLOCK_GUARDED_BY(mu_) = 0;  // campaigns failed in a row
  std::shared_ptr<Leadership> leadership_ DLOCK_GUARDED_BY(mu_);
  std::shared_ptr<void> hold_subscription_ DLOCK_GUARDED_BY(mu_);
  // What the listeners were told last (written by delivery_'s tasks).
  bool told_leader_ DLOCK_GUARDED_BY(mu_) = false;
  std::uint64_t told_term_ DLOCK_GUARDED_BY(mu_) = 0;
};

}  // namespace internal

LeaderLatch::LeaderLatch(Client client, std::string name, std::string value, LatchOptions options)
    : core_(std::make_shared<internal::LatchCore>(std::move(client), std::move(name), std::move(value), options)) {}

LeaderLatch::~LeaderLatch() { close(); }

void LeaderLatch::start() { core_->start(); }

void LeaderLatch::close() noexcept { core_->close(); }

bool LeaderLatch::has_leadership() const noexcept { return core_->has_leadership(); }

std::optional<std::uint64_t> LeaderLatch::term() const noexcept { return core_->term(); }

bool LeaderLatch::await_leadership(Clock::duration timeout, std::stop_token stop) {
  return core_->await_leadership(timeout, stop);
}

std::shared_ptr<void> LeaderLatch::on_change(std::function<void(LatchEvent, std::uint64_t)> fn) {
  return core_->on_change(std::move(fn));
}

Status LeaderLatch::proclaim(std::string value, Clock::duration timeout) {
  return core_->proclaim(std::move(value), timeout);
}

const std::string& LeaderLatch::name() const noexcept { return core_->name(); }

std::string LeaderLatch::value() const { return core_->value(); }

}  // namespace dlock
