// Asynchronous acquisition (dlock/async.hpp) on every store the run has: the
// three forms on every recipe, one outcome per acquire, the dlock thread,
// cancellation, order shared with blocking waiters, and threads that stay few
// whatever the number of pending acquires.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <coroutine>
#include <cstdlib>
#include <future>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "dlock/dlock.hpp"
#include "support/detached.hpp"
#include "support/stores.hpp"
#include "support/threads.hpp"

namespace dlock {
namespace {

using namespace std::chrono_literals;
using testing::Eventually;

// How long a test waits for what must come at once; reached only on a bug.
constexpr auto kPrompt = 60s;

std::string UniqueName(const std::string& base) {
  static std::atomic<int> counter{0};
  return "async/" + base + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

using testing::Detached;
using testing::ThreadCount;
using testing::ThreadNames;

// Collects the outcomes of asynchronous acquires; each must come once.
class Outcomes {
 public:
  explicit Outcomes(std::size_t expected) : count_(expected) {}
  AcquireCallback Callback(std::size_t i, bool keep = false) {
    return [this, i, keep](Result<std::optional<Hold>> r) {
      std::lock_guard<std::mutex> g(mu_);
      ++count_[i];
      order_.push_back(i);
      if (!r.ok()) {
        errors_.push_back(r.status().to_string());
      } else if (r.value()) {
        ++holds_;
        if (keep) kept_.push_back(std::move(*r.value()));
      }
      cv_.notify_all();
    };
  }
  bool AllCame() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kPrompt, [&] { return order_.size() >= count_.size(); });
  }
  std::vector<std::size_t> Order() {
    std::lock_guard<std::mutex> g(mu_);
    return order_;
  }
  // Every acquire had exactly one outcome.
  bool ExactlyOnceEach() {
    std::lock_guard<std::mutex> g(mu_);
    for (int c : count_) {
      if (c != 1) return false;
    }
    return true;
  }
  int Holds() {
    std::lock_guard<std::mutex> g(mu_);
    return holds_;
  }
  std::vector<std::string> Errors() {
    std::lock_guard<std::mutex> g(mu_);
    return errors_;
  }
  void ReleaseKept() {
    std::vector<Hold> kept;
    {
      std::lock_guard<std::mutex> g(mu_);
      kept.swap(kept_);
    }
    kept.clear();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> count_;
  std::vector<std::size_t> order_;
  std::vector<std::string> errors_;
  std::vector<Hold> kept_;
  int holds_ = 0;
};

class AsyncTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { fixture_ = testing::MakeFixture(GetParam()); }
  Client NewClient() { return fixture_.new_client(); }
  std::size_t Entries(const std::string& queue) { return fixture_.entries(queue); }
  testing::StoreFixture fixture_;
};

TEST_P(AsyncTest, TheAcceptanceProgramRunsOnThisStore) {
  const std::string url = GetParam() == "mem" ? "mem://" : GetParam();
  const std::string command = std::string(DLOCK_ASYNC_ACCEPTANCE) + " '" + url + "'";
  int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << command;
  EXPECT_EQ(WEXITSTATUS(status), 0) << command;
}

TEST_P(AsyncTest, TheCallbackRunsOnceOnADlockThreadAndNeverInline) {
  Client c = NewClient();
  Mutex m(c, UniqueName("thread"));
  std::atomic<int> calls{0};
  std::promise<std::thread::id> ran_on;
  m.async_acquire(5s, {}, [&](Result<std::optional<Hold>> r) {
    ++calls;
    EXPECT_TRUE(r.ok() && r.value().has_value());
    ran_on.set_value(std::this_thread::get_id());
  });
  auto f = ran_on.get_future();
  ASSERT_EQ(f.wait_for(kPrompt), std::future_status::ready);
  EXPECT_NE(f.get(), std::this_thread::get_id());
  // The hold went with the callback's argument: the lock is free again.
  EXPECT_TRUE(m.acquire(5s).has_value());
  EXPECT_EQ(calls.load(), 1);
}

TEST_P(AsyncTest, EveryRecipeOffersTheFutureAndTheCoroutineForms) {
  Client c = NewClient();
  const std::string name = UniqueName("forms");
  Mutex m(c, name);
  std::uint64_t last = 0;
  {
    auto f = m.acquire_future(5s);
    auto h = f.get();
    ASSERT_TRUE(h);
    last = h->fencing_token();
  }
  std::promise<std::uint64_t> token;
  [](Mutex& mutex, std::promise<std::uint64_t>& out) -> Detached {
    std::optional<Hold> h = co_await mutex.async_acquire(5s);
    out.set_value(h ? h->fencing_token() : 0);
  }(m, token);
  auto t = token.get_future();
  ASSERT_EQ(t.wait_for(kPrompt), std::future_status::ready);
  EXPECT_GT(t.get(), last) << "tokens only grow";

  Semaphore sem(c, name + "-sem", 3);
  auto lease = sem.acquire_future(3, 5s).get();
  ASSERT_TRUE(lease);
  EXPECT_EQ(lease->permits(), 3u);
  EXPECT_FALSE(sem.acquire_future(1, 0s).get()) << "all permits are out";
  lease->release();
  ReadWriteLock rw(c, name + "-rw");
  auto r1 = rw.reader().acquire_future(5s).get();
  auto r2 = rw.reader().acquire_future(5s).get();
  ASSERT_TRUE(r1 && r2) << "readers share";
  EXPECT_FALSE(rw.writer().acquire_future(0s).get()) << "a writer waits for readers";
  r1->release();
  r2->release();
  EXPECT_TRUE(rw.writer().acquire_future(5s).get());
  SemaphoreMutex sm(c, name + "-smutex");
  std::promise<bool> got;
  sm.async_acquire(5s, {}, [&](Result<std::optional<Hold>> r) { got.set_value(r.ok() && r.value()); });
  EXPECT_TRUE(got.get_future().get());
}

TEST_P(AsyncTest, AsyncAndBlockingWaitersOfOneProcessQueueTogetherInOrder) {
  Client a = NewClient();
  Client b = NewClient();
  const std::string name = UniqueName("order");
  Mutex ma(a, name);
  Mutex mb(b, name);
  ma.lock();
  // Round 1: a blocking waiter first (its entry is in the store), then three
  // asynchronous ones, which wait in the process's line behind it.
  std::promise<void> blocking_granted;
  std::thread blocking([&] {
    auto h = mb.acquire(kPrompt);
    EXPECT_TRUE(h);
    blocking_granted.set_value();
  });
  ASSERT_TRUE(Eventually([&] { return Entries(name) == 2u; }, kPrompt));
  Outcomes outcomes(3);
  for (std::size_t i = 0; i < 3; ++i) mb.async_acquire(kPrompt, {}, outcomes.Callback(i));
  EXPECT_EQ(Entries(name), 2u) << "one store entry per process and lock";
  ma.unlock();
  blocking.join();
  ASSERT_EQ(blocking_granted.get_future().wait_for(0s), std::future_status::ready);
  ASSERT_TRUE(outcomes.AllCame());
  EXPECT_EQ(outcomes.Order(), (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_EQ(outcomes.Holds(), 3);
  EXPECT_TRUE(outcomes.ExactlyOnceEach());
  // Round 2: an asynchronous waiter first, then a blocking one.
  ma.lock();
  Outcomes first(1);
  mb.async_acquire(kPrompt, {}, first.Callback(0, /*keep=*/true));
  ASSERT_TRUE(Eventually([&] { return Entries(name) == 2u; }, kPrompt));
  std::atomic<bool> second_granted{false};
  std::thread second([&] {
    auto h = mb.acquire(kPrompt);
    EXPECT_TRUE(h);
    second_granted = true;
  });
  ma.unlock();
  ASSERT_TRUE(first.AllCame());
  EXPECT_FALSE(second_granted.load()) << "the blocking waiter overtook the asynchronous one ahead of it";
  first.ReleaseKept();
  second.join();
  // Round 3: one thread makes an asynchronous acquire, then a blocking one.
  // The blocking one's steps run on that thread, the other's on dlock's
  // executor; their places in the line follow the calls all the same.
  ma.lock();
  Outcomes third(1);
  std::atomic<bool> fourth_granted{false};
  std::thread fourth([&] {
    mb.async_acquire(kPrompt, {}, third.Callback(0, /*keep=*/true));
    auto h = mb.acquire(kPrompt);
    EXPECT_TRUE(h);
    fourth_granted = true;
  });
  ASSERT_TRUE(Eventually([&] { return Entries(name) == 2u; }, kPrompt));
  ma.unlock();
  ASSERT_TRUE(third.AllCame());
  EXPECT_FALSE(fourth_granted.load()) << "the blocking acquire overtook the asynchronous one made before it";
  third.ReleaseKept();
  fourth.join();
  EXPECT_TRUE(Eventually([&] { return Entries(name) == 0u; }, kPrompt));
}

// Review of 23b0ae1: an acquire's place in the process's line is taken on
// the calling thread after begin() is posted. If the stop (or deadline)
// interrupt runs on the executor before that join, abandon() finds nothing,
// the interrupt is spent, and the acquire then waits in the line behind the
// local waiter inside for as long as that one waits: stop no longer cancels.
TEST_P(AsyncTest, ReviewAStopRequestedBeforeTheAcquireEndsItEvenBehindALocalWaiter) {
  Client a = NewClient();
  Client b = NewClient();
  const std::string name = UniqueName("stop-before-join");
  Mutex ma(a, name);
  Mutex mb(b, name);
  ma.lock();                                                       // another process holds it
  std::thread blocked([&] { EXPECT_TRUE(mb.acquire(kPrompt)); });  // inside b's line, waiting in the store
  ASSERT_TRUE(Eventually([&] { return Entries(name) == 2u; }, kPrompt));
  constexpr std::size_t kThreads = 6;
  constexpr std::size_t kEach = 2000;
  Outcomes outcomes(kThreads * kEach);
  std::vector<std::thread> callers;
  for (std::size_t t = 0; t < kThreads; ++t) {
    callers.emplace_back([&, t] {
      for (std::size_t i = 0; i < kEach; ++i) {
        std::stop_source stopped;
        stopped.request_stop();
        mb.async_acquire(kForever, stopped.get_token(), outcomes.Callback(t * kEach + i));
      }
    });
  }
  for (auto& th : callers) th.join();
  // With the defect they end only at ma.unlock(), which comes after this
  // wait: the bound is for a loaded machine, not for the promptness.
  const bool all_came = Eventually([&] { return outcomes.Order().size() == kThreads * kEach; }, 30s);
  const std::size_t came = outcomes.Order().size();
  ma.unlock();  // lets the blocked waiter in, and with it whatever waits behind it
  blocked.join();
  EXPECT_TRUE(all_came) << (kThreads * kEach - came) << " of " << kThreads * kEach
                        << " acquires with a stop requested before the call were still waiting after 30 s "
                           "(behind a local waiter that waits for good)";
  ASSERT_TRUE(outcomes.AllCame());
  EXPECT_EQ(outcomes.Holds(), 0);
  EXPECT_TRUE(Eventually([&] { return Entries(name) == 0u; }, kPrompt));
}

// The same with a deadline: an asynchronous acquire whose (1 ns) timeout
// passes while it waits in the process's line behind a local waiter must
// end at once, not when that waiter ends. (A timeout <= 0 is a try, which
// never joins the line.)
TEST_P(AsyncTest, ReviewATinyTimeoutAcquireBehindALocalWaiterEndsAtOnce) {
  Client a = NewClient();
  Client b = NewClient();
  const std::string name = UniqueName("zero-before-join");
  Mutex ma(a, name);
  Mutex mb(b, name);
  ma.lock();
  std::thread blocked([&] { EXPECT_TRUE(mb.acquire(kPrompt)); });
  ASSERT_TRUE(Eventually([&] { return Entries(name) == 2u; }, kPrompt));
  constexpr std::size_t kThreads = 6;
  constexpr std::size_t kEach = 2000;
  Outcomes outcomes(kThreads * kEach);
  std::vector<std::thread> callers;
  for (std::size_t t = 0; t < kThreads; ++t) {
    callers.emplace_back([&, t] {
      for (std::size_t i = 0; i < kEach; ++i) mb.async_acquire(1ns, {}, outcomes.Callback(t * kEach + i));
    });
  }
  for (auto& th : callers) th.join();
  // With the defect they end only at ma.unlock(), which comes after this
  // wait: the bound is for a loaded machine, not for the promptness.
  const bool all_came = Eventually([&] { return outcomes.Order().size() == kThreads * kEach; }, 30s);
  const std::size_t came = outcomes.Order().size();
  ma.unlock();
  blocked.join();
  EXPECT_TRUE(all_came) << (kThreads * kEach - came) << " of " << kThreads * kEach
                        << " acquires with a 1 ns timeout were still waiting after 30 s behind a local waiter";
  ASSERT_TRUE(outcomes.AllCame());
  EXPECT_TRUE(Eventually([&] { return Entries(name) == 0u; }, kPrompt));
}

// Blocking and asynchronous acquires of a Mutex and a Semaphore from two
// clients and several threads at once, each with a 0-4 ms timeout or a stop
// requested from another thread at a random moment: the blocking calls run
// their steps on their own threads, the asynchronous ones on the executor,
// and the process's line is shared by both. Every asynchronous acquire has
// exactly one outcome, no two holders of the Mutex overlap, the Semaphore
// never has more holders than permits, and nothing is left in the store.
// (From the review of the caller steps, where it ran under TSan.)
TEST_P(AsyncTest, MixedBlockingAndAsyncAcquiresWithStopsAndTinyTimeoutsStaySafeAndLeaveNothing) {
  Client clients[2] = {NewClient(), NewClient()};
  const std::string mutex_name = UniqueName("mixed-mutex");
  const std::string semaphore_name = UniqueName("mixed-semaphore");
  Mutex mutexes[2] = {Mutex(clients[0], mutex_name), Mutex(clients[1], mutex_name)};
  Semaphore semaphores[2] = {Semaphore(clients[0], semaphore_name, 2), Semaphore(clients[1], semaphore_name, 2)};
  const bool local = GetParam() == "mem" || GetParam().starts_with("file:");
  constexpr std::size_t kThreads = 4;
  const std::size_t each = local ? 400 : 200;  // bounded work: a few ms per acquire at most

  // Shared with the asynchronous callbacks, which may outlive a failed test.
  struct Tally {
    explicit Tally(std::size_t n) : outcomes(n) {}
    Outcomes outcomes;
    std::atomic<int> in_mutex{0};
    std::atomic<int> in_semaphore{0};
    std::atomic<int> overlaps{0};
    std::atomic<int> over_permits{0};
    std::atomic<int> granted{0};
    // Entered and left around each hold, on whatever thread has it; the
    // holder stays a moment so that a second holder would be seen.
    void use_mutex() {
      granted.fetch_add(1);
      if (in_mutex.fetch_add(1) != 0) overlaps.fetch_add(1);
      std::this_thread::sleep_for(50us);
      in_mutex.fetch_sub(1);
    }
    void use_semaphore() {
      granted.fetch_add(1);
      if (in_semaphore.fetch_add(1) >= 2) over_permits.fetch_add(1);
      std::this_thread::sleep_for(50us);
      in_semaphore.fetch_sub(1);
    }
  };
  auto tally = std::make_shared<Tally>(kThreads * each);

  // One stop source per thread at a time, requested by the stopper thread.
  std::mutex stops_mu;
  std::vector<std::shared_ptr<std::stop_source>> stops(kThreads);
  std::atomic<bool> working{true};
  std::thread stopper([&] {
    std::mt19937 rng(7);
    while (working.load()) {
      {
        std::lock_guard<std::mutex> g(stops_mu);
        if (auto& s = stops[rng() % kThreads]) s->request_stop();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500));
    }
  });

  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < kThreads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) + 1);
      for (std::size_t i = 0; i < each; ++i) {
        const std::size_t side = rng() % 2;
        const auto timeout = std::chrono::microseconds(rng() % 4000);
        auto stop = std::make_shared<std::stop_source>();
        if (rng() % 2 == 0) {
          std::lock_guard<std::mutex> g(stops_mu);
          stops[t] = stop;
        }
        AcquireCallback done = tally->outcomes.Callback(t * each + i);
        const unsigned form = rng() % 4;
        if (form < 2) {
          // Blocking: its outcome is counted here; a store error (thrown)
          // is counted as one, not left to end the test binary.
          try {
            if (form == 0) {
              if (auto hold = mutexes[side].acquire(timeout, stop->get_token())) tally->use_mutex();
            } else {
              if (auto lease = semaphores[side].acquire(1, timeout, stop->get_token())) tally->use_semaphore();
            }
            done(std::optional<Hold>());
          } catch (const Error& e) {
            done(e.status());
          }
          continue;
        }
        auto use = [tally, form, done = std::move(done)](Result<std::optional<Hold>> r) {
          if (r.ok() && r.value()) form == 2 ? tally->use_mutex() : tally->use_semaphore();
          done(std::move(r));
        };
        if (form == 2) {
          mutexes[side].async_acquire(timeout, stop->get_token(), std::move(use));
        } else {
          semaphores[side].async_acquire(1, timeout, stop->get_token(), std::move(use));
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  const bool all_came = tally->outcomes.AllCame();
  working.store(false);
  stopper.join();
  ASSERT_TRUE(all_came) << "an asynchronous acquire never had its outcome";
  EXPECT_TRUE(tally->outcomes.ExactlyOnceEach());
  const std::vector<std::string> errors = tally->outcomes.Errors();
  EXPECT_TRUE(errors.empty()) << errors.size() << " errors, the first: " << errors.front();
  EXPECT_GT(tally->granted.load(), 0) << "nothing was granted: the test tested nothing";
  EXPECT_EQ(tally->overlaps.load(), 0) << "two holders of the Mutex at once";
  EXPECT_EQ(tally->over_permits.load(), 0) << "more holders of the Semaphore than permits";
  EXPECT_TRUE(Eventually([&] { return Entries(mutex_name) == 0u && Entries(semaphore_name) == 0u; }, kPrompt))
      << Entries(mutex_name) << " Mutex and " << Entries(semaphore_name) << " Semaphore entries left";
}

TEST_P(AsyncTest, ATimeoutOrAStopEndsTheAcquireAndLeavesNothingInTheStore) {
  Client a = NewClient();
  Client b = NewClient();
  const std::string name = UniqueName("cancel");
  Mutex ma(a, name);
  Mutex mb(b, name);
  ma.lock();
  // A stop request.
  std::stop_source stop;
  Outcomes stopped(1);
  mb.async_acquire(kForever, stop.get_token(), stopped.Callback(0));
  ASSERT_TRUE(Eventually([&] { return Entries(name) == 2u; }, kPrompt));
  stop.request_stop();
  ASSERT_TRUE(stopped.AllCame());
  EXPECT_EQ(stopped.Holds(), 0);
  EXPECT_TRUE(stopped.Errors().empty());
  EXPECT_EQ(Entries(name), 1u) << "the cancelled acquire's entry is still there after its outcome";
  // A timeout, and a zero timeout (one try).
  Outcomes timed(2);
  mb.async_acquire(200ms, {}, timed.Callback(0));
  mb.async_acquire(0s, {}, timed.Callback(1));
  ASSERT_TRUE(timed.AllCame());
  EXPECT_EQ(timed.Holds(), 0);
  EXPECT_TRUE(timed.Errors().empty());
  EXPECT_TRUE(timed.ExactlyOnceEach());
  EXPECT_EQ(Entries(name), 1u);
  // A stop requested before the call.
  std::stop_source early;
  early.request_stop();
  EXPECT_FALSE(mb.acquire_future(kForever, early.get_token()).get());
  ma.unlock();
}

// Cancellation racing with the grant: every acquire ends with exactly one
// outcome, the hold or nothing, and no entry is left behind.
TEST_P(AsyncTest, CancellationRacingWithTheGrantGivesOneOutcomeAndNoOrphan) {
  const int rounds = GetParam() == "mem" ? 200 : 40;
  constexpr int kWaiters = 8;
  Client a = NewClient();
  Client b = NewClient();
  const std::string name = UniqueName("race");
  Mutex ma(a, name);
  Mutex mb(b, name);
  std::mt19937 rng(12345);
  int holds = 0;
  for (int round = 0; round < rounds; ++round) {
    ma.lock();
    Outcomes outcomes(kWaiters);
    std::vector<std::stop_source> stops(kWaiters);
    for (int i = 0; i < kWaiters; ++i) mb.async_acquire(kPrompt, stops[i].get_token(), outcomes.Callback(i));
    std::vector<int> victims;
    for (int i = 0; i < kWaiters; ++i) {
      if (rng() % 2) victims.push_back(i);
    }
    ma.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    for (int i : victims) stops[i].request_stop();
    ASSERT_TRUE(outcomes.AllCame()) << "round " << round;
    ASSERT_TRUE(outcomes.ExactlyOnceEach()) << "round " << round;
    ASSERT_TRUE(outcomes.Errors().empty()) << outcomes.Errors().front();
    EXPECT_GE(outcomes.Holds(), kWaiters - static_cast<int>(victims.size()));
    holds += outcomes.Holds();
  }
  EXPECT_GT(holds, 0);
  EXPECT_TRUE(Eventually([&] { return Entries(name) == 0u; }, kPrompt)) << Entries(name) << " entries left";
}

// A hold watches its own entry: removed by another client (the operator's
// `dlock break`), the holder is told kLost at once, not at its session's end.
TEST_P(AsyncTest, AHoldWhoseEntryIsRemovedByAnotherClientIsToldLost) {
  Client a = NewClient();
  Client b = NewClient();
  const std::string name = UniqueName("broken");
  Semaphore sem(a, name + "-sem", 2);
  for (bool lease : {false, true}) {
    std::optional<Hold> hold = lease ? sem.acquire(2, 5s) : Mutex(a, name).acquire(5s);
    ASSERT_TRUE(hold);
    std::atomic<int> told_lost{0};
    auto sub = hold->on_state_change([&](HoldState s) { told_lost += s == HoldState::kLost; });
    const std::string queue = lease ? name + "-sem/leases" : name;
    auto listed = b.list_entries(queue, false);
    ASSERT_TRUE(listed.ok());
    ASSERT_EQ(listed->size(), lease ? 2u : 1u);
    ASSERT_TRUE(b.remove_entry(queue, listed->front().id).ok());
    EXPECT_TRUE(Eventually([&] { return told_lost.load() == 1; }, kPrompt)) << (lease ? "lease" : "mutex");
    EXPECT_EQ(hold->state(), HoldState::kLost);
    EXPECT_TRUE(hold->lost_token().stop_requested());
    hold->release();
    EXPECT_EQ(told_lost.load(), 1) << "told once";
  }
  EXPECT_TRUE(Mutex(b, name).acquire(5s)) << "the lock is free for others";
  EXPECT_TRUE(Eventually([&] { return Entries(name) == 0u && Entries(name + "-sem/leases") == 0u; }, kPrompt));
}

// The same after the lock was taken and released a few times by the same
// client (on etcd, each hold's watch of its own entry adopts the watch the
// last hold left behind: the entry has the same key; the deletions of the
// earlier entries must not count, the removal of this one must).
TEST_P(AsyncTest, AHoldTakenAfterQuickCyclesIsToldLostWhenItsEntryIsRemoved) {
  Client a = NewClient();
  Client b = NewClient();
  const std::string name = UniqueName("broken-after-cycles");
  Mutex m(a, name);
  constexpr int kCycles = 4;
  for (int i = 0; i <= kCycles; ++i) {
    std::optional<Hold> hold = m.acquire(5s);
    ASSERT_TRUE(hold);
    std::atomic<int> told_lost{0};
    auto sub = hold->on_state_change([&](HoldState s) { told_lost += s == HoldState::kLost; });
    if (i < kCycles) {
      std::this_thread::sleep_for(20ms);  // an earlier entry's deletion, if counted, ends it now
      EXPECT_EQ(hold->state(), HoldState::kHeld) << "cycle " << i;
      hold->release();
      EXPECT_EQ(told_lost.load(), 0) << "cycle " << i;
      continue;
    }
    auto listed = b.list_entries(name, false);
    ASSERT_TRUE(listed.ok());
    ASSERT_EQ(listed->size(), 1u);
    ASSERT_TRUE(b.remove_entry(name, listed->front().id).ok());
    EXPECT_TRUE(Eventually([&] { return told_lost.load() == 1; }, kPrompt));
    EXPECT_EQ(hold->state(), HoldState::kLost);
  }
  EXPECT_TRUE(Eventually([&] { return Entries(name) == 0u; }, kPrompt));
}

// The handoff without a second look (Session::async_wait_turn): a waiter
// whose own entry was removed while it waited (the operator's `dlock
// break`) must not be granted when the entry ahead of it goes; the waiter
// that moved up into its place is, and the removed one queues again.
TEST_P(AsyncTest, AWaiterWhoseEntryWasRemovedIsNotGrantedWhenTheEntryAheadGoes) {
  Client a = NewClient();
  Client b = NewClient();
  Client c = NewClient();
  Client op = NewClient();
  const std::string name = UniqueName("removed-waiter");
  Mutex ma(a, name), mb(b, name), mc(c, name);
  std::optional<Hold> first = ma.acquire(5s);
  ASSERT_TRUE(first);
  std::future<std::optional<Hold>> fb = mb.acquire_future(kPrompt);
  ASSERT_TRUE(Eventually([&] { return Entries(name) == 2u; }, kPrompt));
  std::future<std::optional<Hold>> fc = mc.acquire_future(kPrompt);
  ASSERT_TRUE(Eventually([&] { return Entries(name) == 3u; }, kPrompt));
  auto listed = op.list_entries(name, false);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 3u);
  ASSERT_TRUE(op.remove_entry(name, (*listed)[1].id).ok());  // b's
  EXPECT_EQ(fb.wait_for(300ms), std::future_status::timeout) << "b granted while a holds";
  EXPECT_EQ(fc.wait_for(0ms), std::future_status::timeout) << "c granted while a holds (the entry it waited for went)";
  first->release();
  ASSERT_EQ(fc.wait_for(kPrompt), std::future_status::ready);
  std::optional<Hold> hc = fc.get();
  ASSERT_TRUE(hc) << "c moved up into b's place";
  EXPECT_EQ(fb.wait_for(500ms), std::future_status::timeout) << "b granted on its removed entry while c holds";
  hc->release();
  ASSERT_EQ(fb.wait_for(kPrompt), std::future_status::ready);
  std::optional<Hold> hb = fb.get();
  EXPECT_TRUE(hb) << "b queued again and was granted after c";
  if (hb) hb->release();
  EXPECT_TRUE(Eventually([&] { return Entries(name) == 0u; }, kPrompt)) << Entries(name) << " entries left";
}

// A hold granted when the one entry ahead went (no list after the wake-up)
// still watches its own entry: removed, it is told kLost.
TEST_P(AsyncTest, AHoldGrantedWhenTheEntryAheadWentIsToldLostWhenItsEntryIsRemoved) {
  Client a = NewClient();
  Client b = NewClient();
  Client op = NewClient();
  const std::string name = UniqueName("turn-lost");
  Mutex ma(a, name), mb(b, name);
  std::optional<Hold> first = ma.acquire(5s);
  ASSERT_TRUE(first);
  std::future<std::optional<Hold>> fb = mb.acquire_future(kPrompt);
  ASSERT_TRUE(Eventually([&] { return Entries(name) == 2u; }, kPrompt));
  first->release();
  ASSERT_EQ(fb.wait_for(kPrompt), std::future_status::ready);
  std::optional<Hold> hb = fb.get();
  ASSERT_TRUE(hb);
  EXPECT_EQ(hb->state(), HoldState::kHeld);
  std::atomic<int> told_lost{0};
  auto sub = hb->on_state_change([&](HoldState s) { told_lost += s == HoldState::kLost; });
  auto listed = op.list_entries(name, false);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  ASSERT_TRUE(op.remove_entry(name, listed->front().id).ok());
  EXPECT_TRUE(Eventually([&] { return told_lost.load() == 1; }, kPrompt));
  EXPECT_EQ(hb->state(), HoldState::kLost);
}

// A downgrade puts a read entry in the place of the write entry it replaces,
// ahead of the writer waiting behind it: when the write entry goes, that
// writer must still wait (the one case where an entry joins ahead).
TEST_P(AsyncTest, AWriterBehindADowngradeWaitsForTheReadHoldThatTookItsPlace) {
  Client a = NewClient();
  Client b = NewClient();
  const std::string name = UniqueName("downgrade");
  ReadWriteLock ra(a, name), rb(b, name);
  ra.writer().lock();
  std::future<std::optional<Hold>> fw = rb.writer().acquire_future(kPrompt);
  ASSERT_TRUE(Eventually([&] { return Entries(name) == 2u; }, kPrompt));
  ra.reader().lock_shared();  // downgrade: the read entry takes the write entry's place
  ASSERT_TRUE(Eventually([&] { return Entries(name) == 3u; }, kPrompt));
  ra.writer().unlock();
  EXPECT_EQ(fw.wait_for(500ms), std::future_status::timeout) << "a writer granted while a reader holds";
  ra.reader().unlock_shared();
  ASSERT_EQ(fw.wait_for(kPrompt), std::future_status::ready);
  std::optional<Hold> hw = fw.get();
  EXPECT_TRUE(hw);
  if (hw) hw->release();
  EXPECT_TRUE(Eventually([&] { return Entries(name) == 0u; }, kPrompt)) << Entries(name) << " entries left";
}

TEST_P(AsyncTest, ABlockingCallOnTheDlockThreadIsRefused) {
  Client c = NewClient();
  const std::string name = UniqueName("refused");
  Mutex m(c, name);
  Mutex other(c, name + "-other");
  std::promise<ErrorCode> code;
  m.async_acquire(5s, {}, [&](Result<std::optional<Hold>> r) {
    EXPECT_TRUE(r.ok());
    try {
      other.try_lock();
      code.set_value(ErrorCode::kOk);
    } catch (const Error& e) {
      code.set_value(e.code());
    }
  });
  EXPECT_EQ(code.get_future().get(), ErrorCode::kFailedPrecondition);
}

TEST_P(AsyncTest, APendingAcquireOutlivesItsLockObject) {
  Client a = NewClient();
  Client b = NewClient();
  const std::string name = UniqueName("outlives");
  Mutex ma(a, name);
  ma.lock();
  std::future<std::optional<Hold>> f;
  {
    Mutex mb(b, name);
    f = mb.acquire_future(kPrompt);
    ASSERT_TRUE(Eventually([&] { return Entries(name) == 2u; }, kPrompt));
  }
  ma.unlock();
  EXPECT_TRUE(f.get());
}

// Review finding: the Semaphore's awaitable kept a pointer to its Semaphore,
// which may be gone by the co_await.
TEST_P(AsyncTest, AnAwaitableMayOutliveItsLockObject) {
  Client c = NewClient();
  const std::string name = UniqueName("awaitable");
  auto sem = std::make_unique<Semaphore>(c, name, 2);
  AcquireAwaitable awaitable = sem->async_acquire(2, 5s);
  sem.reset();
  std::promise<std::uint32_t> permits;
  [](AcquireAwaitable a, std::promise<std::uint32_t>& out) -> Detached {
    std::optional<Hold> h = co_await a;
    out.set_value(h ? h->permits() : 0);
  }(std::move(awaitable), permits);
  auto f = permits.get_future();
  ASSERT_EQ(f.wait_for(kPrompt), std::future_status::ready);
  EXPECT_EQ(f.get(), 2u);
}

TEST_P(AsyncTest, SemaphoreWaitersAreServedInOrderWithTheirCounts) {
  Client a = NewClient();
  Client b = NewClient();
  const std::string name = UniqueName("sem");
  Semaphore sa(a, name, 3);
  Semaphore sb(b, name, 3);
  auto all = sa.acquire(3, 5s);
  ASSERT_TRUE(all);
  Outcomes outcomes(2);
  sb.async_acquire(2, kPrompt, {}, outcomes.Callback(0, true));
  sb.async_acquire(1, kPrompt, {}, outcomes.Callback(1, true));
  all->release();
  ASSERT_TRUE(outcomes.AllCame());
  EXPECT_EQ(outcomes.Order(), (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(outcomes.Holds(), 2);
  EXPECT_FALSE(sa.try_acquire(1)) << "2 + 1 of 3 permits are out";
  outcomes.ReleaseKept();
  EXPECT_TRUE(sa.acquire(3, 5s));
}

// Many pending acquires cost no thread each: at most 4 dlock threads per
// client whatever their number; then all are cancelled at once, and nothing
// of them is left in the store.
TEST_P(AsyncTest, ManyPendingAcquiresUseAFewThreadsAndCancelCleanly) {
  const int locks = GetParam() == "mem" ? 300 : 100;
  constexpr int kOnOne = 300;
  Client a = NewClient();
  Client b = NewClient();
  const std::string base = UniqueName("many");
  std::vector<Hold> held;
  for (int i = 0; i < locks; ++i) {
    auto h = Mutex(a, base + "/" + std::to_string(i)).acquire(5s);
    ASSERT_TRUE(h);
    held.push_back(std::move(*h));
  }
  {
    auto h = Mutex(b, base + "/warm-up").acquire(5s);  // b's session and dlock thread exist
    ASSERT_TRUE(h);
  }
  const int threads_before = ThreadCount();
  std::stop_source stop;
  Outcomes outcomes(static_cast<std::size_t>(locks + kOnOne));
  for (int i = 0; i < locks; ++i) {
    Mutex(b, base + "/" + std::to_string(i)).async_acquire(kForever, stop.get_token(), outcomes.Callback(i));
  }
  for (int i = 0; i < kOnOne; ++i) {
    Mutex(b, base + "/0").async_acquire(kForever, stop.get_token(), outcomes.Callback(locks + i));
  }
  ASSERT_TRUE(Eventually([&] { return Entries(base + "/" + std::to_string(locks - 1)) == 2u; }, kPrompt));
  const int threads_pending = ThreadCount();
  EXPECT_LE(threads_pending - threads_before, 2) << "threads grew from " << threads_before << " to " << threads_pending
                                                 << " for " << locks + kOnOne << " pending acquires";
  stop.request_stop();
  ASSERT_TRUE(outcomes.AllCame());
  EXPECT_TRUE(outcomes.ExactlyOnceEach());
  EXPECT_EQ(outcomes.Holds(), 0);
  EXPECT_TRUE(outcomes.Errors().empty());
  for (int i = 0; i < locks; ++i) EXPECT_EQ(Entries(base + "/" + std::to_string(i)), 1u) << i;
}

// CI finding: a thread joined itself ("Resource deadlock avoided") when the
// last reference to a client went on one of its store's threads; and review
// finding: a dlock thread could outlive every handle of its client. Lets go
// of clients in every way, many times: on the test's thread right after a
// hold, while a session is still being opened, inside the callback on the
// dlock thread, and with the hold as the last handle. Nothing may crash or
// hang, and every thread of those clients must end.
TEST_P(AsyncTest, TheLastHandleOfAClientMayGoOnAnyThread) {
  const std::string name = UniqueName("last-handle");
  Client holder = NewClient();
  std::optional<Hold> contended = Mutex(holder, name + "/held").acquire(5s);
  ASSERT_TRUE(contended);
  const int baseline = ThreadCount();
  const std::string before = ThreadNames();
  constexpr int kRounds = 24;
  for (int round = 0; round < kRounds; ++round) {
    const std::string lock = name + "/" + std::to_string(round % 3);
    std::optional<Client> c(NewClient());
    std::optional<Mutex> m;
    switch (round % 4) {
      case 0: {  // the last handle goes on this thread, right after a hold
        m.emplace(*c, lock);
        ASSERT_TRUE(m->acquire(5s));
        break;
      }
      case 1: {  // an acquire stopped while its session may still be opening
        m.emplace(*c, name + "/held");
        std::stop_source stop;
        std::thread stopper([&] { stop.request_stop(); });
        EXPECT_FALSE(m->acquire(10s, stop.get_token()));
        stopper.join();
        break;
      }
      case 2: {  // the callback holds the last handles, on the dlock thread
        m.emplace(*c, lock);
        std::promise<bool> came;
        m->async_acquire(5s, {}, [client = *c, &came](Result<std::optional<Hold>> r) mutable {
          const bool held = r.ok() && r.value().has_value();
          { auto gone = std::move(r); }  // the hold goes here
          { Client gone = std::move(client); }
          came.set_value(held);
        });
        m.reset();
        c.reset();
        auto f = came.get_future();
        ASSERT_EQ(f.wait_for(kPrompt), std::future_status::ready) << "round " << round;
        EXPECT_TRUE(f.get()) << "round " << round;
        break;
      }
      case 3: {  // the hold, handed over by a future, is the last handle
        m.emplace(*c, lock);
        std::future<std::optional<Hold>> f = m->acquire_future(5s);
        m.reset();
        c.reset();
        ASSERT_EQ(f.wait_for(kPrompt), std::future_status::ready) << "round " << round;
        EXPECT_TRUE(f.get()) << "round " << round;
        break;
      }
    }
    m.reset();
    c.reset();
    EXPECT_TRUE(Eventually([&] { return ThreadCount() <= baseline; }, kPrompt))
        << "round " << round << ": " << ThreadCount() << " threads (" << ThreadNames() << "), " << baseline
        << " before (" << before << ")";
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Entries(name + "/" + std::to_string(i)), 0u) << i;
  EXPECT_EQ(Entries(name + "/held"), 1u);
}

INSTANTIATE_TEST_SUITE_P(Stores, AsyncTest, ::testing::ValuesIn(testing::StoreSpecs()),
                         [](const auto& p) { return testing::SpecName(p.param, p.index); });

}  // namespace
}  // namespace dlock
