// The recipes on every store the run has: mem always, the others when the
// test scripts pass their URLs in DLOCK_TEST_URLS. Each test asserts on what
// a broken lock would get wrong: overlaps, order, tokens, leftover entries.
//
// Every test runs twice per store: through the blocking API it was written
// with, and through the asynchronous one (issue 14: one engine under both
// APIs, and the recipe suite over both), where each acquire takes the next
// of the three asynchronous forms in turn: the callback, the future, the
// coroutine. What only the blocking API has (reentrancy, downgrading a
// Lockable) stays blocking in both runs.
#include <gtest/gtest.h>

#include <atomic>
#include <coroutine>
#include <exception>
#include <future>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "dlock/dlock.hpp"
#include "support/detached.hpp"
#include "support/stores.hpp"

namespace dlock {
namespace {

using namespace std::chrono_literals;
using testing::Eventually;
using testing::StoreFixture;

std::string UniqueName(const std::string& base) {
  static std::atomic<int> counter{0};
  return "test/" + base + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

enum class Api { kBlocking, kAsync };
void PrintTo(Api api, std::ostream* os) { *os << (api == Api::kAsync ? "async" : "blocking"); }

using testing::Detached;

Detached AwaitInto(AcquireAwaitable acquire, std::shared_ptr<std::promise<std::optional<Hold>>> out) {
  try {
    out->set_value(co_await acquire);
  } catch (...) {
    out->set_exception(std::current_exception());
  }
}

// Fails (rather than hangs) when an acquire delivers no outcome; the bound
// is far beyond any timeout the suite uses.
template <class Future>
void ExpectOutcome(Future& outcome) {
  if (outcome.wait_for(std::chrono::minutes(5)) != std::future_status::ready) {
    throw std::runtime_error("an asynchronous acquire delivered no outcome in 5 minutes");
  }
}

// Waits for one asynchronous acquire made in form `form % 3`. The promises
// are shared: the dlock thread may still be inside set_value() when the
// waiting thread wakes and returns.
template <class CallbackForm, class FutureForm, class AwaitForm>
std::optional<Hold> AwaitOutcome(unsigned form, const CallbackForm& callback, const FutureForm& future,
                                 const AwaitForm& awaitable) {
  switch (form % 3) {
    case 0: {
      auto done = std::make_shared<std::promise<Result<std::optional<Hold>>>>();
      auto outcome = done->get_future();
      callback([done](Result<std::optional<Hold>> r) { done->set_value(std::move(r)); });
      ExpectOutcome(outcome);
      Result<std::optional<Hold>> r = outcome.get();
      if (!r.ok()) throw Error(r.status());
      return std::move(r).value();
    }
    case 1: {
      auto outcome = future();
      ExpectOutcome(outcome);
      return outcome.get();
    }
    default: {
      auto done = std::make_shared<std::promise<std::optional<Hold>>>();
      auto outcome = done->get_future();
      AwaitInto(awaitable(), done);
      ExpectOutcome(outcome);
      return outcome.get();
    }
  }
}

// One granted acquire, given back at the end of its scope or by release():
// the Lockable's unlock for the blocking API, a Hold for the asynchronous one.
class Turn {
 public:
  Turn(std::function<void()> unlock, std::function<std::optional<std::uint64_t>()> token)
      : unlock_(std::move(unlock)), token_(std::move(token)) {}
  explicit Turn(Hold hold) : hold_(std::move(hold)) {}
  Turn(Turn&& other) noexcept
      : unlock_(std::exchange(other.unlock_, nullptr)),
        token_(std::move(other.token_)),
        hold_(std::exchange(other.hold_, std::nullopt)) {}
  Turn& operator=(Turn&&) = delete;
  ~Turn() { release(); }
  void release() {
    if (auto unlock = std::exchange(unlock_, nullptr)) unlock();
    if (hold_) hold_->release();
  }
  std::uint64_t token() const { return hold_ ? hold_->fencing_token() : token_().value(); }

 private:
  std::function<void()> unlock_;
  std::function<std::optional<std::uint64_t>()> token_;
  std::optional<Hold> hold_;
};

// How the blocking API names taking and giving back one kind of lock.
template <class L>
struct Lockable {  // Mutex, SemaphoreMutex, ReadWriteLock::Writer
  static void lock(L& l) { l.lock(); }
  static bool try_once(L& l) { return l.try_lock(); }
  static bool lock_for(L& l, Clock::duration t, std::stop_token stop) { return l.lock_for(t, std::move(stop)); }
  static void unlock(L& l) { l.unlock(); }
};
template <>
struct Lockable<ReadWriteLock::Reader> {
  using L = ReadWriteLock::Reader;
  static void lock(L& l) { l.lock_shared(); }
  static bool try_once(L& l) { return l.try_lock_shared(); }
  static bool lock_for(L& l, Clock::duration t, std::stop_token stop) { return l.lock_shared_for(t, std::move(stop)); }
  static void unlock(L& l) { l.unlock_shared(); }
};

class RecipeTest : public ::testing::TestWithParam<std::tuple<std::string, Api>> {
 protected:
  void SetUp() override {
    fixture_ = testing::MakeFixture(std::get<0>(GetParam()));
    // Each test starts at another form, so that tests with one asynchronous
    // acquire (cancellation, a broken entry) do not all use the callback.
    form_ = static_cast<unsigned>(
        std::hash<std::string>{}(::testing::UnitTest::GetInstance()->current_test_info()->name()));
  }
  Client NewClient() { return fixture_.new_client(); }
  bool async() const { return std::get<1>(GetParam()) == Api::kAsync; }

 public:
  // --- Taking locks through the API under test.

  // An acquire of a Hold: acquire() or an asynchronous form.
  template <class L>
  std::optional<Hold> AcquireHold(L& l, Clock::duration timeout, std::stop_token stop = {}) {
    if (!async()) return l.acquire(timeout, std::move(stop));
    return AwaitOutcome(
        form_++, [&](AcquireCallback done) { l.async_acquire(timeout, stop, std::move(done)); },
        [&] { return l.acquire_future(timeout, stop); }, [&] { return l.async_acquire(timeout, stop); });
  }
  std::optional<Lease> AcquireLease(Semaphore& s, std::uint32_t count, Clock::duration timeout) {
    if (!async()) return s.acquire(count, timeout);
    return AwaitOutcome(
        form_++, [&](AcquireCallback done) { s.async_acquire(count, timeout, {}, std::move(done)); },
        [&] { return s.acquire_future(count, timeout); }, [&] { return s.async_acquire(count, timeout); });
  }
  // lock() (lock_shared()), or an asynchronous acquire without a timeout.
  template <class L>
  Turn Lock(L& l) {
    if (!async()) {
      Lockable<L>::lock(l);
      return BlockingTurn(l);
    }
    std::optional<Hold> hold = AcquireHold(l, kForever);
    if (!hold) throw std::runtime_error("an acquire without a timeout returned nothing");
    return Turn(std::move(*hold));
  }
  // try_lock_for(timeout) (lock_for(timeout, stop) with a stop token), or
  // an asynchronous acquire with that timeout.
  template <class L>
  std::optional<Turn> TryLockFor(L& l, Clock::duration timeout, std::stop_token stop = {}) {
    if (!async()) {
      if (!Lockable<L>::lock_for(l, timeout, std::move(stop))) return std::nullopt;
      return BlockingTurn(l);
    }
    std::optional<Hold> hold = AcquireHold(l, timeout, std::move(stop));
    if (!hold) return std::nullopt;
    return Turn(std::move(*hold));
  }
  // try_lock() (try_lock_shared()), or an asynchronous acquire with a
  // timeout of zero: one try.
  template <class L>
  std::optional<Turn> TryOnce(L& l) {
    if (!async()) {
      if (!Lockable<L>::try_once(l)) return std::nullopt;
      return BlockingTurn(l);
    }
    return TryLockFor(l, Clock::duration::zero());
  }

 protected:
  template <class L>
  static Turn BlockingTurn(L& l) {
    return Turn([&l] { Lockable<L>::unlock(l); }, [&l] { return l.fencing_token(); });
  }

  StoreFixture fixture_;
  std::atomic<unsigned> form_{0};
};

// Records who is inside a critical section and fails on any overlap.
class OverlapChecker {
 public:
  void enter() {
    int inside = ++inside_;
    if (inside != 1) overlaps_++;
  }
  void leave() { --inside_; }
  int overlaps() const { return overlaps_; }

 private:
  std::atomic<int> inside_{0};
  std::atomic<int> overlaps_{0};
};

TEST_P(RecipeTest, AcceptanceProgram) {
  auto client = NewClient();
  const std::string base = UniqueName("demo");
  dlock::Mutex m(client, base + "/mutex");
  std::uint64_t first = 0;
  {
    std::unique_lock lock(m);
    first = m.fencing_token().value();
    std::unique_lock again(m);  // reentrant in the same thread
  }
  ASSERT_TRUE(m.try_lock_for(2s));
  EXPECT_GT(m.fencing_token().value(), first);
  m.unlock();

  dlock::Semaphore sem(client, base + "/sem", 3);
  auto two = AcquireLease(sem, 2, 5s);
  ASSERT_TRUE(two);
  EXPECT_FALSE(AcquireLease(sem, 2, 50ms));
  two.reset();

  dlock::ReadWriteLock rw(client, base + "/rw");
  {
    std::shared_lock r1(rw.reader());
    std::shared_lock r2(rw.reader());
  }
  { std::unique_lock w(rw.writer()); }
  EXPECT_EQ(fixture_.entries(base + "/mutex"), 0u);
}

TEST_P(RecipeTest, MutexExcludesAcrossSessionsAndTokensGrow) {
  const std::string name = UniqueName("exclusive");
  constexpr int kThreads = 4;
  constexpr int kRounds = 15;
  OverlapChecker checker;
  std::mutex tokens_mu;
  std::vector<std::uint64_t> tokens;
  std::vector<std::jthread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      auto client = NewClient();  // own session: contends like another process
      Mutex m(client, name);
      for (int i = 0; i < kRounds; ++i) {
        Turn turn = Lock(m);
        checker.enter();
        {
          std::lock_guard<std::mutex> g(tokens_mu);
          tokens.push_back(turn.token());
        }
        checker.leave();
      }
    });
  }
  threads.clear();
  EXPECT_EQ(checker.overlaps(), 0);
  ASSERT_EQ(tokens.size(), static_cast<std::size_t>(kThreads * kRounds));
  // Holds are serialized, so tokens in the order holds happened must grow.
  for (std::size_t i = 1; i < tokens.size(); ++i) EXPECT_LT(tokens[i - 1], tokens[i]) << "at hold " << i;
  EXPECT_EQ(fixture_.entries(name), 0u);
}

