#include "recipes/acquire.hpp"

#include "recipes/operation.hpp"

#include <algorithm>
#include <sstream>
#include <thread>
#include <utility>

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

// One acquisition (see operation.hpp for how its steps run). Its passes are
// those of ZooKeeper's lock recipe: place our entry, then wait for what the
// grant rule names, until granted; after a session loss, start again on a
// new session.
class Acquisition : public Operation<Acquisition> {
 public:
  Acquisition(std::shared_ptr<ClientCore> client, AcquireRequest request, AcquireDone done)
      : Operation(std::move(client), request.deadline, request.stop, request.failure),
        req_(std::move(request)),
        done_(std::move(done)) {}

  // On the calling thread. Our place in the process's line is taken here,
  // not in a step: one thread's acquisitions queue in the order it made
  // them, blocking and asynchronous alike, wherever their steps run. It is
  // taken before begin() is posted, so that a deadline or stop (armed in
  // begin()) always finds us in the line or let in, never not yet there
  // (review: an interrupt spent before the join left the acquire waiting
  // behind a local waiter for as long as that one waited). Being let in may
  // then come before begin(): each of the two looks for the other. Once
  // anything is posted, fields are the steps': the calling thread works on
  // copies.
  void start() {
    if (!req_.use_gate) return post(step([](Acquisition& self) { self.begin(); }));
    std::shared_ptr<LocalLine> line = client_->line(req_.queue);
    const LocalLine::Ticket ticket = line->new_ticket();
    line_ = line;
    ticket_ = ticket;
    line->join(ticket, then(Step([](Acquisition& a) { a.entered_line(); })));
    // Only line_ may count once the steps can run: drop_line() forgets an
    // idle line only if nobody else has a reference (review: a copy held
    // here while a quick acquisition ended on the executor kept an idle
    // line in the client's map).
    line.reset();
    try {
      post(step([](Acquisition& self) { self.begin(); }));
    } catch (
        ...) {  // out of memory: the place goes (entered_line(), if posted, finds no begin() and leaves line_ alone)
      if (!line_->abandon(ticket)) line_->leave();
      throw;
    }
  }

 private:
  friend class Operation<Acquisition>;

  // ------------------------------------------------------------ lifetime

  void begin() {
    begun_ = true;
    arm();
    if (!req_.use_gate || inside_line_) return start_pass(true);
    // In the line: a deadline or stop leaves it.
    on_interrupt_ = [this] {
      if (!line_->abandon(ticket_)) return;  // let in meanwhile: entered_line() follows
      drop_line();
      finish(std::optional<Acquired>());
    };
  }

  void entered_line() {
    inside_line_ = true;
    on_interrupt_ = nullptr;
    if (!begun_) return;  // let in at once, before begin() ran: begin() starts the pass
    // Let in before the deadline (or at once): the first pass is made, as
    // any timeout allows one try.
    start_pass(true);
  }

  void finish(AcquireOutcome outcome) {
    disarm();
    wait_.reset();
    if (inside_line_) line_->leave();
    drop_line();
    AcquireDone done = std::move(done_);
    try {
      done(std::move(outcome));
    } catch (...) {  // the caller's; nothing of ours to undo
    }
  }

  // Ends the acquisition after an exception inside a step.
  void abort(const char* what) {
    if (finished_) return;
    if (unsettled_) client_->forget_attempt(unsettled_, req_.queue, unsettled_attempt_);
    if (placed_) client_->remove_guaranteed(placed_, req_.queue, entry_.id);
    unsettled_.reset();
    placed_.reset();
    finish(InternalError(std::string("acquiring ") + req_.queue + ": " + what));
  }

  void drop_line() {
    if (line_) client_->drop_line(req_.queue, std::exchange(line_, nullptr));
  }

  // --------------------------------------------------------------- passes

