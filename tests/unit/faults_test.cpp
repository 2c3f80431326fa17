// What faults do to holders and waiters, on mem:// where they can be
// injected deterministically.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "dlock/dlock.hpp"
#include "support/stores.hpp"

namespace dlock {
namespace {

using namespace std::chrono_literals;
using testing::Eventually;

std::string SessionOf(const Client& c) { return c.session().value()->id(); }

// A MemStore and two clients (two sessions) on one hand-moved clock.
struct ManualWorld {
  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>();
  std::shared_ptr<MemStore> store;
  Client a, b;
  ManualWorld() : store(MakeStore(clock)), a(MakeClient(store, clock)), b(MakeClient(store, clock)) {}
  static std::shared_ptr<MemStore> MakeStore(const std::shared_ptr<ManualClock>& clock) {
    MemStoreOptions options;
    options.clock = clock;
    return MemStore::create(options);
  }
  static Client MakeClient(const std::shared_ptr<MemStore>& store, const std::shared_ptr<ManualClock>& clock) {
    ClientOptions options;
    options.clock = clock;
    return Client::with_store(store, options);
  }
};

TEST(Faults, ExpiryTellsTheHolderBeforeTheNextHolderGetsIn) {
  auto store = MemStore::create();
  auto a = Client::with_store(store);
  auto b = Client::with_store(store);
  Mutex ma(a, "orders/1");
  Mutex mb(b, "orders/1");
  auto hold = ma.acquire(1s);
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
  ASSERT_TRUE(Eventually([&] { return store->entry_count() == 2u; }));
  store->expire(SessionOf(a));
  waiter.join();
  EXPECT_EQ(hold->state(), HoldState::kLost);
  EXPECT_TRUE(hold->lost_token().stop_requested());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0], "holder:lost");
  EXPECT_EQ(events[1], "next holder in");
}

TEST(Faults, SuspensionMakesTheHoldUncertainAndReconnectRestoresIt) {
  auto store = MemStore::create();
  auto a = Client::with_store(store);
  Mutex m(a, "jobs/x");
  m.lock();
  auto token = m.lost_token();
  store->suspend(SessionOf(a));
  EXPECT_EQ(m.hold_state(), HoldState::kUncertain);
  EXPECT_TRUE(token.stop_requested());
  store->resume(SessionOf(a));
  EXPECT_EQ(m.hold_state(), HoldState::kHeld);
  EXPECT_TRUE(m.lost_token().stop_requested()) << "the lost signal is never reset";
  m.unlock();
  EXPECT_EQ(store->entry_count(), 0u);
}

TEST(Faults, LockAfterLostHoldThrowsUntilUnlocked) {
  auto store = MemStore::create();
  auto a = Client::with_store(store);
  Mutex m(a, "jobs/lost");
  m.lock();
  store->expire(SessionOf(a));
  EXPECT_THROW(m.lock(), Error);
  m.unlock();
  EXPECT_TRUE(m.try_lock_for(1s)) << "a new session re-acquires";
  m.unlock();
}

TEST(Faults, WaiterWhoseSessionExpiresRequeuesOnANewSession) {
  auto store = MemStore::create();
  auto a = Client::with_store(store);
  auto b = Client::with_store(store);
  Mutex ma(a, "q");
  Mutex mb(b, "q");
  ma.lock();
  std::atomic<bool> got{false};
  std::jthread waiter([&] {
    mb.lock();
    got = true;
    mb.unlock();
  });
  ASSERT_TRUE(Eventually([&] { return store->entry_count() == 2u; }));
  std::string first_session = SessionOf(b);
  store->expire(first_session);
  // The waiter re-queues behind the holder on a fresh session.
  ASSERT_TRUE(Eventually([&] { return store->entry_count() == 2u && SessionOf(b) != first_session; }));
  EXPECT_FALSE(got);
  ma.unlock();
  waiter.join();
  EXPECT_TRUE(got);
  EXPECT_EQ(store->entry_count(), 0u);
}

TEST(Faults, LostAppendReplyIsAdoptedNotOrphaned) {
  auto store = MemStore::create();
  auto a = Client::with_store(store);
  Mutex m(a, "adopt");
  store->lose_next_reply("append");
  ASSERT_TRUE(m.try_lock_for(1s));
  EXPECT_EQ(store->entry_count(), 1u) << "the retry made a second entry instead of adopting";
  EXPECT_GE(store->op_count("find_own"), 1u);
  m.unlock();
  EXPECT_EQ(store->entry_count(), 0u);
}

TEST(Faults, TimeoutAfterLostAppendReplyLeavesNothing) {
  auto store = MemStore::create();
  auto a = Client::with_store(store);
  auto b = Client::with_store(store);
  Mutex ma(a, "orphan");
  Mutex mb(b, "orphan");
  ma.lock();
  store->lose_next_reply("append");
  EXPECT_FALSE(mb.try_lock_for(100ms));
  EXPECT_TRUE(Eventually([&] { return store->entry_count() == 1u; }));
  ma.unlock();
  EXPECT_EQ(store->entry_count(), 0u);
}