TEST_P(RecipeTest, MutexIsFifoAcrossSessions) {
  const std::string name = UniqueName("fifo");
  auto holder_client = NewClient();
  Mutex holder(holder_client, name);
  holder.lock();
  constexpr int kWaiters = 5;
  std::mutex order_mu;
  std::vector<int> order;
  std::vector<std::jthread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] {
      auto client = NewClient();
      Mutex m(client, name);
      Turn turn = Lock(m);
      std::lock_guard<std::mutex> g(order_mu);
      order.push_back(i);
    });
    // Next waiter only after this one is queued in the store.
    ASSERT_TRUE(Eventually([&] { return fixture_.entries(name) == static_cast<std::size_t>(i + 2); }));
  }
  holder.unlock();
  threads.clear();
  ASSERT_EQ(order.size(), static_cast<std::size_t>(kWaiters));
  for (int i = 0; i < kWaiters; ++i) EXPECT_EQ(order[i], i);
}

TEST_P(RecipeTest, TryLockAndTimeoutLeaveNoEntry) {
  const std::string name = UniqueName("timeout");
  auto a = NewClient();
  auto b = NewClient();
  Mutex ma(a, name);
  Mutex mb(b, name);
  ma.lock();
  EXPECT_FALSE(TryOnce(mb));
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(TryLockFor(mb, 150ms));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 150ms);
  EXPECT_TRUE(Eventually([&] { return fixture_.entries(name) == 1u; }));
  ma.unlock();
  EXPECT_TRUE(TryOnce(mb));
  EXPECT_TRUE(Eventually([&] { return fixture_.entries(name) == 0u; }));
}

