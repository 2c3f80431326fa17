#include "support/zookeeper_server.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "support/loopback.hpp"
#include "support/tcp_proxy.hpp"

namespace dlock::testing {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::string ZooKeeperFourLetters(int port, const std::string& cmd) {
  int fd = ConnectLoopback(port, 2);
  if (fd < 0) return "";
  std::string out;
  if (::write(fd, cmd.data(), cmd.size()) == static_cast<ssize_t>(cmd.size())) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

ZooKeeperServers::ZooKeeperServers(Options options) : options_(std::move(options)) {
  if (options_.dir.empty()) {
    char tmpl[] = "/tmp/dlock-zk-XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    dir_ = d ? d : "/tmp/dlock-zk-fallback";
    own_dir_ = d != nullptr;
  } else {
    dir_ = options_.dir;
  }
  const int size = std::max(1, options_.size);
  for (int i = 0; i < size; ++i) servers_.push_back({FreePort(), FreePort(), FreePort(), -1});
  // via[i][j]: the (peer, election) ports server i dials to reach server j.
  std::vector<std::vector<std::pair<int, int>>> via(static_cast<std::size_t>(size));
  for (std::size_t i = 0; i < servers_.size(); ++i)
    for (std::size_t j = 0; j < servers_.size(); ++j) {
      const auto& to = servers_[j];
      std::pair<int, int> ports{to.peer, to.election};
      const bool proxied = options_.peer_links == Options::PeerLinks::kAllPairs ||
                           (options_.peer_links == Options::PeerLinks::kFirstServer && (i == 0 || j == 0));
      if (i != j && proxied) {
        links_.push_back({i, j, std::make_unique<TcpProxy>(to.peer)});
        ports.first = links_.back().proxy->port();
        links_.push_back({i, j, std::make_unique<TcpProxy>(to.election)});
        ports.second = links_.back().proxy->port();
      }
      via[i].push_back(ports);
    }
  const int tick = std::max(1, options_.tick_ms);
  const int sync_ticks = std::max(2, options_.sync_ms / tick);
  for (std::size_t i = 0; i < servers_.size(); ++i) {
    const std::string d = server_dir(i);
    std::error_code ec;
    fs::create_directories(d + "/data", ec);
    std::ofstream cfg(d + "/zoo.cfg");
    cfg << "tickTime=" << tick << "\ninitLimit=" << options_.init_limit << "\nsyncLimit=" << sync_ticks
        << "\ndataDir=" << d << "/data\nclientPort=" << servers_[i].client
        << "\nclientPortAddress=127.0.0.1\nmaxSessionTimeout=120000\nmaxClientCnxns=0\n"
        << "4lw.commands.whitelist=*\nadmin.enableServer=false\n";
    if (servers_.size() > 1) {
      for (std::size_t j = 0; j < servers_.size(); ++j)
        cfg << "server." << j + 1 << "=127.0.0.1:" << via[i][j].first << ":" << via[i][j].second << "\n";
      std::ofstream(d + "/data/myid") << i + 1 << "\n";
    }
  }
}

ZooKeeperServers::~ZooKeeperServers() {
  for (std::size_t i = 0; i < servers_.size(); ++i) kill(i);
  links_.clear();
  if (own_dir_) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
}

std::string ZooKeeperServers::server_dir(std::size_t i) const { return dir_ + "/zk" + std::to_string(i + 1); }

std::string ZooKeeperServers::hosts() const {
  std::string out;
  for (const auto& s : servers_) out += (out.empty() ? "127.0.0.1:" : ",127.0.0.1:") + std::to_string(s.client);
  return out;
}

bool ZooKeeperServers::start_all() {
  for (std::size_t i = 0; i < servers_.size(); ++i) launch(i);
  for (std::size_t i = 0; i < servers_.size(); ++i)
    if (!wait_serving(i)) return false;
  return true;
}

void ZooKeeperServers::launch(std::size_t i) {
  if (servers_[i].pid > 0) return;
  const std::string d = server_dir(i);
  // The jar's manifest names its dependencies; slf4j-simple gives it a logger.
  std::string jars = "/usr/share/java/zookeeper.jar";
  if (fs::exists("/usr/share/java/slf4j-simple.jar")) jars += ":/usr/share/java/slf4j-simple.jar";
  std::vector<std::string> args = {"java",
                                   "-Xmx" + options_.heap,
                                   "-XX:+UseSerialGC",
                                   "-XX:TieredStopAtLevel=1",
                                   "-Dzookeeper.jmx.log4j.disable=true",
                                   "-Dzookeeper.admin.enableServer=false",
                                   "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn"};
  args.insert(args.end(), options_.jvm_properties.begin(), options_.jvm_properties.end());
  // QuorumPeerMain runs a standalone server itself when zoo.cfg names no peers.
  args.insert(args.end(), {"-cp", jars, "org.apache.zookeeper.server.quorum.QuorumPeerMain", d + "/zoo.cfg"});
  servers_[i].pid = Spawn(args, d + "/server.log");
}

bool ZooKeeperServers::wait_serving(std::size_t i) {
  for (int n = 0; n < 300; ++n) {
    if (servers_[i].pid <= 0) return false;
    if (ZooKeeperFourLetters(servers_[i].client, "srvr").find("Mode: ") != std::string::npos) return true;
    if (::waitpid(servers_[i].pid, nullptr, WNOHANG) == servers_[i].pid) {  // it exited
      servers_[i].pid = -1;
      return false;
    }
    std::this_thread::sleep_for(200ms);
  }
  return false;
}

void ZooKeeperServers::kill(std::size_t i) {
  if (servers_[i].pid <= 0) return;
  ::kill(servers_[i].pid, SIGKILL);  // also ends a stopped process
  ::waitpid(servers_[i].pid, nullptr, 0);
  servers_[i].pid = -1;
}

void ZooKeeperServers::freeze(std::size_t i) {
  if (servers_[i].pid > 0) ::kill(servers_[i].pid, SIGSTOP);
}

void ZooKeeperServers::thaw(std::size_t i) {
  if (servers_[i].pid > 0) ::kill(servers_[i].pid, SIGCONT);
}

void ZooKeeperServers::cut(std::size_t a, std::size_t b, bool on) {
  for (auto& l : links_)
    if ((l.from == a && l.to == b) || (l.from == b && l.to == a))
      l.proxy->set_mode(on ? TcpProxy::Mode::kBlackHole : TcpProxy::Mode::kPass);
}

void ZooKeeperServers::isolate(bool on) {
  for (std::size_t i = 1; i < servers_.size(); ++i) cut(0, i, on);
}

std::optional<std::size_t> ZooKeeperServers::leader() const {
  for (std::size_t i = 0; i < servers_.size(); ++i)
    if (servers_[i].pid > 0 &&
        ZooKeeperFourLetters(servers_[i].client, "srvr").find("Mode: leader") != std::string::npos)
      return i;
  return std::nullopt;
}

}  // namespace dlock::testing
