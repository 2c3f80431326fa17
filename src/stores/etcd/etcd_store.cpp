// The etcd:// store. See etcd_store.hpp for what it guarantees,
// etcd_layout.hpp for the keys, docs/etcd.md for every operation as etcd
// RPCs and why.
//
// Two gRPC channels per endpoint (each on a connection of its own):
//  - the first carries the unary calls (Txn, LeaseRevoke): the blocking
//    Session methods make them on the calling thread (gRPC's synchronous
//    stubs), the async_ ones on the store's Loop, whose thread runs their
//    completions; and one Watch stream for the waits of every session
//    (Watches), on the Loop too;
//  - the second the lease calls: LeaseGrant, and one LeaseKeepAlive stream
//    for the leases of every session (KeepAlives), on a second Loop, the
//    lease loop, which also runs each session's lost timer and tells the
//    sessions' subscribers of their state. No request, answer or watch
//    event, however many, queues ahead of a renewal (review 2, finding B);
//    a subscriber that blocks still holds back every session's renewals.
// Other threads post to the loops. So a store runs two threads of its own,
// whatever the number of sessions, waits and holds. (gRPC runs a few
// process-wide threads of its own, which never run dlock code.)
//
// Lease accounting: a renewal request sent at time S and answered with
// TTL > 0 proves that the leader renewed the lease after S, so it lives at
// least until S + TTL on the server. The session counts itself lost at
// (latest such S + TTL) - TTL/10, by its own clock, and at once on TTL <= 0.
#include "stores/etcd/etcd_store.hpp"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>

#include "core/dlock_thread.hpp"
#include "core/listeners.hpp"
#include "core/serial_delivery.hpp"
#include "core/thread_annotations.hpp"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "stores/blocking_wait.hpp"
#include "stores/entry_value.hpp"
#include "stores/etcd/etcd_layout.hpp"
#include "stores/etcd/etcd_loop.hpp"
#include "stores/one_outcome.hpp"

