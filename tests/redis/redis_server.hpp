// Test fixture: a private redis-server process (Debian's), on 127.0.0.1 and a
// free port, with a scratch directory and no persistence unless the options
// ask for it (an explicit SAVE still writes dump.rdb there). The tests start,
// stop, freeze (SIGSTOP) and restart it, and talk to it directly over hiredis
// to look at keys and command counts. The process itself is
// tests/support/redis_server.hpp (shared with tools/chaos); this adds the
// looking inside.
#ifndef DLOCK_TESTS_REDIS_REDIS_SERVER_HPP_
#define DLOCK_TESTS_REDIS_REDIS_SERVER_HPP_

#include <sys/time.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <hiredis/hiredis.h>

#include "support/loopback.hpp"  // FreePort
#include "support/redis_server.hpp"

namespace dlock::testing {

class RedisServer : public RedisServerProcess {
 public:
  using Options = RedisServerProcess::Options;

  // Starts a server and waits until it answers PING (at most 10s a try).
  static std::unique_ptr<RedisServer> Start(Options options = {}) {
    auto s = std::make_unique<RedisServer>(std::move(options));
    if (!s->start()) return nullptr;
    return s;
  }
  explicit RedisServer(Options options) : RedisServerProcess(std::move(options)) {}

  void Freeze() { freeze(); }
  void Thaw() { thaw(); }
  // SIGKILL: the server dies with everything in memory.
  void Kill() { kill(); }
  // SIGKILL, then starts again on the same port from what the server left in
  // its directory: dump.rdb or appendonlydir/ if it wrote any, else empty.
  bool Restart() { return restart(); }

  // One command on a fresh connection; nullptr if the server did not answer
  // within 2s. For inspection only.
  struct ReplyDeleter {
    void operator()(redisReply* r) const { freeReplyObject(r); }
  };
  using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;
  ReplyPtr Cmd(const std::vector<std::string>& args, int db = 0) const {
    timeval tv{2, 0};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port(), tv);
    if (c == nullptr) return nullptr;
    if (c->err) {
      redisFree(c);
      return nullptr;
    }
    redisSetTimeout(c, tv);
    auto run = [&](const std::vector<std::string>& a) {
      std::vector<const char*> argv;
      std::vector<size_t> lens;
      for (const auto& s : a) {
        argv.push_back(s.data());
        lens.push_back(s.size());
      }
      return ReplyPtr(
          static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
    };
    if (password()) run({"AUTH", *password()});
    if (db != 0) run({"SELECT", std::to_string(db)});
    ReplyPtr r = run(args);
    redisFree(c);
    return r;
  }
  std::string CmdStr(const std::vector<std::string>& args, int db = 0) const {
    auto r = Cmd(args, db);
    if (!r) return "<no reply>";
    if (r->type == REDIS_REPLY_INTEGER) return std::to_string(r->integer);
    if (r->type == REDIS_REPLY_NIL) return "<nil>";
    if (r->str) return std::string(r->str, r->len);
    return "<array>";
  }
  long long CmdInt(const std::vector<std::string>& args, int db = 0) const {
    auto r = Cmd(args, db);
    return r && r->type == REDIS_REPLY_INTEGER ? r->integer : -999;
  }

  // INFO commandstats as {"evalsha": calls, ...}.
  std::map<std::string, long long> CommandCalls() const {
    std::map<std::string, long long> out;
    std::string info = CmdStr({"INFO", "commandstats"});
    std::size_t pos = 0;
    while ((pos = info.find("cmdstat_", pos)) != std::string::npos) {
      std::size_t colon = info.find(':', pos);
      std::size_t calls = info.find("calls=", colon);
      if (colon == std::string::npos || calls == std::string::npos) break;
      std::string name = info.substr(pos + 8, colon - pos - 8);
      out[name] = std::atoll(info.c_str() + calls + 6);
      pos = colon;
    }
    return out;
  }

  // Writes, on one connection, until `n` replicas acknowledge a write within
  // 100ms (WAIT), for at most `timeout`. A replica the primary already lists
  // as online may not be receiving the write stream yet. The write must come
  // after the replicas connected: before that it makes no replication
  // offset, and a WAIT for offset 0 counts a replica as soon as it is online.
  bool AwaitReplicas(int n, std::chrono::milliseconds timeout = std::chrono::seconds(10)) const {
    timeval tv{2, 0};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port(), tv);
    if (c == nullptr) return false;
    if (password()) freeReplyObject(redisCommand(c, "AUTH %s", password()->c_str()));
    const std::string connected = "connected_slaves:" + std::to_string(n);
    bool ok = false;
    auto until = std::chrono::steady_clock::now() + timeout;
    while (!c->err && !ok && std::chrono::steady_clock::now() < until) {
      ReplyPtr info(static_cast<redisReply*>(redisCommand(c, "INFO replication")));
      if (!info || info->type != REDIS_REPLY_STRING ||
          std::string(info->str, info->len).find(connected) == std::string::npos) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      freeReplyObject(redisCommand(c, "INCR dlock-test:replica-probe"));
      ReplyPtr w(static_cast<redisReply*>(redisCommand(c, "WAIT %d 100", n)));
      ok = w && w->type == REDIS_REPLY_INTEGER && w->integer >= n;
    }
    if (ok) freeReplyObject(redisCommand(c, "DEL dlock-test:replica-probe"));
    redisFree(c);
    return ok;
  }

  // Subscribers of a channel (PUBSUB NUMSUB).
  long long NumSub(const std::string& channel) const {
    auto r = Cmd({"PUBSUB", "NUMSUB", channel});
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 2) return -1;
    return r->element[1]->integer;
  }
};

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_REDIS_REDIS_SERVER_HPP_
