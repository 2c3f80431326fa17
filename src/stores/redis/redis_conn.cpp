#include "stores/redis/redis_conn.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <hiredis/hiredis.h>

namespace dlock::internal::redis {
namespace {

int PollMs(IoClock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - IoClock::now()).count();
  if (left <= 0) return 0;
  return static_cast<int>(std::min<long long>(left, 60'000));
}

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// hiredis's own reply functions, read off a reader it builds (the table is
// static inside hiredis, so the pointer outlives the reader).
const redisReplyObjectFunctions* HiredisReplyFunctions() noexcept {
  static const redisReplyObjectFunctions* const functions = [] {
    redisReader* r = redisReaderCreate();
    const redisReplyObjectFunctions* fn = r ? r->fn : nullptr;
    if (r) redisReaderFree(r);
    return fn;
  }();
  return functions;
}

void* CreateBoundedArray(const redisReadTask* task, int elements) {
  if (elements > kMaxReplyElements) return nullptr;  // the reader fails: "Out of memory"
  return HiredisReplyFunctions()->createArray(task, elements);
}

// Why the reader failed, in words for an error message.
std::string ReaderError(const redisReader* reader) {
  std::string why = reader->errstr;
  if (why == "Out of memory") {
    why = "a reply too large (an array of more than " + std::to_string(kMaxReplyElements) +
          " elements), or out of memory";
  }
  return why;
}

}  // namespace

void BoundArrayReplies(redisReader* reader) noexcept {
  const redisReplyObjectFunctions* defaults = HiredisReplyFunctions();
  if (reader == nullptr || defaults == nullptr) return;
  // Never written after it is made; hiredis wants a pointer to non-const.
  static redisReplyObjectFunctions bounded = [defaults] {
    redisReplyObjectFunctions table = *defaults;
    table.createArray = &CreateBoundedArray;
    return table;
  }();
  reader->fn = &bounded;
}

// --- Reply

Reply::Reply(redisReply* r) noexcept : r_(r) {}
void Reply::Free::operator()(redisReply* r) const noexcept { freeReplyObject(r); }

bool Reply::is_error() const noexcept { return r_ && r_->type == REDIS_REPLY_ERROR; }
bool Reply::is_nil() const noexcept { return !r_ || r_->type == REDIS_REPLY_NIL; }
bool Reply::is_array() const noexcept { return r_ && r_->type == REDIS_REPLY_ARRAY; }
bool Reply::is_integer() const noexcept { return r_ && r_->type == REDIS_REPLY_INTEGER; }
bool Reply::is_string() const noexcept {
  return r_ && (r_->type == REDIS_REPLY_STRING || r_->type == REDIS_REPLY_STATUS);
}
std::string_view Reply::str() const noexcept { return ElementStr(r_.get()); }
long long Reply::integer() const noexcept { return ElementInt(r_.get()); }
std::size_t Reply::size() const noexcept { return is_array() ? r_->elements : 0; }
const redisReply* Reply::element(std::size_t i) const noexcept { return i < size() ? r_->element[i] : nullptr; }

std::string_view ElementStr(const redisReply* r) noexcept {
  if (!r) return {};
  if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_ERROR) {
    return std::string_view(r->str, r->len);
  }
  return {};
}
bool ElementIsNil(const redisReply* r) noexcept { return !r || r->type == REDIS_REPLY_NIL; }
long long ElementInt(const redisReply* r) noexcept { return r && r->type == REDIS_REPLY_INTEGER ? r->integer : 0; }

Status ErrorReplyStatus(std::string_view err, std::string_view what) {
  std::string m = std::string(what) + ": " + std::string(err);
  if (StartsWith(err, "NOAUTH") || StartsWith(err, "WRONGPASS") || StartsWith(err, "ERR invalid password") ||
      StartsWith(err, "ERR AUTH") || StartsWith(err, "ERR Client sent AUTH")) {
    return UnauthenticatedError(std::move(m));
  }
  if (StartsWith(err, "NOPERM")) return PermissionDeniedError(std::move(m));
  if (StartsWith(err, "LOADING") || StartsWith(err, "BUSY") || StartsWith(err, "MASTERDOWN") ||
      StartsWith(err, "TRYAGAIN") || StartsWith(err, "CLUSTERDOWN") || StartsWith(err, "READONLY") ||
      StartsWith(err, "OOM") || StartsWith(err, "NOREPLICAS")) {
    return UnavailableError(std::move(m));
  }
  if (StartsWith(err, "MOVED") || StartsWith(err, "ASK")) {
    return FailedPreconditionError(std::move(m) +
                                   " (this is a Redis Cluster node; dlock's redis:// store talks to one primary and "
                                   "does not follow redirections)");
  }
  if (StartsWith(err, "ERR unknown command") || StartsWith(err, "ERR unknown subcommand")) {
    return FailedPreconditionError(std::move(m));
  }
  if (StartsWith(err, "ERR DB index") || StartsWith(err, "ERR invalid DB index")) {
    return InvalidArgumentError(std::move(m));
  }
  return InternalError(std::move(m));
}

std::optional<EventSignal> MaybeSignal() {
  auto s = EventSignal::create();
  if (!s.ok()) return std::nullopt;
  return std::move(*s);
}

// --- Conn

Result<std::unique_ptr<Conn>> Conn::open(const Endpoint& ep, IoClock::time_point deadline, int interrupt_fd) {
  std::string where =
      (ep.host.find(':') != std::string::npos ? "[" + ep.host + "]" : ep.host) + ":" + std::to_string(ep.port);
  if (IoClock::now() >= deadline) return UnavailableError("connecting to redis at " + where + ": deadline passed");
  // Non-blocking connect, so that the wait for it obeys both the deadline and
  // the interrupt fd. (Name resolution itself is getaddrinfo, not bounded.)
  redisContext* c = redisConnectNonBlock(ep.host.c_str(), ep.port);
  if (c == nullptr) return UnavailableError("connecting to redis at " + where + ": out of memory");
  if (c->err) {
    std::string err = c->errstr;
    redisFree(c);
    return UnavailableError("cannot connect to redis at " + where + ": " + err);
  }
  BoundArrayReplies(c->reader);
  std::unique_ptr<Conn> conn(new Conn(c, where, interrupt_fd));
  auto ready = conn->await(POLLOUT, deadline);
  if (!ready.ok()) return ready.status();
  if (*ready == 0) return UnavailableError("cannot connect to redis at " + where + ": connect timed out");
  int so_error = 0;
  socklen_t len = sizeof so_error;
  if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &so_error, &len) < 0) so_error = errno;
  if (so_error != 0) {
    return UnavailableError("cannot connect to redis at " + where + ": " + std::strerror(so_error));
  }
  std::vector<Command> setup;
  if (ep.password) {
    if (ep.user) {
      setup.push_back({"AUTH", *ep.user, *ep.password});
    } else {
      setup.push_back({"AUTH", *ep.password});
    }
  }
  if (ep.db != 0) setup.push_back({"SELECT", std::to_string(ep.db)});
  if (!setup.empty()) {
    auto replies = conn->pipeline(setup, deadline);
    if (!replies.ok()) {
      if (replies.status().code() == ErrorCode::kCancelled) return replies.status();
      return UnavailableError("redis at " + where + " did not answer: " + replies.status().message());
    }
    for (std::size_t i = 0; i < replies->size(); ++i) {
      const Reply& r = (*replies)[i];
      if (r.is_error()) {
        std::string what = setup[i][0] == "AUTH" ? "authenticating to redis at " + where
                                                 : "selecting database " + std::to_string(ep.db) + " on " + where;
        Status s = ErrorReplyStatus(r.str(), what);
        if (setup[i][0] == "AUTH" && s.code() == ErrorCode::kInternal) s = UnauthenticatedError(s.message());
        return s;
      }
    }
  }
  return conn;
}

