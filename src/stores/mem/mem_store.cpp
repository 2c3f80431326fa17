// The in-process store. One mutex guards everything. Waits are records in
// the state: whatever removes an entry or ends a session takes out the
// waits that now have an outcome and completes them after letting go of the
// mutex, on its own thread (no thread of the store's). Blocking calls wait
// on one condition variable that every such change notifies. Session
// listeners are called without the mutex held, in order, before the change
// they announce becomes visible to other sessions (expiry: listeners first,
// then the entries go).
//
// Injected delays (delay_next) hold the calling thread back, for the
// asynchronous forms too: the delay runs inline before the request (or the
// wait's registration) as it does for the blocking form, so a test sees the
// same slow store whichever form the engine calls.
#include "dlock/mem_store.hpp"

#include "core/listeners.hpp"
#include "core/serial_delivery.hpp"
#include "core/thread_annotations.hpp"
#include "stores/entry_value.hpp"
#include "stores/one_outcome.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>

namespace dlock {
namespace mem_detail {
namespace {

// Outside MemStore::State, which MemStore exports: the std::map code made
// for these types would otherwise be exported from libdlock.so with it
// (package.exports counts the symbols).

// The head of a queue, as async_watch_head compares it.
struct HeadMark {
  std::optional<std::string> id;  // nullopt: the queue was empty
  std::uint64_t value_version = 0;
  bool operator==(const HeadMark&) const = default;
};

// A pending async_watch_head: done when the queue's head differs from the
// one seen.
struct HeadWatcher {
  std::string session;
  HeadMark seen;
  std::shared_ptr<internal::OneOutcome> outcome;
};

}  // namespace
}  // namespace mem_detail

struct MemStore::State {
  std::shared_ptr<Clock> clock;  // set by create() before anyone else sees the state; then constant
  mutable internal::Mutex mu;
  std::condition_variable_any changed;

  struct StoredEntry {
    Entry entry;  // with token, attempt id, value and value_version
    std::string session;
    std::string owner_json;
  };
  struct SessionRec {
    SessionState state = SessionState::kConnected;
    internal::ListenerList<SessionState> listeners;  // a handle: copies share the list
    // Delivers state changes in order; listeners may call back in.
    std::shared_ptr<internal::SerialDelivery> delivery = std::make_shared<internal::SerialDelivery>();
  };

  std::uint64_t next_token DLOCK_GUARDED_BY(mu) = 1;  // sequences and tokens share it: both only grow
  std::uint64_t next_session DLOCK_GUARDED_BY(mu) = 1;
  std::map<std::string, std::vector<StoredEntry>, std::less<>> queues DLOCK_GUARDED_BY(mu);
  std::map<std::string, SessionRec, std::less<>> sessions DLOCK_GUARDED_BY(mu);
  std::map<std::string, std::deque<Status>, std::less<>> failures DLOCK_GUARDED_BY(mu);
  std::map<std::string, int, std::less<>> lost_replies DLOCK_GUARDED_BY(mu);
  std::map<std::string, std::deque<Clock::duration>, std::less<>> delays DLOCK_GUARDED_BY(mu);
  std::map<std::string, std::uint64_t, std::less<>> ops DLOCK_GUARDED_BY(mu);

  // A pending async_wait_any_gone.
  struct Waiter {
    std::string session;
    std::string queue;
    std::vector<std::string> ids;
    std::shared_ptr<internal::OneOutcome> outcome;
    // async_wait_turn's: the waiter's own entry, and whether it was still
    // there when the wait was settled with OK (set under mu, read after).
    std::string own;
    std::vector<std::string> ahead;
    std::shared_ptr<std::atomic<bool>> own_intact;
  };
  std::uint64_t next_waiter DLOCK_GUARDED_BY(mu) = 1;
  // By queue, so that a removal looks only at the waiters of its queue.
  std::map<std::string, std::map<std::uint64_t, Waiter>, std::less<>> waiters DLOCK_GUARDED_BY(mu);
  using HeadMark = mem_detail::HeadMark;
  using HeadWatcher = mem_detail::HeadWatcher;
  std::map<std::string, std::map<std::uint64_t, HeadWatcher>, std::less<>> head_watchers DLOCK_GUARDED_BY(mu);
  // When heads changed, on a counter of head changes of every queue: a
  // reading's Head::position is the counter then, so that a watch armed
  // later sees a head that changed and changed back in between (review
  // finding: an entry that came and went). Per non-empty queue; for the
  // queues that emptied (and are forgotten), only the last such moment:
  // a watch on an empty queue read before it fires, at worst needlessly.
  std::uint64_t head_clock DLOCK_GUARDED_BY(mu) = 0;
  std::map<std::string, std::uint64_t, std::less<>> head_changed_at DLOCK_GUARDED_BY(mu);
  std::uint64_t last_emptied_at DLOCK_GUARDED_BY(mu) = 0;
  // Outcomes taken out under mu, to be delivered after it is let go.
  using Settled = std::vector<std::pair<std::shared_ptr<internal::OneOutcome>, Status>>;

