// Test fixture: a private redis-server process (Debian's), on 127.0.0.1 and a
// free port, with a scratch directory and no persistence unless the options
// ask for it (an explicit SAVE still writes dump.rdb there). The tests start,
// stop, freeze (SIGSTOP) and restart it, and talk to it directly over hiredis
// to look at keys and command counts.
#ifndef DLOCK_TESTS_REDIS_REDIS_SERVER_HPP_
#define DLOCK_TESTS_REDIS_REDIS_SERVER_HPP_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <hiredis/hiredis.h>

namespace dlock::testing {

// A TCP port nobody listens on right now (the kernel's pick).
inline int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return -1;
  }
  int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

inline std::string RedisServerBinary() {
  for (const char* p : {"/usr/bin/redis-server", "/usr/local/bin/redis-server"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "redis-server";
}

class RedisServer {
 public:
  struct Options {
    std::optional<std::string> password;  // --requirepass
    std::vector<std::string> extra;       // more "--name value" arguments
    std::optional<int> replica_of;        // --replicaof 127.0.0.1 <port>
  };

  // Starts a server and waits until it answers PING (at most 10s).
  static std::unique_ptr<RedisServer> Start(Options options = {}) {
    auto s = std::unique_ptr<RedisServer>(new RedisServer(std::move(options)));
    for (int attempt = 0; attempt < 5; ++attempt) {  // a port can be taken between pick and bind
      s->port_ = FreePort();
      if (s->port_ > 0 && s->Launch()) return s;
    }
    return nullptr;
  }

  ~RedisServer() {
    Thaw();
    Kill();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  const std::string& dir() const { return dir_; }

  // "redis://[:password@]127.0.0.1:port<suffix>"
  std::string url(const std::string& suffix = "") const {
    std::string auth = opt_.password ? ":" + *opt_.password + "@" : "";
    return "redis://" + auth + "127.0.0.1:" + std::to_string(port_) + suffix;
  }

  void Freeze() {
    if (pid_ > 0 && !frozen_) {
      ::kill(pid_, SIGSTOP);
      frozen_ = true;
    }
  }
  void Thaw() {
    if (pid_ > 0 && frozen_) {
      ::kill(pid_, SIGCONT);
      frozen_ = false;
    }
  }
  // SIGKILL: the server dies with everything in memory.
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
  }
  // SIGKILL, then starts again on the same port from what the server left in
  // its directory: dump.rdb or appendonlydir/ if it wrote any, else empty.
  bool Restart() {
    Kill();
    for (int attempt = 0; attempt < 50; ++attempt) {  // the port may linger a moment
      if (Launch()) return true;
    }
    return false;
  }

  // One command on a fresh connection; nullptr if the server did not answer
  // within 2s. For inspection only.
  struct ReplyDeleter {
    void operator()(redisReply* r) const { freeReplyObject(r); }
  };
  using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;
  ReplyPtr Cmd(const std::vector<std::string>& args, int db = 0) const {
    timeval tv{2, 0};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
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
    if (opt_.password) run({"AUTH", *opt_.password});
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
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    if (c == nullptr) return false;
    if (opt_.password) freeReplyObject(redisCommand(c, "AUTH %s", opt_.password->c_str()));
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

 private:
  explicit RedisServer(Options o) : opt_(std::move(o)) {
    char tmpl[] = "/tmp/dlock-redis-XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    dir_ = d ? d : "/tmp";
  }

  bool Launch() {
    std::vector<std::string> args = {RedisServerBinary(),
                                     "--port",
                                     std::to_string(port_),
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--dir",
                                     dir_,
                                     "--daemonize",
                                     "no",
                                     "--logfile",
                                     dir_ + "/redis-" + std::to_string(port_) + ".log",
                                     "--protected-mode",
                                     "no"};
    if (opt_.password) {
      args.push_back("--requirepass");
      args.push_back(*opt_.password);
    }
    if (opt_.replica_of) {
      args.push_back("--replicaof");
      args.push_back("127.0.0.1");
      args.push_back(std::to_string(*opt_.replica_of));
    }
    args.insert(args.end(), opt_.extra.begin(), opt_.extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
      if (::getppid() != parent) ::_exit(127);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    if (pid < 0) return false;
    pid_ = pid;
    // Wait until it answers, or exits (port taken), for at most 10s.
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      if (CmdStr({"PING"}) == "PONG") return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    Kill();
    return false;
  }

  Options opt_;
  std::string dir_;
  int port_ = -1;
  pid_t pid_ = -1;
  bool frozen_ = false;
};

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_REDIS_REDIS_SERVER_HPP_
