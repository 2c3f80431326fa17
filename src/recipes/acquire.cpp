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

bool Retryable(const Status& s) { return s.code() == ErrorCode::kUnavailable; }

// Why one pass on one session ended.
enum class PassEnd { kGranted, kGaveUp, kRequeue, kError };

class Attempt {
 public:
  Attempt(ClientCore& client, const AcquireRequest& request) : client_(client), req_(request) {}

  Result<std::optional<Acquired>> Run() {
    while (true) {
      if (Expired()) return std::optional<Acquired>();
      std::shared_ptr<Session> session = req_.session;
      if (!session) {
        auto opened = client_.session(req_.deadline);
        if (!opened.ok()) {
          // The caller's time ran out before the store answered: that is a
          // timeout, not proof that the store is down.
          if (opened.status().code() == ErrorCode::kDeadlineExceeded || Expired()) return std::optional<Acquired>();
          return opened.status();
        }
        session = *opened;
      }
      PassEnd end = Pass(session);
      switch (end) {
        case PassEnd::kGranted: return std::optional<Acquired>(Acquired{session, entry_, std::move(granted_queue_)});
        case PassEnd::kGaveUp: return std::optional<Acquired>();
        case PassEnd::kError: return error_;
        case PassEnd::kRequeue:
          if (req_.session) return SessionLostError("session lost while acquiring " + req_.queue);
          continue;
      }
    }
  }

 private:
  bool Expired() const { return req_.stop.stop_requested() || client_.now() >= req_.deadline; }

  // Gives up: removes our entry (known or maybe-created) and reports why.
  PassEnd GiveUp(const std::shared_ptr<Session>& session, bool have_entry, const std::string& attempt) {
    if (have_entry) {
      client_.remove_guaranteed(session, req_.queue, entry_.id);
    } else {
      client_.forget_attempt(session, req_.queue, attempt);
    }
    return PassEnd::kGaveUp;
  }

  PassEnd Fail(Status s) {
    error_ = std::move(s);
    return PassEnd::kError;
  }

  // After kUnavailable: waits for the session to come back. Returns false if
  // it did not (deadline, stop, or the session ended).
  bool Recover(const std::shared_ptr<Session>& session) {
    SessionState s = client_.await_not_suspended(*session, req_.deadline, req_.stop);
    return s == SessionState::kConnected;
  }

  PassEnd Pass(const std::shared_ptr<Session>& session) {
    const std::string attempt = client_.new_attempt_id();
    EntrySpec spec{req_.kind, attempt, client_.owner(req_.thread), req_.sequence};
    std::optional<std::vector<Entry>> snapshot;

    // 1. Append, adopting our entry if the reply was lost.
    auto appended = session->append(req_.queue, spec, req_.deadline);
    if (appended.ok()) {
      entry_ = appended->entry;
      snapshot = std::move(appended->queue);
    } else if (appended.status().code() == ErrorCode::kSessionLost) {
      return PassEnd::kRequeue;
    } else if (appended.status().code() == ErrorCode::kAborted) {
      // The store kept nothing (too few replicas, say): fail, leaving nothing.
      return Fail(UnavailableError(appended.status().message()));
    } else if (!Retryable(appended.status())) {
      return Fail(appended.status());
    } else {
      // The entry may or may not exist: look for it by attempt id.
      bool found = false;
      for (int tries = 0; tries < 1000 && !found; ++tries) {
        if (!Recover(session) || Expired()) {
          if (session->state() == SessionState::kLost || session->state() == SessionState::kClosed) {
            return Expired() ? PassEnd::kGaveUp : PassEnd::kRequeue;
          }
          return GiveUp(session, false, attempt);
        }
        auto own = session->find_own(req_.queue, attempt, req_.deadline);
        if (!own.ok()) {
          if (own.status().code() == ErrorCode::kSessionLost) return PassEnd::kRequeue;
          if (own.status().code() == ErrorCode::kAborted) return Fail(UnavailableError(own.status().message()));
          if (!Retryable(own.status())) return Fail(own.status());
          continue;
        }
        if (!own->has_value()) return Pass(session);  // never made: a clean retry
        entry_ = **own;
        found = true;
      }
      if (!found) return GiveUp(session, false, attempt);
      if (!entry_.token) return Fail(InternalError("store returned an own entry without a fencing token"));
    }

    // 2. Look, and wait for what the rule names, until granted.
    while (true) {
      std::vector<Entry> queue;
      if (snapshot) {
        queue = std::move(*snapshot);
        snapshot.reset();
      } else {
        auto listed = session->list(req_.queue, {}, req_.deadline);
        if (!listed.ok()) {
          if (listed.status().code() == ErrorCode::kSessionLost) return PassEnd::kRequeue;
          if (!Retryable(listed.status())) {
            client_.remove_guaranteed(session, req_.queue, entry_.id);
            return Fail(listed.status());
          }
          if (!Recover(session)) {
            if (session->state() == SessionState::kLost || session->state() == SessionState::kClosed) {
              return Expired() ? PassEnd::kGaveUp : PassEnd::kRequeue;
            }
            return GiveUp(session, true, attempt);
          }
          continue;
        }
        queue = std::move(listed).value();
      }
      auto ours = std::find_if(queue.begin(), queue.end(), [&](const Entry& e) { return e.id == entry_.id; });
      if (ours == queue.end()) {
        // Our entry is gone: the session ended, or an operator removed it.
        return PassEnd::kRequeue;
      }
      // A given sequence (downgrade) is granted by what the caller holds.
      const Verdict v =
          req_.sequence ? Verdict{true, {}} : req_.rule(queue, static_cast<std::size_t>(ours - queue.begin()));
      if (v.granted) {
        granted_queue_ = std::move(queue);
        return PassEnd::kGranted;
      }
      if (req_.try_only || Expired()) return GiveUp(session, true, attempt);
      Status waited = session->wait_any_gone(req_.queue, v.wait_for, req_.deadline, req_.stop);
      switch (waited.code()) {
        case ErrorCode::kOk:
          continue;
        case ErrorCode::kDeadlineExceeded:
        case ErrorCode::kCancelled:
          return GiveUp(session, true, attempt);
        case ErrorCode::kSessionLost:
          return PassEnd::kRequeue;
        case ErrorCode::kUnavailable:
          if (!Recover(session)) {
            if (session->state() == SessionState::kLost || session->state() == SessionState::kClosed) {
              return Expired() ? PassEnd::kGaveUp : PassEnd::kRequeue;
            }
            return GiveUp(session, true, attempt);
          }
          continue;
        default:
          client_.remove_guaranteed(session, req_.queue, entry_.id);
          return Fail(waited);
      }
    }
  }

  ClientCore& client_;
  const AcquireRequest& req_;
  Entry entry_;
  std::vector<Entry> granted_queue_;
  Status error_;
};

}  // namespace

Result<std::optional<Acquired>> AcquireEntry(ClientCore& client, const AcquireRequest& request) {
  if (!request.use_gate) return Attempt(client, request).Run();
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
  return Attempt(client, request).Run();
}

}  // namespace dlock::internal
