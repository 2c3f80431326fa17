#include "recipes/acquire.hpp"

#include <algorithm>
#include <sstream>
#include <thread>

namespace dlock::internal {

Verdict ExclusiveRule(const std::vector<Entry>& queue, std::size_t ours) {
  if (ours == 0) return {true, {}};
  return {false, {queue[ours - 1].id}};
}

Verdict SharedRule(const std::vector<Entry>& queue, std::size_t ours) {
  for (std::size_t i = ours; i-- > 0;) {
    if (queue[i].kind != entry_kind::kRead) return {false, {queue[i].id}};
  }
  return {true, {}};
}

std::string ThisThreadLabel() {
  std::ostringstream out;
  out << "thread " << std::this_thread::get_id();
  return out.str();
}

namespace {

// How one pass on one session ended.
enum class PassEnd {
  kGranted,  // entry_ is granted
  kGaveUp,   // deadline or stop; our entry is removed (or going)
  kRequeue,  // the session ended, or our entry vanished: start again
  kError,    // error_ says why; our entry is removed (or going)
};

// What a look for our own entry, after an append of unknown outcome, found.
enum class Found { kYes, kNo, kEnded };

class Attempt {
 public:
  Attempt(ClientCore& client, const AcquireRequest& request) : client_(client), req_(request) {}
  Attempt(const Attempt&) = delete;
  Attempt& operator=(const Attempt&) = delete;

  // Reached with an entry of ours still placed only when an exception (an
  // allocation failing in a store, say) cut a pass short: remove it, or the
  // orphan would block the lock for as long as the session lives.
  ~Attempt() {
    if (placed_) client_.remove_guaranteed(placed_, req_.queue, entry_.id);
    if (unsettled_) client_.forget_attempt(unsettled_, req_.queue, unsettled_attempt_);
  }

  Result<std::optional<Acquired>> run() {
    // The first pass is made whatever the deadline (any timeout makes at
    // least one try, as for a TimedLockable); later ones only in time.
    for (bool first = true;; first = false) {
      if (stopped() || (!first && expired())) return std::optional<Acquired>();
      auto session = session_for_pass(first);
      if (!session.ok()) {
        // The caller's time ran out before the store answered: that is a
        // timeout, not proof that the store is down.
        if (session.status().code() == ErrorCode::kDeadlineExceeded || expired()) return std::optional<Acquired>();
        return session.status();
      }
      switch (pass(*session)) {
        case PassEnd::kGranted:
          placed_.reset();  // the caller owns it now
          return std::optional<Acquired>(Acquired{*session, entry_, std::move(granted_queue_)});
        case PassEnd::kGaveUp: return std::optional<Acquired>();
        case PassEnd::kError: return error_;
        case PassEnd::kRequeue:
          if (req_.session) return SessionLostError("session lost while acquiring " + req_.queue);
          continue;
      }
    }
  }

 private:
  bool stopped() const { return req_.stop.stop_requested(); }
  bool expired() const { return stopped() || client_.now() >= req_.deadline; }

  // The session of the next pass. A first pass whose deadline has already
  // passed is a try, and may take a try's time to open one.
  Result<std::shared_ptr<Session>> session_for_pass(bool first) {
    if (req_.session) return req_.session;
    Clock::time_point deadline = req_.deadline;
    if (first && client_.now() >= deadline) deadline = DeadlineAfter(client_.now(), ClientCore::kRequestTimeout);
    return client_.session(deadline);
  }

  static bool ended(const Session& session) {
    SessionState s = session.state();
    return s == SessionState::kLost || s == SessionState::kClosed;
  }

  // One pass on one session: place our entry, then wait for our turn.
  PassEnd pass(const std::shared_ptr<Session>& session) {
    std::optional<std::vector<Entry>> snapshot;
    if (std::optional<PassEnd> end = place_entry(session, snapshot)) return *end;
    return await_turn(session, std::move(snapshot));
  }