  // Counts `op` and returns an injected failure for it, if any.
  Status inject(std::string_view op) DLOCK_REQUIRES(mu) {
    ++ops[std::string(op)];
    for (std::string_view key : {op, std::string_view("*")}) {
      auto it = failures.find(key);
      if (it != failures.end() && !it->second.empty()) {
        Status s = it->second.front();
        it->second.pop_front();
        return s;
      }
    }
    return OkStatus();
  }
  // Waits out an injected delay for `op`, releasing mu meanwhile.
  // Takes the native lock, not internal::MutexLock: MemStore is exported, and
  // the typeinfo of the wait predicate below carries this signature, which
  // must name nothing in dlock::internal (the package.exports test).
  void delay(std::unique_lock<std::mutex>& lock, std::string_view op) DLOCK_REQUIRES(mu) {
    Clock::duration by{};
    for (std::string_view key : {op, std::string_view("*")}) {
      auto it = delays.find(key);
      if (it != delays.end() && !it->second.empty()) {
        by = it->second.front();
        it->second.pop_front();
        break;
      }
    }
    if (by <= Clock::duration::zero()) return;
    ++ops["delayed"];
    const Clock::time_point until = clock->now() + by;
    clock->wait_until(changed, lock, {}, until, [&] { return clock->now() >= until; });
  }
  // True if the reply of this `op` is to be lost.
  // A fault, delay or lost reply is queued for `op` (or for every op).
  bool scripted(std::string_view op) const DLOCK_REQUIRES(mu) {
    for (std::string_view key : {op, std::string_view("*")}) {
      auto f = failures.find(key);
      auto d = delays.find(key);
      auto l = lost_replies.find(key);
      if ((f != failures.end() && !f->second.empty()) || (d != delays.end() && !d->second.empty()) ||
          (l != lost_replies.end() && l->second > 0)) {
        return true;
      }
    }
    return false;
  }
  // async_wait_turn's vouching (see Waiter::own): the own entry is there,
  // and no test has scripted the list it would save (a test that delays or
  // fails "list" after a wake-up means to reach that list).
  bool vouches_for(std::string_view queue, std::string_view own, const std::vector<std::string>& ahead) const
      DLOCK_REQUIRES(mu) {
    return present(queue, own) && !scripted("list") && std::none_of(ahead.begin(), ahead.end(), [&](const auto& id) {
             mu.assert_held();  // called by none_of right here
             return present(queue, id);
           });
  }
  bool lose_reply(std::string_view op) DLOCK_REQUIRES(mu) {
    for (std::string_view key : {op, std::string_view("*")}) {
      auto it = lost_replies.find(key);
      if (it != lost_replies.end() && it->second > 0) {
        --it->second;
        return true;
      }
    }
    return false;
  }
  // The session's usability for a request.
  Status usable(const std::string& session) const DLOCK_REQUIRES(mu) {
    auto it = sessions.find(session);
    if (it == sessions.end()) return SessionLostError("session " + session + " is gone");
    switch (it->second.state) {
      case SessionState::kConnected: return OkStatus();
      case SessionState::kSuspended: return UnavailableError("session " + session + " is suspended");
      case SessionState::kLost: return SessionLostError("session " + session + " expired");
      case SessionState::kClosed: return SessionLostError("session " + session + " is closed");
    }
    return InternalError("bad session state");
  }
  std::vector<Entry> snapshot(std::string_view queue, bool with_owners, bool with_values = false) const
      DLOCK_REQUIRES(mu) {
    std::vector<Entry> out;
    auto it = queues.find(queue);
    if (it == queues.end()) return out;
    for (const auto& stored : it->second) {
      out.push_back(stored.entry);
      if (!with_values) {
        out.back().value.reset();
        out.back().value_version = 0;
      }
      if (with_owners) {
        auto owner = DecodeOwnerRecord(stored.owner_json);
        if (owner.ok()) out.back().owner = *owner;
      }
    }
    std::sort(out.begin(), out.end(), QueueOrder);
    return out;
  }
  // The head of `queue` now, as async_watch_head compares it.
  HeadMark head_mark(std::string_view queue) const DLOCK_REQUIRES(mu) {
    auto it = queues.find(queue);
    if (it == queues.end() || it->second.empty()) return {};
    const StoredEntry& first =
        *std::min_element(it->second.begin(), it->second.end(),
                          [](const StoredEntry& a, const StoredEntry& b) { return QueueOrder(a.entry, b.entry); });
    return {first.entry.id, first.entry.value_version};
  }
  // Records a change of `queue`'s head, if its head is no longer `before`.
  void note_head(std::string_view queue, const HeadMark& before) DLOCK_REQUIRES(mu) {
    const HeadMark after = head_mark(queue);
    if (after == before) return;
    ++head_clock;
    if (after.id) {
      head_changed_at.insert_or_assign(std::string(queue), head_clock);
    } else {
      if (auto it = head_changed_at.find(queue); it != head_changed_at.end()) head_changed_at.erase(it);
      last_emptied_at = head_clock;
    }
  }
  // Whether `queue`'s head may have changed since a reading at `position`.
  bool head_changed_since(std::string_view queue, std::int64_t position) const DLOCK_REQUIRES(mu) {
    auto it = head_changed_at.find(queue);
    const std::uint64_t at = it != head_changed_at.end() ? it->second : last_emptied_at;
    return at > static_cast<std::uint64_t>(std::max<std::int64_t>(position, 0));
  }
  bool present(std::string_view queue, std::string_view id) const DLOCK_REQUIRES(mu) {
    auto it = queues.find(queue);
    if (it == queues.end()) return false;
    return std::any_of(it->second.begin(), it->second.end(), [&](const StoredEntry& e) { return e.entry.id == id; });
  }
  bool ended(const std::string& session) const DLOCK_REQUIRES(mu) {
    auto it = sessions.find(session);
    return it == sessions.end() || it->second.state == SessionState::kLost || it->second.state == SessionState::kClosed;
  }
  bool any_gone(std::string_view queue, const std::vector<std::string>& ids) const DLOCK_REQUIRES(mu) {
    return std::any_of(ids.begin(), ids.end(), [&](const std::string& id) {
      mu.assert_held();  // called by any_of right here
      return !present(queue, id);
    });
  }
  // Takes out every waiter (of `queue` only, if given) that has an outcome now.
  Settled settle(std::optional<std::string_view> queue = std::nullopt) DLOCK_REQUIRES(mu) {
    Settled out;
    auto first = queue ? waiters.find(*queue) : waiters.begin();
    auto last = queue && first != waiters.end() ? std::next(first) : waiters.end();
    for (auto q = first; q != last;) {
      settle_queue(q->second, out);
      q = q->second.empty() ? waiters.erase(q) : std::next(q);
    }
    auto first_head = queue ? head_watchers.find(*queue) : head_watchers.begin();
    auto last_head = queue && first_head != head_watchers.end() ? std::next(first_head) : head_watchers.end();
    for (auto q = first_head; q != last_head;) {
      settle_heads(q->first, q->second, out);
      q = q->second.empty() ? head_watchers.erase(q) : std::next(q);
    }
    changed.notify_all();
    return out;
  }
  void settle_heads(std::string_view queue, std::map<std::uint64_t, HeadWatcher>& in_queue, Settled& out)
      DLOCK_REQUIRES(mu) {
    const HeadMark now = head_mark(queue);
    for (auto it = in_queue.begin(); it != in_queue.end();) {
      const HeadWatcher& w = it->second;
      if (ended(w.session)) {
        out.emplace_back(w.outcome, SessionLostError("session " + w.session + " ended while watching"));
      } else if (!(now == w.seen)) {
        out.emplace_back(w.outcome, OkStatus());
      } else {
        ++it;
        continue;
      }
      it = in_queue.erase(it);
    }
  }
  void settle_queue(std::map<std::uint64_t, Waiter>& in_queue, Settled& out) DLOCK_REQUIRES(mu) {
    for (auto it = in_queue.begin(); it != in_queue.end();) {
      const Waiter& w = it->second;
      if (ended(w.session)) {
        out.emplace_back(w.outcome, SessionLostError("session " + w.session + " ended while waiting"));
      } else if (any_gone(w.queue, w.ids)) {
        ++ops["wake"];
        if (w.own_intact) w.own_intact->store(vouches_for(w.queue, w.own, w.ahead));
        out.emplace_back(w.outcome, OkStatus());
      } else {
        ++it;
        continue;
      }
      it = in_queue.erase(it);
    }
  }
  // Completes what settle() took out; never with mu held.
  static void deliver(Settled settled) {
    for (auto& [outcome, status] : settled) outcome->complete(std::move(status));
  }
  // Removes every entry of `session`.
  void drop_entries_of(const std::string& session) DLOCK_REQUIRES(mu) {
    for (auto it = queues.begin(); it != queues.end();) {
      const std::string queue = it->first;
      const HeadMark before = head_mark(queue);
      std::erase_if(it->second, [&](const StoredEntry& e) { return e.session == session; });
      it = it->second.empty() ? queues.erase(it) : std::next(it);
      note_head(queue, before);
    }
  }
};

// Moves a session to `next` and tells its listeners, in order, outside mu.
// `then` runs under mu after the listeners returned. From inside a listener
// of the same session, the listeners hear it (and `then` runs) after that
// listener returns.
void MemStore::transition(const std::shared_ptr<State>& state, std::string_view id, SessionState next,
                          const std::function<void(State&)>& then) {
  std::shared_ptr<internal::SerialDelivery> delivery;
  internal::ListenerList<SessionState> listeners;
  State::Settled ended_waits;
  {
    internal::MutexLock g(state->mu);
    auto it = state->sessions.find(id);
    if (it == state->sessions.end()) return;
    SessionState cur = it->second.state;
    if (cur == next || cur == SessionState::kLost || cur == SessionState::kClosed) return;
    it->second.state = next;
    delivery = it->second.delivery;
    listeners = it->second.listeners;
    ended_waits = state->settle();  // the session's own waits end with it; also notifies
  }
  State::deliver(std::move(ended_waits));
  delivery->run([state, listeners, next, then] {
    listeners.notify(next);
    if (then) {
      State::Settled woken;
      {
        internal::MutexLock g(state->mu);
        then(*state);
        woken = state->settle();
      }
      State::deliver(std::move(woken));
    }
  });
}

namespace {

// Queue names are lock names on every store (store.hpp).
Status CheckQueue(std::string_view queue) {
  if (Status s = ValidateLockName(queue); !s.ok()) return InvalidArgumentError("queue: " + s.message());
  return OkStatus();
}

}  // namespace

class MemStore::MemSession final : public Session {
 public:
  MemSession(std::shared_ptr<State> state, std::string id) : state_(std::move(state)), id_(std::move(id)) {}
  ~MemSession() override { close(); }

