// dlock-test-worker: takes a lock of one recipe in a loop and writes each
// hold to a ledger (one line per hold, appended with a single write):
//   <worker> <pid> <recipe> <token> <start_ns> <end_ns>
// With --hold-forever it writes "ACQUIRED <pid> <token>" once it holds the
// lock, then waits to be killed. With --report-lost it writes the same line,
// then waits (at most a minute) until its hold is lost and writes
// "LOST <pid> <token> <state>".
//
// --recipe elect campaigns in a loop instead (a new entry each round, value
// "w<worker>-<round>"), leads for --hold-ms, resigns, and writes one line per
// term: <worker> <pid> elect <term> <told-leader ns> <resigning ns> <value>,
// the belief interval as this process saw it (both ends read while it
// believed). With --hold-forever it writes "LEADER <pid> <term> <ns>" and
// waits to be killed; with --report-lost it writes that line, then reads
// state() every millisecond until it is neither held nor uncertain and
// writes "LOST <pid> <term> <state> <last ns it read held> <ns it read the
// loss>"; with --resign-on-usr1 it writes the LEADER line, resigns on
// SIGUSR1, writes the term's line and waits for SIGTERM.
// --recipe observe writes every Observation until SIGTERM:
//   OBS <pid> <number> <leader|none|unknown> <term> <value or -> <ns>
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "dlock/dlock.hpp"

namespace {

std::int64_t MonotonicNanos() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

void Append(int fd, const std::string& line) {
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) std::perror("ledger");
}

std::string Ns(std::int64_t t) { return std::to_string(t); }

bool Believes(dlock::HoldState s) { return s == dlock::HoldState::kHeld || s == dlock::HoldState::kUncertain; }

// Blocks `signals` in this thread and in every thread made after (dlock's),
// so that sigwait() below takes them.
void BlockSignals(std::initializer_list<int> signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void WaitFor(int signal) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, signal);
  int got = 0;
  while (sigwait(&set, &got) != 0 || got != signal) {
  }
}

struct ElectMode {
  bool hold_forever = false;
  bool report_lost = false;
  bool resign_on_usr1 = false;
};