  // Step 1: appends our entry (entry_), adopting it if the reply was lost.
  // nullopt once placed; otherwise how the pass ends.
  std::optional<PassEnd> place_entry(const std::shared_ptr<Session>& session,
                                     std::optional<std::vector<Entry>>& snapshot) {
    while (true) {
      const std::string attempt = client_.new_attempt_id();
      EntrySpec spec{req_.kind, attempt, client_.owner(req_.thread), req_.sequence};
      unsettled_ = session;  // until the store says what became of the append
      unsettled_attempt_ = attempt;
      auto appended = session->append(req_.queue, spec, req_.deadline);
      if (appended.ok()) {
        placed(session, appended->entry);
        snapshot = std::move(appended->queue);
        return std::nullopt;
      }
      const Status& failed = appended.status();
      switch (failed.code()) {
        case ErrorCode::kSessionLost: return settled(PassEnd::kRequeue);    // its entries went with it
        case ErrorCode::kAborted: return settled(fail(undurable(failed)));  // the store left nothing
        case ErrorCode::kUnavailable: break;                                // the entry may or may not exist
        default: return settled(fail(failed));                              // refused: nothing was made
      }
      // The outcome is unknown: look for the entry by its attempt id.
      const Found found = find_attempt(session, attempt);
      unsettled_.reset();  // found, never made, or handed to the background clean-up
      switch (found) {
        case Found::kYes:
          if (!entry_.token)
            return give_up(session, fail(InternalError("store returned an own entry without a fencing token")));
          return std::nullopt;
        case Found::kNo:
          if (expired()) return PassEnd::kGaveUp;  // nothing was made; nothing to remove
          continue;                                // never made: a clean retry
        case Found::kEnded: return ended_;
      }
    }
  }

  // After an append of unknown outcome: finds our entry (into entry_) or
  // learns it was never made. Every way out that gives up leaves nothing
  // behind: the attempt is handed to the background clean-up.
  Found find_attempt(const std::shared_ptr<Session>& session, const std::string& attempt) {
    Backoff backoff;
    while (true) {
      if (!recover(session) || expired()) {
        if (ended(*session)) return end_with(expired() ? PassEnd::kGaveUp : PassEnd::kRequeue);
        client_.forget_attempt(session, req_.queue, attempt);
        return end_with(PassEnd::kGaveUp);
      }
      auto own = session->find_own(req_.queue, attempt, req_.deadline);
      if (own.ok()) {
        if (!own->has_value()) return Found::kNo;
        placed(session, **own);
        return Found::kYes;
      }
      switch (own.status().code()) {
        case ErrorCode::kSessionLost: return end_with(PassEnd::kRequeue);
        case ErrorCode::kAborted: return end_with(fail(undurable(own.status())));  // removed again
        case ErrorCode::kUnavailable: break;
        default: client_.forget_attempt(session, req_.queue, attempt); return end_with(fail(own.status()));
      }
      pause(backoff);
    }
  }

  // Step 2: looks at the queue and waits for what the rule names, until our
  // entry is granted. `snapshot` is the queue as the append read it, if the
  // store did (one round trip less).
  PassEnd await_turn(const std::shared_ptr<Session>& session, std::optional<std::vector<Entry>> snapshot) {
    Backoff backoff;
    while (true) {
      std::vector<Entry> queue;
      if (snapshot) {
        queue = std::move(*snapshot);
        snapshot.reset();
      } else {
        auto listed = session->list(req_.queue, {}, req_.deadline);
        if (!listed.ok()) {
          if (std::optional<PassEnd> end = after_failure(session, listed.status())) return *end;
          pause(backoff);
          continue;
        }
        queue = std::move(listed).value();
      }
      auto ours = std::find_if(queue.begin(), queue.end(), [&](const Entry& e) { return e.id == entry_.id; });
      if (ours == queue.end()) {
        // Our entry is gone: the session ended, or an operator removed it.
        // Say we no longer count on it (a store that checks the entries its
        // session holds, as Redis does, would otherwise end the session).
        if (!ended(*session)) client_.remove_guaranteed(session, req_.queue, entry_.id);
        placed_.reset();
        return PassEnd::kRequeue;
      }
      // A given sequence (downgrade) is granted by what the caller holds.
      const Verdict v =
          req_.sequence ? Verdict{true, {}} : req_.rule(queue, static_cast<std::size_t>(ours - queue.begin()));
      if (v.granted) {
        // A stop request wins over a grant that comes after it (a deadline
        // does not: a try is allowed its round trips).
        if (stopped()) return give_up(session);
        granted_queue_ = std::move(queue);
        return PassEnd::kGranted;
      }
      if (req_.try_only || expired()) return give_up(session);
      Status waited = session->wait_any_gone(req_.queue, v.wait_for, req_.deadline, req_.stop);
      switch (waited.code()) {
        case ErrorCode::kOk: continue;
        case ErrorCode::kDeadlineExceeded:
        case ErrorCode::kCancelled: return give_up(session);
        default:
          if (std::optional<PassEnd> end = after_failure(session, waited)) return *end;
          pause(backoff);
      }
    }
  }

