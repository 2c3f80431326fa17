#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "core/client_core.hpp"
#include "core/dlock_thread.hpp"
#include "core/random_id.hpp"
#include "dlock/client.hpp"

namespace dlock {
namespace internal {

// ---------------------------------------------------------------- LocalGate

bool LocalGate::enter(const Clock& clock, Clock::time_point deadline, std::stop_token stop) {
  MutexLock lock(mu_);
  if (!busy_ && line_.empty()) {
    busy_ = true;
    return true;
  }
  Waiter me;
  line_.push_back(&me);
  auto my_turn = [&] {
    mu_.assert_held();  // run by wait_until under the lock
    return !busy_ && line_.front() == &me;
  };
  bool ok = clock.wait_until(me.cv, lock.native(), stop, deadline, my_turn);
  line_.remove(&me);
  if (ok) {
    busy_ = true;
  } else if (!busy_ && !line_.empty()) {
    line_.front()->cv.notify_one();  // we were first: pass the turn on
  }
  return ok;
}

bool LocalGate::try_enter() noexcept {
  MutexLock g(mu_);
  if (busy_ || !line_.empty()) return false;
  busy_ = true;
  return true;
}

void LocalGate::leave() noexcept {
  MutexLock g(mu_);
  busy_ = false;
  if (!line_.empty()) line_.front()->cv.notify_one();
}

bool LocalGate::idle() noexcept {
  MutexLock g(mu_);
  return !busy_ && line_.empty();
}

void LocalGate::poke() noexcept {
  MutexLock g(mu_);
  for (Waiter* w : line_) w->cv.notify_all();
}

// --------------------------------------------------------------- ClientCore

ClientCore::ClientCore(std::shared_ptr<Store> store, ClientOptions options)
    : store_(std::move(store)),
      options_(std::move(options)),
      clock_(options_.clock ? options_.clock : Clock::system()),
      executor_(std::make_unique<Executor>(clock_)) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) host_ = host;
  pid_ = getpid();
}

ClientCore::~ClientCore() {
  // First the executor: its timers (background removals) use the session.
  executor_.reset();
  std::jthread opener;
  std::shared_ptr<Session> session;
  {
    MutexLock g(mu_);
    opener = std::move(opener_thread_);
    session = std::move(session_);
  }
  // The opener holds a reference to this object while it works, so it is
  // either done (joined by on_last_user_gone, or not yet) or is the thread
  // running this destructor.
  JoinOrDetach(opener);
  if (session) session->close();
}

namespace {

// The control block of the user references: its end is the last one's.
struct UserRefs {
  explicit UserRefs(std::shared_ptr<ClientCore> e) : engine(std::move(e)) {}
  std::shared_ptr<ClientCore> engine;
  UserRefs(const UserRefs&) = delete;
  UserRefs& operator=(const UserRefs&) = delete;
  ~UserRefs() { engine->on_last_user_gone(); }
};

}  // namespace

std::shared_ptr<ClientCore> ClientCore::make(std::shared_ptr<Store> store, ClientOptions options) {
  auto engine = std::make_shared<ClientCore>(std::move(store), std::move(options));
  auto refs = std::make_shared<UserRefs>(engine);
  return std::shared_ptr<ClientCore>(refs, engine.get());  // counts in `refs`, points at the engine
}

void ClientCore::on_last_user_gone() noexcept {
  // From a dlock thread, joining could wait for this very thread, or for
  // one that waits for it (a ZooKeeper session thread closing a session the
  // opener is opening): the threads then end with the engine's last
  // reference (~ClientCore, which handles its own threads).
  if (OnDlockThread()) return;
  // Nobody can start an acquisition any more, so nobody waits for what the
  // opener opens: let it finish (at most the connect timeout).
  std::jthread opener;
  {
    MutexLock g(mu_);
    opener = std::move(opener_thread_);
  }
  if (opener.joinable()) opener.join();
  // No hold is left: what the session still has is released with it.
  close_session();
  // Background removals die with the session; tasks left are dropped.
  executor_->shut_down();
}

