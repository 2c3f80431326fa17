#include "support/redis_server.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "support/loopback.hpp"

namespace dlock::testing {

RedisServerProcess::RedisServerProcess(Options options) : options_(std::move(options)) {
  if (options_.dir.empty()) {
    char tmpl[] = "/tmp/dlock-redis-XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    dir_ = d ? d : "/tmp";
    own_dir_ = d != nullptr;
  } else {
    dir_ = options_.dir;
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
  }
}

RedisServerProcess::~RedisServerProcess() {
  kill();
  if (own_dir_) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string RedisServerProcess::url(const std::string& suffix) const {
  std::string auth = options_.password ? ":" + *options_.password + "@" : "";
  return "redis://" + auth + "127.0.0.1:" + std::to_string(port_) + suffix;
}

std::vector<std::string> RedisServerProcess::data_files() const {
  return options_.persist == "aof" ? std::vector<std::string>{"appendonlydir"} : std::vector<std::string>{"dump.rdb"};
}

bool RedisServerProcess::ping() const {
  int fd = ConnectLoopback(port_, 1);
  if (fd < 0) return false;
  std::string request = "PING\r\n";
  if (options_.password) {
    request = "*2\r\n$4\r\nAUTH\r\n$" + std::to_string(options_.password->size()) + "\r\n" + *options_.password +
              "\r\n" + request;
  }
  std::string got;
  if (::write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
    // Both replies, or the first error, within the read timeout.
    const std::size_t want = options_.password ? 2 : 1;
    auto lines = [&] {
      std::size_t n = 0;
      for (std::size_t p = 0; (p = got.find("\r\n", p)) != std::string::npos; p += 2) ++n;
      return n;
    };
    char buf[256];
    while (lines() < want) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return got.find("+PONG\r\n") != std::string::npos;
}

bool RedisServerProcess::launch() {
  std::vector<std::string> args = {"redis-server", "--port",    std::to_string(port_), "--bind", "127.0.0.1",
                                   "--dir",        dir_,        "--daemonize",         "no",     "--protected-mode",
                                   "no",           "--logfile", dir_ + "/redis.log"};
  if (options_.persist == "rdb") {
    args.insert(args.end(), {"--save", "1 1", "--appendonly", "no"});
  } else if (options_.persist == "aof") {
    args.insert(args.end(), {"--save", "", "--appendonly", "yes", "--appendfsync", "everysec"});
  } else {
    args.insert(args.end(), {"--save", "", "--appendonly", "no"});
  }
  if (options_.password) args.insert(args.end(), {"--requirepass", *options_.password});
  if (options_.replica_of) args.insert(args.end(), {"--replicaof", "127.0.0.1", std::to_string(*options_.replica_of)});
  args.insert(args.end(), options_.extra.begin(), options_.extra.end());
  pid_ = Spawn(args, dir_ + "/redis.out");
  if (pid_ <= 0) {
    pid_ = -1;
    return false;
  }
  frozen_ = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {  // exited: the port is taken, or a bad argument
      pid_ = -1;
      return false;
    }
    if (ping()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill();
  return false;
}

bool RedisServerProcess::start() {
  if (running()) return true;
  if (port_ <= 0) {
    for (int attempt = 0; attempt < 5; ++attempt) {  // a port can be taken between pick and bind
      port_ = FreePort();
      if (port_ > 0 && launch()) return true;
    }
    return false;
  }
  for (int attempt = 0; attempt < 50; ++attempt) {  // the port may linger a moment after a kill
    if (launch()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

void RedisServerProcess::kill() {
  if (pid_ <= 0) return;
  if (frozen_) ::kill(pid_, SIGCONT);
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
  frozen_ = false;
}

bool RedisServerProcess::restart() {
  kill();
  return start();
}

void RedisServerProcess::freeze() {
  if (pid_ > 0 && !frozen_) {
    ::kill(pid_, SIGSTOP);
    frozen_ = true;
  }
}

void RedisServerProcess::thaw() {
  if (pid_ > 0 && frozen_) {
    ::kill(pid_, SIGCONT);
    frozen_ = false;
  }
}

}  // namespace dlock::testing
