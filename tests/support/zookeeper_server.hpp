// Test support: private ZooKeeper servers from Debian's jars, run with `java`
// directly on 127.0.0.1 and free ports: one standalone server or an ensemble,
// for the tests (tests/zookeeper: servers a test freezes or kills) and the
// chaos runner (tools/chaos). Each server dies with the thread that started
// it (PR_SET_PDEATHSIG), even on a crash, and runs in a session of its own.
//
// The CTest fixture's shared server (tests/servers/zookeeper.sh, the same
// zoo.cfg settings) is started by that script instead: it outlives the test
// processes that use it, as CTest's FIXTURES_SETUP needs.
#ifndef DLOCK_TESTS_SUPPORT_ZOOKEEPER_SERVER_HPP_
#define DLOCK_TESTS_SUPPORT_ZOOKEEPER_SERVER_HPP_

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dlock::testing {

class TcpProxy;

// The answer of a four-letter command (ruok, srvr, mntr, ...) from the
// server on 127.0.0.1:`port`, or "" if none (2 s read timeout).
std::string ZooKeeperFourLetters(int port, const std::string& cmd);

class ZooKeeperServers {
 public:
  struct Options {
    // 1: a standalone server; more: an ensemble (server.N lines, myid).
    int size = 1;
    // Server i (0-based) lives in DIR/zk<i+1>: zoo.cfg, data/, server.log.
    // Data persists there, so a restarted server keeps its znodes and
    // sessions (if back within their timeout). Empty: a scratch directory
    // of its own, deleted when this object is.
    std::string dir;
    int tick_ms = 200;
    int init_limit = 100;  // ticks
    // syncLimit x tickTime: how long a follower goes on serving its clients
    // without hearing from the leader (syncLimit: at least 2 ticks).
    int sync_ms = 2000;
    // In an ensemble, which quorum and election connections between servers
    // go through proxies of this object's (cut() and isolate() silence
    // them): each server's zoo.cfg names the others at the addresses it
    // should dial. kFirstServer: server 1's to and from the others;
    // kAllPairs: every ordered pair's. (An election connection may bypass a
    // proxy: a server answers a peer on the address the peer announces. A
    // follower's connection to its leader never does.)
    enum class PeerLinks { kNone, kFirstServer, kAllPairs };
    PeerLinks peer_links = PeerLinks::kNone;
    std::string heap = "192m";                // -Xmx
    std::vector<std::string> jvm_properties;  // more "-Dname=value"
  };

  // Picks the ports and writes each server's zoo.cfg; does not start them
  // (start_all(), launch()).
  explicit ZooKeeperServers(Options options);
  ~ZooKeeperServers();  // kills every server (even a frozen one)
  ZooKeeperServers(const ZooKeeperServers&) = delete;
  ZooKeeperServers& operator=(const ZooKeeperServers&) = delete;

  // Launches every server, then waits until each one serves.
  bool start_all();
  // Starts server `i` (again: same ports, same data).
  void launch(std::size_t i);
  // Until server `i` answers srvr as standalone, leader or follower: 60 s at
  // most (a cold JVM), false at once if it exits.
  bool wait_serving(std::size_t i);
  // SIGKILL (no clean shutdown; its data stays), reaped. Idempotent.
  void kill(std::size_t i);
  void freeze(std::size_t i);  // SIGSTOP
  void thaw(std::size_t i);    // SIGCONT
  // Cuts (black-holes, connections kept open) or heals the proxied links
  // between servers `a` and `b`, both ways; their clients stay connected.
  void cut(std::size_t a, std::size_t b, bool on);
  // cut() between server 1 and each of the others.
  void isolate(bool on);
  // The index of the server that says it leads, if any.
  std::optional<std::size_t> leader() const;

  std::size_t size() const { return servers_.size(); }
  int client_port(std::size_t i) const { return servers_[i].client; }
  pid_t pid(std::size_t i) const { return servers_[i].pid; }
  bool running(std::size_t i) const { return servers_[i].pid > 0; }
  const std::string& dir() const { return dir_; }
  std::string server_dir(std::size_t i) const;
  // "127.0.0.1:PORT,..." of every server's client port.
  std::string hosts() const;

 private:
  struct Server {
    int client, peer, election;
    pid_t pid;
  };
  Options options_;
  std::string dir_;
  bool own_dir_ = false;
  std::vector<Server> servers_;
  struct Link {
    std::size_t from, to;  // server `from` dials server `to` through `proxy`
    std::unique_ptr<TcpProxy> proxy;
  };
  std::vector<Link> links_;
};

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_SUPPORT_ZOOKEEPER_SERVER_HPP_
