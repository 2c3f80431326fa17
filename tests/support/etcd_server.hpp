// Test support: private etcd members (Debian's etcd-server) on 127.0.0.1 and
// free ports, one member or a cluster, for the tests and the chaos runner
// (tools/chaos). Each member is started by tests/servers/etcd.sh
// exec-member, so its command line is the CTest fixtures' (one place for
// etcd's flags), and dies with the thread that started it
// (PR_SET_PDEATHSIG), even on a crash, in a session of its own.
//
// The CTest fixtures' shared servers and tests/etcd/private_etcd.hpp (TLS,
// auth, extra flags) run that script's `start` instead, whose members
// outlive it as CTest's FIXTURES_SETUP needs.
#ifndef DLOCK_TESTS_SUPPORT_ETCD_SERVER_HPP_
#define DLOCK_TESTS_SUPPORT_ETCD_SERVER_HPP_

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dlock::testing {

class TcpProxy;

// etcdctl `args` (v3 API) against `endpoints` ("http://127.0.0.1:P,..."),
// bounded by `timeout_s`; true if it exited 0. Its stdout goes to `out`.
bool EtcdCtl(const std::string& endpoints, const std::string& args, std::string* out = nullptr, int timeout_s = 5);

class EtcdServers {
 public:
  struct Options {
    int size = 1;  // members; more than one: a cluster
    // Member i (0-based) lives in DIR/etcd<i+1>: data/ and etcd.log. Data
    // persists there, so a restarted member keeps its keys and leases.
    // Empty: a scratch directory of its own, deleted when this object is.
    std::string dir;
    // In a cluster: every member advertises its peer URL at a proxy of this
    // object's, so that isolate() can cut member 0 off from the others
    // (its clients stay connected to it).
    bool proxied_peers = false;
  };

  // Picks the ports; does not start the members (start_all(), launch()).
  explicit EtcdServers(Options options);
  ~EtcdServers();  // kills every member (even a frozen one)
  EtcdServers(const EtcdServers&) = delete;
  EtcdServers& operator=(const EtcdServers&) = delete;

  // Launches every member, then waits until each one serves.
  bool start_all();
  // Starts member `i` (again: same ports, same data).
  void launch(std::size_t i);
  // Until member `i` answers a linearizable read (so the cluster has a
  // leader): 60 s at most, false at once if it exits.
  bool wait_serving(std::size_t i);
  // SIGKILL (no clean shutdown; its data stays), reaped. Idempotent.
  void kill(std::size_t i);
  void freeze(std::size_t i);  // SIGSTOP
  void thaw(std::size_t i);    // SIGCONT
  // Member 0 loses every peer connection to the others, both ways
  // (black-holed, connections kept open; new ones swallowed), or gets them
  // back. Needs Options::proxied_peers. Its clients stay connected to it.
  void isolate(bool on);
  // The index of the member that says it leads, if any (etcdctl endpoint
  // status of every running, unfrozen member).
  std::optional<std::size_t> leader() const;
  // Moves the leadership to member `i` (etcdctl move-leader on the
  // current leader); true once `i` says it leads.
  bool make_leader(std::size_t i);

  std::size_t size() const { return members_.size(); }
  int client_port(std::size_t i) const { return members_[i].client; }
  pid_t pid(std::size_t i) const { return members_[i].pid; }
  bool running(std::size_t i) const { return members_[i].pid > 0; }
  const std::string& dir() const { return dir_; }
  std::string member_dir(std::size_t i) const;
  // "127.0.0.1:PORT,..." of every member's client port (an etcd:// URL's hosts).
  std::string hosts() const;
  // "http://127.0.0.1:PORT" of member `i`, or of every member without `i`.
  std::string endpoint(std::size_t i) const;
  std::string endpoints() const;

 private:
  struct Member {
    int client = 0, peer = 0;
    pid_t pid = -1;
    bool frozen = false;
  };
  Options options_;
  std::string dir_, token_, initial_cluster_;
  bool own_dir_ = false;
  std::vector<Member> members_;
  std::vector<std::unique_ptr<TcpProxy>> peer_proxies_;  // by member, if proxied
};

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_SUPPORT_ETCD_SERVER_HPP_
