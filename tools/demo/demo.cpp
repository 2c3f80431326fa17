// dlock-demo: several processes contend for one lock on a store (by default
// the embedded file:// store). Each writes every hold it gets, with its
// fencing token and its start and end on the host's monotonic clock, to a
// shared ledger; the parent prints the holds in time order and checks that
// no two overlapped and that tokens grew from one holder to the next.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dlock/dlock.hpp"

extern char** environ;

namespace {

std::int64_t MonotonicNanos() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

struct HoldRecord {
  int worker = 0;
  long pid = 0;
  std::uint64_t token = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
};

int RunWorker(const std::string& url, const std::string& name, int worker, int rounds, int hold_ms,
              const std::string& ledger) {
  try {
    auto client = dlock::Client::connect(url);
    dlock::Mutex mutex(client, name);
    int fd = ::open(ledger.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) {
      std::perror("dlock-demo: ledger");
      return 1;
    }
    for (int i = 0; i < rounds; ++i) {
      std::unique_lock lock(mutex);
      std::int64_t start = MonotonicNanos();
      std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));  // the "work"
      std::int64_t end = MonotonicNanos();
      char line[160];
      int n = std::snprintf(line, sizeof line, "%d %ld %llu %lld %lld\n", worker, static_cast<long>(::getpid()),
                            static_cast<unsigned long long>(*mutex.fencing_token()), static_cast<long long>(start),
                            static_cast<long long>(end));
      if (::write(fd, line, static_cast<std::size_t>(n)) != n) std::perror("dlock-demo: ledger write");
    }
    ::close(fd);
    return 0;
  } catch (const dlock::Error& e) {
    std::fprintf(stderr, "dlock-demo worker %d: %s\n", worker, e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Several processes take turns on one dlock mutex; prints every hold and checks for overlaps."};
  std::string url = "file://";
  std::string name = "demo/quickstart";
  int processes = 4;
  int rounds = 5;
  int hold_ms = 20;
  int worker = -1;
  std::string ledger;
  app.add_option("--url", url, "store URL (default: the embedded file:// store)");
  app.add_option("--name", name, "lock name");
  app.add_option("--processes", processes, "contending processes")->check(CLI::Range(1, 64));
  app.add_option("--rounds", rounds, "holds per process")->check(CLI::Range(1, 10000));
  app.add_option("--hold-ms", hold_ms, "how long each hold lasts")->check(CLI::Range(0, 10000));
  app.add_option("--worker", worker, "internal: run as worker N")->group("");
  app.add_option("--ledger", ledger, "internal: ledger file")->group("");
  CLI11_PARSE(app, argc, argv);

  if (worker >= 0) return RunWorker(url, name, worker, rounds, hold_ms, ledger);

  if (url.rfind("mem:", 0) == 0) {
    std::fprintf(stderr,
                 "dlock-demo: mem:// lives inside one process, so separate processes cannot share it; "
                 "use file:// or a server store\n");
    return 2;
  }
  if (auto client = dlock::Client::open(url); !client.ok()) {
    std::fprintf(stderr, "dlock-demo: %s\n", client.status().to_string().c_str());
    return 5;
  }
  char dir_template[] = "/tmp/dlock-demo-XXXXXX";
  if (!::mkdtemp(dir_template)) {
    std::perror("dlock-demo: mkdtemp");
    return 1;
  }
  ledger = std::string(dir_template) + "/ledger";
  ::close(::open(ledger.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));

  std::printf("dlock-demo: %d processes x %d holds of '%s' on %s\n", processes, rounds, name.c_str(), url.c_str());
  std::vector<pid_t> children;
  for (int i = 0; i < processes; ++i) {
    std::vector<std::string> args = {"/proc/self/exe",
                                     "--url",
                                     url,
                                     "--name",
                                     name,
                                     "--rounds",
                                     std::to_string(rounds),
                                     "--hold-ms",
                                     std::to_string(hold_ms),
                                     "--worker",
                                     std::to_string(i),
                                     "--ledger",
                                     ledger};
    std::vector<char*> cargs;
    for (auto& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, cargs.data(), environ) != 0) {
      std::perror("dlock-demo: spawn");
      return 1;
    }
    children.push_back(pid);
  }
  bool workers_ok = true;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    workers_ok = workers_ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

  std::vector<HoldRecord> holds;
  std::ifstream in(ledger);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    HoldRecord h;
    if (fields >> h.worker >> h.pid >> h.token >> h.start_ns >> h.end_ns) holds.push_back(h);
  }
  ::unlink(ledger.c_str());
  ::rmdir(dir_template);
  std::sort(holds.begin(), holds.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });

  int overlaps = 0;
  int token_regressions = 0;
  const std::int64_t t0 = holds.empty() ? 0 : holds.front().start_ns;
  for (std::size_t i = 0; i < holds.size(); ++i) {
    const auto& h = holds[i];
    const char* note = "";
    if (i > 0 && h.start_ns < holds[i - 1].end_ns) {
      ++overlaps;
      note = "  <-- OVERLAPS the previous hold";
    } else if (i > 0 && h.token <= holds[i - 1].token) {
      ++token_regressions;
      note = "  <-- token did not grow";
    }
    std::printf("  hold %3zu  process %-2d (pid %-7ld) token %-8llu %9.3f ms .. %9.3f ms%s\n", i + 1, h.worker, h.pid,
                static_cast<unsigned long long>(h.token), (h.start_ns - t0) / 1e6, (h.end_ns - t0) / 1e6, note);
  }
  const std::size_t expected = static_cast<std::size_t>(processes) * static_cast<std::size_t>(rounds);
  std::printf("dlock-demo: %zu holds (expected %zu), %d overlaps, %d token regressions%s\n", holds.size(), expected,
              overlaps, token_regressions, workers_ok ? "" : ", a worker failed");
  bool ok = workers_ok && holds.size() == expected && overlaps == 0 && token_regressions == 0;
  std::printf("dlock-demo: %s\n", ok ? "OK: every hold was exclusive and tokens only grew" : "FAILED");
  return ok ? 0 : 1;
}
