// A fault-injecting TCP proxy on loopback, for the chaos runner: clients
// connect to port() and are forwarded to 127.0.0.1:upstream_port. The runner
// switches its mode to cut connections without touching anything outside the
// test (no iptables, no tc).
#ifndef DLOCK_TOOLS_CHAOS_TCP_PROXY_HPP_
#define DLOCK_TOOLS_CHAOS_TCP_PROXY_HPP_

#include <netinet/in.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace dlock::chaos {

// 127.0.0.1:`port` (0: any free port, for bind).
sockaddr_in Loopback(int port);

class TcpProxy {
 public:
  enum class Mode {
    kPass,       // forward at once
    kDelay,      // forward each chunk after delay()
    kBlackHole,  // accept and keep connections, forward nothing (a silent partition)
  };

  // Listens on 127.0.0.1 and a free port; throws std::runtime_error if it cannot.
  explicit TcpProxy(int upstream_port);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const noexcept { return port_; }
  void set_mode(Mode mode, std::chrono::milliseconds delay = {}) noexcept;
  // Closes every open connection (both sides), like a reset.
  void drop_all() noexcept { drop_.store(true); }
  // New connections go to 127.0.0.1:`port` from now on (a failover).
  void set_upstream(int port) noexcept { upstream_port_.store(port); }

 private:
  void run();

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<int> upstream_port_{0};
  std::atomic<Mode> mode_{Mode::kPass};
  std::atomic<std::int64_t> delay_ms_{0};
  std::atomic<bool> drop_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace dlock::chaos

#endif  // DLOCK_TOOLS_CHAOS_TCP_PROXY_HPP_
