// dlock-bench: one benchmark scenario against one store, one JSON object on
// stdout. bench/run.sh runs every scenario on every store and the peers.
//
//   dlock-bench --url URL --scenario cycles|floor|contend|waiters|footprint|async-footprint [options]
//
// Multi-process scenarios fork() their workers before the parent creates any
// thread or client, and the workers write their records into an anonymous
// shared mapping; all times are CLOCK_MONOTONIC, which every process on the
// host shares, so one holder's release and the next one's acquire compare.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <latch>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dlock/dlock.hpp"

#ifdef DLOCK_BENCH_HIREDIS
#include <hiredis/hiredis.h>

#include "stores/redis/redis_scripts.hpp"  // the floor runs dlock's own scripts
#endif
#ifdef DLOCK_BENCH_ZOOKEEPER
#include <zookeeper/zookeeper.h>
#endif
#ifdef DLOCK_BENCH_ETCD
#include <grpcpp/grpcpp.h>

#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "stores/etcd/etcd_layout.hpp"  // the floor's dlock-txns shape uses the store's keys
#endif
#include <netdb.h>
#include <sys/socket.h>

namespace {

using json = nlohmann::json;

std::int64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// A short critical section that does not give the CPU away (sleeping would
// measure the scheduler, not the lock).
void Spin(int us) {
  if (us <= 0) return;
  const std::int64_t until = NowNs() + std::int64_t{us} * 1000;
  while (NowNs() < until) {
  }
}

void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

struct Options {
  std::string url;
  std::string scenario;
  std::string floor = "scripts";
  std::string name = "bench/lock";
  double seconds = 2.0;
  std::int64_t max_ops = 1'000'000;
  int procs = 2;
  int threads = 1;
  int hold_us = 0;
  int waiters = 1000;
  int pool = 10;
  int locks = 1000;
  int on_one = 1000;
};

std::string Scheme(const std::string& url) { return url.substr(0, url.find(':')); }

// ---- shared memory between the parent and its forked workers ------------

struct Record {
  std::int64_t req_ns;  // lock() called
  std::int64_t acq_ns;  // lock() returned
  std::int64_t rel_ns;
  std::int32_t proc;
  std::int32_t thread;
  std::uint64_t token;  // fencing token: the entry's place in the store's order
};

struct Shared {
  std::atomic<std::int64_t> count;  // records claimed
  std::atomic<int> ready;           // workers connected and waiting for go
  std::atomic<int> go;
  std::atomic<int> done;
  std::atomic<int> failed;
  std::atomic<std::int64_t> start_ns;
  std::int64_t capacity;
  Record records[1];  // really `capacity` of them
};
static_assert(std::atomic<std::int64_t>::is_always_lock_free, "the counters are shared across processes");

class SharedRegion {
 public:
  explicit SharedRegion(std::int64_t capacity)
      : size_(sizeof(Shared) + sizeof(Record) * static_cast<std::size_t>(capacity)) {
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    shared_ = new (p) Shared{};  // zero-filled by mmap; placement-new makes the atomics objects
    shared_->capacity = capacity;
  }
  ~SharedRegion() { ::munmap(shared_, size_); }
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  Shared* operator->() const { return shared_; }

 private:
  std::size_t size_;
  Shared* shared_;
};

// Runs fn(i) in `n` forked processes and returns their pids. A worker that
// throws marks `failed`, so the parent's barrier does not wait forever.
template <class Fn>
std::vector<pid_t> Fork(int n, Shared* shared, Fn fn) {
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (int i = 0; i < n; ++i) {
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      int rc = 0;
      try {
        fn(i);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "dlock-bench worker %d: %s\n", i, e.what());
        shared->failed.fetch_add(1);
        rc = 1;
      }
      std::fflush(nullptr);
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  return pids;
}

bool WaitAll(const std::vector<pid_t>& pids) {
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

// Waits (bounded) until `want` workers are connected and ready.
void WaitReady(Shared* shared, int want, double timeout_s = 60) {
  const std::int64_t until = NowNs() + static_cast<std::int64_t>(timeout_s * 1e9);
  while (shared->ready.load() < want) {
    if (shared->failed.load() > 0 || NowNs() > until) throw std::runtime_error("workers did not get ready");
    SleepMs(1);
  }
}

void Go(Shared* shared) {
  shared->start_ns.store(NowNs());
  shared->go.store(1);
}

void AwaitGo(Shared* shared) {
  shared->ready.fetch_add(1);
  while (shared->go.load() == 0) SleepMs(1);
}

// "host:port" of the first server in a redis:// or zk:// URL.
std::pair<std::string, int> HostPort(const std::string& url, int default_port) {
  std::string rest = url.substr(url.find("://") + 3);
  rest = rest.substr(0, rest.find_first_of("/?,"));
  if (auto at = rest.rfind('@'); at != std::string::npos) rest = rest.substr(at + 1);
  auto colon = rest.rfind(':');
  if (colon == std::string::npos) return {rest, default_port};
  return {rest.substr(0, colon), std::stoi(rest.substr(colon + 1))};
}

// The answer to `cmd` read until the server closes ("" on failure): a
// ZooKeeper four-letter command, or an HTTP/1.0 GET (etcd's /metrics).
std::string FourLetters(const std::string& host, int port, const char* cmd) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return "";
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  std::string out;
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
      ::write(fd, cmd, std::strlen(cmd)) == static_cast<ssize_t>(std::strlen(cmd))) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  return out;
}

// ---- server-side request counters (RunWorkers follows)  --------------------------------------

// Redis: the sum of `calls` over INFO commandstats, minus the INFO calls
// themselves. Empty when the store has no counters this driver can read.
class ServerCounter {
 public:
  explicit ServerCounter(const std::string& url) {
    kind_ = Scheme(url);
    if (kind_ != "redis" && kind_ != "zk" && kind_ != "etcd") return;
    std::tie(host_, port_) = HostPort(url, kind_ == "zk" ? 2181 : kind_ == "etcd" ? 2379 : 6379);
    enabled_ = true;
  }

  const std::string& kind() const { return kind_; }

  // Calls and microseconds per command name, commands run inside scripts
  // included (a script's time includes theirs).
  // For ZooKeeper, mntr's count of requests received ("packets_received",
  // pings included), with no time.
  // For etcd, the gRPC messages its server received per method of etcd's
  // API (grpc_server_msg_received_total on /metrics, the client port): one
  // per unary call; for a stream ("Watch (stream)", "LeaseKeepAlive
  // (stream)") one per message sent on it (a watch create or cancel, a
  // renewal). No time.
  std::optional<std::map<std::string, std::pair<std::int64_t, std::int64_t>>> Read() const {
    if (!enabled_) return std::nullopt;
    if (kind_ == "etcd") {
      const std::string text = FourLetters(host_, port_, "GET /metrics HTTP/1.0\r\n\r\n");
      std::map<std::string, std::pair<std::int64_t, std::int64_t>> calls;
      const std::string metric = "\ngrpc_server_msg_received_total{";
      for (auto pos = text.find(metric); pos != std::string::npos; pos = text.find(metric, pos + 1)) {
        const auto end = text.find('\n', pos + 1);
        const std::string line = text.substr(pos + 1, end == std::string::npos ? end : end - pos - 1);
        if (line.find("grpc_service=\"etcdserverpb.") == std::string::npos) continue;  // gRPC's health service
        const auto m = line.find("grpc_method=\"") + std::strlen("grpc_method=\"");
        std::string method = line.substr(m, line.find('"', m) - m);
        if (line.find("grpc_type=\"unary\"") == std::string::npos) method += " (stream)";
        calls[method].first += static_cast<std::int64_t>(std::stod(line.substr(line.rfind(' ') + 1)));
      }
      if (calls.empty()) return std::nullopt;
      return calls;
    }
    if (kind_ == "zk") {
      const std::string text = FourLetters(host_, port_, "mntr");
      auto at = text.find("zk_packets_received");
      if (at == std::string::npos) return std::nullopt;
      return std::map<std::string, std::pair<std::int64_t, std::int64_t>>{
          {"packets_received", {std::stoll(text.substr(at + std::strlen("zk_packets_received"))), 0}}};
    }
#ifdef DLOCK_BENCH_HIREDIS
    redisContext* c = redisConnect(host_.c_str(), port_);
    if (c == nullptr || c->err) {
      if (c) redisFree(c);
      return std::nullopt;
    }
    auto* reply = static_cast<redisReply*>(redisCommand(c, "INFO commandstats"));
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> calls;
    if (reply && reply->type == REDIS_REPLY_STRING) {
      std::string text(reply->str, reply->len);
      std::size_t pos = 0;
      while ((pos = text.find("cmdstat_", pos)) != std::string::npos) {
        auto colon = text.find(':', pos);
        auto at = text.find("calls=", colon);
        auto usec = text.find("usec=", at);
        calls[text.substr(pos + 8, colon - pos - 8)] = {std::stoll(text.substr(at + 6)),
                                                        std::stoll(text.substr(usec + 5))};
        pos = at;
      }
    }
    if (reply) freeReplyObject(reply);
    redisFree(c);
    return calls;
#else
    return std::nullopt;
#endif
  }