  std::string id() const override { return id_; }

  SessionState state() const noexcept override {
    internal::MutexLock g(state_->mu);
    auto it = state_->sessions.find(id_);
    return it == state_->sessions.end() ? SessionState::kClosed : it->second.state;
  }

  std::shared_ptr<void> subscribe(std::function<void(SessionState)> fn) override {
    internal::ListenerList<SessionState> listeners;
    {
      internal::MutexLock g(state_->mu);
      listeners = state_->sessions[id_].listeners;
    }
    return listeners.add(std::move(fn));
  }

  Result<Appended> append(std::string_view queue, const EntrySpec& spec, Clock::time_point) override {
    if (Status s = CheckQueue(queue); !s.ok()) return s;
    if (Status s = internal::CheckEntryValue(spec.value); !s.ok()) return s;
    internal::MutexLock lock(state_->mu);
    state_->delay(lock.native(), "append");
    if (Status s = state_->inject("append"); !s.ok()) return s;
    if (Status s = state_->usable(id_); !s.ok()) return s;
    if (spec.kind.empty() || spec.attempt_id.empty()) {
      return InvalidArgumentError("entry needs a kind and an attempt id");
    }
    std::uint64_t token = state_->next_token++;
    State::StoredEntry stored;
    char id[48];
    std::snprintf(id, sizeof id, "%010llu-%s", static_cast<unsigned long long>(token), spec.kind.c_str());
    stored.entry.id = id;
    stored.entry.kind = spec.kind;
    stored.entry.sequence = spec.sequence.value_or(static_cast<std::int64_t>(token));
    stored.entry.token = token;
    stored.entry.attempt_id = spec.attempt_id;
    stored.entry.value = spec.value;
    stored.entry.value_version = 1;
    stored.session = id_;
    stored.owner_json = EncodeOwnerRecord(spec.owner);
    Appended out;
    out.entry = stored.entry;
    const State::HeadMark before = state_->head_mark(queue);
    state_->queues[std::string(queue)].push_back(std::move(stored));
    state_->note_head(queue, before);
    out.queue = state_->snapshot(queue, false);
    State::Settled woken = state_->settle(queue);  // head watchers of a queue that was empty
    const bool lost = state_->lose_reply("append");
    lock.unlock();
    State::deliver(std::move(woken));
    if (lost) return UnavailableError("reply to append lost (injected)");
    return out;
  }

