#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "core/client_core.hpp"
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
      clock_(options_.clock ? options_.clock : Clock::system()) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) host_ = host;
  pid_ = getpid();
  // A clock moved by hand must re-check the deadlines of local waiters.
  clock_subscription_ = clock_->on_advance([this] {
    MutexLock g(mu_);
    for (auto& [name, gate] : gates_) gate->poke();
    pending_cv_.notify_all();
  });
}

ClientCore::~ClientCore() {
  clock_subscription_.reset();
  if (retry_thread_.joinable()) {
    retry_thread_.request_stop();
    pending_cv_.notify_all();
    retry_thread_.join();
  }
  std::shared_ptr<Session> session;
  {
    MutexLock g(mu_);
    session = std::move(session_);
  }
  if (session) session->close();
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

SessionState ClientCore::await_not_suspended(Session& session, Clock::time_point deadline, std::stop_token stop) {
  // Shared with the subscription, which may still run after it is dropped.
  struct Waker {
    Mutex mu;  // guards nothing; the waits need one
    std::condition_variable_any cv;
  };
  auto waker = std::make_shared<Waker>();
  auto wake = [waker] {
    MutexLock g(waker->mu);
    waker->cv.notify_all();
  };
  auto sub = session.subscribe([wake](SessionState) { wake(); });
  auto advanced = clock_->on_advance(wake);
  MutexLock lock(waker->mu);
  clock_->wait_until(waker->cv, lock.native(), stop, deadline,
                     [&] { return session.state() != SessionState::kSuspended; });
  lock.unlock();
  sub.reset();
  return session.state();
}

void ClientCore::sleep_until(Clock::time_point until, std::stop_token stop) {
  struct Waker {  // shared with the clock subscription, which may outlive this call
    Mutex mu;     // guards nothing; the waits need one
    std::condition_variable_any cv;
  };
  auto waker = std::make_shared<Waker>();
  auto advanced = clock_->on_advance([waker] {
    MutexLock g(waker->mu);
    waker->cv.notify_all();
  });
  MutexLock lock(waker->mu);
  clock_->wait_until(waker->cv, lock.native(), stop, until, [] { return false; });
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

void ClientCore::remove_guaranteed(const std::shared_ptr<Session>& session, const std::string& queue,
                                   const std::string& id) noexcept {
  try {
    Pending p{session, queue, id, {}, 0};
    if (!try_pending(p)) enqueue(std::move(p));
  } catch (...) {
    report(InternalError("failed to schedule removal of " + queue + "/" + id));
  }
}

void ClientCore::forget_attempt(const std::shared_ptr<Session>& session, const std::string& queue,
                                const std::string& attempt_id) noexcept {
  try {
    Pending p{session, queue, {}, attempt_id, 0};
    if (!try_pending(p)) enqueue(std::move(p));
  } catch (...) {
    report(InternalError("failed to schedule clean-up of attempt " + attempt_id));
  }
}

void ClientCore::enqueue(Pending p) {
  MutexLock g(mu_);
  pending_.push_back(std::move(p));
  if (!retry_thread_.joinable()) {
    retry_thread_ = std::jthread([this](std::stop_token stop) { retry_loop(stop); });
  }
  pending_cv_.notify_all();
}

void ClientCore::retry_loop(std::stop_token stop) {
  auto backoff = std::chrono::milliseconds(50);
  while (!stop.stop_requested()) {
    std::deque<Pending> work;
    {
      MutexLock lock(mu_);
      clock_->wait_until(pending_cv_, lock.native(), stop, kNoDeadline, [&] {
        mu_.assert_held();  // run by wait_until under the lock
        return !pending_.empty();
      });
      if (stop.stop_requested()) return;
      work.swap(pending_);
    }
    // Whatever fails stays in `work` and goes back to the queue.
    std::erase_if(work, [this](Pending& p) {
      if (try_pending(p)) return true;
      if (++p.failures == 5) {
        try {
          report(UnavailableError("still retrying the removal of an entry in " + p.queue));
        } catch (...) {  // no memory for the message: the retry matters more
        }
      }
      return false;
    });
    if (work.empty()) {
      backoff = std::chrono::milliseconds(50);
      continue;
    }
    MutexLock lock(mu_);
    // The older ones first. If memory runs out here the newer ones are
    // dropped, and their entries stay until their session ends.
    try {
      for (auto& p : pending_) work.push_back(std::move(p));
    } catch (...) {
    }
    pending_.swap(work);
    // Back off before the next round: these are error-recovery retries, not waits.
    auto until = DeadlineAfter(now(), backoff);
    clock_->wait_until(pending_cv_, lock.native(), stop, until, [] { return false; });
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
}

std::shared_ptr<LocalGate> ClientCore::gate(const std::string& queue) {
  MutexLock g(mu_);
  auto& slot = gates_[queue];
  if (!slot) slot = std::make_shared<LocalGate>();
  return slot;
}

void ClientCore::drop_gate(const std::string& queue, std::shared_ptr<LocalGate> gate) noexcept {
  MutexLock g(mu_);
  auto it = gates_.find(queue);
  // Handed out only under mu_: the map's reference and ours mean nobody else has it.
  if (it != gates_.end() && it->second == gate && gate.use_count() == 2 && gate->idle()) gates_.erase(it);
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
  return Client(std::make_shared<internal::ClientCore>(std::move(store), std::move(options)));
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