 private:
  std::string kind_;
  std::string host_;
  int port_ = 0;
  bool enabled_ = false;
};

using Counts = std::optional<std::map<std::string, std::pair<std::int64_t, std::int64_t>>>;

// What the server did per operation between `before` and now: every command
// (commands run by scripts count too: that is the server's work), and the
// scripts alone (EVAL/EVALSHA: one round trip each). For etcd: every gRPC
// message received, and as "scripts" the unary calls (one round trip each;
// the rest are messages on the watch and keep-alive streams).
json Requests(const ServerCounter& counter, const Counts& before, std::int64_t ops) {
  auto after = counter.Read();
  if (!before || !after || ops <= 0) return nullptr;
  std::int64_t total = 0, scripts = 0, script_usec = 0, other_usec = 0;
  json by_command = json::object();
  for (const auto& [cmd, n] : *after) {
    if (cmd == "info") continue;  // ours
    auto it = before->find(cmd);
    const std::int64_t d = n.first - (it == before->end() ? 0 : it->second.first);
    const std::int64_t us = n.second - (it == before->end() ? 0 : it->second.second);
    if (d == 0) continue;
    total += d;
    const bool round_trip = counter.kind() == "etcd" ? !cmd.ends_with(" (stream)") : cmd == "eval" || cmd == "evalsha";
    if (round_trip) {
      scripts += d;
      script_usec += us;
    } else {
      other_usec += us;  // also counts the commands scripts ran: an upper bound for the rest
    }
    by_command[cmd] = static_cast<double>(d) / static_cast<double>(ops);
  }
  const auto per = [ops](std::int64_t n) { return static_cast<double>(n) / static_cast<double>(ops); };
  return json{{"commands", total},
              {"commands_per_op", per(total)},
              {"scripts_per_op", per(scripts)},
              {"script_usec_per_op", per(script_usec)},
              {"other_usec_per_op", per(other_usec)},
              {"by_command_per_op", by_command}};
}

// Runs worker(i) in `procs` forked processes (or in a thread of this one,
// for mem://), starts them together once all are connected, and waits for
// them. Returns the server's request counters read just before the start.
template <class Fn>
Counts RunWorkers(Shared* shm, bool in_process, int procs, const ServerCounter& counter, Fn worker) {
  Counts before;
  if (in_process) {
    std::jthread run([&] { worker(0); });
    WaitReady(shm, 1);
    Go(shm);
    return before;
  }
  auto pids = Fork(procs, shm, worker);
  try {
    WaitReady(shm, procs);
  } catch (...) {
    for (pid_t pid : pids) ::kill(pid, SIGKILL);
    WaitAll(pids);
    throw;
  }
  before = counter.Read();
  Go(shm);
  if (!WaitAll(pids)) throw std::runtime_error("a worker failed");
  return before;
}

// ---- statistics ----------------------------------------------------------

double Percentile(std::vector<std::int64_t> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  auto i = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size()))) - 1;
  return static_cast<double>(v[std::min(i, v.size() - 1)]);
}

// Throughput, handoff latency and fairness of a set of holds on one lock.
json Analyze(std::vector<Record> recs) {
  std::sort(recs.begin(), recs.end(), [](const Record& a, const Record& b) { return a.acq_ns < b.acq_ns; });
  json out;
  out["holds"] = recs.size();
  if (recs.size() < 2) return out;
  std::vector<std::int64_t> any, cross;
  std::int64_t overlaps = 0, same_holder = 0, holder_changes = 0, token_inversions = 0;
  std::map<std::pair<int, int>, std::int64_t> per_holder;
  per_holder[{recs[0].proc, recs[0].thread}]++;
  for (std::size_t i = 1; i < recs.size(); ++i) {
    const Record& prev = recs[i - 1];
    const Record& cur = recs[i];
    per_holder[{cur.proc, cur.thread}]++;
    if (cur.acq_ns < prev.rel_ns) ++overlaps;  // must stay 0: two holders at once
    // Tokens follow the order entries entered the store's queue, so a grant
    // with a smaller token than the one before went out of store order.
    if (cur.token < prev.token) ++token_inversions;
    if (cur.proc == prev.proc && cur.thread == prev.thread) {
      ++same_holder;
      continue;
    }
    ++holder_changes;
    // A handoff: the next holder was already waiting when the lock was let go.
    if (cur.req_ns > prev.rel_ns) continue;
    const std::int64_t gap = cur.acq_ns - prev.rel_ns;
    any.push_back(gap);
    if (cur.proc != prev.proc) cross.push_back(gap);
  }
  // FIFO order: pairs of holds that got the lock in the other order than they
  // asked for it (an inversion count, by merge sort).
  std::vector<std::int64_t> req;
  for (const Record& r : recs) req.push_back(r.req_ns);
  std::int64_t overtakes = 0;
  std::vector<std::int64_t> tmp(req.size());
  for (std::size_t width = 1; width < req.size(); width *= 2) {
    for (std::size_t lo = 0; lo < req.size(); lo += 2 * width) {
      const std::size_t mid = std::min(lo + width, req.size()), hi = std::min(lo + 2 * width, req.size());
      std::size_t a = lo, b = mid, k = lo;
      while (a < mid && b < hi) {
        if (req[b] < req[a]) {
          overtakes += static_cast<std::int64_t>(mid - a);
          tmp[k++] = req[b++];
        } else {
          tmp[k++] = req[a++];
        }
      }
      while (a < mid) tmp[k++] = req[a++];
      while (b < hi) tmp[k++] = req[b++];
    }
    std::swap(req, tmp);
  }
  const double span_s = static_cast<double>(recs.back().rel_ns - recs.front().acq_ns) / 1e9;
  double sum = 0, sum_sq = 0;
  std::int64_t lo = INT64_MAX, hi = 0;
  for (const auto& [holder, n] : per_holder) {
    sum += static_cast<double>(n);
    sum_sq += static_cast<double>(n) * static_cast<double>(n);
    lo = std::min(lo, n);
    hi = std::max(hi, n);
  }
  out["seconds"] = span_s;
  out["holds_per_sec"] = static_cast<double>(recs.size()) / span_s;
  // The lock passing to another holder; a holder taking it again right after
  // itself is not a handoff.
  out["handoffs_per_sec"] = static_cast<double>(holder_changes) / span_s;
  out["overlaps"] = overlaps;
  out["out_of_store_order"] = token_inversions;
  out["holders"] = per_holder.size();
  // Jain's index over holds per holder: 1 = everyone got the same share.
  out["fairness_jain"] = sum * sum / (static_cast<double>(per_holder.size()) * sum_sq);
  out["holds_min"] = lo;
  out["holds_max"] = hi;
  // A holder taking the lock again right after itself (others may not have
  // been waiting yet: see overtakes for the order).
  out["reacquire_fraction"] = static_cast<double>(same_holder) / static_cast<double>(recs.size() - 1);
  // Holds that were overtaken by a later request, per hold (0 = strict FIFO).
  out["overtakes_per_hold"] = static_cast<double>(overtakes) / static_cast<double>(recs.size());
  out["handoff_us"] = {{"n", any.size()},
                       {"p50", Percentile(any, 50) / 1e3},
                       {"p90", Percentile(any, 90) / 1e3},
                       {"p99", Percentile(any, 99) / 1e3},
                       {"max", Percentile(any, 100) / 1e3}};
  out["cross_process_handoff_us"] = {
      {"n", cross.size()}, {"p50", Percentile(cross, 50) / 1e3}, {"p99", Percentile(cross, 99) / 1e3}};
  return out;
}

// ---- scenarios -----------------------------------------------------------