  // The first pass is made whatever the deadline (any timeout makes at least
  // one try, as for a TimedLockable); later ones only in time.
  void start_pass(bool first) {
    if (stopped() || (!first && expired())) return finish(std::optional<Acquired>());
    if (req_.session) return on_session(req_.session);
    // A first pass whose deadline has already passed is a try, and may take
    // a try's time to open a session.
    Clock::time_point deadline = req_.deadline;
    if (first && client_->now() >= deadline) deadline = DeadlineAfter(client_->now(), ClientCore::kRequestTimeout);
    // While a session is opened, a deadline or stop ends the acquisition,
    // except that the first pass is a try whatever the deadline: only a stop
    // ends it (its open has a try's time; review finding: a 1 ns timeout on
    // a client without a session never tried).
    on_interrupt_ = [this, first] {
      if (!first || stopped()) finish(std::optional<Acquired>());
    };
    // The usual case: the client's session is there, no need to ask for it.
    if (std::shared_ptr<Session> live = client_->live_session()) return on_session(std::move(live));
    // Weakly: until it finishes, arm() keeps this alive; after that, a
    // reference here would keep the client alive for as long as the open
    // takes, after the caller has let go of everything.
    std::weak_ptr<Acquisition> weak = weak_from_this();
    client_->async_session(deadline, [weak](Result<std::shared_ptr<Session>> opened) {
      // On the executor, which need not be where the steps run.
      if (auto self = weak.lock()) {
        self->post(
            self->step([opened = std::move(opened)](Acquisition& a) mutable { a.on_session(std::move(opened)); }));
      }
    });
  }

  void on_session(Result<std::shared_ptr<Session>> opened) {
    on_interrupt_ = nullptr;
    if (!opened.ok()) {
      // The caller's time ran out before the store answered: that is a
      // timeout, not proof that the store is down.
      if (opened.status().code() == ErrorCode::kDeadlineExceeded || expired()) {
        return finish(std::optional<Acquired>());
      }
      return finish(opened.status());
    }
    session_ = std::move(opened).value();
    place_entry();
  }

  void pass_ended(PassEnd end) {
    switch (end) {
      case PassEnd::kGranted:
        placed_.reset();  // the caller owns it now
        return finish(std::optional<Acquired>(Acquired{session_, entry_, owner_, std::move(granted_queue_)}));
      case PassEnd::kGaveUp: return finish(std::optional<Acquired>());
      case PassEnd::kError: return finish(error_);
      case PassEnd::kRequeue:
        if (req_.session) return finish(SessionLostError("session lost while acquiring " + req_.queue));
        return start_pass(false);
    }
  }

  // ------------------------------------------------ step 1: our entry

  // Appends our entry (entry_), adopting it if the reply was lost.
  void place_entry() {
    attempt_ = client_->new_attempt_id();
    owner_ = client_->owner(req_.thread);
    EntrySpec spec{req_.kind, attempt_, owner_, req_.sequence, req_.value};
    unsettled_ = session_;  // until the store says what became of the append
    unsettled_attempt_ = attempt_;
    request<Result<Appended>>([&] { return session_->append(req_.queue, spec, req_.deadline); },
                              [&](auto done) { session_->async_append(req_.queue, spec, req_.deadline, done); },
                              [](Acquisition& a, Result<Appended> r) { a.on_appended(std::move(r)); });
  }

  void on_appended(Result<Appended> appended) {
    if (appended.ok()) {
      placed(appended->entry);
      return await_turn(std::move(appended->queue));
    }
    const Status& failed = appended.status();
    switch (failed.code()) {
      case ErrorCode::kSessionLost: return settled(PassEnd::kRequeue);    // its entries went with it
      case ErrorCode::kAborted: return settled(fail(undurable(failed)));  // the store left nothing
      case ErrorCode::kUnavailable: return find_attempt();                // it may or may not exist
      default: return settled(fail(failed));                              // refused: nothing was made
    }
  }

  // After an append of unknown outcome: finds our entry or learns it was
  // never made. Every way out that gives up leaves nothing behind: the
  // attempt is handed to the background clean-up.
  void find_attempt() {
    recover(session_, [](Acquisition& a, bool connected) {
      if (!connected || a.expired()) {
        if (ended(*a.session_)) return a.settled(a.expired() ? PassEnd::kGaveUp : PassEnd::kRequeue);
        a.client_->forget_attempt(a.session_, a.req_.queue, a.attempt_);
        return a.settled(PassEnd::kGaveUp);
      }
      a.request<Result<std::optional<Entry>>>(
          [&] { return a.session_->find_own(a.req_.queue, a.attempt_, a.req_.deadline); },
          [&](auto done) { a.session_->async_find_own(a.req_.queue, a.attempt_, a.req_.deadline, done); },
          [](Acquisition& b, Result<std::optional<Entry>> r) { b.on_found(std::move(r)); });
    });
  }

