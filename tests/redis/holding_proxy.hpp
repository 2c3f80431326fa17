// Test fixture: a TCP proxy on 127.0.0.1 in front of a redis-server, for
// faults that only the network can make:
//
//  - a request that is slow on the wire: HoldRequestsWith(marker) keeps the
//    bytes of every connection from the request that contains `marker` on,
//    and Release() delivers them, even if the client has given up and closed
//    its connection meanwhile (the server then runs the request late);
//  - a lost reply: HoldRepliesTo(marker) lets the request through but keeps
//    what the server answers, so the client times out after the server acted;
//  - a failover: SetUpstream(port) sends new connections to another server;
//  - a host that vanished without a word: HalfOpenSubscribers() turns every
//    connection that has sent a SUBSCRIBE into a half-open one: nothing
//    passes either way any more, and when the server closes its side the
//    client is not told (no FIN, as when the server's host lost power), so
//    the client learns only from its own timeouts.
//
// One thread, poll(2), non-blocking sockets; nothing outside the test is
// touched. Markers are plain substrings of the RESP bytes (a key, an owner
// label), so one connection of many can be picked.
#ifndef DLOCK_TESTS_REDIS_HOLDING_PROXY_HPP_
#define DLOCK_TESTS_REDIS_HOLDING_PROXY_HPP_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dlock::testing {

class HoldingProxy {
 public:
  explicit HoldingProxy(int upstream_port) : upstream_(upstream_port) {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    ::setsockopt(listen_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a = Loopback(0);
    socklen_t len = sizeof a;
    if (listen_ < 0 || ::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_, 64) != 0 ||
        ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      if (listen_ >= 0) ::close(listen_);
      throw std::runtime_error("holding proxy: cannot listen on 127.0.0.1");
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~HoldingProxy() {
    stop_.store(true);
    thread_.join();
    for (auto& c : conns_) CloseBoth(c);
    ::close(listen_);
  }
  HoldingProxy(const HoldingProxy&) = delete;
  HoldingProxy& operator=(const HoldingProxy&) = delete;

  int port() const { return port_; }
  // "redis://127.0.0.1:<port><suffix>"
  std::string url(const std::string& suffix = "") const {
    return "redis://127.0.0.1:" + std::to_string(port_) + suffix;
  }

  void HoldRequestsWith(std::string marker) {
    std::lock_guard<std::mutex> g(mu_);
    hold_requests_ = std::move(marker);
  }
  void HoldRepliesTo(std::string marker) {
    std::lock_guard<std::mutex> g(mu_);
    hold_replies_ = std::move(marker);
  }
  // Stops holding and delivers what was held (requests to the server, even
  // for clients that closed; replies to clients still there).
  void Release() {
    std::lock_guard<std::mutex> g(mu_);
    hold_requests_.clear();
    hold_replies_.clear();
    release_requests_ = release_replies_ = true;
  }
  // The same for held requests only; held replies stay held.
  void ReleaseRequests() {
    std::lock_guard<std::mutex> g(mu_);
    hold_requests_.clear();
    release_requests_ = true;
  }
  // See the file comment: a subscriber's connection goes silent, and stays
  // open on the client's side whatever the server does.
  void HalfOpenSubscribers() {
    std::lock_guard<std::mutex> g(mu_);
    half_open_asked_ = true;
  }
  // New connections go to `port`.
  void SetUpstream(int port) { upstream_.store(port); }
  // Closes every connection open now, both sides; returns once done.
  void CutAll() {
    std::unique_lock<std::mutex> lk(mu_);
    std::uint64_t mine = ++cuts_asked_;
    cv_.wait_for(lk, std::chrono::seconds(5), [&] { return cuts_done_ >= mine; });
  }

  // Connections holding requests now.
  int held_requests() const { return held_requests_.load(); }
  // Connections holding replies now.
  int held_replies() const { return held_replies_.load(); }
  // Connections whose held requests were delivered and answered since.
  int answered_after_release() const { return answered_.load(); }

 private:
  struct Conn {
    int client = -1;
    int server = -1;
    std::string up;    // client -> server, not yet written
    std::string down;  // server -> client, not yet written
    std::string tail;  // the last bytes the client sent, for markers split across reads
    bool hold_up = false;
    bool hold_down = false;
    bool released = false;     // its held requests were let go
    bool answered = false;     // and the server has answered since
    bool client_gone = false;  // the client closed; deliver what is held, then drain
    bool subscriber = false;   // it has sent a SUBSCRIBE
    bool half_open = false;    // HalfOpenSubscribers(): silent both ways, the client never told
  };

  static sockaddr_in Loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    return a;
  }
  static void CloseBoth(Conn& c) {
    if (c.client >= 0) ::close(c.client);
    if (c.server >= 0) ::close(c.server);
    c.client = c.server = -1;
  }
  // Writes what it can of `buf` to `fd`; false on a socket error.
  static bool Flush(int fd, std::string& buf) {
    while (!buf.empty()) {
      ssize_t n = ::send(fd, buf.data(), buf.size(), MSG_NOSIGNAL);
      if (n < 0) return errno == EAGAIN || errno == EINTR;
      buf.erase(0, static_cast<std::size_t>(n));
    }
    return true;
  }
  // Reads what `fd` has into `out`: 1 data, 0 end of stream, -1 nothing yet.
  static int Read(int fd, std::string& out) {
    char buf[16384];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.assign(buf, static_cast<std::size_t>(n));
      return 1;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return -1;
    return 0;
  }

  void Accept() {
    for (;;) {
      int cfd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (cfd < 0) return;
      int sfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in up = Loopback(upstream_.load());
      // Loopback: a blocking connect ends at once (refused while the server is down).
      if (sfd < 0 || ::connect(sfd, reinterpret_cast<sockaddr*>(&up), sizeof up) != 0) {
        if (sfd >= 0) ::close(sfd);
        ::close(cfd);
        continue;
      }
      ::fcntl(sfd, F_SETFL, ::fcntl(sfd, F_GETFL) | O_NONBLOCK);
      int one = 1;
      ::setsockopt(sfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      ::setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      Conn c;
      c.client = cfd;
      c.server = sfd;
      conns_.push_back(std::move(c));
    }
  }

  // Bytes from the client: look for the markers, then hold or forward.
  void FromClient(Conn& c, const std::string& data) {
    std::string hay = c.tail + data;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!hold_requests_.empty() && hay.find(hold_requests_) != std::string::npos) c.hold_up = true;
      if (!hold_replies_.empty() && hay.find(hold_replies_) != std::string::npos) c.hold_down = true;
    }
    if (hay.find("SUBSCRIBE") != std::string::npos) c.subscriber = true;
    c.tail = hay.substr(hay.size() > 256 ? hay.size() - 256 : 0);
    c.up += data;
  }