// 1. One client, lock then unlock, in a loop.
json Cycles(const Options& o) {
  ServerCounter counter(o.url);
  auto client = dlock::Client::connect(o.url);
  dlock::Mutex m(client, o.name);
  for (int i = 0; i < 10; ++i) {  // warm up: session, connections, scripts
    m.lock();
    m.unlock();
  }
  const auto before = counter.Read();
  const std::int64_t start = NowNs(), until = start + static_cast<std::int64_t>(o.seconds * 1e9);
  std::int64_t n = 0;
  while (n < o.max_ops && NowNs() < until) {
    m.lock();
    m.unlock();
    ++n;
  }
  const double s = static_cast<double>(NowNs() - start) / 1e9;
  return {{"cycles", n},
          {"seconds", s},
          {"cycles_per_sec", static_cast<double>(n) / s},
          {"requests", Requests(counter, before, n)}};
}

// 1'. The floor of a host-local lock, in plain system calls on the same
// file system. --floor flock: what flock(1) does, the kernel's own lock on
// one file (no queue, no token, no record of the holder). Otherwise the
// operations a cycle of a queue with fencing tokens and visible holders
// needs: draw a token from a counter file under flock, create the entry
// file exclusively with the owner record and lock it (so that a waiter can
// tell a live holder from a dead one), list the queue, unlink and close.
json FileFloor(const Options& o) {
  const std::string root = o.url.substr(std::string("file://").size());
  const std::string dir = root + "/bench-floor-" + std::to_string(::getpid());
  ::mkdir(root.c_str(), 0755);
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) throw std::runtime_error("floor: cannot create " + dir);
  auto fail = [](const std::string& what) { throw std::runtime_error("floor: " + what + ": " + std::strerror(errno)); };
  std::function<void(std::int64_t)> cycle;
  std::string ops;
  const std::string lock_path = dir + "/lock", counter_path = dir + "/counter";
  const std::string record(120, 'x');  // about the size of dlock's owner record
  if (o.floor == "flock") {
    cycle = [&](std::int64_t) {
      int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) fail("open");
      if (::flock(fd, LOCK_EX) != 0 || ::flock(fd, LOCK_UN) != 0) fail("flock");
      ::close(fd);
    };
    ops = "open + flock(LOCK_EX) + flock(LOCK_UN) + close";
  } else {
    cycle = [&](std::int64_t n) {
      int counter = ::open(counter_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (counter < 0 || ::flock(counter, LOCK_EX) != 0) fail("counter");
      std::uint64_t token = 0;
      if (::pread(counter, &token, sizeof token, 0) < 0) fail("pread");
      ++token;
      if (::pwrite(counter, &token, sizeof token, 0) != sizeof token) fail("pwrite");
      ::flock(counter, LOCK_UN);
      ::close(counter);
      const std::string entry = dir + "/e-" + std::to_string(n);
      int fd = ::open(entry.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0) fail("create " + entry);
      if (::write(fd, record.data(), record.size()) != static_cast<ssize_t>(record.size())) fail("write");
      if (::flock(fd, LOCK_EX | LOCK_NB) != 0) fail("flock");
      DIR* d = ::opendir(dir.c_str());
      if (d == nullptr) fail("opendir");
      while (::readdir(d) != nullptr) {
      }
      ::closedir(d);
      if (::unlink(entry.c_str()) != 0) fail("unlink");
      ::close(fd);
    };
    ops = "token (flock, pread, pwrite on a counter) + create entry O_EXCL, write, flock + readdir + unlink";
  }
  const std::int64_t start = NowNs(), until = start + static_cast<std::int64_t>(o.seconds * 1e9);
  std::int64_t n = 0;
  while (n < o.max_ops && NowNs() < until) cycle(n++);
  const double secs = static_cast<double>(NowNs() - start) / 1e9;
  ::unlink(lock_path.c_str());
  ::unlink(counter_path.c_str());
  ::rmdir(dir.c_str());
  return {{"cycles", n}, {"seconds", secs}, {"cycles_per_sec", static_cast<double>(n) / secs}, {"ops", ops}};
}

#ifdef DLOCK_BENCH_ETCD
// 1'. etcd: the bare v3 RPCs of one uncontended cycle, from a plain loop of
// synchronous gRPC calls over the generated stubs, on one lease granted
// before the loop (a session is made once, as in every other driver).
//  --floor go (the default): the shape of Go's concurrency.Mutex (etcd
//    3.4, clientv3/concurrency/mutex.go): one Txn {if CreateRevision(key) == 0
//    then Put(key, lease), Range(prefix, first create) else Get(key),
//    Range(prefix, first create)}, owned when the first key is ours; then a
//    Txn {if CreateRevision(key) == rev then Delete(key)} (Go's Unlock is a
//    plain Delete; the compare is what dlock's remove adds, at no round trip).
//  --floor dlock-txns: the three unary calls dlock's etcd store makes per
//    uncontended cycle, with its own keys and Txn bodies (etcd_store.cpp:
//    put_entry, Watches::check, remove), without the client around them and
//    without the watch stream's create and cancel messages.
namespace epb = etcdserverpb;

json EtcdFloor(const Options& o) {
  ServerCounter counter(o.url);
  const auto [host, port] = HostPort(o.url, 2379);
  auto channel = grpc::CreateChannel(host + ":" + std::to_string(port), grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)))
    throw std::runtime_error("floor: cannot connect to etcd");
  auto kv = epb::KV::NewStub(channel);
  auto lease_stub = epb::Lease::NewStub(channel);
  auto check = [](const grpc::Status& s, const char* what) {
    if (!s.ok()) throw std::runtime_error(std::string("floor: ") + what + ": " + s.error_message());
  };
  std::int64_t lease = 0;
  {
    grpc::ClientContext ctx;
    epb::LeaseGrantRequest req;
    req.set_ttl(30);
    epb::LeaseGrantResponse resp;
    check(lease_stub->LeaseGrant(&ctx, req, &resp), "LeaseGrant");
    lease = resp.id();
  }
  auto txn = [&](const epb::TxnRequest& req) {
    grpc::ClientContext ctx;
    epb::TxnResponse resp;
    check(kv->Txn(&ctx, req, &resp), "Txn");
    return resp;
  };
  auto range = [](const std::string& key, const std::string& end, bool keys_only) {
    epb::RequestOp op;
    auto* r = op.mutable_request_range();
    r->set_key(key);
    if (!end.empty()) r->set_range_end(end);
    r->set_keys_only(keys_only);
    return op;
  };
  auto put = [lease](const std::string& key, const std::string& value) {
    epb::RequestOp op;
    auto* p = op.mutable_request_put();
    p->set_key(key);
    p->set_value(value);
    p->set_lease(lease);
    return op;
  };
  auto del = [](const std::string& key) {
    epb::RequestOp op;
    op.mutable_request_delete_range()->set_key(key);
    return op;
  };
  auto compare = [](const std::string& key, epb::Compare::CompareTarget target, std::int64_t value) {
    epb::Compare c;
    c.set_key(key);
    c.set_target(target);
    c.set_result(epb::Compare::EQUAL);
    if (target == epb::Compare::CREATE) c.set_create_revision(value);
    if (target == epb::Compare::VERSION) c.set_version(value);
    return c;
  };
  namespace ed = dlock::internal::etcd;
  const std::string queue = "bench/floor-etcd/" + o.name + "-" + std::to_string(::getpid());
  std::function<void()> cycle;
  std::string ops;
  if (o.floor == "go") {
    const std::string pfx = queue + "/", key = pfx + ed::LeaseHex(lease), end = ed::PrefixEnd(pfx);
    epb::RequestOp owner = range(pfx, end, false);  // Go's WithFirstCreate(): sort by create, limit 1
    owner.mutable_request_range()->set_sort_target(epb::RangeRequest::CREATE);
    owner.mutable_request_range()->set_sort_order(epb::RangeRequest::ASCEND);
    owner.mutable_request_range()->set_limit(1);
    cycle = [&, key, owner] {
      epb::TxnRequest lock;
      *lock.add_compare() = compare(key, epb::Compare::CREATE, 0);
      *lock.add_success() = put(key, "");
      *lock.add_success() = owner;
      *lock.add_failure() = range(key, "", false);
      *lock.add_failure() = owner;
      const epb::TxnResponse r = txn(lock);
      const std::int64_t rev = r.header().revision();
      const auto& first = r.responses(1).response_range().kvs();
      if (!r.succeeded() || first.empty() || first[0].create_revision() != rev)
        throw std::runtime_error("floor: the lock was not free");
      epb::TxnRequest unlock;
      *unlock.add_compare() = compare(key, epb::Compare::CREATE, rev);
      *unlock.add_success() = del(key);
      if (!txn(unlock).succeeded()) throw std::runtime_error("floor: the fenced delete failed");
    };
    ops =
        "Txn{if CreateRevision(key)==0 then Put(key, lease), Range(prefix, first create)} + "
        "Txn{if CreateRevision(key)==rev then Delete(key)} (gRPC C++, sync)";
  } else {
    const ed::Layout layout("");
    const std::string suffix = ed::FirstSuffix(lease), key = layout.entry_key(queue, suffix),
                      record = layout.record_key(queue, suffix), reservation = ed::ReservationSuffix(suffix);
    cycle = [&, key, record, reservation, suffix] {
      const std::string attempt = std::to_string(NowNs()) + "0123456789abcdef";
      dlock::OwnerRecord owner{"bench-host", ::getpid(), "bench-thread", "", 0};
      epb::TxnRequest append;  // put_entry (a "lock" entry: no reservation)
      *append.add_compare() = compare(key, epb::Compare::CREATE, 0);
      *append.add_compare() = compare(layout.fence_key(attempt), epb::Compare::VERSION, 0);
      *append.add_success() = put(key, "");
      *append.add_success() = put(record, ed::EncodeRecord(dlock::entry_kind::kLock, attempt, owner));
      *append.add_success() = range(layout.queue_dir(queue), ed::PrefixEnd(layout.queue_dir(queue)), true);
      *append.add_success() = range(layout.record_dir(queue), ed::PrefixEnd(layout.record_dir(queue)), false);
      *append.add_failure() = range(record, "", false);
      *append.add_failure() = range(layout.fence_key(attempt), "", true);
      const epb::TxnResponse r = txn(append);
      if (!r.succeeded()) throw std::runtime_error("floor: the append failed");
      const std::int64_t rev = r.header().revision();
      epb::TxnRequest remove;  // remove
      *remove.add_compare() = compare(key, epb::Compare::CREATE, rev);
      *remove.add_success() = del(key);
      *remove.add_success() = del(record);
      epb::RequestOp nested;
      auto* inner = nested.mutable_request_txn();
      *inner->add_compare() = compare(layout.entry_key(queue, reservation), epb::Compare::CREATE, rev);
      *inner->add_compare() = compare(layout.record_key(queue, reservation), epb::Compare::VERSION, 0);
      *inner->add_success() = del(layout.entry_key(queue, reservation));
      *remove.add_success() = std::move(nested);
      if (!txn(remove).succeeded()) throw std::runtime_error("floor: the remove failed");
    };
    ops = "dlock's append Txn + remove Txn (gRPC C++, sync; the hold's watch needs no reading)";
  }
  const auto before = counter.Read();
  const std::int64_t start = NowNs(), until = start + static_cast<std::int64_t>(o.seconds * 1e9);
  std::int64_t n = 0;
  while (n < o.max_ops && NowNs() < until) {
    cycle();
    ++n;
  }
  const double secs = static_cast<double>(NowNs() - start) / 1e9;
  json requests = Requests(counter, before, n);
  {
    grpc::ClientContext ctx;
    epb::LeaseRevokeRequest req;
    req.set_id(lease);
    epb::LeaseRevokeResponse resp;
    (void)lease_stub->LeaseRevoke(&ctx, req, &resp);
  }
  return {{"cycles", n},
          {"seconds", secs},
          {"cycles_per_sec", static_cast<double>(n) / secs},
          {"ops", ops},
          {"requests", requests}};
}
#endif

