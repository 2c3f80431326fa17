#include "stores/zookeeper/zk_session.hpp"

#include <zookeeper/zookeeper.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <shared_mutex>
#include <unordered_map>
#include <unordered_set>
#include <variant>

#include "core/dlock_thread.hpp"
#include "core/thread_annotations.hpp"
#include "stores/entry_value.hpp"
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
// twelfth of the timeout of lateness. (See the heartbeat notes at Core::on_heartbeat.)
Clock::duration LeaderPingBound(Clock::duration timeout) { return timeout / 3; }

// The pause between a heartbeat's answer and the next heartbeat. Safety does
// not depend on it (only on LeaderPingBound); shorter pauses keep the basis
// fresher: it lags by about LeaderPingBound + 3 pauses + 4 round trips at
// worst, half the timeout plus round trips, against a deadline at 0.9.
Clock::duration HeartbeatPause(Clock::duration timeout) { return timeout / 18; }

// At most this many requests of ordinary batches are outstanding on a
// session's connection; later batches wait, in order, until replies come
// back. A server answers one session's requests in order, so a heartbeat
// (never held back) waits behind at most this many. Without the bound, a
// burst of 10,000 acquires delayed the heartbeats past the lost-timer, and
// the session declared itself lost (docs/notes.md).
constexpr std::size_t kMaxRequestsInFlight = 64;

// The C client's log lines go to a per-handle callback (zookeeper_init2), so
// dlock never touches the library-wide log stream or level that the
// application may have set. They are dropped unless DLOCK_ZK_LOG is set.
void DropLog(const char*) {}
void StderrLog(const char* message) { std::fprintf(stderr, "zookeeper: %s\n", message); }

}  // namespace

// ------------------------------------------------------------ requests

struct Batch;
struct AsyncWaiter;

// One watch a round of arming sets: getData or exists on an entry (a wait,
// or a head watch's head), getChildren on a queue, or exists on a queue
// znode that is gone (head watches only).
struct ArmRequest {
  enum class Kind { kGetData, kExists, kChildren };
  std::string path;
  Kind kind = Kind::kGetData;
  bool on_entry = true;  // a data watch on an entry, which waits may share (Core::watched_)
};

// One request's reply, filled by its completion callback (before
// Core::finish; read once Core::await has seen the batch done).
struct Slot {
  Batch* batch = nullptr;
  int rc = ZSYSTEMERROR;
  Stat stat{};
  std::string value;               // created path, or node data
  std::vector<std::string> names;  // children

 private:
  friend class Core;
  bool done_ = false;       // guarded by the batch's Core::mu_ (see Batch)
  std::uint64_t conn_ = 0;  // Core::conn_gen_ when the reply came (arm batches)
};

// Requests sent back to back and waited for together. While any reply is
// outstanding, Core::inflight_ owns the batch, so a callback can always reach
// it even if the caller has stopped waiting.
//
// `pending_` (and each Slot's `done_`) are guarded by the mutex of `core`,
// which is private to Core; they are private too, so that only Core's
// methods can touch them, with that mutex held. The analysis cannot check
// these two: it cannot tell that a slot's `batch->core` is the Core whose
// method runs.
struct Batch {
  enum class Purpose { kRequest, kHeartbeat, kProbe, kArm };
  explicit Batch(Core* c, Purpose p = Purpose::kRequest) : core(c), purpose(p) {}

  Core* const core;
  const Purpose purpose;
  std::vector<std::function<int(zhandle_t*, Slot*)>> ops;  // filled before Core::send
  std::unique_ptr<Slot[]> slots;
  std::size_t size = 0;
  Clock::time_point sent;
  std::condition_variable_any cv;
  std::string what;  // for the error when replies are missing
  // kArm: the waiter whose watches these are, and what each request sets.
  std::shared_ptr<AsyncWaiter> waiter;
  std::vector<ArmRequest> arms;

  Slot& operator[](std::size_t i) { return slots[i]; }

 private:
  friend class Core;
  int pending_ = 0;  // guarded by core's mutex (see above)
  // Also guarded by core's mutex: its requests are counted in
  // Core::requests_in_flight_ (an ordinary batch, sent), and it was given up
  // by its waiter (a held-back batch that is given up is never sent: its
  // waiter was told the outcome is unknown and may look for what it would
  // have made).
  bool counted_ = false;
  bool abandoned_ = false;
  // Core::send_then: what runs once, on the session thread, when every
  // reply is in or `until_` has passed (set before send; guarded after).
  std::function<void(Status)> then_;
  Clock::time_point until_ = kNoDeadline;
};

Slot* AsSlot(const void* data) { return static_cast<Slot*>(const_cast<void*>(data)); }

// A wait_any_gone in progress (ZkSession::async_wait_any_gone), owned by its
// handle and, until its outcome is decided, by the core. The session thread
// sets its watches and calls `done_`; watch events and replies (completion
// thread) only decide the outcome. The private fields are guarded by that
// Core's mutex, and private, so that only Core's methods touch them, with
// the mutex held (the analysis cannot name another object's private mutex
// here).
struct AsyncWaiter {
  AsyncWaiter(std::vector<std::string> p, std::string w, std::function<void(Status, bool)> d)
      : paths(std::move(p)), what(std::move(w)), done_(std::move(d)) {}

  const std::vector<std::string> paths;  // sorted, unique
  const std::string what;                // for error messages
  std::condition_variable_any cv;        // the blocking form and cancel wait on it

  // async_watch_head only (set before the waiter is registered): the
  // reading it watches from. Any event on its paths ends it with OK.
  struct HeadSeen {
    std::string queue_path;
    std::string entry_path;    // empty: the queue was empty
    std::int64_t version = 0;  // the head's data version
    std::int64_t pzxid = 0;    // the queue znode's; 0: there was none
    bool children = false;     // also watch the queue's children (a write head: a downgrade may go first)
  };
  std::optional<HeadSeen> head;

 private:
  friend class Core;
  friend class ZkSession;
  std::function<void(Status, bool)> done_;  // the outcome, and whether vouched (async_wait_turn)
  std::set<std::string> armed_;             // paths with a watch set in this session
  // async_wait_turn only (ZkSession::async_wait_turn): the own entry's path;
  // the path whose removal vouches (empty: none may); whether the own
  // entry's watch is set, and on which connection (Core::conn_gen_); and the
  // verdict, set when a removal decides the outcome.
  std::string own_path_;
  std::string vouch_by_;
  bool own_watched_ = false;
  std::uint64_t own_conn_ = 0;
  bool vouched_ = false;
  std::set<std::string> hidden_;  // getData forbidden by an ACL: watched with exists
  bool registered_ = false;       // in the core's maps
  bool arming_ = false;           // a round of watches is in flight
  bool tried_ = false;            // a round of watches was answered
  Clock::time_point retry_at_{};  // the next round, after connection trouble
  std::optional<Status> outcome_;
  bool claimed_ = false;    // someone calls, or called, done_
  bool delivered_ = false;  // done_ has returned
  std::thread::id delivering_;
};

// A std::shared_mutex the thread-safety analysis can see: submissions share
// the handle, closing it takes it alone.
class DLOCK_CAPABILITY("shared_mutex") SharedMutex {
 public:
  void lock() DLOCK_ACQUIRE() { mu_.lock(); }
  void unlock() DLOCK_RELEASE() { mu_.unlock(); }
  void lock_shared() DLOCK_THREAD_ANNOTATION(acquire_shared_capability()) { mu_.lock_shared(); }
  void unlock_shared() DLOCK_THREAD_ANNOTATION(release_shared_capability()) { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

// Holds a SharedMutex shared for its scope.
class DLOCK_SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex& mu) DLOCK_THREAD_ANNOTATION(acquire_shared_capability(mu)) : mu_(mu) {
    mu_.lock_shared();
  }
  ~ReaderLock() DLOCK_RELEASE() { mu_.unlock_shared(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex& mu_;
};

// Holds a SharedMutex exclusively for its scope.
class DLOCK_SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex& mu) DLOCK_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~WriterLock() DLOCK_RELEASE() { mu_.unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex& mu_;
};

// ---------------------------------------------------------------- Core

class Core : public std::enable_shared_from_this<Core> {
 public:
  enum class Phase { kConnecting, kOpen, kFailed, kEnded };

  Core(std::shared_ptr<const Config> config, std::shared_ptr<Clock> clock)
      : cfg_(std::move(config)), clock_(std::move(clock)) {}
  ~Core() {
    clock_sub_.reset();
    close_handle();
  }
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  const Config& cfg() const { return *cfg_; }
  Clock& clock() const { return *clock_; }

  // --- Life cycle (ZkSession::start, the session thread, close()).
  void subscribe_clock() DLOCK_EXCLUDES(mu_);
  void init() DLOCK_EXCLUDES(mu_);
  void run(std::stop_token stop) DLOCK_EXCLUDES(mu_);
  void close() noexcept DLOCK_EXCLUDES(mu_);

  // --- The session's state, for ZkSession (each takes the lock).
  // See ZkSession::await_open.
  Status await_open(Clock::time_point deadline) DLOCK_EXCLUDES(mu_);
  bool reusable() const DLOCK_EXCLUDES(mu_);
  Clock::duration time_left() const DLOCK_EXCLUDES(mu_);
  Clock::duration negotiated_timeout() const DLOCK_EXCLUDES(mu_);
  SessionState state() DLOCK_EXCLUDES(mu_);
  std::int64_t session_id() const DLOCK_EXCLUDES(mu_);
  // OK if requests can be sent now; kUnavailable while suspended;
  // kSessionLost once lost or closed.
  Status usable() DLOCK_EXCLUDES(mu_);
  Status error(int rc, std::string_view op, std::string_view path) DLOCK_EXCLUDES(mu_);

  // --- Subscribers. A subscriber hears only the notes queued after it
  // subscribed; remove_subscriber may be called from any thread.
  std::uint64_t add_subscriber(std::function<void(SessionState)> fn) DLOCK_EXCLUDES(mu_);
  void remove_subscriber(std::uint64_t key) DLOCK_EXCLUDES(mu_);

  // --- Requests.
  std::shared_ptr<Batch> new_batch() { return std::make_shared<Batch>(this); }
  void send(const std::shared_ptr<Batch>& b) DLOCK_EXCLUDES(mu_);
  // Waits for every reply of `b` until `until`; kUnavailable if one is missing.
  Status await(Batch& b, Clock::time_point until, const std::string& what) DLOCK_EXCLUDES(mu_);
  // Sends `b`; once every reply is in (OK) or `until` has passed
  // (kUnavailable: the outcome is unknown), runs then(status) on the session
  // thread, never on the C client's. The continuation of asynchronous requests.
  void send_then(const std::shared_ptr<Batch>& b, Clock::time_point until, std::function<void(Status, Batch&)> then)
      DLOCK_EXCLUDES(mu_);
  // Requests may overrun a deadline by one round trip: a call made with a
  // deadline already past still gets its answer.
  Clock::time_point reply_deadline(Clock::time_point deadline) const DLOCK_EXCLUDES(mu_);

  // --- Watches (wait_any_gone). add_waiter registers `w` unless the
  // session has ended (then it says why, and `w` stays out); the session
  // thread then sets its watches and, once the outcome is decided, calls its
  // completion. cancel decides kCancelled if nothing else came first, and
  // returns once the completion has run (at once if it runs on this very
  // thread). await_waiter is the blocking form's wait: the outcome, or
  // what ended the wait (session ended, stop, deadline).
  Status add_waiter(const std::shared_ptr<AsyncWaiter>& w) DLOCK_EXCLUDES(mu_);
  void cancel(const std::shared_ptr<AsyncWaiter>& w) DLOCK_EXCLUDES(mu_);
  // Calls w's completion with `why` on this thread, unless it was claimed.
  void complete_now(const std::shared_ptr<AsyncWaiter>& w, Status why) DLOCK_EXCLUDES(mu_);
  Status await_waiter(AsyncWaiter& w, Clock::time_point deadline, std::stop_token stop) DLOCK_EXCLUDES(mu_);

  // --- Callbacks from the C client (completion thread).
  static void on_global_event(zhandle_t* zh, int type, int state, const char* path, void* ctx);
  static void on_node_event(zhandle_t* zh, int type, int state, const char* path, void* ctx);
  static void on_auth(int rc, const void* data);
  // `rc` of one request; `from_server`: a completion of the C client, not a
  // local refusal at submission.
  void finish(Slot* slot, int rc, bool from_server = true) DLOCK_EXCLUDES(mu_);

 private:
  // What the session thread does next, besides notes and closing.
  enum class Tick { kSleep, kAgain, kProbe, kHeartbeat, kArm };

  // Sends b's requests back to back (registered in inflight_ already).
  void submit(Batch& b) DLOCK_EXCLUDES(mu_);
  // Takes the held-back batches that may go now (`send`) and those given up
  // meanwhile (`drop`, to be finished without sending); false if none.
  bool take_held_back(std::vector<std::shared_ptr<Batch>>& send, std::vector<std::shared_ptr<Batch>>& drop)
      DLOCK_REQUIRES(mu_);
  // Sends the held-back batches there is room for, finishes those given up.
  void release_held_back() DLOCK_EXCLUDES(mu_);