  Result<std::vector<Entry>> list(std::string_view queue, const ListOptions& options, Clock::time_point) override {
    auto read = read_queue(queue, options);
    if (!read.ok()) return read.status();
    return std::move(read->first);
  }

  Result<Entry> update_entry(std::string_view queue, std::string_view id, const EntryUpdate& update,
                             Clock::time_point) override {
    if (Status s = CheckQueue(queue); !s.ok()) return s;
    if (Status s = internal::CheckEntryValue(update.value); !s.ok()) return s;
    internal::MutexLock lock(state_->mu);
    state_->delay(lock.native(), "update");
    if (Status s = state_->inject("update"); !s.ok()) return s;
    if (Status s = state_->usable(id_); !s.ok()) return s;
    State::StoredEntry* mine = own_entry(queue, id);
    if (mine == nullptr) {
      return FailedPreconditionError("no entry " + std::string(id) + " of session " + id_ + " in " +
                                     std::string(queue));
    }
    const State::HeadMark before = state_->head_mark(queue);
    if (update.value) {
      mine->entry.value = update.value;
      ++mine->entry.value_version;
    }
    if (update.owner) mine->owner_json = EncodeOwnerRecord(*update.owner);
    Entry out = mine->entry;
    state_->note_head(queue, before);
    State::Settled woken = state_->settle(queue);  // head watchers, if it is the head
    const bool lost = state_->lose_reply("update");
    lock.unlock();
    State::deliver(std::move(woken));
    if (lost) return UnavailableError("reply to update lost (injected)");
    return out;
  }