// 1'. The protocol floor: the bare store operations one cycle needs, with
// the store's official C client and nothing else.
json Floor(const Options& o) {
#ifdef DLOCK_BENCH_HIREDIS
  if (Scheme(o.url) == "redis") {
    ServerCounter counter(o.url);
    const auto [host, port] = HostPort(o.url, 6379);
    redisContext* c = redisConnect(host.c_str(), port);
    if (c == nullptr || c->err) throw std::runtime_error("floor: cannot connect to redis");
    auto load = [c](const std::string& src) {
      auto* r = static_cast<redisReply*>(redisCommand(c, "SCRIPT LOAD %b", src.data(), src.size()));
      if (r == nullptr || r->type != REDIS_REPLY_STRING) throw std::runtime_error("floor: SCRIPT LOAD failed");
      std::string sha(r->str, r->len);
      freeReplyObject(r);
      return sha;
    };
    // One command, arguments as strings; true if the reply satisfies ok().
    auto call = [c](const std::vector<std::string>& argv, auto ok) {
      std::vector<const char*> ptrs;
      std::vector<std::size_t> lens;
      for (const auto& a : argv) {
        ptrs.push_back(a.data());
        lens.push_back(a.size());
      }
      auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), ptrs.data(), lens.data()));
      const bool good = r != nullptr && ok(r);
      if (r) freeReplyObject(r);
      return good;
    };
    std::mt19937_64 rng(std::random_device{}());
    auto hex = [&rng] {
      char buf[33];
      std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(rng()),
                    static_cast<unsigned long long>(rng()));
      return std::string(buf);
    };
    std::function<bool()> cycle;
    std::string ops;
    if (o.floor == "setnx") {
      // SET NX PX, then the compare-and-delete every such lock releases with.
      const std::string sha =
          load("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0");
      const std::string key = "bench:floor:" + o.name;
      cycle = [=] {
        const std::string token = hex();
        return call({"SET", key, token, "NX", "PX", "30000"},
                    [](redisReply* r) { return r->type == REDIS_REPLY_STATUS; }) &&
               call({"EVALSHA", sha, "1", key, token}, [](redisReply* r) { return r->integer == 1; });
      };
      ops = "SET NX PX + EVALSHA compare-and-delete (hiredis)";
    } else {
      // dlock's own append and remove scripts, with the keys and arguments
      // the redis:// store passes (see redis_scripts.hpp): the protocol
      // without the client around it.
      namespace rs = dlock::internal::redis;
      const std::string append = load(rs::ScriptSource(rs::ScriptId::kAppend));
      const std::string remove = load(rs::ScriptSource(rs::ScriptId::kRemove));
      const std::string base = "dlock:{bench/floor/" + o.name + "}:", sid = hex();
      cycle = [=] {
        const std::string id = hex();
        return call({"EVALSHA", append, "4", base + "q", base + "n", base + "e:" + id, base + "s:" + sid, base,
                     base + "c", id, "lock", hex(), sid, "{}", "30000", ""},
                    [](redisReply* r) { return r->type == REDIS_REPLY_ARRAY; }) &&
               call({"EVALSHA", remove, "1", base + "q", base, base + "c", id, sid},
                    [](redisReply* r) { return r->type == REDIS_REPLY_INTEGER && r->integer == 1; });
      };
      ops = "dlock's append + remove scripts by EVALSHA (hiredis)";
    }
    const auto before = counter.Read();
    const std::int64_t start = NowNs(), until = start + static_cast<std::int64_t>(o.seconds * 1e9);
    std::int64_t n = 0;
    while (n < o.max_ops && NowNs() < until) {
      if (!cycle()) throw std::runtime_error("floor: a command failed");
      ++n;
    }
    const double s = static_cast<double>(NowNs() - start) / 1e9;
    redisFree(c);
    return {{"cycles", n},
            {"seconds", s},
            {"cycles_per_sec", static_cast<double>(n) / s},
            {"ops", ops},
            {"requests", Requests(counter, before, n)}};
  }
#endif
#ifdef DLOCK_BENCH_ZOOKEEPER
  if (Scheme(o.url) == "zk") {
    // What one uncontended cycle of a ZooKeeper lock recipe needs: create an
    // ephemeral sequential node, list the children (am I first?), delete it.
    ServerCounter counter(o.url);
    const auto [host, port] = HostPort(o.url, 2181);
    zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR);
    const std::string hosts = host + ":" + std::to_string(port);
    zhandle_t* zh = zookeeper_init(hosts.c_str(), nullptr, 10'000, nullptr, nullptr, 0);
    if (zh == nullptr) throw std::runtime_error("floor: zookeeper_init failed");
    const std::int64_t connect_until = NowNs() + 10'000'000'000;
    while (zoo_state(zh) != ZOO_CONNECTED_STATE) {
      if (NowNs() > connect_until) throw std::runtime_error("floor: cannot connect to zookeeper");
      SleepMs(5);
    }
    const std::string parent = "/dlock-bench-floor";
    int rc = zoo_create(zh, parent.c_str(), "", 0, &ZOO_OPEN_ACL_UNSAFE, 0, nullptr, 0);
    if (rc != ZOK && rc != ZNODEEXISTS) throw std::runtime_error("floor: cannot create " + parent);
    const std::string prefix = parent + "/lock-";
    const auto before = counter.Read();
    const std::int64_t start = NowNs(), until = start + static_cast<std::int64_t>(o.seconds * 1e9);
    std::int64_t n = 0;
    while (n < o.max_ops && NowNs() < until) {
      char created[512];
      rc = zoo_create(zh, prefix.c_str(), "", 0, &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL_SEQUENTIAL, created,
                      sizeof created);
      if (rc != ZOK) throw std::runtime_error("floor: create failed");
      String_vector children{};
      rc = zoo_get_children(zh, parent.c_str(), 0, &children);
      if (rc != ZOK) throw std::runtime_error("floor: get_children failed");
      deallocate_String_vector(&children);
      if (zoo_delete(zh, created, -1) != ZOK) throw std::runtime_error("floor: delete failed");
      ++n;
    }
    const double secs = static_cast<double>(NowNs() - start) / 1e9;
    zookeeper_close(zh);
    return {{"cycles", n},
            {"seconds", secs},
            {"cycles_per_sec", static_cast<double>(n) / secs},
            {"ops", "create ephemeral sequential + get_children + delete (libzookeeper_mt, sync)"},
            {"requests", Requests(counter, before, n)}};
  }