  // The session thread's steps.
  using Listener = std::shared_ptr<std::function<void(SessionState)>>;
  // Takes the oldest note off the queue, with the subscribers that hear it.
  std::pair<SessionState, std::vector<Listener>> take_next_note() DLOCK_REQUIRES(mu_);
  Tick next_tick(Clock::time_point& next) DLOCK_REQUIRES(mu_);
  Tick next_tick_connecting(Clock::time_point now, Clock::time_point& next) DLOCK_REQUIRES(mu_);
  Tick next_tick_open(Clock::time_point now, Clock::time_point& next) DLOCK_REQUIRES(mu_);
  void send_control(Batch::Purpose purpose) DLOCK_EXCLUDES(mu_);
  // When the next heartbeat is due (kNoDeadline: none may go now), and
  // claiming it if it is due at `now` (then the caller sends it).
  Clock::time_point heartbeat_at(Clock::time_point now) const DLOCK_REQUIRES(mu_);
  bool claim_due_heartbeat(Clock::time_point now) DLOCK_REQUIRES(mu_);
  // Moves the oldest completions (at most kReadyPerTurn, so that the
  // heartbeat check comes round often) to `out`, after the sending of a
  // heartbeat if one is due.
  void take_ready(std::deque<std::function<void()>>& out) DLOCK_REQUIRES(mu_);
  // Sends a round of watches for each waiter that needs one now.
  void send_arms() DLOCK_EXCLUDES(mu_);
  // The requests of w's next round of watches: its entries not watched yet
  // (a wait), or everything a head watch sets.
  void add_wait_arms(AsyncWaiter& w, Batch& b) DLOCK_REQUIRES(mu_);
  void add_head_arms(const AsyncWaiter& w, Batch& b);
  // Decides every waiter with why the session ended.
  void end_waiters() DLOCK_REQUIRES(mu_);
  // Calls w's completion once, unless someone else claimed it first.
  void deliver(const std::shared_ptr<AsyncWaiter>& w) DLOCK_EXCLUDES(mu_);

  // Callbacks.
  void on_session_state(zhandle_t* zh, int zstate) DLOCK_EXCLUDES(mu_);
  void on_connected(zhandle_t* zh) DLOCK_REQUIRES(mu_);
  void on_disconnected() DLOCK_REQUIRES(mu_);
  void on_path_event(int type, const char* path) DLOCK_EXCLUDES(mu_);
  void on_batch_done(Batch& b) DLOCK_REQUIRES(mu_);
  void on_probe(const Batch& b) DLOCK_REQUIRES(mu_);
  void on_heartbeat(const Batch& b) DLOCK_REQUIRES(mu_);
  void on_armed(const Batch& b) DLOCK_REQUIRES(mu_);
  void on_head_armed(const Batch& b, AsyncWaiter& w) DLOCK_REQUIRES(mu_);
  // Queues b's continuation (send_then) with `status`, once.
  void fire_then(Batch& b, Status status) DLOCK_REQUIRES(mu_);
  // Fires the continuations whose deadline has passed; the earliest other
  // one goes into `next`.
  void expire_thens(Clock::time_point now, Clock::time_point& next) DLOCK_REQUIRES(mu_);

  // Waiters. decide sets w's outcome (if it has none), takes w out of the
  // maps and queues its completion for the session thread.
  void decide(AsyncWaiter& w, Status outcome) DLOCK_REQUIRES(mu_);
  void unregister(AsyncWaiter& w) DLOCK_REQUIRES(mu_);
  // Queues `w` for a round of watches and wakes the session thread.
  void want_arm(AsyncWaiter& w) DLOCK_REQUIRES(mu_);
  Status error_locked(int rc, std::string_view op, std::string_view path) DLOCK_REQUIRES(mu_);

  // State changes.
  void note(SessionState s) DLOCK_REQUIRES(mu_);
  void wake_all() DLOCK_REQUIRES(mu_);
  void fail(Status why) DLOCK_REQUIRES(mu_);
  void lose(std::string why) DLOCK_REQUIRES(mu_);
  // Declares the session lost if the clock has passed its lost deadline,
  // whether or not the session thread has noticed yet, so that every reader
  // agrees on the moment (store.hpp, state()) and nothing that happens later
  // (a late reply) can make the session unlost.
  void fold_clock() DLOCK_REQUIRES(mu_);
  // The error for a session that can no longer be used, or OK. Folds in the
  // lost deadline first (fold_clock).
  Status ended() DLOCK_REQUIRES(mu_);
  // When this process counts the session lost.
  Clock::time_point lost_at() const DLOCK_REQUIRES(mu_) { return basis_ + timeout_ - LostMargin(timeout_); }

  void close_handle() noexcept DLOCK_EXCLUDES(mu_, zh_mu_);

  const std::shared_ptr<const Config> cfg_;
  const std::shared_ptr<Clock> clock_;
  std::shared_ptr<void> clock_sub_;

  // The handle. Requests are submitted under a shared lock; close_handle
  // takes it exclusively to swap in nullptr, so no submission can touch a
  // closed handle. Never held while waiting for a reply. Never taken with
  // mu_ held; send() takes mu_ under it (finish, on a local refusal).
  mutable SharedMutex zh_mu_;
  zhandle_t* zh_ DLOCK_GUARDED_BY(zh_mu_) = nullptr;

  std::atomic<std::thread::id> thread_id_{};  // the session thread, once running

  mutable Mutex mu_;
  Phase phase_ DLOCK_GUARDED_BY(mu_) = Phase::kConnecting;
  SessionState state_ DLOCK_GUARDED_BY(mu_) = SessionState::kConnected;  // meaningful once kOpen
  std::uint64_t state_gen_ DLOCK_GUARDED_BY(mu_) = 0;                    // bumps on every change
  // Waiters with no outcome yet (the core's reference), by path, and those
  // that need a round of watches.
  std::unordered_map<AsyncWaiter*, std::shared_ptr<AsyncWaiter>> waiters_ DLOCK_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::vector<AsyncWaiter*>> watch_map_ DLOCK_GUARDED_BY(mu_);
  // The data watches set in this session that have not fired yet, with the
  // connection each was set on: a waiter of such a path shares the watch
  // instead of setting one (the C client calls one watcher per path, and a
  // hold's watch on its own entry takes over its wait's, no request).
  std::unordered_map<std::string, std::uint64_t> watched_ DLOCK_GUARDED_BY(mu_);
  // Counts session events (connections made and lost): events set up on
  // one connection are in the server's order; across a reconnect, the
  // events the server replays for watches set again may not be.
  std::uint64_t conn_gen_ DLOCK_GUARDED_BY(mu_) = 0;
  std::unordered_set<AsyncWaiter*> to_arm_ DLOCK_GUARDED_BY(mu_);
  // Completions for the session thread to run, without mu_: never on the C
  // client's completion thread, where a completion that dropped the last
  // reference to the session would join that very thread.
  std::deque<std::function<void()>> ready_ DLOCK_GUARDED_BY(mu_);
  std::condition_variable_any connect_cv_;  // await_open waits on it

  struct Sub {
    Listener fn;
    std::uint64_t since;  // hears only notes newer than this
  };
  std::map<std::uint64_t, Sub> subs_ DLOCK_GUARDED_BY(mu_);
  std::uint64_t next_sub_ DLOCK_GUARDED_BY(mu_) = 0;
  std::uint64_t note_seq_ DLOCK_GUARDED_BY(mu_) = 0;