// Polls state() (which folds in the session's own clock, so it is right at
// once after a pause) until leadership is lost; bounded by three minutes.
void ReportLost(int fd, const dlock::Leadership& lead) {
  std::int64_t last_held = 0;
  const std::int64_t give_up = MonotonicNanos() + std::int64_t{180} * 1'000'000'000;
  for (;;) {
    // The time before the reading: a pause between the two cannot make a
    // reading before the pause look like one after it.
    const std::int64_t now = MonotonicNanos();
    const dlock::HoldState s = lead.state();
    if (!Believes(s) || now > give_up) {
      Append(fd, "LOST " + std::to_string(::getpid()) + " " + std::to_string(lead.term()) + " " +
                     std::string(dlock::HoldStateName(s)) + " " + Ns(last_held) + " " + Ns(now) + "\n");
      return;
    }
    last_held = now;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int Elect(const dlock::Client& client, const std::string& name, int fd, int worker, int rounds, int hold_ms,
          ElectMode mode) {
  dlock::Election election(client, name);
  for (int i = 0; i < rounds; ++i) {
    const std::string value = "w" + std::to_string(worker) + "-" + std::to_string(i);
    std::optional<dlock::Leadership> lead = election.campaign(value);
    if (!lead) return 11;
    const std::int64_t start = MonotonicNanos();
    if (!Believes(lead->state())) return 12;  // a test run has no faults
    const std::string pid = std::to_string(::getpid());
    if (mode.hold_forever || mode.report_lost || mode.resign_on_usr1) {
      Append(fd, "LEADER " + pid + " " + std::to_string(lead->term()) + " " + Ns(start) + "\n");
    }
    while (mode.hold_forever) ::pause();
    if (mode.report_lost) {
      ReportLost(fd, *lead);
      return 0;
    }
    if (mode.resign_on_usr1) {
      WaitFor(SIGUSR1);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
    }
    const std::int64_t end = MonotonicNanos();
    if (!Believes(lead->state())) return 12;
    lead->resign();
    Append(fd, std::to_string(worker) + " " + pid + " elect " + std::to_string(lead->term()) + " " + Ns(start) + " " +
                   Ns(end) + " " + value + "\n");
  }
  if (mode.resign_on_usr1) WaitFor(SIGTERM);
  return 0;
}

int Observe(const dlock::Client& client, const std::string& name, int fd) {
  dlock::Election election(client, name);
  const std::string pid = std::to_string(::getpid());
  auto sub = election.observe([fd, pid](const dlock::Observation& o) {
    const std::string term = o.leader ? std::to_string(o.leader->term) : "0";
    const std::string value = o.leader && !o.leader->value.empty() ? o.leader->value : "-";
    Append(fd, "OBS " + pid + " " + std::to_string(o.number) + " " + std::string(dlock::LeaderStateName(o.state)) +
                   " " + term + " " + value + " " + Ns(MonotonicNanos()) + "\n");
  });
  WaitFor(SIGTERM);
  sub.reset();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dlock test worker"};
  std::string url, name, recipe = "mutex", ledger;
  int worker = 0, rounds = 1, hold_ms = 1;
  unsigned permits = 1;
  bool hold_forever = false;
  bool report_lost = false;
  app.add_option("--url", url)->required();
  app.add_option("--name", name)->required();
  app.add_option("--recipe", recipe)
      ->check(CLI::IsMember({"mutex", "semaphore", "semmutex", "read", "write", "elect", "observe"}));
  app.add_option("--permits", permits);
  app.add_option("--worker", worker);
  app.add_option("--rounds", rounds);
  app.add_option("--hold-ms", hold_ms);
  app.add_option("--ledger", ledger)->required();
  app.add_flag("--hold-forever", hold_forever);
  app.add_flag("--report-lost", report_lost);
  bool resign_on_usr1 = false;
  app.add_flag("--resign-on-usr1", resign_on_usr1);
  CLI11_PARSE(app, argc, argv);
  // Before the client starts its threads, so that none of them takes these.
  if (recipe == "observe") BlockSignals({SIGTERM});
  if (resign_on_usr1) BlockSignals({SIGUSR1, SIGTERM});

  int fd = ::open(ledger.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return 10;
  try {
    auto client = dlock::Client::connect(url);
    if (recipe == "elect") {
      return Elect(client, name, fd, worker, rounds, hold_ms, {hold_forever, report_lost, resign_on_usr1});
    }
    if (recipe == "observe") return Observe(client, name, fd);
    dlock::Mutex mutex(client, name);
    dlock::Semaphore semaphore(client, name, permits);
    dlock::ReadWriteLock rw(client, name);
    for (int i = 0; i < rounds; ++i) {
      std::optional<dlock::Hold> hold;
      if (recipe == "mutex") hold = mutex.acquire();
      if (recipe == "semaphore" || recipe == "semmutex") hold = semaphore.acquire(1);
      if (recipe == "read") hold = rw.acquire_read();
      if (recipe == "write") hold = rw.acquire_write();
      if (!hold) return 11;
      const std::int64_t start = MonotonicNanos();
      if (hold_forever || report_lost) {
        Append(fd, "ACQUIRED " + std::to_string(::getpid()) + " " + std::to_string(hold->fencing_token()) + "\n");
        while (hold_forever) ::pause();
        // The lost signal fires already on kUncertain (contact lost); report
        // once the hold is known lost, which follows (bounded by a minute).
        struct Waker {
          std::mutex mu;
          std::condition_variable_any cv;
        };
        auto waker = std::make_shared<Waker>();
        auto sub = hold->on_state_change([waker](dlock::HoldState) {
          std::lock_guard<std::mutex> g(waker->mu);
          waker->cv.notify_all();
        });
        std::unique_lock<std::mutex> lock(waker->mu);
        waker->cv.wait_for(lock, std::chrono::minutes(1), [&] { return hold->state() == dlock::HoldState::kLost; });
        Append(fd, "LOST " + std::to_string(::getpid()) + " " + std::to_string(hold->fencing_token()) + " " +
                       std::string(dlock::HoldStateName(hold->state())) + "\n");
        return 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
      const std::int64_t end = MonotonicNanos();
      if (hold->state() != dlock::HoldState::kHeld) return 12;  // a test run has no faults
      Append(fd, std::to_string(worker) + " " + std::to_string(::getpid()) + " " + recipe + " " +
                     std::to_string(hold->fencing_token()) + " " + std::to_string(start) + " " + std::to_string(end) +
                     "\n");
    }
  } catch (const dlock::Error& e) {
    std::fprintf(stderr, "worker %d: %s\n", worker, e.what());
    return 13;
  }
  return 0;
}