#endif
  if (Scheme(o.url) == "file") return FileFloor(o);
#ifdef DLOCK_BENCH_ETCD
  if (Scheme(o.url) == "etcd") {
    Options go = o;
    if (go.floor == "scripts") go.floor = "go";  // the default
    return EtcdFloor(go);
  }
#endif
  throw std::runtime_error("floor: no floor loop for " + Scheme(o.url));
}

// Every thread of every process loops lock / short critical section /
// unlock on one lock until the time or the record budget runs out.
// Scenario 2 (handoff latency) is this with one thread per process;
// scenario 3 (contended throughput) with several.
json Contend(const Options& o) {
  const bool in_process = Scheme(o.url) == "mem";
  const int procs = in_process ? 1 : o.procs;
  SharedRegion shm(o.max_ops);
  ServerCounter counter(o.url);
  auto worker = [&](int proc) {
    auto client = dlock::Client::connect(o.url);
    dlock::Mutex m(client, o.name);
    AwaitGo(shm.operator->());
    const std::int64_t until = shm->start_ns.load() + static_cast<std::int64_t>(o.seconds * 1e9);
    std::vector<std::jthread> threads;
    for (int t = 0; t < o.threads; ++t) {
      threads.emplace_back([&, t] {
        while (NowNs() < until) {
          const std::int64_t req = NowNs();
          m.lock();
          const std::int64_t acq = NowNs();
          const std::uint64_t token = m.fencing_token().value_or(0);
          const std::int64_t slot = shm->count.fetch_add(1);
          Spin(o.hold_us);
          const std::int64_t rel = NowNs();
          if (slot < shm->capacity) shm->records[slot] = {req, acq, rel, proc, t, token};
          m.unlock();
          if (slot >= shm->capacity) break;
        }
      });
    }
  };
  const auto before = RunWorkers(shm.operator->(), in_process, procs, counter, worker);
  const std::int64_t n = std::min(shm->count.load(), shm->capacity);
  json out = Analyze(std::vector<Record>(shm->records, shm->records + n));
  out["procs"] = procs;
  out["threads"] = o.threads;
  out["hold_us"] = o.hold_us;
  out["requests"] = Requests(counter, before, n);
  return out;
}

// 4. `waiters` tasks, split over the processes, each run by a pool of
// `pool` threads per process; every task takes the lock once. The server's
// requests per handoff must not grow with the number of waiters.
json Waiters(const Options& o) {
  const bool in_process = Scheme(o.url) == "mem";
  const int procs = in_process ? 1 : o.procs;
  SharedRegion shm(o.waiters);
  ServerCounter counter(o.url);
  auto worker = [&](int proc) {
    auto client = dlock::Client::connect(o.url);
    dlock::Mutex m(client, o.name);
    const int tasks = o.waiters / procs + (proc < o.waiters % procs ? 1 : 0);
    std::atomic<int> next{0};
    // Every task is queued before any runs: the pool starts together.
    std::latch arrived(o.pool);
    std::atomic<bool> start{false};
    std::vector<std::jthread> pool;
    for (int t = 0; t < o.pool; ++t) {
      pool.emplace_back([&, t] {
        arrived.count_down();
        start.wait(false);
        while (next.fetch_add(1) < tasks) {
          const std::int64_t req = NowNs();
          m.lock();
          const std::int64_t acq = NowNs();
          const std::uint64_t token = m.fencing_token().value_or(0);
          Spin(o.hold_us);
          const std::int64_t slot = shm->count.fetch_add(1);
          const std::int64_t rel = NowNs();
          if (slot < shm->capacity) shm->records[slot] = {req, acq, rel, proc, t, token};
          m.unlock();
        }
      });
    }
    arrived.wait();
    AwaitGo(shm.operator->());
    start = true;
    start.notify_all();
  };
  const auto before = RunWorkers(shm.operator->(), in_process, procs, counter, worker);
  const double total_s = static_cast<double>(NowNs() - shm->start_ns.load()) / 1e9;
  const std::int64_t n = std::min(shm->count.load(), shm->capacity);
  json out = Analyze(std::vector<Record>(shm->records, shm->records + n));
  out["waiters"] = o.waiters;
  out["procs"] = procs;
  out["pool"] = o.pool;
  out["total_seconds"] = total_s;
  out["requests"] = Requests(counter, before, n);  // includes connects and session setup
  return out;
}

struct ProcStatus {
  std::int64_t rss_kb = 0;
  std::int64_t threads = 0;
};

ProcStatus ReadStatus() {
  ProcStatus s;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_kb = std::stoll(line.substr(6));
    if (line.rfind("Threads:", 0) == 0) s.threads = std::stoll(line.substr(8));
  }
  return s;
}

// 5. A client process waiting on `locks` different locks at once, all held
// by another process. The API blocks the calling thread, so each wait is one
// benchmark thread; what dlock adds is the rest.
json Footprint(const Options& o) {
  SharedRegion shm(1);
  auto holder = Fork(1, shm.operator->(), [&](int) {
    auto client = dlock::Client::connect(o.url);
    std::vector<dlock::Hold> holds;
    for (int i = 0; i < o.locks; ++i) {
      dlock::Mutex m(client, o.name + "/" + std::to_string(i));
      auto h = m.acquire();
      if (!h) throw std::runtime_error("holder: acquire failed");
      holds.push_back(std::move(*h));
    }
    shm->ready.store(1);
    while (shm->done.load() == 0) SleepMs(5);
  });
  const std::int64_t until = NowNs() + 60'000'000'000;
  while (shm->ready.load() == 0) {
    if (shm->failed.load() > 0 || NowNs() > until) throw std::runtime_error("holder did not get ready");
    SleepMs(5);
  }
  const ProcStatus base = ReadStatus();
  json out;
  {
    auto client = dlock::Client::connect(o.url);
    std::vector<std::unique_ptr<dlock::Mutex>> mutexes;
    for (int i = 0; i < o.locks; ++i)
      mutexes.push_back(std::make_unique<dlock::Mutex>(client, o.name + "/" + std::to_string(i)));
    std::stop_source stop;
    std::atomic<int> started{0}, got{0};
    std::vector<std::jthread> threads;
    for (int i = 0; i < o.locks; ++i) {
      threads.emplace_back([&, i] {
        started.fetch_add(1);
        if (mutexes[i]->lock_for(dlock::kForever, stop.get_token())) {
          got.fetch_add(1);
          mutexes[i]->unlock();
        }
      });
    }
    while (started.load() < o.locks) SleepMs(5);
    SleepMs(o.seconds >= 1 ? 2000 : 300);  // let every wait reach the store
    const ProcStatus waiting = ReadStatus();
    stop.request_stop();
    threads.clear();  // joins
    out = {{"locks", o.locks},
           {"base_rss_kb", base.rss_kb},
           {"base_threads", base.threads},
           {"rss_kb", waiting.rss_kb},
           {"threads", waiting.threads},
           {"rss_kb_per_lock", static_cast<double>(waiting.rss_kb - base.rss_kb) / o.locks},
           // Threads that are neither the benchmark's waiters nor its main thread.
           {"dlock_threads", waiting.threads - o.locks - base.threads},
           {"acquired_while_held", got.load()}};
  }
  shm->done.store(1);
  if (!WaitAll(holder)) throw std::runtime_error("the holder failed");
  return out;
}

// ---- 6. async-footprint ---------------------------------------------------