  void on_found(Result<std::optional<Entry>> own) {
    if (own.ok()) {
      if (!own->has_value()) {
        unsettled_.reset();  // never made, and now never will be
        if (expired()) return pass_ended(PassEnd::kGaveUp);
        return place_entry();  // a clean retry
      }
      placed(**own);
      if (!entry_.token) return give_up(fail(InternalError("store returned an own entry without a fencing token")));
      return await_turn(std::nullopt);
    }
    switch (own.status().code()) {
      case ErrorCode::kSessionLost: return settled(PassEnd::kRequeue);
      case ErrorCode::kAborted: return settled(fail(undurable(own.status())));  // removed again
      case ErrorCode::kUnavailable: return pause([](Acquisition& a) { a.find_attempt(); });
      default: client_->forget_attempt(session_, req_.queue, attempt_); return settled(fail(own.status()));
    }
  }

  // ---------------------------------------------- step 2: our turn

  // Looks at the queue (`snapshot`: as the append read it, if the store did:
  // one round trip less) and waits for what the rule names.
  void await_turn(std::optional<std::vector<Entry>> snapshot) {
    if (snapshot) return evaluate(std::move(*snapshot));
    request<Result<std::vector<Entry>>>([&] { return session_->list(req_.queue, {}, req_.deadline); },
                                        [&](auto done) { session_->async_list(req_.queue, {}, req_.deadline, done); },
                                        [](Acquisition& a, Result<std::vector<Entry>> listed) {
                                          if (listed.ok()) return a.evaluate(std::move(listed).value());
                                          a.after_failure(listed.status(),
                                                          [](Acquisition& b) { b.await_turn(std::nullopt); });
                                        });
  }

  void evaluate(std::vector<Entry> queue) {
    auto ours = std::find_if(queue.begin(), queue.end(), [&](const Entry& e) { return e.id == entry_.id; });
    if (ours == queue.end()) {
      // Our entry is gone: the session ended, or an operator removed it.
      // Say we no longer count on it (a store that checks the entries its
      // session holds, as Redis does, would otherwise end the session).
      if (!ended(*session_)) client_->remove_async(session_, req_.queue, entry_.id, [] {});
      placed_.reset();
      return pass_ended(PassEnd::kRequeue);
    }
    // A given sequence (downgrade) is granted by what the caller holds.
    const Verdict v =
        req_.sequence ? Verdict{true, {}} : req_.rule(queue, static_cast<std::size_t>(ours - queue.begin()));
    if (v.granted) {
      // A stop request wins over a grant that comes after it (a deadline
      // does not: a try is allowed its round trips).
      if (stopped()) return give_up();
      granted_queue_ = std::move(queue);
      return pass_ended(PassEnd::kGranted);
    }
    if (req_.try_only || expired()) return give_up();
    // A wait on this very thread (file://, for a blocking caller) gets no
    // vouching for our entry: it lists after the wake-up.
    turn_queue_ =
        waits_here(*session_) ? std::nullopt : next_in_line(queue, static_cast<std::size_t>(ours - queue.begin()), v);
    if (!turn_queue_) {
      return wait_any_gone(*session_, req_.queue, v.wait_for,
                           [](Acquisition& a, Status waited) { a.on_waited(std::move(waited)); });
    }
    auto waited = then<std::pair<Status, bool>>(
        [](Acquisition& a, std::pair<Status, bool> w) { a.on_waited(std::move(w.first), w.second); });
    wait_ = session_->async_wait_turn(
        req_.queue, v.wait_for, ahead_, entry_.id,
        [waited = std::move(waited)](Status s, bool own_intact) { waited(std::make_pair(std::move(s), own_intact)); });
    // The wait's own completion (kCancelled) follows the cancel.
    on_interrupt_ = [this] { wait_.reset(); };
  }

  // The queue as it will be once every entry ahead of ours is gone (their
  // ids in ahead_), if then the rule grants us at once and no entry can have
  // come in ahead of us meanwhile: entries only join at the back, except a
  // downgrade, which puts a read entry in the place of the write entry it
  // replaces (read_write_lock.cpp), ahead of the waiters behind it. So: one
  // entry waited for, no write entry ahead unless we are a reader (a read
  // entry in its place would not stop us), and the rule grants us first in
  // line. Otherwise nullopt: list after the wake-up.
  std::optional<std::vector<Entry>> next_in_line(const std::vector<Entry>& queue, std::size_t ours, const Verdict& v) {
    ahead_.clear();
    // The store reads every entry ahead with each check: deep in a long
    // queue, a plain wait and a list after it cost less.
    constexpr std::size_t kMaxAhead = 32;
    if (req_.sequence || ours == 0 || ours > kMaxAhead || v.wait_for.size() != 1) return std::nullopt;
    for (std::size_t i = 0; i < ours; ++i) {
      if (queue[i].kind == entry_kind::kWrite && req_.kind != entry_kind::kRead) return std::nullopt;
    }
    std::vector<Entry> next(queue.begin() + static_cast<std::ptrdiff_t>(ours), queue.end());
    if (!req_.rule(next, 0).granted) return std::nullopt;
    for (std::size_t i = 0; i < ours; ++i) ahead_.push_back(queue[i].id);
    return next;
  }