TEST_P(RecipeTest, StopTokenCancelsWaitAndLeavesNoEntry) {
  const std::string name = UniqueName("cancel");
  auto a = NewClient();
  auto b = NewClient();
  Mutex ma(a, name);
  Mutex mb(b, name);
  ma.lock();
  std::stop_source stop;
  std::atomic<int> result{-1};
  std::jthread waiter([&] { result = TryLockFor(mb, kForever, stop.get_token()) ? 1 : 0; });
  ASSERT_TRUE(Eventually([&] { return fixture_.entries(name) == 2u; }));
  stop.request_stop();
  waiter.join();
  EXPECT_EQ(result, 0);
  EXPECT_TRUE(Eventually([&] { return fixture_.entries(name) == 1u; }));
  ma.unlock();
}

TEST_P(RecipeTest, HoldIsReleasableFromAnotherThread) {
  const std::string name = UniqueName("hold");
  auto client = NewClient();
  Mutex m(client, name);
  auto hold = AcquireHold(m, 5s);
  ASSERT_TRUE(hold);
  EXPECT_TRUE(hold->held());
  EXPECT_GT(hold->fencing_token(), 0u);
  EXPECT_FALSE(hold->lost_token().stop_requested());
  std::jthread other([h = std::move(*hold)]() mutable { h.release(); });
  other.join();
  auto next = AcquireHold(m, 5s);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->state(), HoldState::kHeld);
}

TEST_P(RecipeTest, LocalThreadsKeepOneWaitingEntryPerProcess) {
  const std::string name = UniqueName("gate");
  auto client = NewClient();  // one "process": all threads share its session
  Mutex m(client, name);
  OverlapChecker checker;
  std::atomic<bool> done{false};
  std::atomic<std::size_t> max_entries{0};
  std::jthread sampler([&] {
    while (!done) {
      std::size_t n = fixture_.entries(name);
      std::size_t prev = max_entries;
      while (n > prev && !max_entries.compare_exchange_weak(prev, n)) {
      }
    }
  });
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < 6; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 8; ++i) {
          Turn turn = Lock(m);
          checker.enter();
          std::this_thread::sleep_for(1ms);  // a critical section that takes time
          checker.leave();
        }
      });
    }
  }
  done = true;
  sampler.join();
  EXPECT_EQ(checker.overlaps(), 0);
  EXPECT_LE(max_entries.load(), 2u) << "more than one waiting entry from one process";
  EXPECT_GE(max_entries.load(), 1u);
}

