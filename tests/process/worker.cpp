// dlock-test-worker: takes a lock of one recipe in a loop and writes each
// hold to a ledger (one line per hold, appended with a single write):
//   <worker> <pid> <recipe> <token> <start_ns> <end_ns>
// With --hold-forever it writes "ACQUIRED <pid> <token>" once it holds the
// lock, then waits to be killed. With --report-lost it writes the same line,
// then waits (at most a minute) until its hold is lost and writes
// "LOST <pid> <token> <state>".
#include <fcntl.h>
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
  app.add_option("--recipe", recipe)->check(CLI::IsMember({"mutex", "semaphore", "semmutex", "read", "write"}));
  app.add_option("--permits", permits);
  app.add_option("--worker", worker);
  app.add_option("--rounds", rounds);
  app.add_option("--hold-ms", hold_ms);
  app.add_option("--ledger", ledger)->required();
  app.add_flag("--hold-forever", hold_forever);
  app.add_flag("--report-lost", report_lost);
  CLI11_PARSE(app, argc, argv);

  int fd = ::open(ledger.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return 10;
  try {
    auto client = dlock::Client::connect(url);
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
