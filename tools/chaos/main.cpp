// dlock-chaos: runs worker processes that contend for one lock while faults
// are injected, records every hold in a ledger and checks it. See docs/chaos.md.
//
//   dlock-chaos run --store file|redis|zk|zk3 [--duration 60] [--workers 4] [--seed N] [--out DIR]
//   dlock-chaos check LEDGER           re-checks a ledger (without the orphan check)
//   dlock-chaos worker ...             (started by `run`)
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dlock/dlock.hpp"
#include "ledger.hpp"
#include "tcp_proxy.hpp"

namespace dlock::chaos {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::string Str(std::int64_t v) { return std::to_string(v); }

// Set by SIGINT/SIGTERM in the runner: end the run early, but clean up
// (workers, servers) and check what was recorded.
volatile std::sig_atomic_t g_interrupted = 0;

// ---------------------------------------------------------------- worker

struct WorkerArgs {
  std::string url, name, ledger;
  int slot = 0;
  int hold_max_ms = 50;
  int acquire_timeout_ms = 5000;
  std::uint64_t seed = 0;
};

int RunWorker(const WorkerArgs& a) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the runner
  // SIGUSR1 asks the worker to stop: a thread turns it into a stop request,
  // which also ends a pending acquire. Blocked before any dlock thread starts.
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
  std::stop_source stop;
  std::thread([stop, usr1]() mutable {  // a copy: shares the state, outlives this frame
    int sig = 0;
    sigwait(&usr1, &sig);
    stop.request_stop();
  }).detach();

  const int fd = ::open(a.ledger.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return 10;
  const std::string who = Str(a.slot) + " " + Str(::getpid()) + " ";
  std::mt19937_64 rng(a.seed ^ static_cast<std::uint64_t>(::getpid()));
  try {
    // The store may be down or cut off right now: keep trying, as an application would.
    std::optional<Client> client;
    while (!client && !stop.stop_requested()) {
      auto opened = Client::open(a.url);
      if (opened.ok()) client = std::move(*opened);
      else std::this_thread::sleep_for(100ms);
    }
    if (!client) return 0;
    Mutex mutex(*client, a.name);
    while (!stop.stop_requested()) {
      const std::int64_t begin = MonotonicNanos();
      AppendLine(fd, "B " + who + Str(begin) + "\n");
      std::optional<Hold> hold;
      std::string outcome = "ok";
      try {
        hold = mutex.acquire(std::chrono::milliseconds(a.acquire_timeout_ms), stop.get_token());
        if (!hold) outcome = stop.stop_requested() ? "cancelled" : "timeout";
      } catch (const Error& e) {
        outcome = "error:" + std::string(ErrorCodeName(e.code()));
      }
      const std::int64_t start = MonotonicNanos();
      AppendLine(fd, "W " + who + Str(begin) + " " + Str(start) + " " + outcome + "\n");
      if (!hold) {
        if (outcome.starts_with("error")) std::this_thread::sleep_for(50ms);  // the store is down: do not spin
        continue;
      }
      // When the holder is told; written only by the callback, read after release.
      auto uncertain = std::make_shared<std::atomic<std::int64_t>>(-1);
      auto lost = std::make_shared<std::atomic<std::int64_t>>(-1);
      auto sub = hold->on_state_change([uncertain, lost](HoldState s) {
        std::int64_t none = -1;
        if (s == HoldState::kUncertain) uncertain->compare_exchange_strong(none, MonotonicNanos());
        if (s == HoldState::kLost) lost->compare_exchange_strong(none, MonotonicNanos());
      });
      // A state change before the subscription is still visible in state().
      if (hold->state() == HoldState::kUncertain) {
        std::int64_t none = -1;
        uncertain->compare_exchange_strong(none, start);
      }
      if (hold->state() == HoldState::kLost) {
        std::int64_t none = -1;
        lost->compare_exchange_strong(none, start);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1 + rng() % static_cast<unsigned>(a.hold_max_ms)));
      const std::int64_t end = MonotonicNanos();
      const HoldState state = hold->state();
      const auto token = static_cast<std::int64_t>(hold->fencing_token());  // before release() empties the hold
      sub.reset();
      hold->release();
      AppendLine(fd, "H " + who + Str(token) + " " + Str(begin) + " " +
                         Str(start) + " " + Str(end) + " " + Str(uncertain->load()) + " " + Str(lost->load()) + " " +
                         std::string(HoldStateName(state)) + "\n");
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "dlock-chaos worker %d: %s\n", a.slot, e.what());
    return 13;
  }
  return 0;
}

