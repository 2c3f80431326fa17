// Regression tests against a real ZooKeeper server, for defects an
// adversarial review found in the first round of issue 11's fixes (each
// failed on that code). Run by CTest with the shared server fixture, or by
// hand with DLOCK_TEST_ZK=host:port.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>

#include "dlock/dlock.hpp"
#include "support/child.hpp"
#include "support/status_matchers.hpp"
#include "zookeeper/zk_test_support.hpp"

namespace dlock {
namespace {

using namespace std::chrono_literals;
using testing::IsOk;
using testing::RunInChild;
using Steady = std::chrono::steady_clock;

std::string Server() { return zktest::SharedServer(); }

#define REQUIRE_ZK() DLOCK_REQUIRE_ZK_SERVER()

std::string Chroot(const std::string& test) {
  return "/dlock-review-" + test + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(Steady::now().time_since_epoch().count() % 100000);
}

// ---------------------------------------------------------------------------
// Finding: ClientCore::session() holds open_mu_ while it close()s a session
// it found lost, and a ZooKeeper close() waits for the session thread to
// deliver the pending notes (kLost) and close the handle. A Hold's
// on_state_change listener runs on that session thread; hold.hpp allows it
// to "call into dlock". If it calls anything that opens/gets the client's
// session (Client::list_entries, Client::session, try_lock, acquire,
// dlock::Inspect) while another thread of the process is inside
// ClientCore::session() closing the lost session, both wait forever:
//   thread X: session() [open_mu_] -> ZkSession::close -> waits handle_closed_
//   session thread: kLost -> listener -> list_entries -> session() -> open_mu_
// The lost deadline is passed by moving an injected clock (no server fault).
void DeadlockScenario(bool listener_calls_in, std::string& outcome) {
  const std::string url = "zk://" + Server() + Chroot("deadlock") + "?session_timeout=4s";
  outcome = RunInChild(
      [&]() -> int {
        auto clock = std::make_shared<ManualClock>();
        ClientOptions options;
        options.clock = clock;
        auto client = Client::open(url, options);
        if (!client.ok()) return 3;
        Mutex held_lock(*client, "held");
        auto hold = held_lock.acquire(10s);
        if (!hold) return 4;
        std::atomic<bool> listener_done{false};
        auto sub = hold->on_state_change([&](HoldState s) {
          if (s != HoldState::kLost) return;
          std::this_thread::sleep_for(300ms);  // the other thread is in session() by now
          if (listener_calls_in) auto entries = client->list_entries("held", false);  // "may call into dlock"
          listener_done = true;
        });
        clock->advance(5s);  // past the lost deadline: the session thread tells the hold
        std::this_thread::sleep_for(50ms);
        Mutex other(*client, "other");
        bool got = other.try_lock();  // finds the session lost and replaces it
        if (got) other.unlock();
        return testing::Eventually([&] { return listener_done.load(); }, 5s) ? 0 : 5;
      },
      30s);
}

TEST(ZkRegressions, HoldListenerMayCallIntoTheClientWhileAnotherThreadReplacesTheLostSession) {
  REQUIRE_ZK();
  std::string outcome;
  DeadlockScenario(true, outcome);
  EXPECT_EQ(outcome, "exit 0") << "the process " << outcome
                               << " (HUNG: the acquirer and the session thread wait for each other)";
}

// Control: the same steps, with a listener that does not call into the client.
TEST(ZkRegressions, ReplacingALostSessionWithAQuietListener) {
  REQUIRE_ZK();
  std::string outcome;
  DeadlockScenario(false, outcome);
  EXPECT_EQ(outcome, "exit 0");
}

// ---------------------------------------------------------------------------
// A new session's lost deadline counts from the moment it began connecting
// (when the leader made it is unknown to the client). If connecting took
// most of the timeout -- a silent server tried first, which the C client
// waits 2/3 of the timeout for -- the session counted itself lost right
// after it opened, and every hold taken on it went kLost at once. The store
// now opens another session instead. Here the only server is reached through
// a proxy that swallows the first two connections (the C client gives up on
// each after 2/3 of the timeout), so the first session opens late for sure.
TEST(ZkRegressions, ASessionOpenedLateIsReplacedBeforeUse) {
  REQUIRE_ZK();
  const std::string server = Server();
  testing::TcpProxy proxy(std::stoi(server.substr(server.rfind(':') + 1)));
  proxy.partition();
  std::thread healer([&] {
    testing::Eventually([&] { return proxy.accepted() >= 2; }, 20s);
    proxy.heal();
  });
  auto client = Client::open("zk://" + proxy.hosts() + Chroot("late") + "?session_timeout=2s&connect_timeout=20s");
  ASSERT_THAT(client.status(), IsOk());
  Mutex m(*client, "job");
  auto t0 = Steady::now();
  auto hold = m.acquire(30s);
  healer.join();
  ASSERT_TRUE(hold);
  auto opened_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Steady::now() - t0).count();
  EXPECT_GE(proxy.accepted(), 3) << "the first session did not open late";
  auto t1 = Steady::now();
  bool lost = testing::Eventually([&] { return hold->state() == HoldState::kLost; }, 1500ms);
  auto held_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Steady::now() - t1).count();
  EXPECT_FALSE(lost) << "acquiring took " << opened_ms << " ms; the hold was declared lost " << held_ms
                     << " ms after it was granted, with the server healthy";
}

}  // namespace
}  // namespace dlock
