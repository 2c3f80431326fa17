// Test support: a fault-injecting TCP proxy on loopback, for the tests and
// the chaos runner (tools/chaos). Clients connect to port() and are forwarded
// to 127.0.0.1:upstream_port. Switching its mode cuts connections without
// touching anything outside the test (no iptables, no tc).
//
//   kPass       forward at once
//   kDelay      forward each chunk after `delay`
//   kBlackHole  a silent partition: open connections stay open and carry
//               nothing (the kernel buffers fill); new ones are accepted but
//               never connected upstream (a network that swallows the
//               handshake), and are closed once the partition ends
//
// black_hole_from(pid) does the same to the connections of one process
// only (their client end's owner, looked up in /proc), in any mode: a
// partition of one member of a cluster whose members all dial each other
// at the same advertised addresses (etcd's peer URLs).
#ifndef DLOCK_TESTS_SUPPORT_TCP_PROXY_HPP_
#define DLOCK_TESTS_SUPPORT_TCP_PROXY_HPP_

#include <netinet/in.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "support/loopback.hpp"

namespace dlock::testing {

class TcpProxy {
 public:
  enum class Mode { kPass, kDelay, kBlackHole };

  // Listens on 127.0.0.1:`listen_port` (0: a free port); throws
  // std::runtime_error if it cannot.
  explicit TcpProxy(int upstream_port, int listen_port = 0);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const noexcept { return port_; }
  std::string hosts() const { return "127.0.0.1:" + std::to_string(port_); }
  void set_mode(Mode mode, std::chrono::milliseconds delay = {}) noexcept;
  // While `pid` > 0, connections from process `pid` (the process whose
  // socket is the client end, found through /proc/net/tcp and
  // /proc/PID/fd, for connections already open too) are black-holed as in
  // kBlackHole, whatever the mode; the others go on as before. 0: none.
  void black_hole_from(pid_t pid) noexcept { from_pid_.store(pid); }
  void partition() noexcept { set_mode(Mode::kBlackHole); }
  void heal() noexcept { set_mode(Mode::kPass); }
  // Closes every open connection (both sides), like a reset: the client sees
  // it at once.
  void drop_all() noexcept { drop_.store(true); }
  void reset() noexcept { drop_all(); }
  // New connections go to 127.0.0.1:`port` from now on (a failover).
  void set_upstream(int port) noexcept { upstream_port_.store(port); }
  // How many connections it has accepted so far.
  int accepted() const noexcept { return accepted_.load(); }
  // Returns once every byte it forwards comes under the mode set before the
  // call (a round that began earlier may still forward under the old one),
  // or after 10 s if its thread does not get to run.
  void settle() const noexcept;

 private:
  void run();

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<int> upstream_port_{0};
  std::atomic<Mode> mode_{Mode::kPass};
  std::atomic<std::int64_t> delay_ms_{0};
  std::atomic<pid_t> from_pid_{0};
  std::atomic<bool> drop_{false};
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::atomic<std::uint64_t> rounds_{0};  // rounds of the thread's loop begun
  std::thread thread_;
};

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_SUPPORT_TCP_PROXY_HPP_
