// What faults do to holders and waiters, on every store: the faults are
// injected by a decorator (tests/support/faulty_store.hpp) in front of the
// real store, so their meaning is the store contract's, and the recipes meet
// the real store underneath. The faults only MemStore's own hooks can make
// (a hand-moved clock, slow replies) stay in tests/unit/faults_test.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "dlock/dlock.hpp"
#include "support/faulty_store.hpp"
#include "support/status_matchers.hpp"
#include "support/stores.hpp"

namespace dlock {
namespace {

using namespace std::chrono_literals;
using testing::Eventually;
using testing::FaultyStore;

class InjectedFaultsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string url = GetParam();
    if (url == "mem") {
      real_ = MemStore::create();
    } else {
      if (url == "file") {
        char tmpl[] = "/tmp/dlock-injected-XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        scratch_ = tmpl;
        url = "file://" + scratch_;
      }
      auto opened = OpenStore(url);
      ASSERT_TRUE(opened.ok()) << opened.status().to_string();
      real_ = *opened;
    }
    faulty_ = std::make_shared<FaultyStore>(real_);
    static std::atomic<int> counter{0};
    name_ = "injected/" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  }
  void TearDown() override {
    faulty_.reset();
    real_.reset();
    if (!scratch_.empty()) std::filesystem::remove_all(scratch_);
  }

  // A client whose store requests go through the fault injector.
  Client FaultyClient() { return Client::with_store(faulty_); }
  // A client of the real store, for looking without faults.
  Client PlainClient() { return Client::with_store(real_); }
  static std::string SessionOf(const Client& c) { return c.session().value()->id(); }
  // Live entries of `queue`, as a fresh session of the real store sees them.
  std::size_t Entries(const std::string& queue) {
    auto listed = PlainClient().list_entries(queue, false);
    return listed.ok() ? listed->size() : 0;
  }

  std::shared_ptr<Store> real_;
  std::shared_ptr<FaultyStore> faulty_;
  std::string scratch_;
  std::string name_;
};

TEST_P(InjectedFaultsTest, ExpiryTellsTheHolderBeforeTheNextHolderGetsIn) {
  auto a = FaultyClient();
  auto b = PlainClient();
  Mutex ma(a, name_);
  Mutex mb(b, name_);
  auto hold = ma.acquire(10s);
  ASSERT_TRUE(hold);
  std::mutex mu;
  std::vector<std::string> events;
  auto sub = hold->on_state_change([&](HoldState s) {
    std::lock_guard<std::mutex> g(mu);
    events.push_back(std::string("holder:") + std::string(HoldStateName(s)));
  });
  std::jthread waiter([&] {
    std::unique_lock lock(mb);
    std::lock_guard<std::mutex> g(mu);
    events.push_back("next holder in");
  });
  ASSERT_TRUE(Eventually([&] { return Entries(name_) == 2u; }));
  faulty_->expire(SessionOf(a));
  waiter.join();
  EXPECT_EQ(hold->state(), HoldState::kLost);
  EXPECT_TRUE(hold->lost_token().stop_requested());
  std::lock_guard<std::mutex> g(mu);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.front(), "holder:lost");
  EXPECT_EQ(events.back(), "next holder in");
}

TEST_P(InjectedFaultsTest, SuspensionMakesTheHoldUncertainAndReconnectRestoresIt) {
  auto a = FaultyClient();
  Mutex m(a, name_);
  m.lock();
  auto token = m.lost_token();
  faulty_->suspend(SessionOf(a));
  EXPECT_EQ(m.hold_state(), HoldState::kUncertain);
  EXPECT_TRUE(token.stop_requested());
  faulty_->resume(SessionOf(a));
  EXPECT_EQ(m.hold_state(), HoldState::kHeld);
  EXPECT_TRUE(m.lost_token().stop_requested()) << "the lost signal is never reset";
  m.unlock();
  EXPECT_TRUE(Eventually([&] { return Entries(name_) == 0u; }));
}

TEST_P(InjectedFaultsTest, LockAfterALostHoldThrowsUntilUnlocked) {
  auto a = FaultyClient();
  Mutex m(a, name_);
  m.lock();
  faulty_->expire(SessionOf(a));
  EXPECT_THROW(m.lock(), Error);
  m.unlock();
  EXPECT_TRUE(m.try_lock_for(10s)) << "a new session re-acquires";
  m.unlock();
}

TEST_P(InjectedFaultsTest, AWaiterWhoseSessionExpiresRequeuesOnANewSession) {
  auto a = PlainClient();
  auto b = FaultyClient();
  Mutex ma(a, name_);
  Mutex mb(b, name_);
  ma.lock();
  std::atomic<bool> got{false};
  std::jthread waiter([&] {
    mb.lock();
    got = true;
    mb.unlock();
  });
  ASSERT_TRUE(Eventually([&] { return Entries(name_) == 2u; }));
  const std::string first = SessionOf(b);
  faulty_->expire(first);
  ASSERT_TRUE(Eventually([&] { return SessionOf(b) != first && Entries(name_) == 2u; }));
  EXPECT_FALSE(got);
  ma.unlock();
  waiter.join();
  EXPECT_TRUE(got);
  EXPECT_TRUE(Eventually([&] { return Entries(name_) == 0u; }));
}

