#include "stores/zookeeper/zk_session.hpp"

#include <zookeeper/zookeeper.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <unordered_map>
#include <unordered_set>

#include "stores/zookeeper/zk_names.hpp"

namespace dlock::internal::zk {
namespace {

using std::chrono::milliseconds;

std::string Hex(std::int64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string Millis(Clock::duration d) {
  return std::to_string(std::chrono::duration_cast<milliseconds>(d).count()) + "ms";
}

// True if `rc` is an answer from a server (so the request reached it), as
// opposed to a failure of the connection or of the handle.
bool ServerAnswered(int rc) {
  if (rc == ZOK) return true;
  if (rc > ZAPIERROR) return false;  // system errors: connection loss, timeouts, ...
  switch (rc) {
    case ZSESSIONEXPIRED:
    case ZINVALIDCALLBACK:
    case ZAUTHFAILED:
    case ZCLOSING:
    case ZNOTHING:
    case ZSESSIONMOVED:
    case ZSESSIONCLOSEDREQUIRESASLAUTH:
    case ZTHROTTLEDOP: return false;
    default: return true;
  }
}

// A connection problem: the request may or may not have taken effect, and the
// session itself is fine (the C client is reconnecting).
bool ConnectionTrouble(int rc) {
  return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT || rc == ZSESSIONMOVED || rc == ZTHROTTLEDOP ||
         rc == ZNOTREADONLY || rc == ZSYSTEMERROR;
}

// How long before the earliest possible server-side expiry the session
// thread declares kLost: a tenth of the session timeout, at most a second.
Clock::duration LostMargin(Clock::duration timeout) {
  return std::min<Clock::duration>(timeout / 10, std::chrono::seconds(1));
}

// The longest a leader may go between two pings to a follower, as we assume
// it: a leader pings every tickTime/2, and the server never grants a session
// timeout below minSessionTimeout, 2 * tickTime by default, so tickTime/2 is
// at most a quarter of the timeout. A third leaves the leader's ping loop a
// twelfth of the timeout of lateness. (See the heartbeat notes in Core.)
Clock::duration LeaderPingBound(Clock::duration timeout) { return timeout / 3; }

// The pause between a heartbeat's answer and the next heartbeat. Safety does
// not depend on it (only on LeaderPingBound); shorter pauses keep the basis
// fresher: it lags by about LeaderPingBound + 3 pauses + 4 round trips at
// worst, half the timeout plus round trips, against a deadline at 0.9.
Clock::duration HeartbeatPause(Clock::duration timeout) { return timeout / 18; }

// The C client's log lines go to a per-handle callback (zookeeper_init2), so
// dlock never touches the library-wide log stream or level that the
// application may have set. They are dropped unless DLOCK_ZK_LOG is set.
void DropLog(const char*) {}
void StderrLog(const char* message) { std::fprintf(stderr, "zookeeper: %s\n", message); }

}  // namespace

// ------------------------------------------------------------ requests

struct Batch;

// One request's reply, filled by its completion callback.
struct Slot {
  Batch* batch = nullptr;
  int rc = ZSYSTEMERROR;
  bool done = false;  // guarded by Core::mu_
  Stat stat{};
  std::string value;               // created path, or node data
  std::vector<std::string> names;  // children
};

// Requests sent back to back and waited for together. While any reply is
// outstanding, Core::inflight_ owns the batch, so a callback can always reach
// it even if the caller has stopped waiting.
struct Batch {
  enum class Purpose { kRequest, kHeartbeat, kProbe };
  explicit Batch(Core* c, Purpose p = Purpose::kRequest) : core(c), purpose(p) {}

  Core* const core;
  const Purpose purpose;
  std::vector<std::function<int(zhandle_t*, Slot*)>> ops;  // filled before Send
  std::unique_ptr<Slot[]> slots;
  std::size_t size = 0;
  int pending = 0;  // guarded by Core::mu_
  Clock::time_point sent;
  std::condition_variable_any cv;

  Slot& operator[](std::size_t i) { return slots[i]; }
};

Slot* AsSlot(const void* data) { return static_cast<Slot*>(const_cast<void*>(data)); }

// A wait_any_gone call in progress. Lives on the waiting thread's stack and
// is registered with the core (under its mutex) for the duration.
struct Waiter {
  std::condition_variable_any cv;
  std::vector<std::string> paths;
  std::set<std::string> fired;  // watches that fired without a delete; re-arm
  bool gone = false;            // a watched entry was deleted
};

// ---------------------------------------------------------------- Core

class Core : public std::enable_shared_from_this<Core> {
 public:
  enum class Phase { kConnecting, kOpen, kFailed, kEnded };

  Core(std::shared_ptr<const Config> config, std::shared_ptr<Clock> clock)
      : cfg_(std::move(config)), clock_(std::move(clock)) {}
  ~Core() {
    clock_sub_.reset();
    CloseHandle();
  }

  const Config& cfg() const { return *cfg_; }
  Clock& clock() const { return *clock_; }

  void Init();
  void Run(std::stop_token stop);
  void Close() noexcept;

  // --- Requests.
  std::shared_ptr<Batch> NewBatch() { return std::make_shared<Batch>(this); }
  void Send(const std::shared_ptr<Batch>& b);
  // Waits for every reply of `b` until `until`; kUnavailable if one is missing.
  Status Await(Batch& b, Clock::time_point until, const std::string& what);
  // Requests may overrun a deadline by one round trip: a call made with a
  // deadline already past still gets its answer.
  Clock::time_point ReplyDeadline(Clock::time_point deadline) const {
    std::lock_guard<std::mutex> g(mu_);
    return std::max(deadline, DeadlineAfter(clock_->now(), std::max<Clock::duration>(timeout_ / 3, milliseconds(200))));
  }
  // OK if requests can be sent now; kUnavailable while suspended;
  // kSessionLost once lost or closed.
  Status Usable();
  Status Error(int rc, std::string_view op, std::string_view path);
  std::int64_t session_id() const {
    std::lock_guard<std::mutex> g(mu_);
    return sid_;
  }

  // --- Callbacks from the C client (completion thread).
  static void OnGlobalEvent(zhandle_t* zh, int type, int state, const char* path, void* ctx);
  static void OnNodeEvent(zhandle_t* zh, int type, int state, const char* path, void* ctx);
  static void OnAuth(int rc, const void* data);
  // `rc` of one request; `from_server`: a completion of the C client, not a
  // local refusal at submission.
  void Finish(Slot* slot, int rc, bool from_server = true);

  // Shared by ZkSession's methods.
  mutable std::mutex mu_;
  Phase phase_ = Phase::kConnecting;                                 // guarded by mu_
  SessionState state_ = SessionState::kConnected;                    // meaningful once kOpen; guarded by mu_
  std::uint64_t state_gen_ = 0;                                      // bumps on every change; guarded by mu_
  std::unordered_map<std::string, std::vector<Waiter*>> watch_map_;  // guarded by mu_
  std::unordered_set<Waiter*> waiters_;                              // guarded by mu_
  std::condition_variable_any connect_cv_;

  // Requires mu_: the error for a session that can no longer be used, or OK.
  // Folds in the lost deadline first (FoldClockLocked).
  Status EndedLocked();