  void Run() {
    while (!stop_.load()) {
      bool release_requests = false, release_replies = false, half_open = false;
      {
        std::lock_guard<std::mutex> g(mu_);
        release_requests = std::exchange(release_requests_, false);
        release_replies = std::exchange(release_replies_, false);
        half_open = half_open_asked_;
        if (cuts_done_ < cuts_asked_) {
          for (auto& c : conns_) CloseBoth(c);
          conns_.clear();
          cuts_done_ = cuts_asked_;
          cv_.notify_all();
        }
      }
      for (auto& c : conns_) {
        if (release_requests && c.hold_up) {
          c.released = true;
          c.hold_up = false;
        }
        if (release_replies) c.hold_down = false;
        if (half_open && c.subscriber && !c.half_open) {
          c.half_open = true;
          c.up.clear();
          c.down.clear();
        }
      }
      std::vector<pollfd> fds;
      std::vector<Conn*> polled;
      fds.push_back({listen_, POLLIN, 0});
      for (auto& c : conns_) {
        polled.push_back(&c);
        short cev = c.client_gone ? 0 : POLLIN;
        if (!c.client_gone && !c.hold_down && !c.down.empty()) cev |= POLLOUT;
        short sev = POLLIN;
        if (!c.hold_up && !c.up.empty()) sev |= POLLOUT;
        fds.push_back({c.client_gone ? -1 : c.client, cev, 0});
        fds.push_back({c.server, sev, 0});
      }
      ::poll(fds.data(), fds.size(), 10);
      if (fds[0].revents & POLLIN) Accept();
      for (std::size_t k = 0; k < polled.size(); ++k) {
        Conn& c = *polled[k];
        const short cre = fds[1 + 2 * k].revents, sre = fds[2 + 2 * k].revents;
        bool dead = false;
        std::string data;
        if (c.half_open) {
          // Whatever comes is dropped; the server's close is not passed on.
          if (c.client >= 0 && (cre & (POLLIN | POLLHUP | POLLERR)) && Read(c.client, data) == 0) {
            ::close(c.client);
            c.client = -1;
            c.client_gone = true;
          }
          if (c.server >= 0 && (sre & (POLLIN | POLLHUP | POLLERR)) && Read(c.server, data) == 0) {
            ::close(c.server);
            c.server = -1;
          }
          if (c.client_gone) CloseBoth(c);
          continue;
        }
        if (!c.client_gone && (cre & (POLLIN | POLLHUP | POLLERR))) {
          int r = Read(c.client, data);
          if (r == 1) {
            FromClient(c, data);
          } else if (r == 0) {
            // The client gave up. What it sent and we hold still reaches the
            // server later (that is the point); otherwise we are done.
            ::close(c.client);
            c.client = -1;
            c.client_gone = true;
            if (!c.hold_up && c.up.empty() && !c.released) dead = true;
          }
        }
        if (!dead && (sre & (POLLIN | POLLHUP | POLLERR))) {
          int r = Read(c.server, data);
          if (r == 1) {
            if (c.released && !c.answered) {
              c.answered = true;
              answered_.fetch_add(1);
            }
            if (!c.client_gone) c.down += data;
          } else if (r == 0) {
            dead = true;
          }
        }
        if (!dead && !c.hold_up && !Flush(c.server, c.up)) dead = true;
        if (!dead && !c.client_gone && !c.hold_down && !Flush(c.client, c.down)) dead = true;
        if (dead) CloseBoth(c);
      }
      conns_.remove_if([](const Conn& c) { return c.server < 0 && !(c.half_open && !c.client_gone); });
      int up = 0, down = 0;
      for (const auto& c : conns_) {
        up += c.hold_up ? 1 : 0;
        down += c.hold_down ? 1 : 0;
      }
      held_requests_.store(up);
      held_replies_.store(down);
    }
  }

  int listen_ = -1;
  int port_ = 0;
  std::atomic<int> upstream_;
  std::atomic<bool> stop_{false};
  std::atomic<int> held_requests_{0};
  std::atomic<int> held_replies_{0};
  std::atomic<int> answered_{0};
  std::mutex mu_;
  std::string hold_requests_;      // guarded by mu_
  std::string hold_replies_;       // guarded by mu_
  bool release_requests_ = false;  // guarded by mu_
  bool release_replies_ = false;   // guarded by mu_
  std::uint64_t cuts_asked_ = 0;   // guarded by mu_
  std::uint64_t cuts_done_ = 0;    // guarded by mu_
  bool half_open_asked_ = false;   // guarded by mu_
  std::condition_variable cv_;
  std::list<Conn> conns_;  // the proxy thread's
  std::thread thread_;
};

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_REDIS_HOLDING_PROXY_HPP_
