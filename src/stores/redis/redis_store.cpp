// The redis:// store. See redis_store.hpp for what it guarantees,
// redis_scripts.hpp for the key layout, redis_subscriber.hpp for waiting.
//
// Connections of one Store:
//  - a small pool of command connections (blocking appends, lists, removes,
//    and the waits' checks);
//  - one subscriber connection, owned by the Subscriber's thread, which also
//    runs every wait (async_wait_any_gone: a waiter object, no thread each;
//    the blocking wait_any_gone blocks on one);
//  - one keep-alive connection per session, owned by its keep-alive thread,
//    so that a slow request (or a WAIT for replicas) never delays a renewal.
//  - one request-loop connection, owned by the RequestLoop's thread, which
//    carries the async_ requests of every session, pipelined
//    (redis_loop.hpp); the blocking requests use the pool.
// So a store runs at most one subscriber thread, one loop thread, and one
// keep-alive thread per open session (a Client has one at a time).
//
// Session lease accounting. A session's entries live while its *mirror* in
// their queue exists (redis_scripts.hpp). Each mirror, like the session key,
// is extended to expire `ttl` after a request that the client *sent* at some
// time B (its "basis"): the server receives it later, so it expires no
// earlier than B + ttl on the server. Replies prove a basis: the keep-alive's
// renewal of an existing mirror proves the renewal's (unless one of the
// session's removes crossed it: a remove deletes the mirror with the
// session's last entry in the queue), an append or a find_own that found the
// entry proves the one it computed its TTL from. The client keeps the basis
// of the session key and of every mirror it relies on (the queues where it
// has confirmed entries that it is not removing), and declares the session
// lost at min(basis) + ttl - margin, by its own monotonic clock: before any
// lease can run out on the server (clock rates being equal to within the
// margin), so a holder always hears kLost before anyone else can take its
// place. Mirrors are only ever extended (PTTL is checked before PEXPIRE), so
// a late request can never shorten a lease the client counts on; and only
// appends create them, so a late renewal can never bring back a lease that
// ran out.
#include "stores/redis/redis_store.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <system_error>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/dlock_thread.hpp"
#include "core/event_signal.hpp"
#include "core/listeners.hpp"
#include "core/random_id.hpp"
#include "core/thread_annotations.hpp"
#include "stores/blocking_wait.hpp"
#include "stores/entry_value.hpp"
#include "stores/redis/redis_conn.hpp"
#include "stores/redis/redis_entries.hpp"
#include "stores/redis/redis_loop.hpp"
#include "stores/redis/redis_scripts.hpp"
#include "stores/redis/redis_subscriber.hpp"

