// Recipes across real processes: each worker process is its own client and
// session, writes a ledger of its holds on the shared monotonic clock, and the
// test checks the ledger for overlaps and token order. Runs on a file://
// store in a scratch directory and on every URL in DLOCK_TEST_URLS.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "dlock/dlock.hpp"
#include "support/stores.hpp"

extern char** environ;

namespace dlock {
namespace {

using namespace std::chrono_literals;

struct Held {
  int worker = 0;
  long pid = 0;
  std::string recipe;
  std::uint64_t token = 0;
  std::int64_t start = 0;
  std::int64_t end = 0;
  std::string value;  // elect: the campaign's value
};

// One report of an observer process (worker --recipe observe).
struct Seen {
  std::uint64_t number = 0;
  std::string state;
  std::uint64_t term = 0;
  std::string value;
};

// Now on the workers' clock (CLOCK_MONOTONIC, as steady_clock on Linux).
std::int64_t MonotonicNanos() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

class ProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dlock-proc-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    url_ = GetParam() == "file" ? "file://" + dir_ + "/store" : GetParam();
    if (GetParam() == "file") std::filesystem::create_directory(dir_ + "/store");
    ledger_ = dir_ + "/ledger";
    static int counter = 0;
    name_ = "proc/" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  }
  void TearDown() override {
    for (pid_t pid : children_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    std::filesystem::remove_all(dir_);
  }

  pid_t Spawn(int worker, const std::string& recipe, int rounds, int hold_ms, std::vector<std::string> extra = {},
              const std::string& name = "", const std::string& ledger = "") {
    std::vector<std::string> args = {DLOCK_TEST_WORKER,
                                     "--url",
                                     url_,
                                     "--name",
                                     name.empty() ? name_ : name,
                                     "--recipe",
                                     recipe,
                                     "--worker",
                                     std::to_string(worker),
                                     "--rounds",
                                     std::to_string(rounds),
                                     "--hold-ms",
                                     std::to_string(hold_ms),
                                     "--ledger",
                                     ledger.empty() ? ledger_ : ledger};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    EXPECT_EQ(posix_spawn(&pid, DLOCK_TEST_WORKER, nullptr, nullptr, argv.data(), environ), 0);
    children_.push_back(pid);
    return pid;
  }

  // Waits for every child but those in `except` (left running); returns
  // false if one failed or hung past `limit`.
  bool WaitAll(std::chrono::seconds limit = 120s, const std::vector<pid_t>& except = {}) {
    auto end = std::chrono::steady_clock::now() + limit;
    bool ok = true;
    for (pid_t pid : children_) {
      if (std::find(except.begin(), except.end(), pid) != except.end()) continue;
      int status = 0;
      while (::waitpid(pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > end) {
          ::kill(pid, SIGKILL);
          ::waitpid(pid, &status, 0);
          ADD_FAILURE() << "worker " << pid << " hung";
          ok = false;
          break;
        }
        std::this_thread::sleep_for(5ms);
      }
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        ADD_FAILURE() << "worker " << pid << " failed, status " << status;
        ok = false;
      }
    }
    std::erase_if(children_, [&](pid_t pid) { return std::find(except.begin(), except.end(), pid) == except.end(); });
    return ok;
  }

  std::vector<Held> Ledger() const {
    std::vector<Held> out;
    std::ifstream in(ledger_);
    for (std::string line; std::getline(in, line);) {
      std::istringstream f(line);
      Held h;
      if (f >> h.worker >> h.pid >> h.recipe >> h.token >> h.start >> h.end) {
        f >> h.value;
        out.push_back(h);
      }
    }
    std::sort(out.begin(), out.end(), [](const Held& a, const Held& b) { return a.start < b.start; });
    return out;
  }

  // The most holds that were ever inside at once.
  static int MaxConcurrent(const std::vector<Held>& holds, const std::string& recipe = "") {
    std::vector<std::pair<std::int64_t, int>> events;
    for (const auto& h : holds) {
      if (!recipe.empty() && h.recipe != recipe) continue;
      events.push_back({h.start, +1});
      events.push_back({h.end, -1});
    }
    std::sort(events.begin(), events.end());  // an end sorts before a start at the same instant
    int inside = 0, most = 0;
    for (auto& [t, d] : events) most = std::max(most, inside += d);
    return most;
  }