Result<std::shared_ptr<Session>> ClientCore::session(Clock::time_point deadline) {
  while (true) {
    std::shared_ptr<Session> ended;
    {
      MutexLock g(mu_);
      if (session_) {
        SessionState s = session_->state();
        if (s == SessionState::kConnected || s == SessionState::kSuspended) return session_;
        ended = std::move(session_);
      }
    }
    if (ended) {
      // With no lock held: a close may wait for the store's own threads,
      // which may be telling a listener that calls back into this client.
      ended->close();
      continue;
    }
    // One opener at a time, but without mu_: opening may block on the store,
    // and mu_ is also taken by clock callbacks that a slow store may wait for.
    MutexLock opening(open_mu_);
    {
      MutexLock g(mu_);
      if (session_) continue;  // another thread opened one meanwhile: look at it
    }
    Clock::time_point connect_deadline = std::min(deadline, DeadlineAfter(now(), options_.connect_timeout));
    auto opened = store_->open_session(connect_deadline);
    if (!opened.ok()) return opened.status();
    MutexLock g(mu_);
    session_ = *opened;
    return session_;
  }
}

SessionState ClientCore::session_state() const {
  MutexLock g(mu_);
  return session_ ? session_->state() : SessionState::kClosed;
}

void ClientCore::close_session() noexcept {
  std::shared_ptr<Session> session;
  {
    MutexLock g(mu_);
    session = std::move(session_);
  }
  if (session) session->close();
}

std::shared_ptr<Session> ClientCore::live_locked() const {
  if (!session_) return nullptr;
  const SessionState s = session_->state();
  return s == SessionState::kConnected || s == SessionState::kSuspended ? session_ : nullptr;
}

std::shared_ptr<Session> ClientCore::live_session() const {
  MutexLock g(mu_);
  return live_locked();
}

void ClientCore::async_session(Clock::time_point deadline, std::function<void(Result<std::shared_ptr<Session>>)> done) {
  std::shared_ptr<Session> live;
  {
    MutexLock g(mu_);
    live = live_locked();
    if (!live) {
      openers_.emplace_back(deadline, std::move(done));
      if (opener_running_) return;
      if (opener_thread_.joinable()) opener_thread_.join();  // done: it cleared opener_running_ last
      try {
        opener_thread_ = std::jthread([self = shared_from_this()] {
          MarkDlockThread("dlock-opener");
          self->open_sessions();
        });
      } catch (const std::exception& e) {  // no thread to be had: these waiters hear it now
        auto waiting = std::exchange(openers_, {});
        g.unlock();
        Status failed = UnavailableError(std::string("cannot start a thread to open a session: ") + e.what());
        for (auto& w : waiting) executor_->post([done = std::move(w.second), failed] { done(failed); });
        return;
      }
      opener_running_ = true;
      return;
    }
  }
  executor_->post([done = std::move(done), live = std::move(live)] { done(live); });
}

void ClientCore::open_sessions() {
  while (true) {
    decltype(openers_) waiting;
    Clock::time_point deadline = Clock::time_point::min();
    {
      MutexLock g(mu_);
      if (openers_.empty()) {
        opener_running_ = false;
        return;
      }
      waiting.swap(openers_);
    }
    // One open for all of them, as long as the most patient one allows: the
    // others give up on their own timers meanwhile.
    for (const auto& w : waiting) deadline = std::max(deadline, w.first);
    Result<std::shared_ptr<Session>> opened = session(deadline);
    for (auto& w : waiting) {
      executor_->post([done = std::move(w.second), opened] { done(opened); });
    }
  }
}

bool ClientCore::try_pending(Pending& p) noexcept {
  try {
    SessionState s = p.session->state();
    if (s == SessionState::kLost || s == SessionState::kClosed) return true;  // gone with the session
    Clock::time_point deadline = DeadlineAfter(now(), kRequestTimeout);
    if (p.id.empty()) {
      auto found = p.session->find_own(p.queue, p.attempt_id, deadline);
      if (!found.ok()) return found.status().code() == ErrorCode::kAborted;  // aborted: removed again
      if (!*found) return true;  // the append never happened, and now never will
      p.id = (*found)->id;
    }
    Status st = p.session->remove(p.queue, p.id, deadline);
    return st.ok() || st.code() == ErrorCode::kSessionLost || st.code() == ErrorCode::kNotFound ||
           st.code() == ErrorCode::kAborted;
  } catch (...) {
    return false;  // out of memory in the store, at worst: try again later
  }
}