namespace dlock::internal {
namespace redis {
namespace {

using std::chrono::milliseconds;

constexpr std::int64_t kMaxSequence = std::int64_t{1} << 53;  // exact in a ZSET score
constexpr std::size_t kPoolSize = 4;

// The names of one queue's keys (see redis_scripts.hpp).
struct QueueKeys {
  std::string base;     // dlock:{Q}:
  std::string zset;     // dlock:{Q}:q
  std::string counter;  // dlock:{Q}:n
  std::string channel;  // dlock:{Q}:c[:DB]
  std::string heads;    // dlock:{Q}:h[:DB]
  std::string entry(std::string_view id) const { return base + "e:" + std::string(id); }
  std::string mirror(std::string_view sid) const { return base + "s:" + std::string(sid); }
};

QueueKeys KeysFor(std::string_view queue, int db) {
  QueueKeys k;
  k.base = "dlock:{" + std::string(queue) + "}:";
  k.zset = k.base + "q";
  k.counter = k.base + "n";
  // Pub/sub ignores SELECT: name the database so stores on different
  // databases of one server do not hear each other.
  const std::string db_suffix = db != 0 ? ":" + std::to_string(db) : std::string();
  k.channel = k.base + "c" + db_suffix;
  k.heads = k.base + "h" + db_suffix;  // the scripts name it the same way (kPrelude)
  return k;
}

// A reading's head as a head watch compares it.
HeadMark MarkOf(const Head& head) {
  HeadMark m;
  if (head.entry) {
    m.id = head.entry->id;
    m.value_version = head.entry->value_version;
  }
  m.position = head.position;
  return m;
}

// The update script's answer when the entry is not the session's, or gone.
bool Gone(const Reply& r) { return r.is_array() && r.size() == 1 && ElementStr(r.element(0)) == "gone"; }

std::string SessionKey(std::string_view sid) { return "dlock:session:" + std::string(sid); }

// The append script's answer when find_own already settled the attempt.
bool Fenced(const Reply& r) { return r.is_array() && r.size() == 1 && ElementStr(r.element(0)) == "fenced"; }

// The server forgot the scripts (a restart, SCRIPT FLUSH).
bool IsNoScript(const Reply& r) { return r.is_error() && r.str().substr(0, 8) == "NOSCRIPT"; }

// --- Configuration

struct Config {
  Endpoint endpoint;
  std::string url;  // redacted
  std::shared_ptr<Clock> clock;
  milliseconds ttl{30'000};
  milliseconds op_timeout{10'000};
  int wait_replicas = 0;
  milliseconds wait_timeout{1'000};

  milliseconds renew_every() const { return ttl / 3; }
  // How long before the server could let the lease run out the client gives
  // up: covers clock rate differences and its own scheduling delay.
  milliseconds margin() const { return std::max(ttl / 10, milliseconds(20)); }
  milliseconds retry_interval() const { return std::clamp(ttl / 10, milliseconds(50), milliseconds(1'000)); }
};

// --- Connection pool

class Pool {
 public:
  // A connection lent out of the pool, or none (default). It goes back
  // when dropped; it is closed instead if it broke, or if it is dropped by
  // an exception thrown while it was lent (which may have left a request's
  // answer unread on it).
  class Lent {
   public:
    Lent() = default;
    Lent(Pool& pool, std::unique_ptr<Conn> conn, bool fresh) : pool_(&pool), conn_(std::move(conn)), fresh_(fresh) {}
    Lent(Lent&& other) noexcept
        : pool_(std::exchange(other.pool_, nullptr)), conn_(std::move(other.conn_)), fresh_(other.fresh_) {}
    Lent& operator=(Lent&& other) noexcept {
      if (this == &other) return *this;
      Lent gone(std::move(*this));  // back to the pool
      pool_ = std::exchange(other.pool_, nullptr);
      conn_ = std::move(other.conn_);
      fresh_ = other.fresh_;
      unwinding_ = std::uncaught_exceptions();
      return *this;
    }
    ~Lent() {
      if (pool_ == nullptr) return;
      if (std::uncaught_exceptions() > unwinding_) conn_.reset();  // never lent again with an answer unread
      pool_->release(std::move(conn_));
    }
    explicit operator bool() const { return pool_ != nullptr; }
    Conn& conn() { return *conn_; }
    bool fresh() const { return fresh_; }

   private:
    Pool* pool_ = nullptr;
    std::unique_ptr<Conn> conn_;
    bool fresh_ = false;                          // opened for this loan
    int unwinding_ = std::uncaught_exceptions();  // exceptions in flight when it was lent
  };

  Pool(Endpoint ep, std::size_t max) : ep_(std::move(ep)), max_(max) {}

  // A connection: an idle one, or one opened now while fewer than the
  // maximum are open; otherwise, with `wait`, the first one given back
  // before `deadline`, and without it none (an empty Lent) at once.
  Result<Lent> lend(IoClock::time_point deadline, bool wait) DLOCK_EXCLUDES(mu_) {
    MutexLock lk(mu_);
    for (;;) {
      if (!idle_.empty()) {
        auto c = std::move(idle_.back());
        idle_.pop_back();
        return Lent(*this, std::move(c), false);
      }
      if (open_ < max_) {
        ++open_;
        lk.unlock();
        // Without the lock: others may use the idle ones meanwhile.
        auto c = [&]() -> Result<std::unique_ptr<Conn>> {
          try {
            return Conn::open(ep_, deadline);
          } catch (...) {
            free_slot();
            throw;
          }
        }();
        if (!c.ok()) {
          free_slot();
          return c.status();
        }
        return Lent(*this, std::move(*c), true);
      }
      if (!wait) return Lent();
      if (cv_.wait_until(lk.native(), deadline) == std::cv_status::timeout && idle_.empty() && open_ >= max_) {
        return UnavailableError("redis store: all " + std::to_string(max_) + " connections stayed busy");
      }
    }
  }

  // A connection, waiting for one until `deadline` when all are lent out.
  Result<Lent> acquire(IoClock::time_point deadline) DLOCK_EXCLUDES(mu_) { return lend(deadline, /*wait=*/true); }

  void adopt(std::unique_ptr<Conn> c) DLOCK_EXCLUDES(mu_) {
    MutexLock lk(mu_);
    ++open_;
    idle_.push_back(std::move(c));
    cv_.notify_one();
  }

 private:
  // A connection that was to be opened was not.
  void free_slot() DLOCK_EXCLUDES(mu_) {
    MutexLock lk(mu_);
    --open_;
    cv_.notify_one();
  }

  void release(std::unique_ptr<Conn> c) DLOCK_EXCLUDES(mu_) {
    MutexLock lk(mu_);
    if (c && !c->broken()) {
      idle_.push_back(std::move(c));
    } else {
      --open_;
    }
    cv_.notify_one();
  }

  const Endpoint ep_;
  const std::size_t max_;
  Mutex mu_;
  std::condition_variable cv_;  // a connection came back, or a slot freed up
  std::vector<std::unique_ptr<Conn>> idle_ DLOCK_GUARDED_BY(mu_);
  std::size_t open_ DLOCK_GUARDED_BY(mu_) = 0;  // idle or lent out
};

// An asynchronous request's answer, waited for on this thread (never a
// dlock thread: the answer comes on one).
template <class T, class Start>
T AwaitAnswer(Start start) {
  auto answer = std::make_shared<std::promise<T>>();  // shared: set_value may still run when get() returns
  std::future<T> got = answer->get_future();
  start([answer](T r) { answer->set_value(std::move(r)); });
  return got.get();
}

// --- The shared part of a store

class StoreCore {
 public:
  StoreCore(Config cfg, std::array<std::string, kScriptCount> shas)
      : cfg_(std::move(cfg)), shas_(std::move(shas)), pool_(cfg_.endpoint, kPoolSize) {}
  ~StoreCore() {
    std::shared_ptr<RequestLoop> loop;
    std::shared_ptr<Subscriber> sub;
    {
      MutexLock lk(sub_mu_);
      loop = std::move(loop_);
      sub = std::move(sub_);
    }
    if (loop) loop->shut_down();
    if (sub) sub->shut_down();
  }
  StoreCore(const StoreCore&) = delete;
  StoreCore& operator=(const StoreCore&) = delete;

  const Config& cfg() const { return cfg_; }
  Pool& pool() { return pool_; }
  const std::string& sha(ScriptId id) const { return shas_[static_cast<int>(id)]; }

  // The socket deadline for a request made with the caller's `deadline`:
  // "at most about the deadline plus one round trip", and never more than
  // the request timeout.
  IoClock::time_point io_deadline(Clock::time_point deadline) const {
    auto floor = std::min<Clock::duration>(cfg_.op_timeout, milliseconds(1'000));
    Clock::duration left = cfg_.op_timeout;
    if (deadline != kNoDeadline) left = deadline - cfg_.clock->now();
    left = std::clamp<Clock::duration>(left, floor, cfg_.op_timeout);
    return IoClock::now() + left;
  }

  // The socket deadline for a request that must follow one whose deadline
  // may have been used up (taking back an entry a WAIT found undurable).
  IoClock::time_point one_more_round_trip() const {
    return IoClock::now() + std::min<Clock::duration>(cfg_.op_timeout, milliseconds(1'000));
  }

  // A script's reply, and how many replicas acknowledged its writes when a
  // WAIT followed it (-1 when none did).
  struct Scripted {
    Reply reply;
    int acked = -1;
  };

  // Fewer replicas acknowledged than wait_replicas asks for.
  bool short_of_replicas(int acked) const { return acked >= 0 && acked < cfg_.wait_replicas; }
  std::string short_of_replicas_message(int acked, std::string_view what) const {
    return "redis store: only " + std::to_string(acked) + " of " + std::to_string(cfg_.wait_replicas) +
           " replicas acknowledged the " + std::string(what) + " within " + std::to_string(cfg_.wait_timeout.count()) +
           "ms";
  }

  // Runs a script on one connection: EVALSHA, EVAL if the server forgot it
  // (NOSCRIPT, after a restart or SCRIPT FLUSH); then, with `wait` and
  // wait_replicas set, WAIT in the same round trip. A WAIT that falls short
  // is not an error here: the caller decides (see Scripted).
  Result<Scripted> script_on(Conn& c, ScriptId id, const std::vector<std::string>& keys,
                             const std::vector<std::string>& args, IoClock::time_point deadline, bool wait) {
    Command cmd;
    cmd.reserve(3 + keys.size() + args.size());
    cmd.push_back("EVALSHA");
    cmd.push_back(sha(id));
    cmd.push_back(std::to_string(keys.size()));
    cmd.insert(cmd.end(), keys.begin(), keys.end());
    cmd.insert(cmd.end(), args.begin(), args.end());
    std::vector<Command> cmds{cmd};
    wait = wait && cfg_.wait_replicas > 0;
    if (wait) {
      cmds.push_back(wait_command());
      deadline += cfg_.wait_timeout;
    }
    // The WAIT must follow the script's writes: sent again with it.
    auto r = pipeline_scripts(c, cmds, /*resend_last=*/wait, deadline);
    if (!r.ok()) return r.status();
    Reply& first = (*r)[0];
    if (first.is_error()) {
      return ErrorReplyStatus(first.str(), "redis store: script " + std::string(ScriptName(id)));
    }
    Scripted out{std::move(first), -1};
    if (wait) {
      const Reply& w = (*r)[1];
      if (w.is_error()) return ErrorReplyStatus(w.str(), "redis store: WAIT");
      out.acked = static_cast<int>(w.integer());
    }
    return out;
  }

  // Sends `cmds` (EVALSHAs of dlock's scripts, and other commands) on `c`
  // in one round trip. An EVALSHA the server answers NOSCRIPT (it forgot the
  // scripts: a restart, SCRIPT FLUSH) is sent again as EVAL with the script's
  // source, in a second round trip, followed once more by the last command
  // of `cmds` when `resend_last` (a WAIT, which must follow the writes it
  // waits for). Running a script twice is harmless: every one is idempotent.
  // The second round trip's replies replace the first's.
  Result<std::vector<Reply>> pipeline_scripts(Conn& c, const std::vector<Command>& cmds, bool resend_last,
                                              IoClock::time_point deadline) {
    auto r = c.pipeline(cmds, deadline);
    if (!r.ok()) return r.status();
    auto [again, retry] = noscript_retry(cmds, *r, resend_last);
    if (again.empty()) return r;
    auto r2 = c.pipeline(retry, deadline);
    if (!r2.ok()) return r2.status();
    for (std::size_t j = 0; j < again.size(); ++j) (*r)[again[j]] = std::move((*r2)[j]);
    return r;
  }

  // The commands of `cmds` to send again after `replies` (see
  // pipeline_scripts), and their indexes.
  std::pair<std::vector<std::size_t>, std::vector<Command>> noscript_retry(const std::vector<Command>& cmds,
                                                                           const std::vector<Reply>& replies,
                                                                           bool resend_last) const {
    std::vector<std::size_t> again;
    for (std::size_t i = 0; i < replies.size(); ++i) {
      if (cmds[i].size() >= 2 && cmds[i][0] == "EVALSHA" && IsNoScript(replies[i])) again.push_back(i);
    }
    std::vector<Command> retry;
    if (again.empty()) return {again, retry};
    if (resend_last && again.back() != cmds.size() - 1) again.push_back(cmds.size() - 1);
    for (std::size_t i : again) {
      Command cmd = cmds[i];
      if (IsNoScript(replies[i])) {
        cmd[0] = "EVAL";
        cmd[1] = source_of(cmd[1]);
      }
      retry.push_back(std::move(cmd));
    }
    return {again, retry};
  }

  // pipeline_scripts() on the request loop; `done` runs on its thread.
  void async_pipeline_scripts(std::vector<Command> cmds, bool resend_last, IoClock::time_point deadline,
                              RequestLoop::Done done) {
    RequestLoop& rl = loop();
    auto first = [this, &rl, cmds, resend_last, deadline,
                  done = std::move(done)](Result<std::vector<Reply>> r) mutable {
      if (!r.ok()) return done(std::move(r));
      auto [again, retry] = noscript_retry(cmds, *r, resend_last);
      if (again.empty()) return done(std::move(r));
      // Shared: a std::function must be copyable, and replies are not.
      auto replies = std::make_shared<std::vector<Reply>>(std::move(*r));
      rl.submit(std::move(retry), deadline,
                [replies, again = std::move(again), done = std::move(done)](Result<std::vector<Reply>> r2) {
                  if (!r2.ok()) return done(r2.status());
                  for (std::size_t j = 0; j < again.size(); ++j) (*replies)[again[j]] = std::move((*r2)[j]);
                  done(std::move(*replies));
                });
    };
    rl.submit(std::move(cmds), deadline, std::move(first));
  }

  // script_on() on the request loop.
  void async_script(ScriptId id, const std::vector<std::string>& keys, const std::vector<std::string>& args,
                    IoClock::time_point deadline, bool wait, std::function<void(Result<Scripted>)> done) {
    Command cmd;
    cmd.reserve(3 + keys.size() + args.size());
    cmd.push_back("EVALSHA");
    cmd.push_back(sha(id));
    cmd.push_back(std::to_string(keys.size()));
    cmd.insert(cmd.end(), keys.begin(), keys.end());
    cmd.insert(cmd.end(), args.begin(), args.end());
    std::vector<Command> cmds{std::move(cmd)};
    wait = wait && cfg_.wait_replicas > 0;
    if (wait) {
      cmds.push_back(wait_command());
      deadline += cfg_.wait_timeout;
    }
    async_pipeline_scripts(
        std::move(cmds), /*resend_last=*/wait, deadline,
        [id, wait, done = std::move(done)](Result<std::vector<Reply>> r) {
          if (!r.ok()) return done(r.status());
          Reply& first = (*r)[0];
          if (first.is_error()) {
            return done(ErrorReplyStatus(first.str(), "redis store: script " + std::string(ScriptName(id))));
          }
          Scripted out{std::move(first), -1};
          if (wait) {
            const Reply& w = (*r)[1];
            if (w.is_error()) return done(ErrorReplyStatus(w.str(), "redis store: WAIT"));
            out.acked = static_cast<int>(w.integer());
          }
          done(std::move(out));
        });
  }

  // Made on first use; lives as long as the store.
  RequestLoop& loop() DLOCK_EXCLUDES(sub_mu_) {
    MutexLock lk(sub_mu_);
    if (!loop_) loop_ = RequestLoop::start(cfg_.endpoint, cfg_.op_timeout);
    return *loop_;
  }

  // WAIT for the writes made so far on `c`; how many replicas acknowledged.
  Result<int> wait_on(Conn& c, IoClock::time_point deadline) {
    auto w = c.run(wait_command(), deadline + cfg_.wait_timeout);
    if (!w.ok()) return w.status();
    if (w->is_error()) return ErrorReplyStatus(w->str(), "redis store: WAIT");
    return static_cast<int>(w->integer());
  }

  // Runs `fn(conn)` on a pooled connection (`first`, when the caller has
  // one already). A request that failed on a reused connection the server
  // had closed (a restart, an idle timeout, a CLIENT KILL) is sent once more
  // on a new one, since every request dlock makes is idempotent (see the
  // scripts); a timeout is not retried.
  template <typename Fn>
  Result<Reply> pooled(IoClock::time_point deadline, Fn fn, Pool::Lent first = {}) {
    for (int attempt = 0;; ++attempt) {
      Pool::Lent lent = std::move(first);
      if (!lent) {
        auto c = pool_.acquire(deadline);
        if (!c.ok()) return c.status();
        lent = std::move(*c);
      }
      Conn& conn = lent.conn();
      Result<Reply> r = fn(conn);
      const bool retry =
          !r.ok() && conn.broken() && !conn.timed_out() && !lent.fresh() && attempt == 0 && IoClock::now() < deadline;
      lent = Pool::Lent();  // back to the pool before a retry takes one
      if (!retry) return r;
    }
  }

  // A script, without WAIT.
  Result<Reply> script(ScriptId id, const std::vector<std::string>& keys, const std::vector<std::string>& args,
                       IoClock::time_point deadline, Pool::Lent first = {}) {
    return pooled(
        deadline,
        [&](Conn& c) -> Result<Reply> {
          auto r = script_on(c, id, keys, args, deadline, /*wait=*/false);
          if (!r.ok()) return r.status();
          return std::move(r->reply);
        },
        std::move(first));
  }

  Result<Reply> command(const Command& cmd, IoClock::time_point deadline) {
    return pooled(deadline, [&](Conn& c) { return c.run(cmd, deadline); });
  }

  // Made on first use; lives as long as the store.
  Subscriber& subscriber() DLOCK_EXCLUDES(sub_mu_) {
    MutexLock lk(sub_mu_);
    if (!sub_) {
      SubscriberOptions o;
      o.endpoint = cfg_.endpoint;
      o.endpoint.db = 0;  // pub/sub is server-wide
      o.clock = cfg_.clock;
      o.ttl = cfg_.ttl;
      o.io_timeout = cfg_.op_timeout;
      o.retry_interval = cfg_.retry_interval();
      o.linger = milliseconds(5'000);
      sub_ = Subscriber::start(o);
    }
    return *sub_;
  }

  void poke_waiters() DLOCK_EXCLUDES(sub_mu_) {
    MutexLock lk(sub_mu_);
    if (sub_) sub_->poke();
  }

  void quiesce_waiters(const void* owner) DLOCK_EXCLUDES(sub_mu_) {
    Subscriber* sub = nullptr;
    {
      MutexLock lk(sub_mu_);
      sub = sub_.get();  // lives as long as the store
    }
    if (sub) sub->quiesce(owner);
  }

 private:
  // The source of the script whose SHA1 is `sha`.
  const std::string& source_of(const std::string& sha) const {
    for (int i = 0; i < kScriptCount; ++i) {
      if (shas_[i] == sha) return ScriptSource(static_cast<ScriptId>(i));
    }
    return sha;  // not one of dlock's: the server says so
  }

  Command wait_command() const {
    return {"WAIT", std::to_string(cfg_.wait_replicas), std::to_string(cfg_.wait_timeout.count())};
  }

  const Config cfg_;
  const std::array<std::string, kScriptCount> shas_;
  Pool pool_;
  Mutex sub_mu_;
  // Each thread holds its own reference: the last reference to the store
  // may go on one of them (a completion's closure holds a session, which
  // holds the store); ~StoreCore then lets that thread end on its own.
  std::shared_ptr<Subscriber> sub_ DLOCK_GUARDED_BY(sub_mu_);
  std::shared_ptr<RequestLoop> loop_ DLOCK_GUARDED_BY(sub_mu_);
};

// --- Sessions

using CoreScripted = StoreCore::Scripted;

class SessionCore;

// What an asynchronous request's completion reaches its session through:
// ~RedisSession empties it, so a reply that comes later touches nothing.
struct Anchor {
  Mutex mu;
  SessionCore* core DLOCK_GUARDED_BY(mu) = nullptr;
};

class SessionCore : public std::enable_shared_from_this<SessionCore> {
 public:
  SessionCore(std::shared_ptr<StoreCore> store, std::string sid, Clock::time_point basis)
      : store_(std::move(store)), cfg_(store_->cfg()), sid_(std::move(sid)), interrupt_(MaybeSignal()) {
    MutexLock lk(mu_);  // nobody else can see the session yet: for the analysis
    master_basis_ = basis;
    update_lost_at();
  }

  void start() {
    {
      MutexLock lk(anchor_->mu);
      anchor_->core = this;
    }
    auto self = shared_from_this();
    clock_subscription_ = cfg_.clock->on_advance([weak = weak_from_this()] {
      if (auto s = weak.lock()) {
        MutexLock lk(s->mu_);
        s->cv_.notify_all();
      }
    });
    thread_ = std::thread([self] {
      MarkDlockThread("dlock-redis-ka");
      self->keep_alive();
    });
  }

  const std::string& id() const { return sid_; }

  SessionState state() const noexcept {
    SessionState s = state_.load();
    if ((s == SessionState::kConnected || s == SessionState::kSuspended) &&
        cfg_.clock->now().time_since_epoch().count() >= lost_at_.load()) {
      return SessionState::kLost;  // the keep-alive is about to say so
    }
    return s;
  }

  std::shared_ptr<void> subscribe(std::function<void(SessionState)> fn) { return listeners_.add(std::move(fn)); }

  // kSessionLost once lost or closed; kUnavailable while suspended (when
  // `fail_if_suspended`).
  Status usable(bool fail_if_suspended) const {
    switch (state()) {
      case SessionState::kLost: return SessionLostError("redis session " + sid_ + " is lost" + lost_reason());
      case SessionState::kClosed: return SessionLostError("redis session " + sid_ + " is closed");
      case SessionState::kSuspended:
        if (fail_if_suspended) {
          return UnavailableError("redis session " + sid_ + " is suspended: cannot reach " + cfg_.url);
        }
        return OkStatus();
      case SessionState::kConnected: return OkStatus();
    }
    return OkStatus();
  }

  // What an append sends: checked, tracked, ready.
  struct AppendPlan {
    std::string q;
    QueueKeys k;
    std::string id;
    Clock::time_point basis;
    std::vector<std::string> keys;
    std::vector<std::string> args;
  };
  // Where a blocking request (append, list, find_own, remove) goes: on a
  // pooled connection free now, or, when all of the pool's are lent out,
  // through the request loop, pipelined there with every other request and
  // this thread waiting for the answer. So blocking callers beyond the
  // pool's size never queue for a connection (review of 8323212, which
  // moved a blocking acquire's requests off the loop: 100 threads each
  // taking a free lock with a 300 ms timeout over a 25 ms link got 60 of
  // 100, the slowest 1 s late). On a dlock thread the request waits for a
  // pooled connection as before: the loop's own thread must never wait for
  // the loop. So does a request followed by a WAIT (`with_wait`, when the
  // URL asks for replicas): the server answers one connection's WAITs one
  // after another, so on the loop's one connection each would wait out the
  // one before it (review: 12 releases with a replica gone took 0.5 s to
  // 4 s, one after another, and held back every other request on the loop).
  struct Route {
    bool through_loop = false;
    Pool::Lent conn;  // the pooled connection, when one was free
  };
  Route route_blocking(IoClock::time_point io, bool with_wait) {
    auto lent = store_->pool().lend(io, /*wait=*/false);
    if (!lent.ok()) return {};  // none could be opened: pooled() tries once more and says why
    if (*lent) return {false, std::move(*lent)};
    if (OnDlockThread() || (with_wait && cfg_.wait_replicas > 0)) return {};
    try {
      (void)store_->loop();  // started on first use
    } catch (const std::exception&) {
      return {};  // no thread for it: wait for a pooled connection
    }
    return {true, {}};
  }

  // Whether an append may be made: its arguments, and the session.
  Status check_append(std::string_view queue, const EntrySpec& spec) {
    if (auto s = ValidateLockName(queue); !s.ok()) return s;
    if (spec.kind.empty()) return InvalidArgumentError("entry kind is empty");
    if (auto s = CheckEntryValue(spec.value); !s.ok()) return s;
    if (spec.sequence && (*spec.sequence < 0 || *spec.sequence >= kMaxSequence)) {
      return InvalidArgumentError("entry sequence " + std::to_string(*spec.sequence) + " is out of range");
    }
    return usable(true);
  }

  // Checks again in append(): the session may have ended while a
  // connection was opened for it (review).
  Result<AppendPlan> plan_append(std::string_view queue, const EntrySpec& spec) {
    if (auto s = check_append(queue, spec); !s.ok()) return s;
    AppendPlan p;
    p.q = std::string(queue);
    p.k = KeysFor(p.q, cfg_.endpoint.db);
    p.id = RandomHex(16);
    auto mirror = track(p.q, p.id, spec.attempt_id);
    if (!mirror.ok()) return mirror.status();
    p.basis = mirror->basis;
    p.keys = {p.k.zset, p.k.counter, p.k.entry(p.id), p.k.mirror(sid_)};
    p.args = {p.k.base,
              p.k.channel,
              p.id,
              spec.kind,
              spec.attempt_id,
              sid_,
              EncodeOwnerRecord(spec.owner),
              std::to_string(mirror->ms),
              spec.sequence ? std::to_string(*spec.sequence) : std::string()};
    if (spec.value) p.args.push_back(*spec.value);
    return p;
  }

  // The append's entry was taken back (too few replicas acknowledged it).
  Status append_undone(const AppendPlan& p, int acked) {
    untrack(p.q, [&](const std::string& tracked_id, const Tracked&) { return tracked_id == p.id; });
    return AbortedError(store_->short_of_replicas_message(acked, "append to " + p.q) + "; the entry was removed again");
  }

  // What the append script's reply means (the entry not taken back).
  Result<Appended> finish_append(const AppendPlan& p, const EntrySpec& spec, const Reply& r) {
    if (Fenced(r)) {
      untrack(p.q, [&](const std::string& tracked_id, const Tracked&) { return tracked_id == p.id; });
      return AbortedError("redis store: append of attempt " + spec.attempt_id + " to " + p.q +
                          " refused: find_own already settled that attempt");
    }
    Appended out;
    std::int64_t seq = 0;
    std::uint64_t token = 0;
    if (!r.is_array() || r.size() < 2 || !ParseNumber(ElementStr(r.element(0)), seq) ||
        !ParseNumber(ElementStr(r.element(1)), token)) {
      return InternalError("redis store: malformed reply to append");
    }
    auto queue_now = ParseEntries(r, 2, false);
    if (!queue_now.ok()) return queue_now.status();
    confirm(p.q, p.id, spec.attempt_id, p.basis);
    out.entry.id = p.id;
    out.entry.kind = KnownKind(spec.kind);
    out.entry.sequence = seq;
    out.entry.token = token;
    out.entry.attempt_id = spec.attempt_id;
    out.entry.owner = spec.owner;
    out.entry.value = spec.value;
    out.entry.value_version = 1;  // as the script sets it
    out.queue = std::move(*queue_now);
    return out;
  }

  Result<Appended> append(std::string_view queue, const EntrySpec& spec, Clock::time_point deadline) {
    // Checked before a connection is taken (or opened) for it.
    if (auto s = check_append(queue, spec); !s.ok()) return s;
    const auto io = store_->io_deadline(deadline);
    Route route = route_blocking(io, /*with_wait=*/true);
    if (route.through_loop) {
      return AwaitAnswer<Result<Appended>>([&](auto done) { async_append(queue, spec, deadline, std::move(done)); });
    }
    auto plan = plan_append(queue, spec);
    if (!plan.ok()) return plan.status();
    const AppendPlan& p = *plan;
    const std::string& q = p.q;
    const QueueKeys& k = p.k;
    const std::string& id = p.id;
    int acked = -1;
    bool undone = false;
    auto r = store_->pooled(
        io,
        [&](Conn& c) -> Result<Reply> {
          auto s = store_->script_on(c, ScriptId::kAppend, p.keys, p.args, io, /*wait=*/true);
          if (!s.ok()) return s.status();
          acked = s->acked;
          if (store_->short_of_replicas(acked) && !Fenced(s->reply)) {
            // Not as durable as asked for: take the entry back before anyone
            // counts on it (a waiter behind it could otherwise be granted on a
            // replica that never saw it).
            mark_removing(q, id);
            auto undo = store_->script_on(c, ScriptId::kRemove, {k.zset}, {k.base, k.channel, id, sid_},
                                          store_->one_more_round_trip(), /*wait=*/false);
            if (!undo.ok()) return undo.status();  // the entry may exist: find_own settles it
            undone = true;
          }
          return std::move(s->reply);
        },
        std::move(route.conn));
    if (!r.ok()) {
      on_request_failed(r.status());
      return r.status();  // the entry may exist: it stays tracked until find_own says
    }
    if (undone) return append_undone(p, acked);
    return finish_append(p, spec, *r);
  }

  // append() on the request loop: the same steps, each a completion.
  void async_append(std::string_view queue, const EntrySpec& spec, Clock::time_point deadline,
                    std::function<void(Result<Appended>)> done) {
    auto plan = plan_append(queue, spec);
    if (!plan.ok()) return done(plan.status());
    auto p = std::make_shared<const AppendPlan>(std::move(*plan));
    StoreCore* store = store_.get();  // lives while the session does; ~RedisSession empties the anchor first
    store->async_script(ScriptId::kAppend, p->keys, p->args, store->io_deadline(deadline), /*wait=*/true,
                        [anchor = anchor_, store, p, spec, done = std::move(done)](Result<CoreScripted> r) {
                          if (!r.ok()) {
                            // The entry may exist: it stays tracked until find_own says.
                            with_core(*anchor, [&](SessionCore& c) { c.on_request_failed(r.status()); });
                            return done(r.status());
                          }
                          if (!store->short_of_replicas(r->acked) || Fenced(r->reply)) {
                            Result<Appended> out = SessionLostError("redis session closed while appending");
                            with_core(*anchor, [&](SessionCore& c) { out = c.finish_append(*p, spec, r->reply); });
                            return done(std::move(out));
                          }
                          // Not as durable as asked for: take the entry back before anyone
                          // counts on it (see append()).
                          bool alive = false;
                          std::string sid;
                          with_core(*anchor, [&](SessionCore& c) {
                            alive = true;
                            sid = c.sid_;
                            c.mark_removing(p->q, p->id);
                          });
                          if (!alive) return done(SessionLostError("redis session closed while appending"));
                          const int acked = r->acked;
                          store->async_script(ScriptId::kRemove, {p->k.zset}, {p->k.base, p->k.channel, p->id, sid},
                                              store->one_more_round_trip(), /*wait=*/false,
                                              [anchor, p, acked, done](Result<CoreScripted> u) {
                                                Status out = SessionLostError("redis session closed while appending");
                                                with_core(*anchor, [&](SessionCore& c) {
                                                  if (u.ok()) {
                                                    out = c.append_undone(*p, acked);
                                                  } else {
                                                    // The entry may exist: find_own settles it.
                                                    c.on_request_failed(u.status());
                                                    out = u.status();
                                                  }
                                                });
                                                done(std::move(out));
                                              });
                        });
  }

  Result<std::vector<Entry>> list(std::string_view queue, const ListOptions& options, Clock::time_point deadline) {
    if (auto s = ValidateLockName(queue); !s.ok()) return s;
    if (auto s = usable(true); !s.ok()) return s;
    const auto io = store_->io_deadline(deadline);
    Route route = route_blocking(io, /*with_wait=*/false);
    if (route.through_loop) {
      return AwaitAnswer<Result<std::vector<Entry>>>(
          [&](auto done) { async_list(queue, options, deadline, std::move(done)); });
    }
    const QueueKeys k = KeysFor(queue, cfg_.endpoint.db);
    auto r = store_->script(ScriptId::kList, {k.zset},
                            {k.base, k.channel, options.with_owners ? "1" : "0", options.with_values ? "1" : "0"}, io,
                            std::move(route.conn));
    if (!r.ok()) {
      on_request_failed(r.status());
      return r.status();
    }
    return ParseEntries(*r, 0, options.with_owners, options.with_values);
  }

  Status remove(std::string_view queue, std::string_view id, Clock::time_point deadline) {
    if (auto s = ValidateLockName(queue); !s.ok()) return s;
    if (id.empty()) return InvalidArgumentError("entry id is empty");
    if (auto s = usable(true); !s.ok()) return s;
    const auto io = store_->io_deadline(deadline);
    Route route = route_blocking(io, /*with_wait=*/true);
    if (route.through_loop) {
      return AwaitAnswer<Status>([&](auto done) { async_remove(queue, id, deadline, std::move(done)); });
    }
    const std::string q(queue);
    const QueueKeys k = KeysFor(q, cfg_.endpoint.db);
    // Before it is sent: a renewal that finds the entry gone meanwhile must
    // not take that for lost data.
    mark_removing(q, std::string(id));
    // With wait_replicas, WAIT, so that a release normally survives a
    // failover too. If too few replicas acknowledge in time, the removal has
    // still happened on the primary: done (a failover to a replica that
    // missed it brings the entry back until the session's lease there ends).
    auto r = store_->pooled(
        io,
        [&](Conn& c) -> Result<Reply> {
          auto s = store_->script_on(c, ScriptId::kRemove, {k.zset}, {k.base, k.channel, std::string(id), sid_}, io,
                                     /*wait=*/true);
          if (!s.ok()) return s.status();
          return std::move(s->reply);
        },
        std::move(route.conn));
    if (!r.ok()) {
      on_request_failed(r.status());
      return r.status();
    }
    untrack(q, [&](const std::string& tracked_id, const Tracked&) { return tracked_id == id; });
    return OkStatus();
  }

  Result<std::optional<Entry>> find_own(std::string_view queue, std::string_view attempt_id,
                                        Clock::time_point deadline) {
    if (auto s = ValidateLockName(queue); !s.ok()) return s;
    if (attempt_id.empty()) return InvalidArgumentError("attempt id is empty");
    if (auto s = usable(true); !s.ok()) return s;
    const auto io = store_->io_deadline(deadline);
    Route route = route_blocking(io, /*with_wait=*/true);
    if (route.through_loop) {
      return AwaitAnswer<Result<std::optional<Entry>>>(
          [&](auto done) { async_find_own(queue, attempt_id, deadline, std::move(done)); });
    }
    const std::string q(queue);
    const QueueKeys k = KeysFor(q, cfg_.endpoint.db);
    auto mirror = track(q, std::string(), std::string());  // no id yet
    if (!mirror.ok()) return mirror.status();
    int acked = -1;
    bool undone = false;
    auto r = store_->pooled(
        io,
        [&](Conn& c) -> Result<Reply> {
          auto s = store_->script_on(c, ScriptId::kFindOwn, {k.zset, k.mirror(sid_)},
                                     {k.base, k.channel, std::string(attempt_id), sid_, std::to_string(mirror->ms),
                                      std::to_string(cfg_.ttl.count())},
                                     io, /*wait=*/false);
          if (!s.ok()) return s.status();
          if (cfg_.wait_replicas == 0 || !s->reply.is_array() || s->reply.size() == 0) return std::move(s->reply);
          // Found: hand it out only as durable as a fresh append would be. The
          // script wrote after the append did, so this WAIT covers the entry.
          auto w = store_->wait_on(c, io);
          if (!w.ok()) return w.status();
          acked = *w;
          if (store_->short_of_replicas(acked)) {
            const std::string found(ElementStr(s->reply.element(0)));
            mark_removing(q, found);
            auto undo = store_->script_on(c, ScriptId::kRemove, {k.zset}, {k.base, k.channel, found, sid_},
                                          store_->one_more_round_trip(), /*wait=*/false);
            if (!undo.ok()) return undo.status();
            undone = true;
          }
          return std::move(s->reply);
        },
        std::move(route.conn));
    if (!r.ok()) {
      untrack(q, [](const std::string&, const Tracked&) { return false; });  // drop an empty track
      on_request_failed(r.status());
      return r.status();
    }
    if (undone) return find_own_undone(q, attempt_id, acked);
    return finish_find_own(q, attempt_id, mirror->basis, *r);
  }

  // The entry find_own found was taken back (too few replicas acknowledged).
  Status find_own_undone(const std::string& q, std::string_view attempt_id, int acked) {
    untrack(q, [&](const std::string&, const Tracked& t) { return t.attempt == attempt_id; });
    return AbortedError(store_->short_of_replicas_message(acked, "entry found in " + q) + "; it was removed");
  }

  // What the find_own script's reply means (the entry not taken back).
  Result<std::optional<Entry>> finish_find_own(const std::string& q, std::string_view attempt_id,
                                               Clock::time_point basis, const Reply& r) {
    auto entries = ParseEntries(r, 0, false);
    if (!entries.ok()) return entries.status();
    if (entries->empty()) {
      // Not there: an earlier append with this attempt whose reply was lost
      // did not happen (or its entry already went). Stop renewing for it.
      untrack(q, [&](const std::string&, const Tracked& t) { return !t.confirmed && t.attempt == attempt_id; });
      return std::optional<Entry>();
    }
    Entry e = std::move(entries->front());
    confirm(q, e.id, std::string(attempt_id), basis);
    return std::optional<Entry>(std::move(e));
  }

  // find_own() on the request loop. With wait_replicas, the WAIT goes in the
  // script's pipeline (the script always writes: its fence), so it follows
  // the script's writes on the same connection even when the request is
  // sent again on a new one.
  void async_find_own(std::string_view queue, std::string_view attempt_id, Clock::time_point deadline,
                      std::function<void(Result<std::optional<Entry>>)> done) {
    if (auto s = ValidateLockName(queue); !s.ok()) return done(s);
    if (attempt_id.empty()) return done(InvalidArgumentError("attempt id is empty"));
    if (auto s = usable(true); !s.ok()) return done(s);
    auto q = std::make_shared<const std::string>(queue);
    const QueueKeys k = KeysFor(*q, cfg_.endpoint.db);
    auto mirror = track(*q, std::string(), std::string());  // no id yet
    if (!mirror.ok()) return done(mirror.status());
    StoreCore* store = store_.get();  // lives while the session does
    std::string attempt(attempt_id);
    const Clock::time_point basis = mirror->basis;
    store->async_script(
        ScriptId::kFindOwn, {k.zset, k.mirror(sid_)},
        {k.base, k.channel, attempt, sid_, std::to_string(mirror->ms), std::to_string(cfg_.ttl.count())},
        store->io_deadline(deadline), /*wait=*/true,
        [anchor = anchor_, store, q, k, attempt, basis, sid = sid_, done = std::move(done)](Result<CoreScripted> r) {
          const Status closed = SessionLostError("redis session closed while finding its entry");
          if (!r.ok()) {
            with_core(*anchor, [&](SessionCore& c) {
              c.untrack(*q, [](const std::string&, const Tracked&) { return false; });  // drop an empty track
              c.on_request_failed(r.status());
            });
            return done(r.status());
          }
          const bool found = r->reply.is_array() && r->reply.size() > 0;
          if (!found || !store->short_of_replicas(r->acked)) {
            Result<std::optional<Entry>> out = closed;
            with_core(*anchor, [&](SessionCore& c) { out = c.finish_find_own(*q, attempt, basis, r->reply); });
            return done(std::move(out));
          }
          // Found, but not as durable as a fresh append would be: taken back.
          const std::string entry(ElementStr(r->reply.element(0)));
          bool alive = false;
          with_core(*anchor, [&](SessionCore& c) {
            alive = true;
            c.mark_removing(*q, entry);
          });
          if (!alive) return done(closed);
          const int acked = r->acked;
          store->async_script(ScriptId::kRemove, {k.zset}, {k.base, k.channel, entry, sid},
                              store->one_more_round_trip(), /*wait=*/false,
                              [anchor, q, attempt, acked, closed, done](Result<CoreScripted> u) {
                                Status out = closed;
                                with_core(*anchor, [&](SessionCore& c) {
                                  if (u.ok()) {
                                    out = c.find_own_undone(*q, attempt, acked);
                                  } else {
                                    c.untrack(*q, [](const std::string&, const Tracked&) { return false; });
                                    c.on_request_failed(u.status());
                                    out = u.status();
                                  }
                                });
                                done(std::move(out));
                              });
        });
  }

  // The wait is a Subscriber waiter; its `done` runs on the subscriber
  // thread (or inline, for an argument or session error, or on the thread
  // that destroys the handle, with kCancelled).
  std::shared_ptr<void> async_wait_any_gone(std::string_view queue, std::span<const std::string> ids,
                                            std::function<void(Status)> done, std::string_view own = {},
                                            std::span<const std::string> ahead = {},
                                            std::shared_ptr<std::atomic<bool>> own_intact = nullptr) {
    Status early;
    if (early = ValidateLockName(queue); early.ok() && ids.empty()) {
      early = InvalidArgumentError("wait_any_gone needs at least one entry id");
    }
    return start_wait(queue, std::move(early), std::move(done), [&](Subscriber::WaitSpec& spec, const QueueKeys& k) {
      spec.channel = k.channel;
      spec.ids.assign(ids.begin(), ids.end());
      spec.check = [this, k](const std::string& q, const std::vector<std::string>& which) {
        return check(q, k, which);
      };
      spec.own = std::string(own);
      spec.ahead.assign(ahead.begin(), ahead.end());
      spec.own_intact = std::move(own_intact);
    });
  }

  // Starts a Subscriber wait on `queue` (redis_subscriber.hpp), or calls
  // `done` at once with `early`, or with what the session says, if either
  // is an error. `fill` sets what the kinds of wait differ in: the channel,
  // the check, what to wait for.
  std::shared_ptr<void> start_wait(std::string_view queue, Status early, std::function<void(Status)> done,
                                   const std::function<void(Subscriber::WaitSpec&, const QueueKeys&)>& fill) {
    if (early.ok()) early = usable(false);
    if (!early.ok()) {
      done(std::move(early));
      return std::make_shared<int>(0);  // nothing to cancel
    }
    Subscriber::WaitSpec spec;
    spec.queue = std::string(queue);
    const QueueKeys k = KeysFor(spec.queue, cfg_.endpoint.db);
    spec.owner = this;
    // Raw `this` in `session` and in the checks `fill` sets: ~RedisSession
    // quiesces the subscriber before the core can go.
    spec.session = [this] { return usable(false); };
    spec.done = std::move(done);
    fill(spec, k);
    return store_->subscriber().start(std::move(spec));
  }

  // The blocking form: the asynchronous wait, and a deadline and stop token
  // on top (the handle cancels what they end).
  Status wait_any_gone(std::string_view queue, std::span<const std::string> ids, Clock::time_point deadline,
                       std::stop_token stop) {
    return AwaitAsyncWait(*cfg_.clock, queue, deadline, std::move(stop), [&](std::function<void(Status)> done) {
      return async_wait_any_gone(queue, ids, std::move(done));
    });
  }

  // Before the core can go: no check of the subscriber's, and no reply of
  // the request loop's, calls into it any more.
  void quiesce() {
    store_->quiesce_waiters(this);
    MutexLock lk(anchor_->mu);
    anchor_->core = nullptr;
  }

  // The asynchronous list and remove: on the request loop, with what the
  // blocking forms do before and after the request done around it.
  void async_list(std::string_view queue, const ListOptions& options, Clock::time_point deadline,
                  std::function<void(Result<std::vector<Entry>>)> done) {
    if (auto s = ValidateLockName(queue); !s.ok()) return done(s);
    if (auto s = usable(true); !s.ok()) return done(s);
    const QueueKeys k = KeysFor(queue, cfg_.endpoint.db);
    const bool owners = options.with_owners;
    const bool values = options.with_values;
    store_->async_script(ScriptId::kList, {k.zset}, {k.base, k.channel, owners ? "1" : "0", values ? "1" : "0"},
                         store_->io_deadline(deadline), /*wait=*/false,
                         [anchor = anchor_, owners, values, done = std::move(done)](Result<CoreScripted> r) {
                           if (!r.ok()) {
                             with_core(*anchor, [&](SessionCore& c) { c.on_request_failed(r.status()); });
                             return done(r.status());
                           }
                           done(ParseEntries(r->reply, 0, owners, values));
                         });
  }

  void async_remove(std::string_view queue, std::string_view id, Clock::time_point deadline,
                    std::function<void(Status)> done) {
    if (auto s = ValidateLockName(queue); !s.ok()) return done(s);
    if (id.empty()) return done(InvalidArgumentError("entry id is empty"));
    if (auto s = usable(true); !s.ok()) return done(s);
    std::string q(queue);
    std::string entry(id);
    const QueueKeys k = KeysFor(q, cfg_.endpoint.db);
    mark_removing(q, entry);  // as remove(): before it is sent
    store_->async_script(
        ScriptId::kRemove, {k.zset}, {k.base, k.channel, entry, sid_}, store_->io_deadline(deadline),
        /*wait=*/true, [anchor = anchor_, q = std::move(q), entry, done = std::move(done)](Result<CoreScripted> r) {
          with_core(*anchor, [&](SessionCore& c) {
            if (!r.ok()) {
              c.on_request_failed(r.status());
            } else {
              c.untrack(q, [&](const std::string& tracked, const Tracked&) { return tracked == entry; });
            }
          });
          done(r.ok() ? OkStatus() : r.status());
        });
  }

  // --- Published values (docs/election.md, step 3)

  // What an update sends: checked, ready.
  struct UpdatePlan {
    std::string q;
    std::string id;
    QueueKeys k;
    std::vector<std::string> args;
  };
  Result<UpdatePlan> plan_update(std::string_view queue, std::string_view id, const EntryUpdate& update) {
    if (auto s = ValidateLockName(queue); !s.ok()) return s;
    if (id.empty()) return InvalidArgumentError("entry id is empty");
    if (auto s = CheckEntryValue(update.value); !s.ok()) return s;
    if (auto s = usable(true); !s.ok()) return s;
    UpdatePlan p;
    p.q = std::string(queue);
    p.id = std::string(id);
    p.k = KeysFor(p.q, cfg_.endpoint.db);
    p.args = {p.k.base,
              p.k.channel,
              p.id,
              sid_,
              update.value ? "1" : "0",
              update.value.value_or(std::string()),
              update.owner ? EncodeOwnerRecord(*update.owner) : std::string()};
    return p;
  }

  // What the update script's reply means.
  static Result<Entry> finish_update(const UpdatePlan& p, const Reply& r) {
    if (Gone(r)) return FailedPreconditionError("redis store: no live entry " + p.id + " of this session in " + p.q);
    auto entries = ParseEntries(r, 0, /*owners=*/true, /*values=*/true);
    if (!entries.ok()) return entries.status();
    if (entries->size() != 1) return InternalError("redis store: malformed reply to update");
    return std::move(entries->front());
  }

  // With wait_replicas, WAIT as a remove does: one that falls short has
  // still happened on the primary.
  Result<Entry> update_entry(std::string_view queue, std::string_view id, const EntryUpdate& update,
                             Clock::time_point deadline) {
    auto plan = plan_update(queue, id, update);
    if (!plan.ok()) return plan.status();
    const auto io = store_->io_deadline(deadline);
    auto r = store_->pooled(io, [&](Conn& c) -> Result<Reply> {
      auto s = store_->script_on(c, ScriptId::kUpdate, {plan->k.zset}, plan->args, io, /*wait=*/true);
      if (!s.ok()) return s.status();
      return std::move(s->reply);
    });
    if (!r.ok()) {
      on_request_failed(r.status());
      return r.status();
    }
    return finish_update(*plan, *r);
  }

  void async_update_entry(std::string_view queue, std::string_view id, const EntryUpdate& update,
                          Clock::time_point deadline, std::function<void(Result<Entry>)> done) {
    auto plan = plan_update(queue, id, update);
    if (!plan.ok()) return done(plan.status());
    auto p = std::make_shared<const UpdatePlan>(std::move(*plan));
    store_->async_script(ScriptId::kUpdate, {p->k.zset}, p->args, store_->io_deadline(deadline), /*wait=*/true,
                         [anchor = anchor_, p, done = std::move(done)](Result<CoreScripted> r) {
                           if (!r.ok()) {
                             with_core(*anchor, [&](SessionCore& c) { c.on_request_failed(r.status()); });
                             return done(r.status());
                           }
                           done(finish_update(*p, r->reply));
                         });
  }

  void async_read_head(std::string_view queue, const ListOptions& options, Clock::time_point deadline,
                       std::function<void(Result<Head>)> done) {
    if (auto s = ValidateLockName(queue); !s.ok()) return done(s);
    if (auto s = usable(true); !s.ok()) return done(s);
    const QueueKeys k = KeysFor(queue, cfg_.endpoint.db);
    const bool owners = options.with_owners;
    store_->async_script(ScriptId::kReadHead, {k.zset}, {k.base, k.channel, owners ? "1" : "0"},
                         store_->io_deadline(deadline), /*wait=*/false,
                         [anchor = anchor_, owners, done = std::move(done)](Result<CoreScripted> r) {
                           if (!r.ok()) {
                             with_core(*anchor, [&](SessionCore& c) { c.on_request_failed(r.status()); });
                             return done(r.status());
                           }
                           auto read = ParseHead(r->reply, owners);
                           if (!read.ok()) return done(read.status());
                           done(std::move(read->head));
                         });
  }

  // A Subscriber wait on the queue's head channel: subscribed before its
  // first check, which compares the head with `seen` (redis_subscriber.hpp).
  // `done` runs as async_wait_any_gone's does.
  std::shared_ptr<void> async_watch_head(std::string_view queue, const Head& seen, std::function<void(Status)> done) {
    return start_wait(
        queue, ValidateLockName(queue), std::move(done), [&](Subscriber::WaitSpec& spec, const QueueKeys& k) {
          spec.channel = k.heads;
          spec.check = [this, k](const std::string&, const std::vector<std::string>&) { return check_head(k); };
          spec.head = MarkOf(seen);
        });
  }

  // Every subscriber hears kClosed, and has returned, before the entries
  // are removed (deliver() runs cleanup() after the notice). From inside a
  // subscriber it returns at once; the close completes once that subscriber
  // has returned.
  void close() noexcept DLOCK_EXCLUDES(notice_mu_, mu_) {
    std::uint64_t seq = 0;
    try {
      seq = enqueue(SessionState::kClosed, /*cleanup=*/true);
    } catch (...) {
      // Out of memory: closed all the same, untold; the leases run out.
      state_.store(SessionState::kClosed);
      stop_keep_alive();
      return;
    }
    if (seq == 0) return;  // already closed
    stop_keep_alive();
    store_->poke_waiters();
    deliver(seq, /*wait=*/true);
  }

 private:
  struct Tracked {
    std::string attempt;
    bool confirmed = false;  // the append's reply (or find_own) confirmed it
    bool removing = false;   // a remove was sent: its absence is expected
    bool relied_on() const { return confirmed && !removing; }
  };
  struct QueueTrack {
    std::map<std::string, Tracked> ids;  // entries of this session that may exist
    // The mirror lasts on the server until at least basis + ttl, if `proven`
    // (see the file comment).
    Clock::time_point basis;
    bool proven = false;
    // Changes whenever this session's remove may delete the mirror (its last
    // entry there gone) and an append make it again: a renewal that crossed
    // that proves nothing about the mirror now.
    std::uint64_t epoch = 0;
    bool relied_on() const {
      return std::any_of(ids.begin(), ids.end(), [](const auto& p) { return p.second.relied_on(); });
    }
  };
  // A wait's check of `queue` (on the subscriber thread). If this session
  // has confirmed entries in the queue, its lease there must exist: asked on
  // the way; one found gone loses the session (told by the keep-alive).
  Result<CheckResult> check(const std::string& q, const QueueKeys& k, const std::vector<std::string>& which) {
    const std::vector<std::string> relied = relied_entries(q);
    const bool relies = !relied.empty();
    std::vector<std::string> args = {k.base, k.channel, relies ? sid_ : std::string()};
    args.insert(args.end(), which.begin(), which.end());
    // No deadline of the wait's own: bounded like a renewal's cadence.
    auto r = store_->script(ScriptId::kCheckGone, {k.zset}, args,
                            store_->io_deadline(cfg_.clock->now() + cfg_.renew_every()));
    if (!r.ok()) {
      on_request_failed(r.status());
      return r.status();
    }
    if (!r->is_array() || r->size() < 2) return InternalError("redis store: malformed reply to check");
    if (relies && ElementInt(r->element(1)) == 0 && still_relied(q, relied)) {
      lose_later("the session's lease in queue " + q + " is gone from the server");
    }
    CheckResult out;
    out.soonest_ttl_ms = ElementInt(r->element(0));
    for (std::size_t i = 2; i < r->size(); ++i) out.gone.emplace_back(ElementStr(r->element(i)));
    return out;
  }

  // A head watch's check (on the subscriber thread): the head now, and when
  // the soonest lease in the queue can end, for the fallback re-check.
  Result<CheckResult> check_head(const QueueKeys& k) {
    auto r = store_->script(ScriptId::kReadHead, {k.zset}, {k.base, k.channel, "0"},
                            store_->io_deadline(cfg_.clock->now() + cfg_.renew_every()));
    if (!r.ok()) {
      on_request_failed(r.status());
      return r.status();
    }
    auto read = ParseHead(*r, /*owners=*/false);
    if (!read.ok()) return read.status();
    CheckResult out;
    out.soonest_ttl_ms = read->soonest_ttl_ms;
    out.head = MarkOf(read->head);
    return out;
  }

  std::string lost_reason() const DLOCK_EXCLUDES(mu_) {
    MutexLock lk(mu_);
    return lost_reason_.empty() ? std::string() : " (" + lost_reason_ + ")";
  }

  // When the client declares the session lost (see the file comment).
  Clock::time_point compute_lost_at() const DLOCK_REQUIRES(mu_) {
    Clock::time_point basis = master_basis_;
    for (const auto& [name, t] : queues_) {
      if (t.relied_on()) basis = std::min(basis, t.basis);
    }
    return basis + cfg_.ttl - cfg_.margin();
  }
  void update_lost_at() DLOCK_REQUIRES(mu_) { lost_at_.store(compute_lost_at().time_since_epoch().count()); }

  // The TTL a request gives the queue's mirror, and the basis it counts
  // from: what is left of the session key's lease.
  struct MirrorTtl {
    std::int64_t ms;
    Clock::time_point basis;
  };

  // Registers `id` (if not empty) as maybe existing in `queue`, and returns
  // the TTL for the queue's mirror.
  Result<MirrorTtl> track(const std::string& queue, const std::string& id, const std::string& attempt)
      DLOCK_EXCLUDES(mu_) {
    MutexLock lk(mu_);
    Clock::time_point now = cfg_.clock->now();
    if (now >= compute_lost_at()) return SessionLostError("redis session " + sid_ + " is lost (lease ran out)");
    auto [it, inserted] = queues_.try_emplace(queue);
    if (inserted) it->second.epoch = ++epochs_;
    if (!id.empty()) it->second.ids[id] = Tracked{attempt, false};
    auto left = std::chrono::ceil<milliseconds>(master_basis_ + cfg_.ttl - now).count();
    return MirrorTtl{std::max<std::int64_t>(left, 1), master_basis_};
  }

  // A reply proved the queue's mirror lasts until at least `basis` + ttl.
  // (`track` is in queues_: mu_ held.)
  static void prove(QueueTrack& track, Clock::time_point basis) {
    track.basis = track.proven ? std::max(track.basis, basis) : basis;
    track.proven = true;
  }

  // The entries in `queue` the session holds on to (confirmed, not being
  // removed).
  std::vector<std::string> relied_entries(const std::string& queue) const DLOCK_EXCLUDES(mu_) {
    MutexLock lk(mu_);
    std::vector<std::string> out;
    auto it = queues_.find(queue);
    if (it == queues_.end()) return out;
    for (const auto& [id, e] : it->second.ids) {
      if (e.relied_on()) out.push_back(id);
    }
    return out;
  }

  // Whether the session still holds on to any of `ids` (a request that
  // found them gone may have crossed this session's own remove).
  bool still_relied(const std::string& queue, const std::vector<std::string>& ids) const DLOCK_EXCLUDES(mu_) {
    MutexLock lk(mu_);
    auto it = queues_.find(queue);
    if (it == queues_.end()) return false;
    return std::any_of(ids.begin(), ids.end(), [&](const std::string& id) {
      auto e = it->second.ids.find(id);
      return e != it->second.ids.end() && e->second.relied_on();
    });
  }

  // The append (or find_own) of `id` succeeded, with a mirror TTL counted
  // from `basis`.
  void confirm(const std::string& queue, const std::string& id, const std::string& attempt, Clock::time_point basis)
      DLOCK_EXCLUDES(mu_) {
    MutexLock lk(mu_);
    auto [it, inserted] = queues_.try_emplace(queue);
    if (inserted) it->second.epoch = ++epochs_;
    it->second.ids[id] = Tracked{attempt, true};
    prove(it->second, basis);
    update_lost_at();
  }

  // Before a remove of `id` is sent (see Tracked::removing and
  // QueueTrack::epoch).
  void mark_removing(const std::string& queue, const std::string& id) DLOCK_EXCLUDES(mu_) {
    MutexLock lk(mu_);
    auto it = queues_.find(queue);
    if (it == queues_.end()) return;
    it->second.epoch = ++epochs_;
    auto e = it->second.ids.find(id);
    if (e == it->second.ids.end()) return;
    e->second.removing = true;
    update_lost_at();
  }

  template <typename Pred>
  void untrack(const std::string& queue, Pred pred) DLOCK_EXCLUDES(mu_) {
    MutexLock lk(mu_);
    auto it = queues_.find(queue);
    if (it == queues_.end()) return;
    std::erase_if(it->second.ids, [&](const auto& p) { return pred(p.first, p.second); });
    if (it->second.ids.empty()) queues_.erase(it);
    update_lost_at();
  }

  // A request failed for lack of contact: renew now, so the state says so.
  void on_request_failed(const Status& s) DLOCK_EXCLUDES(mu_) {
    if (s.code() != ErrorCode::kUnavailable) return;
    MutexLock lk(mu_);
    poke_ = true;
    cv_.notify_all();
  }

  // --- Telling subscribers
  //
  // State changes are queued in the order they happen and delivered one at a
  // time by whichever thread finds nobody delivering. A change made from
  // inside a subscriber (close() included) is delivered by that same thread
  // once the subscriber has returned, so no subscriber is ever called from
  // inside another call. No lock is held while a subscriber runs.

  // Moves to `to` unless the session already ended (or is there), and queues
  // the notice. Returns its number, or 0 if nothing changed.
  std::uint64_t enqueue(SessionState to, bool cleanup) DLOCK_EXCLUDES(notice_mu_) {
    MutexLock lk(notice_mu_);
    SessionState prev = state_.load();
    if (prev == to || prev == SessionState::kClosed) return 0;
    if (prev == SessionState::kLost && to != SessionState::kClosed) return 0;
    notices_.push_back(Notice{to, cleanup, ++notices_queued_});
    state_.store(to);
    return notices_queued_;
  }

  // Delivers queued notices until none is left, unless another thread is
  // delivering: then that thread will deliver `seq` too, and with `wait` this
  // one waits for that (unless it is that thread, inside a subscriber).
  void deliver(std::uint64_t seq, bool wait) noexcept DLOCK_EXCLUDES(notice_mu_, mu_) {
    MutexLock lk(notice_mu_);
    if (deliverer_) {
      if (!wait || *deliverer_ == std::this_thread::get_id()) return;
      while (notices_delivered_ < seq) notice_cv_.wait(lk.native());
      return;
    }
    deliverer_ = std::this_thread::get_id();
    while (!notices_.empty()) {
      Notice n = notices_.front();
      notices_.pop_front();
      lk.unlock();
      listeners_.notify(n.state);
      if (n.cleanup) {
        try {
          cleanup();
        } catch (...) {
          // Out of memory, at worst. Best effort: the leases run out anyway.
        }
      }
      lk.lock();
      notices_delivered_ = n.seq;
      notice_cv_.notify_all();
    }
    deliverer_.reset();
  }

  // kConnected <-> kSuspended, or -> kLost. Never leaves kLost or kClosed.
  void transition(SessionState to) DLOCK_EXCLUDES(notice_mu_, mu_) {
    std::uint64_t seq = enqueue(to, /*cleanup=*/false);
    if (seq == 0) return;
    store_->poke_waiters();
    deliver(seq, /*wait=*/false);
  }

  void lose(std::string reason) DLOCK_EXCLUDES(notice_mu_, mu_) {
    {
      MutexLock lk(mu_);
      if (lost_reason_.empty()) lost_reason_ = std::move(reason);
    }
    transition(SessionState::kLost);
  }

  // lose(), from a thread that must not run the listeners (the subscriber
  // thread): the state is kLost at once, and the keep-alive tells it.
  void lose_later(std::string reason) DLOCK_EXCLUDES(notice_mu_, mu_) {
    {
      MutexLock lk(mu_);
      if (lost_reason_.empty()) lost_reason_ = std::move(reason);
    }
    if (enqueue(SessionState::kLost, /*cleanup=*/false) == 0) return;
    MutexLock lk(mu_);
    poke_ = true;
    cv_.notify_all();
  }

  void stop_keep_alive() noexcept DLOCK_EXCLUDES(mu_) {
    stop_.request_stop();
    if (interrupt_) interrupt_->signal();
    {
      MutexLock lk(mu_);
      cv_.notify_all();
    }
    JoinOrDetach(thread_);  // close() from a listener: the thread ends on its own
    clock_subscription_.reset();
  }

  // Removes the session's entries, mirrors and key, in one round trip, with a
  // short timeout. The leases run out by themselves if this fails.
  void cleanup() DLOCK_EXCLUDES(mu_) {
    std::vector<std::string> queues;
    {
      MutexLock lk(mu_);
      for (const auto& [name, t] : queues_) queues.push_back(name);
      queues_.clear();
    }
    auto deadline = IoClock::now() + std::min(cfg_.op_timeout, milliseconds(2'000));
    auto c = store_->pool().acquire(deadline);
    if (!c.ok()) return;
    Conn& conn = c->conn();
    for (const auto& q : queues) {
      const QueueKeys k = KeysFor(q, cfg_.endpoint.db);
      auto r = store_->script_on(conn, ScriptId::kCloseQueue, {k.zset, k.mirror(sid_)}, {k.base, k.channel}, deadline,
                                 /*wait=*/false);
      if (!r.ok() && conn.broken()) break;
    }
    if (!conn.broken()) {
      auto r = conn.run({"DEL", SessionKey(sid_)}, deadline);
      (void)r;
    }
  }

  // One renewal round trip: PEXPIRE of the session key, and the renewal of
  // each mirror, pipelined.
  struct RenewItem {
    std::string queue;
    std::uint64_t epoch;              // the queue's, as of the renewal's start
    std::vector<std::string> relied;  // entries the session holds on to, as of the renewal's start
  };
  Result<std::vector<Reply>> renew(Conn& conn, const std::vector<RenewItem>& items, IoClock::time_point deadline) {
    std::vector<Command> cmds;
    cmds.push_back({"PEXPIRE", SessionKey(sid_), std::to_string(cfg_.ttl.count())});
    for (const auto& item : items) {
      const QueueKeys k = KeysFor(item.queue, cfg_.endpoint.db);
      Command c = {
          "EVALSHA", store_->sha(ScriptId::kRenewMirror), "1", k.mirror(sid_), std::to_string(cfg_.ttl.count()), k.base,
          sid_};
      c.insert(c.end(), item.relied.begin(), item.relied.end());
      cmds.push_back(std::move(c));
    }
    // Renewing a mirror twice is harmless.
    return store_->pipeline_scripts(conn, cmds, /*resend_last=*/false, deadline);
  }

  // Reads one mirror's renewal reply (kRenewMirror). Returns why the session
  // is lost, or "" if it is not: it is if an entry it holds on to is gone
  // (the server lost data; or an operator removed it), or the mirror those
  // entries live by is. Entries it started to remove since the renewal was
  // sent are expected to go.
  std::string check_renewal(const RenewItem& item, const Reply& reply, Clock::time_point sent) DLOCK_REQUIRES(mu_) {
    auto it = queues_.find(item.queue);
    if (it == queues_.end()) return "";  // untracked meanwhile
    QueueTrack& track = it->second;
    if (!reply.is_array() || reply.size() < 1) return "a malformed reply to the renewal in queue " + item.queue;
    const bool exists = ElementInt(reply.element(0)) == 1;
    std::vector<std::string> gone;
    if (exists) {
      if (track.epoch == item.epoch) prove(track, sent);
      for (std::size_t j = 1; j < reply.size(); ++j) gone.emplace_back(ElementStr(reply.element(j)));
    } else {
      track.proven = false;
      gone = item.relied;
    }
    for (const auto& id : gone) {
      auto e = track.ids.find(id);
      if (e == track.ids.end() || !e->second.relied_on()) continue;
      if (!exists) return "the session's lease in queue " + item.queue + " is gone from the server";
      return "its entry " + id + " in queue " + item.queue +
             " is gone from the server (the server lost data, e.g. it restarted from an older snapshot or a "
             "lagging replica took over; or someone removed the entry)";
    }
    return "";
  }

  // --- The keep-alive thread
  //
  // Sleeps until the next renewal is due (every ttl/3, or at once when a
  // request failed for lack of contact), the session would be lost, or
  // close() stops it. A renewal is one round trip on the thread's own
  // connection; while renewals fail the session is kSuspended, once one
  // succeeds kConnected again, and it is kLost when the lease may have run out
  // (by the client's clock) or a renewal shows that the server lost what the
  // session holds on to.

  // What one renewal round trip brought back.
  struct Renewal {
    Status error;                // the request failed (or the server answered an error)
    std::vector<Reply> replies;  // otherwise: the session key's, then one per RenewItem
    Clock::time_point sent;      // when it was sent: the lease counts from here, not from the reply
  };

  void keep_alive() DLOCK_EXCLUDES(mu_, notice_mu_) {
    keep_renewing();
    // What lose_later() (or a lose() that crossed it) queued.
    deliver(0, /*wait=*/false);
  }

  void keep_renewing() DLOCK_EXCLUDES(mu_, notice_mu_) {
    std::unique_ptr<Conn> conn;  // the thread's own: a slow request never delays a renewal
    std::stop_token st = stop_.get_token();
    const Clock& clock = *cfg_.clock;
    MutexLock lk(mu_);
    Clock::time_point next = master_basis_ + cfg_.renew_every();
    while (!st.stop_requested()) {
      Clock::time_point lost_at = compute_lost_at();
      clock.wait_until(cv_, lk.native(), st, std::min(next, lost_at), [&] {
        mu_.assert_held();  // wait_until runs the predicate with the lock held
        return poke_;
      });
      if (st.stop_requested()) break;
      if (state_.load() == SessionState::kLost) break;  // lose_later()
      Clock::time_point now = clock.now();
      if (now >= compute_lost_at()) {
        // No renewal got through in time: the server may end the lease soon.
        lk.unlock();
        lose("no successful lease renewal for " +
             std::to_string(std::chrono::duration_cast<milliseconds>(cfg_.ttl - cfg_.margin()).count()) +
             "ms; the server can end the lease " + std::to_string(cfg_.margin().count()) + "ms later");
        return;
      }
      if (!poke_ && now < next) continue;  // woken early (a clock advance): not due yet
      poke_ = false;

      std::vector<RenewItem> items = renew_items();
      Clock::duration budget = std::min<Clock::duration>(cfg_.op_timeout, compute_lost_at() - now);
      lk.unlock();
      Renewal renewal = send_renewal(conn, items, budget);
      lk.lock();
      if (st.stop_requested()) break;
      if (!renewal.error.ok()) {
        if (renewal.error.code() == ErrorCode::kCancelled) break;  // close() interrupted the request
        // Out of contact: retry soon; the session lives until compute_lost_at().
        next = clock.now() + cfg_.retry_interval();
        lk.unlock();
        transition(SessionState::kSuspended);
        lk.lock();
        continue;
      }
      std::string lost = apply_renewal(items, renewal);
      if (!lost.empty()) {
        lk.unlock();
        lose(std::move(lost));
        return;
      }
      next = renewal.sent + cfg_.renew_every();
      lk.unlock();
      transition(SessionState::kConnected);
      lk.lock();
    }
  }

  // What a renewal covers: every tracked queue, with the entries the session
  // holds on to there and the queue's epoch, as of now.
  std::vector<RenewItem> renew_items() const DLOCK_REQUIRES(mu_) {
    std::vector<RenewItem> items;
    for (const auto& [name, t] : queues_) {
      RenewItem item{name, t.epoch, {}};
      for (const auto& [id, e] : t.ids) {
        if (e.relied_on()) item.relied.push_back(id);
      }
      items.push_back(std::move(item));
    }
    return items;
  }

  // Sends one renewal on `conn` (opened first if there is none), within
  // `budget`. A connection the server closed since the last renewal (a
  // restart, CLIENT KILL) gets one retry on a new one; a timeout does not.
  // `conn` is reset when it cannot be used again.
  Renewal send_renewal(std::unique_ptr<Conn>& conn, const std::vector<RenewItem>& items, Clock::duration budget)
      DLOCK_EXCLUDES(mu_) {
    const Clock& clock = *cfg_.clock;
    Renewal out;
    out.sent = clock.now();
    auto io_deadline = IoClock::now() + budget;
    for (int attempt = 0; attempt < 2; ++attempt) {
      bool fresh = !conn;
      if (!conn) {
        auto c = Conn::open(cfg_.endpoint, io_deadline, FdOf(interrupt_));
        if (!c.ok()) {
          out.error = c.status();
          break;
        }
        conn = std::move(*c);
      }
      out.sent = clock.now();  // the lease counts from here, not from the reply
      auto r = renew(*conn, items, io_deadline);
      if (r.ok()) {
        out.error = OkStatus();
        out.replies = std::move(*r);
        break;
      }
      out.error = r.status();
      bool retry = !fresh && !conn->timed_out() && out.error.code() == ErrorCode::kUnavailable;
      conn.reset();
      if (!retry) break;
    }
    if (out.error.ok()) {
      // An error reply (an ACL change, a server still loading) counts as no
      // contact.
      for (const auto& reply : out.replies) {
        if (reply.is_error()) {
          out.error = ErrorReplyStatus(reply.str(), "renewing the session lease");
          conn.reset();
          break;
        }
      }
    }
    return out;
  }

  // Reads a renewal that got through. Returns why the session is lost, or ""
  // if it lives on: then the session key's lease counts from the renewal.
  std::string apply_renewal(const std::vector<RenewItem>& items, const Renewal& renewal) DLOCK_REQUIRES(mu_) {
    if (renewal.replies[0].integer() != 1) {
      return "the session key is gone from the server (it expired, or the server restarted without its data)";
    }
    for (std::size_t i = 0; i < items.size(); ++i) {
      std::string lost = check_renewal(items[i], renewal.replies[i + 1], renewal.sent);
      if (!lost.empty()) return lost;
    }
    master_basis_ = renewal.sent;
    update_lost_at();
    return "";
  }

  // Runs `fn` on the session `anchor` still reaches, if any.
  template <typename Fn>
  static void with_core(Anchor& anchor, Fn fn) DLOCK_EXCLUDES(anchor.mu) {
    MutexLock lk(anchor.mu);
    if (anchor.core) fn(*anchor.core);
  }

  const std::shared_ptr<StoreCore> store_;
  const Config& cfg_;
  const std::string sid_;
  const std::shared_ptr<Anchor> anchor_ = std::make_shared<Anchor>();

  std::atomic<SessionState> state_{SessionState::kConnected};
  std::atomic<Clock::duration::rep> lost_at_{0};  // compute_lost_at(), readable without mu_

  mutable Mutex mu_;
  std::condition_variable_any cv_;                        // keep-alive wake-ups
  bool poke_ DLOCK_GUARDED_BY(mu_) = false;               // renew now
  Clock::time_point master_basis_ DLOCK_GUARDED_BY(mu_);  // of the session key
  std::map<std::string, QueueTrack> queues_ DLOCK_GUARDED_BY(mu_);
  std::uint64_t epochs_ DLOCK_GUARDED_BY(mu_) = 0;  // QueueTrack::epoch values, never reused
  std::string lost_reason_ DLOCK_GUARDED_BY(mu_);

  ListenerList<SessionState> listeners_;
  struct Notice {
    SessionState state;
    bool cleanup;  // remove the session's entries once it is delivered (close)
    std::uint64_t seq;
  };
  Mutex notice_mu_;  // guards the notice queue; state_ changes under it
  std::condition_variable notice_cv_;
  std::deque<Notice> notices_ DLOCK_GUARDED_BY(notice_mu_);
  std::uint64_t notices_queued_ DLOCK_GUARDED_BY(notice_mu_) = 0;
  std::uint64_t notices_delivered_ DLOCK_GUARDED_BY(notice_mu_) = 0;
  std::optional<std::thread::id> deliverer_ DLOCK_GUARDED_BY(notice_mu_);
  // Set by start() and reset by stop_keep_alive(), which close() runs once:
  // not shared between threads.
  std::shared_ptr<void> clock_subscription_;
  // Interrupts the keep-alive's I/O on close. Made by the constructor, never
  // changed (empty if out of descriptors: close() then waits for the I/O's
  // own timeout).
  const std::optional<EventSignal> interrupt_;
  std::stop_source stop_;  // thread-safe
  std::thread thread_;     // set by start(), joined (or detached) by stop_keep_alive()
};

class RedisSession final : public Session {
 public:
  explicit RedisSession(std::shared_ptr<SessionCore> core) : core_(std::move(core)) {}
  ~RedisSession() override {
    core_->close();
    core_->quiesce();
  }

  std::string id() const override { return core_->id(); }
  SessionState state() const noexcept override { return core_->state(); }
  std::shared_ptr<void> subscribe(std::function<void(SessionState)> fn) override {
    return core_->subscribe(std::move(fn));
  }
  Result<Appended> append(std::string_view queue, const EntrySpec& spec, Clock::time_point deadline) override {
    return core_->append(queue, spec, deadline);
  }
  Result<std::vector<Entry>> list(std::string_view queue, const ListOptions& options,
                                  Clock::time_point deadline) override {
    return core_->list(queue, options, deadline);
  }
  Status wait_any_gone(std::string_view queue, std::span<const std::string> ids, Clock::time_point deadline,
                       std::stop_token stop) override {
    return core_->wait_any_gone(queue, ids, deadline, std::move(stop));
  }
  // The subscriber vouches for `own` (Subscriber::WaitSpec::own): watched
  // with `ids`, it costs nothing more (the same check, the same channel).
  std::shared_ptr<void> async_wait_turn(std::string_view queue, std::span<const std::string> ids,
                                        std::span<const std::string> ahead, std::string_view own,
                                        std::function<void(Status, bool)> done) override {
    auto intact = std::make_shared<std::atomic<bool>>(false);
    return core_->async_wait_any_gone(
        queue, ids,
        [intact, done = std::move(done)](Status s) {
          const bool vouched = s.ok() && intact->load();
          done(std::move(s), vouched);
        },
        own, ahead, intact);
  }
  std::shared_ptr<void> async_wait_any_gone(std::string_view queue, std::span<const std::string> ids,
                                            std::function<void(Status)> done) override {
    return core_->async_wait_any_gone(queue, ids, std::move(done));
  }
  void async_append(std::string_view queue, const EntrySpec& spec, Clock::time_point deadline,
                    std::function<void(Result<Appended>)> done) override {
    core_->async_append(queue, spec, deadline, std::move(done));
  }
  void async_find_own(std::string_view queue, std::string_view attempt_id, Clock::time_point deadline,
                      std::function<void(Result<std::optional<Entry>>)> done) override {
    core_->async_find_own(queue, attempt_id, deadline, std::move(done));
  }
  void async_list(std::string_view queue, const ListOptions& options, Clock::time_point deadline,
                  std::function<void(Result<std::vector<Entry>>)> done) override {
    core_->async_list(queue, options, deadline, std::move(done));
  }
  void async_remove(std::string_view queue, std::string_view id, Clock::time_point deadline,
                    std::function<void(Status)> done) override {
    core_->async_remove(queue, id, deadline, std::move(done));
  }
  Status remove(std::string_view queue, std::string_view id, Clock::time_point deadline) override {
    return core_->remove(queue, id, deadline);
  }
  Result<std::optional<Entry>> find_own(std::string_view queue, std::string_view attempt_id,
                                        Clock::time_point deadline) override {
    return core_->find_own(queue, attempt_id, deadline);
  }
  bool keeps_values() const noexcept override { return true; }
  Result<Entry> update_entry(std::string_view queue, std::string_view id, const EntryUpdate& update,
                             Clock::time_point deadline) override {
    return core_->update_entry(queue, id, update, deadline);
  }
  void async_update_entry(std::string_view queue, std::string_view id, const EntryUpdate& update,
                          Clock::time_point deadline, std::function<void(Result<Entry>)> done) override {
    core_->async_update_entry(queue, id, update, deadline, std::move(done));
  }
  void async_read_head(std::string_view queue, const ListOptions& options, Clock::time_point deadline,
                       std::function<void(Result<Head>)> done) override {
    core_->async_read_head(queue, options, deadline, std::move(done));
  }
  std::shared_ptr<void> async_watch_head(std::string_view queue, const Head& seen,
                                         std::function<void(Status)> done) override {
    return core_->async_watch_head(queue, seen, std::move(done));
  }
  void close() noexcept override { core_->close(); }

 private:
  std::shared_ptr<SessionCore> core_;
};

// --- The store

std::string SessionNote() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  nlohmann::json j = {{"host", host}, {"pid", static_cast<std::int64_t>(::getpid())}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

class RedisStore final : public Store {
 public:
  explicit RedisStore(std::shared_ptr<StoreCore> core) : core_(std::move(core)) {}

  std::string url() const override { return core_->cfg().url; }

  Result<std::shared_ptr<Session>> open_session(Clock::time_point deadline) override {
    const Config& cfg = core_->cfg();
    const std::string note = SessionNote();
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::string sid = RandomHex(8);
      Clock::time_point sent = cfg.clock->now();
      auto r = core_->command({"SET", SessionKey(sid), note, "NX", "PX", std::to_string(cfg.ttl.count())},
                              core_->io_deadline(deadline));
      if (!r.ok()) return r.status();
      if (r->is_error()) return ErrorReplyStatus(r->str(), "redis store: opening a session");
      if (r->is_nil()) continue;  // a 64-bit collision: draw again
      auto core = std::make_shared<SessionCore>(core_, sid, sent);
      core->start();
      return std::shared_ptr<Session>(std::make_shared<RedisSession>(std::move(core)));
    }
    return InternalError("redis store: could not draw a free session id");
  }

 private:
  std::shared_ptr<StoreCore> core_;
};

Result<Config> ParseConfig(const ParsedUrl& url, const StoreOptions& options) {
  Config cfg;
  cfg.url = url.redacted();
  cfg.clock = options.clock ? options.clock : Clock::system();
  if (url.hosts.empty()) return InvalidArgumentError("redis:// needs a host, e.g. redis://localhost:6379");
  if (url.hosts.size() > 1) {
    return InvalidArgumentError("redis:// takes one host; Redis Cluster and Sentinel are not supported");
  }
  if (auto s = CheckQueryKeys(url, {"ttl", "connect_timeout", "wait_replicas", "wait_timeout"}); !s.ok()) return s;
  cfg.endpoint.host = url.hosts[0].host;
  cfg.endpoint.port = url.hosts[0].port.value_or(6379);
  if (url.user && !url.user->empty() && !url.password) {
    return InvalidArgumentError("redis:// user '" + *url.user + "' needs a password (redis://user:password@host)");
  }
  if (url.user && !url.user->empty()) cfg.endpoint.user = url.user;
  cfg.endpoint.password = url.password;
  if (!url.path.empty() && url.path != "/") {
    std::string_view db = std::string_view(url.path).substr(1);
    int n = -1;
    if (!ParseNumber(db, n) || n < 0 || n > 1'000'000) {
      return InvalidArgumentError("redis:// path '" + url.path + "' is not a database number (e.g. /0)");
    }
    cfg.endpoint.db = n;
  }
  auto ttl = QueryDuration(url, "ttl", milliseconds(30'000));
  if (!ttl.ok()) return ttl.status();
  if (*ttl < milliseconds(100) || *ttl > std::chrono::hours(24)) {
    return InvalidArgumentError("URL parameter ttl must be between 100ms and 24h");
  }
  cfg.ttl = *ttl;
  auto ct = QueryDuration(url, "connect_timeout", options.connect_timeout);
  if (!ct.ok()) return ct.status();
  if (*ct <= milliseconds(0)) return InvalidArgumentError("URL parameter connect_timeout must be positive");
  cfg.op_timeout = *ct;
  auto wr = QueryInt(url, "wait_replicas", 0, 0, 1000);
  if (!wr.ok()) return wr.status();
  cfg.wait_replicas = static_cast<int>(*wr);
  auto wt = QueryDuration(url, "wait_timeout", milliseconds(1'000));
  if (!wt.ok()) return wt.status();
  if (*wt <= milliseconds(0)) return InvalidArgumentError("URL parameter wait_timeout must be positive");
  cfg.wait_timeout = *wt;
  return cfg;
}

}  // namespace
}  // namespace redis

Result<std::shared_ptr<Store>> OpenRedisStore(const ParsedUrl& url, const StoreOptions& options) {
  using namespace redis;
  auto cfg = ParseConfig(url, options);
  if (!cfg.ok()) return cfg.status();
  auto deadline = IoClock::now() + cfg->op_timeout;
  auto conn = Conn::open(cfg->endpoint, deadline);
  if (!conn.ok()) return conn.status();
  // Load the scripts (their SHA1s come back), and make sure both EVAL and
  // EVALSHA run: a server that refuses scripts fails here, not at the first
  // lock.
  std::vector<Command> load;
  for (int i = 0; i < kScriptCount; ++i) load.push_back({"SCRIPT", "LOAD", ScriptSource(static_cast<ScriptId>(i))});
  load.push_back({"EVAL", ScriptSource(ScriptId::kProbe), "0"});
  auto replies = (*conn)->pipeline(load, deadline);
  const std::string where = (*conn)->where();
  if (!replies.ok()) {
    return UnavailableError("redis at " + where +
                            " did not answer within the connect timeout: " + replies.status().message());
  }
  std::array<std::string, kScriptCount> shas;
  for (std::size_t i = 0; i < replies->size(); ++i) {
    const Reply& r = (*replies)[i];
    bool is_eval = i == static_cast<std::size_t>(kScriptCount);
    if (r.is_error()) {
      Status s = ErrorReplyStatus(r.str(), "redis at " + where);
      if (s.code() == ErrorCode::kUnauthenticated || s.code() == ErrorCode::kPermissionDenied ||
          s.code() == ErrorCode::kUnavailable) {
        return s;
      }
      return FailedPreconditionError("redis at " + where + " refuses Lua scripts (" +
                                     (is_eval ? "EVAL" : "SCRIPT LOAD") + " failed: " + std::string(r.str()) +
                                     "); dlock's redis:// store needs EVAL, EVALSHA and SCRIPT");
    }
    if (!is_eval) shas[i] = std::string(r.str());
  }
  auto probe = (*conn)->run({"EVALSHA", shas[static_cast<int>(ScriptId::kProbe)], "0"}, deadline);
  if (!probe.ok()) {
    return UnavailableError("redis at " + where +
                            " did not answer within the connect timeout: " + probe.status().message());
  }
  if (probe->is_error()) {
    return FailedPreconditionError("redis at " + where + " refuses Lua scripts (EVALSHA failed: " +
                                   std::string(probe->str()) + "); dlock's redis:// store needs EVAL and EVALSHA");
  }
  auto core = std::make_shared<StoreCore>(std::move(*cfg), std::move(shas));
  core->pool().adopt(std::move(*conn));
  return std::shared_ptr<Store>(std::make_shared<RedisStore>(std::move(core)));
}

}  // namespace dlock::internal
