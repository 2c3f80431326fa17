// dlock-chaos: runs worker processes that contend for one lock while faults
// are injected, records every hold in a ledger and checks it. See docs/chaos.md.
//
//   dlock-chaos run --store file|redis|zk|zk3|etcd|etcd3 [--duration 60] [--workers 4] [--seed N] [--out DIR]
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
#include <cctype>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dlock/dlock.hpp"
#include "ledger.hpp"
#include "support/etcd_server.hpp"
#include "support/loopback.hpp"
#include "support/redis_server.hpp"
#include "support/tcp_proxy.hpp"
#include "support/zookeeper_server.hpp"

namespace dlock::chaos {
namespace {

using namespace std::chrono_literals;
using testing::ConnectLoopback;
using testing::Loopback;
using testing::Spawn;
using testing::TcpProxy;
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
  int threads = 1;
  std::vector<std::string> recipes = {"mutex"};
};

// The lock name each recipe uses: its own, so that the checker compares
// holds of one lock (a Mutex and a ReadWriteLock on one name would exclude
// each other too, a SemaphoreMutex would not).
std::string LockName(const std::string& base, const std::string& recipe) {
  return recipe == "mutex" ? base : base + "-" + (recipe == "semaphore" ? "sem" : recipe);
}

// One contender thread. `acquire(mode)` returns a hold or nothing; the thread
// writes B/W/H lines (ledger.hpp). While it holds, it samples the hold
// (state() and lost_token()) before each simulated write: at the start, every
// 5 ms or so and at the end; the H line says when it last saw kHeld.
void ContendLoop(const WorkerArgs& a, int fd, int thread, const std::string& lock, std::stop_source stop,
                 std::uint64_t seed, const std::function<std::optional<Hold>(bool write, std::stop_token)>& acquire,
                 bool has_modes) {
  const std::string who = Str(a.slot) + " " + Str(::getpid()) + " ";
  const std::string tail = " " + Str(thread) + " " + lock;
  std::mt19937_64 rng(seed);
  while (!stop.stop_requested()) {
    const bool write = !has_modes || rng() % 2 == 0;
    const std::int64_t begin = MonotonicNanos();
    AppendLine(fd, "B " + who + Str(begin) + tail + "\n");
    std::optional<Hold> hold;
    std::string outcome = "ok";
    try {
      hold = acquire(write, stop.get_token());
      if (!hold) outcome = stop.stop_requested() ? "cancelled" : "timeout";
    } catch (const Error& e) {
      outcome = "error:" + std::string(ErrorCodeName(e.code()));
    }
    const std::int64_t start = MonotonicNanos();
    AppendLine(fd, "W " + who + Str(begin) + " " + Str(start) + " " + outcome + tail + "\n");
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
    const std::stop_token lost_token = hold->lost_token();
    std::int64_t last_held = -1;  // when a sample last began that saw kHeld
    auto sample = [&] {
      const std::int64_t t = MonotonicNanos();
      const HoldState st = hold->state();
      const bool stopped = lost_token.stop_requested();
      std::int64_t none = -1;
      if (st == HoldState::kUncertain) uncertain->compare_exchange_strong(none, t);
      none = -1;
      if (st == HoldState::kLost) lost->compare_exchange_strong(none, t);
      if (st == HoldState::kHeld && !stopped) last_held = t;
      return st;
    };
    sample();  // before the first write
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(1 + rng() % static_cast<unsigned>(a.hold_max_ms));
    while (true) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= until) break;
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(until - now, 5ms));
      sample();
    }
    const HoldState state = sample();  // before the last write
    const std::int64_t end = MonotonicNanos();
    const auto token = static_cast<std::int64_t>(hold->fencing_token());  // before release() empties the hold
    sub.reset();
    hold->release();
    AppendLine(fd, "H " + who + Str(token) + " " + Str(begin) + " " + Str(start) + " " + Str(end) + " " +
                       Str(uncertain->load()) + " " + Str(lost->load()) + " " + std::string(HoldStateName(state)) +
                       " " + Str(last_held) + " " + lock + " " + (has_modes ? (write ? "w" : "r") : "x") + " " +
                       Str(thread) + "\n");
  }
}

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
  })
      .detach();

  const int fd = ::open(a.ledger.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return 10;
  std::mt19937_64 rng(a.seed ^ static_cast<std::uint64_t>(::getpid()));
  std::atomic<bool> failed{false};
  try {
    // The store may be down or cut off right now: keep trying, as an application would.
    std::optional<Client> client;
    while (!client && !stop.stop_requested()) {
      auto opened = Client::open(a.url);
      if (opened.ok())
        client = std::move(*opened);
      else
        std::this_thread::sleep_for(100ms);
    }
    if (!client) return 0;
    // One handle of each recipe, shared by every thread of this process.
    const auto timeout = std::chrono::milliseconds(a.acquire_timeout_ms);
    std::optional<Mutex> mutex;
    std::optional<SemaphoreMutex> sem;
    std::optional<ReadWriteLock> rw;
    for (const auto& r : a.recipes) {
      if (r == "mutex")
        mutex.emplace(*client, LockName(a.name, r));
      else if (r == "semaphore")
        sem.emplace(*client, LockName(a.name, r));
      else if (r == "rw")
        rw.emplace(*client, LockName(a.name, r));
      else
        throw Error(InvalidArgumentError("unknown recipe " + r));
    }
    std::vector<std::thread> threads;
    for (int t = 0; t < std::max(1, a.threads); ++t) {
      const std::string recipe = a.recipes[static_cast<std::size_t>(t) % a.recipes.size()];
      std::function<std::optional<Hold>(bool, std::stop_token)> acquire;
      if (recipe == "mutex")
        acquire = [&](bool, std::stop_token st) { return mutex->acquire(timeout, st); };
      else if (recipe == "semaphore")
        acquire = [&](bool, std::stop_token st) { return sem->acquire(timeout, st); };
      else
        acquire = [&](bool w, std::stop_token st) {
          return w ? rw->acquire_write(timeout, st) : rw->acquire_read(timeout, st);
        };
      threads.emplace_back([&, t, recipe, acquire, seed = rng()] {
        try {
          ContendLoop(a, fd, t, LockName(a.name, recipe), stop, seed, acquire, recipe == "rw");
        } catch (const std::exception& e) {
          std::fprintf(stderr, "dlock-chaos worker %d thread %d: %s\n", a.slot, t, e.what());
          failed = true;
          stop.request_stop();
        }
      });
    }
    for (auto& t : threads) t.join();
  } catch (const Error& e) {
    std::fprintf(stderr, "dlock-chaos worker %d: %s\n", a.slot, e.what());
    return 13;
  }
  return failed ? 13 : 0;
}

// ---------------------------------------------------------------- runner