  // Requires mu_: declares the session lost if the clock has passed its lost
  // deadline, whether or not the session thread has noticed yet, so that
  // every reader agrees on the moment (store.hpp, state()) and nothing that
  // happens later (a late reply) can make the session unlost.
  void FoldClockLocked();
  // Requires mu_: when this process counts the session lost.
  Clock::time_point LostAtLocked() const { return basis_ + timeout_ - LostMargin(timeout_); }
  // Requires mu_: the negotiated session timeout.
  Clock::duration TimeoutLocked() const { return timeout_; }

  // --- Subscribers.
  struct Sub {
    std::shared_ptr<std::function<void(SessionState)>> fn;
    std::uint64_t since;  // hears only notes newer than this
  };
  std::map<std::uint64_t, Sub> subs_;  // guarded by mu_
  std::uint64_t next_sub_ = 0;         // guarded by mu_
  std::uint64_t note_seq_ = 0;         // guarded by mu_

  void SubscribeClock() {
    std::weak_ptr<Core> weak = weak_from_this();
    clock_sub_ = clock_->on_advance([weak] {
      if (auto core = weak.lock()) {
        std::lock_guard<std::mutex> g(core->mu_);
        core->WakeAllLocked();
      }
    });
  }

 private:
  void OnSessionState(zhandle_t* zh, int zstate);
  void OnPathEvent(int type, const char* path);
  void OnBatchDoneLocked(Batch& b);
  void OnHeartbeatLocked(const Batch& b);
  void NoteLocked(SessionState s);
  void WakeAllLocked();
  void FailLocked(Status why);
  void LoseLocked(std::string why);
  void CloseHandle() noexcept;
  void SendControl(Batch::Purpose purpose);

  const std::shared_ptr<const Config> cfg_;
  const std::shared_ptr<Clock> clock_;
  std::shared_ptr<void> clock_sub_;

  // The handle. Requests are submitted under a shared lock; CloseHandle takes
  // it exclusively to swap in nullptr, so no submission can touch a closed
  // handle. Never held while waiting for a reply.
  mutable std::shared_mutex zh_mu_;
  zhandle_t* zh_ = nullptr;  // guarded by zh_mu_

  std::atomic<std::thread::id> thread_id_{};  // the session thread, once running

