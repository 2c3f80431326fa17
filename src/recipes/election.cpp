// Election: a queue of candidate entries whose first entry leads
// (docs/election.md). Campaigning is the acquisition engine with the
// exclusive rule and no local line; a Leadership is a HoldCore (states,
// lost token, own-entry watch, release) plus the published value and the
// updates that change it, one at a time.
#include "dlock/election.hpp"

#include <algorithm>
#include <deque>
#include <future>
#include <utility>

#include "core/access.hpp"
#include "core/hold_core.hpp"
#include "core/thread_annotations.hpp"
#include "recipes/acquire.hpp"
#include "recipes/election_internal.hpp"
#include "recipes/operation.hpp"
#include "recipes/thread_owned_lock.hpp"
#include "stores/entry_value.hpp"

namespace dlock {
namespace internal {

namespace {

Status NotLeaderError(const std::string& name, const std::string& why) {
  return FailedPreconditionError("not leader of " + name + ": " + why);
}

Status NotConfirmedError(const std::string& name) {
  return UnavailableError("the store did not confirm the update of " + name +
                          "'s value in time; it may or may not be published");
}

// One update of our own entry (a proclaim, the elected time): sent again
// after contact comes back, until confirmed, refused or out of time.
class EntryUpdater : public Operation<EntryUpdater> {
 public:
  using Done = std::function<void(Result<Entry>)>;

  EntryUpdater(std::shared_ptr<ClientCore> client, std::shared_ptr<HoldCore> hold, const HeldEntry& entry,
               EntryUpdate update, Clock::time_point deadline, std::stop_token stop, Done done)
      : Operation(std::move(client), deadline, std::move(stop), nullptr),
        hold_(std::move(hold)),
        entry_(entry),
        update_(std::move(update)),
        done_(std::move(done)) {}

  void start() {
    post(step([](EntryUpdater& u) {
      u.arm();
      u.send();
    }));
  }

 private:
  friend class Operation<EntryUpdater>;

  bool leading() const {
    const HoldState s = hold_->state();
    return s == HoldState::kHeld || s == HoldState::kUncertain;
  }

  void send() {
    if (!leading()) return finish(NotLeaderError(hold_->name(), "the leadership is " + state_text()));
    // Out of time (it may have waited behind other updates), or stopped.
    if (expired()) return finish(NotConfirmedError(hold_->name()));
    hold_->session()->async_update_entry(
        entry_.queue, entry_.id, update_, deadline_,
        then<Result<Entry>>([](EntryUpdater& u, Result<Entry> r) { u.on_sent(std::move(r)); }));
  }

  void on_sent(Result<Entry> sent) {
    if (sent.ok()) return finish(std::move(sent));
    switch (sent.status().code()) {
      case ErrorCode::kFailedPrecondition:  // our entry is gone
      case ErrorCode::kSessionLost: return finish(NotLeaderError(hold_->name(), sent.status().message()));
      case ErrorCode::kUnavailable:
      case ErrorCode::kDeadlineExceeded:
        // The outcome is unknown; the same update may be sent again.
        return recover(hold_->session(), [](EntryUpdater& u, bool connected) {
          if (connected && !u.expired()) return u.pause([](EntryUpdater& v) { v.send(); });
          if (ended(*u.hold_->session())) return u.finish(NotLeaderError(u.hold_->name(), "the session ended"));
          u.finish(NotConfirmedError(u.hold_->name()));
        });
      default: return finish(std::move(sent));
    }
  }

  std::string state_text() const { return std::string(HoldStateName(hold_->state())); }

  void abort(const char* what) { finish(InternalError(std::string("updating ") + hold_->name() + ": " + what)); }

  void finish(Result<Entry> outcome) {
    disarm();
    Done done = std::move(done_);
    done(std::move(outcome));
  }

  const std::shared_ptr<HoldCore> hold_;
  const HeldEntry entry_;
  const EntryUpdate update_;
  Done done_;
};

}  // namespace

// What a reading says of one candidate.
LeaderInfo LeaderInfoOf(const Entry& e) {
  LeaderInfo info;
  info.value = e.value.value_or("");
  info.term = e.token.value_or(0);
  info.entry = e.id;
  info.owner = e.owner;
  if (e.owner && e.owner->elected_unix_ms != 0) info.elected_unix_ms = e.owner->elected_unix_ms;
  if (e.owner && e.owner->acquired_unix_ms != 0) {
    info.candidate_since_unix_ms = e.owner->acquired_unix_ms;
  } else if (e.created_unix_ms != 0) {
    info.candidate_since_unix_ms = e.created_unix_ms;  // another client's entry, or zk's candidates
  }
  return info;
}

// The shared state of one Leadership.
class LeadershipCore : public std::enable_shared_from_this<LeadershipCore> {
 public:
  LeadershipCore(std::shared_ptr<ClientCore> client, std::shared_ptr<HoldCore> hold, std::string value)
      : client_(std::move(client)), hold_(std::move(hold)), value_(std::move(value)) {}