// ZooKeeper: tests/support/zookeeper_server.hpp (shared with the tests), from
// Debian's jars, run with `java` directly: one standalone server or a
// three-server ensemble on loopback whose server 1 reaches the others through
// proxies (isolate()). Data persists in DIR/zk<N>, so a restarted server keeps
// its znodes and sessions (if back within the timeout).
using ZkCluster = testing::ZooKeeperServers;

std::unique_ptr<ZkCluster> MakeZkCluster(const std::string& dir, int size, int sync_ms) {
  ZkCluster::Options o;
  o.size = size;
  o.dir = dir;
  o.sync_ms = sync_ms;  // syncLimit x tickTime (200 ms)
  o.peer_links = ZkCluster::Options::PeerLinks::kFirstServer;
  return std::make_unique<ZkCluster>(o);
}

// etcd: tests/support/etcd_server.hpp (shared with the tests), Debian's etcd
// started as tests/servers/etcd.sh starts it: one member or three on
// loopback whose peer links go through proxies (isolate() cuts member 0
// off). Data persists in DIR/etcd<N>, so a restarted member keeps its keys
// and leases.
using EtcdCluster = testing::EtcdServers;

// A Redis command's raw reply ("" if none): `cmd` is sent inline.
std::string RedisCommand(int port, const std::string& cmd) {
  int fd = ConnectLoopback(port, 1);
  if (fd < 0) return "";
  std::string out;
  const std::string line = cmd + "\r\n";
  if (::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size())) {
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) out.assign(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

// The redis-servers: tests/support/redis_server.hpp (shared with the tests).
// Persistence "none", "rdb" or "aof"; a restart loads what the directory holds.
using RedisServer = testing::RedisServerProcess;

RedisServer::Options RedisOptions(const std::string& persist, const std::string& dir) {
  RedisServer::Options o;
  o.persist = persist;
  o.dir = dir;
  return o;
}

// ---------------------------------------------------------------- watchdog

// What the process `pid`'s threads are blocked in, from /proc: per thread its
// state, wchan and system call (x86-64 numbers named; a file descriptor
// argument resolved to its path), e.g. "15154/15154 T do_signal_stop" or
// "15149/15149 S locks_lock_inode_wait flock(/tmp/x/store/.counter)".
std::string DescribeThreads(pid_t pid) {
  auto slurp = [](const std::string& path) {
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    std::string out = s.str();
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
  };
  std::string out;
  std::error_code ec;
  const std::string base = "/proc/" + Str(pid);
  for (const auto& t : fs::directory_iterator(base + "/task", ec)) {
    const std::string tdir = t.path().string();
    std::string state = "?";
    {
      std::ifstream st(tdir + "/stat");
      std::string all((std::istreambuf_iterator<char>(st)), std::istreambuf_iterator<char>());
      auto close = all.rfind(')');
      if (close != std::string::npos && close + 2 < all.size()) state = all.substr(close + 2, 1);
    }
    std::string line =
        "    " + Str(pid) + "/" + t.path().filename().string() + " " + state + " " + slurp(tdir + "/wchan");
    std::istringstream sc(slurp(tdir + "/syscall"));
    std::string nr_text;
    sc >> nr_text;
    if (!nr_text.empty() && nr_text != "running" && std::isdigit(static_cast<unsigned char>(nr_text[0]))) {
      const long nr = std::stol(nr_text);
      std::string arg0;
      sc >> arg0;
      std::string name = "syscall " + nr_text;
#if defined(__x86_64__)
      static const std::map<long, std::string> names = {{0, "read"},
                                                        {1, "write"},
                                                        {7, "poll"},
                                                        {23, "select"},
                                                        {35, "nanosleep"},
                                                        {42, "connect"},
                                                        {43, "accept"},
                                                        {61, "wait4"},
                                                        {72, "fcntl"},
                                                        {73, "flock"},
                                                        {128, "rt_sigtimedwait"},
                                                        {202, "futex"},
                                                        {230, "clock_nanosleep"},
                                                        {232, "epoll_wait"},
                                                        {247, "waitid"},
                                                        {270, "pselect6"},
                                                        {271, "ppoll"},
                                                        {281, "epoll_pwait"}};
      if (auto it = names.find(nr); it != names.end()) name = it->second;
      if (nr == 0 || nr == 1 || nr == 42 || nr == 43 || nr == 72 || nr == 73) {  // the first argument is an fd
        const long fd = std::stol(arg0, nullptr, 16);
        std::string target = fs::read_symlink(base + "/fd/" + Str(fd), ec).string();
        name += "(" + (target.empty() ? "fd " + Str(fd) : target) + ")";
      }
#endif
      line += " " + name;
    }
    out += line + "\n";
  }
  return out.empty() ? "    (no such process)\n" : out;
}

// The last ledger line of `pid` (what the worker last said it was doing).
std::string LastLedgerLine(const std::string& ledger, pid_t pid) {
  std::ifstream in(ledger);
  std::string last;
  const std::string needle = " " + Str(pid) + " ";
  for (std::string line; std::getline(in, line);)
    if ((line.starts_with("B ") || line.starts_with("W ") || line.starts_with("H ") || line.starts_with("O ")) &&
        line.find(needle) != std::string::npos)
      last = line;
  return last.empty() ? "(none)" : last;
}

// A thread of its own that the runner's main thread cannot block:
//  - it owns every SIGSTOP: a stopped worker is continued when its time is up,
//    whatever the main thread is doing (the main thread once blocked in a
//    file-store listing on the counter lock a stopped worker held, and the
//    SIGCONT that would have freed it was the main thread's own next step);
//  - the main thread declares what it is doing and for how long at most
//    (`Doing`); past that, or past the run's overall bound, the watchdog
//    writes a diagnosis (the runner's and every worker's threads from /proc,
//    the stopped workers, their last ledger lines), kills the workers and
//    fails the run; if the main thread is still stuck after that, it ends
//    the process (servers die with it: PR_SET_PDEATHSIG).
class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  Watchdog(int ledger_fd, std::string ledger, std::string report, Clock::duration overall)
      : fd_(ledger_fd), ledger_(std::move(ledger)), report_(std::move(report)), deadline_(Clock::now() + overall) {
    thread_ = std::thread([this] { loop(); });
  }
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // The main thread says what it does next and how long that may take.
  class Doing {
   public:
    Doing(Watchdog& w, std::string what, Clock::duration bound) : w_(w) {
      std::lock_guard lock(w_.mu_);
      saved_ = {w_.doing_, w_.doing_since_, w_.doing_until_};
      w_.doing_ = std::move(what);
      w_.doing_since_ = Clock::now();
      w_.doing_until_ = w_.doing_since_ + bound;
    }
    ~Doing() {
      std::lock_guard lock(w_.mu_);
      std::tie(w_.doing_, w_.doing_since_, w_.doing_until_) = saved_;
      // The outer activity's clock restarts: its bound is per step.
      w_.doing_since_ = Clock::now();
      w_.doing_until_ = w_.doing_since_ + (std::get<2>(saved_) - std::get<1>(saved_));
    }
    Doing(const Doing&) = delete;
    Doing& operator=(const Doing&) = delete;

   private:
    Watchdog& w_;
    std::tuple<std::string, Clock::time_point, Clock::time_point> saved_;
  };

  void add_worker(pid_t pid, int slot) {
    std::lock_guard lock(mu_);
    workers_[pid] = slot;
  }
  // waitpid(WNOHANG) for one of the workers, under the lock that signals are
  // sent under, so that no signal goes to a reaped (and maybe reused) pid. A
  // worker that died while stopped gets its "F stop" line here.
  pid_t reap_any(int& status) {
    std::lock_guard lock(mu_);
    for (auto it = workers_.begin(); it != workers_.end(); ++it) {
      const pid_t pid = it->first;
      if (::waitpid(pid, &status, WNOHANG) != pid) continue;
      workers_.erase(it);
      if (auto s = stops_.find(pid); s != stops_.end()) {
        AppendLine(fd_, "F stop " + Str(pid) + " " + Str(s->second.t0) + " " + Str(MonotonicNanos()) + "\n");
        stops_.erase(s);
      }
      return pid;
    }
    return -1;
  }
  // SIGKILL under the same lock (the pid is not reaped yet).
  void kill_worker(pid_t pid) {
    std::lock_guard lock(mu_);
    if (workers_.count(pid)) ::kill(pid, SIGKILL);
  }
  // SIGSTOPs `pid` for `len`; the watchdog thread sends the SIGCONT.
  bool stop_worker(pid_t pid, Clock::duration len, const std::string& why) {
    std::lock_guard lock(mu_);
    if (!workers_.count(pid) || stops_.count(pid)) return false;
    const std::int64_t t0 = MonotonicNanos();
    ::kill(pid, SIGSTOP);
    stops_[pid] = {t0, Clock::now(), Clock::now() + len, why};
    AppendLine(fd_, "P " + Str(pid) + " " + Str(t0) + " " + why + "\n");
    cv_.notify_all();
    return true;
  }
  bool stopped(pid_t pid) {
    std::lock_guard lock(mu_);
    return stops_.count(pid) > 0;
  }
  void continue_all() {
    std::lock_guard lock(mu_);
    for (auto& [pid, s] : stops_) s.until = Clock::now();
    continue_due();
  }
  bool failed() {
    std::lock_guard lock(mu_);
    return failed_;
  }

 private:
  struct Stop {
    std::int64_t t0;
    Clock::time_point since, until;
    std::string why;
  };

  // Under mu_.
  void continue_due() {
    const auto now = Clock::now();
    for (auto it = stops_.begin(); it != stops_.end();) {
      if (it->second.until > now) {
        ++it;
        continue;
      }
      ::kill(it->first, SIGCONT);
      AppendLine(fd_, "F stop " + Str(it->first) + " " + Str(it->second.t0) + " " + Str(MonotonicNanos()) + "\n");
      it = stops_.erase(it);
    }
  }

  void loop() {
    std::unique_lock lock(mu_);
    while (!quit_) {
      cv_.wait_for(lock, 20ms);
      continue_due();
      if (failed_) continue;
      const auto now = Clock::now();
      std::string why;
      if (now > doing_until_)
        why = "the runner has been " + doing_ + " for " +
              Str(std::chrono::duration_cast<std::chrono::milliseconds>(now - doing_since_).count()) + " ms (bound " +
              Str(std::chrono::duration_cast<std::chrono::milliseconds>(doing_until_ - doing_since_).count()) + " ms)";
      else if (now > deadline_)
        why = "the run passed its overall bound (--deadline-s) while " + doing_;
      if (why.empty()) continue;
      fail(why, lock);
    }
  }

  void fail(const std::string& why, std::unique_lock<std::mutex>& lock) {
    failed_ = true;
    const auto now = Clock::now();
    auto ms_ago = [&](Clock::time_point t) {
      return Str(std::chrono::duration_cast<std::chrono::milliseconds>(now - t).count());
    };
    std::ostringstream d;
    d << "dlock-chaos: STUCK: " << why << "\n  runner (pid " << ::getpid() << ") threads:\n"
      << DescribeThreads(::getpid());
    for (const auto& [pid, slot] : workers_) {
      d << "  worker slot " << slot << " pid " << pid;
      if (auto s = stops_.find(pid); s != stops_.end())
        d << ": SIGSTOPped " << ms_ago(s->second.since) << " ms ago (" << s->second.why << "), due for SIGCONT in "
          << std::chrono::duration_cast<std::chrono::milliseconds>(s->second.until - now).count() << " ms";
      d << "\n    last ledger line: " << LastLedgerLine(ledger_, pid) << "\n" << DescribeThreads(pid);
    }
    const std::string text = d.str();
    std::cerr << text << std::flush;
    std::ofstream(report_) << text;
    std::string one = why;
    for (char& c : one)
      if (c == '\n') c = ' ';
    AppendLine(fd_, "STUCK " + Str(MonotonicNanos()) + " " + one + "\n");
    // Continue and kill every worker (that frees whatever store lock they
    // held), then give the main thread a while to wind down and check.
    const std::string t = Str(MonotonicNanos());
    for (const auto& [pid, slot] : workers_) {
      ::kill(pid, SIGCONT);
      ::kill(pid, SIGKILL);
      if (auto s = stops_.find(pid); s != stops_.end())
        AppendLine(fd_, "F stop " + Str(pid) + " " + Str(s->second.t0) + " " + t + "\n");
      AppendLine(fd_, "F kill " + Str(pid) + " " + t + " " + t + "\n");
    }
    stops_.clear();
    const auto grace = Clock::now() + 30s;
    while (!quit_ && Clock::now() < grace) cv_.wait_for(lock, 50ms);
    if (!quit_) {
      std::cerr << "dlock-chaos: the runner is still stuck (" << doing_ << "); exiting. Report: " << report_ << "\n"
                << DescribeThreads(::getpid()) << std::flush;
      ::_exit(3);
    }
  }

  int fd_;
  std::string ledger_, report_;
  Clock::time_point deadline_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool quit_ = false, failed_ = false;
  std::string doing_ = "starting";
  Clock::time_point doing_since_ = Clock::now(), doing_until_ = Clock::now() + 10min;
  std::map<pid_t, int> workers_;
  std::map<pid_t, Stop> stops_;
  std::thread thread_;
};

