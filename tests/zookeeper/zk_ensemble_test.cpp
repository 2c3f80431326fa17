// Three-server ensembles (tests/servers/zookeeper-ensemble.sh run ...):
//  - ZkEnsembleTest: its leader killed while clients hold and wait for one
//    mutex. Each thread has a Client of its own (its own session), so they
//    contend like processes. The ledger of holds must show fencing tokens
//    growing in hold order, no overlap between holds the store still
//    confirmed, and holds resuming after the election.
//  - ZkPartitionTest (ZK_PEER_PROXIES=1): a follower cut off from the leader
//    while a holder stays connected to it.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

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
  EXPECT_TRUE(testing::Eventually([&] { return count_since(t0) >= 20; }, 30s));
  const std::string leader = Script("leader " + dir);
  ASSERT_FALSE(leader.empty()) << "no leader";
  // SIGKILL it straight from here, while a worker holds the lock (the others
  // wait all the time), then let the script reap it.
  pid_t leader_pid = 0;
  std::ifstream(dir + "/s" + leader + "/pid") >> leader_pid;
  ASSERT_GT(leader_pid, 0);
  EXPECT_TRUE(testing::Eventually([&] { return holding.load() > 0; }, 10s));
  const auto killed_at = SteadyClock::now();
  ::kill(leader_pid, SIGKILL);
  Script("kill " + dir + " " + leader);
  const long before = static_cast<long>(count_since(t0)) - static_cast<long>(count_since(killed_at));
  // The two survivors elect a new leader...
  std::string new_leader;
  EXPECT_TRUE(testing::Eventually([&] { return !(new_leader = Script("leader " + dir)).empty(); }, 30s));
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

// The ensemble's servers, and the proxies between them (DIR/links).
struct Ensemble {
  struct Link {
    int from, to;
    std::string kind;  // quorum | election
    std::unique_ptr<testing::TcpProxy> proxy;
  };
  std::vector<int> client_ports;  // [0] is server 1
  std::vector<Link> links;

  std::string hosts(int n) const { return "127.0.0.1:" + std::to_string(client_ports[n - 1]); }
  std::string mode(int n) const {
    std::string srvr = zktest::FourLetters(hosts(n), "srvr");
    auto at = srvr.find("Mode: ");
    return at == std::string::npos ? "" : srvr.substr(at + 6, srvr.find('\n', at) - at - 6);
  }
  // Silences every connection between servers a and b, both ways.
  void cut(int a, int b) {
    for (auto& l : links) {
      if ((l.from == a && l.to == b) || (l.from == b && l.to == a)) l.proxy->partition();
    }
  }
};

// Starts the proxies of the ensemble in `dir` on the ports its zoo.cfg files
// name; false if it is not proxied or a port is taken.
bool StartProxies(const std::string& dir, Ensemble& e) {
  for (int n = 1; n <= 3; ++n) {
    int port = 0;
    std::ifstream(dir + "/s" + std::to_string(n) + "/port") >> port;
    if (port == 0) return false;
    e.client_ports.push_back(port);
  }
  std::ifstream in(dir + "/links");
  Ensemble::Link l;
  int listen = 0, target = 0;
  while (in >> l.from >> l.to >> l.kind >> listen >> target) {
    e.links.push_back({l.from, l.to, l.kind, std::make_unique<testing::TcpProxy>(target, listen)});
    if (e.links.back().proxy->port() != listen) return false;
  }
  return e.links.size() == 12;
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
  const std::string dir = Env("DLOCK_ZK_ENSEMBLE_DIR");
  if (dir.empty() || !std::ifstream(dir + "/links")) {
    GTEST_SKIP() << "run through ZK_PEER_PROXIES=1 tests/servers/zookeeper-ensemble.sh run DIR ...";
  }
  Ensemble ens;
  ASSERT_TRUE(StartProxies(dir, ens)) << "cannot read " << dir << "/links";
  // The quorum forms once the proxies run.
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