  // `own_intact`: the store vouches that our entry was still there when the
  // entry waited for and every other entry ahead of ours were seen gone
  // (Session::async_wait_turn); with a session that is still connected, we
  // are first, as a list then would have said: granted without that list.
  void on_waited(Status waited, bool own_intact = false) {
    wait_.reset();
    on_interrupt_ = nullptr;
    std::optional<std::vector<Entry>> next = std::exchange(turn_queue_, std::nullopt);
    switch (waited.code()) {
      case ErrorCode::kOk:
        if (own_intact && next && session_->state() == SessionState::kConnected) {
          return evaluate(std::move(*next));
        }
        return await_turn(std::nullopt);
      case ErrorCode::kDeadlineExceeded:
      case ErrorCode::kCancelled: return give_up();
      default: return after_failure(waited, [](Acquisition& a) { a.await_turn(std::nullopt); });
    }
  }

  // A request failed while our entry exists: `retry` after a pause once
  // contact is back, or the pass ends.
  void after_failure(const Status& failed, Step retry) {
    if (failed.code() == ErrorCode::kSessionLost) return gone(PassEnd::kRequeue);
    if (failed.code() != ErrorCode::kUnavailable) return give_up(fail(failed));
    recover(session_, [retry = std::move(retry)](Acquisition& a, bool connected) {
      if (connected && !a.expired()) return a.pause(retry);
      if (ended(*a.session_)) return a.gone(a.expired() ? PassEnd::kGaveUp : PassEnd::kRequeue);
      a.give_up();
    });
  }

  // ------------------------------------------------------- bookkeeping

  // Our entry exists: entry_ is it, and it is ours to remove until granted.
  void placed(Entry entry) {
    entry_ = std::move(entry);
    placed_ = session_;
    unsettled_.reset();
  }
  // The append's outcome is known and nothing was made.
  void settled(PassEnd end) {
    unsettled_.reset();
    pass_ended(end);
  }
  // Our entry went with its session. If the session says it still lives
  // (a store that answered kSessionLost for it early, or wrongly), the entry
  // is removed anyway: the next pass may append on that same session, and
  // must not leave this one behind.
  void gone(PassEnd end) {
    if (placed_ && !ended(*placed_)) client_->remove_guaranteed(placed_, req_.queue, entry_.id);
    placed_.reset();
    pass_ended(end);
  }
  // Gives up with our entry placed: removes it, then reports why (so that a
  // caller told "timed out" finds nothing of its own left in the store).
  void give_up(PassEnd end = PassEnd::kGaveUp) {
    std::shared_ptr<Session> session = std::exchange(placed_, nullptr);
    client_->remove_async(session, req_.queue, entry_.id, then(Step([end](Acquisition& a) { a.pass_ended(end); })));
  }
  PassEnd fail(Status s) {
    error_ = std::move(s);
    return PassEnd::kError;
  }
  // The acquire's error when the store would not keep our entry durably.
  static Status undurable(const Status& s) { return UnavailableError(s.message()); }

  const AcquireRequest req_;
  AcquireDone done_;

  std::shared_ptr<LocalLine> line_;
  LocalLine::Ticket ticket_ = 0;
  bool begun_ = false;
  bool inside_line_ = false;

  std::shared_ptr<Session> session_;  // this pass's
  std::string attempt_;
  OwnerRecord owner_;  // the attempt's
  Entry entry_;
  std::shared_ptr<Session> placed_;     // set while entry_ exists and is ours to remove
  std::shared_ptr<Session> unsettled_;  // set while an append's outcome is unknown
  std::string unsettled_attempt_;
  std::vector<Entry> granted_queue_;
  std::optional<std::vector<Entry>> turn_queue_;  // while waiting: next_in_line()
  std::vector<std::string> ahead_;                // its entries ahead of ours
  Status error_;
};

}  // namespace

void StartAcquire(const std::shared_ptr<ClientCore>& client, AcquireRequest request, AcquireDone done) {
  std::make_shared<Acquisition>(client, std::move(request), std::move(done))->start();
}

}  // namespace dlock::internal