  // A request failed while our entry exists: nullopt to try again (contact
  // is back), or how the pass ends.
  std::optional<PassEnd> after_failure(const std::shared_ptr<Session>& session, const Status& failed) {
    if (failed.code() == ErrorCode::kSessionLost) return gone(PassEnd::kRequeue);
    if (failed.code() != ErrorCode::kUnavailable) return give_up(session, fail(failed));
    if (recover(session) && !expired()) return std::nullopt;
    if (ended(*session)) return gone(expired() ? PassEnd::kGaveUp : PassEnd::kRequeue);
    return give_up(session);
  }

  // Our entry exists: entry_ is it, and it is ours to remove until granted.
  void placed(const std::shared_ptr<Session>& session, Entry entry) {
    entry_ = std::move(entry);
    placed_ = session;
    unsettled_.reset();
  }
  // The append's outcome is known and nothing was made.
  PassEnd settled(PassEnd end) {
    unsettled_.reset();
    return end;
  }
  // Our entry went with its session.
  PassEnd gone(PassEnd end) {
    placed_.reset();
    return end;
  }

  // Gives up with our entry placed: removes it and reports why.
  PassEnd give_up(const std::shared_ptr<Session>& session, PassEnd end = PassEnd::kGaveUp) {
    client_.remove_guaranteed(session, req_.queue, entry_.id);
    placed_.reset();
    return end;
  }

  PassEnd fail(Status s) {
    error_ = std::move(s);
    return PassEnd::kError;
  }

  Found end_with(PassEnd end) {
    ended_ = end;
    return Found::kEnded;
  }

  // The acquire's error when the store would not keep our entry durably.
  static Status undurable(const Status& s) { return UnavailableError(s.message()); }

  // After kUnavailable: waits for the session to come back. False if it did
  // not (deadline, stop, or the session ended).
  bool recover(const std::shared_ptr<Session>& session) {
    SessionState s = client_.await_not_suspended(*session, req_.deadline, req_.stop);
    return s == SessionState::kConnected;
  }

  // Retry pacing for requests that fail at once although the session says
  // it is connected: 5 ms doubling to 500 ms, cut short by the deadline and
  // by stop. These are error retries, not waits for the lock.
  struct Backoff {
    Clock::duration next = std::chrono::milliseconds(5);
  };
  void pause(Backoff& b) {
    client_.sleep_until(std::min(req_.deadline, DeadlineAfter(client_.now(), b.next)), req_.stop);
    b.next = std::min<Clock::duration>(b.next * 2, std::chrono::milliseconds(500));
  }

  ClientCore& client_;
  const AcquireRequest& req_;
  Entry entry_;
  std::shared_ptr<Session> placed_;     // set while entry_ exists and is ours to remove
  std::shared_ptr<Session> unsettled_;  // set while an append's outcome is unknown
  std::string unsettled_attempt_;
  std::vector<Entry> granted_queue_;
  Status error_;
  PassEnd ended_ = PassEnd::kGaveUp;  // how find_attempt's kEnded ends the pass
};

}  // namespace

Result<std::optional<Acquired>> AcquireEntry(ClientCore& client, const AcquireRequest& request) {
  if (!request.use_gate) return Attempt(client, request).run();
  std::shared_ptr<LocalGate> gate = client.gate(request.queue);
  if (!gate->enter(client.clock(), request.deadline, request.stop)) {
    client.drop_gate(request.queue, std::move(gate));
    return std::optional<Acquired>();
  }
  struct Leave {  // also on an exception, or the next thread waits forever
    ClientCore& client;
    const std::string& queue;
    std::shared_ptr<LocalGate> gate;
    ~Leave() {
      gate->leave();
      client.drop_gate(queue, std::move(gate));
    }
  } leave{client, request.queue, std::move(gate)};
  return Attempt(client, request).run();
}

}  // namespace dlock::internal
