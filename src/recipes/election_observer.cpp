// Election::observe: a loop on the client's executor that reads the head of
// the election's queue, reports it if it differs from the last report, and
// arms a head watch against that very reading (docs/election.md, §3.4):
//
//   open a session ─► read ─► report ─► watch ─┐
//        ▲             ▲                       │ fired
//        │             └───────────────────────┘
//        └── session lost or closed (report kUnknown first)
//
// The session is followed too: suspended ⇒ kUnknown once; connected again
// ⇒ read and report even if unchanged. Every step runs on the executor, so
// the loop's fields need no lock; store completions come back through
// post(), tagged with the round they belong to, and a completion of an
// older round (a watch cancelled by a reconnect) is dropped.
#include <atomic>
#include <utility>

#include "core/access.hpp"
#include "core/client_core.hpp"
#include "dlock/election.hpp"
#include "recipes/election_internal.hpp"

namespace dlock {
namespace internal {
namespace {

class ElectionObserver : public std::enable_shared_from_this<ElectionObserver> {
 public:
  ElectionObserver(Client client, std::string name, std::function<void(const Observation&)> fn)
      : core_(CoreOf(client)), client_(std::move(client)), name_(std::move(name)), fn_(std::move(fn)) {}

  void start() {
    post([](ElectionObserver& o) { o.open_session(); });
  }

  // From the handle's destructor, on any thread: no report starts after it.
  void stop() noexcept {
    stopped_.store(true);
    try {
      // The store handles go on the executor, where the loop owns them.
      core_->executor().post([self = shared_from_this()] { self->drop_everything(); });
    } catch (...) {  // out of memory: they go with the last reference instead
    }
  }

 private:
  using Step = void (*)(ElectionObserver&);

  // Runs `step` on the executor unless stopped.
  void post(Step step) {
    core_->executor().post([weak = weak_from_this(), step] {
      auto self = weak.lock();
      if (self && !self->stopped_.load()) step(*self);
    });
  }

  // A completion for the store (any thread): runs `fn(result)` on the
  // executor if the loop is still in `round`.
  template <class T>
  std::function<void(T)> in_round(void (*fn)(ElectionObserver&, T)) {
    return [weak = weak_from_this(), round = round_, fn](T result) {
      auto self = weak.lock();
      if (!self) return;
      self->core_->executor().post([weak, round, fn, result = std::make_shared<T>(std::move(result))] {
        auto o = weak.lock();
        if (o && !o->stopped_.load() && o->round_ == round) fn(*o, std::move(*result));
      });
    };
  }

  // A new round: whatever the old one armed is cancelled, and its late
  // completions are dropped.
  void new_round() {
    ++round_;
    watch_.reset();
  }

  // ---------------------------------------------------------- the session

  void open_session() {
    new_round();
    ++sessions_;  // news of the session before is no longer ours
    subscription_.reset();
    session_.reset();
    core_->async_session(
        DeadlineAfter(core_->now(), ClientCore::kRequestTimeout),
        in_round<Result<std::shared_ptr<Session>>>(
            [](ElectionObserver& o, Result<std::shared_ptr<Session>> s) { o.on_session(std::move(s)); }));
  }

  void on_session(Result<std::shared_ptr<Session>> opened) {
    if (!opened.ok()) {
      report_unknown();
      return retry([](ElectionObserver& o) { o.open_session(); });
    }
    session_ = std::move(opened).value();
    if (!session_->keeps_values()) {
      // Nothing to watch, ever: say so once, and stop.
      report_unknown();
      core_->report(
          UnimplementedError("observing " + name_ + ": this store keeps no values, so it cannot be observed"));
      return new_round();
    }
    force_ = true;  // a new session: report what it reads, even if unchanged
    std::weak_ptr<ElectionObserver> weak = weak_from_this();
    const std::uint64_t sessions = sessions_;
    subscription_ = session_->subscribe([weak, sessions](SessionState s) {
      auto self = weak.lock();
      if (!self) return;
      self->core_->executor().post([weak, sessions, s] {
        // Only the current session's news: an earlier one's may still arrive.
        auto o = weak.lock();
        if (o && !o->stopped_.load() && o->sessions_ == sessions) o->on_session_state(s);
      });
    });
    // A change between the open and the subscription is read below, or
    // told by the state the session has now.
    if (session_->state() == SessionState::kSuspended) return report_unknown();
    read();
  }

  void on_session_state(SessionState s) {
    switch (s) {
      case SessionState::kSuspended: return report_unknown();
      case SessionState::kConnected:
        // Contact is back: read again from the present, and say so even if
        // nothing changed.
        new_round();
        force_ = true;
        return read();
      default:  // lost or closed: its watches went with it
        report_unknown();
        return open_session();
    }
  }

  // --------------------------------------------------------- the reading

  void read() {
    if (!session_) return;
    session_->async_read_head(
        name_, {.with_owners = true, .with_values = true}, DeadlineAfter(core_->now(), ClientCore::kRequestTimeout),
        in_round<Result<Head>>([](ElectionObserver& o, Result<Head> h) { o.on_read(std::move(h)); }));
  }

