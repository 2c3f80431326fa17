// Faults against a real server: thousands of short timeouts and cancellations
// on a few names while a proxy cuts some clients off at random. Afterwards no
// entry may be left behind, and no two valid holds may have overlapped.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <random>

#include "support/observer_cut.hpp"
#include "zookeeper/zk_test_support.hpp"

namespace dlock {
namespace {

using namespace std::chrono_literals;
using zktest::SharedServer;
using zktest::SteadyClock;

// One hold as seen by its holder: [start, end] on the steady clock, and
// whether the store still confirmed it (kHeld) at `end`, just before release.
struct Span {
  std::string name;
  char kind;  // 'x' exclusive (mutex, writer), 'r' reader, 's' semaphore permit
  SteadyClock::time_point start, end;
  bool valid;
};

// Every ephemeral node under `root` (recursively): what a live session left.
std::vector<std::string> Ephemerals(zktest::RawZk& raw, const std::string& root) {
  std::vector<std::string> out, todo{root};
  while (!todo.empty()) {
    std::string p = todo.back();
    todo.pop_back();
    for (const auto& c : raw.children(p)) {
      std::string child = p + "/" + c;
      Stat st{};
      if (raw.exists(child, &st) && st.ephemeralOwner != 0) out.push_back(child);
      todo.push_back(child);
    }
  }
  return out;
}

constexpr std::uint32_t kPermits = 2;

// The most holds of one name valid at the same instant, per kind rule:
// exclusive holds exclude everything, readers exclude exclusive holds, and
// semaphore permits are at most kPermits.
std::string CheckOverlaps(const std::vector<Span>& spans) {
  std::map<std::string, std::vector<const Span*>> by_name;
  for (const auto& s : spans) {
    if (s.valid) by_name[s.name].push_back(&s);
  }
  for (auto& [name, v] : by_name) {
    // Events: +1 at start, -1 at end; ends sort before starts at equal times
    // (a hold that ended at t did not overlap one that started at t).
    std::vector<std::tuple<SteadyClock::time_point, int, char>> ev;
    for (const Span* s : v) {
      ev.emplace_back(s->start, 1, s->kind);
      ev.emplace_back(s->end, -1, s->kind);
    }
    std::sort(ev.begin(), ev.end(), [](const auto& a, const auto& b) {
      if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) < std::get<0>(b);
      return std::get<1>(a) < std::get<1>(b);
    });
    int x = 0, r = 0, s = 0;
    for (const auto& [t, d, k] : ev) {
      (k == 'x' ? x : k == 'r' ? r : s) += d;
      if (x > 1 || (x == 1 && r > 0) || s > static_cast<int>(kPermits)) {
        return name + ": overlapping holds (exclusive " + std::to_string(x) + ", readers " + std::to_string(r) +
               ", permits " + std::to_string(s) + ")";
      }
    }
  }
  return "";
}

TEST(ZkFaultTest, RandomTimeoutsCancellationsAndDropsLeaveNoOrphans) {
  DLOCK_REQUIRE_ZK_SERVER();
  const std::string hosts = SharedServer();
  zktest::EnsureTestRoot(hosts);
  const std::string chroot = zktest::UniqueChroot("faults");
  zktest::RawZk raw(hosts);
  ASSERT_TRUE(raw.connected());
  testing::TcpProxy proxy(std::stoi(hosts.substr(hosts.rfind(':') + 1)));

  // A short session timeout, so that sessions lost behind the proxy expire
  // (and their ephemerals go) within the test's bounded wait.
  const std::string query = "?session_timeout=2s&connect_timeout=5s";
  constexpr int kClients = 4, kThreadsPerClient = 2;
  constexpr int kMaxAttempts = 4000;
  const auto kMaxRun = 45s;
  std::vector<std::optional<Client>> clients;
  for (int i = 0; i < kClients; ++i) {
    // Clients 0 and 1 go through the proxy that drops connections.
    clients.emplace_back(Client::connect("zk://" + (i < 2 ? proxy.hosts() : hosts) + chroot + query));
  }

  const std::vector<std::string> names{"m0", "m1", "rw", "sem"};
  std::mutex spans_mu;
  std::vector<Span> spans;
  std::atomic<int> attempts{0}, acquired{0}, timed_out{0}, cancelled{0}, errors{0};
  std::atomic<bool> done{false};

  // One stop source per worker, which the canceller trips at random moments.
  struct Slot {
    std::mutex mu;
    std::stop_source source;
  };
  std::vector<Slot> slots(kClients * kThreadsPerClient);

  auto worker = [&](int index, Client client) {
    std::mt19937 rng(static_cast<unsigned>(index * 7919 + 17));
    Mutex m0(client, "m0"), m1(client, "m1");
    ReadWriteLock rw(client, "rw");
    Semaphore sem(client, "sem", kPermits);
    const auto run_end = SteadyClock::now() + kMaxRun;
    while (attempts.fetch_add(1) < kMaxAttempts && SteadyClock::now() < run_end) {
      const int what = static_cast<int>(rng() % 5);  // m0, m1, read, write, permit
      const auto timeout = std::chrono::milliseconds(rng() % 60);
      std::stop_token stop;
      if (rng() % 3 == 0) {
        std::lock_guard lock(slots[index].mu);
        slots[index].source = std::stop_source();
        stop = slots[index].source.get_token();
      }
      try {
        std::optional<Hold> hold;
        char kind = 'x';
        std::string name;
        switch (what) {
          case 0: hold = m0.acquire(timeout, stop), name = "m0"; break;
          case 1: hold = m1.acquire(timeout, stop), name = "m1"; break;
          case 2: hold = rw.acquire_read(timeout, stop), name = "rw", kind = 'r'; break;
          case 3: hold = rw.acquire_write(timeout, stop), name = "rw"; break;
          default: hold = sem.acquire(1, timeout, stop), name = "sem", kind = 's'; break;
        }
        if (!hold) {
          (stop.stop_requested() ? cancelled : timed_out)++;
          continue;
        }
        ++acquired;
        const auto start = SteadyClock::now();
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
        const auto end = SteadyClock::now();
        const bool valid = hold->state() == HoldState::kHeld;
        hold->release();
        std::lock_guard lock(spans_mu);
        spans.push_back({name, kind, start, end, valid});
      } catch (const Error&) {
        ++errors;  // the store failed (a cut connection, a lost session): allowed
      }
    }
  };

  std::vector<std::thread> threads;
  for (int i = 0; i < kClients * kThreadsPerClient; ++i) threads.emplace_back(worker, i, *clients[i % kClients]);
  // Cancels a random worker's current attempt every few milliseconds.
  std::thread canceller([&] {
    std::mt19937 rng(4242);
    while (!done) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1 + rng() % 10));
      auto& slot = slots[rng() % slots.size()];
      std::lock_guard lock(slot.mu);
      slot.source.request_stop();
    }
  });
  // Cuts the proxied connections at random; now and then goes silent for
  // longer than the session timeout, so that those sessions expire.
  std::atomic<int> resets{0}, partitions{0};
  std::thread chaos([&] {
    std::mt19937 rng(99);
    while (!done) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50 + rng() % 300));
      if (done) break;
      if (rng() % 12 == 0) {
        proxy.partition();
        ++partitions;
        for (int i = 0; i < 25 && !done; ++i) std::this_thread::sleep_for(100ms);
        proxy.heal();
      } else {
        proxy.reset();
        ++resets;
      }
    }
  });
  for (auto& t : threads) t.join();
  done = true;
  canceller.join();
  chaos.join();
  proxy.heal();

  std::printf("attempts %d, acquired %d, timed out %d, cancelled %d, errors %d, resets %d, partitions %d\n",
              std::min(attempts.load(), kMaxAttempts), acquired.load(), timed_out.load(), cancelled.load(),
              errors.load(), resets.load(), partitions.load());
  EXPECT_GE(std::min(attempts.load(), kMaxAttempts), 1000);  // the run did real work
  EXPECT_GT(acquired.load(), 100);
  EXPECT_GT(timed_out.load() + cancelled.load(), 100);
  EXPECT_EQ(CheckOverlaps(spans), "");

  // Every hold is released and the clients are still open: whatever is left
  // is an orphan, unless it belongs to a session that is lost and about to
  // expire (2 s) or to a removal the store is still retrying.
  std::vector<std::string> left;
  EXPECT_TRUE(testing::Eventually([&] { return (left = Ephemerals(raw, chroot)).empty(); }, 20s))
      << left.size() << " orphan(s), first " << left.front();
  clients.clear();
  EXPECT_TRUE(testing::Eventually([&] { return Ephemerals(raw, chroot).empty(); }, 10s));
}

// An observer cut off from the server (issue 16, "no stale leader after a
// reconnect"): it says kUnknown while cut off; the leader changes meanwhile;
// once its connection is back (the same session) it reads again and
// reports the new leader, never the old one again.
TEST(ZkFaultTest, AnObserverCutOffSaysUnknownThenReportsTheLeaderNowNeverTheOldOne) {
  DLOCK_REQUIRE_ZK_SERVER();
  const std::string hosts = SharedServer();
  zktest::EnsureTestRoot(hosts);
  const std::string chroot = zktest::UniqueChroot("observer-cut");
  testing::TcpProxy proxy(std::stoi(hosts.substr(hosts.rfind(':') + 1)));
  // A session that outlives the cut, so that the reconnect is the same one.
  Client watcher = Client::connect("zk://" + proxy.hosts() + chroot + "?session_timeout=20s");
  Client direct = Client::connect("zk://" + hosts + chroot);
  testing::ExpectAnObserverCutOffReportsTheLeaderNowNeverTheOldOne(watcher, direct, proxy);
}

}  // namespace
}  // namespace dlock