// Looks up the lock's holders (by their owner records, read directly) on a
// thread of its own, so that the main thread waits a bounded time: a
// file-store listing takes the counter lock, which a stopped worker may hold.
class HolderProbe {
 public:
  HolderProbe(std::string url, std::vector<std::string> names) : url_(std::move(url)), names_(std::move(names)) {
    thread_ = std::thread([this] { loop(); });
  }
  ~HolderProbe() {
    {
      std::lock_guard lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // The pids whose entries hold now; nullopt if the answer does not come
  // within `wait` (a lookup still running is not started again).
  std::optional<std::vector<pid_t>> holders(std::chrono::milliseconds wait) {
    std::unique_lock lock(mu_);
    if (asked_ == answered_) ++asked_;
    cv_.notify_all();
    const auto want = asked_;
    if (!cv_.wait_for(lock, wait, [&] { return answered_ >= want; })) return std::nullopt;
    return answer_;
  }

 private:
  void loop() {
    std::optional<Client> client;
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return quit_ || asked_ > answered_; });
      if (quit_) return;
      const auto want = asked_;
      lock.unlock();
      std::optional<std::vector<pid_t>> out;
      if (!client) {
        auto c = Client::open(url_);
        if (c.ok()) client = std::move(*c);
      }
      for (std::size_t i = 0; client && i < names_.size(); ++i) {
        auto entries = Inspect(*client, names_[i]);
        if (!entries.ok()) continue;
        if (!out) out.emplace();
        for (const auto& e : *entries)
          if (e.holds && e.entry.owner) out->push_back(static_cast<pid_t>(e.entry.owner->pid));
      }
      lock.lock();
      answer_ = std::move(out);
      answered_ = want;
      cv_.notify_all();
    }
  }

  std::string url_;
  std::vector<std::string> names_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t asked_ = 0, answered_ = 0;
  std::optional<std::vector<pid_t>> answer_;
  bool quit_ = false;
  std::thread thread_;
};