Conn::~Conn() {
  if (c_) redisFree(c_);
}

int Conn::fd() const noexcept { return c_ ? c_->fd : -1; }

Status Conn::fail(std::string what) {
  broken_ = true;
  return UnavailableError("redis at " + where_ + ": " + what);
}

Result<int> Conn::await(short events, IoClock::time_point deadline) {
  for (;;) {
    pollfd p[2] = {{c_->fd, events, 0}, {interrupt_fd_, POLLIN, 0}};
    int ms = PollMs(deadline);
    int pr = ::poll(p, interrupt_fd_ >= 0 ? 2 : 1, ms);
    if (pr < 0) {
      if (errno == EINTR) continue;
      return fail(std::string("poll: ") + std::strerror(errno));
    }
    if (interrupt_fd_ >= 0 && (p[1].revents & POLLIN)) {
      broken_ = true;
      return CancelledError("redis at " + where_ + ": interrupted");
    }
    if (pr == 0) {
      if (IoClock::now() >= deadline) return 0;
      continue;
    }
    return 1;  // ready, or an error the next read/write reports
  }
}

Status Conn::write(const std::vector<Command>& cmds, IoClock::time_point deadline) {
  if (broken_) return UnavailableError("redis at " + where_ + ": connection is broken");
  std::string out;
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  for (const auto& cmd : cmds) {
    argv.clear();
    lens.clear();
    for (const auto& a : cmd) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    char* buf = nullptr;
    int n = redisFormatCommandArgv(&buf, static_cast<int>(argv.size()), argv.data(), lens.data());
    if (n < 0 || buf == nullptr) return fail("out of memory formatting a command");
    out.append(buf, static_cast<std::size_t>(n));
    redisFreeCommand(buf);
  }
  std::size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::send(c_->fd, out.data() + done, out.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      auto ready = await(POLLOUT, deadline);
      if (!ready.ok()) return ready.status();
      if (*ready == 0) {
        timed_out_ = true;
        return fail("timed out writing");
      }
      continue;
    }
    return fail(std::string("write failed: ") + (n < 0 ? std::strerror(errno) : "closed"));
  }
  return OkStatus();
}

