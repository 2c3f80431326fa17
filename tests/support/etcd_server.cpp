#include "support/etcd_server.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <thread>

#include "support/loopback.hpp"
#include "support/tcp_proxy.hpp"

#ifndef DLOCK_SOURCE_DIR
#error "DLOCK_SOURCE_DIR must name the source tree (tests/servers/etcd.sh)"
#endif

namespace dlock::testing {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

bool EtcdCtl(const std::string& endpoints, const std::string& args, std::string* out, int timeout_s) {
  const std::string t = std::to_string(std::max(1, timeout_s));
  const std::string cmd = "ETCDCTL_API=3 timeout " + t + " etcdctl --endpoints=" + endpoints + " --dial-timeout=" + t +
                          "s --command-timeout=" + t + "s " + args + " 2>/dev/null";
  std::FILE* p = ::popen(cmd.c_str(), "re");
  if (!p) return false;
  std::string text;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
  const int status = ::pclose(p);
  if (out) *out = std::move(text);
  return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

EtcdServers::EtcdServers(Options options) : options_(std::move(options)) {
  if (options_.dir.empty()) {
    char tmpl[] = "/tmp/dlock-etcd-XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    dir_ = d ? d : "/tmp/dlock-etcd-fallback";
    own_dir_ = d != nullptr;
  } else {
    dir_ = options_.dir;
  }
  static int count = 0;
  token_ = "dlock-test-" + std::to_string(::getpid()) + "-" + std::to_string(++count);
  const int size = std::max(1, options_.size);
  for (int i = 0; i < size; ++i) members_.push_back({FreePort(), FreePort(), -1, false});
  for (std::size_t i = 0; i < members_.size(); ++i) {
    int advertised = members_[i].peer;
    if (options_.proxied_peers && members_.size() > 1) {
      peer_proxies_.push_back(std::make_unique<TcpProxy>(members_[i].peer));
      advertised = peer_proxies_.back()->port();
    }
    initial_cluster_ += (i ? ",m" : "m") + std::to_string(i + 1) + "=http://127.0.0.1:" + std::to_string(advertised);
  }
}

EtcdServers::~EtcdServers() {
  for (std::size_t i = 0; i < members_.size(); ++i) kill(i);
  peer_proxies_.clear();
  if (own_dir_) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
}

std::string EtcdServers::member_dir(std::size_t i) const { return dir_ + "/etcd" + std::to_string(i + 1); }

std::string EtcdServers::hosts() const {
  std::string out;
  for (const auto& m : members_) out += (out.empty() ? "127.0.0.1:" : ",127.0.0.1:") + std::to_string(m.client);
  return out;
}

std::string EtcdServers::endpoint(std::size_t i) const {
  return "http://127.0.0.1:" + std::to_string(members_[i].client);
}

std::string EtcdServers::endpoints() const {
  std::string out;
  for (std::size_t i = 0; i < members_.size(); ++i) out += (i ? "," : "") + endpoint(i);
  return out;
}

bool EtcdServers::start_all() {
  for (std::size_t i = 0; i < members_.size(); ++i) launch(i);
  for (std::size_t i = 0; i < members_.size(); ++i)
    if (!wait_serving(i)) return false;
  return true;
}

void EtcdServers::launch(std::size_t i) {
  if (members_[i].pid > 0) return;
  const std::string d = member_dir(i);
  std::error_code ec;
  fs::create_directories(d, ec);
  const auto& m = members_[i];
  std::string advertised = "http://127.0.0.1:" + std::to_string(m.peer);
  if (!peer_proxies_.empty()) advertised = "http://127.0.0.1:" + std::to_string(peer_proxies_[i]->port());
  members_[i].pid = Spawn(
      {"bash", std::string(DLOCK_SOURCE_DIR) + "/tests/servers/etcd.sh", "exec-member", d, "m" + std::to_string(i + 1),
       std::to_string(m.client), std::to_string(m.peer), initial_cluster_, token_, advertised},
      d + "/etcd.log");
  members_[i].frozen = false;
}

bool EtcdServers::wait_serving(std::size_t i) {
  const auto limit = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < limit) {
    if (members_[i].pid <= 0) return false;
    if (::waitpid(members_[i].pid, nullptr, WNOHANG) == members_[i].pid) {  // it exited
      members_[i].pid = -1;
      return false;
    }
    if (EtcdCtl(endpoint(i), "endpoint health", nullptr, 2)) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

void EtcdServers::kill(std::size_t i) {
  if (members_[i].pid <= 0) return;
  ::kill(members_[i].pid, SIGKILL);  // also ends a stopped process
  ::waitpid(members_[i].pid, nullptr, 0);
  members_[i].pid = -1;
  members_[i].frozen = false;
}

void EtcdServers::freeze(std::size_t i) {
  if (members_[i].pid <= 0) return;
  ::kill(members_[i].pid, SIGSTOP);
  members_[i].frozen = true;
}

void EtcdServers::thaw(std::size_t i) {
  if (members_[i].pid <= 0) return;
  ::kill(members_[i].pid, SIGCONT);
  members_[i].frozen = false;
}

void EtcdServers::isolate(bool on) {
  if (peer_proxies_.size() < 2) return;
  // The others dial member 0 at its proxy; member 0 dials them at theirs,
  // which tell its connections from the others' by their owner.
  peer_proxies_[0]->set_mode(on ? TcpProxy::Mode::kBlackHole : TcpProxy::Mode::kPass);
  for (std::size_t j = 1; j < peer_proxies_.size(); ++j) peer_proxies_[j]->black_hole_from(on ? members_[0].pid : 0);
}

namespace {

// Field `n` (0-based, trimmed) of member `endpoint`'s `etcdctl endpoint
// status -w simple`: endpoint, ID, version, db size, is leader, ...; "" if
// it does not answer.
std::string StatusField(const std::string& endpoint, int n) {
  std::string out;
  if (!EtcdCtl(endpoint, "endpoint status -w simple", &out, 2)) return "";
  std::istringstream fields(out);
  std::string field;
  for (int k = 0; k <= n; ++k)
    if (!std::getline(fields, field, ',')) return "";
  const auto b = field.find_first_not_of(" \n");
  const auto e = field.find_last_not_of(" \n");
  return b == std::string::npos ? "" : field.substr(b, e - b + 1);
}

}  // namespace

std::optional<std::size_t> EtcdServers::leader() const {
  for (std::size_t i = 0; i < members_.size(); ++i)
    if (members_[i].pid > 0 && !members_[i].frozen && StatusField(endpoint(i), 4) == "true") return i;
  return std::nullopt;
}

bool EtcdServers::make_leader(std::size_t i) {
  const auto current = leader();
  if (!current) return false;
  if (*current == i) return true;
  const std::string id = StatusField(endpoint(i), 1);
  if (id.empty() || !EtcdCtl(endpoint(*current), "move-leader " + id, nullptr, 5)) return false;
  for (int n = 0; n < 20; ++n) {
    if (leader() == i) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

}  // namespace dlock::testing
