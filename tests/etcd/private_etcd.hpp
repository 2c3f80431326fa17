// A private etcd for one test (tests/servers/etcd.sh): one member or three,
// in a scratch directory of its own, so that a test may freeze, kill or
// reconfigure it without touching any other suite. Stopped (thawed first)
// and removed when dropped. DLOCK_SOURCE_DIR names the source tree.
#ifndef DLOCK_TESTS_ETCD_PRIVATE_ETCD_HPP_
#define DLOCK_TESTS_ETCD_PRIVATE_ETCD_HPP_

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#ifndef DLOCK_SOURCE_DIR
#error "DLOCK_SOURCE_DIR must name the source tree (tests/servers/etcd.sh)"
#endif

namespace dlock::testing {

class PrivateEtcd {
 public:
  // `members`: 1 or 3. `env`: variables for the members, e.g.
  // "ETCD_AUTH_TOKEN_TTL=2". `tls`: clients over TLS with certificates
  // (DLOCK_ETCD_TLS).
  explicit PrivateEtcd(int members = 1, const std::string& env = "", bool tls = false) {
    static int count = 0;
    dir_ = std::filesystem::temp_directory_path() /
           ("dlock-etcd-" + std::to_string(::getpid()) + "-" + std::to_string(++count));
    const std::string cmd = env + " DLOCK_ETCD_TLS=" + (tls ? "1 " : "0 ") + script() +
                            (members == 1 ? " start " : " start-cluster ") + dir_.string() + " >/dev/null 2>&1";
    ok_ = std::system(cmd.c_str()) == 0;
    if (!ok_) return;
    hosts_ = FirstLine(dir_ / "url").substr(7);
    if (auto q = hosts_.find('?'); q != std::string::npos) {
      tls_query_ = hosts_.substr(q + 1);
      hosts_.resize(q);
    }
    endpoints_ = FirstLine(dir_ / "endpoints");
    for (int i = 1; i <= members; ++i) {
      const auto mdir = members == 1 ? dir_ : dir_ / ("m" + std::to_string(i));
      pids_.push_back(std::stoi(FirstLine(mdir / "pid")));
      ports_.push_back(FirstLine(mdir / "port"));
    }
  }
  ~PrivateEtcd() {
    for (int pid : pids_) ::kill(pid, SIGCONT);
    (void)std::system((script() + " stop " + dir_.string() + " >/dev/null 2>&1").c_str());
  }
  PrivateEtcd(const PrivateEtcd&) = delete;
  PrivateEtcd& operator=(const PrivateEtcd&) = delete;

  bool ok() const { return ok_; }
  // "etcd://<every member>" + tail ("/prefix?ttl=3s").
  std::string url(const std::string& tail) const { return "etcd://" + hosts_ + tail; }
  // The same with user:password@.
  std::string url_as(const std::string& user_password, const std::string& tail) const {
    return "etcd://" + user_password + "@" + hosts_ + tail;
  }
  // With the client certificates: `path`, then the certificates and `query`.
  std::string tls_url(const std::string& path, const std::string& query) const {
    return "etcd://" + hosts_ + path + "?" + tls_query_ + "&" + query;
  }
  int pid(std::size_t member = 0) const { return pids_.at(member); }
  const std::string& port(std::size_t member) const { return ports_.at(member); }
  void signal(std::size_t member, int sig) const { ::kill(pids_.at(member), sig); }
  void freeze(std::size_t member = 0) const { signal(member, SIGSTOP); }
  void thaw(std::size_t member = 0) const { signal(member, SIGCONT); }
  // etcdctl ARGS on this server, bounded; true if it exited 0.
  bool ctl(const std::string& args) const {
    const std::string cmd =
        "ETCDCTL_API=3 timeout 10 etcdctl --endpoints=" + endpoints_ + " " + args + " >/dev/null 2>&1";
    return std::system(cmd.c_str()) == 0;
  }

 private:
  static std::string script() { return std::string(DLOCK_SOURCE_DIR) + "/tests/servers/etcd.sh"; }
  static std::string FirstLine(const std::filesystem::path& p) {
    std::ifstream in(p);
    std::string line;
    std::getline(in, line);
    return line;
  }

  std::filesystem::path dir_;
  std::string hosts_, tls_query_, endpoints_;
  std::vector<int> pids_;
  std::vector<std::string> ports_;
  bool ok_ = false;
};

}  // namespace dlock::testing

#endif  // DLOCK_TESTS_ETCD_PRIVATE_ETCD_HPP_