  // Guarded by mu_:
  Status failure_;           // why phase_ is kFailed
  std::string lost_reason_;  // why state_ is kLost
  std::int64_t sid_ = 0;
  Clock::duration timeout_ = milliseconds(10'000);  // negotiated session timeout
  Clock::time_point connect_deadline_ = kNoDeadline;
  // The lost deadline's basis: a moment no later than the leader's last
  // touch of the session that we know of (see the heartbeat notes).
  Clock::time_point basis_{};
  // The send time of the newest request a server answered: sent before the
  // current connection, once a reconnect has been reported.
  Clock::time_point last_answered_sent_{};
  // Heartbeats (syncs) answered on the current connection, oldest first.
  struct Beat {
    Clock::time_point sent, answered;
  };
  std::deque<Beat> beats_;
  Clock::time_point hb_answered_{};  // when the last heartbeat ended
  bool c_connected_ = false;         // the C client reports ZOO_CONNECTED_STATE
  bool probe_needed_ = false, probe_in_flight_ = false;
  bool hb_in_flight_ = false, hb_now_ = false;
  Clock::time_point hb_not_before_{};
  bool close_needed_ = false, close_claimed_ = false;
  bool handle_closed_ = false;             // CloseHandle has finished
  std::condition_variable_any closed_cv_;  // Close waits on it for the session thread
  bool wake_ = false;
  std::condition_variable_any cv_;                            // wakes the session thread
  std::deque<std::pair<std::uint64_t, SessionState>> notes_;  // state changes to deliver
  std::unordered_map<Batch*, std::shared_ptr<Batch>> inflight_;
};

void Core::Init() {
  Clock::time_point start = clock_->now();
  int timeout_ms = static_cast<int>(cfg_->session_timeout.count());
  log_callback_fn log = std::getenv("DLOCK_ZK_LOG") ? StderrLog : DropLog;
  {
    std::lock_guard<std::mutex> g(mu_);
    connect_deadline_ = DeadlineAfter(start, cfg_->connect_timeout);
    timeout_ = cfg_->session_timeout;
    // The leader touches a new session when it creates it, which is after
    // the C client sent its connect request, which is after now.
    basis_ = start;
  }
  errno = 0;
  zhandle_t* zh =
      zookeeper_init2(cfg_->hosts.c_str(), &Core::OnGlobalEvent, timeout_ms, nullptr, this, ZOO_NO_LOG_CLIENTENV, log);
  if (zh == nullptr) {
    int err = errno;
    std::lock_guard<std::mutex> g(mu_);
    std::string why = err ? std::strerror(err) : "unknown error";
    if (err == EINVAL) {
      FailLocked(InvalidArgumentError("ZooKeeper client rejected the hosts of " + cfg_->redacted_url +
                                      " (unresolvable or malformed: " + why + ")"));
    } else {
      FailLocked(UnavailableError("cannot start a ZooKeeper client for " + cfg_->redacted_url + ": " + why));
    }
    return;
  }
  {
    std::unique_lock<std::shared_mutex> w(zh_mu_);
    zh_ = zh;
  }
  if (!cfg_->digest.empty()) {
    // Queued now, sent as part of every (re)connection handshake.
    int rc =
        zoo_add_auth(zh, "digest", cfg_->digest.data(), static_cast<int>(cfg_->digest.size()), &Core::OnAuth, this);
    if (rc != ZOK) {
      std::lock_guard<std::mutex> g(mu_);
      FailLocked(UnauthenticatedError("cannot send credentials for " + cfg_->redacted_url + ": " + zerror(rc)));
    }
  }
}

// --- The session thread.
void Core::Run(std::stop_token stop) {
  thread_id_ = std::this_thread::get_id();
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    if (!notes_.empty()) {  // 1. state changes, oldest first, without our lock
      auto [seq, s] = notes_.front();
      notes_.pop_front();
      std::vector<std::shared_ptr<std::function<void(SessionState)>>> fns;
      for (auto& [key, sub] : subs_) {
        if (sub.since < seq) fns.push_back(sub.fn);
      }
      lk.unlock();
      for (auto& fn : fns) {
        try {
          (*fn)(s);
        } catch (...) {  // a listener's exception must not kill the session thread
        }
      }
      fns.clear();
      lk.lock();
      continue;
    }
    if (close_needed_ && !close_claimed_) {  // 2. a lost or closed handle goes at once
      lk.unlock();
      CloseHandle();
      lk.lock();
      continue;
    }
    if (stop.stop_requested()) break;
    Clock::time_point now = clock_->now();
    Clock::time_point next = kNoDeadline;
    if (phase_ == Phase::kConnecting) {
      if (now >= connect_deadline_) {
        FailLocked(UnavailableError("no ZooKeeper server of " + cfg_->redacted_url + " answered within " +
                                    Millis(cfg_->connect_timeout) + " (down, unreachable, or not ZooKeeper)"));
        continue;
      }
      if (probe_needed_ && c_connected_ && !probe_in_flight_) {
        probe_needed_ = false;
        probe_in_flight_ = true;
        lk.unlock();
        SendControl(Batch::Purpose::kProbe);
        lk.lock();
        continue;
      }
      next = connect_deadline_;
    } else if (phase_ == Phase::kOpen) {
      // 3. The lost-timer. The leader expires the session no earlier than
      // `timeout_` after its last touch of it, which was no earlier than
      // basis_. We declare the loss a margin before that point, so that a
      // holder has time to stop before the leader can hand its locks on.
      Clock::time_point lost_at = LostAtLocked();
      if (now >= lost_at) {
        FoldClockLocked();
        continue;
      }
      next = lost_at;
      // 4. Heartbeats (syncs, one at a time) move basis_ forward.
      if (state_ == SessionState::kConnected && !hb_in_flight_) {
        Clock::time_point hb_at = hb_now_ ? now : hb_answered_ + HeartbeatPause(timeout_);
        hb_at = std::max(hb_at, hb_not_before_);
        if (now >= hb_at) {
          hb_now_ = false;
          hb_in_flight_ = true;
          lk.unlock();
          SendControl(Batch::Purpose::kHeartbeat);
          lk.lock();
          continue;
        }
        next = std::min(next, hb_at);
      }
    }
    wake_ = false;
    clock_->wait_until(cv_, lk, stop, next,
                       [&] { return wake_ || !notes_.empty() || (close_needed_ && !close_claimed_); });
  }
}

void Core::SendControl(Batch::Purpose purpose) {
  auto b = std::make_shared<Batch>(this, purpose);
  if (purpose == Batch::Purpose::kProbe && !cfg_->chroot.empty()) {
    // Reading the chroot checks the credentials against its ACL.
    std::string path = cfg_->chroot;
    b->ops.push_back([path](zhandle_t* zh, Slot* s) {
      return zoo_aget(
          zh, path.c_str(), 0,
          [](int rc, const char*, int, const Stat*, const void* data) {
            AsSlot(data)->batch->core->Finish(AsSlot(data), rc);
          },
          s);
    });
  } else if (purpose == Batch::Purpose::kProbe) {
    b->ops.push_back([](zhandle_t* zh, Slot* s) {
      return zoo_aexists(
          zh, "/", 0,
          [](int rc, const Stat*, const void* data) { AsSlot(data)->batch->core->Finish(AsSlot(data), rc); }, s);
    });
  } else {
    b->ops.push_back([](zhandle_t* zh, Slot* s) {
      return zoo_async(
          zh, "/", [](int rc, const char*, const void* data) { AsSlot(data)->batch->core->Finish(AsSlot(data), rc); },
          s);
    });
  }
  Send(b);
}

void Core::Send(const std::shared_ptr<Batch>& b) {
  b->size = b->ops.size();
  b->slots = std::make_unique<Slot[]>(b->size);
  for (std::size_t i = 0; i < b->size; ++i) b->slots[i].batch = b.get();
  {
    std::lock_guard<std::mutex> g(mu_);
    b->pending = static_cast<int>(b->size);
    inflight_.emplace(b.get(), b);
  }
  std::shared_lock<std::shared_mutex> zl(zh_mu_);
  b->sent = clock_->now();
  for (std::size_t i = 0; i < b->size; ++i) {
    // Back to back, without waiting: the server answers them in this order.
    int rc = zh_ ? b->ops[i](zh_, &b->slots[i]) : ZCLOSING;
    if (rc != ZOK) Finish(&b->slots[i], rc, /*from_server=*/false);  // refused locally: no callback will come
  }
}

Status Core::Await(Batch& b, Clock::time_point until, const std::string& what) {
  std::unique_lock<std::mutex> lk(mu_);
  clock_->wait_until(b.cv, lk, {}, until, [&] { return b.pending == 0; });
  if (b.pending == 0) return OkStatus();
  return UnavailableError("no answer from ZooKeeper to " + what + " before the deadline; the outcome is unknown");
}

void Core::Finish(Slot* slot, int rc, bool from_server) {
  std::shared_ptr<Batch> finished;  // released after the lock: may be the last owner
  std::lock_guard<std::mutex> g(mu_);
  Batch* b = slot->batch;
  slot->rc = rc;
  slot->done = true;
  FoldClockLocked();  // a reply after the deadline does not move it
  if (from_server && ServerAnswered(rc)) last_answered_sent_ = std::max(last_answered_sent_, b->sent);
  if (--b->pending == 0) {
    auto it = inflight_.find(b);
    if (it != inflight_.end()) {
      finished = std::move(it->second);
      inflight_.erase(it);
    }
    OnBatchDoneLocked(*b);
  }
  b->cv.notify_all();
}

void Core::OnBatchDoneLocked(Batch& b) {
  if (b.purpose == Batch::Purpose::kHeartbeat) {
    OnHeartbeatLocked(b);
    wake_ = true;
    cv_.notify_all();
  } else if (b.purpose == Batch::Purpose::kProbe) {
    probe_in_flight_ = false;
    int rc = b[0].rc;
    if (phase_ != Phase::kConnecting) return;
    if (rc == ZOK || rc == ZNONODE) {
      // Open. The lost-timer counts from basis_ (Init); heartbeats start now.
      phase_ = Phase::kOpen;
      state_ = SessionState::kConnected;
      ++state_gen_;
      hb_now_ = true;
      connect_cv_.notify_all();
    } else if (rc == ZNOAUTH) {
      FailLocked(UnauthenticatedError(
          (cfg_->user.empty() ? std::string("without credentials, ") : "as user '" + cfg_->user + "', ") +
          "this client may not read the chroot " + cfg_->chroot + " of " + cfg_->redacted_url + " (ZooKeeper ACL)"));
    } else if (ConnectionTrouble(rc)) {
      probe_needed_ = true;  // sent again on the next connection
    } else {
      // Not Error(): it may take mu_, which we hold.
      FailLocked(
          UnavailableError("the first request of a new session to " + cfg_->redacted_url + " failed: " + zerror(rc)));
    }
    wake_ = true;
    cv_.notify_all();
  }
}

// --- Heartbeats.
//
// Only the leader expires (global) sessions, and it learns that a session is
// alive only from the server the client is connected to: a follower notes
// each request of the session in a touch table, and sends the table to the
// leader in its reply to the leader's next ping (the leader pings every
// tickTime/2). A read, or a ping of the C client, is answered by the
// follower alone, also while it is cut off from the leader, until
// syncLimit * tickTime later; meanwhile the leader may expire the session.
// So no answer of a read says anything about the leader. A sync does: the
// follower forwards it to the leader and answers it when the leader's reply
// (SYNC) comes back, and the follower's stream to the leader, and the
// leader's stream to the follower, each keep their order.
//
// Heartbeats are syncs, one at a time, answered on one connection (to one
// server; a server that loses its leader drops its clients). For heartbeats
// m < n-1 < n with sent(S) and answered(R) times, if R(m) + LeaderPingBound
// <= S(n-1), the leader sent the follower a ping between its replies to sync
// m and sync n-1 (the leader replied to m before R(m) and to n-1 after
// S(n-1)). The follower read that ping after the reply to m (after it had
// noted sync m's touch, at S(m) or later) and before the reply to n-1, so
// before sync n reached it, and answered the ping at once; that answer
// carried sync m's touch (or an earlier answer did, also after S(m)). The
// leader read it before sync n, as the answer of sync n proves. So once n is
// answered, the leader has touched the session at S(m) or later, and cannot
// expire it before S(m) + timeout: basis_ = S(m) for the newest such m.
//
// The other ways basis_ moves: a new session starts at the moment Init began
// (the leader touched it on creation, later); and a reconnect moves it to the
// send time of the newest request answered before (the new server asks the
// leader to revalidate, which touches, the session before it accepts us).
void Core::OnHeartbeatLocked(const Batch& b) {
  hb_in_flight_ = false;
  const Clock::time_point now = clock_->now();
  hb_answered_ = now;
  const int rc = b.slots[0].rc;
  if (rc != ZOK) {
    // Failed (connection trouble, or refused): try again a little later.
    hb_not_before_ = DeadlineAfter(now, timeout_ / 10);
    return;
  }
  if (phase_ != Phase::kOpen || state_ != SessionState::kConnected) return;
  beats_.push_back({b.sent, now});
  if (beats_.size() > 64) beats_.pop_front();  // bounded, whatever the clock does
  if (beats_.size() < 3) return;
  const Clock::time_point before_last_sent = beats_[beats_.size() - 2].sent;
  const Clock::duration ping_bound = LeaderPingBound(timeout_);
  for (std::size_t m = beats_.size() - 2; m-- > 0;) {
    if (beats_[m].answered + ping_bound > before_last_sent) continue;
    basis_ = std::max(basis_, beats_[m].sent);
    // Older beats can only give older bases.
    beats_.erase(beats_.begin(), beats_.begin() + static_cast<std::ptrdiff_t>(m));
    break;
  }
}

// --- Session and watch events.
void Core::OnGlobalEvent(zhandle_t* zh, int type, int state, const char*, void* ctx) {
  if (type == ZOO_SESSION_EVENT) static_cast<Core*>(ctx)->OnSessionState(zh, state);
}

void Core::OnNodeEvent(zhandle_t*, int type, int, const char* path, void* ctx) {
  // The C client also calls every node watcher on session events; the
  // global watcher handles those.
  if (type != ZOO_SESSION_EVENT && path != nullptr) static_cast<Core*>(ctx)->OnPathEvent(type, path);
}

void Core::OnAuth(int rc, const void* data) {
  auto* core = static_cast<Core*>(const_cast<void*>(data));
  if (rc != ZAUTHFAILED) return;  // success, or lost with the connection (resent on reconnect)
  std::lock_guard<std::mutex> g(core->mu_);
  if (core->phase_ == Phase::kConnecting) {
    core->FailLocked(UnauthenticatedError("ZooKeeper rejected the credentials of user '" + core->cfg_->user + "' for " +
                                          core->cfg_->redacted_url));
  } else {
    core->LoseLocked("ZooKeeper rejected the session's credentials");
  }
}

void Core::OnSessionState(zhandle_t* zh, int zstate) {
  std::lock_guard<std::mutex> g(mu_);
  if (zstate == ZOO_CONNECTED_STATE) {
    const clientid_t* id = zoo_client_id(zh);
    int t = zoo_recv_timeout(zh);
    if (phase_ == Phase::kConnecting) {
      if (id) sid_ = id->client_id;
      if (t > 0) timeout_ = milliseconds(t);
      c_connected_ = true;
      probe_needed_ = true;
      wake_ = true;
      cv_.notify_all();
    } else if (phase_ == Phase::kOpen) {
      if (id && id->client_id != sid_) {  // cannot happen with one handle; be safe
        LoseLocked("ZooKeeper gave this handle a different session");
        return;
      }
      if (t > 0) timeout_ = milliseconds(t);  // may change when the server changes
      if (state_ == SessionState::kSuspended) {
        FoldClockLocked();  // a reconnect after the deadline does not move it
        if (phase_ != Phase::kOpen) return;
        // The server accepted the new connection only after the leader had
        // revalidated (touched) the session, which was after the C client
        // sent its connect request, which was after it gave up the old
        // connection: after every request answered on it was sent.
        basis_ = std::max(basis_, last_answered_sent_);
        beats_.clear();
        state_ = SessionState::kConnected;
        NoteLocked(SessionState::kConnected);
        hb_now_ = true;
      }
    }
  } else if (zstate == ZOO_EXPIRED_SESSION_STATE) {
    if (phase_ == Phase::kConnecting) {
      FailLocked(
          UnavailableError("ZooKeeper expired the new session of " + cfg_->redacted_url + " before it was usable"));
    } else {
      LoseLocked("ZooKeeper expired session " + Hex(sid_));
    }
  } else if (zstate == ZOO_AUTH_FAILED_STATE) {
    if (phase_ == Phase::kConnecting) {
      FailLocked(UnauthenticatedError("ZooKeeper rejected the credentials of user '" + cfg_->user + "' for " +
                                      cfg_->redacted_url));
    } else {
      LoseLocked("ZooKeeper rejected the session's credentials");
    }
  } else {
    // ZOO_CONNECTING_STATE, ZOO_ASSOCIATING_STATE, ZOO_NOTCONNECTED_STATE,
    // ZOO_READONLY_STATE (never asked for): no usable connection right now.
    if (phase_ == Phase::kConnecting) {
      c_connected_ = false;
    } else if (phase_ == Phase::kOpen && state_ == SessionState::kConnected) {
      beats_.clear();  // a heartbeat chain holds on one connection only
      state_ = SessionState::kSuspended;
      NoteLocked(SessionState::kSuspended);
    }
  }
}

void Core::OnPathEvent(int type, const char* path) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = watch_map_.find(path);
  if (it == watch_map_.end()) return;  // nobody waits any more: the watch was left to fire
  for (Waiter* w : it->second) {
    if (type == ZOO_DELETED_EVENT) {
      w->gone = true;
    } else {
      w->fired.insert(it->first);  // changed/created/not-watching: look again
    }
    w->cv.notify_all();
  }
}

// --- State changes. All require mu_.
void Core::NoteLocked(SessionState s) {
  ++state_gen_;
  notes_.emplace_back(++note_seq_, s);
  WakeAllLocked();
}

void Core::WakeAllLocked() {
  wake_ = true;
  cv_.notify_all();
  connect_cv_.notify_all();
  for (Waiter* w : waiters_) w->cv.notify_all();
  for (auto& [p, b] : inflight_) b->cv.notify_all();
}

void Core::FailLocked(Status why) {
  if (phase_ != Phase::kConnecting) return;
  phase_ = Phase::kFailed;
  failure_ = std::move(why);
  close_needed_ = true;
  ++state_gen_;
  WakeAllLocked();
}

void Core::LoseLocked(std::string why) {
  if (phase_ != Phase::kOpen) return;
  phase_ = Phase::kEnded;
  state_ = SessionState::kLost;
  lost_reason_ = std::move(why);
  close_needed_ = true;
  NoteLocked(SessionState::kLost);
}

void Core::FoldClockLocked() {
  if (phase_ != Phase::kOpen) return;
  Clock::time_point now = clock_->now();
  if (now < LostAtLocked()) return;
  LoseLocked("the ZooKeeper leader may not have heard of this session for " + Millis(now - basis_) + " of its " +
             Millis(timeout_) + " timeout (no heartbeat through the leader); it may expire the session");
}

Status Core::EndedLocked() {
  FoldClockLocked();
  switch (phase_) {
    case Phase::kFailed: return failure_;
    case Phase::kEnded:
      if (state_ == SessionState::kLost) {
        return SessionLostError("ZooKeeper session " + Hex(sid_) + " is lost: " + lost_reason_);
      }
      return SessionLostError("ZooKeeper session " + Hex(sid_) + " was closed");
    default: return OkStatus();
  }
}

Status Core::Usable() {
  std::lock_guard<std::mutex> g(mu_);
  if (Status s = EndedLocked(); !s.ok()) return s;
  if (phase_ == Phase::kConnecting) return UnavailableError("not connected to " + cfg_->redacted_url + " yet");
  if (state_ == SessionState::kSuspended) {
    return UnavailableError("the connection of ZooKeeper session " + Hex(sid_) + " to " + cfg_->redacted_url +
                            " is suspended");
  }
  return OkStatus();
}

Status Core::Error(int rc, std::string_view op, std::string_view path) {
  std::string what = std::string(op) + " " + std::string(path);
  std::string z = zerror(rc);
  if (ConnectionTrouble(rc)) {
    return UnavailableError("ZooKeeper connection trouble during " + what + " (" + z + "); the outcome is unknown");
  }
  switch (rc) {
    case ZSESSIONEXPIRED:
    case ZCLOSING:
    case ZINVALIDSTATE: {
      std::lock_guard<std::mutex> g(mu_);
      Status ended = EndedLocked();
      if (!ended.ok() && ended.code() == ErrorCode::kSessionLost) return ended;
      return SessionLostError("ZooKeeper session " + Hex(sid_) + " ended during " + what + " (" + z + ")");
    }
    case ZNOAUTH:
      return PermissionDeniedError(
          "ZooKeeper denied " + what + " (the znode's ACL does not allow " +
          (cfg_->user.empty() ? std::string("unauthenticated clients") : "user '" + cfg_->user + "'") + ")");
    case ZAUTHFAILED: return UnauthenticatedError("ZooKeeper rejected the credentials during " + what);
    case ZNONODE: return NotFoundError(what + ": no such znode");
    case ZNODEEXISTS: return AlreadyExistsError(what + ": the znode exists");
    case ZBADARGUMENTS: return InvalidArgumentError("ZooKeeper rejected the arguments of " + what);
    case ZINVALIDACL: return InvalidArgumentError("ZooKeeper rejected the ACL of " + what);
    case ZNOCHILDRENFOREPHEMERALS:
      return FailedPreconditionError(what + ": a parent znode is ephemeral and cannot have children");
    case ZBADVERSION:
    case ZNOTEMPTY: return AbortedError(what + ": " + z);
    default: return InternalError("ZooKeeper error during " + what + ": " + z + " (" + std::to_string(rc) + ")");
  }
}

// --- Closing.
//
// The handle is closed by the session thread only, after it has delivered
// every note before it: closing the handle deletes the session's entries at
// once, and every subscriber must have heard kClosed (and returned) before
// another session can see them gone (store.hpp, close()).
void Core::Close() noexcept {
  std::unique_lock<std::mutex> lk(mu_);
  if (phase_ == Phase::kConnecting) {
    FailLocked(SessionLostError("the ZooKeeper session was closed before it connected"));
  } else if (phase_ == Phase::kOpen) {
    phase_ = Phase::kEnded;
    state_ = SessionState::kClosed;
    NoteLocked(SessionState::kClosed);
  }
  close_needed_ = true;
  wake_ = true;
  cv_.notify_all();
  // Called by a subscriber: the session thread closes the handle once that
  // subscriber (and the others) have returned. Anyone else waits for it.
  if (thread_id_.load() == std::this_thread::get_id()) return;
  closed_cv_.wait(lk, [&] { return handle_closed_; });
}

void Core::CloseHandle() noexcept {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (close_claimed_) return;
    close_claimed_ = true;
  }
  zhandle_t* zh = nullptr;
  {
    std::unique_lock<std::shared_mutex> w(zh_mu_);  // waits out submissions in progress
    std::swap(zh, zh_);
  }
  // Sends the close request if connected (the server then deletes our
  // ephemeral entries at once) and joins the C client's threads: no callback
  // runs after this returns.
  if (zh != nullptr) zookeeper_close(zh);
  std::vector<std::shared_ptr<Batch>> reaped;  // destroyed after the lock
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [p, b] : inflight_) {  // replies the C client never delivered
    for (std::size_t i = 0; i < b->size; ++i) {
      if (!b->slots[i].done) {
        b->slots[i].done = true;
        b->slots[i].rc = ZCLOSING;
      }
    }
    b->pending = 0;
    b->cv.notify_all();
    reaped.push_back(std::move(b));
  }
  inflight_.clear();
  hb_in_flight_ = probe_in_flight_ = false;
  handle_closed_ = true;
  closed_cv_.notify_all();
}