struct RunArgs {
  std::string store = "file";
  std::string out;
  double duration_s = 60;
  int workers = 4;
  std::uint64_t seed = 0;
  int hold_max_ms = 50;
  int acquire_timeout_ms = 5000;
  int ttl_ms = 2000;                   // redis session lease
  std::string redis_persist = "none";  // none, rdb, aof
  bool redis_replica = false;          // a replica, and the failover fault
  int zk_sync_ms = 0;                  // zk3: how long a follower takes to notice a silent leader (0: 2 s)
  int fault_every_ms = 700;            // mean gap between faults
  int threads = 1;
  std::vector<std::string> recipes = {"mutex"};
  std::vector<std::string> known;   // checks reported but not counted (CheckOptions::known)
  double deadline_s = 0;            // the whole run's bound (0: duration + 300 s + 60 s per ZooKeeper server)
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
    int status = run_in_out_dir();
    if (wd_ && wd_->failed()) status = 1;
    wd_.reset();
    if (fd_ >= 0) ::close(fd_);
    // A scratch directory is kept only when there is something to look at
    // (not after the watchdog's self-test, which fails by design).
    const bool self_test = a_.faults == std::vector<std::string>{"stall"};
    if (scratch && (status == 0 || self_test))
      fs::remove_all(a_.out);
    else
      std::cerr << "dlock-chaos: ledger kept in " << ledger_ << "\n";
    return status;
  }

 private:
  int run_in_out_dir() {
    fs::create_directories(a_.out);
    ledger_ = a_.out + "/ledger";
    fs::remove(ledger_);
    fd_ = ::open(ledger_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ < 0) return 2;
    {
      double bound = a_.deadline_s;
      if (bound <= 0)
        bound = a_.duration_s + 300 +
                (a_.store == "zk3" || a_.store == "etcd3" ? 180
                 : a_.store == "zk" || a_.store == "etcd" ? 60
                                                          : 0);
      wd_ = std::make_unique<Watchdog>(fd_, ledger_, a_.out + "/stuck.txt",
                                       std::chrono::milliseconds(static_cast<std::int64_t>(bound * 1000)));
    }
    std::optional<Watchdog::Doing> starting(std::in_place, *wd_, "starting the servers", 240s);
    name_ = "chaos/lock";
    std::vector<std::string> kinds;
    if (a_.store == "file") {
      fs::remove_all(a_.out + "/store");
      fs::create_directories(a_.out + "/store");
      url_ = direct_url_ = "file://" + a_.out + "/store";
      kinds = {"kill", "stop"};
    } else if (a_.store == "redis") {
      if (a_.redis_persist != "none" && a_.redis_persist != "rdb" && a_.redis_persist != "aof") {
        std::cerr << "dlock-chaos: --redis-persist: none, rdb or aof\n";
        return 2;
      }
      redis_ = std::make_unique<RedisServer>(RedisOptions(a_.redis_persist, a_.out + "/redis-a"));
      if (!redis_->start()) {
        std::cerr << "dlock-chaos: redis-server did not start (see " << redis_->dir() << "/redis.log)\n";
        return 2;
      }
      if (a_.redis_replica) {
        replica_ = std::make_unique<RedisServer>(RedisOptions(a_.redis_persist, a_.out + "/redis-b"));
        replica_->set_replica_of(redis_->port());
        bool synced = replica_->start();
        for (int i = 0; synced && i < 100 && !replica_synced(); ++i) std::this_thread::sleep_for(100ms);
        if (!synced || !replica_synced()) {
          std::cerr << "dlock-chaos: the redis replica did not start or sync (see " << replica_->dir()
                    << "/redis.log)\n";
          return 2;
        }
      }
      proxy_ = std::make_unique<TcpProxy>(redis_->port());
      // The runner's own view (holder lookups, orphans): never faulted, but
      // it follows a failover too.
      inspect_proxy_ = std::make_unique<TcpProxy>(redis_->port());
      const std::string q = "?ttl=" + Str(a_.ttl_ms) + "ms&connect_timeout=" + Str(a_.ttl_ms) + "ms";
      url_ = "redis://127.0.0.1:" + Str(proxy_->port()) + q;
      direct_url_ = "redis://127.0.0.1:" + Str(inspect_proxy_->port()) + q;
      kinds = {"kill", "stop", "restart", "cut", "drop", "delay"};
      if (a_.redis_persist != "none") kinds.push_back("rollback");
      if (a_.redis_replica) kinds.push_back("failover");
    } else if (a_.store == "zk" || a_.store == "zk3") {
      zk_ = MakeZkCluster(a_.out, a_.store == "zk" ? 1 : 3, a_.zk_sync_ms > 0 ? a_.zk_sync_ms : 2000);
      if (!zk_->start_all()) {
        std::cerr << "dlock-chaos: ZooKeeper did not start (see " << a_.out << "/zk*/server.log)\n";
        return 2;
      }
      const std::string q = "?session_timeout=" + Str(a_.ttl_ms) + "ms&connect_timeout=" + Str(a_.ttl_ms) + "ms";
      proxy_servers(
          "zk", q, [this](std::size_t i) { return zk_->client_port(i); }, zk_->size());
      kinds = {"kill", "stop", "restart", "cut", "drop", "delay"};
      if (zk_->size() > 1) {
        kinds.push_back("leader");
        kinds.push_back("partition");
      }
    } else if (a_.store == "etcd" || a_.store == "etcd3") {
      EtcdCluster::Options o;
      o.size = a_.store == "etcd" ? 1 : 3;
      o.dir = a_.out;
      o.proxied_peers = o.size > 1;  // isolate(): member 0's peer links
      etcd_ = std::make_unique<EtcdCluster>(o);
      if (!etcd_->start_all()) {
        std::cerr << "dlock-chaos: etcd did not start (see " << a_.out << "/etcd*/etcd.log)\n";
        return 2;
      }
      // The lease is whole seconds (at least 1 s): --ttl-ms rounds up.
      const std::string q = "?ttl=" + Str(a_.ttl_ms) + "ms&connect_timeout=" + Str(a_.ttl_ms) + "ms";
      proxy_servers(
          "etcd", q, [this](std::size_t i) { return etcd_->client_port(i); }, etcd_->size());
      kinds = {"kill", "stop", "restart", "cut", "drop", "delay"};
      if (etcd_->size() > 1) {
        kinds.push_back("leader");
        kinds.push_back("partition");
      }
    } else {
      std::cerr << "dlock-chaos: unknown store " << a_.store << " (file, redis, zk, zk3, etcd, etcd3)\n";
      return 2;
    }
    if (!a_.faults.empty()) kinds = a_.faults;
    AppendLine(
        fd_, "C store=" + a_.store + " url=" + url_ + " workers=" + Str(a_.workers) + " duration_s=" +
                 Str(static_cast<std::int64_t>(a_.duration_s)) + " seed=" + Str(static_cast<std::int64_t>(a_.seed)) +
                 " acquire_timeout_ms=" + Str(a_.acquire_timeout_ms) + " hold_max_ms=" + Str(a_.hold_max_ms) +
                 " ttl_ms=" + Str(a_.store == "file" ? 0 : a_.ttl_ms) + " threads=" + Str(a_.threads) +
                 (a_.store == "redis" ? " redis_persist=" + a_.redis_persist + " redis_replica=" + Str(a_.redis_replica)
                                      : "") +
                 " recipes=" + recipes_csv() + "\n");
    std::cerr << "dlock-chaos: " << a_.store << " store at " << url_ << ", ledger " << ledger_ << "\n";
    starting.reset();
    probe_ = std::make_unique<HolderProbe>(direct_url_, lock_names());

    for (int s = 0; s < a_.workers; ++s) spawn_worker(s);
    const auto t_end =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(a_.duration_s * 1000));
    auto next_fault = std::chrono::steady_clock::now() + gap();
    while (std::chrono::steady_clock::now() < t_end && !g_interrupted && !wd_->failed()) {
      // One step of the loop; a restart inside it declares its own, longer bound.
      Watchdog::Doing step(*wd_, "in the fault loop", 30s);
      reap();
      snapshot_redis();
      run_due_actions(false);
      if (std::chrono::steady_clock::now() >= next_fault) {
        inject(kinds[rng_() % kinds.size()]);
        next_fault = std::chrono::steady_clock::now() + gap();
      }
      std::this_thread::sleep_for(10ms);
    }
    wd_->continue_all();
    std::cerr << "dlock-chaos: holder lookups " << holder_lookups_
              << ", not answered within 1 s: " << holder_lookups_late_
              << "; faults skipped (not possible at the time):";
    for (const auto& [k, n] : skipped_) std::cerr << " " << k << "=" << n;
    std::cerr << "\n";
    {
      Watchdog::Doing ending(*wd_, "ending the faults in progress", 240s);
      run_due_actions(true);  // end every fault still in progress
    }
    const int stopped_ok = stop_workers();
    std::int64_t orphans = -1;
    {
      Watchdog::Doing doing(*wd_, "counting orphans", std::chrono::milliseconds(a_.ttl_ms * 3) + 90s);
      orphans = count_orphans();
      probe_.reset();
      if (redis_) redis_->kill();
      if (replica_) replica_->kill();
      member_proxies_.clear();
      zk_.reset();
      etcd_.reset();
    }
    CheckOptions opts;
    opts.orphans = orphans;
    opts.known = std::set<std::string>(a_.known.begin(), a_.known.end());
    Watchdog::Doing doing(*wd_, "checking the ledger", 300s);
    const int violations = CheckLedger(ledger_, opts, std::cout);
    return (violations == 0 && stopped_ok && !wd_->failed()) ? 0 : 1;
  }

  using Action = std::pair<std::chrono::steady_clock::time_point, std::function<void()>>;

  // One TcpProxy per server for the workers; url_ through them, direct_url_
  // (the runner's own checks) straight to the servers. With more than one
  // server, even worker slots connect to server 1 only (the one a partition
  // cuts off), odd slots to the others.
  void proxy_servers(const std::string& scheme, const std::string& q, const std::function<int(std::size_t)>& port,
                     std::size_t n) {
    std::string via, via_rest, direct;
    for (std::size_t i = 0; i < n; ++i) {
      member_proxies_.push_back(std::make_unique<TcpProxy>(port(i)));
      via += (i ? ",127.0.0.1:" : "127.0.0.1:") + Str(member_proxies_.back()->port());
      if (i > 0) via_rest += (i > 1 ? ",127.0.0.1:" : "127.0.0.1:") + Str(member_proxies_.back()->port());
      direct += (i ? ",127.0.0.1:" : "127.0.0.1:") + Str(port(i));
    }
    url_ = scheme + "://" + via + q;
    direct_url_ = scheme + "://" + direct + q;
    if (n > 1) {
      slot_urls_[0] = scheme + "://127.0.0.1:" + Str(member_proxies_[0]->port()) + q;
      slot_urls_[1] = scheme + "://" + via_rest + q;
    }
  }

  std::chrono::milliseconds gap() {
    std::exponential_distribution<double> d(1.0 / a_.fault_every_ms);
    return std::chrono::milliseconds(50 + static_cast<std::int64_t>(d(rng_)));
  }
  std::chrono::milliseconds between(int lo_ms, int hi_ms) {
    return std::chrono::milliseconds(lo_ms + static_cast<int>(rng_() % static_cast<unsigned>(hi_ms - lo_ms + 1)));
  }

  std::string recipes_csv() const {
    std::string out;
    for (const auto& r : a_.recipes) out += (out.empty() ? "" : ",") + r;
    return out;
  }
  std::vector<std::string> lock_names() const {
    std::vector<std::string> out;
    for (const auto& r : a_.recipes) out.push_back(LockName(name_, r));
    return out;
  }

  void spawn_worker(int slot) {
    // SIGUSR1 ("stop") is blocked from birth: a worker spawned just before
    // the end of a run would otherwise die of it before its main() blocks it.
    sigset_t stop_signal;
    sigemptyset(&stop_signal);
    sigaddset(&stop_signal, SIGUSR1);
    const std::string url = slot_urls_.empty() ? url_ : slot_urls_[slot % 2];
    pid_t pid = Spawn({self_,
                       "worker",
                       "--url",
                       url,
                       "--name",
                       name_,
                       "--ledger",
                       ledger_,
                       "--slot",
                       Str(slot),
                       "--hold-max-ms",
                       Str(a_.hold_max_ms),
                       "--acquire-timeout-ms",
                       Str(a_.acquire_timeout_ms),
                       "--seed",
                       Str(static_cast<std::int64_t>(rng_() >> 1)),
                       "--threads",
                       Str(a_.threads),
                       "--recipes",
                       recipes_csv()},
                      "", &stop_signal);
    if (pid > 0) {
      workers_[pid] = slot;
      wd_->add_worker(pid, slot);
    }
  }

  // Collects workers that ended: a killed one is replaced; one that exited
  // on its own is a crash.
  // Waits only for workers (through the watchdog, which signals them): the
  // servers are waited for by their own classes.
  pid_t wait_any_worker(int& status) { return wd_->reap_any(status); }

  void reap() {
    int status = 0;
    pid_t pid;
    while ((pid = wait_any_worker(status)) > 0) {
      auto it = workers_.find(pid);
      const int slot = it->second;
      workers_.erase(it);
      if (wd_->failed()) continue;  // the watchdog killed them all: the run ends
      if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && killed_by_us_.count(pid)))
        AppendLine(fd_, "D " + Str(pid) + " " + Str(status) + "\n");
      spawn_worker(slot);
    }
  }

  // A worker that holds the lock now, by the owner records in the store
  // (read directly, not through the proxy); -1 if unknown or if the answer
  // takes over a second (see HolderProbe).
  pid_t holder() {
    ++holder_lookups_;
    auto pids = probe_->holders(1000ms);
    if (!pids) {
      ++holder_lookups_late_;
      return -1;
    }
    for (const pid_t pid : *pids)
      if (workers_.count(pid) && !wd_->stopped(pid)) return pid;
    return -1;
  }

  pid_t random_worker() {
    std::vector<pid_t> pids;
    for (auto& [pid, slot] : workers_)
      if (!wd_->stopped(pid)) pids.push_back(pid);
    return pids.empty() ? -1 : pids[rng_() % pids.size()];
  }

  std::vector<TcpProxy*> proxies() {
    std::vector<TcpProxy*> out;
    if (proxy_) out.push_back(proxy_.get());
    for (auto& p : member_proxies_) out.push_back(p.get());
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
        // Restarts wait for a server (a JVM: up to a minute).
        Watchdog::Doing doing(*wd_, "ending a fault (restarting a server, healing the network)", 150s);
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
      wd_->kill_worker(pid);
      AppendLine(fd_, "F kill " + Str(pid) + " " + Str(t0) + " " + Str(t0) + "\n");
    } else if (kind == "stop") {
      // Half of the time the current holder: that is where a pause matters.
      const bool aim = rng_() % 2;
      pid_t pid = aim ? holder() : -1;
      const bool hit_holder = pid > 0;
      if (pid <= 0) pid = random_worker();
      if (pid <= 0) return;
      // Longer than the session lease, so the store gives the lock away
      // meanwhile. The watchdog continues it on time and writes "F stop".
      const int base = a_.store == "file" ? 1000 : a_.ttl_ms;
      wd_->stop_worker(pid, between(base * 3 / 2, base * 5 / 2), hit_holder ? "holder" : "random");
    } else if (kind == "stall") {
      // A self-test of the watchdog (never chosen unless asked for): stop a
      // worker for 10 s, then block the main thread past its declared bound,
      // as a blocking store call once did. The run must fail within seconds
      // with a diagnosis, not hang.
      pid_t pid = random_worker();
      if (pid <= 0) return;
      wd_->stop_worker(pid, 10s, "stall");
      Watchdog::Doing doing(*wd_, "stalling on purpose (fault 'stall')", 2s);
      std::this_thread::sleep_for(6s);
    } else if (kind == "restart" && redis_ && redis_->running() && !server_down_) {
      // With persistence it comes back with what it had written (AOF: all
      // but the last second or so; RDB: up to the last snapshot).
      server_down_ = true;
      redis_->kill();
      later(between(0, 1500), [this, t0] {
        if (!redis_->start()) std::cerr << "dlock-chaos: redis-server did not restart\n";
        server_down_ = false;
        AppendLine(fd_, "F restart -1 " + Str(t0) + " " + Str(MonotonicNanos()) + "\n");
      });
    } else if (kind == "rollback" && redis_ && redis_->running() && !server_down_) {
      // SIGKILL the primary and start it from a copy of its files taken 1-6 s
      // ago (a restore from an older backup, a lost disk cache, a replica
      // promoted from behind): keys, counters and entries go back in time.
      const auto now = std::chrono::steady_clock::now();
      std::vector<std::size_t> fit;
      for (std::size_t i = 0; i < snapshots_.size(); ++i)
        if (now - snapshots_[i].at >= 1s && now - snapshots_[i].at <= 6s) fit.push_back(i);
      if (fit.empty()) return;
      const Snapshot snap = snapshots_[fit[rng_() % fit.size()]];
      server_down_ = true;
      redis_->kill();
      std::error_code ec;
      for (const auto& f : redis_->data_files()) fs::remove_all(redis_->dir() + "/" + f, ec);
      fs::copy(snap.path, redis_->dir(), fs::copy_options::recursive | fs::copy_options::overwrite_existing, ec);
      const auto age_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - snap.at).count();
      later(between(0, 1000), [this, t0, age_ms] {
        if (!redis_->start()) std::cerr << "dlock-chaos: redis-server did not restart from its older files\n";
        server_down_ = false;
        AppendLine(fd_, "F rollback -1 " + Str(t0) + " " + Str(MonotonicNanos()) + " " + Str(age_ms) + "\n");
      });
    } else if (kind == "failover" && replica_ && redis_->running() && !server_down_ && replica_synced()) {
      // SIGKILL the primary, promote the replica (REPLICAOF NO ONE) and point
      // the proxies at it; what the replica had not yet received is gone.
      // The old primary comes back 0.5-2 s later, empty, as the new replica.
      server_down_ = true;
      redis_->kill();
      const std::string reply = RedisCommand(replica_->port(), "REPLICAOF NO ONE");
      replica_->set_replica_of(std::nullopt);  // a primary from now on, restarts included
      if (!reply.starts_with("+OK")) std::cerr << "dlock-chaos: REPLICAOF NO ONE answered '" << reply << "'\n";
      proxy_->set_upstream(replica_->port());
      inspect_proxy_->set_upstream(replica_->port());
      proxy_->drop_all();
      inspect_proxy_->drop_all();
      std::swap(redis_, replica_);
      AppendLine(fd_, "F failover -1 " + Str(t0) + " " + Str(MonotonicNanos()) + "\n");
      later(between(500, 2000), [this] {
        std::error_code ec;
        for (const auto& f : replica_->data_files()) fs::remove_all(replica_->dir() + "/" + f, ec);
        replica_->set_replica_of(redis_->port());
        if (!replica_->start()) std::cerr << "dlock-chaos: the old redis primary did not restart as a replica\n";
        for (int i = 0; i < 100 && !replica_synced(); ++i) std::this_thread::sleep_for(100ms);
        server_down_ = false;
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
    } else if (kind == "partition" && zk_ && zk_->size() > 1 && !server_down_) {
      // Server 1 loses its links to the others for 0.5-3 session timeouts,
      // while its clients stay connected to it; it notices the leader is
      // gone after --zk-sync-ms. Counted as a server fault: no restart meanwhile.
      server_down_ = true;
      const auto leader = zk_->leader();
      const std::string role = !leader ? "unknown" : *leader == 0 ? "leader" : "follower";
      zk_->isolate(true);
      later(between(a_.ttl_ms / 2, a_.ttl_ms * 3), [this, t0, role] {
        zk_->isolate(false);
        server_down_ = false;
        AppendLine(fd_, "F partition -1 " + Str(t0) + " " + Str(MonotonicNanos()) + " " + role + "\n");
      });
    } else if (kind == "restart" && etcd_ && etcd_->size() == 1 && etcd_->running(0) && !server_down_) {
      // SIGKILL the member; it comes back with its data (keys, leases).
      server_down_ = true;
      etcd_->kill(0);
      later(between(0, 1500), [this, t0] {
        etcd_->launch(0);
        if (!etcd_->wait_serving(0)) std::cerr << "dlock-chaos: etcd did not restart\n";
        server_down_ = false;
        AppendLine(fd_, "F restart -1 " + Str(t0) + " " + Str(MonotonicNanos()) + "\n");
      });
    } else if ((kind == "restart" || kind == "leader") && etcd_ && etcd_->size() > 1 && !server_down_) {
      // One member at a time, so that a quorum stays possible.
      std::optional<std::size_t> victim =
          kind == "leader" ? etcd_->leader() : std::optional<std::size_t>(rng_() % etcd_->size());
      if (!victim) {
        ++skipped_[kind];
        return;
      }
      server_down_ = true;
      etcd_->kill(*victim);
      later(between(500, 3000), [this, kind, t0, i = *victim] {
        etcd_->launch(i);
        if (!etcd_->wait_serving(i)) std::cerr << "dlock-chaos: etcd member " << i << " did not restart\n";
        server_down_ = false;
        AppendLine(fd_, "F " + kind + " -1 " + Str(t0) + " " + Str(MonotonicNanos()) + " member=" + Str(i) + "\n");
      });
    } else if (kind == "partition" && etcd_ && etcd_->size() > 1 && !server_down_) {
      // Member 0 loses its peer links to the others, both ways, for 0.5-3
      // leases, while its clients stay connected to it: it can neither
      // renew their leases nor serve a linearizable read or a write, and the
      // other two elect a leader (if it was member 0) and expire the leases
      // of its clients. Counted as a server fault: no restart meanwhile.
      // Half of the time member 1 is made the leader first (etcdctl
      // move-leader): a leader cut off goes on answering its clients'
      // renewals by itself until it steps down (CheckQuorum: within two
      // election timeouts), while the other two elect a new one.
      server_down_ = true;
      if (rng_() % 2) etcd_->make_leader(0);
      const auto leader = etcd_->leader();
      const std::string role = !leader ? "unknown" : *leader == 0 ? "leader" : "follower";
      etcd_->isolate(true);
      later(between(a_.ttl_ms / 2, a_.ttl_ms * 3), [this, t0, role] {
        etcd_->isolate(false);
        server_down_ = false;
        AppendLine(fd_, "F partition -1 " + Str(t0) + " " + Str(MonotonicNanos()) + " " + role + "\n");
      });
    } else if ((kind == "cut" || kind == "delay") && !proxies().empty() && !network_fault_) {
      network_fault_ = true;
      const auto delay = between(20, a_.ttl_ms / 3);
      for (auto* p : proxies()) {
        if (kind == "cut")
          p->set_mode(TcpProxy::Mode::kBlackHole);
        else
          p->set_mode(TcpProxy::Mode::kDelay, delay);
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
    } else {
      ++skipped_[kind];  // not possible now (a server is down, the replica is not in sync, ...)
    }
  }

  // Whether the replica runs and its link to the primary is up.
  bool replica_synced() {
    return replica_ && replica_->running() &&
           RedisCommand(replica_->port(), "INFO replication").find("master_link_status:up") != std::string::npos;
  }

  // Every 500 ms, a copy of the primary's data files (the last 12 s are
  // kept), for the rollback fault.
  void snapshot_redis() {
    if (!redis_ || a_.redis_persist == "none" || !redis_->running() || server_down_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now < next_snapshot_) return;
    next_snapshot_ = now + 500ms;
    const std::string path = a_.out + "/snapshots/" + Str(snapshot_seq_++);
    std::error_code ec;
    fs::create_directories(path, ec);
    bool any = false;
    for (const auto& f : redis_->data_files()) {
      const std::string src = redis_->dir() + "/" + f;
      if (!fs::exists(src, ec)) continue;
      fs::copy(src, path + "/" + f, fs::copy_options::recursive | fs::copy_options::overwrite_existing, ec);
      any = any || !ec;
    }
    if (!any) {
      fs::remove_all(path, ec);
      return;
    }
    snapshots_.push_back({now, path});
    while (snapshots_.size() > 24) {
      fs::remove_all(snapshots_.front().path, ec);
      snapshots_.erase(snapshots_.begin());
    }
  }

  // Asks every worker to stop; a worker that does not exit within the
  // acquire timeout plus a margin is hung (a liveness failure).
  bool stop_workers() {
    Watchdog::Doing doing(*wd_, "stopping the workers", std::chrono::milliseconds(a_.acquire_timeout_ms) + 60s);
    for (auto& [pid, slot] : workers_) ::kill(pid, SIGUSR1);
    bool ok = true;
    const auto limit = std::chrono::steady_clock::now() + std::chrono::milliseconds(a_.acquire_timeout_ms) + 20s;
    while (!workers_.empty()) {
      int status = 0;
      pid_t pid = wait_any_worker(status);
      if (pid > 0) {
        const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && killed_by_us_.count(pid);
        if (workers_.erase(pid) && !killed && !wd_->failed() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
          AppendLine(fd_, "D " + Str(pid) + " " + Str(status) + "\n");
        continue;
      }
      if (std::chrono::steady_clock::now() > limit && ok) {
        // Say what each one is blocked in, then kill it (reaped by this loop).
        for (auto& [p, slot] : workers_) {
          AppendLine(fd_, "HUNG " + Str(p) + " " + Str(MonotonicNanos()) + "\n");
          std::cerr << "dlock-chaos: worker slot " << slot << " pid " << p << " did not stop when asked\n"
                    << "    last ledger line: " << LastLedgerLine(ledger_, p) << "\n"
                    << DescribeThreads(p);
          killed_by_us_.insert(p);
          wd_->kill_worker(p);
        }
        ok = false;
      }
      std::this_thread::sleep_for(10ms);
    }
    return ok;
  }

  // Entries left in the store once every worker is gone. Entries of killed
  // workers may stay until their session's lease runs out, so this waits for
  // a few leases before counting.
  //
  // The faults have just ended: a ZooKeeper ensemble may still be electing a
  // leader (and then gives every session a fresh timeout), a loaded machine
  // may be slow to restart a server. So a listing that fails is tried again,
  // and the bound is generous; a passing run stops at the first empty look.
  std::int64_t count_orphans() {
    const auto limit = std::chrono::steady_clock::now() + std::chrono::milliseconds(a_.ttl_ms * 3) + 30s;
    std::int64_t n = -1;
    std::string last_error;
    try {
      auto client = Client::connect(direct_url_);
      while (true) {
        n = 0;
        for (const auto& lock : lock_names()) {
          auto entries = Inspect(client, lock);
          if (!entries.ok()) {
            last_error = entries.status().to_string();
            n = -1;
            break;
          }
          n += static_cast<std::int64_t>(entries->size());
        }
        if (n == 0 || std::chrono::steady_clock::now() > limit) break;
        std::this_thread::sleep_for(200ms);
      }
      if (n < 0) std::cerr << "dlock-chaos: cannot list the store: " << last_error << "\n";
      if (n > 0) std::cerr << "dlock-chaos: " << n << " entries left in the store after every worker stopped\n";
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
  std::unique_ptr<RedisServer> redis_, replica_;  // the primary, and its replica if any
  std::unique_ptr<TcpProxy> proxy_, inspect_proxy_;
  struct Snapshot {
    std::chrono::steady_clock::time_point at;
    std::string path;
  };
  std::vector<Snapshot> snapshots_;
  std::chrono::steady_clock::time_point next_snapshot_{};
  int snapshot_seq_ = 0;
  std::unique_ptr<ZkCluster> zk_;
  std::unique_ptr<EtcdCluster> etcd_;
  std::vector<std::unique_ptr<TcpProxy>> member_proxies_;  // zk, etcd: the workers' way to each server
  std::map<int, std::string> slot_urls_;                   // zk3, etcd3: by slot % 2
  bool network_fault_ = false;
  bool server_down_ = false;
  std::map<pid_t, int> workers_;
  std::set<pid_t> killed_by_us_;
  std::vector<Action> actions_;
  std::unique_ptr<Watchdog> wd_;  // declared after fd_ and before the servers: outlives the run's steps
  std::unique_ptr<HolderProbe> probe_;
  int holder_lookups_ = 0, holder_lookups_late_ = 0;
  std::map<std::string, int> skipped_;
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
  run_cmd
      ->add_option("--store", run.store,
                   "file, redis, zk (one server), zk3 (a three-server ensemble), etcd (one member) or etcd3 (three)")
      ->required();
  run_cmd->add_option("--duration", run.duration_s, "seconds");
  run_cmd->add_option("--workers", run.workers);
  run_cmd->add_option("--seed", run.seed);
  run_cmd->add_option("--out", run.out, "directory for the ledger and the store (default: a new /tmp dir)");
  run_cmd->add_option("--hold-max-ms", run.hold_max_ms);
  run_cmd->add_option("--acquire-timeout-ms", run.acquire_timeout_ms);
  run_cmd->add_option("--ttl-ms", run.ttl_ms, "redis session lease, zk session timeout, etcd lease (whole seconds)");
  run_cmd->add_option("--fault-every-ms", run.fault_every_ms, "mean gap between faults");
  run_cmd->add_option("--redis-persist", run.redis_persist,
                      "redis: none, rdb (save 1 1) or aof (appendfsync everysec); rdb/aof add the rollback fault");
  run_cmd->add_flag("--redis-replica", run.redis_replica, "redis: a primary and a replica; adds the failover fault");
  run_cmd->add_option(
      "--zk-sync-ms", run.zk_sync_ms,
      "zk3: syncLimit x tickTime, how long a follower serves without hearing the leader (default 2000)");
  run_cmd->add_option("--threads", run.threads, "contender threads per worker, sharing its handles");
  run_cmd
      ->add_option("--recipes", run.recipes,
                   "mutex, semaphore (SemaphoreMutex), rw (ReadWriteLock); threads take them in turn")
      ->delimiter(',');
  run_cmd
      ->add_option("--known", run.known,
                   "checks whose violations are reported but do not fail the run (known store defects): "
                   "fencing, overlaps, token-order, duplicates, hold-level, liveness, crashes, runner, orphans")
      ->delimiter(',');
  run_cmd->add_option("--deadline-s", run.deadline_s,
                      "bound on the whole run; past it the watchdog diagnoses and fails the run");
  run_cmd->add_option("--faults", run.faults, "kinds to inject: kill stop restart cut drop delay leader partition")
      ->delimiter(',');

  std::string ledger;
  auto* check_cmd = app.add_subcommand("check", "check a ledger");
  check_cmd->add_option("ledger", ledger)->required();
  CheckOptions check_opts;
  check_cmd->add_option("--known", check_opts.known, "checks reported but not counted")->delimiter(',');

  WorkerArgs w;
  auto* worker_cmd = app.add_subcommand("worker", "one contender (started by run)");
  worker_cmd->add_option("--url", w.url)->required();
  worker_cmd->add_option("--name", w.name)->required();
  worker_cmd->add_option("--ledger", w.ledger)->required();
  worker_cmd->add_option("--slot", w.slot);
  worker_cmd->add_option("--hold-max-ms", w.hold_max_ms)->check(CLI::PositiveNumber);
  worker_cmd->add_option("--acquire-timeout-ms", w.acquire_timeout_ms);
  worker_cmd->add_option("--seed", w.seed);
  worker_cmd->add_option("--threads", w.threads);
  worker_cmd->add_option("--recipes", w.recipes)->delimiter(',');

  CLI11_PARSE(app, argc, argv);
  if (*worker_cmd) {
    // Everything of the worker's own is closed by now (RunWorker's handles
    // are gone); a session the library is still opening or closing in the
    // background must not race the exit handlers that destroy static data
    // (docs/notes.md: no dlock thread outliving the last handle is open).
    const int status = RunWorker(w);
    std::fflush(nullptr);
    std::_Exit(status);
  }
  if (*check_cmd) return CheckLedger(ledger, check_opts, std::cout) == 0 ? 0 : 1;
  if (run.seed == 0) run.seed = std::random_device{}();
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGINT, [](int) { g_interrupted = 1; });
  std::signal(SIGTERM, [](int) { g_interrupted = 1; });
  std::cerr << "dlock-chaos: seed " << run.seed << "\n";
  return Runner(run, SelfPath(argv[0])).run();
}
