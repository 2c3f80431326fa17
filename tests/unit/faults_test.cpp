// What faults do to holders and waiters, where only MemStore's own hooks
// can make them: a hand-moved clock, slow replies, a store that throws, a
// listener held inside MemStore's delivery. The faults any store can be
// given (expiry, suspension, lost replies, failed requests) run on every
// store in tests/store/injected_faults_test.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "dlock/dlock.hpp"
#include "support/manual_world.hpp"
#include "support/stores.hpp"
#include "support/threads.hpp"

namespace dlock {
namespace {

using namespace std::chrono_literals;
using testing::Eventually;
using testing::ManualWorld;
using testing::SessionOf;

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

// A handoff to a waiter that waited for the one entry ahead of it takes no
// list after the wake-up: the store vouches that the waiter's own entry was
// still there when that entry went (Session::async_wait_turn).
TEST(Faults, AHandoffToTheNextInLineTakesNoSecondLook) {
  auto store = MemStore::create();
  auto holder = Client::with_store(store);
  auto waiter = Client::with_store(store);
  Mutex mh(holder, "turn"), mw(waiter, "turn");
  std::optional<Hold> held = mh.acquire(5s);
  ASSERT_TRUE(held);
  std::future<std::optional<Hold>> next = mw.acquire_future(60s);
  ASSERT_TRUE(Eventually([&] { return store->entry_count() == 2u; }));
  const std::uint64_t lists_before = store->op_count("list");
  held->release();
  ASSERT_EQ(next.wait_for(60s), std::future_status::ready);
  std::optional<Hold> granted = next.get();
  ASSERT_TRUE(granted);
  EXPECT_EQ(store->op_count("list") - lists_before, 0u) << "a list after the wake-up";
  EXPECT_GT(granted->fencing_token(), held->fencing_token());
}

// mem:// waits are records in the store, not threads; an injected fault or
// delay for "wait" applies to the asynchronous form too, on the calling thread.
TEST(Faults, MemAsyncWaitsTakeNoThreadAndHonourInjectedFaults) {
  ManualWorld w;
  auto& [clock, store, a, b] = w;
  std::shared_ptr<Session> holder = a.session().value();
  std::shared_ptr<Session> waiter = b.session().value();
  EntrySpec spec;
  spec.kind = "lock";
  spec.attempt_id = "a1";
  auto appended = holder->append("mem-async", spec, kNoDeadline);
  ASSERT_TRUE(appended.ok());
  std::vector<std::string> ids{appended->entry.id};
  constexpr int kWaits = 200;
  std::atomic<int> ok{0};
  std::atomic<int> unavailable{0};
  auto count = [&](Status s) {
    if (s.ok()) ++ok;
    if (s.code() == ErrorCode::kUnavailable) ++unavailable;
  };
  const int threads_before = testing::ThreadCount();
  const std::uint64_t wakes_before = store->op_count("wake");
  std::vector<std::shared_ptr<void>> handles;
  for (int i = 0; i < kWaits; ++i) handles.push_back(waiter->async_wait_any_gone("mem-async", ids, count));
  EXPECT_EQ(testing::ThreadCount(), threads_before);
  store->fail_next("wait", UnavailableError("injected"));
  auto failed = waiter->async_wait_any_gone("mem-async", ids, count);
  EXPECT_EQ(unavailable.load(), 1) << "the injected failure did not reach the asynchronous wait";
  // A delayed wait registers once the clock has moved past the delay.
  store->delay_next("wait", 2s);
  std::shared_ptr<void> delayed;
  std::jthread registering([&] { delayed = waiter->async_wait_any_gone("mem-async", ids, count); });
  ASSERT_TRUE(Eventually([&] { return store->op_count("delayed") == 1u; }));
  clock->advance(2s);
  registering.join();
  EXPECT_EQ(ok.load(), 0);
  ASSERT_TRUE(holder->remove("mem-async", ids[0], kNoDeadline).ok());
  EXPECT_EQ(ok.load(), kWaits + 1) << "every wait is completed by the remove, on its thread";
  EXPECT_EQ(store->op_count("wake") - wakes_before, static_cast<std::uint64_t>(kWaits + 1));
}

// The election primitives on mem (store.hpp, "Published values") under the
// store's fault hooks: a lost reply leaves a retry safe, a failure changes
// nothing, and an expired leader is told before a head watcher sees it go.
TEST(Faults, MemUpdatesAndHeadWatchesHonourInjectedFaults) {
  auto store = MemStore::create();
  std::shared_ptr<Session> leader = store->open_session(kNoDeadline).value();
  std::shared_ptr<Session> watcher = store->open_session(kNoDeadline).value();
  EntrySpec spec;
  spec.kind = std::string(entry_kind::kCandidate);
  spec.attempt_id = "c1";
  spec.value = "one";
  Entry e = leader->append("election", spec, kNoDeadline).value().entry;
  auto value_now = [&] {
    auto listed = watcher->list("election", {.with_owners = false, .with_values = true}, kNoDeadline);
    return listed.ok() && !listed->empty() ? listed->front().value.value_or("-") : std::string("?");
  };

  store->fail_next("update", UnavailableError("injected"));
  EXPECT_EQ(
      leader->update_entry("election", e.id, {.value = "two", .owner = std::nullopt}, kNoDeadline).status().code(),
      ErrorCode::kUnavailable);
  EXPECT_EQ(value_now(), "one") << "a failed update changes nothing";
  store->lose_next_reply("update");
  EXPECT_EQ(
      leader->update_entry("election", e.id, {.value = "two", .owner = std::nullopt}, kNoDeadline).status().code(),
      ErrorCode::kUnavailable);
  EXPECT_EQ(value_now(), "two") << "a lost reply: the update took effect";
  auto retried = leader->update_entry("election", e.id, {.value = "two", .owner = std::nullopt}, kNoDeadline);
  ASSERT_TRUE(retried.ok()) << retried.status().to_string();
  EXPECT_EQ(retried->value, std::optional<std::string>("two"));

  store->fail_next("watch_head", UnavailableError("injected"));
  std::vector<Status> refused;
  Head seen;
  auto h0 = watcher->async_watch_head("election", seen, [&](Status s) { refused.push_back(std::move(s)); });
  ASSERT_EQ(refused.size(), 1u) << "the injected failure came at once";
  EXPECT_EQ(refused[0].code(), ErrorCode::kUnavailable);

  // Expiry: the leader hears kLost before the head watcher sees its entry go.
  std::mutex mu;
  std::vector<std::string> order;
  auto subscription = leader->subscribe([&](SessionState s) {
    std::lock_guard<std::mutex> g(mu);
    order.push_back(std::string("leader ") + std::string(SessionStateName(s)));
  });
  watcher->async_read_head("election", {}, kNoDeadline, [&](Result<Head> h) { seen = h.value(); });
  ASSERT_TRUE(seen.entry.has_value());
  auto h1 = watcher->async_watch_head("election", seen, [&](Status s) {
    std::lock_guard<std::mutex> g(mu);
    order.push_back("head changed: " + s.to_string());
  });
  store->expire(leader->id());
  std::lock_guard<std::mutex> g(mu);
  EXPECT_EQ(order, (std::vector<std::string>{"leader lost", "head changed: OK"}));
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

// ---- Defects found in review (issue 11), each seen failing before its fix.

// Item 5: thread A locks a SemaphoreMutex, A's session expires, thread B
// locks the same object; A's unlock must not end B's hold.
TEST(Faults, SemaphoreMutexUnlockEndsOnlyTheHoldItBelongsTo) {
  auto store = MemStore::create();
  auto shared = Client::with_store(store);
  auto other = Client::with_store(store);
  SemaphoreMutex sm(shared, "review/semaphore-mutex");
  SemaphoreMutex rival(other, "review/semaphore-mutex");
  sm.lock();  // "thread A"
  store->expire(SessionOf(shared));
  std::atomic<bool> b_locked{false};
  std::jthread b([&] {
    sm.lock();  // "thread B": waits while the object is still locked by A
    b_locked = true;
  });
  // Like a std::mutex, the object stays locked until A unlocks it, lost or not.
  EXPECT_FALSE(Eventually([&] { return b_locked.load(); }, 300ms)) << "B locked an object A had not unlocked";
  sm.unlock();  // A ends its critical section: this ends A's (lost) hold only
  ASSERT_TRUE(Eventually([&] { return b_locked.load(); }));
  b.join();
  EXPECT_TRUE(sm.fencing_token().has_value()) << "B's hold was ended by A's unlock";
  EXPECT_FALSE(rival.try_lock()) << "another process got the lock while B holds it";
  sm.unlock();
  EXPECT_TRUE(rival.try_lock());
  rival.unlock();
}

// Item 7: a hold read while its session's listeners are still running must
// already say what the session says.
TEST(Faults, HoldStateFoldsInTheSessionStateWhenRead) {
  auto store = MemStore::create();
  auto a = Client::with_store(store);
  Mutex m1(a, "review/fold-1");
  Mutex m2(a, "review/fold-2");
  auto first = m1.acquire(1s);
  auto second = m2.acquire(1s);
  ASSERT_TRUE(first && second);
  std::atomic<bool> in_listener{false}, release_listener{false};
  auto sub = first->on_state_change([&](HoldState) {
    in_listener = true;
    // Holds the session's delivery (one listener at a time) while the test reads.
    for (int i = 0; i < 20000 && !release_listener; ++i) std::this_thread::sleep_for(1ms);
  });
  std::jthread expirer([&] { store->expire(SessionOf(a)); });
  ASSERT_TRUE(Eventually([&] { return in_listener.load(); }));
  HoldState seen = second->state();
  bool token_stopped = second->lost_token().stop_requested();
  release_listener = true;
  expirer.join();
  EXPECT_EQ(seen, HoldState::kLost) << "the hold lagged its session";
  EXPECT_TRUE(token_stopped) << "the lost token lagged its session";
}

// Item 10: the try-variants never wait behind another thread of the same
// process that is waiting for the same lock.
TEST(Faults, TryVariantsNeverWaitInTheLocalGate) {
  ManualWorld w;  // time stands still: a try that waits never comes back
  auto& [clock, store, a, b] = w;
  Mutex holder(b, "review/gate");
  ReadWriteLock holder_rw(b, "review/gate-rw");
  Semaphore holder_sem(b, "review/gate-sem", 1);
  holder.lock();
  holder_rw.writer().lock();
  auto lease = holder_sem.acquire(1, 1s);
  ASSERT_TRUE(lease);

  Mutex waiting(a, "review/gate");
  ReadWriteLock waiting_rw(a, "review/gate-rw");
  Semaphore waiting_sem(a, "review/gate-sem", 1);
  std::jthread w1([&] {
    waiting.lock();
    waiting.unlock();
  });
  std::jthread w2([&] {
    waiting_rw.writer().lock();
    waiting_rw.writer().unlock();
  });
  std::jthread w3([&] { waiting_sem.acquire(1); });
  ASSERT_TRUE(Eventually([&] { return store->entry_count() == 7u; }));  // 3 holds + 1 lock + 3 waiters

  std::atomic<int> done{0};
  std::jthread tries([&] {
    Mutex m(a, "review/gate");
    EXPECT_FALSE(m.try_lock());
    ++done;
    EXPECT_FALSE(waiting_rw.reader().try_lock_shared());
    ++done;
    EXPECT_FALSE(waiting_rw.writer().try_lock());
    ++done;
    EXPECT_FALSE(waiting_sem.try_acquire(1));
    ++done;
  });
  bool returned = Eventually([&] { return done.load() == 4; });
  EXPECT_TRUE(returned) << "a try-variant waited in the local gate (" << done.load() << " of 4 returned)";
  for (int i = 0; i < 8 && done.load() < 4; ++i) {  // let stuck tries time out, so the test can end
    clock->advance(20s);
    std::this_thread::sleep_for(50ms);
  }
  tries.join();
  holder.unlock();
  holder_rw.writer().unlock();
  lease.reset();
  w1.join();
  w2.join();
  w3.join();
}

// Item 14: a hold's listener may call into the library, closing the session
// included, without a deadlock.
TEST(Faults, HoldListenerMayCloseTheSession) {
  auto store = MemStore::create();
  auto a = Client::with_store(store);
  Mutex m(a, "review/reentrant");
  auto hold = m.acquire(1s);
  ASSERT_TRUE(hold);
  std::atomic<int> calls{0};
  auto sub = hold->on_state_change([&](HoldState s) {
    ++calls;
    if (s == HoldState::kUncertain) a.close_session();
  });
  std::atomic<bool> done{false};
  std::thread suspender([&] {
    store->suspend(SessionOf(a));
    done = true;
  });
  bool returned = Eventually([&] { return done.load(); });
  EXPECT_TRUE(returned) << "suspend() deadlocked in the listener's close";
  if (!returned) {
    suspender.detach();  // stuck for good; the process ends with the test run
    return;
  }
  suspender.join();
  EXPECT_EQ(hold->state(), HoldState::kLost);
  EXPECT_TRUE(Eventually([&] { return store->entry_count() == 0u; }));
}

}  // namespace
}  // namespace dlock