// What the processes of async-footprint share: the holder's and the waiter's
// steps, and the waiter's JSON result.
struct AsyncShared {
  std::atomic<int> failed;
  std::atomic<int> holder_ready;  // the holder holds every lock
  std::atomic<int> release;       // the waiter asks the holder to let go
  std::atomic<int> released;      // the holder has let go of everything
  std::atomic<int> done;          // the waiter is finished: the holder may exit
  std::atomic<std::int64_t> release_start_ns;
  std::atomic<std::int64_t> release_end_ns;
  // The holder's holds that were no longer held (kLost, kUncertain) when it
  // said it was ready, and when it was asked to release.
  std::atomic<std::int64_t> holder_not_held_at_ready;
  std::atomic<std::int64_t> holder_not_held_at_release;
  std::atomic<std::int64_t> holder_lost_at_ready;  // of those, kLost
  char result[1 << 20];                            // the waiter's JSON, NUL-terminated
};

class AsyncRegion {
 public:
  AsyncRegion() {
    void* p = ::mmap(nullptr, sizeof(AsyncShared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    shared_ = new (p) AsyncShared{};
  }
  ~AsyncRegion() { ::munmap(shared_, sizeof(AsyncShared)); }
  AsyncRegion(const AsyncRegion&) = delete;
  AsyncRegion& operator=(const AsyncRegion&) = delete;
  AsyncShared* operator->() const { return shared_; }

 private:
  AsyncShared* shared_;
};

// Forks one process running fn(); a throw marks `failed`.
template <class Fn>
pid_t ForkOne(AsyncShared* shared, const char* who, Fn fn) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int rc = 0;
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dlock-bench %s: %s\n", who, e.what());
      shared->failed.fetch_add(1);
      rc = 1;
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
  return pid;
}

// waitpid, bounded: a process still running after `timeout_s` is killed.
// True if it exited with status 0.
bool WaitBounded(pid_t pid, double timeout_s, bool* killed) {
  const std::int64_t until = NowNs() + static_cast<std::int64_t>(timeout_s * 1e9);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (NowNs() > until) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      *killed = true;
      return false;
    }
    SleepMs(10);
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// Polls until pred() or the time runs out; true if pred() held.
template <class Pred>
bool WaitFor(double timeout_s, Pred pred, int poll_ms = 1) {
  const std::int64_t until = NowNs() + static_cast<std::int64_t>(timeout_s * 1e9);
  while (!pred()) {
    if (NowNs() > until) return false;
    SleepMs(poll_ms);
  }
  return true;
}

// Releases every hold in `holds`, from `threads` threads (each release is a
// store round trip).
void ReleaseAll(std::vector<std::optional<dlock::Hold>>& holds, int threads) {
  std::atomic<std::size_t> next{0};
  std::vector<std::jthread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1)) < holds.size();)
        if (holds[i]) holds[i]->release();
    });
  }
}

// The holder of async-footprint: takes every lock in `names` (all acquires
// started at once), tells the waiter, and on its request releases them all
// (from 8 threads), recording when it started and finished.
void AsyncHolder(const Options& o, AsyncShared* shm, const std::vector<std::string>& names) {
  dlock::ClientOptions copts;
  copts.label = "dlock-bench holder";
  auto client = dlock::Client::connect(o.url, copts);
  std::vector<std::unique_ptr<dlock::Mutex>> mutexes;
  for (const auto& n : names) mutexes.push_back(std::make_unique<dlock::Mutex>(client, n));
  std::vector<std::optional<dlock::Hold>> holds(names.size());
  std::atomic<std::size_t> completed{0}, bad{0};
  for (std::size_t i = 0; i < names.size(); ++i) {
    mutexes[i]->async_acquire(dlock::kForever, {}, [&, i](dlock::Result<std::optional<dlock::Hold>> r) {
      if (r.ok() && r.value()) {
        holds[i] = std::move(r).value();
      } else {
        bad.fetch_add(1);
      }
      completed.fetch_add(1, std::memory_order_release);
    });
  }
  if (!WaitFor(
          300, [&] { return completed.load(std::memory_order_acquire) == names.size(); }, 5))
    throw std::runtime_error("holder: acquires did not complete in 300 s");
  if (bad.load() > 0) throw std::runtime_error("holder: " + std::to_string(bad.load()) + " acquires failed");
  auto not_held = [&] {
    return std::count_if(holds.begin(), holds.end(),
                         [](const std::optional<dlock::Hold>& h) { return !h || !h->held(); });
  };
  shm->holder_not_held_at_ready.store(not_held());
  shm->holder_lost_at_ready.store(std::count_if(holds.begin(), holds.end(), [](const std::optional<dlock::Hold>& h) {
    return h && h->state() == dlock::HoldState::kLost;
  }));
  shm->holder_ready.store(1);
  while (shm->release.load() == 0 && shm->done.load() == 0) SleepMs(1);
  shm->holder_not_held_at_release.store(not_held());
  if (shm->release.load() != 0) {
    shm->release_start_ns.store(NowNs());
    ReleaseAll(holds, 8);
    shm->release_end_ns.store(NowNs());
    shm->released.store(1);
  }
  while (shm->done.load() == 0) SleepMs(5);
}

// Waits (bounded) until the queue `name` shows `want` entries; the seconds
// it took, or -1 on a timeout.
double WaitQueued(const dlock::Client& client, const std::string& name, std::size_t want, double timeout_s) {
  const std::int64_t start = NowNs();
  const bool ok = WaitFor(
      timeout_s,
      [&] {
        auto entries = client.list_entries(name, false);
        return entries.ok() && entries.value().size() >= want;
      },
      5);
  return ok ? static_cast<double>(NowNs() - start) / 1e9 : -1;
}

// Waits (bounded) until every queue in `names` shows `want` entries (the
// last one first seen there need not mean all are); the seconds it took, or
// -1 on a timeout. `queued` gets how many did at the last pass.
double WaitAllQueued(const dlock::Client& client, const std::vector<std::string>& names, std::size_t want,
                     double timeout_s, std::size_t* queued) {
  const std::int64_t start = NowNs(), until = start + static_cast<std::int64_t>(timeout_s * 1e9);
  std::vector<bool> seen(names.size(), false);
  std::size_t n = 0;
  while (true) {
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (seen[i]) continue;
      auto entries = client.list_entries(names[i], false);
      if (entries.ok() && entries.value().size() >= want) {
        seen[i] = true;
        ++n;
      }
    }
    *queued = n;
    if (n == names.size()) return static_cast<double>(NowNs() - start) / 1e9;
    if (NowNs() > until) return -1;
    SleepMs(200);
  }
}

double Seconds(std::int64_t from_ns, std::int64_t to_ns) { return static_cast<double>(to_ns - from_ns) / 1e9; }

// Open descriptors of this process.
std::int64_t CountFds() {
  std::int64_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
    --n;  // the listing's own
  }
  return n;
}

json StatusJson(const ProcStatus& s) { return {{"threads", s.threads}, {"rss_kb", s.rss_kb}, {"fds", CountFds()}}; }

// Runs holder and waiter of one part in two forked processes; returns the
// waiter's JSON (with "holder_ok", and "error" if either failed or hung).
template <class Waiter>
json RunAsyncPart(const Options& o, const std::vector<std::string>& names, Waiter waiter) {
  AsyncRegion shm;
  const pid_t holder = ForkOne(shm.operator->(), "holder", [&] { AsyncHolder(o, shm.operator->(), names); });
  const pid_t waiting = ForkOne(shm.operator->(), "waiter", [&] {
    json out;
    try {
      out = waiter(shm.operator->());
    } catch (const std::exception& e) {
      out["error"] = e.what();
    }
    shm->done.store(1);
    const std::string text = out.dump();
    std::snprintf(shm->result, sizeof shm->result, "%s", text.c_str());
  });
  bool waiter_killed = false, holder_killed = false;
  const bool waiter_ok = WaitBounded(waiting, 1800, &waiter_killed);
  shm->done.store(1);
  const bool holder_ok = WaitBounded(holder, 120, &holder_killed);
  json out = shm->result[0] != '\0' ? json::parse(shm->result) : json::object();
  if (!waiter_ok)
    out["error"] = std::string("waiter process ") + (waiter_killed ? "killed after 1800 s" : "failed") + "; " +
                   out.value("error", "");
  out["holder_ok"] = holder_ok;
  out["holder_not_held_at_ready"] = shm->holder_not_held_at_ready.load();
  out["holder_not_held_at_release"] = shm->holder_not_held_at_release.load();
  out["holder_lost_at_ready"] = shm->holder_lost_at_ready.load();
  if (holder_killed) out["holder_error"] = "holder did not exit after the waiter: killed";
  return out;
}