  Status failure_ DLOCK_GUARDED_BY(mu_);           // why phase_ is kFailed
  std::string lost_reason_ DLOCK_GUARDED_BY(mu_);  // why state_ is kLost
  std::int64_t sid_ DLOCK_GUARDED_BY(mu_) = 0;
  Clock::duration timeout_ DLOCK_GUARDED_BY(mu_) = milliseconds(10'000);  // negotiated session timeout
  Clock::time_point connect_deadline_ DLOCK_GUARDED_BY(mu_) = kNoDeadline;
  // The lost deadline's basis: a moment no later than the leader's last
  // touch of the session that we know of (see the heartbeat notes).
  Clock::time_point basis_ DLOCK_GUARDED_BY(mu_){};
  // The send time of the newest request a server answered: sent before the
  // current connection, once a reconnect has been reported.
  Clock::time_point last_answered_sent_ DLOCK_GUARDED_BY(mu_){};
  // Heartbeats (syncs) answered on the current connection, oldest first.
  struct Beat {
    Clock::time_point sent, answered;
  };
  std::deque<Beat> beats_ DLOCK_GUARDED_BY(mu_);
  Clock::time_point hb_answered_ DLOCK_GUARDED_BY(mu_){};  // when the last heartbeat ended
  bool c_connected_ DLOCK_GUARDED_BY(mu_) = false;         // the C client reports ZOO_CONNECTED_STATE
  bool probe_needed_ DLOCK_GUARDED_BY(mu_) = false;
  bool probe_in_flight_ DLOCK_GUARDED_BY(mu_) = false;
  bool hb_in_flight_ DLOCK_GUARDED_BY(mu_) = false;
  bool hb_now_ DLOCK_GUARDED_BY(mu_) = false;
  Clock::time_point hb_not_before_ DLOCK_GUARDED_BY(mu_){};
  bool close_needed_ DLOCK_GUARDED_BY(mu_) = false;
  bool close_claimed_ DLOCK_GUARDED_BY(mu_) = false;
  bool handle_closed_ DLOCK_GUARDED_BY(mu_) = false;  // close_handle has finished
  std::condition_variable_any closed_cv_;             // close waits on it for the session thread
  bool wake_ DLOCK_GUARDED_BY(mu_) = false;
  std::condition_variable_any cv_;                                                  // wakes the session thread
  std::deque<std::pair<std::uint64_t, SessionState>> notes_ DLOCK_GUARDED_BY(mu_);  // state changes to deliver
  std::unordered_map<Batch*, std::shared_ptr<Batch>> inflight_ DLOCK_GUARDED_BY(mu_);
  // Requests of ordinary batches submitted and not answered; the batches
  // over kMaxRequestsInFlight, oldest first (also in inflight_).
  std::size_t requests_in_flight_ DLOCK_GUARDED_BY(mu_) = 0;
  std::deque<std::shared_ptr<Batch>> held_back_ DLOCK_GUARDED_BY(mu_);
  bool releasing_ DLOCK_GUARDED_BY(mu_) = false;  // a thread is in release_held_back()
};

void Core::subscribe_clock() {
  std::weak_ptr<Core> weak = weak_from_this();
  clock_sub_ = clock_->on_advance([weak] {
    if (auto core = weak.lock()) {
      MutexLock g(core->mu_);
      core->wake_all();
    }
  });
}

void Core::init() {
  Clock::time_point start = clock_->now();
  int timeout_ms = static_cast<int>(cfg_->session_timeout.count());
  log_callback_fn log = std::getenv("DLOCK_ZK_LOG") ? StderrLog : DropLog;
  {
    MutexLock g(mu_);
    connect_deadline_ = DeadlineAfter(start, cfg_->connect_timeout);
    timeout_ = cfg_->session_timeout;
    // The leader touches a new session when it creates it, which is after
    // the C client sent its connect request, which is after now.
    basis_ = start;
  }
  errno = 0;
  zhandle_t* zh = zookeeper_init2(cfg_->hosts.c_str(), &Core::on_global_event, timeout_ms, nullptr, this,
                                  ZOO_NO_LOG_CLIENTENV, log);
  if (zh == nullptr) {
    int err = errno;
    MutexLock g(mu_);
    std::string why = err ? std::strerror(err) : "unknown error";
    if (err == EINVAL) {
      fail(InvalidArgumentError("ZooKeeper client rejected the hosts of " + cfg_->redacted_url +
                                " (unresolvable or malformed: " + why + ")"));
    } else {
      fail(UnavailableError("cannot start a ZooKeeper client for " + cfg_->redacted_url + ": " + why));
    }
    return;
  }
  {
    WriterLock w(zh_mu_);
    zh_ = zh;
  }
  if (!cfg_->digest.empty()) {
    // Queued now, sent as part of every (re)connection handshake.
    int rc =
        zoo_add_auth(zh, "digest", cfg_->digest.data(), static_cast<int>(cfg_->digest.size()), &Core::on_auth, this);
    if (rc != ZOK) {
      MutexLock g(mu_);
      fail(UnauthenticatedError("cannot send credentials for " + cfg_->redacted_url + ": " + zerror(rc)));
    }
  }
}

// --- The session thread.
//
// One step at a time, in this order: deliver the oldest state change; run
// the completions of waits; close a lost or closed handle; end the waits of
// an ended session; then the timers of the current phase (connect
// deadline and probe; lost-timer and heartbeats); else sleep until the next
// timer or a wake-up. Anything sent or delivered happens without mu_.
void Core::run(std::stop_token stop) {
  thread_id_ = std::this_thread::get_id();
  MutexLock lk(mu_);
  while (true) {
    if (!notes_.empty()) {
      // 1. State changes, oldest first, without our lock: a listener may
      // call back into the session (close() from a listener returns at once).
      auto [s, fns] = take_next_note();
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
    if (!ready_.empty()) {
      // 2. Completions of waits and requests, also without our lock. A
      // heartbeat that is due goes first: a steady stream of completions (a
      // burst of thousands of requests) must not hold it back past the
      // lost-timer (found under TSan, where the stream is slow to drain).
      std::deque<std::function<void()>> ready;
      take_ready(ready);
      lk.unlock();
      for (auto& fn : ready) fn();
      ready.clear();  // what they captured goes without our lock too
      lk.lock();
      continue;
    }
    if (close_needed_ && !close_claimed_) {
      // 3. A lost or closed handle goes at once, after the notes before it.
      lk.unlock();
      close_handle();
      lk.lock();
      continue;
    }
    if ((phase_ == Phase::kEnded || phase_ == Phase::kFailed) && !waiters_.empty()) {
      end_waiters();  // their completions run at step 2, before the thread can stop
      continue;
    }
    if (stop.stop_requested()) break;
    Clock::time_point next = kNoDeadline;
    const Tick tick = next_tick(next);
    if (tick == Tick::kAgain) continue;  // the state changed (failed or lost): notes first
    if (tick != Tick::kSleep) {
      lk.unlock();
      if (tick == Tick::kArm) {
        send_arms();
      } else {
        send_control(tick == Tick::kProbe ? Batch::Purpose::kProbe : Batch::Purpose::kHeartbeat);
      }
      lk.lock();
      continue;
    }
    wake_ = false;
    clock_->wait_until(cv_, lk.native(), stop, next, [&] {
      mu_.assert_held();  // the predicate runs inside wait_until, with the lock taken back
      return wake_ || !notes_.empty() || !ready_.empty() || (close_needed_ && !close_claimed_);
    });
  }
}

std::pair<SessionState, std::vector<Core::Listener>> Core::take_next_note() {
  auto [seq, s] = notes_.front();
  notes_.pop_front();
  std::vector<Listener> fns;
  for (auto& [key, sub] : subs_) {
    if (sub.since < seq) fns.push_back(sub.fn);
  }
  return {s, std::move(fns)};
}

Core::Tick Core::next_tick(Clock::time_point& next) {
  const Clock::time_point now = clock_->now();
  expire_thens(now, next);
  if (!ready_.empty()) return Tick::kAgain;  // continuations first
  if (phase_ == Phase::kConnecting) return next_tick_connecting(now, next);
  if (phase_ == Phase::kOpen) return next_tick_open(now, next);
  return Tick::kSleep;  // failed or ended: only notes and the close are left
}

Core::Tick Core::next_tick_connecting(Clock::time_point now, Clock::time_point& next) {
  if (now >= connect_deadline_) {
    fail(UnavailableError("no ZooKeeper server of " + cfg_->redacted_url + " answered within " +
                          Millis(cfg_->connect_timeout) + " (down, unreachable, or not ZooKeeper)"));
    return Tick::kAgain;
  }
  // The handshake alone proves little (credentials, chroot): a first
  // request, once per connection, decides whether the session opens.
  if (probe_needed_ && c_connected_ && !probe_in_flight_) {
    probe_needed_ = false;
    probe_in_flight_ = true;
    return Tick::kProbe;
  }
  next = connect_deadline_;
  return Tick::kSleep;
}

Core::Tick Core::next_tick_open(Clock::time_point now, Clock::time_point& next) {
  // The lost-timer. The leader expires the session no earlier than
  // `timeout_` after its last touch of it, which was no earlier than
  // basis_. We declare the loss a margin before that point, so that a
  // holder has time to stop before the leader can hand its locks on.
  const Clock::time_point lost = lost_at();
  if (now >= lost) {
    fold_clock();
    return Tick::kAgain;
  }
  next = lost;
  // Watches to set, on a connection that is up (through a suspension the
  // C client keeps those set, and sets them again when it reconnects).
  if (state_ == SessionState::kConnected && !to_arm_.empty()) {
    Clock::time_point arm_at = kNoDeadline;
    for (const AsyncWaiter* w : to_arm_) arm_at = std::min(arm_at, w->retry_at_);
    if (now >= arm_at) return Tick::kArm;
    next = std::min(next, arm_at);
  }
  // Heartbeats (syncs, one at a time) move basis_ forward; none while
  // suspended (a chain holds on one connection only).
  if (claim_due_heartbeat(now)) return Tick::kHeartbeat;
  next = std::min(next, heartbeat_at(now));
  return Tick::kSleep;
}

Clock::time_point Core::heartbeat_at(Clock::time_point now) const {
  if (phase_ != Phase::kOpen || state_ != SessionState::kConnected || hb_in_flight_) return kNoDeadline;
  const Clock::time_point hb_at = hb_now_ ? now : hb_answered_ + HeartbeatPause(timeout_);
  return std::max(hb_at, hb_not_before_);
}

void Core::take_ready(std::deque<std::function<void()>>& out) {
  constexpr std::size_t kReadyPerTurn = 32;
  if (ready_.size() <= kReadyPerTurn) {
    out.swap(ready_);
  } else {
    for (std::size_t i = 0; i < kReadyPerTurn; ++i) {
      out.push_back(std::move(ready_.front()));
      ready_.pop_front();
    }
  }
  if (claim_due_heartbeat(clock_->now())) out.push_front([this] { send_control(Batch::Purpose::kHeartbeat); });
}

bool Core::claim_due_heartbeat(Clock::time_point now) {
  if (now < heartbeat_at(now)) return false;
  hb_now_ = false;
  hb_in_flight_ = true;
  return true;
}

void Core::send_control(Batch::Purpose purpose) {
  auto b = std::make_shared<Batch>(this, purpose);
  if (purpose == Batch::Purpose::kProbe && !cfg_->chroot.empty()) {
    // Reading the chroot checks the credentials against its ACL.
    std::string path = cfg_->chroot;
    b->ops.push_back([path](zhandle_t* zh, Slot* s) {
      return zoo_aget(
          zh, path.c_str(), 0,
          [](int rc, const char*, int, const Stat*, const void* data) {
            AsSlot(data)->batch->core->finish(AsSlot(data), rc);
          },
          s);
    });
  } else if (purpose == Batch::Purpose::kProbe) {
    b->ops.push_back([](zhandle_t* zh, Slot* s) {
      return zoo_aexists(
          zh, "/", 0,
          [](int rc, const Stat*, const void* data) { AsSlot(data)->batch->core->finish(AsSlot(data), rc); }, s);
    });
  } else {
    b->ops.push_back([](zhandle_t* zh, Slot* s) {
      return zoo_async(
          zh, "/", [](int rc, const char*, const void* data) { AsSlot(data)->batch->core->finish(AsSlot(data), rc); },
          s);
    });
  }
  send(b);
}

void Core::send(const std::shared_ptr<Batch>& b) {
  b->size = b->ops.size();
  b->slots = std::make_unique<Slot[]>(b->size);
  for (std::size_t i = 0; i < b->size; ++i) b->slots[i].batch = b.get();
  {
    MutexLock g(mu_);
    b->pending_ = static_cast<int>(b->size);
    inflight_.emplace(b.get(), b);
    // Heartbeats and probes go at once: they are what the bound protects.
    if (b->purpose != Batch::Purpose::kHeartbeat && b->purpose != Batch::Purpose::kProbe) {
      // Held back only behind requests in flight, whose replies (or the
      // handle's close) will let it go; also while a release is under way,
      // whose taken batches may not be submitted yet (a find_own overtaking
      // the append it looks for would leave an orphan; review finding).
      const bool full = requests_in_flight_ + b->size > kMaxRequestsInFlight || !held_back_.empty() || releasing_;
      if (!close_claimed_ && requests_in_flight_ > 0 && full) {
        held_back_.push_back(b);
        return;
      }
      requests_in_flight_ += b->size;
      b->counted_ = true;
    }
  }
  submit(*b);
}

void Core::submit(Batch& b) {
  std::vector<std::pair<std::size_t, int>> refused;  // no callback will come for these
  {
    ReaderLock zl(zh_mu_);
    b.sent = clock_->now();
    for (std::size_t i = 0; i < b.size; ++i) {
      // Back to back, without waiting: the server answers them in this order.
      int rc = zh_ ? b.ops[i](zh_, &b.slots[i]) : ZCLOSING;
      if (rc != ZOK) refused.emplace_back(i, rc);
    }
  }
  for (auto [i, rc] : refused) finish(&b.slots[i], rc, /*from_server=*/false);
}

bool Core::take_held_back(std::vector<std::shared_ptr<Batch>>& send, std::vector<std::shared_ptr<Batch>>& drop) {
  while (!held_back_.empty()) {
    std::shared_ptr<Batch>& b = held_back_.front();
    if (b->abandoned_ || close_claimed_) {
      drop.push_back(std::move(b));
    } else if (requests_in_flight_ == 0 || requests_in_flight_ + b->size <= kMaxRequestsInFlight) {
      requests_in_flight_ += b->size;
      b->counted_ = true;
      send.push_back(std::move(b));
    } else {
      break;
    }
    held_back_.pop_front();
  }
  return !send.empty() || !drop.empty();
}

// On the thread whose reply made room (the C client's completion thread,
// or a caller whose submission was refused at once), one thread at a time,
// in a loop: a refused submission finishes inside submit(), which must not
// recurse into here. Not on the session thread, which may be running a
// listener that waits for one of these requests.
void Core::release_held_back() {
  while (true) {
    std::vector<std::shared_ptr<Batch>> send, drop;
    {
      MutexLock g(mu_);
      if (!take_held_back(send, drop)) {
        releasing_ = false;
        return;
      }
    }
    for (auto& b : send) submit(*b);
    for (auto& b : drop) {
      for (std::size_t i = 0; i < b->size; ++i) finish(&b->slots[i], ZOPERATIONTIMEOUT, /*from_server=*/false);
    }
  }
}

Status Core::await(Batch& b, Clock::time_point until, const std::string& what) {
  MutexLock lk(mu_);
  clock_->wait_until(b.cv, lk.native(), {}, until, [&] {
    mu_.assert_held();  // the predicate runs inside wait_until, with the lock taken back
    return b.pending_ == 0;
  });
  if (b.pending_ == 0) return OkStatus();
  b.abandoned_ = true;  // if it is still held back, it never goes
  return UnavailableError("no answer from ZooKeeper to " + what + " before the deadline; the outcome is unknown");
}

void Core::finish(Slot* slot, int rc, bool from_server) {
  // The C client's completion thread (not a caller whose request the C
  // client refused at once: that thread is the program's).
  if (from_server) MarkDlockThread();
  bool release = false;
  {
    std::shared_ptr<Batch> finished;  // released after the lock: may be the last owner
    MutexLock g(mu_);
    Batch* b = slot->batch;
    if (slot->done_) return;  // a held-back batch dropped while close_handle reaped it
    slot->rc = rc;
    slot->done_ = true;
    if (from_server && rc == ZOK && b->purpose == Batch::Purpose::kArm) {
      // The watch is set as of this reply: recorded now, in the order the
      // C client delivers replies and events, so that an event for the path
      // later in this batch erases it (review: recorded at the batch's end,
      // a watch that fired meanwhile stayed "set" for good).
      const auto i = static_cast<std::size_t>(slot - b->slots.get());
      if (b->arms[i].on_entry) watched_[b->arms[i].path] = conn_gen_;
      slot->conn_ = conn_gen_;
    }
    if (b->counted_ && requests_in_flight_ > 0) {
      --requests_in_flight_;
      // Room for a held-back batch: this thread sends it, unless another
      // is at it already (it loops until nothing more fits).
      release = !held_back_.empty() && !std::exchange(releasing_, true);
    }
    fold_clock();  // a reply after the deadline does not move it
    if (from_server && ServerAnswered(rc)) last_answered_sent_ = std::max(last_answered_sent_, b->sent);
    if (--b->pending_ == 0) {
      auto it = inflight_.find(b);
      if (it != inflight_.end()) {
        finished = std::move(it->second);
        inflight_.erase(it);
      }
      on_batch_done(*b);
    }
    b->cv.notify_all();
  }
  if (release) release_held_back();
}

void Core::on_batch_done(Batch& b) {
  if (b.purpose == Batch::Purpose::kHeartbeat) {
    on_heartbeat(b);
    wake_ = true;
    cv_.notify_all();
  } else if (b.purpose == Batch::Purpose::kProbe) {
    on_probe(b);
  } else if (b.purpose == Batch::Purpose::kArm) {
    on_armed(b);
  }
  if (b.then_) fire_then(b, OkStatus());
}

void Core::send_then(const std::shared_ptr<Batch>& b, Clock::time_point until,
                     std::function<void(Status, Batch&)> then) {
  // The continuation keeps its batch (and so the replies it reads) alive.
  b->then_ = [b, then = std::move(then)](Status s) { then(std::move(s), *b); };
  b->until_ = until;
  send(b);
}

void Core::fire_then(Batch& b, Status status) {
  if (!b.then_) return;  // fired already (deadline, then the replies)
  ready_.emplace_back([fn = std::move(b.then_), status = std::move(status)] { fn(status); });
  b.then_ = nullptr;
  wake_ = true;
  cv_.notify_all();
}

void Core::expire_thens(Clock::time_point now, Clock::time_point& next) {
  for (auto& [p, b] : inflight_) {
    if (!b->then_) continue;
    if (now < b->until_) {
      next = std::min(next, b->until_);
      continue;
    }
    b->abandoned_ = true;  // if it is still held back, it never goes
    fire_then(*b, UnavailableError("no answer from ZooKeeper to " + b->what +
                                   " before the deadline; the outcome is unknown"));
  }
}

// The answer to a new session's first request decides whether it opens.
void Core::on_probe(const Batch& b) {
  probe_in_flight_ = false;
  int rc = b.slots[0].rc;
  if (phase_ != Phase::kConnecting) return;
  if (rc == ZOK || rc == ZNONODE) {
    // Open. The lost-timer counts from basis_ (init); heartbeats start now.
    phase_ = Phase::kOpen;
    state_ = SessionState::kConnected;
    ++state_gen_;
    hb_now_ = true;
    connect_cv_.notify_all();
  } else if (rc == ZNOAUTH) {
    fail(UnauthenticatedError(
        (cfg_->user.empty() ? std::string("without credentials, ") : "as user '" + cfg_->user + "', ") +
        "this client may not read the chroot " + cfg_->chroot + " of " + cfg_->redacted_url + " (ZooKeeper ACL)"));
  } else if (ConnectionTrouble(rc)) {
    probe_needed_ = true;  // sent again on the next connection
  } else {
    // Not error(): it may take mu_, which we hold.
    fail(UnavailableError("the first request of a new session to " + cfg_->redacted_url + " failed: " + zerror(rc)));
  }
  wake_ = true;
  cv_.notify_all();
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
// The other ways basis_ moves: a new session starts at the moment init began
// (the leader touched it on creation, later); and a reconnect moves it to the
// send time of the newest request answered before (the new server asks the
// leader to revalidate, which touches, the session before it accepts us).
void Core::on_heartbeat(const Batch& b) {
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
// The C client's threads run these: they are dlock's threads too (see
// core/dlock_thread.hpp).
void Core::on_global_event(zhandle_t* zh, int type, int state, const char*, void* ctx) {
  MarkDlockThread();
  if (type == ZOO_SESSION_EVENT) static_cast<Core*>(ctx)->on_session_state(zh, state);
}

void Core::on_node_event(zhandle_t*, int type, int, const char* path, void* ctx) {
  MarkDlockThread();
  // The C client also calls every node watcher on session events; the
  // global watcher handles those.
  if (type != ZOO_SESSION_EVENT && path != nullptr) static_cast<Core*>(ctx)->on_path_event(type, path);
}

void Core::on_auth(int rc, const void* data) {
  MarkDlockThread();
  auto* core = static_cast<Core*>(const_cast<void*>(data));
  if (rc != ZAUTHFAILED) return;  // success, or lost with the connection (resent on reconnect)
  MutexLock g(core->mu_);
  if (core->phase_ == Phase::kConnecting) {
    core->fail(UnauthenticatedError("ZooKeeper rejected the credentials of user '" + core->cfg_->user + "' for " +
                                    core->cfg_->redacted_url));
  } else {
    core->lose("ZooKeeper rejected the session's credentials");
  }
}

void Core::on_session_state(zhandle_t* zh, int zstate) {
  MutexLock g(mu_);
  ++conn_gen_;
  if (zstate == ZOO_CONNECTED_STATE) {
    on_connected(zh);
  } else if (zstate == ZOO_EXPIRED_SESSION_STATE) {
    if (phase_ == Phase::kConnecting) {
      fail(UnavailableError("ZooKeeper expired the new session of " + cfg_->redacted_url + " before it was usable"));
    } else {
      lose("ZooKeeper expired session " + Hex(sid_));
    }
  } else if (zstate == ZOO_AUTH_FAILED_STATE) {
    if (phase_ == Phase::kConnecting) {
      fail(UnauthenticatedError("ZooKeeper rejected the credentials of user '" + cfg_->user + "' for " +
                                cfg_->redacted_url));
    } else {
      lose("ZooKeeper rejected the session's credentials");
    }
  } else {
    // ZOO_CONNECTING_STATE, ZOO_ASSOCIATING_STATE, ZOO_NOTCONNECTED_STATE,
    // ZOO_READONLY_STATE (never asked for): no usable connection right now.
    on_disconnected();
  }
}

void Core::on_connected(zhandle_t* zh) {
  const clientid_t* id = zoo_client_id(zh);
  int t = zoo_recv_timeout(zh);
  if (phase_ == Phase::kConnecting) {
    // The handshake of a new session: the session thread sends the probe.
    if (id) sid_ = id->client_id;
    if (t > 0) timeout_ = milliseconds(t);
    c_connected_ = true;
    probe_needed_ = true;
    wake_ = true;
    cv_.notify_all();
    return;
  }
  if (phase_ != Phase::kOpen) return;
  if (id && id->client_id != sid_) {  // cannot happen with one handle; be safe
    lose("ZooKeeper gave this handle a different session");
    return;
  }
  if (t > 0) timeout_ = milliseconds(t);  // may change when the server changes
  if (state_ != SessionState::kSuspended) return;
  fold_clock();  // a reconnect after the deadline does not move it
  if (phase_ != Phase::kOpen) return;
  // The server accepted the new connection only after the leader had
  // revalidated (touched) the session, which was after the C client
  // sent its connect request, which was after it gave up the old
  // connection: after every request answered on it was sent.
  basis_ = std::max(basis_, last_answered_sent_);
  beats_.clear();
  state_ = SessionState::kConnected;
  note(SessionState::kConnected);
  hb_now_ = true;
}

void Core::on_disconnected() {
  if (phase_ == Phase::kConnecting) {
    c_connected_ = false;
  } else if (phase_ == Phase::kOpen && state_ == SessionState::kConnected) {
    beats_.clear();  // a heartbeat chain holds on one connection only
    state_ = SessionState::kSuspended;
    note(SessionState::kSuspended);
  }
}

void Core::on_path_event(int type, const char* path) {
  MutexLock g(mu_);
  watched_.erase(path);  // a watch fires once
  auto it = watch_map_.find(path);
  if (it == watch_map_.end()) return;                     // nobody waits any more: the watch was left to fire
  const std::vector<AsyncWaiter*> watching = it->second;  // decide() edits the map
  for (AsyncWaiter* w : watching) {
    if (w->head) {
      // The head, or the queue, changed (or a watch was dropped): the
      // caller reads again.
      decide(*w, OkStatus());
    } else if (type == ZOO_DELETED_EVENT) {
      // The entry waited for went while the own entry's watch, set on this
      // same connection, has not fired: the own entry was still there
      // (its removal, earlier in the server's order, would have come first).
      if (w->vouch_by_ == path && w->own_watched_ && w->own_conn_ == conn_gen_) {
        w->vouched_ = true;
      }
      decide(*w, OkStatus());
    } else {
      // Changed data, or a watch the server dropped: spent, set it again.
      w->armed_.erase(path);
      if (w->own_path_ == path) w->own_watched_ = false;
      want_arm(*w);
    }
  }
}

// --- State changes. All require mu_.
void Core::note(SessionState s) {
  ++state_gen_;
  notes_.emplace_back(++note_seq_, s);
  wake_all();
}

void Core::wake_all() {
  wake_ = true;
  cv_.notify_all();
  connect_cv_.notify_all();
  for (auto& [p, w] : waiters_) w->cv.notify_all();
  for (auto& [p, b] : inflight_) b->cv.notify_all();
}

void Core::fail(Status why) {
  if (phase_ != Phase::kConnecting) return;
  phase_ = Phase::kFailed;
  failure_ = std::move(why);
  close_needed_ = true;
  ++state_gen_;
  wake_all();
}

void Core::lose(std::string why) {
  if (phase_ != Phase::kOpen) return;
  phase_ = Phase::kEnded;
  state_ = SessionState::kLost;
  lost_reason_ = std::move(why);
  close_needed_ = true;
  note(SessionState::kLost);
}

void Core::fold_clock() {
  if (phase_ != Phase::kOpen) return;
  Clock::time_point now = clock_->now();
  if (now < lost_at()) return;
  lose("the ZooKeeper leader may not have heard of this session for " + Millis(now - basis_) + " of its " +
       Millis(timeout_) + " timeout (no heartbeat through the leader); it may expire the session");
}

Status Core::ended() {
  fold_clock();
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

Status Core::usable() {
  MutexLock g(mu_);
  if (Status s = ended(); !s.ok()) return s;
  if (phase_ == Phase::kConnecting) return UnavailableError("not connected to " + cfg_->redacted_url + " yet");
  if (state_ == SessionState::kSuspended) {
    return UnavailableError("the connection of ZooKeeper session " + Hex(sid_) + " to " + cfg_->redacted_url +
                            " is suspended");
  }
  return OkStatus();
}

Status Core::error(int rc, std::string_view op, std::string_view path) {
  MutexLock g(mu_);
  return error_locked(rc, op, path);
}

Status Core::error_locked(int rc, std::string_view op, std::string_view path) {
  std::string what = std::string(op) + " " + std::string(path);
  std::string z = zerror(rc);
  if (ConnectionTrouble(rc)) {
    return UnavailableError("ZooKeeper connection trouble during " + what + " (" + z + "); the outcome is unknown");
  }
  switch (rc) {
    case ZSESSIONEXPIRED:
    case ZCLOSING:
    case ZINVALIDSTATE: {
      Status why = ended();
      if (!why.ok() && why.code() == ErrorCode::kSessionLost) return why;
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
void Core::close() noexcept {
  MutexLock lk(mu_);
  if (phase_ == Phase::kConnecting) {
    fail(SessionLostError("the ZooKeeper session was closed before it connected"));
  } else if (phase_ == Phase::kOpen) {
    phase_ = Phase::kEnded;
    state_ = SessionState::kClosed;
    note(SessionState::kClosed);
  }
  close_needed_ = true;
  wake_ = true;
  cv_.notify_all();
  // Called by a subscriber: the session thread closes the handle once that
  // subscriber (and the others) have returned. Anyone else waits for it.
  if (thread_id_.load() == std::this_thread::get_id()) return;
  closed_cv_.wait(lk.native(), [&] {
    mu_.assert_held();  // the predicate runs inside wait, with the lock taken back
    return handle_closed_;
  });
}

void Core::close_handle() noexcept {
  {
    MutexLock g(mu_);
    if (close_claimed_) return;
    close_claimed_ = true;
  }
  zhandle_t* zh = nullptr;
  {
    WriterLock w(zh_mu_);  // waits out submissions in progress
    std::swap(zh, zh_);
  }
  // Sends the close request if connected (the server then deletes our
  // ephemeral entries at once) and joins the C client's threads: no callback
  // runs after this returns.
  if (zh != nullptr) zookeeper_close(zh);
  std::vector<std::shared_ptr<Batch>> reaped;  // destroyed after the lock
  MutexLock g(mu_);
  for (auto& [p, b] : inflight_) {  // replies the C client never delivered
    for (std::size_t i = 0; i < b->size; ++i) {
      if (!b->slots[i].done_) {
        b->slots[i].done_ = true;
        b->slots[i].rc = ZCLOSING;
      }
    }
    b->pending_ = 0;
    b->cv.notify_all();
    fire_then(*b, OkStatus());  // the replies are ZCLOSING
    reaped.push_back(std::move(b));
  }
  inflight_.clear();
  held_back_.clear();  // reaped above with the rest
  requests_in_flight_ = 0;
  hb_in_flight_ = probe_in_flight_ = false;
  handle_closed_ = true;
  closed_cv_.notify_all();
}

// --- The session's state, for ZkSession.
Status Core::await_open(Clock::time_point deadline) {
  MutexLock lk(mu_);
  clock_->wait_until(connect_cv_, lk.native(), {}, deadline, [&] {
    mu_.assert_held();  // the predicate runs inside wait_until, with the lock taken back
    return phase_ != Phase::kConnecting;
  });
  switch (phase_) {
    case Phase::kOpen: return OkStatus();
    case Phase::kConnecting:
      return UnavailableError("not connected to " + cfg_->redacted_url +
                              " before the deadline (servers down or unreachable?)");
    default: {
      Status s = ended();
      if (s.code() == ErrorCode::kSessionLost) return UnavailableError(s.message());
      return s;
    }
  }
}

bool Core::reusable() const {
  MutexLock g(mu_);
  return phase_ == Phase::kConnecting || phase_ == Phase::kOpen;
}

Clock::duration Core::time_left() const {
  MutexLock g(mu_);
  return lost_at() - clock_->now();
}

Clock::duration Core::negotiated_timeout() const {
  MutexLock g(mu_);
  return timeout_;
}

SessionState Core::state() {
  MutexLock g(mu_);
  fold_clock();
  switch (phase_) {
    case Phase::kConnecting: return SessionState::kSuspended;
    case Phase::kFailed: return SessionState::kClosed;
    default: return state_;
  }
}

std::int64_t Core::session_id() const {
  MutexLock g(mu_);
  return sid_;
}

Clock::time_point Core::reply_deadline(Clock::time_point deadline) const {
  MutexLock g(mu_);
  return std::max(deadline, DeadlineAfter(clock_->now(), std::max<Clock::duration>(timeout_ / 3, milliseconds(200))));
}

std::uint64_t Core::add_subscriber(std::function<void(SessionState)> fn) {
  MutexLock g(mu_);
  const std::uint64_t key = next_sub_++;
  subs_[key] = {std::make_shared<std::function<void(SessionState)>>(std::move(fn)), note_seq_};
  return key;
}

void Core::remove_subscriber(std::uint64_t key) {
  MutexLock g(mu_);
  subs_.erase(key);
}

// --- Watches.
//
// A waiter sets a watch on each of its entries (one round trip, from the
// session thread), with getData or, where an ACL forbids reading, with
// exists. Every waiter of a path is woken by one C-client watcher (the C
// client keeps one per path, function and context), which fires, unobserved,
// when the entry goes after nobody waits any more, and costs nothing until
// then. Through a suspension the watches stay set: the C client sets them
// again when it reconnects within the session.
Status Core::add_waiter(const std::shared_ptr<AsyncWaiter>& w) {
  MutexLock g(mu_);
  if (Status s = ended(); !s.ok()) return s;
  waiters_.emplace(w.get(), w);
  for (const auto& p : w->paths) watch_map_[p].push_back(w.get());
  w->registered_ = true;
  want_arm(*w);
  return OkStatus();
}

void Core::want_arm(AsyncWaiter& w) {
  if (!w.registered_ || w.arming_) return;  // on_armed looks again
  to_arm_.insert(&w);
  wake_ = true;
  cv_.notify_all();
}

void Core::unregister(AsyncWaiter& w) {
  if (!w.registered_) return;
  w.registered_ = false;
  to_arm_.erase(&w);
  for (const auto& p : w.paths) {
    auto it = watch_map_.find(p);
    if (it == watch_map_.end()) continue;
    std::erase(it->second, &w);
    if (it->second.empty()) watch_map_.erase(it);
  }
  waiters_.erase(&w);  // may drop the core's reference: last
}

void Core::decide(AsyncWaiter& w, Status outcome) {
  if (w.outcome_) return;
  w.outcome_ = std::move(outcome);
  auto it = waiters_.find(&w);
  if (it != waiters_.end()) {
    ready_.emplace_back([this, sp = it->second] { deliver(sp); });
    wake_ = true;
    cv_.notify_all();
  }
  w.cv.notify_all();
  unregister(w);
}

void Core::end_waiters() {
  const Status why = ended();
  std::vector<std::shared_ptr<AsyncWaiter>> all;
  all.reserve(waiters_.size());
  for (auto& [p, w] : waiters_) all.push_back(w);
  for (auto& w : all) decide(*w, why);
}

void Core::deliver(const std::shared_ptr<AsyncWaiter>& w) {
  std::function<void(Status, bool)> fn;
  Status outcome;
  bool vouched = false;
  {
    MutexLock g(mu_);
    if (w->claimed_) return;  // cancelled (and so completed) meanwhile
    w->claimed_ = true;
    w->delivering_ = std::this_thread::get_id();
    fn = std::move(w->done_);
    outcome = *w->outcome_;
    vouched = w->vouched_ && outcome.ok();
  }
  try {
    if (fn) fn(std::move(outcome), vouched);
  } catch (...) {  // `done` must not throw (store.hpp); the session thread survives it
  }
  fn = nullptr;
  MutexLock g(mu_);
  w->delivered_ = true;
  w->cv.notify_all();
}

void Core::cancel(const std::shared_ptr<AsyncWaiter>& w) { complete_now(w, CancelledError(w->what)); }

void Core::complete_now(const std::shared_ptr<AsyncWaiter>& w, Status why) {
  std::function<void(Status, bool)> fn;
  {
    MutexLock lk(mu_);
    decide(*w, why);
    if (w->claimed_) {
      // Completed, or being completed: on this thread (inside the
      // completion) return at once, else wait until the completion returns.
      if (w->delivering_ == std::this_thread::get_id()) return;
      w->cv.wait(lk.native(), [&] {
        mu_.assert_held();  // the predicate runs inside wait, with the lock taken back
        return w->delivered_;
      });
      return;
    }
    // Not called yet: `why`, here and now, whatever was decided.
    w->claimed_ = true;
    w->delivering_ = std::this_thread::get_id();
    fn = std::move(w->done_);
  }
  try {
    if (fn) fn(std::move(why), false);
  } catch (...) {  // `done` must not throw (store.hpp)
  }
  fn = nullptr;
  MutexLock g(mu_);
  w->delivered_ = true;
  w->cv.notify_all();
}

Status Core::await_waiter(AsyncWaiter& w, Clock::time_point deadline, std::stop_token stop) {
  MutexLock lk(mu_);
  // A round of watches may overrun the deadline by a round trip, as a request.
  const Clock::time_point reply_by =
      std::max(deadline, DeadlineAfter(clock_->now(), std::max<Clock::duration>(timeout_ / 3, milliseconds(200))));
  while (true) {
    if (w.outcome_) return *w.outcome_;
    if (Status s = ended(); !s.ok()) return s;
    if (stop.stop_requested()) return CancelledError(w.what);
    const bool connected = phase_ == Phase::kOpen && state_ == SessionState::kConnected;
    // Past the deadline, but never before one round of watches while
    // connected: an entry already gone is found even so.
    if (connected && to_arm_.count(&w) && thread_id_.load() == std::this_thread::get_id()) {
      // Called on the session thread (by a subscriber), which sets watches:
      // set this one here, or nothing would until the deadline.
      lk.unlock();
      send_arms();
      lk.lock();
      continue;
    }
    const Clock::time_point now = clock_->now();
    const bool past = now >= deadline;
    if (past && (w.tried_ || !connected || now >= reply_by)) return DeadlineExceededError(w.what);
    const std::uint64_t gen = state_gen_;
    const bool tried = w.tried_;
    clock_->wait_until(w.cv, lk.native(), stop, past ? reply_by : deadline, [&] {
      mu_.assert_held();  // the predicate runs inside wait_until, with the lock taken back
      return w.outcome_.has_value() || state_gen_ != gen || w.tried_ != tried;
    });
  }
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
  s->batch->core->finish(s, rc);
}

void OnString(int rc, const char* value, const void* data) {
  Slot* s = AsSlot(data);
  if (rc == ZOK && value) s->value = value;
  s->batch->core->finish(s, rc);
}

void OnStrings(int rc, const String_vector* strings, const void* data) {
  Slot* s = AsSlot(data);
  if (rc == ZOK && strings) {
    s->names.reserve(static_cast<std::size_t>(strings->count));
    for (std::int32_t i = 0; i < strings->count; ++i) s->names.emplace_back(strings->data[i]);
  }
  s->batch->core->finish(s, rc);
}

void OnStringsStat(int rc, const String_vector* strings, const Stat* stat, const void* data) {
  Slot* s = AsSlot(data);
  if (rc == ZOK && strings) {
    s->names.reserve(static_cast<std::size_t>(strings->count));
    for (std::int32_t i = 0; i < strings->count; ++i) s->names.emplace_back(strings->data[i]);
  }
  if (rc == ZOK && stat) s->stat = *stat;
  s->batch->core->finish(s, rc);
}

void OnData(int rc, const char* value, int len, const Stat* stat, const void* data) {
  Slot* s = AsSlot(data);
  if (rc == ZOK) {
    if (value && len > 0) s->value.assign(value, static_cast<std::size_t>(len));
    if (stat) s->stat = *stat;
  }
  s->batch->core->finish(s, rc);
}

void OnStat(int rc, const Stat* stat, const void* data) {
  Slot* s = AsSlot(data);
  if (rc == ZOK && stat) s->stat = *stat;
  s->batch->core->finish(s, rc);
}

void OnVoid(int rc, const void* data) { AsSlot(data)->batch->core->finish(AsSlot(data), rc); }

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

// getChildren with the queue znode's stat (its pzxid: a head reading's position).
void AddChildrenStat(Batch& b, std::string path) {
  b.ops.push_back([path = std::move(path)](zhandle_t* zh, Slot* s) {
    return zoo_aget_children2(zh, path.c_str(), 0, OnStringsStat, s);
  });
}
void AddChildrenWatch(Batch& b, std::string path, watcher_fn watcher, void* ctx) {
  b.ops.push_back([path = std::move(path), watcher, ctx](zhandle_t* zh, Slot* s) {
    return zoo_awget_children2(zh, path.c_str(), watcher, ctx, OnStringsStat, s);
  });
}
// setData, only if the node's data version is still `version`.
void AddSetData(Batch& b, std::string path, std::string data, std::int32_t version) {
  b.ops.push_back([path = std::move(path), data = std::move(data), version](zhandle_t* zh, Slot* s) {
    return zoo_aset(zh, path.c_str(), data.data(), static_cast<int>(data.size()), version, OnStat, s);
  });
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
// ResolveBatch is that round of exists(), ApplyResolve reads its replies.
std::shared_ptr<Batch> ResolveBatch(Core& c, const std::string& base, const ParsedChildren& parsed) {
  auto e = c.new_batch();
  e->what = "exists under " + base;
  for (const auto& u : parsed.unsure) AddExists(*e, base + "/" + u.id, nullptr, nullptr);
  return e;
}
Result<std::vector<Entry>> ApplyResolve(Core& c, const std::string& base, ParsedChildren& parsed, Batch& e) {
  for (std::size_t i = 0; i < parsed.unsure.size(); ++i) {
    const Slot& slot = e[i];
    if (slot.rc == ZNONODE) continue;  // gone in between
    if (slot.rc != ZOK) return c.error(slot.rc, "exists", base + "/" + parsed.unsure[i].id);
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

}  // namespace

// A round of watches for each waiter due one (see "Watches").
void Core::send_arms() {
  std::vector<std::shared_ptr<Batch>> batches;
  {
    MutexLock g(mu_);
    if (phase_ != Phase::kOpen || state_ != SessionState::kConnected) return;
    const Clock::time_point now = clock_->now();
    for (auto it = to_arm_.begin(); it != to_arm_.end();) {
      AsyncWaiter& w = **it;
      if (w.retry_at_ > now) {
        ++it;
        continue;
      }
      auto b = std::make_shared<Batch>(this, Batch::Purpose::kArm);
      b->waiter = waiters_.at(&w);
      if (w.head) {
        add_head_arms(w, *b);
      } else {
        add_wait_arms(w, *b);
      }
      it = to_arm_.erase(it);
      if (b->arms.empty()) {  // every watch shared: armed as if answered
        w.tried_ = true;
        w.cv.notify_all();
        continue;
      }
      w.arming_ = true;
      batches.push_back(std::move(b));
    }
  }
  for (const auto& b : batches) send(b);
}

void Core::add_wait_arms(AsyncWaiter& w, Batch& b) {
  for (const auto& p : w.paths) {
    if (w.armed_.count(p)) continue;
    if (auto set = watched_.find(p); set != watched_.end()) {
      // Set already and not fired: shared, no request.
      w.armed_.insert(p);
      if (p == w.own_path_) {
        w.own_watched_ = true;
        w.own_conn_ = set->second;
      }
      continue;
    }
    const bool with_exists = w.hidden_.count(p) > 0;
    // getData with a watch is the check and the watch in one atomic
    // step, and leaves no watch behind when the entry is already gone.
    // exists() needs no permission, but on a missing node it leaves a
    // watch for its creation until the session ends: only for hidden ones.
    if (with_exists) {
      AddExists(b, p, &Core::on_node_event, this);
    } else {
      AddGet(b, p, &Core::on_node_event, this);
    }
    b.arms.push_back({p, with_exists ? ArmRequest::Kind::kExists : ArmRequest::Kind::kGetData, true});
  }
}

// Each request checks the reading and sets its watch in one step, so a
// change after the reading is either in the reply or fires the watch
// (docs/election.md §3.4). Never shared with another waiter's watch: the
// reply's version is the check. Sent again whole after connection trouble.
void Core::add_head_arms(const AsyncWaiter& w, Batch& b) {
  const AsyncWaiter::HeadSeen& seen = *w.head;
  if (!seen.entry_path.empty()) {
    AddGet(b, seen.entry_path, &Core::on_node_event, this);
    b.arms.push_back({seen.entry_path, ArmRequest::Kind::kGetData, true});
  }
  if (seen.entry_path.empty() ? seen.pzxid != 0 : seen.children) {
    AddChildrenWatch(b, seen.queue_path, &Core::on_node_event, this);
    b.arms.push_back({seen.queue_path, ArmRequest::Kind::kChildren, false});
  } else if (seen.entry_path.empty()) {
    // The queue znode was gone: watch for it to come back.
    AddExists(b, seen.queue_path, &Core::on_node_event, this);
    b.arms.push_back({seen.queue_path, ArmRequest::Kind::kExists, false});
  }
}

void Core::on_armed(const Batch& b) {
  AsyncWaiter& w = *b.waiter;
  w.arming_ = false;
  // The watches set were recorded as their replies came (finish()).
  if (w.outcome_) return;
  if (w.head) return on_head_armed(b, w);
  w.tried_ = true;
  w.cv.notify_all();
  for (std::size_t i = 0; i < b.size; ++i) {
    // Still set only if no event for it came after its reply.
    if (b.slots[i].rc == ZOK && b.arms[i].path == w.own_path_ && watched_.count(w.own_path_)) {
      w.own_watched_ = true;
      w.own_conn_ = b.slots[i].conn_;
    }
  }
  for (std::size_t i = 0; i < b.size; ++i) {
    if (b.slots[i].rc != ZNONODE) continue;
    // Already gone. If it is the one that vouches, and the own entry is
    // watched on this connection (read there in this round, or earlier):
    // the own entry was there after it went. One connection delivers the
    // server's answers and events in its order, so an own entry removed
    // before that read would have decided this wait already.
    if (b.arms[i].path == w.vouch_by_ && w.own_watched_ && w.own_conn_ == conn_gen_) w.vouched_ = true;
    return decide(w, OkStatus());
  }
  bool trouble = false;
  for (std::size_t i = 0; i < b.size; ++i) {
    const std::string& path = b.arms[i].path;
    const bool with_exists = b.arms[i].kind == ArmRequest::Kind::kExists;
    const int rc = b.slots[i].rc;
    if (rc == ZOK) {
      if (watched_.count(path)) w.armed_.insert(path);  // else it fired within the batch: set it again
    } else if (rc == ZNOAUTH && !with_exists) {
      w.hidden_.insert(path);  // again at once, with exists
    } else if (ConnectionTrouble(rc)) {
      trouble = true;
    } else {
      return decide(w, error_locked(rc, with_exists ? "exists" : "getData", path));
    }
  }
  // A failed round is sent again once the connection is back; the short
  // pause only matters if the C client has not noticed the trouble yet.
  if (trouble) w.retry_at_ = DeadlineAfter(clock_->now(), milliseconds(20));
  if (w.armed_.size() < w.paths.size()) want_arm(w);
}

namespace {

// Whether one reply of a head watch's round shows a change since the reading.
bool HeadMoved(const AsyncWaiter::HeadSeen& seen, const ArmRequest& arm, const Slot& slot) {
  switch (arm.kind) {
    case ArmRequest::Kind::kGetData: return slot.rc == ZNONODE || (slot.rc == ZOK && slot.stat.version != seen.version);
    case ArmRequest::Kind::kChildren: return slot.rc == ZNONODE || (slot.rc == ZOK && slot.stat.pzxid != seen.pzxid);
    case ArmRequest::Kind::kExists: return slot.rc == ZOK;  // gone at the reading, back now
  }
  return true;
}

const char* ArmOp(ArmRequest::Kind kind) {
  switch (kind) {
    case ArmRequest::Kind::kGetData: return "getData";
    case ArmRequest::Kind::kExists: return "exists";
    case ArmRequest::Kind::kChildren: return "getChildren";
  }
  return "watch";
}

}  // namespace

void Core::on_head_armed(const Batch& b, AsyncWaiter& w) {
  w.tried_ = true;
  w.cv.notify_all();
  bool trouble = false;
  for (std::size_t i = 0; i < b.size; ++i) {
    const Slot& slot = b.slots[i];
    const ArmRequest& arm = b.arms[i];
    if (ConnectionTrouble(slot.rc)) {
      trouble = true;
    } else if (HeadMoved(*w.head, arm, slot)) {
      return decide(w, OkStatus());
    } else if (slot.rc != ZOK && !(slot.rc == ZNONODE && arm.kind == ArmRequest::Kind::kExists)) {
      return decide(w, error_locked(slot.rc, ArmOp(arm.kind), arm.path));
    }
  }
  if (!trouble) return;  // armed: an event decides
  // Again once the connection is back, the whole round: each request
  // compares with the reading, not with the round before.
  w.retry_at_ = DeadlineAfter(clock_->now(), milliseconds(20));
  want_arm(w);
}

namespace {

std::string LastComponent(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::shared_ptr<ZkSession> ZkSession::start(std::shared_ptr<const Config> config, std::shared_ptr<Clock> clock) {
  auto core = std::make_shared<Core>(std::move(config), std::move(clock));
  core->subscribe_clock();
  core->init();
  std::shared_ptr<ZkSession> session(new ZkSession(core));
  session->thread_ = std::jthread([core](std::stop_token stop) {
    MarkDlockThread("dlock-zk");
    core->run(stop);
  });
  return session;
}

ZkSession::ZkSession(std::shared_ptr<Core> core) : core_(std::move(core)) {}

ZkSession::~ZkSession() {
  core_->close();
  thread_.request_stop();
  // A subscriber may drop the last reference from the session thread
  // itself; the thread owns the core and finishes on its own then.
  JoinOrDetach(thread_);
}

Status ZkSession::await_open(Clock::time_point deadline) { return core_->await_open(deadline); }

bool ZkSession::reusable() const noexcept { return core_->reusable(); }

Clock::duration ZkSession::time_left() const noexcept { return core_->time_left(); }

Clock::duration ZkSession::negotiated_timeout() const noexcept { return core_->negotiated_timeout(); }

std::string ZkSession::id() const { return Hex(core_->session_id()); }

SessionState ZkSession::state() const noexcept { return core_->state(); }

std::shared_ptr<void> ZkSession::subscribe(std::function<void(SessionState)> fn) {
  const std::uint64_t key = core_->add_subscriber(std::move(fn));
  std::weak_ptr<Core> weak = core_;
  return std::shared_ptr<void>(nullptr, [weak, key](void*) {
    if (auto core = weak.lock()) core->remove_subscriber(key);
  });
}

namespace {

// The watched paths of a wait, sorted and unique, and its description.
Result<std::pair<std::vector<std::string>, std::string>> WaitPaths(const Config& cfg, std::string_view queue,
                                                                   std::span<const std::string> ids) {
  if (Status s = ValidateQueueName(queue); !s.ok()) return s;
  if (ids.empty()) return InvalidArgumentError("wait_any_gone needs at least one entry id");
  const std::string base = QueuePath(cfg.chroot, queue);
  std::vector<std::string> paths;
  for (const auto& id : ids) {
    if (Status s = ValidateEntryId(id); !s.ok()) return s;
    paths.push_back(base + "/" + id);
  }
  std::sort(paths.begin(), paths.end());
  paths.erase(std::unique(paths.begin(), paths.end()), paths.end());
  std::string what = "waiting for " + std::string(queue) + "/" + ids.front() +
                     (ids.size() > 1 ? " (and " + std::to_string(ids.size() - 1) + " more)" : "");
  return std::make_pair(std::move(paths), std::move(what));
}

// The handle of an asynchronous wait: destroying it cancels the wait.
class WaitHandle {
 public:
  WaitHandle(std::shared_ptr<Core> core, std::shared_ptr<AsyncWaiter> w) : core_(std::move(core)), w_(std::move(w)) {}
  WaitHandle(const WaitHandle&) = delete;
  WaitHandle& operator=(const WaitHandle&) = delete;
  ~WaitHandle() { core_->cancel(w_); }

 private:
  const std::shared_ptr<Core> core_;
  const std::shared_ptr<AsyncWaiter> w_;
};

// Registers `w` and hands back its handle; on a session that has ended, `w`
// is completed at once (with why) and there is nothing to cancel.
std::shared_ptr<void> StartWait(const std::shared_ptr<Core>& core, std::shared_ptr<AsyncWaiter> w) {
  if (Status s = core->add_waiter(w); !s.ok()) {
    core->complete_now(w, std::move(s));
    return std::make_shared<int>(0);
  }
  return std::make_shared<WaitHandle>(core, std::move(w));
}

}  // namespace

std::shared_ptr<void> ZkSession::async_wait_any_gone(std::string_view queue, std::span<const std::string> ids,
                                                     std::function<void(Status)> done) {
  auto paths = WaitPaths(core_->cfg(), queue, ids);
  if (!paths.ok()) {
    done(paths.status());
    return std::make_shared<int>(0);  // nothing left to cancel
  }
  return StartWait(core_,
                   std::make_shared<AsyncWaiter>(std::move(paths->first), std::move(paths->second),
                                                 [done = std::move(done)](Status s, bool) { done(std::move(s)); }));
}

// The wait also watches the own entry (in the same round trip), and the
// hold made after the grant shares that watch (Core::watched_), so the
// watch costs no request of its own. It vouches when the one entry waited
// for is the only one ahead, and its removal came while the own entry's
// watch, set on the same connection, had not fired (ZooKeeper delivers a
// session's watch events in the order of the changes).
std::shared_ptr<void> ZkSession::async_wait_turn(std::string_view queue, std::span<const std::string> ids,
                                                 std::span<const std::string> ahead, std::string_view own,
                                                 std::function<void(Status, bool)> done) {
  // Review: the own entry's watch only pays off when this wait can vouch
  // (one entry ahead); otherwise it is a request the short hold after the
  // grant often never made (released before its watch was sent).
  const bool can_vouch =
      ids.size() == 1 && ids.front() != own &&
      std::all_of(ahead.begin(), ahead.end(), [&](const std::string& a) { return a == ids.front(); });
  if (!can_vouch) {
    return async_wait_any_gone(queue, ids, [done = std::move(done)](Status s) { done(std::move(s), false); });
  }
  const std::array<std::string, 2> watch{ids.front(), std::string(own)};
  auto paths = WaitPaths(core_->cfg(), queue, watch);  // checks both ids
  if (!paths.ok()) {
    done(paths.status(), false);
    return std::make_shared<int>(0);  // nothing left to cancel
  }
  auto w = std::make_shared<AsyncWaiter>(std::move(paths->first), std::move(paths->second), std::move(done));
  const std::string base = QueuePath(core_->cfg().chroot, queue);
  w->vouch_by_ = base + "/" + watch[0];
  w->own_path_ = base + "/" + watch[1];
  return StartWait(core_, std::move(w));
}

// The asynchronous wait, blocked on: its outcome, or the deadline or stop,
// which cancel it.
Status ZkSession::wait_any_gone(std::string_view queue, std::span<const std::string> ids, Clock::time_point deadline,
                                std::stop_token stop) {
  auto paths = WaitPaths(core_->cfg(), queue, ids);
  if (!paths.ok()) return paths.status();
  auto w = std::make_shared<AsyncWaiter>(std::move(paths->first), std::move(paths->second), nullptr);
  if (Status s = core_->add_waiter(w); !s.ok()) return s;
  Status outcome = core_->await_waiter(*w, deadline, std::move(stop));
  core_->cancel(w);
  return outcome;
}

// ------------------------------------------------- requests of rounds
//
// list, remove and find_own are written once, as rounds (one batch each)
// that a driver sends: the blocking form awaits each round on the calling
// thread, the asynchronous form sends the next round from the session
// thread when the last one is answered (Core::send_then), so that no
// request holds a thread. Both send the very same requests in the same
// order, on the same connection, and so keep the same guarantees (the
// find_own fence below relies on that order).

namespace {

// A request of one or more rounds. step() reads the last round's replies
// (`awaited`: OK, or kUnavailable when they did not all come before the
// deadline, and then it must not read them) and gives the result or the
// next round.
template <class T>
class Rounds {
 public:
  using Next = std::variant<T, std::shared_ptr<Batch>>;
  virtual ~Rounds() = default;
  virtual std::shared_ptr<Batch> first() = 0;
  virtual Next step(Status awaited, Batch& b) = 0;
};

template <class T>
T RunBlocking(Core& c, Rounds<T>& op, Clock::time_point until) {
  std::shared_ptr<Batch> b = op.first();
  while (true) {
    c.send(b);
    Status awaited = c.await(*b, until, b->what);
    auto next = op.step(std::move(awaited), *b);
    if (T* result = std::get_if<T>(&next)) return std::move(*result);
    b = std::get<std::shared_ptr<Batch>>(std::move(next));
  }
}

// The continuations run on the session thread, which keeps the core alive.
template <class T>
void RunAsync(Core& c, std::shared_ptr<Rounds<T>> op, std::shared_ptr<Batch> b, Clock::time_point until,
              std::shared_ptr<std::function<void(T)>> done) {
  c.send_then(b, until, [&c, op, until, done](Status awaited, Batch& got) {
    auto next = op->step(std::move(awaited), got);
    if (T* result = std::get_if<T>(&next)) {
      (*done)(std::move(*result));
    } else {
      RunAsync(c, op, std::get<std::shared_ptr<Batch>>(std::move(next)), until, done);
    }
  });
}

template <class T>
void StartAsync(Core& c, Result<std::shared_ptr<Rounds<T>>> op, Clock::time_point until, std::function<void(T)> done) {
  if (!op.ok()) return done(T(op.status()));  // refused at once: on this thread
  auto first = (*op)->first();
  RunAsync(c, std::move(*op), std::move(first), until, std::make_shared<std::function<void(T)>>(std::move(done)));
}

using Listed = Result<std::vector<Entry>>;
using Found = Result<std::optional<Entry>>;

// A node's data as dlock reads it (docs/election.md §2.1): a candidate's
// (-latch-) is its value, Curator's participant id, and it has no owner
// record; any other entry's is an owner record if it decodes as one, else
// the value another client wrote there (a LeaderSelector id, a kazoo
// identifier; no owner). Empty data is no value (Curator's default id).
void ReadNodeData(Entry& e, const Slot& s, const ListOptions& options) {
  e.token = static_cast<std::uint64_t>(s.stat.czxid);
  e.value_version = static_cast<std::uint64_t>(s.stat.version);
  e.created_unix_ms = s.stat.ctime;
  std::optional<std::string> value;
  std::optional<OwnerRecord> owner;
  if (e.kind != entry_kind::kCandidate) {
    auto decoded = DecodeOwnerRecord(s.value);
    owner = decoded.ok() ? *decoded : OwnerRecord{};
    if (!decoded.ok() && !s.value.empty()) value = s.value;
  } else if (!s.value.empty()) {
    value = s.value;
  }
  if (options.with_owners) e.owner = std::move(owner);
  if (options.with_values) e.value = std::move(value);
}

// list: getChildren; an exists() per child of unknown shape; with owners
// or values, a getData per entry. Each round is one round trip.
class ListOp final : public Rounds<Listed> {
 public:
  ListOp(Core& c, std::string base, ListOptions options) : c_(c), base_(std::move(base)), options_(options) {}

  std::shared_ptr<Batch> first() override {
    auto b = c_.new_batch();
    b->what = "getChildren " + base_;
    AddChildren(*b, base_);
    return b;
  }

  Next step(Status awaited, Batch& b) override {
    if (!awaited.ok()) return Listed(std::move(awaited));
    switch (stage_) {
      case Stage::kChildren: return on_children(b);
      case Stage::kResolve: {
        auto resolved = ApplyResolve(c_, base_, parsed_, b);
        if (!resolved.ok()) return Listed(resolved.status());
        return with_owners(std::move(*resolved));
      }
      case Stage::kOwners: return on_owners(b);
    }
    return Listed(InternalError("list: no such stage"));
  }

 private:
  enum class Stage { kChildren, kResolve, kOwners };

  Next on_children(Batch& b) {
    if (b[0].rc == ZNONODE) return Listed(std::vector<Entry>{});  // no queue: empty
    if (b[0].rc != ZOK) return Listed(c_.error(b[0].rc, "getChildren", base_));
    parsed_ = ParseChildren(b[0].names);
    if (parsed_.unsure.empty()) return with_owners(std::move(parsed_.entries));
    stage_ = Stage::kResolve;
    return ResolveBatch(c_, base_, parsed_);
  }

  Next with_owners(std::vector<Entry> entries) {
    entries_ = std::move(entries);
    if ((!options_.with_owners && !options_.with_values) || entries_.empty()) return Listed(std::move(entries_));
    stage_ = Stage::kOwners;
    auto d = c_.new_batch();  // one getData per entry, all in one round trip
    d->what = "getData of the entries of " + base_;
    for (const auto& e : entries_) AddGet(*d, base_ + "/" + e.id, nullptr, nullptr);
    return d;
  }

  Next on_owners(Batch& d) {
    std::vector<Entry> out;
    out.reserve(entries_.size());
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      Slot& s = d[i];
      Entry& e = entries_[i];
      if (s.rc == ZNONODE) continue;  // went away in between
      if (s.rc == ZOK) {
        ReadNodeData(e, s, options_);
      } else if (s.rc == ZNOAUTH) {
        if (options_.with_owners) e.owner = OwnerRecord{};  // an ACL hides it from us
      } else {
        return Listed(c_.error(s.rc, "getData", base_ + "/" + e.id));
      }
      out.push_back(std::move(e));
    }
    return Listed(std::move(out));
  }

  Core& c_;
  const std::string base_;
  const ListOptions options_;
  Stage stage_ = Stage::kChildren;
  ParsedChildren parsed_;
  std::vector<Entry> entries_;
};

class RemoveOp final : public Rounds<Status> {
 public:
  RemoveOp(Core& c, std::string path) : c_(c), path_(std::move(path)) {}

  std::shared_ptr<Batch> first() override {
    auto b = c_.new_batch();
    b->what = "delete " + path_;
    AddDelete(*b, path_);
    return b;
  }

  Next step(Status awaited, Batch& b) override {
    if (!awaited.ok()) return awaited;
    const int rc = b[0].rc;
    if (rc == ZOK || rc == ZNONODE) return OkStatus();
    return c_.error(rc, "delete", path_);
  }

 private:
  Core& c_;
  const std::string path_;
};

// find_own's fence (store.hpp: once find_own says nullopt, no append still
// in flight may make the entry). An append whose connection broke may still
// be on its way through the old server, and this call may run on another
// server whose state lags. The sync goes through the leader: once the new
// connection was accepted, the leader had revalidated the session and made
// the new server its owner, so a create the old server forwards later fails
// with SESSIONMOVED; one the leader took before is ahead of the sync, which
// the leader answers only after that create is committed and sent to our
// server, so the getChildren behind the sync (a session's requests are
// answered in order) sees it. On the same connection, order alone does it.
// No test here: it needs a commit delayed between two followers, which the
// test proxies cannot aim at.
class FindOwnOp final : public Rounds<Found> {
 public:
  FindOwnOp(Core& c, std::string base, std::string prefix, std::string attempt_id)
      : c_(c), base_(std::move(base)), prefix_(std::move(prefix)), attempt_id_(std::move(attempt_id)) {}

  std::shared_ptr<Batch> first() override {
    auto b = c_.new_batch();
    b->what = "sync and getChildren " + base_;
    AddSync(*b, base_);
    AddChildren(*b, base_);
    return b;
  }

  Next step(Status awaited, Batch& b) override {
    if (!awaited.ok()) return Found(std::move(awaited));
    return candidates_.empty() ? on_children(b) : on_owners(b);
  }

 private:
  Next on_children(Batch& b) {
    if (b[0].rc != ZOK) return Found(c_.error(b[0].rc, "sync", base_));
    if (b[1].rc == ZNONODE) return Found(std::optional<Entry>());
    if (b[1].rc != ZOK) return Found(c_.error(b[1].rc, "getChildren", base_));
    for (const auto& name : b[1].names) {
      if (name.compare(0, prefix_.size(), prefix_) == 0) candidates_.push_back(name);
    }
    if (candidates_.empty()) return Found(std::optional<Entry>());
    // Ours only if this very session owns it: a node of an expired session
    // may still be listed for a moment, and must not be adopted (CURATOR-604).
    auto e = c_.new_batch();
    e->what = "exists under " + base_;
    for (const auto& name : candidates_) AddExists(*e, base_ + "/" + name, nullptr, nullptr);
    return e;
  }

  Next on_owners(Batch& e) {
    const std::int64_t sid = c_.session_id();
    for (std::size_t i = 0; i < candidates_.size(); ++i) {
      Slot& s = e[i];
      if (s.rc == ZNONODE) continue;
      if (s.rc != ZOK) return Found(c_.error(s.rc, "exists", base_ + "/" + candidates_[i]));
      if (s.stat.ephemeralOwner != sid) continue;
      auto parsed = ParseChildName(candidates_[i]);
      if (!parsed) continue;
      parsed->token = static_cast<std::uint64_t>(s.stat.czxid);
      parsed->attempt_id = attempt_id_;
      return Found(std::optional<Entry>(std::move(*parsed)));
    }
    return Found(std::optional<Entry>());
  }

  Core& c_;
  const std::string base_, prefix_, attempt_id_;
  std::vector<std::string> candidates_;
};

// What append creates, fixed before its first round.
struct AppendPlan {
  std::string base;  // the queue's znode
  std::string path;  // the entry's path (a prefix, when the server adds the sequence)
  std::string data;  // the value if any, else the owner record (a candidate: nothing)
  int mode = ZOO_EPHEMERAL_SEQUENTIAL;
};

// Checks append's arguments; the entry's name prefix.
Result<std::string> CheckAppend(std::string_view queue, const EntrySpec& spec) {
  if (Status s = ValidateQueueName(queue); !s.ok()) return s;
  auto prefix = EntryNamePrefix(spec.kind, spec.attempt_id);
  if (!prefix.ok()) return prefix.status();
  if (spec.sequence && (*spec.sequence < INT32_MIN || *spec.sequence > INT32_MAX)) {
    return InvalidArgumentError("sequence " + std::to_string(*spec.sequence) + " is not a ZooKeeper sequence");
  }
  if (spec.sequence && spec.kind == entry_kind::kCandidate) {
    // A latch node ahead of the head would change it with no event on the
    // head's node (and Curator never makes one).
    return FailedPreconditionError("the zk store gives a candidate no chosen sequence (Curator's latch does not)");
  }
  if (Status s = CheckEntryValue(spec.value); !s.ok()) return s;
  return prefix;
}

// append: the create and a getChildren in one round trip (after the
// parents, from the second round on); if a create with a given sequence
// finds the node, an exists() to adopt our own earlier attempt; an exists()
// per child of unknown shape for the queue's snapshot.
class AppendOp final : public Rounds<Result<Appended>> {
 public:
  AppendOp(Core& c, AppendPlan plan, EntrySpec spec) : c_(c), plan_(std::move(plan)), spec_(std::move(spec)) {}

  std::shared_ptr<Batch> first() override { return std::get<std::shared_ptr<Batch>>(create_round()); }

  Next step(Status awaited, Batch& b) override {
    if (stage_ == Stage::kSnapshot) return on_snapshot(std::move(awaited), b);
    if (!awaited.ok()) return Result<Appended>(std::move(awaited));
    if (stage_ == Stage::kAdopt) return on_adopt(b);
    return on_created(b);
  }

 private:
  enum class Stage { kCreate, kAdopt, kSnapshot };
  static constexpr int kMaxParentRounds = 5;

  // Parents are created only after a create failed for want of them:
  // creating an existing znode is a (failed) write on every server.
  Next create_round() {
    if (round_ == kMaxParentRounds) {
      return Result<Appended>(
          UnavailableError("could not create the parents of " + plan_.base + ": they kept disappearing"));
    }
    parents_.clear();
    if (round_++ > 0) parents_ = PathPrefixes(plan_.base);
    stage_ = Stage::kCreate;
    auto b = c_.new_batch();
    b->what = "create " + plan_.path;
    for (const auto& p : parents_) AddCreateContainer(*b, p, c_.cfg().acl());
    AddCreate(*b, plan_.path, plan_.data, c_.cfg().acl(), plan_.mode);
    AddChildren(*b, plan_.base);  // same round trip; answered after the create
    return b;
  }

  Next on_created(Batch& b) {
    for (std::size_t i = 0; i < parents_.size(); ++i) {
      int rc = b[i].rc;
      if (rc != ZOK && rc != ZNODEEXISTS && rc != ZNONODE) return Result<Appended>(c_.error(rc, "create", parents_[i]));
    }
    const Slot& created = b[parents_.size()];
    const Slot& listed = b[parents_.size() + 1];
    listed_rc_ = listed.rc;
    listed_names_ = listed.names;
    // A parent is missing, or a container vanished: create them.
    if (created.rc == ZNONODE) return create_round();
    if (created.rc == ZNODEEXISTS && spec_.sequence) {
      // Our own earlier attempt whose reply was lost? Ours if this session owns it.
      stage_ = Stage::kAdopt;
      auto e = c_.new_batch();
      e->what = "exists " + plan_.path;
      AddExists(*e, plan_.path, nullptr, nullptr);
      return e;
    }
    if (created.rc != ZOK) return Result<Appended>(c_.error(created.rc, "create", plan_.path));
    return made(LastComponent(created.value), created.stat);
  }

  Next on_adopt(Batch& e) {
    if (e[0].rc == ZNONODE) return create_round();  // gone meanwhile: another round
    if (e[0].rc != ZOK) return Result<Appended>(c_.error(e[0].rc, "exists", plan_.path));
    if (e[0].stat.ephemeralOwner != c_.session_id()) {
      return Result<Appended>(AlreadyExistsError(plan_.path + " exists and belongs to another session"));
    }
    return made(LastComponent(plan_.path), e[0].stat);
  }

  // The result of a created (or adopted) entry `name`, with the queue as the
  // getChildren behind the create saw it, when that snapshot can be had.
  Next made(const std::string& name, const Stat& stat) {
    const std::int64_t sid = c_.session_id();
    if (stat.ephemeralOwner != sid) {
      return Result<Appended>(InternalError("ZooKeeper created " + plan_.base + "/" + name + " for session " +
                                            Hex(stat.ephemeralOwner) + ", not for this session " + Hex(sid)));
    }
    auto parsed = ParseChildName(name);
    if (!parsed) {
      return Result<Appended>(
          InternalError("ZooKeeper created " + plan_.base + "/" + name + ", which has no sequence suffix"));
    }
    out_.entry = std::move(*parsed);
    out_.entry.kind = spec_.kind;
    out_.entry.token = static_cast<std::uint64_t>(stat.czxid);  // zxids only grow, store-wide
    out_.entry.attempt_id = spec_.attempt_id;
    // The node keeps the owner record only where it holds no value.
    if (!spec_.value && spec_.kind != entry_kind::kCandidate) out_.entry.owner = spec_.owner;
    out_.entry.value = spec_.value;
    out_.entry.value_version = static_cast<std::uint64_t>(stat.version);
    out_.entry.created_unix_ms = stat.ctime;
    // Without the snapshot (if children of unknown shape cannot be checked
    // now) the recipe lists the queue itself: the append stands either way.
    if (listed_rc_ != ZOK || std::find(listed_names_.begin(), listed_names_.end(), name) == listed_names_.end()) {
      return Result<Appended>(std::move(out_));
    }
    snapshot_ = ParseChildren(listed_names_);
    if (snapshot_.unsure.empty()) return with_queue(std::move(snapshot_.entries));
    stage_ = Stage::kSnapshot;
    return ResolveBatch(c_, plan_.base, snapshot_);
  }

  Next on_snapshot(Status awaited, Batch& e) {
    if (!awaited.ok()) return Result<Appended>(std::move(out_));
    auto resolved = ApplyResolve(c_, plan_.base, snapshot_, e);
    if (!resolved.ok()) return Result<Appended>(std::move(out_));
    return with_queue(std::move(*resolved));
  }

  Next with_queue(std::vector<Entry> queue) {
    for (auto& e : queue) {
      if (e.id == out_.entry.id) e.token = out_.entry.token;
    }
    out_.queue = std::move(queue);
    return Result<Appended>(std::move(out_));
  }

  Core& c_;
  const AppendPlan plan_;
  const EntrySpec spec_;
  Stage stage_ = Stage::kCreate;
  int round_ = 0;
  std::vector<std::string> parents_;
  int listed_rc_ = ZSYSTEMERROR;
  std::vector<std::string> listed_names_;
  ParsedChildren snapshot_;
  Appended out_;
};

Result<std::shared_ptr<Rounds<Result<Appended>>>> MakeAppend(Core& c, std::string_view queue, const EntrySpec& spec) {
  auto prefix = CheckAppend(queue, spec);
  if (!prefix.ok()) return prefix.status();
  if (Status s = c.usable(); !s.ok()) return s;
  AppendPlan plan;
  plan.base = QueuePath(c.cfg().chroot, queue);
  plan.path = plan.base + "/" + *prefix;
  if (spec.sequence) {
    // Lock downgrade (Curator's CURATOR-621 fix): the same sequence as the
    // entry it replaces, so that it sorts exactly where that one is.
    plan.path += FormatSequence(static_cast<std::int32_t>(*spec.sequence));
    plan.mode = ZOO_EPHEMERAL;
  }
  // Where other clients read it: Curator takes a latch node's data as the
  // participant's id, and reads no owner record.
  if (spec.value) {
    plan.data = *spec.value;
  } else if (spec.kind != entry_kind::kCandidate) {
    plan.data = EncodeOwnerRecord(spec.owner);
  }
  return std::shared_ptr<Rounds<Result<Appended>>>(std::make_shared<AppendOp>(c, std::move(plan), spec));
}

// Checks the arguments and the session; the request, ready to run.
Result<std::shared_ptr<Rounds<Listed>>> MakeList(Core& c, std::string_view queue, const ListOptions& options) {
  if (Status s = ValidateQueueName(queue); !s.ok()) return s;
  if (Status s = c.usable(); !s.ok()) return s;
  return std::shared_ptr<Rounds<Listed>>(std::make_shared<ListOp>(c, QueuePath(c.cfg().chroot, queue), options));
}

Result<std::shared_ptr<Rounds<Status>>> MakeRemove(Core& c, std::string_view queue, std::string_view id) {
  if (Status s = ValidateQueueName(queue); !s.ok()) return s;
  if (Status s = ValidateEntryId(id); !s.ok()) return s;
  if (Status s = c.usable(); !s.ok()) return s;
  return std::shared_ptr<Rounds<Status>>(
      std::make_shared<RemoveOp>(c, QueuePath(c.cfg().chroot, queue) + "/" + std::string(id)));
}

Result<std::shared_ptr<Rounds<Found>>> MakeFindOwn(Core& c, std::string_view queue, std::string_view attempt_id) {
  if (Status s = ValidateQueueName(queue); !s.ok()) return s;
  auto prefix = ProtectedPrefix(attempt_id);
  if (!prefix.ok()) return prefix.status();
  if (Status s = c.usable(); !s.ok()) return s;
  return std::shared_ptr<Rounds<Found>>(
      std::make_shared<FindOwnOp>(c, QueuePath(c.cfg().chroot, queue), std::move(*prefix), std::string(attempt_id)));
}

// update_entry: getData (is the entry ours, does it hold a value), then a
// setData on the version read. A concurrent update of the same entry (by
// another thread of this session) makes the setData fail, and the round
// starts again on what it wrote: an owner record never overwrites a value
// that came in between.
class UpdateOp final : public Rounds<Result<Entry>> {
 public:
  UpdateOp(Core& c, std::string path, std::string id, EntryUpdate update)
      : c_(c), path_(std::move(path)), id_(std::move(id)), update_(std::move(update)) {}

  std::shared_ptr<Batch> first() override {
    writing_ = false;
    auto b = c_.new_batch();
    b->what = "getData " + path_;
    AddGet(*b, path_, nullptr, nullptr);
    return b;
  }

  Next step(Status awaited, Batch& b) override {
    if (!awaited.ok()) return Result<Entry>(std::move(awaited));
    return writing_ ? on_written(b) : on_read(b);
  }

 private:
  static constexpr int kMaxRounds = 100;  // each lost race is another update's success

  Result<Entry> gone() const {
    return FailedPreconditionError("no entry " + path_ + " of ZooKeeper session " + Hex(c_.session_id()));
  }

  Next on_read(Batch& b) {
    const Slot& s = b[0];
    if (s.rc == ZNONODE) return gone();
    if (s.rc != ZOK) return Result<Entry>(c_.error(s.rc, "getData", path_));
    auto parsed = ParseChildName(id_);
    if (!parsed || s.stat.ephemeralOwner != c_.session_id()) return gone();
    entry_ = std::move(*parsed);
    ReadNodeData(entry_, s, {.with_owners = true, .with_values = true});
    if (entry_.kind == entry_kind::kCandidate) entry_.owner.reset();
    const bool holds_value = entry_.kind == entry_kind::kCandidate || entry_.value.has_value();
    if (update_.owner && (update_.value || holds_value)) {
      // docs/election.md §6.1: the data is the bare value, which Curator
      // reads; there is no other place for the record. Refused, not dropped.
      return Result<Entry>(UnimplementedError("the zk store keeps no owner record beside a value (" + path_ +
                                              "): its data is the value other clients read"));
    }
    if (!update_.value && !update_.owner) return Result<Entry>(std::move(entry_));
    writing_ = true;
    auto w = c_.new_batch();
    w->what = "setData " + path_;
    AddSetData(*w, path_, update_.value ? *update_.value : EncodeOwnerRecord(*update_.owner), s.stat.version);
    return w;
  }

  Next on_written(Batch& b) {
    const Slot& s = b[0];
    if (s.rc == ZBADVERSION) {
      if (++rounds_ == kMaxRounds) {
        return Result<Entry>(UnavailableError("update of " + path_ + ": its data kept changing; nothing written"));
      }
      return first();
    }
    if (s.rc == ZNONODE) return gone();
    if (s.rc != ZOK) return Result<Entry>(c_.error(s.rc, "setData", path_));
    entry_.value_version = static_cast<std::uint64_t>(s.stat.version);
    if (update_.value) {
      entry_.value = update_.value->empty() ? std::nullopt : update_.value;
      entry_.owner.reset();
    } else {
      entry_.owner = update_.owner;
    }
    return Result<Entry>(std::move(entry_));
  }

  Core& c_;
  const std::string path_, id_;
  const EntryUpdate update_;
  bool writing_ = false;
  int rounds_ = 0;
  Entry entry_;
};

// read_head: sync, getChildren (with the queue znode's stat: its pzxid is
// the reading's position), an exists() per child of unknown shape, then
// getData of the first entry; if that entry went in between, again.
//
// The sync (pipelined with the getChildren, answered in order) makes the
// reading as fresh as the leader when it is sent. Without it a reading on a
// new session could be older than one already reported: a new handle has
// seen no zxid, so it may connect to a follower that lags behind the one the
// last session read from, and an observer would report a stale leader after
// its session was replaced. It also lets leader() see a change that another
// process was told of before the call. (As for FindOwnOp: no test, the
// proxies cannot delay one follower's commits.)
class ReadHeadOp final : public Rounds<Result<Head>> {
 public:
  ReadHeadOp(Core& c, std::string base, ListOptions options) : c_(c), base_(std::move(base)), options_(options) {
    options_.with_values = true;
  }

  std::shared_ptr<Batch> first() override {
    stage_ = Stage::kChildren;
    auto b = c_.new_batch();
    b->what = "sync and getChildren " + base_;
    AddSync(*b, base_);
    AddChildrenStat(*b, base_);
    return b;
  }

  Next step(Status awaited, Batch& b) override {
    if (!awaited.ok()) return Result<Head>(std::move(awaited));
    switch (stage_) {
      case Stage::kChildren: return on_children(b);
      case Stage::kResolve: {
        auto resolved = ApplyResolve(c_, base_, parsed_, b);
        if (!resolved.ok()) return Result<Head>(resolved.status());
        return with_entries(std::move(*resolved));
      }
      case Stage::kData: return on_data(b);
    }
    return Result<Head>(InternalError("read_head: no such stage"));
  }

 private:
  enum class Stage { kChildren, kResolve, kData };
  static constexpr int kMaxRounds = 100;  // each one saw a head go

  Next on_children(Batch& b) {
    // A sync of a path that does not exist is answered ZOK all the same.
    if (b[0].rc != ZOK) return Result<Head>(c_.error(b[0].rc, "sync", base_));
    if (b[1].rc == ZNONODE) return Result<Head>(Head{});  // no queue znode: empty, position 0
    if (b[1].rc != ZOK) return Result<Head>(c_.error(b[1].rc, "getChildren", base_));
    head_ = Head{};
    head_.position = b[1].stat.pzxid;
    parsed_ = ParseChildren(b[1].names);
    if (parsed_.unsure.empty()) return with_entries(std::move(parsed_.entries));
    stage_ = Stage::kResolve;
    return ResolveBatch(c_, base_, parsed_);
  }

  Next with_entries(std::vector<Entry> entries) {
    if (entries.empty()) return Result<Head>(std::move(head_));
    head_.entry = std::move(entries.front());
    stage_ = Stage::kData;
    auto d = c_.new_batch();
    d->what = "getData " + base_ + "/" + head_.entry->id;
    AddGet(*d, base_ + "/" + head_.entry->id, nullptr, nullptr);
    return d;
  }

  Next on_data(Batch& d) {
    const Slot& s = d[0];
    if (s.rc == ZNONODE) {
      if (++rounds_ == kMaxRounds) {
        return Result<Head>(UnavailableError("the head of " + base_ + " kept going before it could be read"));
      }
      return first();
    }
    if (s.rc != ZOK) return Result<Head>(c_.error(s.rc, "getData", base_ + "/" + head_.entry->id));
    ReadNodeData(*head_.entry, s, options_);
    return Result<Head>(std::move(head_));
  }

  Core& c_;
  const std::string base_;
  ListOptions options_;
  Stage stage_ = Stage::kChildren;
  int rounds_ = 0;
  ParsedChildren parsed_;
  Head head_;
};

Result<std::shared_ptr<Rounds<Result<Entry>>>> MakeUpdate(Core& c, std::string_view queue, std::string_view id,
                                                          const EntryUpdate& update) {
  if (Status s = ValidateQueueName(queue); !s.ok()) return s;
  if (Status s = ValidateEntryId(id); !s.ok()) return s;
  if (Status s = CheckEntryValue(update.value); !s.ok()) return s;
  if (Status s = c.usable(); !s.ok()) return s;
  return std::shared_ptr<Rounds<Result<Entry>>>(
      std::make_shared<UpdateOp>(c, QueuePath(c.cfg().chroot, queue) + "/" + std::string(id), std::string(id), update));
}

Result<std::shared_ptr<Rounds<Result<Head>>>> MakeReadHead(Core& c, std::string_view queue,
                                                           const ListOptions& options) {
  if (Status s = ValidateQueueName(queue); !s.ok()) return s;
  if (Status s = c.usable(); !s.ok()) return s;
  return std::shared_ptr<Rounds<Result<Head>>>(
      std::make_shared<ReadHeadOp>(c, QueuePath(c.cfg().chroot, queue), options));
}

}  // namespace

Result<Appended> ZkSession::append(std::string_view queue, const EntrySpec& spec, Clock::time_point deadline) {
  auto op = MakeAppend(*core_, queue, spec);
  if (!op.ok()) return op.status();
  return RunBlocking(*core_, **op, core_->reply_deadline(deadline));
}

void ZkSession::async_append(std::string_view queue, const EntrySpec& spec, Clock::time_point deadline,
                             std::function<void(Result<Appended>)> done) {
  StartAsync(*core_, MakeAppend(*core_, queue, spec), core_->reply_deadline(deadline), std::move(done));
}

Result<std::vector<Entry>> ZkSession::list(std::string_view queue, const ListOptions& options,
                                           Clock::time_point deadline) {
  auto op = MakeList(*core_, queue, options);
  if (!op.ok()) return op.status();
  return RunBlocking(*core_, **op, core_->reply_deadline(deadline));
}

void ZkSession::async_list(std::string_view queue, const ListOptions& options, Clock::time_point deadline,
                           std::function<void(Result<std::vector<Entry>>)> done) {
  StartAsync(*core_, MakeList(*core_, queue, options), core_->reply_deadline(deadline), std::move(done));
}

Status ZkSession::remove(std::string_view queue, std::string_view id, Clock::time_point deadline) {
  auto op = MakeRemove(*core_, queue, id);
  if (!op.ok()) return op.status();
  return RunBlocking(*core_, **op, core_->reply_deadline(deadline));
}

void ZkSession::async_remove(std::string_view queue, std::string_view id, Clock::time_point deadline,
                             std::function<void(Status)> done) {
  StartAsync(*core_, MakeRemove(*core_, queue, id), core_->reply_deadline(deadline), std::move(done));
}

Result<std::optional<Entry>> ZkSession::find_own(std::string_view queue, std::string_view attempt_id,
                                                 Clock::time_point deadline) {
  auto op = MakeFindOwn(*core_, queue, attempt_id);
  if (!op.ok()) return op.status();
  return RunBlocking(*core_, **op, core_->reply_deadline(deadline));
}

void ZkSession::async_find_own(std::string_view queue, std::string_view attempt_id, Clock::time_point deadline,
                               std::function<void(Result<std::optional<Entry>>)> done) {
  StartAsync(*core_, MakeFindOwn(*core_, queue, attempt_id), core_->reply_deadline(deadline), std::move(done));
}

Result<Entry> ZkSession::update_entry(std::string_view queue, std::string_view id, const EntryUpdate& update,
                                      Clock::time_point deadline) {
  auto op = MakeUpdate(*core_, queue, id, update);
  if (!op.ok()) return op.status();
  return RunBlocking(*core_, **op, core_->reply_deadline(deadline));
}

void ZkSession::async_update_entry(std::string_view queue, std::string_view id, const EntryUpdate& update,
                                   Clock::time_point deadline, std::function<void(Result<Entry>)> done) {
  StartAsync(*core_, MakeUpdate(*core_, queue, id, update), core_->reply_deadline(deadline), std::move(done));
}

void ZkSession::async_read_head(std::string_view queue, const ListOptions& options, Clock::time_point deadline,
                                std::function<void(Result<Head>)> done) {
  StartAsync(*core_, MakeReadHead(*core_, queue, options), core_->reply_deadline(deadline), std::move(done));
}

// One waiter of the wait machinery (Core, "Watches"), whose round checks the
// reading and whose every event ends it: set again after a reconnect by the
// C client, re-sent by the session thread if its round met connection trouble.
std::shared_ptr<void> ZkSession::async_watch_head(std::string_view queue, const Head& seen,
                                                  std::function<void(Status)> done) {
  Status valid = ValidateQueueName(queue);
  if (valid.ok() && seen.entry) valid = ValidateEntryId(seen.entry->id);
  if (!valid.ok()) {
    done(std::move(valid));
    return std::make_shared<int>(0);  // nothing left to cancel
  }
  AsyncWaiter::HeadSeen h;
  h.queue_path = QueuePath(core_->cfg().chroot, queue);
  h.pzxid = seen.position;
  std::vector<std::string> paths;
  if (seen.entry) {
    h.entry_path = h.queue_path + "/" + seen.entry->id;
    // A Head made otherwise may carry a version no node has: it fires at once.
    h.version = seen.entry->value_version > static_cast<std::uint64_t>(INT32_MAX)
                    ? -1
                    : static_cast<std::int64_t>(seen.entry->value_version);
    h.children = seen.entry->kind == entry_kind::kWrite;  // a downgrade's read entry may sort before it
    paths.push_back(h.entry_path);
  }
  if (!seen.entry || h.children) paths.push_back(h.queue_path);
  std::sort(paths.begin(), paths.end());
  auto w = std::make_shared<AsyncWaiter>(std::move(paths), "watching the head of " + std::string(queue),
                                         [done = std::move(done)](Status s, bool) { done(std::move(s)); });
  w->head = std::move(h);
  return StartWait(core_, std::move(w));
}

void ZkSession::close() noexcept { core_->close(); }

}  // namespace dlock::internal::zk
