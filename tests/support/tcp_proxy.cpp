#include "support/tcp_proxy.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <list>
#include <stdexcept>
#include <string>
#include <vector>

namespace dlock::testing {
namespace {

using SteadyClock = std::chrono::steady_clock;

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

struct Chunk {
  SteadyClock::time_point due;
  std::string bytes;
};

// One direction of a connection: bytes read from `from`, waiting for `to`.
struct Pipe {
  std::deque<Chunk> pending;
};

struct Conn {
  int client = -1;
  int server = -1;
  Pipe up;    // client -> server
  Pipe down;  // server -> client
  bool dead = false;
  int client_port = 0;  // the client end's port (loopback)
  pid_t checked = 0;    // the pid `from` was last looked up for
  bool from = false;    // the client end belongs to process `checked`
};

// Whether process `pid` owns the socket 127.0.0.1:`client_port` ->
// 127.0.0.1:`server_port` (the client end of a connection this proxy
// accepted): its inode from /proc/net/tcp, then /proc/PID/fd.
bool OwnedBy(pid_t pid, int client_port, int server_port) {
  std::FILE* f = std::fopen("/proc/net/tcp", "re");
  if (!f) return false;
  char line[512];
  unsigned long inode = 0;
  while (std::fgets(line, sizeof line, f)) {
    unsigned laddr = 0, lport = 0, raddr = 0, rport = 0;
    unsigned long ino = 0;
    if (std::sscanf(line, " %*d: %8X:%4X %8X:%4X %*X %*X:%*X %*X:%*X %*X %*u %*u %lu", &laddr, &lport, &raddr, &rport,
                    &ino) == 5 &&
        static_cast<int>(lport) == client_port && static_cast<int>(rport) == server_port && ino != 0) {
      inode = ino;
      break;
    }
  }
  std::fclose(f);
  if (inode == 0) return false;
  const std::string want = "socket:[" + std::to_string(inode) + "]";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code rec;
    if (std::filesystem::read_symlink(e.path(), rec).string() == want) return true;
  }
  return false;
}

int PeerPort(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return 0;
  return ntohs(a.sin_port);
}

// Reads what `from` has into `pipe`; false on EOF or error.
bool Pump(int from, Pipe& pipe, SteadyClock::time_point due) {
  char buf[16384];
  ssize_t n = ::read(from, buf, sizeof buf);
  if (n > 0) {
    pipe.pending.push_back({due, std::string(buf, static_cast<std::size_t>(n))});
    return true;
  }
  return n < 0 && (errno == EAGAIN || errno == EINTR);
}

// Writes the chunks that are due; false on error.
bool Flush(int to, Pipe& pipe, SteadyClock::time_point now) {
  while (!pipe.pending.empty() && pipe.pending.front().due <= now) {
    auto& c = pipe.pending.front();
    ssize_t n = ::send(to, c.bytes.data(), c.bytes.size(), MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    c.bytes.erase(0, static_cast<std::size_t>(n));
    if (!c.bytes.empty()) return true;
    pipe.pending.pop_front();
  }
  return true;
}

}  // namespace

TcpProxy::TcpProxy(int upstream_port, int listen_port) : upstream_port_(upstream_port) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a = Loopback(listen_port);
  socklen_t len = sizeof a;
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(listen_fd_, 128) != 0 || ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (listen_fd_ >= 0) ::close(listen_fd_);
    throw std::runtime_error("tcp proxy: cannot listen on 127.0.0.1:" + std::to_string(listen_port));
  }
  port_ = ntohs(a.sin_port);
  SetNonBlocking(listen_fd_);
  thread_ = std::thread([this] { run(); });
}

TcpProxy::~TcpProxy() {
  stop_.store(true);
  thread_.join();
  ::close(listen_fd_);
}

void TcpProxy::set_mode(Mode mode, std::chrono::milliseconds delay) noexcept {
  delay_ms_.store(delay.count());
  mode_.store(mode);
}