TEST_P(RecipeTest, SemaphoreNeverExceedsPermits) {
  const std::string name = UniqueName("sem");
  constexpr std::uint32_t kPermits = 3;
  std::atomic<int> in_use{0};
  std::atomic<int> max_in_use{0};
  std::vector<std::jthread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      auto client = NewClient();
      Semaphore sem(client, name, kPermits);
      for (int i = 0; i < 6; ++i) {
        std::uint32_t want = 1 + (t + i) % 2;
        auto lease = AcquireLease(sem, want, 30s);
        ASSERT_TRUE(lease);
        EXPECT_EQ(lease->permits(), want);
        int now = (in_use += static_cast<int>(want));
        int prev = max_in_use;
        while (now > prev && !max_in_use.compare_exchange_weak(prev, now)) {
        }
        std::this_thread::sleep_for(1ms);
        in_use -= static_cast<int>(want);
      }
    });
  }
  threads.clear();
  EXPECT_LE(max_in_use.load(), static_cast<int>(kPermits));
  EXPECT_GE(max_in_use.load(), 2);
  EXPECT_EQ(fixture_.entries(name + "/leases"), 0u);
  EXPECT_EQ(fixture_.entries(name + "/locks"), 0u);
}

TEST_P(RecipeTest, SemaphoreServesABigRequestBeforeLaterSmallOnes) {
  const std::string name = UniqueName("sem-fifo");
  auto a = NewClient();
  Semaphore sa(a, name, 3);
  auto two = AcquireLease(sa, 2, 5s);
  ASSERT_TRUE(two);
  std::mutex mu;
  std::vector<std::string> order;
  auto b = NewClient();
  std::jthread big([&] {
    Semaphore sb(b, name, 3);
    auto three = AcquireLease(sb, 3, 30s);
    ASSERT_TRUE(three);
    {
      std::lock_guard<std::mutex> g(mu);
      order.push_back("big");
    }
  });
  // The big request is at the head: it holds the acquirers' lock.
  ASSERT_TRUE(Eventually([&] { return fixture_.entries(name + "/locks") == 1u; }));
  auto c = NewClient();
  std::jthread small([&] {
    Semaphore sc(c, name, 3);
    auto one = AcquireLease(sc, 1, 30s);  // one permit is free, but big came first
    ASSERT_TRUE(one);
    std::lock_guard<std::mutex> g(mu);
    order.push_back("small");
  });
  ASSERT_TRUE(Eventually([&] { return fixture_.entries(name + "/locks") == 2u; }));
  two.reset();
  big.join();
  small.join();
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0], "big");
}

TEST_P(RecipeTest, SemaphoreMutexUnlocksFromAnyThread) {
  const std::string name = UniqueName("semmutex");
  auto client = NewClient();
  SemaphoreMutex m(client, name);
  std::optional<Turn> turn(Lock(m));
  EXPECT_GT(turn->token(), 0u);
  EXPECT_FALSE(TryOnce(m));  // not reentrant
  std::jthread([&] { turn.reset(); }).join();
  EXPECT_TRUE(TryOnce(m));
}

TEST_P(RecipeTest, ReadersShareWritersExclude) {
  const std::string name = UniqueName("rw");
  auto a = NewClient();
  auto b = NewClient();
  auto c = NewClient();
  ReadWriteLock ra(a, name);
  ReadWriteLock rb(b, name);
  ReadWriteLock rc(c, name);
  std::optional<Turn> r1(Lock(ra.reader()));
  auto r2 = TryLockFor(rb.reader(), 5s);
  ASSERT_TRUE(r2);  // two readers at once
  EXPECT_FALSE(TryLockFor(rc.writer(), 50ms)) << "a writer got in beside readers";
  r2.reset();
  r1.reset();
  auto w = TryLockFor(rb.writer(), 5s);
  ASSERT_TRUE(w);
  EXPECT_FALSE(TryLockFor(ra.reader(), 50ms)) << "a reader got in beside a writer";
}

TEST_P(RecipeTest, WaitingWriterIsNotStarvedByLaterReaders) {
  const std::string name = UniqueName("rw-fair");
  auto a = NewClient();
  ReadWriteLock ra(a, name);
  ra.reader().lock_shared();
  std::mutex mu;
  std::vector<std::string> order;
  auto b = NewClient();
  ReadWriteLock rb(b, name);
  std::jthread writer([&] {
    Turn w = Lock(rb.writer());
    std::lock_guard<std::mutex> g(mu);
    order.push_back("writer");
  });
  ASSERT_TRUE(Eventually([&] { return fixture_.entries(name) == 2u; }));
  auto c = NewClient();
  ReadWriteLock rc(c, name);
  std::jthread late_reader([&] {
    Turn r = Lock(rc.reader());
    std::lock_guard<std::mutex> g(mu);
    order.push_back("reader");
  });
  ASSERT_TRUE(Eventually([&] { return fixture_.entries(name) == 3u; }));
  ra.reader().unlock_shared();
  writer.join();
  late_reader.join();
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0], "writer");
}