  bool keeps_values() const noexcept override { return true; }

  // One reading under the store's lock; its position is the head clock then.
  void async_read_head(std::string_view queue, const ListOptions& options, Clock::time_point deadline,
                       std::function<void(Result<Head>)> done) override {
    done(read_head(queue, options, deadline));
  }
  Result<Head> read_head(std::string_view queue, const ListOptions& options, Clock::time_point) {
    ListOptions with_values = options;
    with_values.with_values = true;
    auto read = read_queue(queue, with_values);
    if (!read.ok()) return read.status();
    Head head;
    if (!read->first.empty()) head.entry = std::move(read->first.front());
    head.position = static_cast<std::int64_t>(read->second);
    return head;
  }

  // A watcher in the state, completed by whatever changes the queue's head
  // (State::settle_heads). Faults and delays injected for "watch_head" apply
  // here, on the calling thread.
  std::shared_ptr<void> async_watch_head(std::string_view queue, const Head& seen,
                                         std::function<void(Status)> done) override {
    auto outcome = std::make_shared<internal::OneOutcome>(std::move(done));
    std::uint64_t key = 0;
    std::optional<Status> now = register_head_watch(queue, seen, outcome, key);
    if (now) outcome->complete(std::move(*now));
    // Written out for each registry: a template shared by both would put
    // dlock::internal in the name of a type MemStore exports (package.exports).
    std::weak_ptr<State> weak = state_;
    return std::shared_ptr<void>(nullptr, [weak, queue = std::string(queue), key, outcome](void*) {
      if (auto state = weak.lock(); state && key != 0) {
        internal::MutexLock g(state->mu);
        auto it = state->head_watchers.find(queue);
        if (it != state->head_watchers.end()) {
          it->second.erase(key);
          if (it->second.empty()) state->head_watchers.erase(it);
        }
      }
      outcome->cancel();
    });
  }