// 6a. `locks` different locks held by another process; this process starts
// an async_acquire on each at once, with no thread per acquire. Round 1
// cancels them all through one stop_source (each callback must deliver
// nullopt exactly once, and nothing of them may be left in the store);
// round 2 starts them again and the holder lets go: the time until every
// callback has its Hold.
json AsyncManyLocks(const Options& o) {
  std::vector<std::string> names;
  const std::string prefix = o.name + "/async-" + std::to_string(::getpid()) + "/";
  for (int i = 0; i < o.locks; ++i) names.push_back(prefix + std::to_string(i));
  return RunAsyncPart(o, names, [&](AsyncShared* shm) {
    const std::size_t n = names.size();
    json out{{"locks", n}};
    if (!WaitFor(
            600, [&] { return shm->holder_ready.load() != 0 || shm->failed.load() > 0; }, 5) ||
        shm->failed.load() > 0)
      throw std::runtime_error("holder did not get ready");
    const ProcStatus base = ReadStatus();
    const std::int64_t base_fds = CountFds();
    dlock::ClientOptions copts;
    copts.label = "dlock-bench async waiter";
    auto client = dlock::Client::connect(o.url, copts);
    std::vector<std::unique_ptr<dlock::Mutex>> mutexes;
    for (const auto& name : names) mutexes.push_back(std::make_unique<dlock::Mutex>(client, name));
    const ProcStatus objects = ReadStatus();
    out["base"] = StatusJson(base);
    out["after_client_and_mutexes"] = StatusJson(objects);

    struct Round {
      std::vector<std::atomic<int>> calls;
      std::vector<std::optional<dlock::Hold>> holds;
      std::atomic<std::size_t> completed{0}, granted{0}, nullopts{0}, errors{0};
      std::atomic<std::int64_t> last_ns{0};
      std::mutex mu;
      std::string first_error;
      explicit Round(std::size_t n) : calls(n), holds(n) {}
    };
    // Starts one acquire per lock; every callback counts its calls.
    auto start = [&](Round& r, std::stop_source& stop) {
      for (std::size_t i = 0; i < n; ++i) {
        mutexes[i]->async_acquire(dlock::kForever, stop.get_token(),
                                  [&r, i](dlock::Result<std::optional<dlock::Hold>> res) {
                                    if (r.calls[i].fetch_add(1) == 0) {
                                      if (!res.ok()) {
                                        r.errors.fetch_add(1);
                                        std::lock_guard lk(r.mu);
                                        if (r.first_error.empty()) r.first_error = res.status().to_string();
                                      } else if (res.value()) {
                                        r.holds[i] = std::move(res).value();
                                        r.granted.fetch_add(1);
                                      } else {
                                        r.nullopts.fetch_add(1);
                                      }
                                    }
                                    r.last_ns.store(NowNs());
                                    r.completed.fetch_add(1, std::memory_order_release);
                                  });
      }
    };
    auto exactly_once = [&](Round& r) {
      std::size_t never = 0, twice = 0;
      for (auto& c : r.calls) {
        const int k = c.load();
        never += k == 0;
        twice += k > 1;
      }
      return json{{"never_called", never}, {"called_more_than_once", twice}};
    };

    // Round 1: pending, then cancel all at once.
    {
      Round r(n);
      std::stop_source stop;
      const std::int64_t t0 = NowNs();
      start(r, stop);
      const std::int64_t started = NowNs();
      const double queued = WaitQueued(client, names.back(), 2, 300);
      std::size_t all_queued = 0;
      const double all_s = queued < 0 ? -1 : WaitAllQueued(client, names, 2, 60, &all_queued);
      const ProcStatus pending = ReadStatus();
      json c{{"start_calls_s", Seconds(t0, started)},
             {"last_queued_s", queued < 0 ? json(nullptr) : json(Seconds(t0, started) + queued)},
             {"queues_with_2_entries", all_queued},
             {"all_queued_check_s", all_s < 0 ? json(nullptr) : json(all_s)},
             {"pending", StatusJson(pending)},
             {"completed_before_cancel", r.completed.load()}};
      if (queued < 0) c["error"] = "the last lock's queue did not show 2 entries in 300 s";
      const std::int64_t t1 = NowNs();
      stop.request_stop();
      const bool all = WaitFor(120, [&] { return r.completed.load(std::memory_order_acquire) >= n; });
      c["cancel_all_s"] = all ? json(Seconds(t1, r.last_ns.load())) : json(nullptr);
      SleepMs(500);  // room for a late second call
      c["callbacks"] = r.completed.load();
      c["nullopt"] = r.nullopts.load();
      c["granted"] = r.granted.load();
      c["errors"] = r.errors.load();
      if (!r.first_error.empty()) c["first_error"] = r.first_error;
      c["exactly_once"] = exactly_once(r);
      c["exactly_once_ok"] = all && r.completed.load() == n && r.nullopts.load() == n;
      if (!all) c["error"] = "not every callback came within 120 s of the cancel";
      // What is left in the store: every queue should hold the holder's
      // entry only.
      std::size_t left = 0, list_errors = 0;
      json examples = json::array();
      const std::int64_t t2 = NowNs();
      for (const auto& name : names) {
        auto entries = client.list_entries(name, false);
        if (!entries.ok()) {
          ++list_errors;
          continue;
        }
        if (entries.value().size() != 1 && examples.size() < 5) {
          json e = json::array();
          auto with_owners = client.list_entries(name, true);
          if (with_owners.ok())
            for (const auto& en : with_owners.value())
              e.push_back({{"id", en.id},
                           {"seq", en.sequence},
                           {"pid", en.owner ? en.owner->pid : 0},
                           {"label", en.owner ? en.owner->label : ""}});
          examples.push_back({{"queue", name}, {"entries", e}});
        }
        left += entries.value().size() > 0 ? entries.value().size() - 1 : 0;
      }
      c["entries_left"] = left;  // beyond the holder's one per queue
      c["list_errors"] = list_errors;
      c["list_all_s"] = Seconds(t2, NowNs());
      if (!examples.empty()) c["left_examples"] = examples;
      for (auto& h : r.holds)
        if (h) h->release();  // none expected
      out["cancel_round"] = c;
    }

    // Round 2: pending again, then the holder releases everything.
    {
      Round r(n);
      std::stop_source stop;
      const std::int64_t t0 = NowNs();
      start(r, stop);
      const std::int64_t started = NowNs();
      const double queued = WaitQueued(client, names.back(), 2, 300);
      std::size_t all_queued = 0;
      const double all_s = queued < 0 ? -1 : WaitAllQueued(client, names, 2, 60, &all_queued);
      const ProcStatus pending = ReadStatus();
      json g{{"start_calls_s", Seconds(t0, started)},
             {"last_queued_s", queued < 0 ? json(nullptr) : json(Seconds(t0, started) + queued)},
             {"queues_with_2_entries", all_queued},
             {"all_queued_check_s", all_s < 0 ? json(nullptr) : json(all_s)},
             {"pending", StatusJson(pending)},
             {"completed_before_release", r.completed.load()}};
      out["fds_base"] = base_fds;
      out["fds_pending"] = CountFds();
      out["threads_base"] = base.threads;
      out["threads_pending"] = pending.threads;
      out["dlock_threads"] = pending.threads - base.threads;
      out["rss_kb_base"] = base.rss_kb;
      out["rss_kb_pending"] = pending.rss_kb;
      out["rss_kb_per_pending"] = static_cast<double>(pending.rss_kb - base.rss_kb) / static_cast<double>(n);
      out["rss_kb_per_pending_beyond_objects"] =
          static_cast<double>(pending.rss_kb - objects.rss_kb) / static_cast<double>(n);
      shm->release.store(1);
      const bool all = WaitFor(900, [&] { return r.completed.load(std::memory_order_acquire) >= n; });
      WaitFor(60, [&] { return shm->released.load() != 0; });
      const std::int64_t rel0 = shm->release_start_ns.load(), rel1 = shm->release_end_ns.load();
      g["holder_release_s"] = rel1 > 0 ? json(Seconds(rel0, rel1)) : json(nullptr);
      g["grant_all_s"] = all ? json(Seconds(rel0, r.last_ns.load())) : json(nullptr);
      g["grants_per_s"] = all ? json(static_cast<double>(n) / Seconds(rel0, r.last_ns.load())) : json(nullptr);
      SleepMs(200);
      g["callbacks"] = r.completed.load();
      g["granted"] = r.granted.load();
      g["nullopt"] = r.nullopts.load();
      g["errors"] = r.errors.load();
      if (!r.first_error.empty()) g["first_error"] = r.first_error;
      g["exactly_once"] = exactly_once(r);
      if (!all) {
        g["error"] = "not every acquire was granted within 900 s of the release";
        stop.request_stop();
        WaitFor(120, [&] { return r.completed.load() >= n; });
      }
      ReleaseAll(r.holds, 8);
      out["grant_round"] = g;
    }
    return out;
  });
}