TEST_P(RecipeTest, DowngradeKeepsQueuedWriterOut) {
  const std::string name = UniqueName("rw-down");
  auto a = NewClient();
  ReadWriteLock ra(a, name);
  ra.writer().lock();
  std::atomic<bool> writer_in{false};
  auto b = NewClient();
  ReadWriteLock rb(b, name);
  std::jthread writer([&] {
    Turn w = Lock(rb.writer());
    writer_in = true;
  });
  ASSERT_TRUE(Eventually([&] { return fixture_.entries(name) == 2u; }));
  ra.reader().lock_shared();  // downgrade: granted at once
  auto write_token = ra.writer().fencing_token();
  ra.writer().unlock();
  // The queued writer must still be kept out by our read hold.
  EXPECT_FALSE(Eventually([&] { return writer_in.load(); }, 300ms));
  EXPECT_TRUE(ra.reader().fencing_token().has_value());
  // The read hold continues the write hold: same token, smaller than the
  // queued writer's, so fencing never sees the tokens go down.
  EXPECT_EQ(ra.reader().fencing_token(), write_token);
  ra.reader().unlock_shared();
  writer.join();
  EXPECT_TRUE(writer_in);
}

// The blocking writer refuses an upgrade; an asynchronous acquire is never
// reentrant (async.hpp): it waits behind this process's read hold like any
// other contender, and gives up at its timeout leaving nothing behind.
TEST_P(RecipeTest, UpgradeIsRefused) {
  auto client = NewClient();
  const std::string name = UniqueName("rw-up");
  ReadWriteLock rw(client, name);
  std::shared_lock r(rw.reader());
  if (async()) {
    EXPECT_FALSE(AcquireHold(rw.writer(), 50ms)) << "an asynchronous writer got in beside this process's reader";
    EXPECT_TRUE(Eventually([&] { return fixture_.entries(name) == 1u; }));
    return;
  }
  try {
    rw.writer().lock();
    FAIL() << "upgrade did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
  }
}

TEST_P(RecipeTest, MutexCountsAsWriterForReaders) {
  const std::string name = UniqueName("mixed");
  auto a = NewClient();
  auto b = NewClient();
  Mutex m(a, name);
  ReadWriteLock rw(b, name);
  std::optional<Turn> mine(Lock(m));
  EXPECT_FALSE(TryLockFor(rw.reader(), 50ms));
  mine.reset();
  Turn r = Lock(rw.reader());
  EXPECT_FALSE(TryLockFor(m, 50ms));
}

// ---- Defects found in review (issue 11), each seen failing before its fix.

// Item 11: a timeout <= 0 behaves like try_lock(): one try, granted if free.
TEST_P(RecipeTest, ZeroTimeoutTriesOnce) {
  const std::string name = UniqueName("zero");
  auto client = NewClient();
  Mutex m(client, name);
  ASSERT_TRUE(TryLockFor(m, 0s)) << "try_lock_for(0) of a free lock";
  if (!async()) {
    ASSERT_TRUE(m.try_lock_until(std::chrono::steady_clock::now() - 1s)) << "try_lock_until(the past)";
    m.unlock();
  }
  ASSERT_TRUE(AcquireHold(m, 0s).has_value());
  ASSERT_TRUE(AcquireHold(m, -5s).has_value());
  Semaphore sem(client, name + "/sem", 2);
  EXPECT_TRUE(AcquireLease(sem, 2, 0s).has_value());
  SemaphoreMutex sm(client, name + "/semaphore-mutex");
  ASSERT_TRUE(TryLockFor(sm, 0s));
  ReadWriteLock rw(client, name + "/rw");
  ASSERT_TRUE(TryLockFor(rw.reader(), 0s));
  ASSERT_TRUE(TryLockFor(rw.writer(), -5s));
  // Taken: the one try fails, and leaves nothing behind.
  auto other = NewClient();
  Mutex rival(other, name);
  m.lock();
  EXPECT_FALSE(TryLockFor(rival, 0s));
  m.unlock();
  EXPECT_TRUE(Eventually([&] { return fixture_.entries(name) == 0u; }));
}

// Item 6: a holder hears kLost before any other session can see its entry
// gone, when its session is closed.
TEST_P(RecipeTest, CloseTellsTheHolderBeforeItsEntryGoes) {
  const std::string name = UniqueName("close-order");
  auto a = NewClient();
  auto observer = NewClient();
  Mutex m(a, name);
  auto hold = AcquireHold(m, 5s);
  ASSERT_TRUE(hold);
  ASSERT_EQ(observer.list_entries(name, false).value().size(), 1u);
  std::atomic<int> seen_when_told{-1};
  auto sub = hold->on_state_change([&](HoldState s) {
    if (s != HoldState::kLost || seen_when_told != -1) return;
    auto listed = observer.list_entries(name, false);
    seen_when_told = listed.ok() ? static_cast<int>(listed->size()) : -2;
  });
  a.close_session();
  ASSERT_TRUE(Eventually([&] { return seen_when_told.load() != -1; }));
  EXPECT_EQ(seen_when_told.load(), 1) << "the entry was gone (0) or unreadable (-2) before the holder was told";
  EXPECT_EQ(hold->state(), HoldState::kLost);
  EXPECT_TRUE(Eventually([&] { return fixture_.entries(name) == 0u; }));
}