  // The asynchronous wait, blocked on: it ends on the outcome, the deadline
  // (on the store's clock, which notifies `changed` when moved by hand) or
  // `stop`, and then cancels the wait.
  Status wait_any_gone(std::string_view queue, std::span<const std::string> ids, Clock::time_point deadline,
                       std::stop_token stop) override {
    auto result = std::make_shared<std::optional<Status>>();  // read and written under state_->mu
    std::shared_ptr<void> handle = async_wait_any_gone(queue, ids, [state = state_, result](Status s) {
      internal::MutexLock g(state->mu);
      *result = std::move(s);
      state->changed.notify_all();
    });
    {
      internal::MutexLock lock(state_->mu);
      // A suspended session keeps waiting: a real store's watch survives a
      // reconnect within the session.
      state_->clock->wait_until(state_->changed, lock.native(), stop, deadline, [&] { return result->has_value(); });
      if (result->has_value()) return **result;
    }
    handle.reset();  // kCancelled, unless an outcome came first
    internal::MutexLock lock(state_->mu);
    if (result->has_value() && (*result)->code() != ErrorCode::kCancelled) return **result;
    if (stop.stop_requested()) return CancelledError("wait cancelled");
    return DeadlineExceededError("deadline passed waiting in " + std::string(queue));
  }

  // A waiter in the state, completed by whatever removes an entry or ends a
  // session (State::settle). Faults and delays injected for "wait" apply
  // here, on the calling thread.
  std::shared_ptr<void> async_wait_any_gone(std::string_view queue, std::span<const std::string> ids,
                                            std::function<void(Status)> done) override {
    return start_wait(queue, ids, std::move(done), {}, {}, nullptr);
  }

  // Exact: the store reads our entry under the same lock as the removal
  // that wakes the wait.
  std::shared_ptr<void> async_wait_turn(std::string_view queue, std::span<const std::string> ids,
                                        std::span<const std::string> ahead, std::string_view own,
                                        std::function<void(Status, bool)> done) override {
    auto intact = std::make_shared<std::atomic<bool>>(false);
    return start_wait(
        queue, ids,
        [intact, done = std::move(done)](Status s) {
          const bool vouched = s.ok() && intact->load();
          done(std::move(s), vouched);
        },
        std::string(own), std::vector<std::string>(ahead.begin(), ahead.end()), intact);
  }

  // Either wait: `own_intact`, if given, is set when the wait is settled.
  std::shared_ptr<void> start_wait(std::string_view queue, std::span<const std::string> ids,
                                   std::function<void(Status)> done, std::string own, std::vector<std::string> ahead,
                                   std::shared_ptr<std::atomic<bool>> own_intact) {
    auto outcome = std::make_shared<internal::OneOutcome>(std::move(done));
    std::uint64_t key = 0;
    std::optional<Status> now =
        register_wait(queue, ids, outcome, key, std::move(own), std::move(ahead), std::move(own_intact));
    if (now) outcome->complete(std::move(*now));
    // Written out for each registry: a template shared by both would put
    // dlock::internal in the name of a type MemStore exports (package.exports).
    std::weak_ptr<State> weak = state_;
    return std::shared_ptr<void>(nullptr, [weak, queue = std::string(queue), key, outcome](void*) {
      if (auto state = weak.lock(); state && key != 0) {
        internal::MutexLock g(state->mu);
        auto it = state->waiters.find(queue);
        if (it != state->waiters.end()) {
          it->second.erase(key);
          if (it->second.empty()) state->waiters.erase(it);
        }
      }
      outcome->cancel();
    });
  }