void ClientCore::try_pending_async(std::shared_ptr<Pending> p, std::function<void(bool)> done) noexcept {
  try {
    SessionState s = p->session->state();
    if (s == SessionState::kLost || s == SessionState::kClosed) {  // gone with the session
      executor_->post([done = std::move(done)] { done(true); });
      return;
    }
    const Clock::time_point deadline = DeadlineAfter(now(), kRequestTimeout);
    std::weak_ptr<ClientCore> weak = weak_from_this();
    // Back on the executor, if this client is still there.
    auto on_executor = [weak](std::function<void()> step) {
      if (auto self = weak.lock()) self->executor_->post(std::move(step));
    };
    auto remove = [p, done, deadline, on_executor] {
      p->session->async_remove(p->queue, p->id, deadline, [done, on_executor](Status st) {
        bool finished = st.ok() || st.code() == ErrorCode::kSessionLost || st.code() == ErrorCode::kNotFound ||
                        st.code() == ErrorCode::kAborted;
        on_executor([done, finished] { done(finished); });
      });
    };
    if (!p->id.empty()) {
      remove();
      return;
    }
    p->session->async_find_own(p->queue, p->attempt_id, deadline,
                               [p, done, remove, on_executor](Result<std::optional<Entry>> found) {
                                 if (!found.ok()) {
                                   bool aborted = found.status().code() == ErrorCode::kAborted;  // removed again
                                   on_executor([done, aborted] { done(aborted); });
                                   return;
                                 }
                                 if (!*found) {  // the append never happened, and now never will
                                   on_executor([done] { done(true); });
                                   return;
                                 }
                                 p->id = (*found)->id;
                                 remove();
                               });
  } catch (...) {  // out of memory, at worst: try again later
    executor_->post([done = std::move(done)] { done(false); });
  }
}

void ClientCore::retry_later(Pending p) noexcept {
  try {
    // Error-recovery retries, not waits: 50 ms doubling to 2 s.
    const auto backoff = std::chrono::milliseconds(50) * (1 << std::min(p.failures, 5));
    auto shared = std::make_shared<Pending>(std::move(p));
    std::weak_ptr<ClientCore> weak = weak_from_this();
    executor_->at(DeadlineAfter(now(), std::min<Clock::duration>(backoff, std::chrono::seconds(2))), [weak, shared] {
      auto core = weak.lock();
      if (!core) return;
      core->try_pending_async(shared, [weak, shared](bool finished) {
        auto again = weak.lock();
        if (finished || !again) return;
        if (++shared->failures == 5) {
          again->report(UnavailableError("still retrying the removal of an entry in " + shared->queue));
        }
        again->retry_later(std::move(*shared));
      });
    });
  } catch (...) {
    report(InternalError("failed to schedule the removal of an entry in " + p.queue));
  }
}

void ClientCore::remove_guaranteed(const std::shared_ptr<Session>& session, const std::string& queue,
                                   const std::string& id) noexcept {
  try {
    Pending p{session, queue, id, {}, 0};
    if (!try_pending(p)) retry_later(std::move(p));
  } catch (...) {
    report(InternalError("failed to schedule removal of " + queue + "/" + id));
  }
}

void ClientCore::remove_async(const std::shared_ptr<Session>& session, const std::string& queue, const std::string& id,
                              std::function<void()> then) noexcept {
  try {
    auto p = std::make_shared<Pending>(Pending{session, queue, id, {}, 0});
    std::weak_ptr<ClientCore> weak = weak_from_this();
    try_pending_async(p, [weak, p, then = std::move(then)](bool finished) {
      if (auto self = weak.lock(); self && !finished) self->retry_later(std::move(*p));
      then();
    });
  } catch (...) {
    report(InternalError("failed to schedule removal of " + queue + "/" + id));
    executor_->post(std::move(then));
  }
}

void ClientCore::forget_attempt(const std::shared_ptr<Session>& session, const std::string& queue,
                                const std::string& attempt_id) noexcept {
  try {
    auto p = std::make_shared<Pending>(Pending{session, queue, {}, attempt_id, 0});
    std::weak_ptr<ClientCore> weak = weak_from_this();
    try_pending_async(p, [weak, p](bool finished) {
      if (auto self = weak.lock(); self && !finished) self->retry_later(std::move(*p));
    });
  } catch (...) {
    report(InternalError("failed to schedule clean-up of attempt " + attempt_id));
  }
}

// ---------------------------------------------------------------- LocalLine

LocalLine::Ticket LocalLine::new_ticket() {
  MutexLock g(mu_);
  return ++next_;
}

