// Test support: a private redis-server process (Debian's), on 127.0.0.1 and
// a free port, in a directory of its own, for the tests (tests/redis adds
// looking inside over hiredis) and the chaos runner (tools/chaos). It dies
// with the process that started it (PR_SET_PDEATHSIG), even on a crash.
#ifndef DLOCK_TESTS_SUPPORT_REDIS_SERVER_HPP_
#define DLOCK_TESTS_SUPPORT_REDIS_SERVER_HPP_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace dlock::testing {

class RedisServerProcess {
 public:
  struct Options {
    std::optional<std::string> password;  // --requirepass
    std::vector<std::string> extra;       // more "--name value" arguments
    std::optional<int> replica_of;        // --replicaof 127.0.0.1 <port>
    // "none" (a restart loses every key; an explicit SAVE still writes
    // dump.rdb), "rdb" (a snapshot whenever a key changed in the last
    // second: `save 1 1`) or "aof" (append-only file, `appendfsync
    // everysec`). A restart loads whatever the directory holds.
    std::string persist = "none";
    // Its directory; empty: a scratch directory of its own, deleted when
    // this object is.
    std::string dir;
  };

  // Does not start it yet (start()).
  explicit RedisServerProcess(Options options);
  ~RedisServerProcess();  // kills it (SIGCONT first if frozen)
  RedisServerProcess(const RedisServerProcess&) = delete;
  RedisServerProcess& operator=(const RedisServerProcess&) = delete;

  // Starts it and waits until it answers PING with PONG (not -LOADING: an
  // AOF or RDB loads first), for at most 10 s a try. The first start picks a
  // free port (another if that one is taken); later starts (a restart) take
  // the same port again, waiting for it to be released.
  bool start();
  // SIGKILL: the server dies with everything in memory. Idempotent.
  void kill();
  // kill(), then start() on the same port and directory.
  bool restart();
  void freeze();  // SIGSTOP
  void thaw();    // SIGCONT
  // For the next start(): a replica of 127.0.0.1:`port`, or a primary.
  void set_replica_of(std::optional<int> port) { options_.replica_of = port; }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  const std::string& dir() const { return dir_; }
  const std::optional<std::string>& password() const { return options_.password; }
  // "redis://[:password@]127.0.0.1:port<suffix>"
  std::string url(const std::string& suffix = "") const;
  // The files in dir() that a restart loads.
  std::vector<std::string> data_files() const;
  // PING (after AUTH if there is a password) answered with PONG.
  bool ping() const;

 private:
  bool launch();

  Options options_;
  std::string dir_;
  bool own_dir_ = false;
  int port_ = 0;
  pid_t pid_ = -1;
  bool frozen_ = false;
};

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_SUPPORT_REDIS_SERVER_HPP_