  // The first line of the ledger that starts with `word` (split in words),
  // or nothing.
  std::vector<std::string> line_of(const std::string& word, const std::string& path = "") const {
    std::ifstream in(path.empty() ? ledger_ : path);
    for (std::string line; std::getline(in, line);) {
      std::istringstream f(line);
      std::vector<std::string> words;
      for (std::string w; f >> w;) words.push_back(w);
      if (!words.empty() && words[0] == word) return words;
    }
    return {};
  }

  // Waits (bounded) for a LEADER line and returns it: LEADER pid term ns.
  std::vector<std::string> await_leader_line() const {
    std::vector<std::string> line;
    EXPECT_TRUE(testing::Eventually([&] { return (line = line_of("LEADER")).size() == 4; }, 60s))
        << "no process became leader";
    return line;
  }

  std::vector<Seen> observed(const std::string& path) const {
    std::vector<Seen> out;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      std::istringstream f(line);
      std::string word;
      long pid = 0;
      Seen s;
      if (f >> word >> pid >> s.number >> s.state >> s.term >> s.value && word == "OBS") out.push_back(s);
    }
    return out;
  }

  // Waits (bounded) until `n` candidates are in the election's queue.
  void await_candidates(std::size_t n) {
    auto client = Client::connect(url_);
    Election election(client, name_);
    EXPECT_TRUE(testing::Eventually(
        [&] {
          auto all = election.participants();
          return all.ok() && all->size() == n;
        },
        60s))
        << "never " << n << " candidates";
  }

  // Ends one child with `signal` and reaps it (bounded); false if it did not
  // exit 0.
  bool stop_child(pid_t pid, int signal = SIGTERM, std::chrono::seconds limit = 60s) {
    ::kill(pid, signal);
    auto end = std::chrono::steady_clock::now() + limit;
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > end) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    std::erase(children_, pid);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

  std::string dir_, url_, ledger_, name_;
  std::vector<pid_t> children_;
};

TEST_P(ProcessTest, MutexExcludesAcrossProcessesAndTokensGrow) {
  for (int w = 0; w < 4; ++w) Spawn(w, "mutex", 8, 2);
  ASSERT_TRUE(WaitAll());
  auto holds = Ledger();
  ASSERT_EQ(holds.size(), 32u);
  EXPECT_EQ(MaxConcurrent(holds), 1);
  for (std::size_t i = 1; i < holds.size(); ++i) {
    EXPECT_GE(holds[i].start, holds[i - 1].end) << "holds " << i - 1 << " and " << i << " overlap";
    EXPECT_LT(holds[i - 1].token, holds[i].token) << "token went back at hold " << i;
  }
}

TEST_P(ProcessTest, SemaphoreAdmitsAtMostItsPermits) {
  // Holds long enough (40 ms) that a second acquirer gets in while the first
  // still holds, even on ZooKeeper under a sanitizer (an acquire there is a
  // few fsync'd round trips; with 5 ms holds both permits were sometimes
  // never in use at once).
  for (int w = 0; w < 5; ++w) Spawn(w, "semaphore", 6, 40, {"--permits", "2"});
  ASSERT_TRUE(WaitAll());
  auto holds = Ledger();
  ASSERT_EQ(holds.size(), 30u);
  EXPECT_LE(MaxConcurrent(holds), 2);
  EXPECT_EQ(MaxConcurrent(holds), 2) << "two permits were never used at once";
}

TEST_P(ProcessTest, ReadersShareAndWritersExcludeAcrossProcesses) {
  for (int w = 0; w < 3; ++w) Spawn(w, "read", 6, 5);
  for (int w = 3; w < 5; ++w) Spawn(w, "write", 6, 2);
  ASSERT_TRUE(WaitAll());
  auto holds = Ledger();
  ASSERT_EQ(holds.size(), 30u);
  for (const auto& w : holds) {
    if (w.recipe != "write") continue;
    for (const auto& o : holds) {
      if (&o == &w) continue;
      EXPECT_TRUE(o.end <= w.start || o.start >= w.end)
          << "a " << o.recipe << " hold overlapped a write hold (token " << w.token << ")";
    }
  }
}