// Item 14: a hold's listener may call back into the library (here: close
// the session, read states, take another lock) on every store.
TEST_P(RecipeTest, ListenerMayCallBackIntoTheLibrary) {
  const std::string name = UniqueName("callback");
  auto a = NewClient();
  auto b = NewClient();
  Mutex m(a, name);
  Mutex other(b, name + "/other");
  auto hold = AcquireHold(m, 5s);
  ASSERT_TRUE(hold);
  std::atomic<int> result{-1};
  auto sub = hold->on_state_change([&](HoldState s) {
    if (s != HoldState::kLost || result != -1) return;
    a.close_session();  // again, from inside the callback
    bool took = other.try_lock();
    if (took) other.unlock();
    result = (hold->state() == HoldState::kLost && took) ? 1 : 0;
  });
  a.close_session();
  ASSERT_TRUE(Eventually([&] { return result.load() != -1; }));
  EXPECT_EQ(result.load(), 1);
  EXPECT_TRUE(TryLockFor(m, 5s)) << "the client opens a new session afterwards";
}

// Item 8: locks whose names nest never affect each other.
TEST_P(RecipeTest, NestedNamesAreIndependent) {
  const std::string name = UniqueName("tenants");
  auto a = NewClient();
  auto b = NewClient();
  Mutex child1(a, name + "/acct-123456789");
  Mutex child2(a, name + "/run0000000001");
  Mutex child3(a, name + "/x/y");
  Semaphore child_sem(a, name + "/pool", 1);
  ReadWriteLock child_rw(a, name + "/rw-0000000007");
  std::optional<Turn> c1(Lock(child1));
  std::optional<Turn> c2(Lock(child2));
  std::optional<Turn> c3(Lock(child3));
  auto lease = AcquireLease(child_sem, 1, 5s);
  ASSERT_TRUE(lease);
  std::optional<Turn> crw(Lock(child_rw.writer()));
  Mutex parent(b, name);
  {
    auto p = TryOnce(parent);
    EXPECT_TRUE(p) << "a nested lock blocked its parent";
    EXPECT_EQ(b.list_entries(name, false).value().size(), 1u) << "nested locks listed in their parent";
  }
  c1.reset();
  c2.reset();
  c3.reset();
  lease.reset();
  crw.reset();
  // Right after (before any clean-up of empty parents), still independent.
  {
    auto p = TryOnce(parent);
    EXPECT_TRUE(p);
    EXPECT_EQ(b.list_entries(name, false).value().size(), 1u);
  }
  // And the other way round: a held parent does not block its children.
  Turn p = Lock(parent);
  EXPECT_TRUE(TryOnce(child1));
}

// A waiter whose session is closed under it (Client::close_session) queues
// again on a new session at once, not when the entry it waits for goes, and
// gets the lock when that goes. (On file://, a blocking acquire waits on its
// own thread, in poll(2): the close must wake that wait.)
TEST_P(RecipeTest, AWaiterWhoseSessionIsClosedQueuesAgainAtOnce) {
  const std::string name = UniqueName("waiter-closed");
  auto a = NewClient();
  auto b = NewClient();
  auto observer = NewClient();
  Mutex ma(a, name);
  Mutex mb(b, name);
  auto hold = AcquireHold(ma, 5s);
  ASSERT_TRUE(hold);
  std::atomic<int> got{-1};
  std::jthread waiter([&] {
    std::optional<Turn> turn = TryLockFor(mb, 120s);
    got = turn ? 1 : 0;
  });
  // The entry after the holder's: the waiter's, first on the session we close, then on a new one.
  auto second = [&]() -> std::string {
    auto listed = observer.list_entries(name, false);
    if (!listed.ok() || listed->size() != 2) return {};
    return (*listed)[1].id;
  };
  std::string first;
  ASSERT_TRUE(Eventually([&] { return !(first = second()).empty(); }));
  b.close_session();
  EXPECT_TRUE(Eventually([&] {
    std::string now = second();
    return !now.empty() && now != first;
  })) << "the waiter did not queue again while the entry it waits for stayed";
  EXPECT_EQ(got.load(), -1) << "the waiter gave up";
  hold->release();
  waiter.join();
  EXPECT_EQ(got.load(), 1);
  EXPECT_TRUE(Eventually([&] { return fixture_.entries(name) == 0u; }));
}

