// Test support for the zk:// store: where the test server is, a plain
// ZooKeeper client for looking behind the store's back, a private server a
// test may freeze or kill, a TCP proxy that can cut a client off, and a
// kazoo (Python) or Curator (Java) process to interoperate with.
#ifndef DLOCK_TESTS_ZOOKEEPER_ZK_TEST_SUPPORT_HPP_
#define DLOCK_TESTS_ZOOKEEPER_ZK_TEST_SUPPORT_HPP_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zookeeper/zookeeper.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dlock/dlock.hpp"
#include "support/poll.hpp"              // testing::Eventually
#include "support/tcp_proxy.hpp"         // testing::TcpProxy: partition(), heal(), reset()
#include "support/zookeeper_server.hpp"  // testing::ZooKeeperServers

namespace dlock::zktest {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

// "127.0.0.1:PORT" of the shared test server: $DLOCK_TEST_ZK, or the port in
// the file $DLOCK_ZK_PORT_FILE (written by the CTest fixture). Empty if none.
inline std::string SharedServer() {
  if (const char* hp = std::getenv("DLOCK_TEST_ZK"); hp && *hp) return hp;
  if (const char* file = std::getenv("DLOCK_ZK_PORT_FILE"); file && *file) {
    std::ifstream in(file);
    std::string port;
    if (in >> port) return "127.0.0.1:" + port;
  }
  return "";
}

#define DLOCK_REQUIRE_ZK_SERVER()                                                                     \
  do {                                                                                                \
    if (::dlock::zktest::SharedServer().empty())                                                      \
      GTEST_SKIP() << "no ZooKeeper server: set DLOCK_TEST_ZK=host:port or run the tests with ctest"; \
  } while (0)

// A chroot of its own for each test, so tests never see each other's nodes.
// (EnsureTestRoot, below, makes their common parent open and persistent.)
inline std::string UniqueChroot(const std::string& test) {
  static std::atomic<int> counter{0};
  return "/dlock-test/" + test + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

inline double Seconds(SteadyClock::duration d) { return std::chrono::duration<double>(d).count(); }

// The answer of a four-letter command (srvr, mntr, wchp, ...) from the server
// at "host:port", or "" if it does not answer within two seconds.
inline std::string FourLetters(const std::string& hostport, const std::string& cmd) {
  auto colon = hostport.rfind(':');
  if (colon == std::string::npos) return "";
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(hostport.substr(colon + 1))));
  ::inet_pton(AF_INET, hostport.substr(0, colon).c_str(), &a.sin_addr);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::write(fd, cmd.data(), cmd.size()) == static_cast<ssize_t>(cmd.size())) {
    auto end = SteadyClock::now() + 2s;
    char buf[4096];
    while (SteadyClock::now() < end) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      out.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

// --------------------------------------------------------------------- RawZk
// The C client's synchronous API, for setting up and checking znodes.
class RawZk {
 public:
  explicit RawZk(const std::string& hosts, int timeout_ms = 10000, const std::string& digest = "") {
    zh_ = zookeeper_init2(hosts.c_str(), &RawZk::Watch, timeout_ms, nullptr, this, ZOO_NO_LOG_CLIENTENV,
                          [](const char*) {});
    if (!zh_) return;
    if (!digest.empty()) zoo_add_auth(zh_, "digest", digest.data(), static_cast<int>(digest.size()), nullptr, nullptr);
    for (int i = 0; i < 1000 && zoo_state(zh_) != ZOO_CONNECTED_STATE; ++i) std::this_thread::sleep_for(10ms);
  }
  ~RawZk() {
    if (zh_) zookeeper_close(zh_);
  }
  RawZk(const RawZk&) = delete;
  RawZk& operator=(const RawZk&) = delete;

  bool connected() const { return zh_ && zoo_state(zh_) == ZOO_CONNECTED_STATE; }
  zhandle_t* handle() const { return zh_; }

  // Creates `path` (and missing parents as persistent nodes); returns the
  // created path or "" on failure.
  std::string create(const std::string& path, const std::string& data = "", int mode = 0,
                     const ACL_vector* acl = &ZOO_OPEN_ACL_UNSAFE) {
    for (std::size_t i = path.find('/', 1); i != std::string::npos; i = path.find('/', i + 1)) {
      zoo_create(zh_, path.substr(0, i).c_str(), "", 0, &ZOO_OPEN_ACL_UNSAFE, 0, nullptr, 0);
    }
    char buf[1024] = {};
    int rc = zoo_create(zh_, path.c_str(), data.data(), static_cast<int>(data.size()), acl, mode, buf, sizeof buf);
    last_rc = rc;
    return rc == ZOK ? std::string(buf) : std::string();
  }
  bool exists(const std::string& path, Stat* stat = nullptr) {
    Stat s{};
    last_rc = zoo_exists(zh_, path.c_str(), 0, &s);
    if (stat) *stat = s;
    return last_rc == ZOK;
  }
  std::optional<std::string> get(const std::string& path, Stat* stat = nullptr) {
    std::vector<char> buf(1 << 16);
    int len = static_cast<int>(buf.size());
    Stat s{};
    last_rc = zoo_get(zh_, path.c_str(), 0, buf.data(), &len, &s);
    if (last_rc != ZOK) return std::nullopt;
    if (stat) *stat = s;
    return std::string(buf.data(), len > 0 ? static_cast<std::size_t>(len) : 0);
  }
  int set(const std::string& path, const std::string& data) {
    return last_rc = zoo_set(zh_, path.c_str(), data.data(), static_cast<int>(data.size()), -1);
  }
  std::vector<std::string> children(const std::string& path) {
    String_vector v{0, nullptr};
    std::vector<std::string> out;
    last_rc = zoo_get_children(zh_, path.c_str(), 0, &v);
    if (last_rc == ZOK) {
      for (int i = 0; i < v.count; ++i) out.emplace_back(v.data[i]);
      deallocate_String_vector(&v);
    }
    return out;
  }
  int remove(const std::string& path) { return last_rc = zoo_delete(zh_, path.c_str(), -1); }
  // "scheme:id:perms" for each ACL entry of `path`.
  std::vector<std::string> acl(const std::string& path) {
    ACL_vector v{0, nullptr};
    Stat s{};
    std::vector<std::string> out;
    last_rc = zoo_get_acl(zh_, path.c_str(), &v, &s);
    if (last_rc == ZOK) {
      for (int i = 0; i < v.count; ++i) {
        out.push_back(std::string(v.data[i].id.scheme) + ":" + v.data[i].id.id + ":" + std::to_string(v.data[i].perms));
      }
      deallocate_ACL_vector(&v);
    }
    return out;
  }
  std::int64_t session_id() const { return zoo_client_id(zh_)->client_id; }

  int last_rc = ZOK;

 private:
  static void Watch(zhandle_t*, int, int, const char*, void*) {}
  zhandle_t* zh_ = nullptr;
};

// Makes /dlock-test an open, persistent node, so that a test creating its
// chroot with a restrictive ACL (acl=creator) cannot lock the others out.
inline void EnsureTestRoot(const std::string& hosts) {
  RawZk raw(hosts);
  if (raw.connected() && !raw.exists("/dlock-test")) raw.create("/dlock-test");
}

// ------------------------------------------------------------- PrivateServer
// A server of the test's own, for tests that stop, freeze or kill it:
// testing::ZooKeeperServers (support/zookeeper_server.hpp, shared with
// tools/chaos) with one standalone server in a scratch directory, its
// container reaper every 200ms like the fixture's (tests/servers/zookeeper.sh).
class PrivateServer {
 public:
  PrivateServer() : servers_(server_options()) { ok_ = servers_.start_all(); }
  PrivateServer(const PrivateServer&) = delete;
  PrivateServer& operator=(const PrivateServer&) = delete;

  bool ok() const { return ok_; }
  std::string hosts() const { return servers_.hosts(); }
  int port() const { return servers_.client_port(0); }

  void freeze() { servers_.freeze(0); }
  void thaw() { servers_.thaw(0); }
  // Kills the JVM at once (no clean shutdown), keeping its data.
  void crash() { servers_.kill(0); }
  // Starts it again on the same port and data: sessions survive if their
  // clients come back within their timeout.
  bool restart() {
    servers_.launch(0);
    return ok_ = servers_.wait_serving(0);
  }

 private:
  static testing::ZooKeeperServers::Options server_options() {
    testing::ZooKeeperServers::Options o;
    o.heap = "256m";
    o.jvm_properties = {"-Dznode.container.checkIntervalMs=200", "-Dznode.container.maxPerMinute=100000"};
    return o;
  }
  testing::ZooKeeperServers servers_;
  bool ok_ = false;
};

// ------------------------------------------------------------ peer clients
// Another ZooKeeper lock client in a process of its own (kazoo in Python,
// Curator in Java), driven line by line over its stdin/stdout. Commands (one
// per line) and answers, the same for both:
//   lock KIND PATH TIMEOUT  KIND: lock|read|write -> "acquired NODE" | "timeout"
//                           (kazoo: Lock, ReadLock, WriteLock, given the
//                           extra_lock_patterns of Curator's tags; Curator:
//                           InterProcessMutex, InterProcessReadWriteLock)
//   release                 -> "released"
//   cycles KIND PATH N LEDGER TAG
//                           N rounds of acquire, append "enter KIND TAG" to
//                           the file LEDGER, append "exit KIND TAG", release
//                           -> "done ROUNDS"
//   exit
// kazoo only: ephemeral PATH (an EPHEMERAL_SEQUENTIAL node) -> "created PATH".
// kazoo only: elect PATH IDENT TIMEOUT PATTERNS: waits to lead an Election
//                           (PATTERNS "-": kazoo's plain Election; else its
//                           lock's extra_lock_patterns, comma-separated)
//                           -> "elected NODE" | "timeout"; "release" resigns
//             contenders PATH PATTERNS -> "contenders ID,ID,..." (Election.contenders())
// Curator only: semaphore PATH MAX TIMEOUT (a lease of InterProcessSemaphoreV2)
//                           -> "acquired NODE" | "timeout".
enum class PeerKind { kKazoo, kCurator };

inline const char* PeerName(PeerKind kind) { return kind == PeerKind::kKazoo ? "kazoo" : "curator"; }
inline void PrintTo(PeerKind kind, std::ostream* os) { *os << PeerName(kind); }

// Why the peer cannot run here, or "" if it can.
inline std::string PeerMissing(PeerKind kind) {
  if (kind == PeerKind::kKazoo) return std::string(DLOCK_PYTHON_KAZOO).empty() ? "needs python3-kazoo" : "";
  return std::string(DLOCK_CURATOR_CLASSPATH).empty() ? "needs libcurator-recipes-java and a JDK" : "";
}

class PeerClient {
 public:
  // `timeout` is the peer's session timeout in seconds.
  PeerClient(PeerKind kind, const std::string& hosts, double timeout = 10.0) {
    std::string t = std::to_string(timeout);
    std::vector<std::string> argv;
    if (kind == PeerKind::kKazoo) {
      argv = {DLOCK_PYTHON_KAZOO, "-u", "-c", kKazooScript, hosts, t};
    } else {
      argv = {
          DLOCK_JAVA, "-Xshare:auto", "-XX:TieredStopAtLevel=1", "-cp", DLOCK_CURATOR_CLASSPATH, "CuratorDriver", hosts,
          t};
    }
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return;
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = out[0];
    ready_ = read_line(60s) == "ready";  // a JVM on a loaded machine is slow to start
  }
  ~PeerClient() {
    if (pid_ > 0) {
      ::kill(pid_, SIGCONT);
      send("exit");
      ::close(to_);
      int status = 0;
      for (int i = 0; i < 500 && ::waitpid(pid_, &status, WNOHANG) == 0; ++i) std::this_thread::sleep_for(10ms);
      if (::waitpid(pid_, &status, WNOHANG) == 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
      }
      ::close(from_);
    }
  }
  PeerClient(const PeerClient&) = delete;
  PeerClient& operator=(const PeerClient&) = delete;

  bool ready() const { return ready_; }
  pid_t pid() const { return pid_; }
  void send(const std::string& line) {
    std::string l = line + "\n";
    [[maybe_unused]] auto n = ::write(to_, l.data(), l.size());
  }
  // The next line, or "" after `limit`.
  std::string read_line(std::chrono::milliseconds limit = 30s) {
    auto end = SteadyClock::now() + limit;
    while (true) {
      auto nl = pending_.find('\n');
      if (nl != std::string::npos) {
        std::string line = pending_.substr(0, nl);
        pending_.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - SteadyClock::now()).count();
      if (left <= 0) return "";
      pollfd p{from_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buf[4096];
      ssize_t n = ::read(from_, buf, sizeof buf);
      if (n <= 0) return "";
      pending_.append(buf, static_cast<std::size_t>(n));
    }
  }
  std::string call(const std::string& line, std::chrono::milliseconds limit = 30s) {
    send(line);
    return read_line(limit);
  }

 private:
  static constexpr const char* kKazooScript = R"PY(
import os, sys, time, logging
logging.basicConfig(level=logging.CRITICAL)
from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout
from kazoo.recipe.lock import Lock, ReadLock, WriteLock
hosts, timeout = sys.argv[1], float(sys.argv[2])
zk = KazooClient(hosts=hosts, timeout=timeout)
zk.start(timeout=30)
print("ready")
# Curator's and dlock's tags, so that kazoo sees their entries as contenders.
patterns = {"lock": ["-lock-", "__WRIT__"], "write": ["-lock-", "__WRIT__", "__READ__"], "read": ["-lock-", "__WRIT__"]}
def new_lock(kind, path):
    cls = {"lock": Lock, "read": ReadLock, "write": WriteLock}[kind]
    return cls(zk, path, "kazoo-" + kind, extra_lock_patterns=patterns[kind])
def new_election(path, ident, patterns):
    # kazoo's Election does not expose extra_lock_patterns: set its lock.
    election = zk.Election(path, ident)
    if patterns != "-":
        election.lock = zk.Lock(path, ident, extra_lock_patterns=patterns.split(","))
    return election
def append(ledger, line):
    # One write(2) on an O_APPEND file: lines of concurrent writers never mix.
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (line + "\n").encode())
    os.close(fd)
def take(lock, timeout, said):
    # Acquires within `timeout` seconds: prints `said` and the node, and
    # returns the lock to hold; or prints "timeout" and returns None.
    try:
        got = lock.acquire(timeout=timeout)
    except LockTimeout:
        got = False
    print(said, lock.node) if got else print("timeout")
    return lock if got else None
held = None
for line in sys.stdin:
    words = line.split()
    if not words:
        continue
    cmd = words[0]
    if cmd == "lock":
        held = take(new_lock(words[1], words[2]), float(words[3]), "acquired")
    elif cmd == "release":
        held.release()
        held = None
        print("released")
    elif cmd == "cycles":
        kind, path, n, ledger, tag = words[1], words[2], int(words[3]), words[4], words[1] + " " + words[5]
        lock, done = new_lock(kind, path), 0
        while done < n:
            try:
                if not lock.acquire(timeout=60):
                    break
            except LockTimeout:
                break
            try:
                append(ledger, "enter " + tag)
                time.sleep(0.0002)  # let another contender try to get in
                append(ledger, "exit " + tag)
            finally:
                lock.release()
            done += 1
        print("done", done)
    elif cmd == "elect":
        # The lock Election.run holds while its function runs.
        held = take(new_election(words[1], words[2], words[4]).lock, float(words[3]), "elected")
    elif cmd == "contenders":
        print("contenders", ",".join(new_election(words[1], "", words[2]).contenders()))
    elif cmd == "ephemeral":
        print("created", zk.create(words[1], b"kazoo", ephemeral=True, sequence=True, makepath=True))
    elif cmd == "exit":
        break
zk.stop()
zk.close()
)PY";

  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  bool ready_ = false;
  std::string pending_;
};

}  // namespace dlock::zktest

#endif  // DLOCK_TESTS_ZOOKEEPER_ZK_TEST_SUPPORT_HPP_