Result<std::optional<Reply>> Conn::buffered() {
  if (broken_) return UnavailableError("redis at " + where_ + ": connection is broken");
  void* reply = nullptr;
  if (redisReaderGetReply(c_->reader, &reply) != REDIS_OK) {
    return fail("protocol error in a reply: " + ReaderError(c_->reader));
  }
  if (reply == nullptr) return std::optional<Reply>();
  return std::optional<Reply>(Reply(static_cast<redisReply*>(reply)));
}

Result<std::optional<Reply>> Conn::read_one(IoClock::time_point deadline) {
  for (;;) {
    auto have = buffered();
    if (!have.ok() || have->has_value()) return have;
    char buf[16 * 1024];
    ssize_t n = ::read(c_->fd, buf, sizeof buf);
    if (n == 0) return fail("server closed the connection");
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return fail(std::string("read failed: ") + std::strerror(errno));
      auto ready = await(POLLIN, deadline);
      if (!ready.ok()) return ready.status();
      if (*ready == 0) return std::optional<Reply>();
      continue;
    }
    if (redisReaderFeed(c_->reader, buf, static_cast<std::size_t>(n)) != REDIS_OK) {
      return fail("protocol error: " + ReaderError(c_->reader));
    }
  }
}

Result<std::vector<Reply>> Conn::pipeline(const std::vector<Command>& cmds, IoClock::time_point deadline) {
  if (auto s = write(cmds, deadline); !s.ok()) return s;
  std::vector<Reply> out;
  out.reserve(cmds.size());
  while (out.size() < cmds.size()) {
    auto r = read_one(deadline);
    if (!r.ok()) return r.status();
    if (!r->has_value()) {
      timed_out_ = true;
      return fail("timed out waiting for a reply");
    }
    out.push_back(std::move(**r));
  }
  return out;
}

Result<Reply> Conn::run(const Command& cmd, IoClock::time_point deadline) {
  auto r = pipeline({cmd}, deadline);
  if (!r.ok()) return r.status();
  return std::move((*r)[0]);
}

}  // namespace dlock::internal::redis
