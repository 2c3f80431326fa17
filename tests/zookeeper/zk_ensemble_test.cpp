// A three-server ensemble (tests/servers/zookeeper-ensemble.sh run ...), its
// leader killed while clients hold and wait for one mutex. Each thread has a
// Client of its own (its own session), so they contend like processes. The
// ledger of holds must show fencing tokens growing in hold order, no overlap
// between holds the store still confirmed, and holds resuming after the
// election.
#include <gtest/gtest.h>

#include <algorithm>

#include "zookeeper/zk_test_support.hpp"

namespace dlock {
namespace {

using namespace std::chrono_literals;
using zktest::SteadyClock;

struct HoldRecord {
  int worker;
  std::uint64_t token;
  SteadyClock::time_point start, end;
  bool valid;  // still kHeld at `end`, just before release
};

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string Script(const std::string& args) {
  std::string cmd = std::string(DLOCK_ZK_ENSEMBLE_SCRIPT) + " " + args + " 2>/dev/null";
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    ::pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

TEST(ZkEnsembleTest, LeaderKilledWhileLocksAreHeldAndWaitedFor) {
  const std::string hosts = Env("DLOCK_TEST_ZK_ENSEMBLE"), dir = Env("DLOCK_ZK_ENSEMBLE_DIR");
  if (hosts.empty() || dir.empty()) GTEST_SKIP() << "run through tests/servers/zookeeper-ensemble.sh run DIR ...";
  // 6 s: enough to ride out the election (about a second here) without
  // losing the session, whichever server a client was connected to.
  const std::string url = "zk://" + hosts + "/dlock-ensemble?session_timeout=6s";
  constexpr int kWorkers = 4;
  const auto kRunLimit = 90s;

  std::mutex mu;
  std::vector<HoldRecord> ledger;
  std::atomic<int> errors{0};
  std::atomic<bool> stop{false};
  std::atomic<int> holding{0};  // workers between acquire and release
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      auto client = Client::connect(url);
      Mutex m(client, "leader-kill");
      const auto end = SteadyClock::now() + kRunLimit;
      while (!stop && SteadyClock::now() < end) {
        try {
          auto hold = m.acquire(10s);
          if (!hold) continue;
          HoldRecord r{w, hold->fencing_token(), SteadyClock::now(), {}, false};
          ++holding;
          std::this_thread::sleep_for(20ms);
          r.end = SteadyClock::now();
          r.valid = hold->state() == HoldState::kHeld;
          --holding;
          hold->release();
          std::lock_guard lock(mu);
          ledger.push_back(r);
        } catch (const Error&) {
          ++errors;  // the store was unavailable during the election: try again
          std::this_thread::sleep_for(50ms);
        }
      }
    });
  }
  auto count_since = [&](SteadyClock::time_point t) {
    std::lock_guard lock(mu);
    return std::count_if(ledger.begin(), ledger.end(), [&](const HoldRecord& r) { return r.start > t; });
  };

  // Some holds before the kill, then kill the leader while one is held.
  const auto t0 = SteadyClock::now();
  EXPECT_TRUE(zktest::WaitFor([&] { return count_since(t0) >= 20; }, 30s));
  const std::string leader = Script("leader " + dir);
  ASSERT_FALSE(leader.empty()) << "no leader";
  // SIGKILL it straight from here, while a worker holds the lock (the others
  // wait all the time), then let the script reap it.
  pid_t leader_pid = 0;
  std::ifstream(dir + "/s" + leader + "/pid") >> leader_pid;
  ASSERT_GT(leader_pid, 0);
  EXPECT_TRUE(zktest::WaitFor([&] { return holding.load() > 0; }, 10s));
  const auto killed_at = SteadyClock::now();
  ::kill(leader_pid, SIGKILL);
  Script("kill " + dir + " " + leader);
  const long before = static_cast<long>(count_since(t0)) - static_cast<long>(count_since(killed_at));
  // The two survivors elect a new leader...
  std::string new_leader;
  EXPECT_TRUE(zktest::WaitFor([&] { return !(new_leader = Script("leader " + dir)).empty(); }, 30s));
  const auto elected_at = SteadyClock::now();
  std::printf("killed leader server.%s after %ld holds; server.%s leads after %.2f s\n", leader.c_str(), before,
              new_leader.c_str(), zktest::Seconds(elected_at - killed_at));
  EXPECT_NE(new_leader, leader);
  // ...and work resumes under it.
  EXPECT_TRUE(zktest::WaitFor([&] { return count_since(elected_at) >= 30; }, 60s))
      << "holds after the election: " << count_since(elected_at);
  stop = true;
  for (auto& t : threads) t.join();

  std::vector<HoldRecord> holds = ledger;
  std::sort(holds.begin(), holds.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
  // Whether the kill fell inside a hold (others wait all the time).
  const bool during_hold = std::any_of(holds.begin(), holds.end(), [&](const HoldRecord& r) {
    return r.start <= killed_at && killed_at <= r.end;
  });
  std::size_t invalid = 0;
  for (std::size_t i = 0; i < holds.size(); ++i) {
    if (!holds[i].valid) ++invalid;
    if (i == 0) continue;
    // Fencing: tokens strictly increase in the order holds began.
    EXPECT_LT(holds[i - 1].token, holds[i].token) << "holds " << i - 1 << " and " << i;
  }
  for (std::size_t i = 0; i < holds.size(); ++i) {
    for (std::size_t j = i + 1; j < holds.size() && holds[j].start < holds[i].end; ++j) {
      EXPECT_FALSE(holds[i].valid && holds[j].valid)
          << "workers " << holds[i].worker << " and " << holds[j].worker << " overlapped (tokens "
          << holds[i].token << ", " << holds[j].token << ")";
    }
  }
  SteadyClock::duration gap{};
  for (std::size_t i = 1; i < holds.size(); ++i) gap = std::max(gap, holds[i].start - holds[i - 1].end);
  std::printf("%zu holds, %zu not confirmed at their end, %d errors, longest gap %.2f s, killed during a hold: %s\n",
              holds.size(), invalid, errors.load(), zktest::Seconds(gap), during_hold ? "yes" : "no");
}

}  // namespace
}  // namespace dlock