TEST_P(InjectedFaultsTest, ALostAppendReplyIsAdoptedNotOrphaned) {
  auto a = FaultyClient();
  Mutex m(a, name_);
  faulty_->lose_next_reply("append");
  ASSERT_TRUE(m.try_lock_for(10s));
  EXPECT_EQ(Entries(name_), 1u) << "the retry made a second entry instead of adopting";
  EXPECT_GE(faulty_->op_count("find_own"), 1u);
  m.unlock();
  EXPECT_TRUE(Eventually([&] { return Entries(name_) == 0u; }));
}

TEST_P(InjectedFaultsTest, ATimeoutAfterALostAppendReplyLeavesNothing) {
  auto a = PlainClient();
  auto b = FaultyClient();
  Mutex ma(a, name_);
  Mutex mb(b, name_);
  ma.lock();
  faulty_->lose_next_reply("append");
  EXPECT_FALSE(mb.try_lock_for(200ms));
  EXPECT_TRUE(Eventually([&] { return Entries(name_) == 1u; }));
  ma.unlock();
  EXPECT_TRUE(Eventually([&] { return Entries(name_) == 0u; }));
}

TEST_P(InjectedFaultsTest, ALostAppendReplyThenAFailedFindOwnLeavesNothing) {
  auto a = FaultyClient();
  Mutex m(a, name_);
  faulty_->lose_next_reply("append");
  faulty_->fail_next("find_own", PermissionDeniedError("injected"));
  EXPECT_THROW(m.try_lock_for(10s), Error);
  EXPECT_TRUE(Eventually([&] { return Entries(name_) == 0u; })) << "an orphan entry stayed in the queue";
}

TEST_P(InjectedFaultsTest, AFailedRemoveIsRetriedInTheBackground) {
  auto a = FaultyClient();
  Mutex m(a, name_);
  m.lock();
  faulty_->fail_next("remove", UnavailableError("injected"), 3);
  m.unlock();  // must not throw, must not leave the entry forever
  EXPECT_TRUE(Eventually([&] { return Entries(name_) == 0u; }));
  EXPECT_GE(faulty_->op_count("remove"), 4u);
}

// Issue 11, item 15: memory running out inside the background removal is
// survived, and the removal retried.
TEST_P(InjectedFaultsTest, BackgroundRemovalSurvivesAStoreThatThrows) {
  auto a = FaultyClient();
  Mutex m(a, name_);
  auto hold = m.acquire(10s);
  ASSERT_TRUE(hold);
  faulty_->throw_next("remove", 2);
  hold->release();  // must neither throw nor terminate
  EXPECT_TRUE(Eventually([&] { return Entries(name_) == 0u; }));
  EXPECT_GE(faulty_->op_count("remove"), 3u);
}

TEST_P(InjectedFaultsTest, StoreErrorsSurfaceAsDlockError) {
  auto a = FaultyClient();
  Mutex m(a, name_);
  faulty_->fail_next("append", PermissionDeniedError("no ACL"));
  try {
    m.lock();
    FAIL() << "lock() succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPermissionDenied);
  }
  EXPECT_EQ(Entries(name_), 0u);
}

TEST_P(InjectedFaultsTest, AnAbortedAppendFailsTheAcquireAndLeavesNothing) {
  auto a = FaultyClient();
  Mutex m(a, name_);
  faulty_->fail_next("append", AbortedError("only 0 of 1 replicas acknowledged the append"));
  try {
    m.try_lock_for(10s);
    FAIL() << "the acquire succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable) << e.what();
  }
  EXPECT_EQ(faulty_->op_count("find_own"), 0u);
  EXPECT_EQ(Entries(name_), 0u);
}

TEST_P(InjectedFaultsTest, AListenerMayCloseTheSessionWhenItIsTold) {
  auto a = FaultyClient();
  Mutex m(a, name_);
  auto hold = m.acquire(10s);
  ASSERT_TRUE(hold);
  auto sub = hold->on_state_change([&](HoldState s) {
    if (s == HoldState::kUncertain) a.close_session();
  });
  faulty_->suspend(SessionOf(a));
  EXPECT_TRUE(Eventually([&] { return hold->state() == HoldState::kLost; }));
  EXPECT_TRUE(Eventually([&] { return Entries(name_) == 0u; }));
}

TEST_P(InjectedFaultsTest, SemaphoreLeasesGoWithTheSession) {
  auto a = FaultyClient();
  auto b = PlainClient();
  Semaphore sa(a, name_, 2);
  Semaphore sb(b, name_, 2);
  auto lease = sa.acquire(2, 10s);
  ASSERT_TRUE(lease);
  std::atomic<bool> got{false};
  std::jthread waiter([&] { got = sb.acquire(1, 30s).has_value(); });
  ASSERT_TRUE(Eventually([&] { return Entries(name_ + "/leases") == 3u; }));
  faulty_->expire(SessionOf(a));
  waiter.join();
  EXPECT_TRUE(got);
  EXPECT_EQ(lease->state(), HoldState::kLost);
  EXPECT_TRUE(Eventually([&] { return Entries(name_ + "/leases") + Entries(name_ + "/locks") == 0u; }));
}

INSTANTIATE_TEST_SUITE_P(Stores, InjectedFaultsTest, ::testing::ValuesIn(testing::ConformanceSpecs()),
                         [](const auto& p) { return testing::SpecName(p.param, p.index); });

}  // namespace
}  // namespace dlock