void LocalLine::join(Ticket ticket, std::function<void()> enter) {
  std::optional<Waiter> next;
  {
    MutexLock g(mu_);
    line_.emplace_back(ticket, std::move(enter));
    next = admit_next();
  }
  let_in(std::move(next));
}

bool LocalLine::abandon(Ticket ticket) {
  std::optional<Waiter> next;
  std::function<void()> removed;  // destroyed without mu_: it may own anything
  {
    MutexLock g(mu_);
    for (auto it = line_.begin(); it != line_.end(); ++it) {
      if (it->first != ticket) continue;
      removed = std::move(it->second);
      line_.erase(it);
      break;
    }
    next = admit_next();
  }
  let_in(std::move(next));
  return static_cast<bool>(removed);
}

void LocalLine::leave() {
  std::optional<Waiter> next;
  {
    MutexLock g(mu_);
    busy_ = false;
    next = admit_next();
  }
  let_in(std::move(next));
}

bool LocalLine::idle() const noexcept {
  MutexLock g(mu_);
  return !busy_ && line_.empty();
}

std::optional<LocalLine::Waiter> LocalLine::admit_next() {
  if (busy_ || line_.empty()) return std::nullopt;
  busy_ = true;
  Waiter next = std::move(line_.front());
  line_.pop_front();
  return next;
}

void LocalLine::let_in(std::optional<Waiter> next) {
  if (!next) return;
  try {
    next->second();
  } catch (...) {
    MutexLock g(mu_);
    busy_ = false;
    line_.push_front(std::move(*next));
  }
}

std::shared_ptr<LocalLine> ClientCore::line(const std::string& queue) {
  MutexLock g(lines_mu_);
  auto& slot = lines_[queue];
  if (!slot) slot = std::make_shared<LocalLine>();
  return slot;
}

void ClientCore::drop_line(const std::string& queue, std::shared_ptr<LocalLine> line) noexcept {
  MutexLock g(lines_mu_);
  auto it = lines_.find(queue);
  // The map's reference and ours mean nobody else has it (another reference
  // is only made under lines_mu_).
  if (it != lines_.end() && it->second == line && line.use_count() == 2 && line->idle()) lines_.erase(it);
}

std::string ClientCore::new_attempt_id() { return RandomHex(16); }

OwnerRecord ClientCore::owner(std::string thread) const {
  OwnerRecord o;
  o.host = host_;
  o.pid = pid_;
  o.thread = std::move(thread);
  o.label = options_.label;
  o.acquired_unix_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  return o;
}

void ClientCore::report(const Status& status) noexcept {
  if (!options_.on_background_error) return;
  try {
    options_.on_background_error(status);
  } catch (...) {
  }
}

}  // namespace internal

// ------------------------------------------------------------------- Client

Client Client::connect(std::string_view url, ClientOptions options) {
  auto client = open(url, std::move(options));
  if (!client.ok()) throw Error(client.status());
  return std::move(client).value();
}

Result<Client> Client::open(std::string_view url, ClientOptions options) {
  StoreOptions store_options{options.clock ? options.clock : Clock::system(), options.connect_timeout};
  auto store = OpenStore(url, store_options);
  if (!store.ok()) return store.status();
  return with_store(std::move(store).value(), std::move(options));
}

Client Client::with_store(std::shared_ptr<Store> store, ClientOptions options) {
  return Client(internal::ClientCore::make(std::move(store), std::move(options)));
}

std::string Client::url() const { return core_->store().url(); }

SessionState Client::session_state() const { return core_->session_state(); }

Result<std::shared_ptr<Session>> Client::session() const {
  return core_->session(DeadlineAfter(core_->now(), internal::ClientCore::kRequestTimeout));
}

Result<std::vector<Entry>> Client::list_entries(std::string_view queue, bool with_owners) const {
  auto session = this->session();
  if (!session.ok()) return session.status();
  ListOptions options;
  options.with_owners = with_owners;
  return (*session)->list(queue, options, DeadlineAfter(core_->now(), internal::ClientCore::kRequestTimeout));
}

Status Client::remove_entry(std::string_view queue, std::string_view id) const {
  auto session = this->session();
  if (!session.ok()) return session.status();
  return (*session)->remove(queue, id, DeadlineAfter(core_->now(), internal::ClientCore::kRequestTimeout));
}

void Client::close_session() noexcept { core_->close_session(); }

}  // namespace dlock