  Status remove(std::string_view queue, std::string_view id, Clock::time_point) override {
    if (Status s = CheckQueue(queue); !s.ok()) return s;
    internal::MutexLock lock(state_->mu);
    state_->delay(lock.native(), "remove");
    if (Status s = state_->inject("remove"); !s.ok()) return s;
    if (Status s = state_->usable(id_); !s.ok()) return s;
    auto it = state_->queues.find(queue);
    State::Settled woken;
    if (it != state_->queues.end()) {
      const State::HeadMark before = state_->head_mark(queue);
      std::erase_if(it->second, [&](const State::StoredEntry& e) { return e.entry.id == id; });
      if (it->second.empty()) state_->queues.erase(it);
      state_->note_head(queue, before);
      woken = state_->settle(queue);
    }
    Status out = state_->lose_reply("remove") ? UnavailableError("reply to remove lost (injected)") : OkStatus();
    lock.unlock();
    State::deliver(std::move(woken));
    return out;
  }

  Result<std::optional<Entry>> find_own(std::string_view queue, std::string_view attempt_id,
                                        Clock::time_point) override {
    if (Status s = CheckQueue(queue); !s.ok()) return s;
    internal::MutexLock lock(state_->mu);
    state_->delay(lock.native(), "find_own");
    if (Status s = state_->inject("find_own"); !s.ok()) return s;
    if (Status s = state_->usable(id_); !s.ok()) return s;
    auto it = state_->queues.find(queue);
    if (it != state_->queues.end()) {
      for (const auto& e : it->second) {
        if (e.session == id_ && e.entry.attempt_id == attempt_id) return std::optional<Entry>(e.entry);
      }
    }
    return std::optional<Entry>();
  }

  void close() noexcept override {
    try {
      transition(state_, id_, SessionState::kClosed, [id = id_](State& s) {
        s.mu.assert_held();  // transition() runs `then` under mu
        s.drop_entries_of(id);
      });
    } catch (...) {  // out of memory: the entries stay until the store goes
    }
  }

 private:
  // Registers a wait under `key`, or returns its outcome if it has one at
  // once (then `key` stays 0).
  std::optional<Status> register_wait(std::string_view queue, std::span<const std::string> ids,
                                      const std::shared_ptr<internal::OneOutcome>& outcome, std::uint64_t& key,
                                      std::string own, std::vector<std::string> ahead,
                                      std::shared_ptr<std::atomic<bool>> own_intact) {
    if (Status s = CheckQueue(queue); !s.ok()) return s;
    if (ids.empty()) return InvalidArgumentError("wait_any_gone needs at least one entry id");
    internal::MutexLock lock(state_->mu);
    state_->delay(lock.native(), "wait");
    if (Status s = state_->inject("wait"); !s.ok()) return s;
    if (state_->ended(id_)) return state_->usable(id_);
    std::vector<std::string> wanted(ids.begin(), ids.end());
    if (state_->any_gone(queue, wanted)) {
      ++state_->ops["wake"];
      if (own_intact) own_intact->store(state_->vouches_for(queue, own, ahead));
      return OkStatus();
    }
    key = state_->next_waiter++;
    state_->waiters[std::string(queue)].emplace(
        key, State::Waiter{id_, std::string(queue), std::move(wanted), outcome, std::move(own), std::move(ahead),
                           std::move(own_intact)});
    return std::nullopt;
  }

  // One reading of `queue` (a "list" for the fault hooks): its entries, and
  // the head clock at that moment.
  Result<std::pair<std::vector<Entry>, std::uint64_t>> read_queue(std::string_view queue, const ListOptions& options) {
    if (Status s = CheckQueue(queue); !s.ok()) return s;
    internal::MutexLock lock(state_->mu);
    state_->delay(lock.native(), "list");
    if (Status s = state_->inject("list"); !s.ok()) return s;
    if (Status s = state_->usable(id_); !s.ok()) return s;
    auto entries = state_->snapshot(queue, options.with_owners, options.with_values);
    if (state_->lose_reply("list")) return UnavailableError("reply to list lost (injected)");
    return std::make_pair(std::move(entries), state_->head_clock);
  }