TEST_P(ProcessTest, KilledHolderFreesTheLockForTheNextWaiter) {
  pid_t holder = Spawn(0, "mutex", 1, 0, {"--hold-forever"});
  std::uint64_t held_token = 0;
  ASSERT_TRUE(testing::Eventually(
      [&] {
        std::ifstream in(ledger_);
        std::string word;
        long pid;
        return static_cast<bool>(in >> word >> pid >> held_token) && word == "ACQUIRED";
      },
      60s));
  Spawn(1, "mutex", 1, 1);  // waits behind the holder
  auto client = Client::connect(url_);
  ASSERT_TRUE(testing::Eventually([&] { return client.list_entries(name_).value().size() == 2u; }, 30s));
  ASSERT_EQ(::kill(holder, SIGKILL), 0);
  ::waitpid(holder, nullptr, 0);
  children_.erase(children_.begin());
  ASSERT_TRUE(WaitAll());  // the waiter got the lock once the holder's session was gone
  auto holds = Ledger();
  ASSERT_EQ(holds.size(), 1u);
  EXPECT_GT(holds[0].token, held_token);
  EXPECT_TRUE(testing::Eventually([&] { return client.list_entries(name_).value().empty(); }, 30s))
      << "entries left behind";
}

// A holder paused (SIGSTOP) past its session's timeout loses the lock: the
// next waiter gets it with a larger token, and the paused holder, once
// resumed, is told (lost signal) rather than carrying on as if it held it.
TEST_P(ProcessTest, PausedHolderIsToldItLostTheLock) {
  if (GetParam() == "file") GTEST_SKIP() << "a file:// session lives as long as its process: it cannot expire";
  pid_t holder = Spawn(0, "mutex", 1, 0, {"--report-lost"});
  // Pause it only once acquire() has returned: paused earlier, it would just
  // re-queue on a new session after the pause (correctly) and hold later.
  ASSERT_TRUE(testing::Eventually(
      [&] {
        std::ifstream in(ledger_);
        std::string word;
        return static_cast<bool>(in >> word) && word == "ACQUIRED";
      },
      60s));
  ASSERT_EQ(::kill(holder, SIGSTOP), 0);
  Spawn(1, "mutex", 1, 1);  // gets the lock once the paused holder's session expires
  auto start = std::chrono::steady_clock::now();
  auto waiter_done = [&] {
    std::ifstream in(ledger_);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("1 ", 0) == 0) return true;
    }
    return false;
  };
  ASSERT_TRUE(testing::Eventually(waiter_done, 120s)) << "the waiter never got the lock";
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(::kill(holder, SIGCONT), 0);
  ASSERT_TRUE(WaitAll(90s));
  std::ifstream in(ledger_);
  std::uint64_t paused_token = 0, lost_token = 0, next_token = 0;
  std::string lost_state;
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string first;
    f >> first;
    long pid;
    if (first == "ACQUIRED") f >> pid >> paused_token;
    if (first == "LOST") f >> pid >> lost_token >> lost_state;
    if (first == "1") {
      std::string recipe;
      f >> pid >> recipe >> next_token;
    }
  }
  EXPECT_EQ(lost_token, paused_token) << "the paused holder was never told it lost the lock";
  EXPECT_EQ(lost_state, "lost");
  EXPECT_GT(next_token, paused_token) << "the next holder's token must be larger";
  std::printf("[ info ] next holder got the lock %lld ms after the pause\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
}