  const std::shared_ptr<HoldCore>& hold() const noexcept { return hold_; }
  ClientCore& client() const noexcept { return *client_; }

  std::string value() const DLOCK_EXCLUDES(mu_) {
    MutexLock g(mu_);
    return value_;
  }

  // Queues `update`; updates run one at a time, in the order queued, each
  // ends by its own deadline (also while it waits its turn), and `done` is
  // called on the executor. A best-effort update gives way to any other:
  // dropped if queued, stopped if running.
  void update(EntryUpdate update, Clock::time_point deadline, std::function<void(Status)> done,
              bool best_effort = false) DLOCK_EXCLUDES(mu_) {
    std::shared_ptr<std::stop_source> give_way;
    bool start = false;
    std::uint64_t id = 0;
    {
      MutexLock g(mu_);
      id = ++queued_;
      if (!best_effort) {
        std::erase_if(pending_, [](const Pending& p) { return p.best_effort; });
        give_way = running_best_effort_;
      }
      pending_.push_back({id, std::move(update), deadline, std::move(done), best_effort});
      start = !std::exchange(busy_, true);
    }
    if (give_way) give_way->request_stop();
    // No timer for no deadline: it would stay in the executor for good.
    if (deadline != kNoDeadline) {
      client_->executor().at(deadline, [weak = weak_from_this(), id] {
        if (auto self = weak.lock()) self->expire_queued(id);
      });
    }
    if (start) run_next();
  }

  void proclaim(std::string value, Clock::duration timeout, std::function<void(Status)> done) DLOCK_EXCLUDES(mu_) {
    update({.value = std::move(value), .owner = std::nullopt}, DeadlineAfter(client_->now(), timeout), std::move(done));
  }

  // Records when we were told we lead (docs/election.md §1.4): best effort,
  // not waited for; a store that keeps no owner record beside a value says
  // so, and that is fine too.
  void record_elected(OwnerRecord owner) {
    owner.elected_unix_ms = unix_millis_now();
    update(
        {.value = std::nullopt, .owner = std::move(owner)}, DeadlineAfter(client_->now(), ClientCore::kRequestTimeout),
        [](const Status&) {}, /*best_effort=*/true);
  }

 private:
  struct Pending {
    std::uint64_t id = 0;
    EntryUpdate update;
    Clock::time_point deadline;
    std::function<void(Status)> done;
    bool best_effort = false;
  };

  // An update whose deadline passed while it waited its turn.
  void expire_queued(std::uint64_t id) DLOCK_EXCLUDES(mu_) {
    std::function<void(Status)> done;
    {
      MutexLock g(mu_);
      auto it = std::find_if(pending_.begin(), pending_.end(), [id](const Pending& p) { return p.id == id; });
      if (it == pending_.end()) return;  // started, or done
      done = std::move(it->done);
      pending_.erase(it);
    }
    try {
      done(NotConfirmedError(hold_->name()));
    } catch (...) {  // the application's; dropped, as dlock/async.hpp says
    }
  }

  static std::int64_t unix_millis_now() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  void run_next() DLOCK_EXCLUDES(mu_) {
    Pending next;
    std::stop_token stop;
    {
      MutexLock g(mu_);
      running_best_effort_.reset();
      if (pending_.empty()) {
        busy_ = false;
        return;
      }
      next = std::move(pending_.front());
      pending_.pop_front();
      if (next.best_effort) {
        running_best_effort_ = std::make_shared<std::stop_source>();
        stop = running_best_effort_->get_token();
      }
    }
    std::optional<std::string> value = next.update.value;
    std::make_shared<EntryUpdater>(
        client_, hold_, hold_->entries().front(), std::move(next.update), next.deadline, std::move(stop),
        [self = shared_from_this(), value = std::move(value), done = std::move(next.done)](Result<Entry> r) {
          if (r.ok() && value) {
            MutexLock g(self->mu_);
            self->value_ = *value;
          }
          // The next update is started before this one is reported, so
          // that a `done` that proclaims again queues behind it.
          self->run_next();
          try {
            done(r.status());
          } catch (...) {  // the application's; dropped, as dlock/async.hpp says
          }
        })
        ->start();
  }

