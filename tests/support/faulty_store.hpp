// Test support: a Store decorator that injects faults into any store, in the
// manner of ClickHouse's ZooKeeperWithFaultInjection, so that the fault tests
// that MemStore's own hooks made possible run on every store.
//
//   auto faulty = std::make_shared<dlock::testing::FaultyStore>(real_store);
//   auto client = dlock::Client::with_store(faulty);
//   faulty->lose_next_reply("append");      // the append happens; the caller hears kUnavailable
//   faulty->expire(session_id);             // listeners hear kLost, then the real session closes
//
// Faults are the decorator's, so their semantics are the store contract's
// (store.hpp), whatever the store below: a suspension fails requests with
// kUnavailable and keeps the entries; an expiry tells the session's
// subscribers kLost before the real session is closed (its entries go then).
#ifndef DLOCK_TESTS_SUPPORT_FAULTY_STORE_HPP_
#define DLOCK_TESTS_SUPPORT_FAULTY_STORE_HPP_

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>

#include "dlock/store.hpp"

namespace dlock::testing {

class FaultyStore final : public Store, public std::enable_shared_from_this<FaultyStore> {
 public:
  explicit FaultyStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)), faults_(std::make_shared<Faults>()) {}

  std::string url() const override { return inner_->url(); }

  Result<std::shared_ptr<Session>> open_session(Clock::time_point deadline) override {
    if (Status s = faults_->Before("open_session"); !s.ok()) return s;
    auto inner = inner_->open_session(deadline);
    if (!inner.ok()) return inner.status();
    auto session = std::make_shared<FaultySession>(std::move(*inner), faults_);
    std::lock_guard<std::mutex> g(faults_->mu);
    faults_->sessions[session->id()] = session;
    return std::shared_ptr<Session>(session);
  }

  // The next `count` calls of `op` ("append", "list", "wait", "remove",
  // "find_own", "open_session", or "*") fail with `status` and do nothing.
  void fail_next(std::string_view op, Status status, int count = 1) {
    std::lock_guard<std::mutex> g(faults_->mu);
    for (int i = 0; i < count; ++i) faults_->failures[std::string(op)].push_back(status);
  }
  // The next `count` calls of `op` throw std::bad_alloc (memory running
  // out in the store) and do nothing.
  void throw_next(std::string_view op, int count = 1) {
    std::lock_guard<std::mutex> g(faults_->mu);
    faults_->throws[std::string(op)] += count;
  }
  // The next `count` calls of `op` take effect, but report kUnavailable.
  void lose_next_reply(std::string_view op, int count = 1) {
    std::lock_guard<std::mutex> g(faults_->mu);
    faults_->lost_replies[std::string(op)] += count;
  }
  // Contact lost: requests fail with kUnavailable, subscribers hear
  // kSuspended; entries stay. resume() undoes it.
  void suspend(const std::string& session_id) {
    WithSession(session_id, [](auto& s) { s.Suspend(); });
  }
  void resume(const std::string& session_id) {
    WithSession(session_id, [](auto& s) { s.Resume(); });
  }
  // Expiry: subscribers hear kLost first; then the real session is closed.
  void expire(const std::string& session_id) {
    WithSession(session_id, [](auto& s) { s.Expire(); });
  }

  // How many calls of `op` were made.
  std::uint64_t op_count(std::string_view op) const {
    std::lock_guard<std::mutex> g(faults_->mu);
    auto it = faults_->counts.find(std::string(op));
    return it == faults_->counts.end() ? 0 : it->second;
  }

 private:
  class FaultySession;
  struct Faults {
    mutable std::mutex mu;
    std::map<std::string, std::deque<Status>> failures;
    std::map<std::string, int> lost_replies;
    std::map<std::string, int> throws;
    std::map<std::string, std::uint64_t> counts;
    std::map<std::string, std::weak_ptr<FaultySession>> sessions;

    // Counts `op`; returns its injected failure, if any, or throws.
    Status Before(const std::string& op) {
      std::lock_guard<std::mutex> g(mu);
      ++counts[op];
      for (const std::string& key : {op, std::string("*")}) {
        auto it = throws.find(key);
        if (it != throws.end() && it->second > 0) {
          --it->second;
          throw std::bad_alloc();
        }
      }
      for (const std::string& key : {op, std::string("*")}) {
        auto it = failures.find(key);
        if (it != failures.end() && !it->second.empty()) {
          Status s = it->second.front();
          it->second.pop_front();
          return s;
        }
      }
      return OkStatus();
    }
    // True if this call's reply is to be lost.
    bool LoseReply(const std::string& op) {
      std::lock_guard<std::mutex> g(mu);
      for (const std::string& key : {op, std::string("*")}) {
        auto it = lost_replies.find(key);
        if (it != lost_replies.end() && it->second > 0) {
          --it->second;
          return true;
        }
      }
      return false;
    }
  };

  class FaultySession final : public Session, public std::enable_shared_from_this<FaultySession> {
   public:
    FaultySession(std::shared_ptr<Session> inner, std::shared_ptr<Faults> faults)
        : inner_(std::move(inner)), faults_(std::move(faults)), id_(inner_->id()) {}

    std::string id() const override { return id_; }
    SessionState state() const noexcept override {
      std::lock_guard<std::mutex> g(mu_);
      if (expired_) return SessionState::kLost;
      SessionState inner = inner_->state();
      if (suspended_ && inner == SessionState::kConnected) return SessionState::kSuspended;
      return inner;
    }
    // The store's own notes reach `fn` through the real session (so they
    // keep its order and threading); the injected ones come from the thread
    // that injects them.
    std::shared_ptr<void> subscribe(std::function<void(SessionState)> fn) override {
      auto shared = std::make_shared<std::function<void(SessionState)>>(std::move(fn));
      std::weak_ptr<FaultySession> weak = weak_from_this();
      auto inner_subscription = inner_->subscribe([weak, shared](SessionState s) {
        auto self = weak.lock();
        if (!self || !self->PassesThrough(s)) return;
        (*shared)(s);
      });
      std::uint64_t key;
      {
        std::lock_guard<std::mutex> g(mu_);
        key = next_key_++;
        subscribers_[key] = shared;
      }
      return std::shared_ptr<void>(nullptr, [weak, key, inner_subscription](void*) {
        if (auto self = weak.lock()) {
          std::lock_guard<std::mutex> g(self->mu_);
          self->subscribers_.erase(key);
        }
      });
    }

    Result<Appended> append(std::string_view q, const EntrySpec& spec, Clock::time_point d) override {
      if (Status s = Before("append"); !s.ok()) return s;
      auto r = inner_->append(q, spec, d);
      if (r.ok() && faults_->LoseReply("append")) return UnavailableError("reply to append lost (injected)");
      return r;
    }
    Result<std::vector<Entry>> list(std::string_view q, const ListOptions& o, Clock::time_point d) override {
      if (Status s = Before("list"); !s.ok()) return s;
      auto r = inner_->list(q, o, d);
      if (r.ok() && faults_->LoseReply("list")) return UnavailableError("reply to list lost (injected)");
      return r;
    }
    Status wait_any_gone(std::string_view q, std::span<const std::string> ids, Clock::time_point d,
                         std::stop_token stop) override {
      if (Status s = Before("wait"); !s.ok()) return s;
      Status r = inner_->wait_any_gone(q, ids, d, std::move(stop));
      if (Expired()) return SessionLostError("session " + id_ + " expired (injected)");
      return r;
    }
    Status remove(std::string_view q, std::string_view id, Clock::time_point d) override {
      if (Status s = Before("remove"); !s.ok()) return s;
      Status r = inner_->remove(q, id, d);
      if (r.ok() && faults_->LoseReply("remove")) return UnavailableError("reply to remove lost (injected)");
      return r;
    }
    Result<std::optional<Entry>> find_own(std::string_view q, std::string_view a, Clock::time_point d) override {
      if (Status s = Before("find_own"); !s.ok()) return s;
      auto r = inner_->find_own(q, a, d);
      if (r.ok() && faults_->LoseReply("find_own")) return UnavailableError("reply to find_own lost (injected)");
      return r;
    }
    void close() noexcept override { inner_->close(); }

    void Suspend() {
      {
        std::lock_guard<std::mutex> g(mu_);
        if (suspended_ || expired_) return;
        suspended_ = true;
      }
      Tell(SessionState::kSuspended);
    }
    void Resume() {
      {
        std::lock_guard<std::mutex> g(mu_);
        if (!suspended_ || expired_) return;
        suspended_ = false;
      }
      Tell(SessionState::kConnected);
    }
    void Expire() {
      {
        std::lock_guard<std::mutex> g(mu_);
        if (expired_) return;
        expired_ = true;
      }
      Tell(SessionState::kLost);  // holders first ...
      inner_->close();            // ... then the entries go
    }

   private:
    bool Expired() const {
      std::lock_guard<std::mutex> g(mu_);
      return expired_;
    }
    // The decorator's own faults first, then the contract's usual answers.
    Status Before(const std::string& op) {
      if (Status s = faults_->Before(op); !s.ok()) return s;
      std::lock_guard<std::mutex> g(mu_);
      if (expired_) return SessionLostError("session " + id_ + " expired (injected)");
      if (suspended_ && op != "wait") return UnavailableError("session " + id_ + " is suspended (injected)");
      return OkStatus();
    }
    // A note of the real session hides nothing the injected faults said.
    bool PassesThrough(SessionState s) const {
      std::lock_guard<std::mutex> g(mu_);
      if (expired_) return false;  // the injected expiry already said kLost
      return !(suspended_ && s == SessionState::kConnected);
    }
    // Injected notes, in order, without our lock (subscribers may call in).
    void Tell(SessionState s) {
      std::vector<std::shared_ptr<std::function<void(SessionState)>>> fns;
      {
        std::lock_guard<std::mutex> g(mu_);
        for (auto& [key, fn] : subscribers_) fns.push_back(fn);
      }
      for (auto& fn : fns) {
        try {
          (*fn)(s);
        } catch (...) {
        }
      }
    }

    const std::shared_ptr<Session> inner_;
    const std::shared_ptr<Faults> faults_;
    const std::string id_;
    mutable std::mutex mu_;
    bool suspended_ = false;  // guarded by mu_
    bool expired_ = false;    // guarded by mu_
    std::uint64_t next_key_ = 0;
    std::map<std::uint64_t, std::shared_ptr<std::function<void(SessionState)>>> subscribers_;  // guarded by mu_
  };

  template <typename F>
  void WithSession(const std::string& id, F f) {
    std::shared_ptr<FaultySession> s;
    {
      std::lock_guard<std::mutex> g(faults_->mu);
      auto it = faults_->sessions.find(id);
      if (it != faults_->sessions.end()) s = it->second.lock();
    }
    if (s) f(*s);
  }

  const std::shared_ptr<Store> inner_;
  const std::shared_ptr<Faults> faults_;
};

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_SUPPORT_FAULTY_STORE_HPP_