  // This session's entry `id` of `queue`, or nullptr.
  State::StoredEntry* own_entry(std::string_view queue, std::string_view id) DLOCK_REQUIRES(state_->mu) {
    auto it = state_->queues.find(queue);
    if (it == state_->queues.end()) return nullptr;
    for (auto& e : it->second) {
      if (e.entry.id == id && e.session == id_) return &e;
    }
    return nullptr;
  }

  // Registers a head watch under `key`, or returns its outcome if it has one
  // at once (then `key` stays 0).
  std::optional<Status> register_head_watch(std::string_view queue, const Head& seen,
                                            const std::shared_ptr<internal::OneOutcome>& outcome, std::uint64_t& key) {
    if (Status s = CheckQueue(queue); !s.ok()) return s;
    State::HeadMark mark;
    if (seen.entry) mark = {seen.entry->id, seen.entry->value_version};
    internal::MutexLock lock(state_->mu);
    state_->delay(lock.native(), "watch_head");
    if (Status s = state_->inject("watch_head"); !s.ok()) return s;
    if (state_->ended(id_)) return state_->usable(id_);
    if (!(state_->head_mark(queue) == mark) || state_->head_changed_since(queue, seen.position)) return OkStatus();
    key = state_->next_waiter++;
    state_->head_watchers[std::string(queue)].emplace(key, State::HeadWatcher{id_, std::move(mark), outcome});
    return std::nullopt;
  }

  const std::shared_ptr<State> state_;
  const std::string id_;
};

std::shared_ptr<MemStore> MemStore::create(MemStoreOptions options) {
  std::shared_ptr<MemStore> store(new MemStore());
  store->state_ = std::make_shared<State>();
  store->state_->clock = options.clock ? options.clock : Clock::system();
  std::weak_ptr<State> weak = store->state_;
  store->clock_subscription_ = store->state_->clock->on_advance([weak] {
    if (auto s = weak.lock()) {
      internal::MutexLock g(s->mu);
      s->changed.notify_all();
    }
  });
  return store;
}

MemStore::~MemStore() = default;

std::string MemStore::url() const { return "mem://"; }

Result<std::shared_ptr<Session>> MemStore::open_session(Clock::time_point deadline) {
  internal::MutexLock lock(state_->mu);
  state_->delay(lock.native(), "open_session");
  if (Status s = state_->inject("open_session"); !s.ok()) return s;
  if (state_->clock->now() >= deadline) return UnavailableError("no session before the deadline (slow store)");
  std::string id = "mem-" + std::to_string(state_->next_session++);
  state_->sessions[id];
  return std::shared_ptr<Session>(std::make_shared<MemSession>(state_, id));
}

void MemStore::suspend(std::string_view session_id) { transition(state_, session_id, SessionState::kSuspended); }

void MemStore::resume(std::string_view session_id) {
  // Only a suspended session can come back; Transition ignores ended ones.
  transition(state_, session_id, SessionState::kConnected);
}

void MemStore::expire(std::string_view session_id) {
  transition(state_, session_id, SessionState::kLost, [id = std::string(session_id)](State& s) {
    s.mu.assert_held();  // transition() runs `then` under mu
    s.drop_entries_of(id);
  });
}

void MemStore::fail_next(std::string_view op, Status status, int count) {
  internal::MutexLock g(state_->mu);
  auto& q = state_->failures[std::string(op)];
  for (int i = 0; i < count; ++i) q.push_back(status);
}

void MemStore::lose_next_reply(std::string_view op, int count) {
  internal::MutexLock g(state_->mu);
  state_->lost_replies[std::string(op)] += count;
}

void MemStore::delay_next(std::string_view op, Clock::duration by, int count) {
  internal::MutexLock g(state_->mu);
  auto& q = state_->delays[std::string(op)];
  for (int i = 0; i < count; ++i) q.push_back(by);
}

std::size_t MemStore::entry_count() const {
  internal::MutexLock g(state_->mu);
  std::size_t n = 0;
  for (const auto& [name, entries] : state_->queues) n += entries.size();
  return n;
}

std::uint64_t MemStore::op_count(std::string_view op) const {
  internal::MutexLock g(state_->mu);
  auto it = state_->ops.find(op);
  return it == state_->ops.end() ? 0 : it->second;
}

}  // namespace dlock
