// Hostile values: names and URLs no one should pass, and servers that answer
// garbage or hang up mid-reply. Each must end in a clear error (an ErrorCode
// and a message), within a bound, and leave nothing behind in the store.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <ostream>
#include <string>
#include <thread>

#include "dlock/dlock.hpp"

namespace dlock {
namespace {

using namespace std::chrono_literals;

class ScratchDir {
 public:
  ScratchDir() {
    char tmpl[] = "/tmp/dlock-hostile-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  // Every file below the directory, except the layout's own (.counter, .wake).
  std::size_t files() const {
    std::size_t n = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(path_)) {
      const std::string rel = std::filesystem::relative(e.path(), path_).string();
      if (e.is_regular_file() && rel != ".counter" && !rel.starts_with(".wake")) ++n;
    }
    return n;
  }

 private:
  std::string path_;
};

TEST(HostileNames, AreRefusedWithANamedReasonAndLeaveNothing) {
  ScratchDir dir;
  auto client = Client::connect("file://" + dir.path());
  const std::string names[] = {"..",
                               "a/../b",
                               "../../etc/passwd",
                               std::string("a\0b", 3),
                               "",
                               "/abs",
                               "a//b",
                               "a/",
                               ".",
                               "a/./b",
                               "sp ace",
                               "nl\n",
                               "é",
                               std::string(1 << 20, 'a'),
                               std::string(513, 'a'),
                               "a\\b"};
  for (const auto& name : names) {
    try {
      Mutex m(client, name);
      ADD_FAILURE() << "accepted a hostile name of " << name.size() << " bytes";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_FALSE(e.status().message().empty());
      EXPECT_LT(e.status().message().size(), 2000u) << "the error echoes a huge name";
    }
    EXPECT_EQ(client.list_entries(name).status().code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_EQ(dir.files(), 0u);
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/etc"));
}

TEST(HostileUrls, AreRefusedWithANamedReason) {
  const std::string urls[] = {"gopher://x",
                              "redis://127.0.0.1:65536",
                              "redis://127.0.0.1:-1",
                              "redis://127.0.0.1:99999999999999999999",
                              "zk://127.0.0.1:0x10",
                              "redis://127.0.0.1:6379?ttl=-5s",
                              "redis://127.0.0.1:6379?nonsense=1",
                              std::string("file:///tmp/a\0b", 15),
                              "",
                              "://",
                              "redis://" + std::string(1 << 20, 'h') + ":1"};
  for (const auto& url : urls) {
    auto c = Client::open(url);
    ASSERT_FALSE(c.ok()) << "accepted " << url.substr(0, 80);
    EXPECT_EQ(c.status().code(), ErrorCode::kInvalidArgument) << url.substr(0, 80) << ": " << c.status().to_string();
    EXPECT_FALSE(c.status().message().empty());
    EXPECT_LT(c.status().message().size(), 4000u) << "the error echoes a huge URL";
  }
}

// A TCP server on loopback that answers every connection with `reply` and
// then, if `hang_up`, closes it.
class BadServer {
 public:
  BadServer(std::string reply, bool hang_up) : reply_(std::move(reply)), hang_up_(hang_up) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd_, 64);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~BadServer() {
    stop_ = true;
    thread_.join();
    for (int c : clients_) ::close(c);
    ::close(fd_);
  }
  int port() const { return port_; }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      char buf[512];
      pollfd q{c, POLLIN, 0};
      if (::poll(&q, 1, 500) > 0) (void)::read(c, buf, sizeof buf);  // the client speaks first
      (void)::send(c, reply_.data(), reply_.size(), MSG_NOSIGNAL);
      if (hang_up_)
        ::close(c);
      else
        clients_.push_back(c);
    }
  }
  std::string reply_;
  bool hang_up_;
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::vector<int> clients_;
  std::thread thread_;
};

struct Garbage {
  const char* label;
  std::string reply;
  bool hang_up;
  const char* redis_says = "";  // what the error of a redis:// client must mention
};

// Test names show the label, not the bytes.
void PrintTo(const Garbage& g, std::ostream* os) { *os << g.label; }

class GarbageServerTest : public ::testing::TestWithParam<std::tuple<std::string, Garbage>> {};

TEST_P(GarbageServerTest, GivesAClearErrorInBoundedTime) {
  const auto& [scheme, g] = GetParam();
  if (scheme == "redis" || scheme == "zk") {
    const auto schemes = SupportedSchemes();
    if (std::find(schemes.begin(), schemes.end(), scheme) == schemes.end()) GTEST_SKIP() << scheme << " not built";
  }
  BadServer server(g.reply, g.hang_up);
  const std::string q = scheme == "redis" ? "?connect_timeout=2s&ttl=2s" : "?connect_timeout=2s&session_timeout=2s";
  const std::string url = scheme + "://127.0.0.1:" + std::to_string(server.port()) + q;
  const auto t0 = std::chrono::steady_clock::now();
  Status status;
  auto client = Client::open(url);
  if (!client.ok()) {
    status = client.status();
  } else {
    try {
      Mutex m(*client, "hostile/garbage");
      auto hold = m.acquire(3s);
      if (hold) ADD_FAILURE() << "acquired a lock from a server that answers " << g.label;
      status = DeadlineExceededError("timed out");
    } catch (const Error& e) {
      status = e.status();
    }
  }
  EXPECT_FALSE(status.ok());
  EXPECT_FALSE(status.message().empty());
  EXPECT_NE(status.code(), ErrorCode::kInternal) << status.to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s) << status.to_string();
  if (scheme == "redis" && *g.redis_says) {
    EXPECT_THAT(status.message(), ::testing::HasSubstr(g.redis_says));
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, GarbageServerTest,
    ::testing::Combine(
        ::testing::Values("redis", "zk"),
        ::testing::Values(Garbage{"Text", "HTTP/1.1 400 Bad Request\r\n\r\n", true}, Garbage{"HalfReply", "+PO", true},
                          Garbage{"BinaryNoise", std::string("\x00\xff\x13\x37\x00\x00\x00\x10zz", 10), false},
                          Garbage{"HugeLength", "$999999999999\r\n", false},
                          // hiredis would allocate 16 GB for the element table
                          Garbage{"HugeArray", "*2000000000\r\n", false, "reply too large"},
                          Garbage{"Nothing", "", false})),
    [](const auto& p) { return std::get<0>(p.param) + "_" + std::get<1>(p.param).label; });

}  // namespace
}  // namespace dlock