// Regression: a waiter must wake however the kernel orders the release of a
// killed holder's files (it once slept forever when the holder's FIFO was
// released before its entry lock). Many pairs at once make the window likely.
TEST_P(ProcessTest, KilledHoldersNeverStrandWaitersUnderLoad) {
  if (GetParam() != "file") GTEST_SKIP() << "store-independent logic; the race was in the file store";
  constexpr int kPairs = 4;
  auto client = Client::connect(url_);
  for (int round = 0; round < 8; ++round) {
    std::vector<pid_t> holders;
    for (int p = 0; p < kPairs; ++p) {
      std::string name = name_ + "/r" + std::to_string(round) + "p" + std::to_string(p);
      holders.push_back(Spawn(p, "mutex", 1, 0, {"--hold-forever"}, name, ledger_ + name.substr(name.rfind('/') + 1)));
      ASSERT_TRUE(testing::Eventually([&] { return client.list_entries(name).value().size() == 1u; }, 30s));
      Spawn(p, "mutex", 1, 0, {}, name, ledger_ + "-waiters");
      ASSERT_TRUE(testing::Eventually([&] { return client.list_entries(name).value().size() == 2u; }, 30s));
    }
    for (pid_t h : holders) ::kill(h, SIGKILL);
    for (pid_t h : holders) {
      ::waitpid(h, nullptr, 0);
      std::erase(children_, h);
    }
    ASSERT_TRUE(WaitAll(30s)) << "a waiter was stranded in round " << round;
  }
}

// ---- Election (issue 16), a ledger of terms: each line a belief interval of
// one process, from the moment campaign() returned to the moment it resigned.

TEST_P(ProcessTest, ElectionBeliefsNeverOverlapAndTermsGrow) {
  constexpr int kWorkers = 4, kRounds = 5;
  for (int w = 0; w < kWorkers; ++w) Spawn(w, "elect", kRounds, 2);
  ASSERT_TRUE(WaitAll());
  auto terms = Ledger();
  ASSERT_EQ(terms.size(), std::size_t{kWorkers * kRounds});
  EXPECT_EQ(MaxConcurrent(terms), 1);
  for (std::size_t i = 1; i < terms.size(); ++i) {
    EXPECT_GE(terms[i].start, terms[i - 1].end)
        << "terms " << terms[i - 1].token << " and " << terms[i].token << " were believed at once";
    EXPECT_LT(terms[i - 1].token, terms[i].token) << "the term went back at leader " << i;
  }
}

TEST_P(ProcessTest, KilledLeaderIsSucceededWithALargerTerm) {
  pid_t leader = Spawn(0, "elect", 1, 0, {"--hold-forever"});
  auto line = await_leader_line();
  ASSERT_EQ(line.size(), 4u);
  const std::uint64_t killed_term = std::stoull(line[2]);
  Spawn(1, "elect", 1, 1);  // waits behind the leader
  await_candidates(2);
  const std::int64_t killed_at = MonotonicNanos();
  ASSERT_EQ(::kill(leader, SIGKILL), 0);
  ::waitpid(leader, nullptr, 0);
  std::erase(children_, leader);
  ASSERT_TRUE(WaitAll());  // the next one led once the killed one's session was gone
  auto terms = Ledger();
  ASSERT_EQ(terms.size(), 1u);
  EXPECT_GT(terms[0].token, killed_term);
  EXPECT_GT(terms[0].start, killed_at) << "led while the killed leader was alive";
}

// A leader paused (SIGSTOP) past its session's timeout is told it is no
// longer leader by its own clock: it believed last before the pause, the
// next leader is told after that, and the first reading once it is resumed
// is kLost (never kHeld). All on one clock, CLOCK_MONOTONIC.
TEST_P(ProcessTest, PausedLeaderIsNoLongerLeaderBeforeTheNextIsElected) {
  if (GetParam() == "file") GTEST_SKIP() << "a file:// session lives as long as its process: it cannot expire";
  pid_t leader = Spawn(0, "elect", 1, 0, {"--report-lost"});
  auto line = await_leader_line();
  ASSERT_EQ(line.size(), 4u);
  const std::uint64_t paused_term = std::stoull(line[2]);
  const std::int64_t paused_at = MonotonicNanos();
  ASSERT_EQ(::kill(leader, SIGSTOP), 0);
  Spawn(1, "elect", 1, 1);  // leads once the paused leader's session expires
  ASSERT_TRUE(testing::Eventually([&] { return Ledger().size() == 1u; }, 120s)) << "no next leader";
  const std::int64_t resumed_at = MonotonicNanos();
  ASSERT_EQ(::kill(leader, SIGCONT), 0);
  ASSERT_TRUE(WaitAll(90s));
  auto next = Ledger();
  ASSERT_EQ(next.size(), 1u);
  auto lost = line_of("LOST");
  ASSERT_EQ(lost.size(), 6u) << "the paused leader never reported";
  EXPECT_EQ(std::stoull(lost[2]), paused_term);
  EXPECT_EQ(lost[3], "lost") << "gave up waiting to be told";
  const std::int64_t last_held = std::stoll(lost[4]), told_lost = std::stoll(lost[5]);
  EXPECT_LT(last_held, paused_at) << "read itself leader after it was paused";
  EXPECT_LT(last_held, next[0].start) << "believed it led after the next leader was elected";
  EXPECT_GT(next[0].start, paused_at);
  EXPECT_GT(told_lost, resumed_at);
  EXPECT_GT(next[0].token, paused_term);
}

