// Three-server ensembles that each test starts itself (testing::ZooKeeperServers,
// tests/support/zookeeper_server.hpp, also what tools/chaos runs):
//  - ZkEnsembleTest: its leader killed while clients hold and wait for one
//    mutex. Each thread has a Client of its own (its own session), so they
//    contend like processes. The ledger of holds must show fencing tokens
//    growing in hold order, no overlap between holds the store still
//    confirmed, and holds resuming after the election.
//  - ZkPartitionTest (servers reach each other through proxies of the test's,
//    tickTime 500 ms, syncLimit 10): a follower cut off from the leader
//    while a holder stays connected to it.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include "support/status_matchers.hpp"
#include "zookeeper/zk_test_support.hpp"

namespace dlock {
namespace {

using namespace std::chrono_literals;
using testing::IsOk;
using zktest::SteadyClock;

struct HoldRecord {
  int worker;
  std::uint64_t token;
  SteadyClock::time_point start, end;
  bool valid;  // still kHeld at `end`, just before release
};

using Servers = testing::ZooKeeperServers;

// Three servers, tickTime 200 ms, initLimit 50, syncLimit 10, in a scratch
// directory (deleted at the end).
Servers::Options EnsembleOptions() {
  Servers::Options o;
  o.size = 3;
  o.init_limit = 50;
  o.sync_ms = 2000;
  o.heap = "128m";
  return o;
}

// "server.N" (1-based) of the server with index `i`, or "" for none.
std::string ServerName(std::optional<std::size_t> i) { return i ? std::to_string(*i + 1) : ""; }

TEST(ZkEnsembleTest, LeaderKilledWhileLocksAreHeldAndWaitedFor) {
  Servers servers(EnsembleOptions());
  // Up to 60 s a server: three cold JVMs on a busy machine.
  ASSERT_TRUE(servers.start_all()) << "the ensemble did not form (see " << servers.dir() << "/zk*/server.log)";
  const std::string hosts = servers.hosts();
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
  EXPECT_TRUE(testing::Eventually([&] { return count_since(t0) >= 20; }, 30s));
  const auto leader_index = servers.leader();
  const std::string leader = ServerName(leader_index);
  ASSERT_FALSE(leader.empty()) << "no leader";
  // SIGKILL it while a worker holds the lock (the others wait all the time).
  EXPECT_TRUE(testing::Eventually([&] { return holding.load() > 0; }, 10s));
  const auto killed_at = SteadyClock::now();
  servers.kill(*leader_index);
  const long before = static_cast<long>(count_since(t0)) - static_cast<long>(count_since(killed_at));
  // The two survivors elect a new leader...
  std::string new_leader;
  EXPECT_TRUE(testing::Eventually([&] { return !(new_leader = ServerName(servers.leader())).empty(); }, 30s));
  const auto elected_at = SteadyClock::now();
  std::printf("killed leader server.%s after %ld holds; server.%s leads after %.2f s\n", leader.c_str(), before,
              new_leader.c_str(), zktest::Seconds(elected_at - killed_at));
  EXPECT_NE(new_leader, leader);
  // ...and work resumes under it.
  EXPECT_TRUE(testing::Eventually([&] { return count_since(elected_at) >= 30; }, 60s))
      << "holds after the election: " << count_since(elected_at);
  stop = true;
  for (auto& t : threads) t.join();

  std::vector<HoldRecord> holds = ledger;
  std::sort(holds.begin(), holds.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
  // Whether the kill fell inside a hold (others wait all the time).
  const bool during_hold = std::any_of(holds.begin(), holds.end(),
                                       [&](const HoldRecord& r) { return r.start <= killed_at && killed_at <= r.end; });
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
          << "workers " << holds[i].worker << " and " << holds[j].worker << " overlapped (tokens " << holds[i].token
          << ", " << holds[j].token << ")";
    }
  }
  SteadyClock::duration gap{};
  for (std::size_t i = 1; i < holds.size(); ++i) gap = std::max(gap, holds[i].start - holds[i - 1].end);
  std::printf("%zu holds, %zu not confirmed at their end, %d errors, longest gap %.2f s, killed during a hold: %s\n",
              holds.size(), invalid, errors.load(), zktest::Seconds(gap), during_hold ? "yes" : "no");
}

// ------------------------------------------------------------ partition

// The ensemble's servers (1..3), whose quorum and election connections all
// go through proxies of the test's.
struct Ensemble {
  Servers servers;