// A waiter whose entry an operator removes (`dlock break`) notices when it
// next looks (here: when the holder releases), queues again and gets the
// lock; the hold it gets then lasts (on Redis, whose renewals check the
// entries a session counts on, a stale claim on the broken entry would end
// the session, and the new hold with it, at the next renewal).
TEST_P(RecipeTest, AWaiterWhoseEntryIsBrokenStillGetsALastingHold) {
  const std::string name = UniqueName("broken-waiter");
  auto a = NewClient();
  auto b = NewClient();
  auto op = NewClient();
  Mutex ma(a, name);
  Mutex mb(b, name);
  ma.lock();
  std::optional<Hold> got;
  std::jthread waiter([&] { got = AcquireHold(mb, 60s); });
  ASSERT_TRUE(Eventually([&] { return fixture_.entries(name) == 2u; }));
  auto listed = op.list_entries(name, false).value();
  ASSERT_EQ(listed.size(), 2u);
  ASSERT_TRUE(op.remove_entry(name, listed[1].id).ok());
  ma.unlock();
  waiter.join();
  ASSERT_TRUE(got.has_value()) << "the waiter whose entry was broken never got the lock";
  const std::string session = b.session().value()->id();
  std::this_thread::sleep_for(1500ms);  // past a renewal of a 3 s Redis lease
  EXPECT_EQ(got->state(), HoldState::kHeld);
  EXPECT_EQ(b.session().value()->id(), session) << "the waiter's session ended";
}

// Widened fault model (issue 11): several threads of each "process" share
// one lock handle while their sessions end under them. The hold-level rule:
// no thread may read kHeld (state or lost token) for a hold after another
// holder of the lock was granted. Every read is stamped *before* it is made
// and every grant *after* lock() returned, so a reported violation is real.
class HoldLedger {
 public:
  std::uint64_t Stamp() { return ++clock_; }
  void Granted(std::uint64_t token) {
    std::lock_guard<std::mutex> g(mu_);
    grants_.push_back({Stamp(), token});
  }
  void SawHeld(std::uint64_t stamp, std::uint64_t token) {
    std::lock_guard<std::mutex> g(mu_);
    sightings_.push_back({stamp, token});
  }
  // Sightings of a hold made after a newer hold (larger token) was granted.
  std::vector<std::string> Violations() const {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<std::string> out;
    for (const auto& seen : sightings_) {
      for (const auto& grant : grants_) {
        if (grant.token > seen.token && grant.stamp < seen.stamp) {
          out.push_back("token " + std::to_string(seen.token) + " seen held at " + std::to_string(seen.stamp) +
                        " after token " + std::to_string(grant.token) + " was granted at " +
                        std::to_string(grant.stamp));
          break;
        }
      }
    }
    return out;
  }
  std::size_t grants() const {
    std::lock_guard<std::mutex> g(mu_);
    return grants_.size();
  }

 private:
  struct Event {
    std::uint64_t stamp;
    std::uint64_t token;
  };
  std::atomic<std::uint64_t> clock_{0};
  mutable std::mutex mu_;
  std::vector<Event> grants_;
  std::vector<Event> sightings_;
};

// A per-thread-style handle: lock, observe, unlock.
struct SharedHandle {
  std::function<bool()> lock;  // false: not acquired
  std::function<void()> unlock;
  std::function<std::optional<HoldState>()> state;
  std::function<std::optional<std::uint64_t>()> token;
  std::function<std::stop_token()> lost;
};

void RunSharedHandles(const std::function<SharedHandle(Client&)>& make, const std::vector<Client>& clients,
                      HoldLedger& ledger) {
  constexpr int kThreadsPerClient = 3;
  constexpr int kCycles = 8;
  std::vector<SharedHandle> handles;
  std::vector<std::unique_ptr<Client>> owners;
  for (const Client& c : clients) {
    owners.push_back(std::make_unique<Client>(c));
    handles.push_back(make(*owners.back()));
  }
  std::atomic<int> running{0};
  std::vector<std::jthread> threads;
  for (std::size_t c = 0; c < handles.size(); ++c) {
    for (int t = 0; t < kThreadsPerClient; ++t) {
      ++running;
      threads.emplace_back([&, c] {
        for (int i = 0; i < kCycles; ++i) {
          bool locked = false;
          try {
            locked = handles[c].lock();
          } catch (const Error&) {  // this thread's earlier hold was lost: unlock first
            handles[c].unlock();
            continue;
          }
          if (!locked) continue;
          std::optional<std::uint64_t> token = handles[c].token();
          if (token) ledger.Granted(*token);
          for (int look = 0; look < 5 && token; ++look) {
            std::uint64_t stamp = ledger.Stamp();
            bool held = handles[c].state() == HoldState::kHeld;
            bool not_lost = !handles[c].lost().stop_requested();
            if (held) ledger.SawHeld(stamp, *token);
            if (not_lost) ledger.SawHeld(stamp, *token);
            std::this_thread::sleep_for(std::chrono::microseconds(300));
          }
          handles[c].unlock();
        }
        --running;
      });
    }
  }
  // The fault: sessions end under the holders, one client at a time.
  std::jthread chaos([&] {
    for (int round = 0; running > 0 && round < 2000; ++round) {
      std::this_thread::sleep_for(std::chrono::milliseconds(3 + round % 7));
      owners[static_cast<std::size_t>(round) % owners.size()]->close_session();
    }
  });
  threads.clear();
  chaos.join();
}