TEST_P(ProcessTest, ResignHandsLeadershipToAWaitingProcess) {
  pid_t first = Spawn(0, "elect", 1, 0, {"--resign-on-usr1"});
  auto line = await_leader_line();
  ASSERT_EQ(line.size(), 4u);
  Spawn(1, "elect", 1, 1);
  await_candidates(2);
  ASSERT_EQ(::kill(first, SIGUSR1), 0);
  // The first stays alive (its session too): only its resign lets the next lead.
  ASSERT_TRUE(testing::Eventually([&] { return Ledger().size() == 2u; }, 60s)) << "the waiting process never led";
  EXPECT_TRUE(stop_child(first));
  ASSERT_TRUE(WaitAll());
  auto terms = Ledger();
  ASSERT_EQ(terms.size(), 2u);
  EXPECT_EQ(terms[0].pid, first);
  EXPECT_EQ(terms[0].token, std::stoull(line[2]));
  EXPECT_GE(terms[1].start, terms[0].end);
  EXPECT_GT(terms[1].token, terms[0].token);
}

// An observer process's reports against the ledger: every leader it reports
// led (term and value as the ledger has them), in the ledger's order, never
// one already superseded, and "no leader" once all have resigned.
TEST_P(ProcessTest, ObserverReportsLeadersInOrderAndNoLeaderAtTheEnd) {
  const std::string seen_path = dir_ + "/observed";
  pid_t observer = Spawn(9, "observe", 0, 0, {}, "", seen_path);
  ASSERT_TRUE(testing::Eventually([&] { return !observed(seen_path).empty(); }, 60s)) << "no first report";
  for (int w = 0; w < 3; ++w) Spawn(w, "elect", 3, 20);
  ASSERT_TRUE(WaitAll(120s, {observer}));
  auto terms = Ledger();
  ASSERT_EQ(terms.size(), 9u);
  std::map<std::uint64_t, std::string> value_of;
  for (const auto& t : terms) value_of[t.token] = t.value;
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto seen = observed(seen_path);
        return seen.size() >= 2 && seen.back().state == "none";
      },
      60s))
      << "never reported no leader after the last resign";
  EXPECT_TRUE(stop_child(observer));
  auto seen = observed(seen_path);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.front().state, "none") << "the election was empty when it subscribed";
  std::uint64_t last_term = 0;
  int leaders = 0;
  for (std::size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].number, i + 1) << "reports out of order";
    EXPECT_NE(seen[i].state, "unknown") << "no fault in this test";
    if (seen[i].state != "leader") continue;
    ++leaders;
    ASSERT_TRUE(value_of.contains(seen[i].term)) << "reported term " << seen[i].term << ", which never led";
    EXPECT_EQ(seen[i].value, value_of[seen[i].term]);
    EXPECT_GT(seen[i].term, last_term) << "report " << seen[i].number << " went back to a superseded leader";
    last_term = seen[i].term;
  }
  EXPECT_GE(leaders, 1);
  std::printf("[ info ] the observer reported %d of %zu leaders\n", leaders, terms.size());
}

INSTANTIATE_TEST_SUITE_P(Stores, ProcessTest, ::testing::ValuesIn(testing::MultiProcessSpecs()),
                         [](const auto& p) { return testing::SpecName(p.param, p.index); });

}  // namespace
}  // namespace dlock