  void on_read(Result<Head> head) {
    if (!head.ok()) {
      if (head.status().code() == ErrorCode::kSessionLost) {
        report_unknown();
        return open_session();
      }
      // The session's own listener says kSuspended if contact is gone; a
      // reading that fails while connected is tried again.
      return retry([](ElectionObserver& o) { o.read(); });
    }
    failures_ = 0;
    report(*head);
    watch(std::move(head).value());
  }

  void watch(const Head& seen) {
    watch_ = session_->async_watch_head(
        name_, seen, in_round<Status>([](ElectionObserver& o, Status s) { o.on_watched(std::move(s)); }));
  }

  void on_watched(const Status& fired) {
    watch_.reset();
    switch (fired.code()) {
      case ErrorCode::kOk: return read();
      case ErrorCode::kCancelled: return;  // ours
      case ErrorCode::kSessionLost: report_unknown(); return open_session();
      default: return retry([](ElectionObserver& o) { o.read(); });
    }
  }

  // After a failure: `step` again after a pause, 50 ms doubling to 2 s.
  void retry(Step step) {
    const int n = failures_++;
    if (n == 5) core_->report(UnavailableError("observing " + name_ + ": the store keeps failing"));
    const auto pause =
        std::min<Clock::duration>(std::chrono::milliseconds(50) * (1 << std::min(n, 6)), std::chrono::seconds(2));
    core_->executor().at(DeadlineAfter(core_->now(), pause), [weak = weak_from_this(), round = round_, step] {
      auto self = weak.lock();
      if (self && !self->stopped_.load() && self->round_ == round) step(*self);
    });
  }

  // ------------------------------------------------------------ reports

  // Reports a reading unless it says what the last report said (the same
  // entry with the same value: an owner-record update wakes a watch on some
  // stores, and a proclaim of the same value changes nothing).
  void report(const Head& head) {
    Observation next;
    if (head.entry) {
      next.state = LeaderState::kLeader;
      next.leader = LeaderInfoOf(*head.entry);
    } else {
      next.state = LeaderState::kNoLeader;
    }
    const bool same = last_ && last_->state == next.state &&
                      (next.state != LeaderState::kLeader ||
                       (last_entry_ == head.entry->id && last_->leader->value == next.leader->value));
    if (same && !force_) return;
    force_ = false;
    if (head.entry) last_entry_ = head.entry->id;
    tell(std::move(next));
  }

  void report_unknown() {
    if (last_ && last_->state == LeaderState::kUnknown) return;
    Observation next;
    next.state = LeaderState::kUnknown;
    if (last_) next.leader = last_->leader;
    last_entry_.clear();
    tell(std::move(next));
  }

  void tell(Observation next) {
    next.number = ++reports_;
    last_ = next;
    if (stopped_.load()) return;
    try {
      fn_(next);
    } catch (...) {  // the application's; dropped, as election.hpp says
    }
  }

  void drop_everything() {
    ++round_;
    ++sessions_;
    watch_.reset();
    subscription_.reset();
    session_.reset();
    client_.reset();  // the subscription no longer keeps the client working
  }

  const std::shared_ptr<ClientCore> core_;
  std::optional<Client> client_;  // a user handle, until stopped
  const std::string name_;
  const std::function<void(const Observation&)> fn_;
  std::atomic<bool> stopped_{false};

  // Executor only.
  std::uint64_t round_ = 0;
  std::uint64_t sessions_ = 0;  // counts opens: a subscription's news counts only in its own
  std::shared_ptr<Session> session_;
  std::shared_ptr<void> subscription_;
  std::shared_ptr<void> watch_;
  bool force_ = true;
  int failures_ = 0;
  std::uint64_t reports_ = 0;
  std::optional<Observation> last_;
  std::string last_entry_;  // the leader's entry in last_, if any
};

// What observe() returns: stops the observer when the caller lets go.
class ObserverHandle {
 public:
  explicit ObserverHandle(std::shared_ptr<ElectionObserver> observer) : observer_(std::move(observer)) {}
  ObserverHandle(const ObserverHandle&) = delete;
  ObserverHandle& operator=(const ObserverHandle&) = delete;
  ~ObserverHandle() { observer_->stop(); }

 private:
  const std::shared_ptr<ElectionObserver> observer_;
};

}  // namespace
}  // namespace internal

std::string_view LeaderStateName(LeaderState state) noexcept {
  switch (state) {
    case LeaderState::kLeader: return "leader";
    case LeaderState::kNoLeader: return "none";
    case LeaderState::kUnknown: return "unknown";
  }
  return "unknown";
}

std::shared_ptr<void> Election::observe(std::function<void(const Observation&)> fn) const {
  // Nothing here waits for the store (a review finding: a check of the
  // store's kind opened a session first): the loop finds out.
  auto observer = std::make_shared<internal::ElectionObserver>(client_, name_, std::move(fn));
  observer->start();
  return std::make_shared<internal::ObserverHandle>(std::move(observer));
}

}  // namespace dlock