  std::string hosts(int n) const { return "127.0.0.1:" + std::to_string(servers.client_port(n - 1)); }
  std::string mode(int n) const {
    std::string srvr = zktest::FourLetters(hosts(n), "srvr");
    auto at = srvr.find("Mode: ");
    return at == std::string::npos ? "" : srvr.substr(at + 6, srvr.find('\n', at) - at - 6);
  }
  // Silences every connection between servers a and b, both ways.
  void cut(int a, int b) { servers.cut(a - 1, b - 1, true); }
};

Servers::Options PartitionOptions() {
  Servers::Options o = EnsembleOptions();
  o.tick_ms = 500;
  o.sync_ms = 5000;  // syncLimit 10
  o.peer_links = Servers::Options::PeerLinks::kAllPairs;
  return o;
}

// Item 3 of issue 11. A follower cut off from the leader keeps answering its
// clients' reads (and its own pings to them) until syncLimit * tickTime, but
// the leader, which alone expires sessions, hears of them only through that
// follower: it expires a holder connected there one session timeout after
// the cut and grants the lock to someone else. The holder must count itself
// lost before that: by the time the successor holds the lock, the holder's
// session says kLost (state() folds in the session's own deadline, so this
// does not depend on how soon its threads run).
TEST(ZkPartitionTest, FollowerCutFromTheLeaderLosesItsHolderFirst) {
  Ensemble ens{Servers(PartitionOptions())};
  for (std::size_t i = 0; i < ens.servers.size(); ++i) ens.servers.launch(i);
  int leader = 0;
  ASSERT_TRUE(testing::Eventually(
      [&] {
        int followers = 0;
        leader = 0;
        for (int n = 1; n <= 3; ++n) {
          std::string m = ens.mode(n);
          if (m == "leader") leader = n;
          if (m == "follower") ++followers;
        }
        return leader != 0 && followers == 2;
      },
      120s))
      << "the ensemble did not form";
  const int follower = leader == 1 ? 2 : 1;
  const int other = 6 - leader - follower;

  // The holder talks to the follower only; the successor to the other two.
  constexpr auto kTimeout = 2s;
  auto holder_store = OpenStore("zk://" + ens.hosts(follower) + "/dlock-partition?session_timeout=2s");
  ASSERT_THAT(holder_store.status(), IsOk());
  auto holder = (*holder_store)->open_session(Clock::system()->now() + 30s);
  ASSERT_THAT(holder.status(), IsOk());
  std::mutex mu;
  std::vector<std::pair<SessionState, SteadyClock::time_point>> heard;
  auto sub = (*holder)->subscribe([&](SessionState st) {
    std::lock_guard<std::mutex> g(mu);
    heard.emplace_back(st, SteadyClock::now());
  });
  EntrySpec spec;
  spec.kind = std::string(entry_kind::kLock);
  spec.attempt_id = "0123456789abcdef0123456789abcdef";
  auto held = (*holder)->append("lock", spec, Clock::system()->now() + 30s);
  ASSERT_THAT(held.status(), IsOk());
  ASSERT_TRUE(held->queue);
  ASSERT_EQ(held->queue->front().id, held->entry.id);  // the holder holds the lock

  auto successor =
      Client::connect("zk://" + ens.hosts(leader) + "," + ens.hosts(other) + "/dlock-partition?session_timeout=10s");
  Mutex m(successor, "lock");
  // Let a few heartbeats pass, so that the cut finds the holder in its
  // steady state rather than just after it opened.
  std::this_thread::sleep_for(kTimeout);
  ASSERT_EQ((*holder)->state(), SessionState::kConnected);

  const auto cut = SteadyClock::now();
  ens.cut(follower, leader);
  auto hold = m.acquire(60s);
  const auto granted = SteadyClock::now();
  const SessionState holder_state = (*holder)->state();
  const std::string follower_mode = ens.mode(follower);
  ASSERT_TRUE(hold) << "the successor never got the lock";
  EXPECT_EQ(holder_state, SessionState::kLost)
      << "the successor got the lock while the holder's session said " << SessionStateName(holder_state);
  EXPECT_GT(hold->fencing_token(), *held->entry.token);
  EXPECT_TRUE(testing::Eventually([&] { return (*holder)->state() == SessionState::kLost; }, 20s));
  {
    std::lock_guard<std::mutex> g(mu);
    std::string told;
    for (auto& [st, t] : heard) {
      told += " " + std::string(SessionStateName(st)) + " at " + std::to_string(zktest::Seconds(t - cut)) + " s;";
    }
    std::printf(
        "[   INFO   ] server.%d cut from leader server.%d at 0; successor got the lock at %.3f s "
        "(server.%d then in mode '%s'); holder (session timeout %.0f s) told:%s\n",
        follower, leader, zktest::Seconds(granted - cut), follower, follower_mode.c_str(), zktest::Seconds(kTimeout),
        told.c_str());
  }
}

}  // namespace
}  // namespace dlock