void TcpProxy::settle() const noexcept {
  // Two rounds begun after the call: the second read the mode after it.
  const std::uint64_t from = rounds_.load();
  const auto give_up = SteadyClock::now() + std::chrono::seconds(10);
  while (rounds_.load() < from + 2 && SteadyClock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void TcpProxy::run() {
  std::list<Conn> conns;
  auto close_conn = [](Conn& c) {
    if (c.client >= 0) ::close(c.client);
    if (c.server >= 0) ::close(c.server);
    c.client = c.server = -1;
    c.dead = true;
  };
  while (!stop_.load()) {
    rounds_.fetch_add(1);
    const Mode mode = mode_.load();
    const pid_t from = from_pid_.load();
    // Whether `c` is held (black-holed) this round.
    auto held = [&](Conn& c) {
      if (mode == Mode::kBlackHole) return true;
      if (from <= 0) return false;
      if (c.checked != from) {
        c.from = OwnedBy(from, c.client_port, port_);
        c.checked = from;
      }
      return c.from;
    };
    const auto now = SteadyClock::now();
    const auto due = now + std::chrono::milliseconds(mode == Mode::kDelay ? delay_ms_.load() : 0);
    if (drop_.exchange(false)) {
      for (auto& c : conns) close_conn(c);
    }
    std::vector<pollfd> fds;
    std::vector<Conn*> polled;  // in fds order; connections accepted below wait for the next round
    fds.push_back({listen_fd_, POLLIN, 0});
    for (auto& c : conns) {
      // A connection held through a partition never reached the server: it
      // ends with the partition.
      const bool flow = !held(c);
      if (c.server < 0 && flow) close_conn(c);
      if (c.dead) continue;
      polled.push_back(&c);
      // A black hole reads nothing (the kernel buffers fill, as on a partition).
      short cev = static_cast<short>(flow ? POLLIN : 0);
      short sev = cev;
      if (flow && !c.up.pending.empty() && c.up.pending.front().due <= now) sev |= POLLOUT;
      if (flow && !c.down.pending.empty() && c.down.pending.front().due <= now) cev |= POLLOUT;
      // Not polled at all in a black hole: a hang-up would wake poll at once,
      // again and again.
      fds.push_back({flow ? c.client : -1, cev, 0});
      fds.push_back({flow ? c.server : -1, sev, 0});
    }
    ::poll(fds.data(), fds.size(), 10);  // short: delayed chunks become due without an event
    const auto after = SteadyClock::now();
    if (fds[0].revents & POLLIN) {
      while (true) {
        int cfd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (cfd < 0) break;
        ++accepted_;
        Conn conn{cfd, -1, {}, {}, false, PeerPort(cfd), 0, false};
        if (held(conn)) {  // held, never connected upstream
          conns.push_back(std::move(conn));
          continue;
        }
        int sfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in up = Loopback(upstream_port_.load());
        // Loopback: a blocking connect ends at once (refused while the server is down).
        if (sfd < 0 || ::connect(sfd, reinterpret_cast<sockaddr*>(&up), sizeof up) != 0) {
          if (sfd >= 0) ::close(sfd);
          ::close(cfd);
          continue;
        }
        int one = 1;
        ::setsockopt(sfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        ::setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        SetNonBlocking(sfd);
        conn.server = sfd;
        conns.push_back(std::move(conn));
      }
    }
    for (std::size_t k = 0; k < polled.size(); ++k) {
      Conn& c = *polled[k];
      const short cre = fds[1 + 2 * k].revents, sre = fds[2 + 2 * k].revents;
      bool ok = true;
      if (fds[1 + 2 * k].fd >= 0) {  // not held
        if (cre & (POLLIN | POLLHUP | POLLERR)) ok = ok && Pump(c.client, c.up, due);
        if (sre & (POLLIN | POLLHUP | POLLERR)) ok = ok && Pump(c.server, c.down, due);
        ok = ok && Flush(c.server, c.up, after) && Flush(c.client, c.down, after);
      }
      if (!ok) close_conn(c);
    }
    conns.remove_if([](const Conn& c) { return c.dead; });
  }
  for (auto& c : conns) close_conn(c);
}

}  // namespace dlock::testing