// ------------------------------------------------------------ ZkSession

namespace {

// Completions that copy a reply into its slot before finishing it.
void OnStringStat(int rc, const char* value, const Stat* stat, const void* data) {
  Slot* s = AsSlot(data);
  if (rc == ZOK) {
    if (value) s->value = value;
    if (stat) s->stat = *stat;
  }
  s->batch->core->Finish(s, rc);
}

void OnString(int rc, const char* value, const void* data) {
  Slot* s = AsSlot(data);
  if (rc == ZOK && value) s->value = value;
  s->batch->core->Finish(s, rc);
}

void OnStrings(int rc, const String_vector* strings, const void* data) {
  Slot* s = AsSlot(data);
  if (rc == ZOK && strings) {
    s->names.reserve(static_cast<std::size_t>(strings->count));
    for (std::int32_t i = 0; i < strings->count; ++i) s->names.emplace_back(strings->data[i]);
  }
  s->batch->core->Finish(s, rc);
}

void OnData(int rc, const char* value, int len, const Stat* stat, const void* data) {
  Slot* s = AsSlot(data);
  if (rc == ZOK) {
    if (value && len > 0) s->value.assign(value, static_cast<std::size_t>(len));
    if (stat) s->stat = *stat;
  }
  s->batch->core->Finish(s, rc);
}

void OnStat(int rc, const Stat* stat, const void* data) {
  Slot* s = AsSlot(data);
  if (rc == ZOK && stat) s->stat = *stat;
  s->batch->core->Finish(s, rc);
}

void OnVoid(int rc, const void* data) { AsSlot(data)->batch->core->Finish(AsSlot(data), rc); }

// Builders for the requests a session makes.
void AddCreate(Batch& b, std::string path, std::string data, const ACL_vector* acl, int mode) {
  b.ops.push_back([path = std::move(path), data = std::move(data), acl, mode](zhandle_t* zh, Slot* s) {
    return zoo_acreate2(zh, path.c_str(), data.data(), static_cast<int>(data.size()), acl, mode, OnStringStat, s);
  });
}
void AddCreateContainer(Batch& b, std::string path, const ACL_vector* acl) {
  b.ops.push_back([path = std::move(path), acl](zhandle_t* zh, Slot* s) {
    return zoo_acreate(zh, path.c_str(), "", 0, acl, ZOO_CONTAINER, OnString, s);
  });
}
void AddChildren(Batch& b, std::string path) {
  b.ops.push_back([path = std::move(path)](zhandle_t* zh, Slot* s) {
    return zoo_aget_children(zh, path.c_str(), 0, OnStrings, s);
  });
}

// The children of `base` in one round trip; nullopt if the node does not exist.
Result<std::optional<std::vector<std::string>>> ListChildren(Core& c, const std::string& base,
                                                             Clock::time_point until) {
  auto b = c.NewBatch();
  AddChildren(*b, base);
  c.Send(b);
  if (Status s = c.Await(*b, until, "getChildren " + base); !s.ok()) return s;
  if ((*b)[0].rc == ZNONODE) return std::optional<std::vector<std::string>>();
  if ((*b)[0].rc != ZOK) return c.Error((*b)[0].rc, "getChildren", base);
  return std::optional<std::vector<std::string>>(std::move((*b)[0].names));
}
void AddGet(Batch& b, std::string path, watcher_fn watcher, void* ctx) {
  b.ops.push_back([path = std::move(path), watcher, ctx](zhandle_t* zh, Slot* s) {
    return zoo_awget(zh, path.c_str(), watcher, ctx, OnData, s);
  });
}
void AddExists(Batch& b, std::string path, watcher_fn watcher, void* ctx) {
  b.ops.push_back([path = std::move(path), watcher, ctx](zhandle_t* zh, Slot* s) {
    return zoo_awexists(zh, path.c_str(), watcher, ctx, OnStat, s);
  });
}
// The entries among the children of `base`: those of a known shape, and those
// of no known shape that are ephemeral, which one pipelined exists() each
// tells (zk_names.hpp: a nested queue's znode is never ephemeral). Sorted.
Result<std::vector<Entry>> ResolveEntries(Core& c, const std::string& base, ParsedChildren parsed,
                                          Clock::time_point until) {
  if (parsed.unsure.empty()) return std::move(parsed.entries);
  auto e = c.NewBatch();
  for (const auto& u : parsed.unsure) AddExists(*e, base + "/" + u.id, nullptr, nullptr);
  c.Send(e);
  if (Status s = c.Await(*e, until, "exists under " + base); !s.ok()) return s;
  for (std::size_t i = 0; i < parsed.unsure.size(); ++i) {
    const Slot& slot = (*e)[i];
    if (slot.rc == ZNONODE) continue;  // gone in between
    if (slot.rc != ZOK) return c.Error(slot.rc, "exists", base + "/" + parsed.unsure[i].id);
    if (IsSessionOwner(slot.stat.ephemeralOwner)) parsed.entries.push_back(std::move(parsed.unsure[i]));
  }
  std::sort(parsed.entries.begin(), parsed.entries.end(), QueueOrder);
  return std::move(parsed.entries);
}

// sync: answered once the server has caught up with the leader as of when
// the leader handled it.
void AddSync(Batch& b, std::string path) {
  b.ops.push_back(
      [path = std::move(path)](zhandle_t* zh, Slot* s) { return zoo_async(zh, path.c_str(), OnString, s); });
}

void AddDelete(Batch& b, std::string path) {
  b.ops.push_back(
      [path = std::move(path)](zhandle_t* zh, Slot* s) { return zoo_adelete(zh, path.c_str(), -1, OnVoid, s); });
}

std::string LastComponent(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

constexpr int kMaxParentRounds = 5;

}  // namespace

std::shared_ptr<ZkSession> ZkSession::Start(std::shared_ptr<const Config> config, std::shared_ptr<Clock> clock) {
  auto core = std::make_shared<Core>(std::move(config), std::move(clock));
  core->SubscribeClock();
  core->Init();
  std::shared_ptr<ZkSession> session(new ZkSession(core));
  session->thread_ = std::jthread([core](std::stop_token stop) { core->Run(stop); });
  return session;
}

ZkSession::ZkSession(std::shared_ptr<Core> core) : core_(std::move(core)) {}

ZkSession::~ZkSession() {
  core_->Close();
  thread_.request_stop();
  if (thread_.joinable()) {
    // A subscriber may drop the last reference from the session thread
    // itself; the thread owns the core and finishes on its own then.
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
}

Status ZkSession::await_open(Clock::time_point deadline) {
  Core& c = *core_;
  std::unique_lock<std::mutex> lk(c.mu_);
  c.clock().wait_until(c.connect_cv_, lk, {}, deadline, [&] { return c.phase_ != Core::Phase::kConnecting; });
  switch (c.phase_) {
    case Core::Phase::kOpen: return OkStatus();
    case Core::Phase::kConnecting:
      return UnavailableError("not connected to " + c.cfg().redacted_url +
                              " before the deadline (servers down or unreachable?)");
    default: {
      Status s = c.EndedLocked();
      if (s.code() == ErrorCode::kSessionLost) return UnavailableError(s.message());
      return s;
    }
  }
}

bool ZkSession::reusable() const noexcept {
  std::lock_guard<std::mutex> g(core_->mu_);
  return core_->phase_ == Core::Phase::kConnecting || core_->phase_ == Core::Phase::kOpen;
}

Clock::duration ZkSession::time_left() const noexcept {
  std::lock_guard<std::mutex> g(core_->mu_);
  return core_->LostAtLocked() - core_->clock().now();
}

Clock::duration ZkSession::negotiated_timeout() const noexcept {
  std::lock_guard<std::mutex> g(core_->mu_);
  return core_->TimeoutLocked();
}

std::string ZkSession::id() const { return Hex(core_->session_id()); }

SessionState ZkSession::state() const noexcept {
  std::lock_guard<std::mutex> g(core_->mu_);
  core_->FoldClockLocked();
  switch (core_->phase_) {
    case Core::Phase::kConnecting: return SessionState::kSuspended;
    case Core::Phase::kFailed: return SessionState::kClosed;
    default: return core_->state_;
  }
}

std::shared_ptr<void> ZkSession::subscribe(std::function<void(SessionState)> fn) {
  std::uint64_t key;
  {
    std::lock_guard<std::mutex> g(core_->mu_);
    key = core_->next_sub_++;
    core_->subs_[key] = {std::make_shared<std::function<void(SessionState)>>(std::move(fn)), core_->note_seq_};
  }
  std::weak_ptr<Core> weak = core_;
  return std::shared_ptr<void>(nullptr, [weak, key](void*) {
    if (auto core = weak.lock()) {
      std::lock_guard<std::mutex> g(core->mu_);
      core->subs_.erase(key);
    }
  });
}

Result<Appended> ZkSession::append(std::string_view queue, const EntrySpec& spec, Clock::time_point deadline) {
  if (Status s = ValidateQueueName(queue); !s.ok()) return s;
  auto prefix = EntryNamePrefix(spec.kind, spec.attempt_id);
  if (!prefix.ok()) return prefix.status();
  if (spec.sequence && (*spec.sequence < INT32_MIN || *spec.sequence > INT32_MAX)) {
    return InvalidArgumentError("sequence " + std::to_string(*spec.sequence) + " is not a ZooKeeper sequence");
  }
  if (Status s = core_->Usable(); !s.ok()) return s;
  Core& c = *core_;
  const std::string base = QueuePath(c.cfg().chroot, queue);
  std::string path = base + "/" + *prefix;
  int mode = ZOO_EPHEMERAL_SEQUENTIAL;
  if (spec.sequence) {
    // Lock downgrade (Curator's CURATOR-621 fix): the same sequence as the
    // entry it replaces, so that it sorts exactly where that one is.
    path += FormatSequence(static_cast<std::int32_t>(*spec.sequence));
    mode = ZOO_EPHEMERAL;
  }
  const std::string data = EncodeOwnerRecord(spec.owner);
  const Clock::time_point until = c.ReplyDeadline(deadline);

  for (int round = 0; round < kMaxParentRounds; ++round) {
    auto b = c.NewBatch();
    // Parents are created only after a create failed for want of them:
    // creating an existing znode is a (failed) write on every server.
    std::vector<std::string> parents;
    if (round > 0) parents = PathPrefixes(base);
    for (const auto& p : parents) AddCreateContainer(*b, p, c.cfg().acl());
    AddCreate(*b, path, data, c.cfg().acl(), mode);
    AddChildren(*b, base);  // same round trip; answered after the create
    c.Send(b);
    if (Status s = c.Await(*b, until, "create " + path); !s.ok()) return s;
    for (std::size_t i = 0; i < parents.size(); ++i) {
      int rc = (*b)[i].rc;
      if (rc != ZOK && rc != ZNODEEXISTS && rc != ZNONODE) return c.Error(rc, "create", parents[i]);
    }
    Slot& created = (*b)[parents.size()];
    Slot& listed = (*b)[parents.size() + 1];
    if (created.rc == ZNONODE) continue;  // a parent is missing, or a container vanished: create them
    std::int64_t sid = c.session_id();
    Stat stat = created.stat;
    std::string name;
    if (created.rc == ZNODEEXISTS && spec.sequence) {
      // Our own earlier attempt whose reply was lost? Adopt it if it is ours.
      auto e = c.NewBatch();
      AddExists(*e, path, nullptr, nullptr);
      c.Send(e);
      if (Status s = c.Await(*e, until, "exists " + path); !s.ok()) return s;
      if ((*e)[0].rc == ZNONODE) continue;
      if ((*e)[0].rc != ZOK) return c.Error((*e)[0].rc, "exists", path);
      if ((*e)[0].stat.ephemeralOwner != sid) {
        return AlreadyExistsError(path + " exists and belongs to another session");
      }
      stat = (*e)[0].stat;
      name = LastComponent(path);
    } else if (created.rc != ZOK) {
      return c.Error(created.rc, "create", path);
    } else {
      name = LastComponent(created.value);
    }
    if (stat.ephemeralOwner != sid) {
      return InternalError("ZooKeeper created " + base + "/" + name + " for session " + Hex(stat.ephemeralOwner) +
                           ", not for this session " + Hex(sid));
    }
    auto parsed = ParseChildName(name);
    if (!parsed) return InternalError("ZooKeeper created " + base + "/" + name + ", which has no sequence suffix");
    Appended out;
    out.entry = std::move(*parsed);
    out.entry.kind = spec.kind;
    out.entry.token = static_cast<std::uint64_t>(stat.czxid);  // zxids only grow, store-wide
    out.entry.attempt_id = spec.attempt_id;
    out.entry.owner = spec.owner;
    if (listed.rc == ZOK && std::find(listed.names.begin(), listed.names.end(), name) != listed.names.end()) {
      // Without the snapshot (if children of unknown shape cannot be checked
      // now) the recipe lists the queue itself: the append stands either way.
      auto snapshot = ResolveEntries(c, base, ParseChildren(listed.names), until);
      if (snapshot.ok()) {
        out.queue = std::move(*snapshot);
        for (auto& e : *out.queue) {
          if (e.id == name) e.token = out.entry.token;
        }
      }
    }
    return out;
  }
  return UnavailableError("could not create the parents of " + base + ": they kept disappearing");
}

Result<std::vector<Entry>> ZkSession::list(std::string_view queue, const ListOptions& options,
                                           Clock::time_point deadline) {
  if (Status s = ValidateQueueName(queue); !s.ok()) return s;
  if (Status s = core_->Usable(); !s.ok()) return s;
  Core& c = *core_;
  const std::string base = QueuePath(c.cfg().chroot, queue);
  const Clock::time_point until = c.ReplyDeadline(deadline);
  auto children = ListChildren(c, base, until);
  if (!children.ok()) return children.status();
  if (!*children) return std::vector<Entry>{};  // no queue: empty
  auto resolved = ResolveEntries(c, base, ParseChildren(**children), until);
  if (!resolved.ok()) return resolved.status();
  std::vector<Entry> entries = std::move(*resolved);
  if (!options.with_owners || entries.empty()) return entries;

  auto d = c.NewBatch();  // one getData per entry, all in one round trip
  for (const auto& e : entries) AddGet(*d, base + "/" + e.id, nullptr, nullptr);
  c.Send(d);
  if (Status s = c.Await(*d, until, "getData of the entries of " + base); !s.ok()) return s;
  std::vector<Entry> out;
  out.reserve(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    Slot& s = (*d)[i];
    Entry& e = entries[i];
    if (s.rc == ZNONODE) continue;  // went away in between
    if (s.rc == ZOK) {
      auto owner = DecodeOwnerRecord(s.value);
      e.owner = owner.ok() ? *owner : OwnerRecord{};  // other clients' data: no owner
      e.token = static_cast<std::uint64_t>(s.stat.czxid);
    } else if (s.rc == ZNOAUTH) {
      e.owner = OwnerRecord{};  // an ACL hides it from us
    } else {
      return c.Error(s.rc, "getData", base + "/" + e.id);
    }
    out.push_back(std::move(e));
  }
  return out;
}

Status ZkSession::wait_any_gone(std::string_view queue, std::span<const std::string> ids, Clock::time_point deadline,
                                std::stop_token stop) {
  if (Status s = ValidateQueueName(queue); !s.ok()) return s;
  if (ids.empty()) return InvalidArgumentError("wait_any_gone needs at least one entry id");
  Core& c = *core_;
  const std::string base = QueuePath(c.cfg().chroot, queue);
  Waiter w;
  for (const auto& id : ids) {
    if (Status s = ValidateEntryId(id); !s.ok()) return s;
    w.paths.push_back(base + "/" + id);
  }
  std::sort(w.paths.begin(), w.paths.end());
  w.paths.erase(std::unique(w.paths.begin(), w.paths.end()), w.paths.end());
  {
    std::lock_guard<std::mutex> g(c.mu_);
    if (Status s = c.EndedLocked(); !s.ok()) return s;
    c.waiters_.insert(&w);
    for (const auto& p : w.paths) c.watch_map_[p].push_back(&w);
  }
  struct Unregister {
    Core& c;
    Waiter& w;
    ~Unregister() {
      std::lock_guard<std::mutex> g(c.mu_);
      c.waiters_.erase(&w);
      for (const auto& p : w.paths) {
        auto it = c.watch_map_.find(p);
        if (it == c.watch_map_.end()) continue;
        std::erase(it->second, &w);
        // The C client keeps one watcher per (path, function, context); it
        // fires, unobserved, when the entry goes, and costs nothing until then.
        if (it->second.empty()) c.watch_map_.erase(it);
      }
    }
  } unregister{c, w};

  const std::string what = "waiting for " + std::string(queue) + "/" + ids.front() +
                           (ids.size() > 1 ? " (and " + std::to_string(ids.size() - 1) + " more)" : "");
  std::set<std::string> armed;  // paths with a watch set in this session
  bool tried = false;
  Clock::time_point retry_at{};
  while (true) {
    std::vector<std::string> to_arm;
    {
      std::unique_lock<std::mutex> lk(c.mu_);
      while (true) {
        if (w.gone) return OkStatus();
        if (Status s = c.EndedLocked(); !s.ok()) return s;
        for (const auto& p : w.fired) armed.erase(p);
        w.fired.clear();
        if (stop.stop_requested()) return CancelledError(what);
        Clock::time_point now = c.clock().now();
        bool connected = c.phase_ == Core::Phase::kOpen && c.state_ == SessionState::kConnected;
        if (connected && armed.size() < w.paths.size() && now >= retry_at) {
          for (const auto& p : w.paths) {
            if (!armed.count(p)) to_arm.push_back(p);
          }
          break;
        }
        if (now >= deadline && (tried || !connected)) return DeadlineExceededError(what);
        // Sleep until a watch fires, the session changes, stop, or the
        // deadline. Through a suspension the watches stay set: the C client
        // restores them when it reconnects within the session.
        Clock::time_point until = deadline;
        if (connected && armed.size() < w.paths.size()) until = std::min(until, retry_at);
        std::uint64_t gen = c.state_gen_;
        c.clock().wait_until(w.cv, lk, stop, until, [&] { return w.gone || !w.fired.empty() || c.state_gen_ != gen; });
      }
    }

    // Arm: getData with a watch is the check and the watch in one atomic step,
    // and leaves no watch behind when the entry is already gone.
    tried = true;
    auto b = c.NewBatch();
    for (const auto& p : to_arm) AddGet(*b, p, &Core::OnNodeEvent, &c);
    c.Send(b);
    if (Status s = c.Await(*b, c.ReplyDeadline(deadline), what); !s.ok()) return DeadlineExceededError(what);
    std::vector<std::string> hidden;  // ACL forbids reading: watch with exists instead
    bool trouble = false;
    for (std::size_t i = 0; i < to_arm.size(); ++i) {
      int rc = (*b)[i].rc;
      if (rc == ZNONODE) return OkStatus();
      if (rc == ZOK) {
        armed.insert(to_arm[i]);
      } else if (rc == ZNOAUTH) {
        hidden.push_back(to_arm[i]);
      } else if (ConnectionTrouble(rc)) {
        trouble = true;
      } else {
        return c.Error(rc, "getData", to_arm[i]);
      }
    }
    if (!hidden.empty()) {
      // exists() needs no permission, but on a missing node it leaves a watch
      // for its creation until the session ends; only this rare path uses it.
      auto e = c.NewBatch();
      for (const auto& p : hidden) AddExists(*e, p, &Core::OnNodeEvent, &c);
      c.Send(e);
      if (Status s = c.Await(*e, c.ReplyDeadline(deadline), what); !s.ok()) return DeadlineExceededError(what);
      for (std::size_t i = 0; i < hidden.size(); ++i) {
        int rc = (*e)[i].rc;
        if (rc == ZNONODE) return OkStatus();
        if (rc == ZOK) {
          armed.insert(hidden[i]);
        } else if (ConnectionTrouble(rc)) {
          trouble = true;
        } else {
          return c.Error(rc, "exists", hidden[i]);
        }
      }
    }
    // A failed arm is retried once the connection is back; the short pause
    // only matters if the C client has not noticed the trouble yet.
    if (trouble) retry_at = DeadlineAfter(c.clock().now(), milliseconds(20));
  }
}

Status ZkSession::remove(std::string_view queue, std::string_view id, Clock::time_point deadline) {
  if (Status s = ValidateQueueName(queue); !s.ok()) return s;
  if (Status s = ValidateEntryId(id); !s.ok()) return s;
  if (Status s = core_->Usable(); !s.ok()) return s;
  Core& c = *core_;
  const std::string path = QueuePath(c.cfg().chroot, queue) + "/" + std::string(id);
  auto b = c.NewBatch();
  AddDelete(*b, path);
  c.Send(b);
  if (Status s = c.Await(*b, c.ReplyDeadline(deadline), "delete " + path); !s.ok()) return s;
  int rc = (*b)[0].rc;
  if (rc == ZOK || rc == ZNONODE) return OkStatus();
  return c.Error(rc, "delete", path);
}

Result<std::optional<Entry>> ZkSession::find_own(std::string_view queue, std::string_view attempt_id,
                                                 Clock::time_point deadline) {
  if (Status s = ValidateQueueName(queue); !s.ok()) return s;
  auto prefix = ProtectedPrefix(attempt_id);
  if (!prefix.ok()) return prefix.status();
  if (Status s = core_->Usable(); !s.ok()) return s;
  Core& c = *core_;
  const std::string base = QueuePath(c.cfg().chroot, queue);
  const Clock::time_point until = c.ReplyDeadline(deadline);
  // The fence (store.hpp: once find_own says nullopt, no append still in
  // flight may make the entry). An append whose connection broke may still
  // be on its way through the old server, and this call may run on another
  // server whose state lags. The sync goes through the leader: once the new
  // connection was accepted, the leader had revalidated the session and
  // made the new server its owner, so a create the old server forwards
  // later fails with SESSIONMOVED; one the leader took before is ahead of
  // the sync, which the leader answers only after that create is committed
  // and sent to our server, so the getChildren behind the sync (a session's
  // requests are answered in order) sees it. On the same connection, order
  // alone does it. No test here: it needs a commit delayed between two
  // followers, which the test proxies cannot aim at.
  auto b = c.NewBatch();
  AddSync(*b, base);
  AddChildren(*b, base);
  c.Send(b);
  if (Status s = c.Await(*b, until, "sync and getChildren " + base); !s.ok()) return s;
  if ((*b)[0].rc != ZOK) return c.Error((*b)[0].rc, "sync", base);
  if ((*b)[1].rc == ZNONODE) return std::optional<Entry>();
  if ((*b)[1].rc != ZOK) return c.Error((*b)[1].rc, "getChildren", base);
  std::vector<std::string> candidates;
  for (const auto& name : (*b)[1].names) {
    if (name.compare(0, prefix->size(), *prefix) == 0) candidates.push_back(name);
  }
  if (candidates.empty()) return std::optional<Entry>();
  // Ours only if this very session owns it: a node of an expired session may
  // still be listed for a moment, and must not be adopted (CURATOR-604).
  auto e = c.NewBatch();
  for (const auto& name : candidates) AddExists(*e, base + "/" + name, nullptr, nullptr);
  c.Send(e);
  if (Status s = c.Await(*e, until, "exists under " + base); !s.ok()) return s;
  std::int64_t sid = c.session_id();
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    Slot& s = (*e)[i];
    if (s.rc == ZNONODE) continue;
    if (s.rc != ZOK) return c.Error(s.rc, "exists", base + "/" + candidates[i]);
    if (s.stat.ephemeralOwner != sid) continue;
    auto parsed = ParseChildName(candidates[i]);
    if (!parsed) continue;
    parsed->token = static_cast<std::uint64_t>(s.stat.czxid);
    parsed->attempt_id = std::string(attempt_id);
    return std::optional<Entry>(std::move(*parsed));
  }
  return std::optional<Entry>();
}

void ZkSession::close() noexcept { core_->Close(); }

}  // namespace dlock::internal::zk