namespace dlock::internal::etcd {
namespace {

namespace pb = etcdserverpb;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr std::uint16_t kDefaultPort = 2379;
// Waits and stream reopenings retry after this, doubling up to the maximum.
constexpr milliseconds kFirstRetry{50};
constexpr milliseconds kMaxRetry{2'000};
// How often the watch stream checks that its member answers (Watches::probe).
constexpr milliseconds kWatchProbeEvery{2'000};
// How long a hold's watch of its own entry outlives the hold, and how many
// may (Watches::linger).
constexpr milliseconds kLingerFor{1'000};
constexpr std::size_t kMaxLingering = 64;
// Reads of more keys than this in one Txn read the queue's range instead
// (etcd's --max-txn-ops is 128 by default).
constexpr std::size_t kMaxKeysPerTxn = 64;

// --- Configuration

struct Config {
  std::string url;                   // redacted
  std::vector<std::string> targets;  // one gRPC target per endpoint: "ipv4:a:p", "ipv6:[::1]:p", "dns:///h:p"
  std::string prefix;                // "" or ending in '/'
  seconds ttl{10};
  milliseconds connect_timeout{10'000};
  std::shared_ptr<Clock> clock;
  bool tls = false;
  std::string ca_pem, cert_pem, key_pem;
  std::optional<std::string> user, password;
};

bool IsIpv4(const std::string& host) {
  int dots = 0;
  for (char c : host) {
    if (c == '.') {
      ++dots;
    } else if (c < '0' || c > '9') {
      return false;
    }
  }
  return dots == 3;
}

Result<std::string> ReadFile(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgumentError("etcd:// " + what + " file '" + path + "' cannot be read");
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

Result<Config> ParseConfig(const ParsedUrl& url, const StoreOptions& options) {
  if (auto s = CheckQueryKeys(url, {"ttl", "connect_timeout", "ca", "cert", "key"}); !s.ok()) return s;
  Config cfg;
  cfg.url = url.redacted();
  cfg.clock = options.clock ? options.clock : Clock::system();
  if (url.hosts.empty()) return InvalidArgumentError("etcd:// URL needs at least one host, e.g. etcd://127.0.0.1:2379");
  for (const auto& hp : url.hosts) {
    const std::string port = std::to_string(hp.port.value_or(kDefaultPort));
    if (IsIpv4(hp.host)) {
      cfg.targets.push_back("ipv4:" + hp.host + ":" + port);
    } else if (hp.host.find(':') != std::string::npos) {
      cfg.targets.push_back("ipv6:[" + hp.host + "]:" + port);
    } else {
      cfg.targets.push_back("dns:///" + hp.host + ":" + port);
    }
  }
  std::string prefix = url.path;
  while (!prefix.empty() && prefix.front() == '/') prefix.erase(0, 1);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (!prefix.empty()) {
    if (auto s = ValidateLockName(prefix); !s.ok()) {
      return InvalidArgumentError("etcd:// prefix '" + prefix + "': " + s.message());
    }
    cfg.prefix = prefix + "/";
  }
  auto ttl = QueryDuration(url, "ttl", milliseconds(10'000));
  if (!ttl.ok()) return ttl.status();
  if (*ttl < seconds(1) || *ttl > std::chrono::hours(24)) {
    return InvalidArgumentError("etcd:// ttl must be between 1s and 24h");
  }
  cfg.ttl = std::chrono::ceil<seconds>(*ttl);
  auto connect = QueryDuration(url, "connect_timeout", options.connect_timeout);
  if (!connect.ok()) return connect.status();
  cfg.connect_timeout = std::max(*connect, milliseconds(1));
  const std::pair<const char*, std::string*> pems[] = {
      {"ca", &cfg.ca_pem}, {"cert", &cfg.cert_pem}, {"key", &cfg.key_pem}};
  for (auto [key, pem] : pems) {
    auto it = url.query.find(key);
    if (it == url.query.end()) continue;
    auto content = ReadFile(key, it->second);
    if (!content.ok()) return content.status();
    *pem = std::move(*content);
    cfg.tls = true;
  }
  if (cfg.cert_pem.empty() != cfg.key_pem.empty()) {
    return InvalidArgumentError("etcd:// cert and key go together (a client certificate and its key)");
  }
  if (url.user) {
    if (url.user->empty()) return InvalidArgumentError("etcd:// URL has an empty user name");
    if (!url.password) return InvalidArgumentError("etcd:// URL names user '" + *url.user + "' without a password");
    cfg.user = url.user;
    cfg.password = url.password;
  }
  return cfg;
}

// --- gRPC status -> dlock status

Status FromGrpc(const grpc::Status& s, std::string_view what) {
  const std::string m = "etcd store: " + std::string(what) + ": " + s.error_message();
  switch (s.error_code()) {
    case grpc::StatusCode::OK: return OkStatus();
    case grpc::StatusCode::NOT_FOUND:
      if (s.error_message().find("lease not found") != std::string::npos) return SessionLostError(m);
      return InternalError(m);
    case grpc::StatusCode::PERMISSION_DENIED: return PermissionDeniedError(m);
    case grpc::StatusCode::UNAUTHENTICATED: return UnauthenticatedError(m);
    case grpc::StatusCode::INVALID_ARGUMENT:
      if (s.error_message().find("authentication failed") != std::string::npos ||
          s.error_message().find("user name is empty") != std::string::npos) {
        return UnauthenticatedError(m);
      }
      return InternalError(m);
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::UNKNOWN: return UnavailableError(m);
    default: return InternalError(m);
  }
}

// A call refused for its auth token, which another Authenticate renews:
// the token expired on the member (simple tokens after --auth-token-ttl
// without use, on each member of its own), or the auth store changed.
bool IsStaleToken(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
         s.error_message().find("invalid auth token") != std::string::npos ||
         s.error_message().find("revision of auth store is old") != std::string::npos;
}

// --- Request pieces

pb::RequestOp PutOp(const std::string& key, std::string value, std::int64_t lease) {
  pb::RequestOp op;
  auto* put = op.mutable_request_put();
  put->set_key(key);
  put->set_value(std::move(value));
  put->set_lease(lease);
  return op;
}

pb::RequestOp RangeOp(const std::string& key, const std::string& range_end, bool keys_only) {
  pb::RequestOp op;
  auto* range = op.mutable_request_range();
  range->set_key(key);
  if (!range_end.empty()) range->set_range_end(range_end);
  range->set_keys_only(keys_only);
  return op;
}

pb::RequestOp DirOp(const std::string& dir, bool keys_only) { return RangeOp(dir, PrefixEnd(dir), keys_only); }

pb::RequestOp DeleteOp(const std::string& key) {
  pb::RequestOp op;
  op.mutable_request_delete_range()->set_key(key);
  return op;
}

// "`target` of `key` equals `value`": CREATE (its create revision; 0 when
// the key does not exist), VERSION (0 likewise) or LEASE.
pb::Compare Equals(const std::string& key, pb::Compare::CompareTarget target, std::int64_t value) {
  pb::Compare c;
  c.set_key(key);
  c.set_target(target);
  c.set_result(pb::Compare::EQUAL);
  switch (target) {
    case pb::Compare::CREATE: c.set_create_revision(value); break;
    case pb::Compare::VERSION: c.set_version(value); break;
    case pb::Compare::LEASE: c.set_lease(value); break;
    default: break;  // not used
  }
  return c;
}
pb::Compare CreateRevisionIs(const std::string& key, std::int64_t rev) { return Equals(key, pb::Compare::CREATE, rev); }
pb::Compare VersionIs(const std::string& key, std::int64_t version) {
  return Equals(key, pb::Compare::VERSION, version);
}
pb::Compare LeaseIs(const std::string& key, std::int64_t lease) { return Equals(key, pb::Compare::LEASE, lease); }

std::vector<KeyRead> KeysOf(const pb::ResponseOp& op) {
  std::vector<KeyRead> out;
  for (const auto& kv : op.response_range().kvs()) {
    out.push_back({kv.key(), kv.create_revision(), kv.mod_revision(), kv.lease(), kv.value(), kv.version()});
  }
  return out;
}

std::vector<RecordRead> RecordsOf(const pb::ResponseOp& op) {
  std::vector<RecordRead> out;
  for (const auto& kv : op.response_range().kvs()) out.push_back({kv.key(), kv.value(), kv.create_revision()});
  return out;
}

std::vector<Entry> JustEntries(std::vector<Listed> listed) {
  std::vector<Entry> out;
  out.reserve(listed.size());
  for (Listed& l : listed) out.push_back(std::move(l.entry));
  return out;
}

using TxnDone = std::function<void(Result<pb::TxnResponse>)>;

class SessionCore;
class KeepAlives;
class Watches;

// --- The shared part of a store: channels, stubs, loops

// A started Loop, shut down (its thread ended) when this goes: a Core whose
// constructor throws after starting one (the second thread cannot be had)
// leaves no thread behind (review finding).
class StartedLoop {
 public:
  explicit StartedLoop(const char* name) : loop_(Loop::start(name)) {}
  ~StartedLoop() { loop_->shut_down(); }
  StartedLoop(const StartedLoop&) = delete;
  StartedLoop& operator=(const StartedLoop&) = delete;
  Loop& operator*() const { return *loop_; }
  Loop* operator->() const { return loop_.get(); }

 private:
  const std::shared_ptr<Loop> loop_;
};

class Core : public std::enable_shared_from_this<Core> {
 public:
  // One channel per endpoint, so that the store can leave a member that
  // hangs or lost its leader (one channel over all of them would stay with a
  // member whose connection still stands). The lease calls have a channel
  // of their own per endpoint, on a connection of its own: on one
  // connection, a renewal and its answer queue behind every request and
  // answer sent before them (a burst of thousands of them took longer than
  // the TTL).
  struct Member {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<pb::KV::Stub> kv;
    std::unique_ptr<pb::Lease::Stub> lease;
    std::unique_ptr<pb::Watch::Stub> watch;
  };

  Core(Config cfg, const std::vector<std::shared_ptr<grpc::Channel>>& channels,
       const std::vector<std::shared_ptr<grpc::Channel>>& lease_channels, std::size_t first)
      : cfg_(std::move(cfg)), loop_("dlock-etcd"), lease_loop_("dlock-etcd-ka"), current_(first) {
    for (std::size_t i = 0; i < channels.size(); ++i) {
      const auto& c = channels[i];
      members_.push_back(Member{c, pb::KV::NewStub(c), pb::Lease::NewStub(lease_channels[i]), pb::Watch::NewStub(c)});
    }
  }
  ~Core();

  // Makes the loop-thread parts (they need shared_from_this).
  void start();

  const Config& cfg() const { return cfg_; }
  // Requests and waits.
  Loop& loop() { return *loop_; }
  // The keep-alive stream and the sessions' lost timers, apart from the
  // requests, so that no backlog of theirs can hold a renewal back.
  Loop& lease_loop() { return *lease_loop_; }
  bool on_store_thread() const { return loop_->on_loop_thread() || lease_loop_->on_loop_thread(); }
  KeepAlives& keep_alives() { return *keep_alives_; }  // lease loop thread only
  Watches& watches() { return *watches_; }             // loop thread only
  // The member calls go to now, and its index (for avoid()).
  std::size_t current() const { return current_.load(); }
  const Member& member(std::size_t i) const { return members_[i % members_.size()]; }
  // `i` failed (hung, no leader, gone): the next calls and streams go to the
  // next member, unless another failure moved on already.
  void avoid(std::size_t i) {
    std::size_t expected = i;
    current_.compare_exchange_strong(expected, (i + 1) % members_.size());
  }

  // Authenticates (when the URL has a user) and keeps the token for every
  // later call. On the calling thread, bounded by the connect timeout.
  Status authenticate() DLOCK_EXCLUDES(token_mu_);
  // After a call failed with IsStaleToken: a new token, at most once a
  // second (several calls fail together when a token expires). Whether the
  // call is worth one more try.
  bool renew_token() DLOCK_EXCLUDES(token_mu_);

  // A call's context: its deadline (see io_deadline) and the auth token.
  void setup(grpc::ClientContext& ctx, Clock::time_point deadline) DLOCK_EXCLUDES(token_mu_) {
    ctx.set_deadline(std::chrono::system_clock::now() + io_timeout(deadline));
    add_token(ctx);
  }
  // A stream's: no deadline; a member that loses its leader ends it.
  void setup_stream(grpc::ClientContext& ctx) DLOCK_EXCLUDES(token_mu_) {
    ctx.AddMetadata("hasleader", "true");
    add_token(ctx);
  }

  // "At most about the deadline plus one round trip", and never more than
  // the connect timeout (a request that could not be answered in time has
  // an unknown outcome: kUnavailable).
  Clock::duration io_timeout(Clock::time_point deadline) const {
    const Clock::duration cap = cfg_.connect_timeout;
    const Clock::duration floor = std::min<Clock::duration>(cap, milliseconds(1'000));
    Clock::duration left = cap;
    if (deadline != kNoDeadline) left = deadline - cfg_.clock->now();
    return std::clamp<Clock::duration>(left, floor, cap);
  }

  // A synchronous call on this thread, `call(ctx)` made once more with a
  // new token if the first was refused for its token.
  // `call(ctx, member)` goes to the current member; one that cannot be
  // reached is avoided from then on.
  template <class Call>
  grpc::Status call_sync(Clock::time_point deadline, Call call) {
    for (int attempt = 0;; ++attempt) {
      grpc::ClientContext ctx;
      setup(ctx, deadline);
      const std::size_t m = current();
      grpc::Status s = call(ctx, member(m));
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE) avoid(m);
      if (s.ok() || attempt > 0 || !IsStaleToken(s) || !renew_token()) return s;
    }
  }

  // A Txn, on the calling thread (`sync`: `done` runs before this returns)
  // or on the loop.
  void txn(const pb::TxnRequest& req, Clock::time_point deadline, bool sync, TxnDone done);
  void revoke(std::int64_t lease, bool sync);

 private:
  void txn_on_loop(const pb::TxnRequest& req, Clock::time_point deadline, bool retried, TxnDone done);
  void add_token(grpc::ClientContext& ctx) DLOCK_EXCLUDES(token_mu_) {
    MutexLock lk(token_mu_);
    if (!token_.empty()) ctx.AddMetadata("token", token_);
  }

  const Config cfg_;
  std::vector<Member> members_;  // set by the constructor, then constant
  const StartedLoop loop_;
  const StartedLoop lease_loop_;
  std::atomic<std::size_t> current_;
  std::shared_ptr<KeepAlives> keep_alives_;  // set by start(), then constant
  std::shared_ptr<Watches> watches_;         // set by start(), then constant
  Mutex token_mu_;
  std::string token_ DLOCK_GUARDED_BY(token_mu_);
  std::chrono::steady_clock::time_point token_at_ DLOCK_GUARDED_BY(token_mu_);
};

// A unary call, started and completed on the loop thread (posted there
// from any other): `done(status, response)` on the loop thread, or at once
// with UNAVAILABLE when the loop is shutting down.
template <class Response, class Request, class Prepare>
void CallOnLoop(Loop& loop, Prepare prepare, Request req, std::function<void(grpc::ClientContext&)> setup,
                std::function<void(const grpc::Status&, Response&)> done) {
  struct Call {
    grpc::ClientContext ctx;
    Response response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> reader;
  };
  auto closing = [](const std::function<void(const grpc::Status&, Response&)>& d) {
    Response none;
    d(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the store is closing"), none);
  };
  auto start = [&loop, prepare, req = std::move(req), setup = std::move(setup), done, closing]() {
    auto call = std::make_shared<Call>();
    setup(call->ctx);
    void* tag = loop.tag(&call->ctx, [call, done](bool) { done(call->status, call->response); });
    if (tag == nullptr) return closing(done);
    call->reader = prepare(&call->ctx, req, loop.queue());
    call->reader->StartCall();
    call->reader->Finish(&call->response, &call->status, tag);
  };
  if (loop.on_loop_thread()) return start();
  if (!loop.post(std::move(start))) closing(done);
}

Status Core::authenticate() {
  if (!cfg_.user) return OkStatus();
  auto auth = pb::Auth::NewStub(member(current()).channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + cfg_.connect_timeout);
  pb::AuthenticateRequest req;
  req.set_name(*cfg_.user);
  req.set_password(*cfg_.password);
  pb::AuthenticateResponse resp;
  grpc::Status s = auth->Authenticate(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc(s, "authenticating as " + *cfg_.user);
  MutexLock lk(token_mu_);
  token_ = resp.token();
  token_at_ = std::chrono::steady_clock::now();
  return OkStatus();
}

bool Core::renew_token() {
  if (!cfg_.user) return false;
  {
    MutexLock lk(token_mu_);
    if (std::chrono::steady_clock::now() - token_at_ < seconds(1)) return true;  // just renewed: try again
  }
  return authenticate().ok();
}

void Core::txn(const pb::TxnRequest& req, Clock::time_point deadline, bool sync, TxnDone done) {
  if (sync) {
    pb::TxnResponse resp;
    grpc::Status s =
        call_sync(deadline, [&](grpc::ClientContext& ctx, const Member& m) { return m.kv->Txn(&ctx, req, &resp); });
    if (s.ok()) return done(std::move(resp));
    return done(FromGrpc(s, "txn"));
  }
  txn_on_loop(req, deadline, /*retried=*/false, std::move(done));
}

void Core::txn_on_loop(const pb::TxnRequest& req, Clock::time_point deadline, bool retried, TxnDone done) {
  const std::size_t m = current();
  CallOnLoop<pb::TxnResponse>(
      *loop_,
      [this, m](grpc::ClientContext* ctx, const pb::TxnRequest& r, grpc::CompletionQueue* cq) {
        return member(m).kv->PrepareAsyncTxn(ctx, r, cq);
      },
      req, [this, deadline](grpc::ClientContext& ctx) { setup(ctx, deadline); },
      [self = shared_from_this(), m, req, deadline, retried, done = std::move(done)](const grpc::Status& s,
                                                                                     pb::TxnResponse& resp) mutable {
        if (s.ok()) return done(std::move(resp));
        if (s.error_code() == grpc::StatusCode::UNAVAILABLE) self->avoid(m);
        // A renewal is one Authenticate on this thread: rare (a token unused
        // for minutes), and answered by the member that just refused it.
        if (!retried && IsStaleToken(s) && self->renew_token()) {
          return self->txn_on_loop(req, deadline, /*retried=*/true, std::move(done));
        }
        done(FromGrpc(s, "txn"));
      });
}

void Core::revoke(std::int64_t lease, bool sync) {
  pb::LeaseRevokeRequest req;
  req.set_id(lease);
  // Short: the lease runs out by itself if this fails.
  const Clock::time_point deadline = cfg_.clock->now() + std::min<Clock::duration>(cfg_.connect_timeout, seconds(2));
  if (sync) {
    pb::LeaseRevokeResponse resp;
    (void)call_sync(deadline,
                    [&](grpc::ClientContext& ctx, const Member& m) { return m.lease->LeaseRevoke(&ctx, req, &resp); });
    return;
  }
  CallOnLoop<pb::LeaseRevokeResponse>(
      *loop_,
      [this](grpc::ClientContext* ctx, const pb::LeaseRevokeRequest& r, grpc::CompletionQueue* cq) {
        return member(current()).lease->PrepareAsyncLeaseRevoke(ctx, r, cq);
      },
      req, [this, deadline](grpc::ClientContext& ctx) { setup(ctx, deadline); },
      [keep = shared_from_this()](const grpc::Status&, pb::LeaseRevokeResponse&) {});
}

// Retry delays: kFirstRetry, doubling to kMaxRetry.
class Backoff {
 public:
  milliseconds next() {
    const milliseconds d = delay_;
    delay_ = std::min(delay_ * 2, kMaxRetry);
    return d;
  }
  void reset() { delay_ = kFirstRetry; }

 private:
  milliseconds delay_ = kFirstRetry;
};

Loop::TimePoint RealTimeAt(const Clock& clock, Clock::time_point when) {
  return std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                std::max(when - clock.now(), Clock::duration{}));
}

// --- Sessions

// A pending wait (async_wait_any_gone). The fields below `outcome` belong to
// the loop thread.
struct WaitRec {
  std::weak_ptr<SessionCore> session;
  std::string queue;
  std::vector<std::pair<std::string, std::int64_t>> keys;  // key, create revision
  std::shared_ptr<OneOutcome> outcome;

  // Every key is the waiting session's own, so it was there at its create
  // revision (from the session's own append): the first watch starts there
  // without a read. A hold watching its own entry so costs no round trip;
  // a compacted start (the watch is cancelled) reads as any other wait.
  bool watch_without_read = false;

  // A head watch (async_watch_head) rather than a wait: watches, from
  // `head_from`, of `keys` (the head and, for a write entry, its downgrade
  // reservation: any event is a change) or, with `head_dir` set, of the
  // whole queue directory (a Put of an entry of the queue itself is a
  // change). Its start revision is a reading's, so no
  // reading follows it: every event since is in etcd's history, and a
  // compacted start ends the watch with OK (the caller reads again).
  bool head = false;
  std::string head_dir;
  std::int64_t head_from = 0;

  bool done = false;                    // finished or cancelled: nothing more to do
  bool checking = false;                // a read is in flight
  bool lingers = false;                 // watch_ids watch from each key's creation: may linger (Watches::linger)
  std::vector<std::int64_t> watch_ids;  // one per key of `keys`, in order (a head watch: its own)
  std::uint64_t watch_generation = 0;   // of watch_ids: a reading counts for the watches it followed
  std::size_t unconfirmed = 0;          // watches of watch_ids whose creation etcd has not confirmed yet
  std::uint64_t retry_timer = 0;
  Backoff backoff;
};

class SessionCore : public std::enable_shared_from_this<SessionCore> {
 public:
  SessionCore(std::shared_ptr<Core> core, std::int64_t lease, seconds ttl, Clock::time_point granted_sent)
      : core_(std::move(core)),
        cfg_(core_->cfg()),
        lease_(lease),
        sid_(LeaseHex(lease)),
        ttl_(ttl),
        layout_(cfg_.prefix) {
    lost_at_.store((granted_sent + ttl_ - margin()).time_since_epoch().count());
  }

  // Puts the lease on the keep-alive stream.
  void start();

  const std::string& id() const { return sid_; }
  const std::shared_ptr<Clock>& clock() const { return cfg_.clock; }
  // On one of the store's two threads (where a subscriber runs).
  bool on_store_thread() const { return core_->on_store_thread(); }
  std::int64_t lease() const { return lease_; }
  seconds ttl() const { return ttl_; }
  // A tenth of the TTL (in the clock's unit: a whole-second division would
  // round it away).
  Clock::duration margin() const { return std::chrono::duration_cast<Clock::duration>(ttl_) / 10; }
  Clock::time_point lost_at() const { return Clock::time_point(Clock::duration(lost_at_.load())); }

  SessionState state() const noexcept {
    SessionState s = state_.load();
    if ((s == SessionState::kConnected || s == SessionState::kSuspended) &&
        cfg_.clock->now().time_since_epoch().count() >= lost_at_.load()) {
      return SessionState::kLost;  // the loop's timer is about to say so
    }
    return s;
  }

  std::shared_ptr<void> subscribe(std::function<void(SessionState)> fn) { return listeners_.add(std::move(fn)); }

  Status usable(bool fail_if_suspended) const {
    switch (state()) {
      case SessionState::kLost: return SessionLostError("etcd session " + sid_ + " is lost" + lost_reason());
      case SessionState::kClosed: return SessionLostError("etcd session " + sid_ + " is closed");
      case SessionState::kSuspended:
        if (fail_if_suspended)
          return UnavailableError("etcd session " + sid_ + " is suspended: cannot reach " + cfg_.url);
        return OkStatus();
      case SessionState::kConnected: return OkStatus();
    }
    return OkStatus();
  }

  // --- Requests (`sync`: on the calling thread, `done` before returning)

  void append(std::string_view queue, const EntrySpec& spec, Clock::time_point deadline, bool sync,
              std::function<void(Result<Appended>)> done) {
    if (auto s = ValidateLockName(queue); !s.ok()) return done(s);
    if (spec.kind.empty()) return done(InvalidArgumentError("entry kind is empty"));
    if (spec.attempt_id.empty() || spec.attempt_id.find('/') != std::string::npos) {
      return done(InvalidArgumentError("etcd store: attempt id '" + spec.attempt_id + "' is not valid"));
    }
    if (auto s = CheckEntryValue(spec.value); !s.ok()) return done(s);
    if (auto s = usable(true); !s.ok()) return done(s);
    if (spec.sequence) return downgrade(std::string(queue), spec, deadline, sync, std::move(done));
    put_entry(std::string(queue), FirstSuffix(lease_), spec, 0, deadline, sync, /*first=*/true, std::move(done));
  }

  void list(std::string_view queue, const ListOptions& options, Clock::time_point deadline, bool sync,
            std::function<void(Result<std::vector<Entry>>)> done) {
    if (auto s = ValidateLockName(queue); !s.ok()) return done(s);
    if (auto s = usable(true); !s.ok()) return done(s);
    read_queue(std::string(queue), deadline, sync, options.with_values,
               [done = std::move(done), options, self = shared_from_this(),
                q = std::string(queue)](Result<pb::TxnResponse> r) {
                 if (!r.ok()) return done(self->noted(r.status()));
                 done(JustEntries(self->entries_of(q, *r, 0, options)));
               });
  }

  void remove(std::string_view queue, std::string_view id, Clock::time_point deadline, bool sync,
              std::function<void(Status)> done) {
    if (auto s = ValidateLockName(queue); !s.ok()) return done(s);
    auto parsed = ParseEntryId(id);
    if (!parsed.ok()) return done(parsed.status());
    if (auto s = usable(true); !s.ok()) return done(s);
    const std::string q(queue);
    const std::string key = layout_.entry_key(q, parsed->suffix);
    pb::TxnRequest req;
    *req.add_compare() = CreateRevisionIs(key, parsed->create_revision);
    *req.add_success() = DeleteOp(key);
    *req.add_success() = DeleteOp(layout_.record_key(q, parsed->suffix));
    if (!IsReservationSuffix(parsed->suffix)) {
      // A write entry's reservation goes with it, unless a downgrade made it
      // a read entry (it then has a record of its own).
      const std::string reservation = ReservationSuffix(parsed->suffix);
      pb::RequestOp nested;
      auto* inner = nested.mutable_request_txn();
      *inner->add_compare() = CreateRevisionIs(layout_.entry_key(q, reservation), parsed->create_revision);
      *inner->add_compare() = VersionIs(layout_.record_key(q, reservation), 0);
      *inner->add_success() = DeleteOp(layout_.entry_key(q, reservation));
      *req.add_success() = std::move(nested);
    }
    // Not succeeded: the entry was gone already (or is a newer one under
    // the same key, which this id does not name): OK either way.
    core_->txn(req, deadline, sync, [done = std::move(done), self = shared_from_this()](Result<pb::TxnResponse> r) {
      done(r.ok() ? OkStatus() : self->noted(r.status()));
    });
  }

  void find_own(std::string_view queue, std::string_view attempt_id, Clock::time_point deadline, bool sync,
                std::function<void(Result<std::optional<Entry>>)> done) {
    if (auto s = ValidateLockName(queue); !s.ok()) return done(s);
    if (attempt_id.empty() || attempt_id.find('/') != std::string_view::npos) {
      return done(InvalidArgumentError("etcd store: attempt id '" + std::string(attempt_id) + "' is not valid"));
    }
    if (auto s = usable(true); !s.ok()) return done(s);
    const std::string q(queue);
    // The fence first, in the same Txn as the reading: etcd applies Txns one
    // at a time, so an append of this attempt still in flight either came
    // before (the reading has its entry) or fails its compare on the fence.
    pb::TxnRequest req;
    *req.add_success() = PutOp(layout_.fence_key(attempt_id), "", lease_);
    *req.add_success() = DirOp(layout_.queue_dir(q), /*keys_only=*/true);
    *req.add_success() = DirOp(layout_.record_dir(q), /*keys_only=*/false);
    core_->txn(req, deadline, sync,
               [done = std::move(done), self = shared_from_this(), q,
                attempt = std::string(attempt_id)](Result<pb::TxnResponse> r) {
                 if (!r.ok()) return done(self->noted(r.status()));
                 for (Listed& l : self->entries_of(q, *r, 1, {})) {
                   if (l.entry.attempt_id == attempt && l.lease == self->lease_) {
                     return done(std::optional<Entry>(std::move(l.entry)));
                   }
                 }
                 done(std::optional<Entry>());
               });
  }

  // --- Published values

  // A Txn on the entry key, compared on its create revision and lease (so
  // only this session's live entry): a Put of the new value with the lease,
  // and of the record for a new owner (read first: the record keeps the
  // kind and attempt, which an update does not name). Then ranges of both,
  // for the entry as it is now.
  void update(std::string_view queue, std::string_view id, const EntryUpdate& update, Clock::time_point deadline,
              bool sync, std::function<void(Result<Entry>)> done) {
    if (auto s = ValidateLockName(queue); !s.ok()) return done(s);
    if (auto s = CheckEntryValue(update.value); !s.ok()) return done(s);
    auto parsed = ParseEntryId(id);
    if (!parsed.ok()) return done(parsed.status());
    if (auto s = usable(true); !s.ok()) return done(s);
    const std::string q(queue);
    if (!update.owner) return put_update(q, *parsed, update, std::nullopt, deadline, sync, std::move(done));
    pb::TxnRequest req;
    *req.add_success() = RangeOp(layout_.record_key(q, parsed->suffix), "", /*keys_only=*/false);
    core_->txn(req, deadline, sync,
               [self = shared_from_this(), q, parsed = *parsed, update, deadline, sync,
                done = std::move(done)](Result<pb::TxnResponse> r) mutable {
                 if (!r.ok()) return done(self->noted(r.status()));
                 const auto* kvs = r->responses_size() > 0 ? &r->responses(0).response_range().kvs() : nullptr;
                 std::optional<Record> record;
                 if (kvs != nullptr && !kvs->empty()) record = DecodeRecord((*kvs)[0].value());
                 if (!record) {
                   return done(FailedPreconditionError("etcd store: no entry " +
                                                       EntryId(parsed.suffix, parsed.create_revision) + " of session " +
                                                       self->sid_ + " in " + q));
                 }
                 const std::int64_t read_at = (*kvs)[0].create_revision();
                 self->put_update(q, parsed, update, std::make_pair(std::move(*record), read_at), deadline, sync,
                                  std::move(done));
               });
  }

  // One reading of the queue with values; the head is the first entry of
  // dlock's own filtered order (not Go's first-create range, which a nested
  // name's key can win, etcd #6278); its position is the reading's revision.
  void read_head(std::string_view queue, const ListOptions& options, Clock::time_point deadline, bool sync,
                 std::function<void(Result<Head>)> done) {
    if (auto s = ValidateLockName(queue); !s.ok()) return done(s);
    if (auto s = usable(true); !s.ok()) return done(s);
    ListOptions with_values = options;
    with_values.with_values = true;
    read_queue(std::string(queue), deadline, sync, /*with_values=*/true,
               [done = std::move(done), with_values, self = shared_from_this(),
                q = std::string(queue)](Result<pb::TxnResponse> r) {
                 if (!r.ok()) return done(self->noted(r.status()));
                 auto entries = self->entries_of(q, *r, 0, with_values);
                 Head head;
                 if (!entries.empty()) head.entry = std::move(entries.front().entry);
                 head.position = r->header().revision();
                 done(std::move(head));
               });
  }

  // --- Waits

  std::shared_ptr<void> wait(std::string_view queue, std::span<const std::string> ids,
                             std::function<void(Status)> done);
  std::shared_ptr<void> watch_head(std::string_view queue, const Head& seen, std::function<void(Status)> done);
  std::shared_ptr<void> start_wait(std::shared_ptr<WaitRec> w, std::function<void(Status)> done);

  // --- State

  void close() noexcept;

  // Lease loop thread: a renewal sent at `sent` was answered with `ttl`.
  void renewed(Clock::time_point sent, seconds ttl) {
    if (cfg_.clock->now() >= lost_at()) {
      // Answered, but handled after the deadline (the process was paused):
      // state() has read kLost already, and a lost session never comes back.
      return lose("its deadline passed before a renewal's answer was handled");
    }
    const Clock::time_point until = sent + ttl - margin();
    if (until > lost_at()) lost_at_.store(until.time_since_epoch().count());
    arm_lost_timer();
    transition(SessionState::kConnected);
  }
  // Lease loop thread: the keep-alive stream failed, or a renewal is overdue.
  void suspend() { transition(SessionState::kSuspended); }
  // Any thread. kLost at once; subscribers are told on this thread, or
  // (`here` false: a request's caller) on the lease loop's.
  void lose(std::string reason, bool here = true) {
    {
      MutexLock lk(mu_);
      if (lost_reason_.empty()) lost_reason_ = std::move(reason);
    }
    transition(SessionState::kLost, here);
  }
  // Lease loop thread: the timer that tells kLost from the client's own clock.
  void arm_lost_timer();

  void forget_wait(const std::shared_ptr<WaitRec>& w) DLOCK_EXCLUDES(mu_) {
    MutexLock lk(mu_);
    waits_.erase(w);
  }

 private:
  std::string lost_reason() const DLOCK_EXCLUDES(mu_) {
    MutexLock lk(mu_);
    return lost_reason_.empty() ? std::string() : " (" + lost_reason_ + ")";
  }

  // A request's error, with what it says about the session: a lease the
  // server no longer knows is a lost session.
  Status noted(Status s) {
    if (s.code() == ErrorCode::kSessionLost) lose("the server no longer knows its lease", /*here=*/false);
    return s;
  }

  // The queue's entries from the two ranges at `first` and `first + 1` of a Txn's responses.
  std::vector<Listed> entries_of(const std::string& queue, const pb::TxnResponse& r, int first,
                                 const ListOptions& options) const {
    if (r.responses_size() < first + 2) return {};
    return EntriesOf(layout_, queue, KeysOf(r.responses(first)), RecordsOf(r.responses(first + 1)), options);
  }

  void read_queue(const std::string& q, Clock::time_point deadline, bool sync, bool with_values, TxnDone done) {
    pb::TxnRequest req;
    *req.add_success() = DirOp(layout_.queue_dir(q), /*keys_only=*/!with_values);
    *req.add_success() = DirOp(layout_.record_dir(q), /*keys_only=*/false);
    core_->txn(req, deadline, sync, std::move(done));
  }

  // Appends with the entry key `suffix`: a new key, or (taking != 0) this
  // session's downgrade reservation made at revision `taking`.
  void put_entry(const std::string& q, const std::string& suffix, const EntrySpec& spec, std::int64_t taking,
                 Clock::time_point deadline, bool sync, bool first, std::function<void(Result<Appended>)> done) {
    const std::string key = layout_.entry_key(q, suffix);
    const std::string record = layout_.record_key(q, suffix);
    const std::string fence = layout_.fence_key(spec.attempt_id);
    const bool write = spec.kind == entry_kind::kWrite && taking == 0;
    pb::TxnRequest req;
    if (taking == 0) {
      *req.add_compare() = CreateRevisionIs(key, 0);
      if (write) *req.add_compare() = CreateRevisionIs(layout_.entry_key(q, ReservationSuffix(suffix)), 0);
    } else {
      *req.add_compare() = CreateRevisionIs(key, taking);
      *req.add_compare() = LeaseIs(key, lease_);
      *req.add_compare() = VersionIs(record, 0);
    }
    *req.add_compare() = VersionIs(fence, 0);
    *req.add_success() = PutOp(key, spec.value.value_or(""), lease_);
    *req.add_success() = PutOp(record, EncodeRecord(spec.kind, spec.attempt_id, spec.owner), lease_);
    if (write) *req.add_success() = PutOp(layout_.entry_key(q, ReservationSuffix(suffix)), "", lease_);
    const int ranges = req.success_size();
    *req.add_success() = DirOp(layout_.queue_dir(q), /*keys_only=*/true);
    *req.add_success() = DirOp(layout_.record_dir(q), /*keys_only=*/false);
    *req.add_failure() = RangeOp(record, "", /*keys_only=*/false);
    *req.add_failure() = RangeOp(fence, "", /*keys_only=*/true);
    core_->txn(req, deadline, sync,
               [self = shared_from_this(), q, suffix, spec, taking, deadline, sync, first, ranges,
                done = std::move(done)](Result<pb::TxnResponse> r) mutable {
                 if (!r.ok()) return done(self->noted(r.status()));
                 self->appended(q, suffix, spec, taking, deadline, sync, first, ranges, *r, std::move(done));
               });
  }

  void appended(const std::string& q, const std::string& suffix, const EntrySpec& spec, std::int64_t taking,
                Clock::time_point deadline, bool sync, bool first, int ranges, const pb::TxnResponse& r,
                std::function<void(Result<Appended>)> done) {
    Appended out;
    Entry& e = out.entry;
    e.kind = spec.kind;
    e.attempt_id = spec.attempt_id;
    if (r.succeeded()) {
      const std::int64_t rev = r.header().revision();
      e.id = EntryId(suffix, taking != 0 ? taking : rev);
      e.sequence = taking != 0 ? taking : rev;
      e.token = static_cast<std::uint64_t>(rev);
      out.queue = JustEntries(entries_of(q, r, ranges, {}));
      return done(std::move(out));
    }
    if (r.responses_size() < 2) return done(InternalError("etcd store: malformed reply to an append"));
    if (r.responses(1).response_range().kvs_size() > 0) {
      return done(AbortedError("etcd store: append of attempt " + spec.attempt_id + " came after find_own fenced it"));
    }
    const auto& records = r.responses(0).response_range().kvs();
    if (!records.empty()) {
      auto rec = DecodeRecord(records[0].value());
      if (rec && rec->attempt_id == spec.attempt_id) {
        // This attempt's own entry, from a request whose reply was lost:
        // the record was put with the entry, so it has its revisions.
        e.id = EntryId(suffix, taking != 0 ? taking : records[0].create_revision());
        e.sequence = taking != 0 ? taking : records[0].create_revision();
        e.token = static_cast<std::uint64_t>(records[0].create_revision());  // made with the entry
        return done(std::move(out));
      }
    }
    if (first && taking == 0) {
      // The session already has an entry under its plain key (another
      // thread's, or a downgraded read): this one takes a key of its own.
      return put_entry(q, OtherSuffix(lease_, spec.attempt_id), spec, 0, deadline, sync, false, std::move(done));
    }
    if (taking != 0) {
      return done(FailedPreconditionError("etcd store: the write entry at revision " + std::to_string(taking) +
                                          " of queue " + q + " is gone or already downgraded"));
    }
    done(InternalError("etcd store: entry key " + layout_.entry_key(q, suffix) + " is taken"));
  }

  // A downgrade: the read entry takes over the reservation that the write
  // entry at `spec.sequence` made, so it keeps its place for Go's waiters too.
  void downgrade(const std::string& q, const EntrySpec& spec, Clock::time_point deadline, bool sync,
                 std::function<void(Result<Appended>)> done) {
    read_queue(q, deadline, sync, /*with_values=*/false,
               [self = shared_from_this(), q, spec, deadline, sync,
                done = std::move(done)](Result<pb::TxnResponse> r) mutable {
                 if (!r.ok()) return done(self->noted(r.status()));
                 if (r->responses_size() < 1) return done(InternalError("etcd store: malformed reply to a range"));
                 const std::string dir = self->layout_.queue_dir(q);
                 for (const KeyRead& k : KeysOf(r->responses(0))) {
                   auto suffix = OwnSegment(k.key, dir);
                   if (suffix && IsReservationSuffix(*suffix) && k.create_revision == *spec.sequence &&
                       k.lease == self->lease_) {
                     return self->put_entry(q, std::string(*suffix), spec, *spec.sequence, deadline, sync, false,
                                            std::move(done));
                   }
                 }
                 done(FailedPreconditionError("etcd store: no write entry of session " + self->sid_ +
                                              " with sequence " + std::to_string(*spec.sequence) + " in queue " + q));
               });
  }

  // update()'s Txn; `record` (with its create revision) when the owner changes.
  void put_update(const std::string& q, const ParsedId& id, const EntryUpdate& update,
                  std::optional<std::pair<Record, std::int64_t>> record, Clock::time_point deadline, bool sync,
                  std::function<void(Result<Entry>)> done) {
    const std::string key = layout_.entry_key(q, id.suffix);
    const std::string record_key = layout_.record_key(q, id.suffix);
    pb::TxnRequest req;
    *req.add_compare() = CreateRevisionIs(key, id.create_revision);
    *req.add_compare() = LeaseIs(key, lease_);
    if (update.value) *req.add_success() = PutOp(key, *update.value, lease_);
    if (record) {
      // The record read is still the entry's (its kind and attempt never
      // change; another owner update in between is fine).
      *req.add_compare() = CreateRevisionIs(record_key, record->second);
      *req.add_success() =
          PutOp(record_key, EncodeRecord(record->first.kind, record->first.attempt_id, *update.owner), lease_);
    }
    const int ranges = req.success_size();
    *req.add_success() = RangeOp(key, "", /*keys_only=*/false);
    *req.add_success() = RangeOp(record_key, "", /*keys_only=*/false);
    core_->txn(req, deadline, sync,
               [self = shared_from_this(), q, id, ranges, done = std::move(done)](Result<pb::TxnResponse> r) {
                 if (!r.ok()) return done(self->noted(r.status()));
                 const std::string shown = EntryId(id.suffix, id.create_revision);
                 if (!r->succeeded()) {
                   return done(FailedPreconditionError("etcd store: no entry " + shown + " of session " + self->sid_ +
                                                       " in " + q + " (or its record changed)"));
                 }
                 for (Listed& l : self->entries_of(q, *r, ranges, {.with_owners = true, .with_values = true})) {
                   if (l.entry.id == shown) return done(std::move(l.entry));
                 }
                 done(InternalError("etcd store: an updated entry was not in the Txn's reading"));
               });
  }

  // kConnected <-> kSuspended, or -> kLost / kClosed; never back from those.
  // Returns whether the state changed; the notice is delivered in order.
  bool transition(SessionState to, bool here = true) DLOCK_EXCLUDES(notice_mu_) {
    {
      MutexLock lk(notice_mu_);
      const SessionState prev = state_.load();
      if (prev == to || prev == SessionState::kClosed) return false;
      if (prev == SessionState::kLost && to != SessionState::kClosed) return false;
      state_.store(to);
      notices_.push_back(to);
    }
    auto task = [self = shared_from_this()] { self->deliver_pending(); };
    if (to == SessionState::kClosed) {
      delivery_.run(std::move(task));  // close() returns once it is told (unless inside a subscriber)
    } else if (here || !core_->lease_loop().post([self = shared_from_this(), task] { self->delivery_.post(task); })) {
      delivery_.post(std::move(task));
    }
    return true;
  }

  // Tells every notice queued so far, in order, and does what follows from
  // each. One task may so tell notices queued for later tasks (which then
  // find none): close() returns only once kClosed is told.
  void deliver_pending() DLOCK_EXCLUDES(notice_mu_) {
    for (;;) {
      SessionState n;
      {
        MutexLock lk(notice_mu_);
        if (notices_.empty()) return;
        n = notices_.front();
        notices_.pop_front();
      }
      listeners_.notify(n);
      if (n == SessionState::kLost || n == SessionState::kClosed) ended(n);
    }
  }

  // After the subscribers heard kLost or kClosed: waits end, and the lease
  // goes (at once, rather than when it runs out).
  void ended(SessionState how);

  const std::shared_ptr<Core> core_;
  const Config& cfg_;
  const std::int64_t lease_;
  const std::string sid_;
  const seconds ttl_;
  const Layout layout_;

  std::atomic<SessionState> state_{SessionState::kConnected};
  std::atomic<Clock::duration::rep> lost_at_{0};

  mutable Mutex mu_;
  std::string lost_reason_ DLOCK_GUARDED_BY(mu_);
  std::set<std::shared_ptr<WaitRec>> waits_ DLOCK_GUARDED_BY(mu_);
  bool ended_ DLOCK_GUARDED_BY(mu_) = false;  // ended() ran: no wait is taken any more

  ListenerList<SessionState> listeners_;
  SerialDelivery delivery_;
  Mutex notice_mu_;  // orders state changes with their notices
  std::deque<SessionState> notices_ DLOCK_GUARDED_BY(notice_mu_);

  std::uint64_t lost_timer_ = 0;  // the lease loop thread's
};

// --- The store's two long-lived streams (each on its own loop's thread)
//
// One stream on the current member: opened on demand, left for the next
// member when it ends unavailable (or its owner finds it hung), opened again
// after a growing pause while its owner still wants it, with a fresh auth
// token when the member refused the old one. KeepAlives (on the lease loop)
// and Watches (on the loop) each have one.
template <class Request, class Response>
class MemberStream {
 public:
  // Starts the call on member `m` (one of Core::member's stubs).
  using Prepare = std::function<std::unique_ptr<grpc::ClientAsyncReaderWriter<Request, Response>>(
      const Core::Member& m, grpc::ClientContext*, grpc::CompletionQueue*)>;
  struct Handlers {
    std::function<void()> on_ready;             // (re)opened: writes go out now
    std::function<void(Response&)> on_message;  // every message, in order
    std::function<void()> on_end;               // ended: what was sent on it is lost
    std::function<bool()> wanted;               // whether to open it again
  };

  MemberStream(const std::shared_ptr<Core>& core, Loop& loop, Prepare prepare, Handlers handlers)
      : core_(core),
        loop_(loop.shared_from_this()),
        prepare_(std::move(prepare)),
        handlers_(std::move(handlers)),
        stream_(loop_, {[this] { on_ready(); }, [this](Response& r) { handlers_.on_message(r); },
                        [this](const grpc::Status& s) { on_end(s); }}) {}

  // Opens it unless it is open, opening or about to be opened again.
  void ensure_open() {
    if (!stream_.open_or_opening() && reopen_timer_ == 0) open();
  }
  bool ready() const { return stream_.ready(); }
  void write(Request req) { stream_.write(std::move(req)); }
  // Ends it (on_end follows), to open it again on the same member.
  void cancel() { stream_.cancel(); }
  // The member does not answer in time: the next opening goes to the next one.
  void leave_member() {
    if (auto core = core_.lock()) core->avoid(member_);
    stream_.cancel();
  }
  std::size_t member() const { return member_; }
  bool open_or_opening() const { return stream_.open_or_opening(); }

 private:
  void open() {
    auto core = core_.lock();
    if (!core) return;
    member_ = core->current();
    stream_.open([this, core, m = member_](grpc::ClientContext* ctx,
                                           grpc::CompletionQueue* cq) { return prepare_(core->member(m), ctx, cq); },
                 [core](grpc::ClientContext& ctx) { core->setup_stream(ctx); });
  }

  void on_ready() {
    backoff_.reset();
    handlers_.on_ready();
  }

  void on_end(const grpc::Status& status) {
    if (auto core = core_.lock()) {
      if (IsStaleToken(status)) core->renew_token();
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE) core->avoid(member_);
    }
    handlers_.on_end();
    if (!handlers_.wanted()) return;  // ensure_open() opens it when it is wanted again
    reopen_timer_ = loop_->at(std::chrono::steady_clock::now() + backoff_.next(), [this] {
      reopen_timer_ = 0;
      if (handlers_.wanted()) open();
    });
  }

  std::weak_ptr<Core> core_;
  std::shared_ptr<Loop> loop_;
  Prepare prepare_;
  Handlers handlers_;
  BidiStream<Request, Response> stream_;
  Backoff backoff_;
  std::uint64_t reopen_timer_ = 0;
  std::size_t member_ = 0;  // the stream's
};

// --- The keep-alive stream (lease loop thread)

void WatchesFollow(Core& core, std::size_t left);

class KeepAlives {
 public:
  explicit KeepAlives(const std::shared_ptr<Core>& core)
      : core_(core),
        clock_(core->cfg().clock),
        loop_(core->lease_loop().shared_from_this()),
        stream_(core, core->lease_loop(),
                [](const Core::Member& m, grpc::ClientContext* ctx, grpc::CompletionQueue* cq) {
                  return m.lease->PrepareAsyncLeaseKeepAlive(ctx, cq);
                },
                {[this] { on_ready(); }, [this](pb::LeaseKeepAliveResponse& r) { on_message(r); }, [this] { on_end(); },
                 [this] { return !leases_.empty(); }}) {}

  void add(const std::shared_ptr<SessionCore>& s) {
    Track& t = leases_[s->lease()];
    t.session = s;
    t.every = std::chrono::duration_cast<Clock::duration>(s->ttl()) / 3;
    s->arm_lost_timer();
    stream_.ensure_open();
    schedule(s->lease());
  }

  void remove(std::int64_t lease) {
    auto it = leases_.find(lease);
    if (it == leases_.end()) return;
    loop_->cancel_timer(it->second.timer);
    leases_.erase(it);
  }

 private:
  struct Track {
    std::weak_ptr<SessionCore> session;
    Clock::duration every{};
    std::deque<Clock::time_point> sent;  // requests not answered yet, oldest first
    std::uint64_t timer = 0;
  };

  void schedule(std::int64_t lease) {
    auto it = leases_.find(lease);
    if (it == leases_.end()) return;
    it->second.timer = loop_->at(std::chrono::steady_clock::now() + it->second.every, [this, lease] {
      renew(lease);
      schedule(lease);
    });
  }

  void renew(std::int64_t lease) {
    auto it = leases_.find(lease);
    if (it == leases_.end()) return;
    Track& t = it->second;
    auto s = t.session.lock();
    if (!s) return remove(lease);
    const Clock::time_point now = clock_->now();
    if (!t.sent.empty() && now - t.sent.front() > t.every) {
      // A renewal is overdue: the member hangs or lost its leader. Leave it
      // (a new stream, on the next member when there is one), and so does
      // the watch stream if it is there.
      s->suspend();
      const std::size_t left = stream_.member();
      stream_.leave_member();
      if (auto core = core_.lock()) core->loop().post([core, left] { WatchesFollow(*core, left); });
      return;
    }
    if (!stream_.ready()) return;
    pb::LeaseKeepAliveRequest req;
    req.set_id(lease);
    t.sent.push_back(now);
    stream_.write(std::move(req));
  }

  void on_ready() {
    std::vector<std::int64_t> leases;  // renew() may remove one
    for (const auto& [lease, t] : leases_) leases.push_back(lease);
    for (std::int64_t lease : leases) renew(lease);
  }

  void on_message(pb::LeaseKeepAliveResponse& r) {
    auto it = leases_.find(r.id());
    if (it == leases_.end() || it->second.sent.empty()) return;
    const Clock::time_point sent = it->second.sent.front();
    it->second.sent.pop_front();
    auto s = it->second.session.lock();
    if (!s) return;
    if (r.ttl() <= 0) return s->lose("the server says its lease expired or was revoked");
    s->renewed(sent, seconds(r.ttl()));
  }

  void on_end() {
    for (auto& [lease, t] : leases_) {
      t.sent.clear();  // never answered now
      if (auto s = t.session.lock()) s->suspend();
    }
  }

  std::weak_ptr<Core> core_;
  std::shared_ptr<Clock> clock_;
  std::shared_ptr<Loop> loop_;
  std::map<std::int64_t, Track> leases_;
  MemberStream<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse> stream_;  // last: its handlers use the above
};

// --- The watch stream (loop thread)
//
// A wait watches each of its keys for its deletion from the current
// revision on and, once etcd has confirmed every watch, reads the keys: a
// key there in that reading has its deletion seen. (Reading first and then
// watching from the reading's revision would make the watch start in the
// past whenever anything was written meanwhile, which is usual under
// contention; etcd serves such a watch from a catch-up loop that runs every
// 100 ms.) Anything that may have missed an event (the stream ended, a
// watch was cancelled or compacted) makes it watch and read again: a missed
// delete is never assumed, nor a delete that was not seen.
class Watches {
 public:
  explicit Watches(const std::shared_ptr<Core>& core)
      : core_(core),
        loop_(core->loop().shared_from_this()),
        stream_(core, core->loop(),
                [](const Core::Member& m, grpc::ClientContext* ctx, grpc::CompletionQueue* cq) {
                  return m.watch->PrepareAsyncWatch(ctx, cq);
                },
                {[this] { on_ready(); }, [this](pb::WatchResponse& r) { on_message(r); }, [this] { on_end(); },
                 [this] { return !waits_.empty(); }}) {}

  void start(const std::shared_ptr<WaitRec>& w) {
    if (w->done) return;
    waits_.insert(w);
    arm_probe();
    check(w);
  }

  // The keep-alive left member `m` (hung): so does the watch stream if it is there.
  void follow(std::size_t m) {
    if (stream_.open_or_opening() && stream_.member() == m) stream_.leave_member();
  }

  // The wait is over (cancelled, or its session ended): forget it.
  void stop(const std::shared_ptr<WaitRec>& w) {
    w->done = true;
    unwatch(*w, /*may_linger=*/true);
    loop_->cancel_timer(w->retry_timer);
    waits_.erase(w);
  }

 private:
  void check(const std::shared_ptr<WaitRec>& w) {
    if (w->done) return;
    if (w->head) return w->watch_ids.empty() ? watch_head(w) : void();
    if (w->watch_without_read) return watch(w, WatchFrom::kAfterCreation);
    if (w->watch_ids.empty()) return watch(w, WatchFrom::kNow);  // on_created reads
    if (w->unconfirmed == 0) read(w);
  }

  // Reads the wait's keys, after its watches were confirmed.
  void read(const std::shared_ptr<WaitRec>& w) {
    if (w->done || w->checking) return;  // the reading in flight sees that the watches changed
    auto core = core_.lock();
    if (!core) return;
    w->checking = true;
    pb::TxnRequest req;
    const bool by_key = w->keys.size() <= kMaxKeysPerTxn;
    if (by_key) {
      for (const auto& [key, rev] : w->keys) *req.add_success() = RangeOp(key, "", /*keys_only=*/true);
    } else {
      const std::string dir = Layout(core->cfg().prefix).queue_dir(w->queue);
      *req.add_success() = DirOp(dir, /*keys_only=*/true);
    }
    core->txn(req, kNoDeadline, /*sync=*/false, [this, w, generation = w->watch_generation](Result<pb::TxnResponse> r) {
      w->checking = false;
      if (w->done) return;
      if (!r.ok()) return retry(w);
      if (generation != w->watch_generation || w->watch_ids.empty() || w->unconfirmed > 0) {
        // The watches changed (the stream ended, a retry) while reading:
        // this reading may be older than them.
        return check(w);
      }
      checked(w, *r);
    });
  }

  void checked(const std::shared_ptr<WaitRec>& w, const pb::TxnResponse& r) {
    std::map<std::string, std::int64_t> present;
    for (const auto& resp : r.responses()) {
      for (const auto& kv : resp.response_range().kvs()) present.emplace(kv.key(), kv.create_revision());
    }
    for (const auto& [key, rev] : w->keys) {
      auto it = present.find(key);
      if (it == present.end() || it->second != rev) return finish(w, OkStatus());  // gone already
    }
    w->backoff.reset();  // all there, and watched since before this reading
  }

  enum class WatchFrom {
    kNow,            // the revision after the current one; a reading follows
    kAfterCreation,  // the revision after each key's creation: no reading needed
  };

  // Watches each key for its deletion.
  void watch(const std::shared_ptr<WaitRec>& w, WatchFrom from) {
    if (!stream_.ready()) {
      // on_ready checks again every wait without watches.
      stream_.ensure_open();
      return;
    }
    ++w->watch_generation;
    w->unconfirmed = from == WatchFrom::kNow ? w->keys.size() : 0;
    w->lingers = from == WatchFrom::kAfterCreation;
    bool gone = false;  // an adopted watch saw the entry's deletion already
    for (const auto& [key, rev] : w->keys) {
      if (w->lingers) {
        if (std::optional<std::int64_t> id = adopt(key, rev)) {
          by_id_[*id] = w;
          w->watch_ids.push_back(*id);
          gone = gone || last_deletion(*id) > rev;
          continue;
        }
      }
      const std::int64_t id = next_watch_id_++;
      by_id_[id] = w;
      w->watch_ids.push_back(id);
      pb::WatchRequest req;
      auto* create = req.mutable_create_request();
      create->set_key(key);
      if (from == WatchFrom::kAfterCreation) create->set_start_revision(rev + 1);
      create->add_filters(pb::WatchCreateRequest::NOPUT);
      create->set_watch_id(id);
      stream_.write(std::move(req));
    }
    if (gone) finish(w, OkStatus());
  }

  // A head watch's watches (see WaitRec::head). After the stream ended it
  // starts again from the same revision: etcd's history has what came since.
  void watch_head(const std::shared_ptr<WaitRec>& w) {
    if (!stream_.ready()) {
      stream_.ensure_open();
      return;
    }
    ++w->watch_generation;
    w->unconfirmed = 0;
    auto create_watch = [&](const std::string& key, bool dir) {
      const std::int64_t id = next_watch_id_++;
      by_id_[id] = w;
      w->watch_ids.push_back(id);
      pb::WatchRequest req;
      auto* create = req.mutable_create_request();
      create->set_key(key);
      if (dir) {
        create->set_range_end(PrefixEnd(key));
        create->add_filters(pb::WatchCreateRequest::NODELETE);
      }
      create->set_start_revision(std::max<std::int64_t>(w->head_from, 1));
      create->set_watch_id(id);
      stream_.write(std::move(req));
    };
    if (!w->head_dir.empty()) return create_watch(w->head_dir, true);
    for (const auto& [key, rev] : w->keys) create_watch(key, false);
  }

  // Whether a head watch's events show a change of the head.
  static bool head_changed(const WaitRec& w, const pb::WatchResponse& r) {
    for (const auto& ev : r.events()) {
      if (w.head_dir.empty()) return true;  // the head itself: a new value, or gone
      // A new key of this very queue (not of one nested in it) may be a head.
      if (ev.type() == mvccpb::Event::PUT && OwnSegment(ev.kv().key(), w.head_dir)) return true;
    }
    return false;
  }

  // Ends the wait's watches: cancels them, or (`may_linger`, a wait that
  // is over) leaves a watch from its key's creation to linger.
  void unwatch(WaitRec& w, bool may_linger = false) {
    const bool linger_them = may_linger && w.lingers && !w.head && w.watch_ids.size() == w.keys.size();
    for (std::size_t i = 0; i < w.watch_ids.size(); ++i) {
      const std::int64_t id = w.watch_ids[i];
      by_id_.erase(id);
      if (linger_them) {
        linger(w.keys[i].first, w.keys[i].second + 1, id);
      } else {
        cancel_watch(id);
      }
    }
    w.watch_ids.clear();
    w.unconfirmed = 0;
    w.lingers = false;
  }

  void cancel_watch(std::int64_t id) {
    deletions_.erase(id);
    pb::WatchRequest req;
    req.mutable_cancel_request()->set_watch_id(id);
    stream_.write(std::move(req));
  }

  // A hold's watch of its own entry (from the entry's creation) is not
  // cancelled when the hold goes: it lingers for kLingerFor, and a wait on
  // the same key adopts it. A session's first entry in a queue always has
  // the same key (FirstSuffix of its lease), so a lock taken and released
  // in a loop costs no watch create and no cancel on the stream per cycle
  // (each is a message, its answer, and a wake-up of this thread). Adopting
  // is sound because the watch reports every deletion of its key from
  // `from` on, in order, and a key is created only after its last deletion:
  // a wait on an entry created at revision C (C >= from, as every later
  // incarnation of the key is) counts only deletions after C (on_message).
  // Lingering watches end with the stream; at most kMaxLingering are kept.
  void linger(const std::string& key, std::int64_t from, std::int64_t id) {
    if (!stream_.ready()) return;  // ended with the stream already
    if (auto old = lingering_.find(key); old != lingering_.end()) {
      cancel_watch(old->second.id);
      lingering_ids_.erase(old->second.id);
      lingering_.erase(old);
    }
    if (lingering_.size() >= kMaxLingering) {
      auto oldest = std::min_element(lingering_.begin(), lingering_.end(),
                                     [](const auto& a, const auto& b) { return a.second.until < b.second.until; });
      cancel_watch(oldest->second.id);
      lingering_ids_.erase(oldest->second.id);
      lingering_.erase(oldest);
    }
    lingering_[key] = Lingering{id, from, std::chrono::steady_clock::now() + kLingerFor};
    lingering_ids_[id] = key;
    arm_linger_sweep();
  }

  // The lingering watch of `key`, if it reports every deletion of an entry
  // created at `rev`; it is the caller's now. The deletions it reported
  // while it lingered were nobody's: last_deletion() says whether the
  // entry was among them.
  std::optional<std::int64_t> adopt(const std::string& key, std::int64_t rev) {
    auto it = lingering_.find(key);
    if (it == lingering_.end()) return std::nullopt;
    const Lingering l = it->second;
    lingering_ids_.erase(l.id);
    lingering_.erase(it);
    if (l.from > rev + 1) {  // cannot happen (revisions grow); never adopt a watch that starts late
      cancel_watch(l.id);
      return std::nullopt;
    }
    return l.id;
  }

  void drop_lingering() {
    for (const auto& [key, l] : lingering_) cancel_watch(l.id);
    lingering_.clear();
    lingering_ids_.clear();
  }

  // A timer at the earliest end of a lingering watch (each ends at most a
  // timer's lateness after kLingerFor).
  void arm_linger_sweep() {
    if (linger_timer_ != 0 || lingering_.empty()) return;
    auto earliest = std::min_element(lingering_.begin(), lingering_.end(),
                                     [](const auto& a, const auto& b) { return a.second.until < b.second.until; });
    linger_timer_ = loop_->at(earliest->second.until, [this] {
      linger_timer_ = 0;
      const auto now = std::chrono::steady_clock::now();
      for (auto it = lingering_.begin(); it != lingering_.end();) {
        if (it->second.until > now) {
          ++it;
          continue;
        }
        cancel_watch(it->second.id);
        lingering_ids_.erase(it->second.id);
        it = lingering_.erase(it);
      }
      arm_linger_sweep();
    });
  }

  void retry(const std::shared_ptr<WaitRec>& w) {
    unwatch(*w);
    w->watch_without_read = false;  // e.g. its start was compacted: read first
    loop_->cancel_timer(w->retry_timer);
    w->retry_timer = loop_->at(std::chrono::steady_clock::now() + w->backoff.next(), [this, w] {
      w->retry_timer = 0;
      check(w);
    });
  }

  void finish(const std::shared_ptr<WaitRec>& w, Status s) {
    stop(w);
    if (auto session = w->session.lock()) session->forget_wait(w);
    w->outcome->complete(std::move(s));
  }

  // While there are waits, the stream checks that its member answers: a
  // frozen member keeps its connection open and answers nothing, and the
  // keep-alive stream, which would notice, may be on another member (or
  // there may be no session renewing). Every kWatchProbeEvery a progress
  // request (etcd answers it at once, on the stream); one still unanswered
  // at the next turn leaves the member.
  void arm_probe() {
    if (probe_timer_ != 0) return;
    probe_timer_ = loop_->at(std::chrono::steady_clock::now() + kWatchProbeEvery, [this] {
      probe_timer_ = 0;
      probe();
    });
  }

  void probe() {
    if (waits_.empty()) return;  // start() arms it again
    if (!stream_.ready()) {
      probe_unanswered_ = false;
    } else if (probe_unanswered_) {
      probe_unanswered_ = false;
      stream_.leave_member();
    } else {
      pb::WatchRequest req;
      req.mutable_progress_request();
      stream_.write(std::move(req));
      probe_unanswered_ = true;
    }
    arm_probe();
  }

  void on_ready() {
    std::vector<std::shared_ptr<WaitRec>> all(waits_.begin(), waits_.end());
    for (const auto& w : all) {
      if (w->watch_ids.empty()) check(w);
    }
  }

  void on_message(pb::WatchResponse& r) {
    probe_unanswered_ = false;  // the member answers
    if (by_id_.contains(r.watch_id()) || lingering_ids_.contains(r.watch_id())) {
      // Not for a watch cancelled already: its id would stay here for good.
      for (const auto& ev : r.events()) {
        if (ev.type() != mvccpb::Event::DELETE) continue;
        std::int64_t& last = deletions_[r.watch_id()];
        last = std::max(last, ev.kv().mod_revision());
      }
    }
    if (r.canceled() && IsStaleToken(grpc::Status(grpc::StatusCode::UNKNOWN, r.cancel_reason()))) {
      // The stream's token (sent when it opened) expired: a new token and a
      // new stream, on which every wait reads again.
      if (auto core = core_.lock()) core->renew_token();
      return stream_.cancel();
    }
    auto it = by_id_.find(r.watch_id());
    if (it == by_id_.end()) {
      if (auto l = lingering_ids_.find(r.watch_id()); l != lingering_ids_.end()) {
        // A lingering watch: its deletions are noted above, for the wait
        // that adopts it. Cancelled (compacted): it goes, and is cancelled
        // still (etcd keeps a compacted watcher until then).
        if (r.canceled()) {
          const std::int64_t id = l->first;
          lingering_.erase(l->second);
          lingering_ids_.erase(l);
          cancel_watch(id);
        }
        return;
      }
      // A create refused (etcd answers it with watch_id -1, not the id we
      // chose): we cannot tell whose, so every wait watches and reads again,
      // those whose watches were confirmed and those that adopted a
      // lingering watch (which may be the refused one) too, and no lingering
      // watch is adopted any more.
      if (r.canceled() && r.watch_id() < 0) {
        drop_lingering();
        std::vector<std::shared_ptr<WaitRec>> all(waits_.begin(), waits_.end());
        for (const auto& w : all) retry(w);
      }
      return;
    }
    std::shared_ptr<WaitRec> w = it->second;
    if (w->head) {
      // Cancelled: compacted past its start (or refused): the caller reads again.
      if (head_changed(*w, r) || r.canceled()) finish(w, OkStatus());
      return;
    }
    for (const auto& ev : r.events()) {
      if (ev.type() == mvccpb::Event::DELETE && deletes_waited_for_entry(*w, ev.kv())) return finish(w, OkStatus());
    }
    if (r.canceled()) return retry(w);  // compacted, or refused: read again
    // The last of the wait's watches is in place: what the reading finds
    // there, they watch.
    if (r.created() && w->unconfirmed > 0 && --w->unconfirmed == 0) read(w);
  }

  // The revision of the last deletion a watch reported (0: none), whoever
  // had it then.
  std::int64_t last_deletion(std::int64_t id) const {
    auto it = deletions_.find(id);
    return it == deletions_.end() ? 0 : it->second;
  }

  // Whether a deletion of one of the wait's keys (an event of its watches)
  // removed the entry it waits for: the key's incarnation created at the
  // wait's revision, or one before it (the entry was gone already).
  // Deletions of earlier incarnations, older than that revision, reach an
  // adopted lingering watch: they are not this entry's.
  static bool deletes_waited_for_entry(const WaitRec& w, const mvccpb::KeyValue& deleted) {
    for (const auto& [key, rev] : w.keys) {
      if (key == deleted.key()) return deleted.mod_revision() > rev;
    }
    return true;  // not a key of ours: cannot be, and a wake-up too many is safe
  }

  void on_end() {
    probe_unanswered_ = false;
    lingering_.clear();  // the stream's watches are gone with it
    lingering_ids_.clear();
    deletions_.clear();
    by_id_.clear();
    for (const auto& w : waits_) {
      w->watch_ids.clear();
      w->unconfirmed = 0;
    }
  }

  std::weak_ptr<Core> core_;
  std::shared_ptr<Loop> loop_;
  std::set<std::shared_ptr<WaitRec>> waits_;
  std::map<std::int64_t, std::shared_ptr<WaitRec>> by_id_;
  struct Lingering {
    std::int64_t id;    // the watch's
    std::int64_t from;  // its start revision
    std::chrono::steady_clock::time_point until;
  };
  std::map<std::string, Lingering> lingering_;         // by key
  std::map<std::int64_t, std::string> lingering_ids_;  // watch id -> key
  std::uint64_t linger_timer_ = 0;
  // Per watch of the stream, the revision of the last deletion it reported:
  // what a lingering watch saw before a wait adopted it.
  std::map<std::int64_t, std::int64_t> deletions_;
  std::int64_t next_watch_id_ = 1;
  std::uint64_t probe_timer_ = 0;
  bool probe_unanswered_ = false;  // a progress request went out, and nothing came back since
  MemberStream<pb::WatchRequest, pb::WatchResponse> stream_;  // last: its handlers use the above
};

void WatchesFollow(Core& core, std::size_t left) { core.watches().follow(left); }

Core::~Core() {
  // Their callbacks may still be in flight: each loop keeps its own until it has drained.
  lease_loop_->keep_until_drained(keep_alives_);
  loop_->keep_until_drained(watches_);
  lease_loop_->shut_down();
  loop_->shut_down();
}

void Core::start() {
  keep_alives_ = std::make_shared<KeepAlives>(shared_from_this());
  watches_ = std::make_shared<Watches>(shared_from_this());
}

void SessionCore::start() {
  core_->lease_loop().post([self = shared_from_this()] { self->core_->keep_alives().add(self); });
}

void SessionCore::arm_lost_timer() {
  core_->lease_loop().cancel_timer(lost_timer_);
  lost_timer_ = core_->lease_loop().at(RealTimeAt(*cfg_.clock, lost_at()), [weak = weak_from_this()] {
    auto self = weak.lock();
    if (!self) return;
    self->lost_timer_ = 0;
    if (self->cfg_.clock->now() >= self->lost_at()) {
      self->lose("no renewal of its lease was answered in time");
    } else {
      self->arm_lost_timer();
    }
  });
}

std::shared_ptr<void> SessionCore::wait(std::string_view queue, std::span<const std::string> ids,
                                        std::function<void(Status)> done) {
  auto settled = [&done](Status s) {
    done(std::move(s));
    return std::make_shared<int>(0);  // nothing left to cancel
  };
  if (auto s = ValidateLockName(queue); !s.ok()) return settled(s);
  if (ids.empty()) return settled(InvalidArgumentError("nothing to wait for"));
  auto w = std::make_shared<WaitRec>();
  w->session = weak_from_this();
  w->queue = std::string(queue);
  w->watch_without_read = true;
  for (const std::string& id : ids) {
    auto parsed = ParseEntryId(id);
    if (!parsed.ok()) return settled(parsed.status());
    w->keys.emplace_back(layout_.entry_key(queue, parsed->suffix), parsed->create_revision);
    const std::string_view suffix = parsed->suffix;
    const bool own =
        suffix == sid_ || (suffix.starts_with(sid_) && suffix.size() > sid_.size() && suffix[sid_.size()] == '.');
    w->watch_without_read = w->watch_without_read && own;
  }
  return start_wait(std::move(w), std::move(done));
}

// Registers `w` with the session (which ends it with its end) and the watch
// stream; returns the handle that cancels it.
std::shared_ptr<void> SessionCore::start_wait(std::shared_ptr<WaitRec> w, std::function<void(Status)> done) {
  w->outcome = std::make_shared<OneOutcome>(std::move(done));
  bool ended = false;
  {
    MutexLock lk(mu_);
    ended = ended_;  // else ended() will find it
    if (!ended) waits_.insert(w);
  }
  if (ended) {
    w->outcome->complete(usable(false));
    return std::make_shared<int>(0);
  }
  const bool posted = core_->loop().post([w, core = core_] { core->watches().start(w); });
  if (!posted) {
    forget_wait(w);
    w->outcome->complete(UnavailableError("etcd store: the store is closing"));
    return std::make_shared<int>(0);
  }
  // The handle: cancels (kCancelled unless an outcome came first) and lets
  // the loop forget the wait.
  return std::shared_ptr<void>(nullptr, [w, weak = weak_from_this(), core = core_](void*) {
    w->outcome->cancel();
    if (auto self = weak.lock()) self->forget_wait(w);
    core->loop().post([w, core] { core->watches().stop(w); });
  });
}

std::shared_ptr<void> SessionCore::watch_head(std::string_view queue, const Head& seen,
                                              std::function<void(Status)> done) {
  if (auto s = ValidateLockName(queue); !s.ok()) {
    done(s);
    return nullptr;
  }
  auto w = std::make_shared<WaitRec>();
  w->session = weak_from_this();
  w->queue = std::string(queue);
  w->head = true;
  w->head_from = seen.position + 1;
  if (seen.entry) {
    auto parsed = ParseEntryId(seen.entry->id);
    if (!parsed.ok()) {
      done(parsed.status());
      return nullptr;
    }
    w->keys.emplace_back(layout_.entry_key(queue, parsed->suffix), parsed->create_revision);
    // A downgrade puts its read entry in the write entry's place, first by
    // id (`<suffix>.d@rev` < `<suffix>@rev`): a new head, on another key.
    if (!IsReservationSuffix(parsed->suffix)) {
      w->keys.emplace_back(layout_.entry_key(queue, ReservationSuffix(parsed->suffix)), parsed->create_revision);
    }
  } else {
    w->head_dir = layout_.queue_dir(queue);
  }
  return start_wait(std::move(w), std::move(done));
}

void SessionCore::ended(SessionState how) {
  std::set<std::shared_ptr<WaitRec>> waits;
  bool revoke = false;
  {
    MutexLock lk(mu_);
    waits.swap(waits_);
    revoke = !ended_;
    ended_ = true;
  }
  const Status lost =
      SessionLostError("etcd session " + sid_ + (how == SessionState::kClosed ? " was closed" : " is lost") +
                       (how == SessionState::kLost ? lost_reason() : std::string()));
  for (const auto& w : waits) {
    w->outcome->complete(lost);
    core_->loop().post([w, core = core_] { core->watches().stop(w); });
  }
  core_->lease_loop().post([core = core_, lease = lease_] { core->keep_alives().remove(lease); });
  // The lease goes now: its entries with it. From a store thread (a kLost
  // from a timer, a close inside a subscriber) without waiting.
  if (revoke) core_->revoke(lease_, /*sync=*/!core_->on_store_thread());
}

void SessionCore::close() noexcept {
  try {
    transition(SessionState::kClosed);
  } catch (...) {
    // Out of memory: closed all the same, untold; the lease runs out.
    state_.store(SessionState::kClosed);
  }
}

class EtcdSession final : public Session {
 public:
  explicit EtcdSession(std::shared_ptr<SessionCore> core) : core_(std::move(core)) {}
  ~EtcdSession() override { core_->close(); }

  std::string id() const override { return core_->id(); }
  SessionState state() const noexcept override { return core_->state(); }
  std::shared_ptr<void> subscribe(std::function<void(SessionState)> fn) override {
    return core_->subscribe(std::move(fn));
  }

  Result<Appended> append(std::string_view queue, const EntrySpec& spec, Clock::time_point deadline) override {
    return on_this_thread<Appended>([&](auto done) { core_->append(queue, spec, deadline, true, std::move(done)); });
  }
  Result<std::vector<Entry>> list(std::string_view queue, const ListOptions& options,
                                  Clock::time_point deadline) override {
    return on_this_thread<std::vector<Entry>>(
        [&](auto done) { core_->list(queue, options, deadline, true, std::move(done)); });
  }
  Status remove(std::string_view queue, std::string_view id, Clock::time_point deadline) override {
    std::optional<Status> out;
    core_->remove(queue, id, deadline, true, [&](Status s) { out = std::move(s); });
    return out ? *out : InternalError("etcd store: remove had no outcome");
  }
  Result<std::optional<Entry>> find_own(std::string_view queue, std::string_view attempt_id,
                                        Clock::time_point deadline) override {
    return on_this_thread<std::optional<Entry>>(
        [&](auto done) { core_->find_own(queue, attempt_id, deadline, true, std::move(done)); });
  }
  Status wait_any_gone(std::string_view queue, std::span<const std::string> ids, Clock::time_point deadline,
                       std::stop_token stop) override {
    // On a store thread (a subscriber), the wait would block the thread
    // that reads and watches for it, or the one that renews the lease: read
    // once instead.
    if (core_->on_store_thread()) return any_gone_now(queue, ids, deadline);
    return AwaitAsyncWait(*core_->clock(), queue, deadline, std::move(stop),
                          [&](std::function<void(Status)> done) { return core_->wait(queue, ids, std::move(done)); });
  }

  void async_append(std::string_view queue, const EntrySpec& spec, Clock::time_point deadline,
                    std::function<void(Result<Appended>)> done) override {
    core_->append(queue, spec, deadline, false, std::move(done));
  }
  void async_list(std::string_view queue, const ListOptions& options, Clock::time_point deadline,
                  std::function<void(Result<std::vector<Entry>>)> done) override {
    core_->list(queue, options, deadline, false, std::move(done));
  }
  void async_remove(std::string_view queue, std::string_view id, Clock::time_point deadline,
                    std::function<void(Status)> done) override {
    core_->remove(queue, id, deadline, false, std::move(done));
  }
  void async_find_own(std::string_view queue, std::string_view attempt_id, Clock::time_point deadline,
                      std::function<void(Result<std::optional<Entry>>)> done) override {
    core_->find_own(queue, attempt_id, deadline, false, std::move(done));
  }
  std::shared_ptr<void> async_wait_any_gone(std::string_view queue, std::span<const std::string> ids,
                                            std::function<void(Status)> done) override {
    return core_->wait(queue, ids, std::move(done));
  }

  bool keeps_values() const noexcept override { return true; }
  Result<Entry> update_entry(std::string_view queue, std::string_view id, const EntryUpdate& update,
                             Clock::time_point deadline) override {
    return on_this_thread<Entry>([&](auto done) { core_->update(queue, id, update, deadline, true, std::move(done)); });
  }
  void async_update_entry(std::string_view queue, std::string_view id, const EntryUpdate& update,
                          Clock::time_point deadline, std::function<void(Result<Entry>)> done) override {
    core_->update(queue, id, update, deadline, false, std::move(done));
  }
  void async_read_head(std::string_view queue, const ListOptions& options, Clock::time_point deadline,
                       std::function<void(Result<Head>)> done) override {
    core_->read_head(queue, options, deadline, false, std::move(done));
  }
  std::shared_ptr<void> async_watch_head(std::string_view queue, const Head& seen,
                                         std::function<void(Status)> done) override {
    return core_->watch_head(queue, seen, std::move(done));
  }

  void close() noexcept override { core_->close(); }

 private:
  // wait_any_gone on a store thread: OK if an entry of `ids` is gone now;
  // waiting there for one that is still there is refused.
  Status any_gone_now(std::string_view queue, std::span<const std::string> ids, Clock::time_point deadline) {
    if (ids.empty()) return InvalidArgumentError("nothing to wait for");
    auto entries = list(queue, ListOptions{}, deadline);
    if (!entries.ok()) return entries.status();
    for (const std::string& id : ids) {
      if (std::none_of(entries->begin(), entries->end(), [&](const Entry& e) { return e.id == id; })) return OkStatus();
    }
    return FailedPreconditionError(
        "etcd store: wait_any_gone called on the store's own thread (a session subscriber) would block the thread "
        "that watches for it; use async_wait_any_gone there");
  }

  // A request made on this thread: its `done` has run when it returns.
  template <class T, class Start>
  static Result<T> on_this_thread(Start start) {
    std::optional<Result<T>> out;
    start([&](Result<T> r) { out.emplace(std::move(r)); });
    if (!out) return InternalError("etcd store: a request had no outcome");
    return std::move(*out);
  }

  std::shared_ptr<SessionCore> core_;
};

// --- The store

class EtcdStore final : public Store {
 public:
  explicit EtcdStore(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  std::string url() const override { return core_->cfg().url; }

  Result<std::shared_ptr<Session>> open_session(Clock::time_point deadline) override {
    const Config& cfg = core_->cfg();
    pb::LeaseGrantRequest req;
    req.set_ttl(cfg.ttl.count());
    pb::LeaseGrantResponse resp;
    Clock::time_point sent;
    grpc::Status s = core_->call_sync(deadline, [&](grpc::ClientContext& ctx, const Core::Member& m) {
      sent = cfg.clock->now();
      return m.lease->LeaseGrant(&ctx, req, &resp);
    });
    if (!s.ok()) return FromGrpc(s, "granting a session lease");
    if (!resp.error().empty()) return UnavailableError("etcd store: granting a session lease: " + resp.error());
    if (resp.id() <= 0 || resp.ttl() <= 0) return InternalError("etcd store: the server granted no usable lease");
    auto session = std::make_shared<SessionCore>(core_, resp.id(), seconds(resp.ttl()), sent);
    session->start();
    return std::shared_ptr<Session>(std::make_shared<EtcdSession>(std::move(session)));
  }

 private:
  std::shared_ptr<Core> core_;
};

std::shared_ptr<grpc::ChannelCredentials> Credentials(const Config& cfg) {
  if (!cfg.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = cfg.ca_pem;
  ssl.pem_private_key = cfg.key_pem;
  ssl.pem_cert_chain = cfg.cert_pem;
  return grpc::SslCredentials(ssl);
}

}  // namespace

Result<std::shared_ptr<Store>> Open(const ParsedUrl& url, const StoreOptions& options) {
  auto cfg = ParseConfig(url, options);
  if (!cfg.ok()) return cfg.status();
  grpc::ChannelArguments args;
  // Reconnect soon after a member comes back (gRPC's default backs off to
  // 120 s). Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC also takes it as the
  // connect timeout (20 s by default), and a short one never connects on a
  // loaded machine (seen at 100 ms under TSan: every member "failing").
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2'000);
  // No limit on a reply's size, as Go's clientv3 (math.MaxInt32): a queue's
  // reading with values (up to 64 KiB each), or a watch's catch-up of many
  // of them, is larger than gRPC's default 4 MiB, and a reply refused for
  // its size would be refused again on every retry.
  args.SetMaxReceiveMessageSize(-1);
  // No transport keep-alive pings: a member that stops answering is noticed
  // by its overdue renewals (and left), and etcd answers pings on a
  // connection without calls with GOAWAY (its enforcement policy).
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (const std::string& target : cfg->targets) {
    channels.push_back(grpc::CreateCustomChannel(target, Credentials(*cfg), args));
  }
  // The lease channels: the same, each on a connection of its own (gRPC
  // otherwise shares one connection among channels to one target with the
  // same arguments). They connect on their first call.
  grpc::ChannelArguments lease_args = args;
  lease_args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::vector<std::shared_ptr<grpc::Channel>> lease_channels;
  for (const std::string& target : cfg->targets) {
    lease_channels.push_back(grpc::CreateCustomChannel(target, Credentials(*cfg), lease_args));
  }
  // The first member that connects within the connect timeout.
  const auto connect_deadline = std::chrono::steady_clock::now() + cfg->connect_timeout;
  std::optional<std::size_t> first;
  for (auto& c : channels) c->GetState(/*try_to_connect=*/true);
  while (!first) {
    for (std::size_t i = 0; i < channels.size() && !first; ++i) {
      if (channels[i]->GetState(true) == GRPC_CHANNEL_READY) first = i;
    }
    if (first || std::chrono::steady_clock::now() >= connect_deadline) break;
    // Woken by the first change of any of them, or after a short while.
    channels[0]->WaitForStateChange(channels[0]->GetState(false), std::chrono::system_clock::now() + milliseconds(20));
  }
  if (!first) {
    static constexpr const char* kStates[] = {"idle", "connecting", "ready", "failing", "shut down"};
    std::string states;
    for (std::size_t i = 0; i < channels.size(); ++i) {
      const int st = channels[i]->GetState(false);
      states += (i ? ", " : "") + cfg->targets[i] + " " + (st >= 0 && st < 5 ? kStates[st] : "?");
    }
    return UnavailableError("etcd store: cannot connect to " + cfg->url + " within " +
                            std::to_string(cfg->connect_timeout.count()) + " ms (" + states + ")");
  }
  std::shared_ptr<Core> core;
  try {
    core = std::make_shared<Core>(std::move(*cfg), channels, lease_channels, *first);
  } catch (const std::system_error& e) {  // a thread could not be had: say so, rather than throw
    return UnavailableError(std::string("etcd store: cannot start its threads: ") + e.what());
  }
  core->start();
  if (auto s = core->authenticate(); !s.ok()) return s;
  return std::shared_ptr<Store>(std::make_shared<EtcdStore>(std::move(core)));
}

}  // namespace dlock::internal::etcd

namespace dlock::internal {
Result<std::shared_ptr<Store>> OpenEtcdStore(const ParsedUrl& url, const StoreOptions& options) {
  return etcd::Open(url, options);
}
}  // namespace dlock::internal