TEST_P(RecipeTest, SharedHandlesNeverShowAStaleHoldWhileSessionsEnd) {
  const std::string name = UniqueName("shared-handles");
  std::vector<Client> clients{NewClient(), NewClient()};
  struct Kind {
    std::string label;
    std::function<SharedHandle(Client&)> make;
  };
  // Handles live as long as the run: kept here, made per client.
  std::vector<std::shared_ptr<void>> keep;
  const auto timeout = 2s;
  // The asynchronous API keeps no per-thread state in the lock object: each
  // thread keeps the Hold it was given, and looks at that.
  auto async_handle = [&](auto* lock) {
    struct Holds {
      std::mutex mu;
      std::map<std::thread::id, Hold> by_thread;
      Hold* mine() {
        std::lock_guard<std::mutex> g(mu);
        auto it = by_thread.find(std::this_thread::get_id());
        return it == by_thread.end() ? nullptr : &it->second;
      }
    };
    auto holds = std::make_shared<Holds>();
    return SharedHandle{[this, lock, holds, timeout] {
                          std::optional<Hold> hold = AcquireHold(*lock, timeout);
                          if (!hold) return false;
                          std::lock_guard<std::mutex> g(holds->mu);
                          holds->by_thread.insert_or_assign(std::this_thread::get_id(), std::move(*hold));
                          return true;
                        },
                        [holds] {
                          std::optional<Hold> mine;  // released after the map's mutex
                          std::lock_guard<std::mutex> g(holds->mu);
                          if (auto it = holds->by_thread.find(std::this_thread::get_id());
                              it != holds->by_thread.end()) {
                            mine.emplace(std::move(it->second));
                            holds->by_thread.erase(it);
                          }
                        },
                        [holds]() -> std::optional<HoldState> {
                          Hold* h = holds->mine();
                          return h ? std::optional(h->state()) : std::nullopt;
                        },
                        [holds]() -> std::optional<std::uint64_t> {
                          Hold* h = holds->mine();
                          return h ? std::optional(h->fencing_token()) : std::nullopt;
                        },
                        [holds] {
                          Hold* h = holds->mine();
                          return h ? h->lost_token() : std::stop_token();
                        }};
  };
  std::vector<Kind> kinds = {
      {"Mutex",
       [&](Client& c) {
         auto m = std::make_shared<Mutex>(c, name + "/mutex");
         keep.push_back(m);
         if (async()) return async_handle(m.get());
         return SharedHandle{[m, timeout] { return m->try_lock_for(timeout); }, [m] { m->unlock(); },
                             [m] { return m->hold_state(); }, [m] { return m->fencing_token(); },
                             [m] { return m->lost_token(); }};
       }},
      {"SemaphoreMutex",
       [&](Client& c) {
         auto m = std::make_shared<SemaphoreMutex>(c, name + "/semaphore-mutex");
         keep.push_back(m);
         if (async()) return async_handle(m.get());
         return SharedHandle{[m, timeout] { return m->try_lock_for(timeout); }, [m] { m->unlock(); },
                             [m] { return m->hold_state(); }, [m] { return m->fencing_token(); },
                             [m] { return m->lost_token(); }};
       }},
      {"ReadWriteLock writer",
       [&](Client& c) {
         auto rw = std::make_shared<ReadWriteLock>(c, name + "/rw");
         keep.push_back(rw);
         ReadWriteLock::Writer* w = &rw->writer();
         if (async()) return async_handle(w);
         return SharedHandle{
             [w, timeout] { return w->try_lock_for(timeout); }, [w] { w->unlock(); },
             [w] {
               return w->fencing_token()
                          ? std::optional(w->lost_token().stop_requested() ? HoldState::kLost : HoldState::kHeld)
                          : std::nullopt;
             },
             [w] { return w->fencing_token(); }, [w] { return w->lost_token(); }};
       }},
  };
  for (const Kind& kind : kinds) {
    HoldLedger ledger;
    RunSharedHandles(kind.make, clients, ledger);
    EXPECT_GT(ledger.grants(), 0u) << kind.label;
    auto violations = ledger.Violations();
    EXPECT_TRUE(violations.empty()) << kind.label << ": " << violations.size()
                                    << " stale sightings, first: " << (violations.empty() ? "" : violations.front());
  }
  keep.clear();
}

INSTANTIATE_TEST_SUITE_P(Stores, RecipeTest,
                         ::testing::Combine(::testing::ValuesIn(testing::StoreSpecs()),
                                            ::testing::Values(Api::kBlocking, Api::kAsync)),
                         [](const auto& p) {
                           return testing::SpecName(std::get<0>(p.param), p.index) +
                                  (std::get<1>(p.param) == Api::kAsync ? "_async" : "_blocking");
                         });

}  // namespace
}  // namespace dlock