// ---------------------------------------------------------------- runner

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = Loopback(0);
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// A socket connected to 127.0.0.1:`port` whose reads give up after
// `read_timeout_s`, or -1.
int ConnectLoopback(int port, int read_timeout_s) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a = Loopback(port);
  timeval tv{read_timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool RedisPing(int port) {
  int fd = ConnectLoopback(port, 1);
  if (fd < 0) return false;
  bool ok = false;
  if (::write(fd, "PING\r\n", 6) == 6) {
    char buf[16] = {};
    ok = ::read(fd, buf, sizeof buf - 1) >= 5 && std::string(buf).starts_with("+PONG");
  }
  ::close(fd);
  return ok;
}

// Starts `args`; it dies with the runner (PR_SET_PDEATHSIG), even if the
// runner crashes. With a `log`, stdout and stderr go there and it gets its
// own session (servers: a Ctrl-C to the runner's group does not reach them,
// and they do not hold the runner's output open).
// `block`: signals the child starts with blocked (kept across exec).
pid_t Spawn(const std::vector<std::string>& args, const std::string& log = "", const sigset_t* block = nullptr) {
  std::vector<char*> argv;
  for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  // The child: only async-signal-safe calls until exec.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);  // the runner is already gone
  if (block) ::sigprocmask(SIG_BLOCK, block, nullptr);
  if (!log.empty()) {
    ::setsid();
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
  }
  ::execvp(argv[0], argv.data());
  ::_exit(127);
}

// A ZooKeeper four-letter command's answer ("" if none).
std::string FourLetters(int port, const char* cmd) {
  int fd = ConnectLoopback(port, 2);
  if (fd < 0) return "";
  std::string out;
  if (::write(fd, cmd, 4) == 4) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

// ZooKeeper from Debian's jars, run with `java` directly: one standalone
// server or a three-server ensemble on loopback. Data persists in DIR, so a
// restarted server keeps its znodes and sessions (if back within the timeout).
class ZkCluster {
 public:
  ZkCluster(std::string dir, int size) : dir_(std::move(dir)) {
    for (int i = 0; i < size; ++i) servers_.push_back({FreePort(), FreePort(), FreePort(), -1});
    for (int i = 0; i < size; ++i) {
      const std::string d = dir_ + "/zk" + Str(i + 1);
      fs::create_directories(d + "/data");
      std::ofstream cfg(d + "/zoo.cfg");
      cfg << "tickTime=200\ninitLimit=100\nsyncLimit=10\ndataDir=" << d << "/data\nclientPort=" << servers_[i].client
          << "\nclientPortAddress=127.0.0.1\nmaxSessionTimeout=120000\nmaxClientCnxns=0\n"
          << "4lw.commands.whitelist=*\nadmin.enableServer=false\n";
      if (size > 1) {
        for (int j = 0; j < size; ++j)
          cfg << "server." << j + 1 << "=127.0.0.1:" << servers_[j].peer << ":" << servers_[j].election << "\n";
        std::ofstream(d + "/data/myid") << i + 1 << "\n";
      }
    }
  }
  ~ZkCluster() {
    for (std::size_t i = 0; i < servers_.size(); ++i) kill(i);
  }
  std::size_t size() const { return servers_.size(); }
  int client_port(std::size_t i) const { return servers_[i].client; }
  bool running(std::size_t i) const { return servers_[i].pid > 0; }

  bool start_all() {
    for (std::size_t i = 0; i < servers_.size(); ++i) launch(i);
    for (std::size_t i = 0; i < servers_.size(); ++i)
      if (!wait_serving(i)) return false;
    return true;
  }
  void launch(std::size_t i) {
    const std::string d = dir_ + "/zk" + Str(static_cast<std::int64_t>(i) + 1);
    const std::string jars = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar";
    servers_[i].pid = Spawn({"java", "-Xmx192m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                             "-Dzookeeper.jmx.log4j.disable=true", "-Dzookeeper.admin.enableServer=false",
                             "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", jars,
                             "org.apache.zookeeper.server.quorum.QuorumPeerMain", d + "/zoo.cfg"},
                            d + "/server.log");
  }
  // Until the server answers as standalone, leader or follower (60s at most: a cold JVM).
  bool wait_serving(std::size_t i) {
    for (int n = 0; n < 300; ++n) {
      const std::string srvr = FourLetters(servers_[i].client, "srvr");
      if (srvr.find("Mode: ") != std::string::npos) return true;
      std::this_thread::sleep_for(200ms);
    }
    return false;
  }
  void kill(std::size_t i) {
    if (servers_[i].pid <= 0) return;
    ::kill(servers_[i].pid, SIGKILL);
    ::waitpid(servers_[i].pid, nullptr, 0);
    servers_[i].pid = -1;
  }
  // The index of the server that says it leads, if any.
  std::optional<std::size_t> leader() const {
    for (std::size_t i = 0; i < servers_.size(); ++i)
      if (servers_[i].pid > 0 && FourLetters(servers_[i].client, "srvr").find("Mode: leader") != std::string::npos)
        return i;
    return std::nullopt;
  }

 private:
  struct Server {
    int client, peer, election;
    pid_t pid;
  };
  std::string dir_;
  std::vector<Server> servers_;
};

// A private redis-server without persistence: a restart loses every key.
class RedisServer {
 public:
  explicit RedisServer(std::string dir) : dir_(std::move(dir)), port_(FreePort()) {}
  ~RedisServer() { stop(); }
  int port() const { return port_; }
  bool start() {
    for (int attempt = 0; attempt < 100; ++attempt) {  // the port may linger a moment after a kill
      pid_ = Spawn({"redis-server", "--port", Str(port_), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                    "--dir", dir_, "--daemonize", "no", "--protected-mode", "no", "--logfile",
                    dir_ + "/redis.log"},
                   dir_ + "/redis.out");
      for (int i = 0; i < 100 && pid_ > 0; ++i) {
        if (RedisPing(port_)) return true;
        if (::waitpid(pid_, nullptr, WNOHANG) == pid_) { pid_ = -1; break; }
        std::this_thread::sleep_for(20ms);
      }
      stop();
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  bool running() const { return pid_ > 0; }

 private:
  std::string dir_;
  int port_;
  pid_t pid_ = -1;
};

struct RunArgs {
  std::string store = "file";
  std::string out;
  double duration_s = 60;
  int workers = 4;
  std::uint64_t seed = 0;
  int hold_max_ms = 50;
  int acquire_timeout_ms = 5000;
  int ttl_ms = 2000;  // redis session lease
  int fault_every_ms = 700;  // mean gap between faults
  std::vector<std::string> faults;  // empty: every kind the store supports
};

class Runner {
 public:
  Runner(RunArgs args, std::string self) : a_(std::move(args)), self_(std::move(self)), rng_(a_.seed) {}

  int run() {
    const bool scratch = a_.out.empty();
    if (scratch) {
      char tmpl[] = "/tmp/dlock-chaos-XXXXXX";
      if (!::mkdtemp(tmpl)) return 2;
      a_.out = tmpl;
    }
    const int status = run_in_out_dir();
    // A scratch directory is kept only when there is something to look at.
    if (scratch && status == 0) fs::remove_all(a_.out);
    else std::cerr << "dlock-chaos: ledger kept in " << ledger_ << "\n";
    return status;
  }

 private:
  int run_in_out_dir() {
    fs::create_directories(a_.out);
    ledger_ = a_.out + "/ledger";
    fs::remove(ledger_);
    fd_ = ::open(ledger_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ < 0) return 2;
    name_ = "chaos/lock";
    std::vector<std::string> kinds;
    if (a_.store == "file") {
      fs::remove_all(a_.out + "/store");
      fs::create_directories(a_.out + "/store");
      url_ = direct_url_ = "file://" + a_.out + "/store";
      kinds = {"kill", "stop"};
    } else if (a_.store == "redis") {
      redis_ = std::make_unique<RedisServer>(a_.out);
      if (!redis_->start()) {
        std::cerr << "dlock-chaos: redis-server did not start (see " << a_.out << "/redis.log)\n";
        return 2;
      }
      proxy_ = std::make_unique<TcpProxy>(redis_->port());
      const std::string q = "?ttl=" + Str(a_.ttl_ms) + "ms&connect_timeout=" + Str(a_.ttl_ms) + "ms";
      url_ = "redis://127.0.0.1:" + Str(proxy_->port()) + q;
      direct_url_ = "redis://127.0.0.1:" + Str(redis_->port()) + q;
      kinds = {"kill", "stop", "restart", "cut", "drop", "delay"};
    } else if (a_.store == "zk" || a_.store == "zk3") {
      zk_ = std::make_unique<ZkCluster>(a_.out, a_.store == "zk" ? 1 : 3);
      if (!zk_->start_all()) {
        std::cerr << "dlock-chaos: ZooKeeper did not start (see " << a_.out << "/zk*/server.log)\n";
        return 2;
      }
      std::string via, direct;
      for (std::size_t i = 0; i < zk_->size(); ++i) {
        zk_proxies_.push_back(std::make_unique<TcpProxy>(zk_->client_port(i)));
        via += (i ? ",127.0.0.1:" : "127.0.0.1:") + Str(zk_proxies_.back()->port());
        direct += (i ? ",127.0.0.1:" : "127.0.0.1:") + Str(zk_->client_port(i));
      }
      const std::string q = "?session_timeout=" + Str(a_.ttl_ms) + "ms&connect_timeout=" + Str(a_.ttl_ms) + "ms";
      url_ = "zk://" + via + q;
      direct_url_ = "zk://" + direct + q;
      kinds = {"kill", "stop", "restart", "cut", "drop", "delay"};
      if (zk_->size() > 1) kinds.push_back("leader");
    } else {
      std::cerr << "dlock-chaos: unknown store " << a_.store << " (file, redis, zk, zk3)\n";
      return 2;
    }
    if (!a_.faults.empty()) kinds = a_.faults;
    AppendLine(fd_, "C store=" + a_.store + " url=" + url_ + " workers=" + Str(a_.workers) +
                        " duration_s=" + Str(static_cast<std::int64_t>(a_.duration_s)) + " seed=" + Str(static_cast<std::int64_t>(a_.seed)) +
                        " acquire_timeout_ms=" + Str(a_.acquire_timeout_ms) + " hold_max_ms=" + Str(a_.hold_max_ms) +
                        " ttl_ms=" + Str(a_.store == "file" ? 0 : a_.ttl_ms) + "\n");
    std::cerr << "dlock-chaos: " << a_.store << " store at " << url_ << ", ledger " << ledger_ << "\n";

    for (int s = 0; s < a_.workers; ++s) spawn_worker(s);
    const auto t_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(a_.duration_s * 1000));
    auto next_fault = std::chrono::steady_clock::now() + gap();
    while (std::chrono::steady_clock::now() < t_end && !g_interrupted) {
      reap();
      run_due_actions(false);
      if (std::chrono::steady_clock::now() >= next_fault) {
        inject(kinds[rng_() % kinds.size()]);
        next_fault = std::chrono::steady_clock::now() + gap();
      }
      std::this_thread::sleep_for(10ms);
    }
    run_due_actions(true);  // end every fault still in progress
    const int stopped_ok = stop_workers();
    const std::int64_t orphans = count_orphans();
    if (redis_) redis_->stop();
    zk_proxies_.clear();
    zk_.reset();
    ::close(fd_);
    CheckOptions opts;
    opts.orphans = orphans;
    const int violations = CheckLedger(ledger_, opts, std::cout);
    return (violations == 0 && stopped_ok) ? 0 : 1;
  }

  using Action = std::pair<std::chrono::steady_clock::time_point, std::function<void()>>;

  std::chrono::milliseconds gap() {
    std::exponential_distribution<double> d(1.0 / a_.fault_every_ms);
    return std::chrono::milliseconds(50 + static_cast<std::int64_t>(d(rng_)));
  }
  std::chrono::milliseconds between(int lo_ms, int hi_ms) {
    return std::chrono::milliseconds(lo_ms + static_cast<int>(rng_() % static_cast<unsigned>(hi_ms - lo_ms + 1)));
  }

  void spawn_worker(int slot) {
    // SIGUSR1 ("stop") is blocked from birth: a worker spawned just before
    // the end of a run would otherwise die of it before its main() blocks it.
    sigset_t stop_signal;
    sigemptyset(&stop_signal);
    sigaddset(&stop_signal, SIGUSR1);
    pid_t pid = Spawn({self_, "worker", "--url", url_, "--name", name_, "--ledger", ledger_, "--slot", Str(slot),
                       "--hold-max-ms", Str(a_.hold_max_ms), "--acquire-timeout-ms", Str(a_.acquire_timeout_ms),
                       "--seed", Str(static_cast<std::int64_t>(rng_() >> 1))},
                      "", &stop_signal);
    if (pid > 0) workers_[pid] = slot;
  }

  // Collects workers that ended: a killed one is replaced; one that exited
  // on its own is a crash.
  // Waits only for workers: the servers are waited for by their own classes.
  pid_t wait_any_worker(int& status) {
    for (const auto& [pid, slot] : workers_)
      if (::waitpid(pid, &status, WNOHANG) == pid) return pid;
    return -1;
  }

  void reap() {
    int status = 0;
    pid_t pid;
    while ((pid = wait_any_worker(status)) > 0) {
      auto it = workers_.find(pid);
      const int slot = it->second;
      workers_.erase(it);
      if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && killed_by_us_.count(pid)))
        AppendLine(fd_, "D " + Str(pid) + " " + Str(status) + "\n");
      spawn_worker(slot);
    }
  }

  // The worker that holds the lock now, by the owner record in the store
  // (read directly, not through the proxy); -1 if unknown.
  pid_t holder() {
    if (!inspect_client_) {
      auto c = Client::open(direct_url_);
      if (!c.ok()) return -1;
      inspect_client_ = std::move(*c);
    }
    auto entries = Inspect(*inspect_client_, name_);
    if (!entries.ok()) return -1;
    for (const auto& e : *entries) {
      if (!e.holds || !e.entry.owner) continue;
      const auto pid = static_cast<pid_t>(e.entry.owner->pid);
      if (workers_.count(pid) && !stopped_.count(pid)) return pid;
    }
    return -1;
  }

  pid_t random_worker() {
    std::vector<pid_t> pids;
    for (auto& [pid, slot] : workers_)
      if (!stopped_.count(pid)) pids.push_back(pid);
    return pids.empty() ? -1 : pids[rng_() % pids.size()];
  }

  std::vector<TcpProxy*> proxies() {
    std::vector<TcpProxy*> out;
    if (proxy_) out.push_back(proxy_.get());
    for (auto& p : zk_proxies_) out.push_back(p.get());
    return out;
  }

  void later(std::chrono::milliseconds after, std::function<void()> fn) {
    actions_.push_back({std::chrono::steady_clock::now() + after, std::move(fn)});
  }
  void run_due_actions(bool all) {
    const auto now = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < actions_.size();) {
      if (all || actions_[i].first <= now) {
        auto fn = std::move(actions_[i].second);
        actions_.erase(actions_.begin() + static_cast<std::ptrdiff_t>(i));
        fn();
      } else {
        ++i;
      }
    }
  }

  void inject(const std::string& kind) {
    const std::int64_t t0 = MonotonicNanos();
    if (kind == "kill") {
      pid_t pid = random_worker();
      if (pid <= 0) return;
      killed_by_us_.insert(pid);
      ::kill(pid, SIGKILL);
      AppendLine(fd_, "F kill " + Str(pid) + " " + Str(t0) + " " + Str(t0) + "\n");
    } else if (kind == "stop") {
      // Half of the time the current holder: that is where a pause matters.
      pid_t pid = rng_() % 2 ? holder() : -1;
      if (pid <= 0) pid = random_worker();
      if (pid <= 0) return;
      // Longer than the session lease, so the store gives the lock away meanwhile.
      const int base = a_.store == "file" ? 1000 : a_.ttl_ms;
      ::kill(pid, SIGSTOP);
      stopped_.insert(pid);
      later(between(base * 3 / 2, base * 5 / 2), [this, pid, t0] {
        ::kill(pid, SIGCONT);
        stopped_.erase(pid);
        AppendLine(fd_, "F stop " + Str(pid) + " " + Str(t0) + " " + Str(MonotonicNanos()) + "\n");
      });
    } else if (kind == "restart" && redis_ && redis_->running()) {
      redis_->stop();
      later(between(0, 1500), [this, t0] {
        if (!redis_->start()) std::cerr << "dlock-chaos: redis-server did not restart\n";
        AppendLine(fd_, "F restart -1 " + Str(t0) + " " + Str(MonotonicNanos()) + "\n");
      });
    } else if (kind == "restart" && zk_ && zk_->size() == 1 && zk_->running(0)) {
      zk_->kill(0);
      later(between(0, 1500), [this, t0] {
        zk_->launch(0);
        if (!zk_->wait_serving(0)) std::cerr << "dlock-chaos: ZooKeeper did not restart\n";
        AppendLine(fd_, "F restart -1 " + Str(t0) + " " + Str(MonotonicNanos()) + "\n");
      });
    } else if ((kind == "restart" || kind == "leader") && zk_ && zk_->size() > 1 && !server_down_) {
      // One server at a time, so that a quorum stays possible.
      std::optional<std::size_t> victim = kind == "leader" ? zk_->leader() : std::optional<std::size_t>(rng_() % 3);
      if (!victim) return;
      server_down_ = true;
      zk_->kill(*victim);
      later(between(500, 3000), [this, kind, t0, i = *victim] {
        zk_->launch(i);
        if (!zk_->wait_serving(i)) std::cerr << "dlock-chaos: ZooKeeper server " << i << " did not restart\n";
        server_down_ = false;
        AppendLine(fd_, "F " + kind + " -1 " + Str(t0) + " " + Str(MonotonicNanos()) + "\n");
      });
    } else if ((kind == "cut" || kind == "delay") && !proxies().empty() && !network_fault_) {
      network_fault_ = true;
      const auto delay = between(20, a_.ttl_ms / 3);
      for (auto* p : proxies()) {
        if (kind == "cut") p->set_mode(TcpProxy::Mode::kBlackHole);
        else p->set_mode(TcpProxy::Mode::kDelay, delay);
      }
      // A cut sometimes outlasts the session (it is lost), sometimes not.
      const auto len = kind == "cut" ? between(a_.ttl_ms / 4, a_.ttl_ms * 2) : between(500, 3000);
      later(len, [this, kind, t0] {
        for (auto* p : proxies()) p->set_mode(TcpProxy::Mode::kPass);
        network_fault_ = false;
        AppendLine(fd_, "F " + kind + " -1 " + Str(t0) + " " + Str(MonotonicNanos()) + "\n");
      });
    } else if (kind == "drop" && !proxies().empty()) {
      for (auto* p : proxies()) p->drop_all();
      AppendLine(fd_, "F drop -1 " + Str(t0) + " " + Str(t0) + "\n");
    }
  }

  // Asks every worker to stop; a worker that does not exit within the
  // acquire timeout plus a margin is hung (a liveness failure).
  bool stop_workers() {
    for (auto& [pid, slot] : workers_) ::kill(pid, SIGUSR1);
    bool ok = true;
    const auto limit = std::chrono::steady_clock::now() + std::chrono::milliseconds(a_.acquire_timeout_ms) + 20s;
    while (!workers_.empty()) {
      int status = 0;
      pid_t pid = wait_any_worker(status);
      if (pid > 0) {
        const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && killed_by_us_.count(pid);
        if (workers_.erase(pid) && !killed && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
          AppendLine(fd_, "D " + Str(pid) + " " + Str(status) + "\n");
        continue;
      }
      if (std::chrono::steady_clock::now() > limit) {
        for (auto& [p, slot] : workers_) {
          AppendLine(fd_, "HUNG " + Str(p) + " " + Str(MonotonicNanos()) + "\n");
          ::kill(p, SIGKILL);
          ::waitpid(p, nullptr, 0);
        }
        workers_.clear();
        ok = false;
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    return ok;
  }

  // Entries left in the store once every worker is gone. Entries of killed
  // workers may stay until their session's lease runs out, so this waits for
  // a few leases before counting.
  std::int64_t count_orphans() {
    const auto limit = std::chrono::steady_clock::now() + std::chrono::milliseconds(a_.ttl_ms * 3) + 2s;
    std::int64_t n = -1;
    try {
      auto client = Client::connect(direct_url_);
      while (true) {
        auto entries = Inspect(client, name_);
        n = entries.ok() ? static_cast<std::int64_t>(entries->size()) : -1;
        if (n == 0 || std::chrono::steady_clock::now() > limit) break;
        std::this_thread::sleep_for(200ms);
      }
      if (n != 0 && !Inspect(client, name_).ok()) std::cerr << "dlock-chaos: cannot list the store\n";
    } catch (const Error& e) {
      std::cerr << "dlock-chaos: orphan check: " << e.what() << "\n";
    }
    if (a_.store == "file" && n == 0) {
      // Listing deletes dead entries; nothing but the layout's own files may remain.
      for (const auto& d : fs::directory_iterator(a_.out + "/store")) {
        if (!d.is_directory() || !d.path().filename().string().starts_with("q.")) continue;
        for (const auto& f : fs::directory_iterator(d.path())) {
          (void)f;
          ++n;
        }
      }
    }
    return n < 0 ? 1 : n;
  }

  RunArgs a_;
  std::string self_;
  std::mt19937_64 rng_;
  std::string ledger_, url_, direct_url_, name_;
  int fd_ = -1;
  std::unique_ptr<RedisServer> redis_;
  std::unique_ptr<TcpProxy> proxy_;
  std::unique_ptr<ZkCluster> zk_;
  std::vector<std::unique_ptr<TcpProxy>> zk_proxies_;
  bool network_fault_ = false;
  bool server_down_ = false;
  std::map<pid_t, int> workers_;
  std::set<pid_t> stopped_, killed_by_us_;
  std::vector<Action> actions_;
  std::optional<Client> inspect_client_;
};

std::string SelfPath(const char* argv0) {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(argv0) : p.string();
}

}  // namespace
}  // namespace dlock::chaos

int main(int argc, char** argv) {
  using namespace dlock::chaos;
  CLI::App app{"dlock-chaos: locks under injected faults, checked"};
  app.require_subcommand(1);

  RunArgs run;
  auto* run_cmd = app.add_subcommand("run", "start workers, inject faults, check the ledger");
  run_cmd->add_option("--store", run.store, "file, redis, zk (one server) or zk3 (a three-server ensemble)")->required();
  run_cmd->add_option("--duration", run.duration_s, "seconds");
  run_cmd->add_option("--workers", run.workers);
  run_cmd->add_option("--seed", run.seed);
  run_cmd->add_option("--out", run.out, "directory for the ledger and the store (default: a new /tmp dir)");
  run_cmd->add_option("--hold-max-ms", run.hold_max_ms);
  run_cmd->add_option("--acquire-timeout-ms", run.acquire_timeout_ms);
  run_cmd->add_option("--ttl-ms", run.ttl_ms, "redis session lease, zk session timeout");
  run_cmd->add_option("--fault-every-ms", run.fault_every_ms, "mean gap between faults");
  run_cmd->add_option("--faults", run.faults, "kinds to inject: kill stop restart cut drop delay leader")->delimiter(',');

  std::string ledger;
  auto* check_cmd = app.add_subcommand("check", "check a ledger");
  check_cmd->add_option("ledger", ledger)->required();

  WorkerArgs w;
  auto* worker_cmd = app.add_subcommand("worker", "one contender (started by run)");
  worker_cmd->add_option("--url", w.url)->required();
  worker_cmd->add_option("--name", w.name)->required();
  worker_cmd->add_option("--ledger", w.ledger)->required();
  worker_cmd->add_option("--slot", w.slot);
  worker_cmd->add_option("--hold-max-ms", w.hold_max_ms)->check(CLI::PositiveNumber);
  worker_cmd->add_option("--acquire-timeout-ms", w.acquire_timeout_ms);
  worker_cmd->add_option("--seed", w.seed);

  CLI11_PARSE(app, argc, argv);
  if (*worker_cmd) return RunWorker(w);
  if (*check_cmd) return CheckLedger(ledger, {}, std::cout) == 0 ? 0 : 1;
  if (run.seed == 0) run.seed = std::random_device{}();
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGINT, [](int) { g_interrupted = 1; });
  std::signal(SIGTERM, [](int) { g_interrupted = 1; });
  std::cerr << "dlock-chaos: seed " << run.seed << "\n";
  return Runner(run, SelfPath(argv[0])).run();
}