TEST(Faults, FailedRemoveIsRetriedInTheBackground) {
  auto store = MemStore::create();
  auto a = Client::with_store(store);
  Mutex m(a, "retry");
  m.lock();
  store->fail_next("remove", UnavailableError("injected"), 3);
  m.unlock();  // must not throw, must not leave the entry forever
  EXPECT_TRUE(Eventually([&] { return store->entry_count() == 0u; }));
  EXPECT_GE(store->op_count("remove"), 4u);
}

TEST(Faults, StoreErrorsSurfaceAsDlockError) {
  auto store = MemStore::create();
  auto a = Client::with_store(store);
  Mutex m(a, "err");
  store->fail_next("append", PermissionDeniedError("no ACL"));
  try {
    m.lock();
    FAIL() << "lock() succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPermissionDenied);
  }
  EXPECT_EQ(store->entry_count(), 0u);
}

TEST(Faults, EachReleaseWakesExactlyOneWaiter) {
  auto store = MemStore::create();
  constexpr int kWaiters = 8;
  auto holder = Client::with_store(store);
  Mutex mh(holder, "herd");
  mh.lock();
  std::vector<Client> clients;
  for (int i = 0; i < kWaiters; ++i) clients.push_back(Client::with_store(store));
  std::vector<std::jthread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] {
      Mutex m(clients[i], "herd");
      std::unique_lock lock(m);
    });
  }
  ASSERT_TRUE(Eventually([&] { return store->entry_count() == kWaiters + 1u; }));
  std::uint64_t wakes_before = store->op_count("wake");
  mh.unlock();
  threads.clear();
  // kWaiters handoffs; a herd would wake every waiter on every release.
  EXPECT_EQ(store->op_count("wake") - wakes_before, static_cast<std::uint64_t>(kWaiters));
}

TEST(Faults, ManualClockDrivesTimeouts) {
  ManualWorld w;
  auto& [clock, store, a, b] = w;
  Mutex ma(a, "clock");
  Mutex mb(b, "clock");
  ma.lock();
  std::atomic<int> result{-1};
  std::jthread waiter([&] { result = mb.try_lock_for(10s) ? 1 : 0; });
  ASSERT_TRUE(Eventually([&] { return store->entry_count() == 2u; }));
  clock->advance(5s);
  EXPECT_FALSE(Eventually([&] { return result.load() != -1; }, 100ms)) << "timed out before its deadline";
  clock->advance(6s);
  waiter.join();
  EXPECT_EQ(result, 0);
  EXPECT_TRUE(Eventually([&] { return store->entry_count() == 1u; }));
  ma.unlock();
}

TEST(Faults, SlowStoreCountsAgainstTheDeadline) {
  ManualWorld w;
  auto& [clock, store, a, b] = w;
  Mutex ma(a, "slow");
  Mutex mb(b, "slow");
  ma.lock();
  store->delay_next("append", 3s);
  std::atomic<int> result{-1};
  std::jthread waiter([&] { result = mb.try_lock_for(2s) ? 1 : 0; });
  ASSERT_TRUE(Eventually([&] { return store->op_count("delayed") == 1u; }));
  clock->advance(3s);  // the append completes after the deadline has passed
  waiter.join();
  EXPECT_EQ(result, 0);
  EXPECT_TRUE(Eventually([&] { return store->entry_count() == 1u; })) << "the late entry was not removed";
  ma.unlock();
}

TEST(Faults, StoreTooSlowToOpenASessionIsATimeoutNotAnError) {
  ManualWorld w;
  auto& [clock, store, a, b] = w;
  Mutex m(a, "slow-open");
  store->delay_next("open_session", 3s);
  std::atomic<int> result{-1};
  std::jthread waiter([&] {
    try {
      result = m.try_lock_for(1s) ? 1 : 0;
    } catch (const Error&) {
      result = 2;
    }
  });
  ASSERT_TRUE(Eventually([&] { return store->op_count("delayed") == 1u; }));
  clock->advance(3s);
  waiter.join();
  EXPECT_EQ(result, 0) << "1: locked, 2: threw instead of timing out";
  // A store that refuses at once is an error, whatever the timeout.
  store->fail_next("open_session", UnavailableError("connection refused"));
  EXPECT_THROW(b.session().value(), Error);
}

TEST(Faults, SemaphoreLeasesGoWithTheSession) {
  auto store = MemStore::create();
  auto a = Client::with_store(store);
  auto b = Client::with_store(store);
  Semaphore sa(a, "pool", 2);
  Semaphore sb(b, "pool", 2);
  auto lease = sa.acquire(2, 1s);
  ASSERT_TRUE(lease);
  std::atomic<bool> got{false};
  std::jthread waiter([&] {
    auto l = sb.acquire(1, 30s);
    got = l.has_value();
  });
  ASSERT_TRUE(Eventually([&] { return store->entry_count() == 4u; }));  // 2 leases + lock + 1 lease
  store->expire(SessionOf(a));
  waiter.join();
  EXPECT_TRUE(got);
  EXPECT_EQ(lease->state(), HoldState::kLost);
  EXPECT_TRUE(Eventually([&] { return store->entry_count() == 0u; }));
}

}  // namespace
}  // namespace dlock