  const std::shared_ptr<ClientCore> client_;
  const std::shared_ptr<HoldCore> hold_;
  mutable Mutex mu_;
  std::string value_ DLOCK_GUARDED_BY(mu_);
  std::deque<Pending> pending_ DLOCK_GUARDED_BY(mu_);
  std::uint64_t queued_ DLOCK_GUARDED_BY(mu_) = 0;  // ids of updates
  bool busy_ DLOCK_GUARDED_BY(mu_) = false;
  // Set while a best-effort update runs: stopping it lets the next go.
  std::shared_ptr<std::stop_source> running_best_effort_ DLOCK_GUARDED_BY(mu_);
};

namespace {

Leadership MakeLeadership(const Client& client, const std::string& name, Acquired& acquired, std::string value) {
  const std::shared_ptr<ClientCore>& core = CoreOf(client);
  std::vector<HeldEntry> entries{{name, acquired.entry.id, acquired.entry.sequence}};
  auto hold = HoldCore::make(core, acquired.session, name, std::move(entries), acquired.entry.token.value_or(0), 1);
  auto leadership = std::make_shared<LeadershipCore>(core, std::move(hold), std::move(value));
  leadership->record_elected(std::move(acquired.owner));
  return Access::wrap(std::move(leadership));
}

// Starts one campaign; `done` as for StartAcquire, with the Leadership.
void StartCampaign(const Client& client, const std::string& name, const std::string& value, Clock::duration timeout,
                   const std::stop_token& stop, FailureSink failure, CampaignCallback done) {
  AcquireRequest request = MakeRequest(client, name, entry_kind::kCandidate, ExclusiveRule, timeout, stop, false);
  // Every campaign is a participant of its own (election.hpp): no local line.
  request.use_gate = false;
  request.thread = "campaign";
  request.value = value;
  request.failure = failure;
  StartAcquire(CoreOf(client), std::move(request),
               [client = std::optional<Client>(client), name, value, done = std::move(done),
                failure](AcquireOutcome got) mutable {
                 // The client is let go of before `done`, as StartHold does.
                 if (!got.ok() || !got->has_value()) {
                   client.reset();
                   return done(got.ok() ? Result<std::optional<Leadership>>(std::optional<Leadership>())
                                        : Result<std::optional<Leadership>>(got.status()));
                 }
                 std::optional<Leadership> leadership;
                 try {
                   leadership = MakeLeadership(*client, name, **got, std::move(value));
                 } catch (const std::exception& e) {
                   // The HoldCore, if it was made, released the entry as it went.
                   if (failure) failure->keep(std::current_exception());
                   client.reset();
                   return done(InternalError("making the leadership of " + name + ": " + e.what()));
                 }
                 client.reset();
                 done(std::move(leadership));
               });
}

// Waits for one asynchronous reading of the store.
template <class T>
Result<T> ReadBlocking(const Client& client,
                       const std::function<void(Session&, Clock::time_point, std::function<void(Result<T>)>)>& read) {
  auto session = client.session();
  if (!session.ok()) return session.status();
  auto outcome = std::make_shared<std::promise<Result<T>>>();
  std::future<Result<T>> future = outcome->get_future();
  read(**session, DeadlineAfter(CoreOf(client)->now(), ClientCore::kRequestTimeout),
       [outcome](Result<T> r) { outcome->set_value(std::move(r)); });
  return future.get();
}

}  // namespace
}  // namespace internal

Leadership& Leadership::operator=(Leadership&& other) noexcept {
  if (this != &other) {
    resign();
    core_ = std::move(other.core_);
  }
  return *this;
}

Leadership::~Leadership() { resign(); }

bool Leadership::held() const noexcept {
  const HoldState s = state();
  return s == HoldState::kHeld || s == HoldState::kUncertain;
}

HoldState Leadership::state() const noexcept { return core_ ? core_->hold()->state() : HoldState::kReleased; }

std::uint64_t Leadership::term() const noexcept { return core_ ? core_->hold()->token() : 0; }

const std::string& Leadership::name() const noexcept {
  static const std::string kEmpty;
  return core_ ? core_->hold()->name() : kEmpty;
}

std::string Leadership::value() const { return core_ ? core_->value() : std::string(); }

std::stop_token Leadership::lost_token() const noexcept {
  return core_ ? core_->hold()->lost_token() : std::stop_token();
}

std::shared_ptr<void> Leadership::on_state_change(std::function<void(HoldState)> fn) const {
  return core_ ? core_->hold()->on_state_change(std::move(fn)) : nullptr;
}

Status Leadership::proclaim(std::string value, Clock::duration timeout) {
  ThrowIfError(internal::CheckEntryValue(value));
  if (!core_) return FailedPreconditionError("not leader: an empty Leadership");
  Result<bool> got = internal::WaitFor<bool>(
      core_->client(), [&](std::function<void(Result<bool>)> done, const internal::FailureSink& /*unused*/) {
        core_->proclaim(std::move(value), timeout, [done = std::move(done)](const Status& s) {
          done(s.ok() ? Result<bool>(true) : Result<bool>(s));
        });
      });
  return got.status();
}

void Leadership::async_proclaim(std::string value, Clock::duration timeout, std::function<void(Status)> done) {
  ThrowIfError(internal::CheckEntryValue(value));
  // No client to call back on: a misuse, told at the call.
  if (!core_) throw Error(FailedPreconditionError("async_proclaim() on an empty Leadership"));
  core_->proclaim(std::move(value), timeout, std::move(done));
}

void Leadership::resign() noexcept {
  if (core_) core_->hold()->release();
}

Election::Election(Client client, std::string name) : client_(std::move(client)), name_(std::move(name)) {
  ThrowIfError(ValidateLockName(name_));
}

std::function<void(CampaignCallback)> Election::campaign_starter(std::string value, Clock::duration timeout,
                                                                 std::stop_token stop) const {
  ThrowIfError(internal::CheckEntryValue(value));
  return [client = client_, name = name_, value = std::move(value), timeout,
          stop = std::move(stop)](CampaignCallback done) {
    internal::StartCampaign(client, name, value, timeout, stop, nullptr, std::move(done));
  };
}

std::optional<Leadership> Election::campaign(std::string value, Clock::duration timeout, std::stop_token stop) {
  ThrowIfError(internal::CheckEntryValue(value));
  Result<std::optional<Leadership>> got = internal::WaitFor<std::optional<Leadership>>(
      *internal::CoreOf(client_), [&](CampaignCallback done, internal::FailureSink failure) {
        internal::StartCampaign(client_, name_, value, timeout, stop, std::move(failure), std::move(done));
      });
  if (!got.ok()) throw Error(got.status());
  return std::move(got).value();
}

void Election::async_campaign(std::string value, Clock::duration timeout, std::stop_token stop, CampaignCallback done) {
  campaign_starter(std::move(value), timeout, std::move(stop))(std::move(done));
}

CampaignAwaitable Election::async_campaign(std::string value, Clock::duration timeout, std::stop_token stop) {
  return CampaignAwaitable(campaign_starter(std::move(value), timeout, std::move(stop)));
}

std::future<std::optional<Leadership>> Election::campaign_future(std::string value, Clock::duration timeout,
                                                                 std::stop_token stop) {
  return internal::FutureOf<std::optional<Leadership>>(campaign_starter(std::move(value), timeout, std::move(stop)));
}

Result<std::optional<LeaderInfo>> Election::leader() const {
  Result<Head> head = internal::ReadBlocking<Head>(
      client_, [this](Session& s, Clock::time_point deadline, std::function<void(Result<Head>)> done) {
        s.async_read_head(name_, {.with_owners = true, .with_values = true}, deadline, std::move(done));
      });
  if (!head.ok()) return head.status();
  if (!head->entry) return std::optional<LeaderInfo>();
  return std::optional<LeaderInfo>(internal::LeaderInfoOf(*head->entry));
}

Result<std::vector<LeaderInfo>> Election::participants() const {
  auto session = client_.session();
  if (!session.ok()) return session.status();
  auto listed =
      (*session)->list(name_, {.with_owners = true, .with_values = true},
                       DeadlineAfter(internal::CoreOf(client_)->now(), internal::ClientCore::kRequestTimeout));
  if (!listed.ok()) return listed.status();
  std::vector<LeaderInfo> out;
  out.reserve(listed->size());
  for (const Entry& e : *listed) out.push_back(internal::LeaderInfoOf(e));
  return out;
}

}  // namespace dlock