// 6b. `on_one` acquires pending on ONE lock held by another process, started
// in order; each callback releases its Hold at once, so the next one is
// granted: the order of the grants and the time for all.
json AsyncOnOne(const Options& o) {
  const std::string name = o.name + "/async-one-" + std::to_string(::getpid());
  return RunAsyncPart(o, {name}, [&](AsyncShared* shm) {
    const auto m = static_cast<std::size_t>(o.on_one);
    json out{{"acquires", m}};
    if (!WaitFor(
            600, [&] { return shm->holder_ready.load() != 0 || shm->failed.load() > 0; }, 5) ||
        shm->failed.load() > 0)
      throw std::runtime_error("holder did not get ready");
    const ProcStatus base = ReadStatus();
    dlock::ClientOptions copts;
    copts.label = "dlock-bench async waiter";
    auto client = dlock::Client::connect(o.url, copts);
    dlock::Mutex mutex(client, name);
    std::vector<std::size_t> order(m);
    std::vector<std::uint64_t> tokens(m);
    std::vector<std::atomic<int>> calls(m);
    std::atomic<std::size_t> completed{0}, granted{0}, errors{0};
    std::atomic<std::int64_t> last_ns{0};
    std::string first_error;
    // (on the heap: GCC 12 warns of a stop_source on this frame, wrongly)
    const auto stop = std::make_unique<std::stop_source>();
    const std::int64_t t0 = NowNs();
    for (std::size_t i = 0; i < m; ++i) {
      mutex.async_acquire(dlock::kForever, stop->get_token(), [&, i](dlock::Result<std::optional<dlock::Hold>> r) {
        // Callbacks run one at a time on the client's dlock thread.
        calls[i].fetch_add(1);
        const std::size_t k = completed.load(std::memory_order_relaxed);
        if (k < m) order[k] = i;
        if (r.ok() && r.value()) {
          if (k < m) tokens[k] = r.value()->fencing_token();
          granted.fetch_add(1);
          r.value()->release();
        } else if (!r.ok()) {
          if (errors.fetch_add(1) == 0) first_error = r.status().to_string();
        }
        last_ns.store(NowNs());
        completed.fetch_add(1, std::memory_order_release);
      });
    }
    const std::int64_t started = NowNs();
    const double queued = WaitQueued(client, name, 2, 300);
    const ProcStatus pending = ReadStatus();
    out["start_calls_s"] = Seconds(t0, started);
    out["queued_s"] = queued < 0 ? json(nullptr) : json(Seconds(t0, started) + queued);
    if (queued < 0) out["error"] = "the queue did not show 2 entries in 300 s";
    auto listed = client.list_entries(name, false);
    out["store_entries_while_pending"] = listed.ok() ? json(listed.value().size()) : json(nullptr);
    out["completed_before_release"] = completed.load();
    out["fds_pending"] = CountFds();
    out["threads_base"] = base.threads;
    out["threads_pending"] = pending.threads;
    out["dlock_threads"] = pending.threads - base.threads;
    out["rss_kb_base"] = base.rss_kb;
    out["rss_kb_pending"] = pending.rss_kb;
    out["rss_kb_per_pending"] = static_cast<double>(pending.rss_kb - base.rss_kb) / static_cast<double>(m);
    shm->release.store(1);
    const bool all = WaitFor(900, [&] { return completed.load(std::memory_order_acquire) >= m; });
    const std::int64_t rel0 = shm->release_start_ns.load();
    out["grant_all_s"] = all ? json(Seconds(rel0, last_ns.load())) : json(nullptr);
    out["grants_per_s"] = all ? json(static_cast<double>(m) / Seconds(rel0, last_ns.load())) : json(nullptr);
    SleepMs(200);
    const std::size_t done = std::min(completed.load(), m);
    std::size_t out_of_order = 0, token_inversions = 0, twice = 0;
    for (std::size_t k = 0; k < done; ++k) {
      out_of_order += order[k] != k;
      if (k > 0 && tokens[k] <= tokens[k - 1]) ++token_inversions;
    }
    for (auto& c : calls) twice += c.load() > 1;
    out["callbacks"] = completed.load();
    out["granted"] = granted.load();
    out["errors"] = errors.load();
    if (!first_error.empty()) out["first_error"] = first_error;
    out["out_of_start_order"] = out_of_order;
    out["token_not_increasing"] = token_inversions;
    out["called_more_than_once"] = twice;
    out["fifo_ok"] = all && granted.load() == m && out_of_order == 0 && token_inversions == 0;
    if (out_of_order > 0) {
      json first = json::array();
      for (std::size_t k = 0; k < done && first.size() < 10; ++k)
        if (order[k] != k) first.push_back({{"grant", k}, {"acquire", order[k]}});
      out["first_out_of_order"] = first;
    }
    if (!all) {
      out["error"] = "not every acquire was granted within 900 s of the release";
      stop->request_stop();
      WaitFor(120, [&] { return completed.load() >= m; });
    }
    return out;
  });
}

// 6. Both parts, each with a waiting process and a holding process of its
// own. file:// keeps descriptors per waiting entry: the soft descriptor limit
// is raised to the hard one first (and both are reported).
json AsyncFootprint(const Options& o) {
  json out;
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  const auto soft_before = lim.rlim_cur;
  if (lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  ::getrlimit(RLIMIT_NOFILE, &lim);
  out["nofile"] = {{"soft_before", soft_before}, {"soft", lim.rlim_cur}, {"hard", lim.rlim_max}};
  if (o.locks > 0) out["many_locks"] = AsyncManyLocks(o);
  if (o.on_one > 0) out["on_one"] = AsyncOnOne(o);
  for (const char* part : {"many_locks", "on_one"})
    if (out.contains(part) && out[part].contains("error"))
      throw std::runtime_error(std::string(part) + ": " + out[part]["error"].get<std::string>() + " | " + out.dump());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dlock benchmark driver: one scenario, one JSON object on stdout"};
  Options o;
  app.add_option("--url", o.url, "store URL")->required();
  app.add_option("--scenario", o.scenario)
      ->required()
      ->check(CLI::IsMember({"cycles", "floor", "contend", "waiters", "footprint", "async-footprint"}));
  app.add_option("--floor", o.floor,
                 "redis: dlock's scripts, or SET NX PX + compare-and-delete (setnx); "
                 "file: the queue's system calls, or one flock (flock); "
                 "etcd: the Txns of Go's Mutex (go, the default), or dlock's own (dlock-txns)")
      ->check(CLI::IsMember({"scripts", "setnx", "flock", "go", "dlock-txns"}));
  app.add_option("--name", o.name, "lock name (prefix for footprint)");
  app.add_option("--seconds", o.seconds, "time budget of a timed loop");
  app.add_option("--max-ops", o.max_ops, "record / cycle budget of a loop");
  app.add_option("--procs", o.procs, "worker processes");
  app.add_option("--threads", o.threads, "threads per worker process (contend)");
  app.add_option("--hold-us", o.hold_us, "critical section, busy-waited");
  app.add_option("--waiters", o.waiters, "tasks in all (waiters)");
  app.add_option("--pool", o.pool, "threads per process running the tasks (waiters)");
  app.add_option("--locks", o.locks, "locks waited on at once (footprint, async-footprint; 0: skip)");
  app.add_option("--on-one", o.on_one, "acquires pending on one lock (async-footprint; 0: skip)");
  CLI11_PARSE(app, argc, argv);

  json out{{"store", Scheme(o.url)},
           {"scenario", o.scenario},
           {"impl", o.scenario != "floor"                     ? "dlock"
                    : o.floor == "scripts" || o.floor == "go" ? "floor"
                                                              : "floor-" + o.floor}};
  try {
    json r;
    if (o.scenario == "cycles") r = Cycles(o);
    if (o.scenario == "floor") r = Floor(o);
    if (o.scenario == "contend") r = Contend(o);
    if (o.scenario == "waiters") r = Waiters(o);
    if (o.scenario == "footprint") r = Footprint(o);
    if (o.scenario == "async-footprint") r = AsyncFootprint(o);
    out["result"] = r;
  } catch (const std::exception& e) {
    out["error"] = e.what();
    std::printf("%s\n", out.dump().c_str());
    return 1;
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
