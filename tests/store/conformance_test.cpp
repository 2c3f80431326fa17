// The store contract (include/dlock/store.hpp), checked once on every store:
// mem and file always, and each server store whose URL the test scripts pass
// in DLOCK_TEST_URLS. A new store is accepted by passing this suite. What is
// specific to one store (its layout, its server's quirks) stays in that
// store's own tests.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <thread>

#include "dlock/dlock.hpp"
#include "support/status_matchers.hpp"
#include "support/stores.hpp"

namespace dlock {
namespace {

using namespace std::chrono_literals;
using ::testing::ElementsAreArray;
using testing::Eventually;
using testing::IsOk;
using testing::StatusIs;

// How long a test waits for something that must happen at once; only
// reached when the store is wrong.
constexpr auto kPrompt = 20s;
// How long a waiter must stay blocked to show that it blocks.
constexpr auto kStillBlocked = 150ms;

Clock::time_point In(Clock::duration d) { return DeadlineAfter(Clock::system()->now(), d); }

std::string NewAttemptId() {
  static std::mt19937_64 rng(std::random_device{}());
  static std::mutex mu;
  std::lock_guard<std::mutex> g(mu);
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

EntrySpec Spec(std::string kind = "lock", std::string attempt = NewAttemptId()) {
  EntrySpec spec;
  spec.kind = std::move(kind);
  spec.attempt_id = std::move(attempt);
  spec.owner.host = "conformance-host";
  spec.owner.pid = ::getpid();
  spec.owner.thread = "main";
  spec.owner.label = "conformance";
  spec.owner.acquired_unix_ms = 1'700'000'000'000;
  return spec;
}

std::vector<std::string> Ids(const std::vector<Entry>& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(e.id);
  return out;
}

// The store a test runs on. mem: one MemStore; file: a scratch directory;
// anything else: a URL.
class Target {
 public:
  explicit Target(const std::string& spec) : spec_(spec) {
    if (spec == "mem") {
      store_ = MemStore::create();
      return;
    }
    std::string url = spec;
    if (spec == "file") {
      char tmpl[] = "/tmp/dlock-conformance-XXXXXX";
      if (::mkdtemp(tmpl) == nullptr) std::abort();
      scratch_ = tmpl;
      url = "file://" + scratch_;
    }
    url_ = url;
    auto opened = OpenStore(url);
    if (!opened.ok()) {
      ADD_FAILURE() << "cannot open " << url << ": " << opened.status().to_string();
      return;
    }
    store_ = *opened;
  }
  ~Target() {
    store_.reset();
    if (!scratch_.empty()) std::filesystem::remove_all(scratch_);
  }

  Store& store() { return *store_; }
  bool ok() const { return store_ != nullptr; }
  // Another Store on the same data, as another process would open it (mem:
  // the same object: its data lives in it).
  std::shared_ptr<Store> OpenAgain(StoreOptions options = {}) {
    if (spec_ == "mem") return store_;
    auto opened = OpenStore(url_, options);
    EXPECT_TRUE(opened.ok()) << opened.status().to_string();
    return opened.ok() ? *opened : nullptr;
  }
  // Whether the store can run on a hand-moved clock. Redis counts leases in
  // real time on the server, so it needs a clock that keeps real time.
  bool takes_manual_clock() const { return spec_ == "mem" || spec_ == "file" || spec_.starts_with("zk"); }
  const std::string& spec() const { return spec_; }

 private:
  std::string spec_;
  std::string url_;
  std::string scratch_;
  std::shared_ptr<Store> store_;
};

class ConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    target_ = std::make_unique<Target>(GetParam());
    ASSERT_TRUE(target_->ok());
    static std::atomic<int> counter{0};
    prefix_ = "conformance/" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  }

  std::string Queue(const std::string& name) const { return prefix_ + "/" + name; }

  std::shared_ptr<Session> NewSession(Store* store = nullptr) {
    auto s = (store ? store : &target_->store())->open_session(In(kPrompt));
    EXPECT_THAT(s.status(), IsOk());
    return s.ok() ? *s : nullptr;
  }

  Entry Append(Session& s, const std::string& queue, EntrySpec spec = Spec()) {
    auto appended = s.append(queue, spec, In(kPrompt));
    EXPECT_THAT(appended.status(), IsOk());
    return appended.ok() ? appended->entry : Entry{};
  }

  std::vector<Entry> List(Session& s, const std::string& queue, bool with_owners = false) {
    auto listed = s.list(queue, {.with_owners = with_owners}, In(kPrompt));
    EXPECT_THAT(listed.status(), IsOk());
    return listed.ok() ? *listed : std::vector<Entry>{};
  }

  // wait_any_gone on its own thread; cancelled when destroyed so that a
  // failing test never hangs.
  class AsyncWait {
   public:
    AsyncWait(std::shared_ptr<Session> s, std::string queue, std::vector<std::string> ids,
              Clock::time_point deadline = kNoDeadline) {
      std::stop_token stop = stop_.get_token();
      result_ = std::async(std::launch::async, [=] { return s->wait_any_gone(queue, ids, deadline, stop); });
    }
    ~AsyncWait() { stop_.request_stop(); }
    bool Blocks() { return result_.wait_for(kStillBlocked) == std::future_status::timeout; }
    Status Result() {
      if (result_.wait_for(kPrompt) != std::future_status::ready) return AbortedError("the wait did not end");
      return result_.get();
    }
    void Cancel() { stop_.request_stop(); }

   private:
    std::stop_source stop_;
    std::future<Status> result_;
  };

  std::unique_ptr<Target> target_;
  std::string prefix_;
};

// ------------------------------------------------------------- sessions

TEST_P(ConformanceTest, OpenSessionReturnsANewIndependentSessionEachTime) {
  auto a = NewSession();
  auto b = NewSession();
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->id(), b->id());
  EXPECT_EQ(a->state(), SessionState::kConnected);
  Entry kept = Append(*b, Queue("q"));
  a->close();
  EXPECT_EQ(a->state(), SessionState::kClosed);
  EXPECT_EQ(b->state(), SessionState::kConnected) << "closing one session ended another";
  EXPECT_THAT(Ids(List(*b, Queue("q"))), ElementsAreArray({kept.id}));
}

TEST_P(ConformanceTest, CloseIsIdempotentAndAClosedSessionRefusesWork) {
  auto s = NewSession();
  auto other = NewSession();
  ASSERT_TRUE(s && other);
  Entry theirs = Append(*other, Queue("q"));
  s->close();
  s->close();
  EXPECT_EQ(s->state(), SessionState::kClosed);
  EXPECT_THAT(s->append(Queue("q"), Spec(), In(kPrompt)).status(), StatusIs(ErrorCode::kSessionLost));
  EXPECT_THAT(s->list(Queue("q"), {}, In(kPrompt)).status(), StatusIs(ErrorCode::kSessionLost));
  EXPECT_THAT(s->find_own(Queue("q"), NewAttemptId(), In(kPrompt)).status(), StatusIs(ErrorCode::kSessionLost));
  std::vector<std::string> ids{theirs.id};
  EXPECT_THAT(s->wait_any_gone(Queue("q"), ids, In(kPrompt), {}), StatusIs(ErrorCode::kSessionLost));
  EXPECT_EQ(List(*other, Queue("q")).size(), 1u) << "closing one session took another's entry";
}

TEST_P(ConformanceTest, ASessionMayOutliveItsStore) {
  auto other = target_->OpenAgain();
  ASSERT_TRUE(other);
  auto s = NewSession(other.get());
  ASSERT_TRUE(s);
  other.reset();  // the application dropped its Store handle first
  Entry e = Append(*s, Queue("orphaned-store"));
  EXPECT_THAT(Ids(List(*s, Queue("orphaned-store"))), ElementsAreArray({e.id}));
  s->close();
  auto observer = NewSession();
  EXPECT_TRUE(Eventually([&] { return List(*observer, Queue("orphaned-store")).empty(); }));
}

// ---------------------------------------------------------------- append

TEST_P(ConformanceTest, AppendsGetGrowingTokensInQueueOrderAndReturnTheQueue) {
  auto a = NewSession();
  auto b = NewSession();
  ASSERT_TRUE(a && b);
  std::vector<std::string> expected;
  std::uint64_t last = 0;
  for (int i = 0; i < 6; ++i) {
    Session& s = i % 2 == 0 ? *a : *b;
    auto appended = s.append(Queue("q"), Spec(), In(kPrompt));
    ASSERT_THAT(appended.status(), IsOk());
    ASSERT_TRUE(appended->entry.token.has_value()) << "an appended entry always has its token";
    EXPECT_GT(*appended->entry.token, last);
    last = *appended->entry.token;
    EXPECT_EQ(appended->entry.kind, "lock");
    expected.push_back(appended->entry.id);
    if (appended->queue) {
      EXPECT_EQ(Ids(*appended->queue), expected) << "the queue right after the append";
    }
  }
  auto listed = List(*a, Queue("q"));
  EXPECT_EQ(Ids(listed), expected);
  EXPECT_TRUE(std::is_sorted(listed.begin(), listed.end(), QueueOrder));
  std::set<std::string> distinct(expected.begin(), expected.end());
  EXPECT_EQ(distinct.size(), expected.size());
}

TEST_P(ConformanceTest, TokensKeepGrowingAfterTheQueueEmptied) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  std::uint64_t last = 0;
  for (int i = 0; i < 4; ++i) {
    Entry e = Append(*s, Queue("emptied"));
    ASSERT_TRUE(e.token.has_value());
    EXPECT_GT(*e.token, last);
    last = *e.token;
    ASSERT_THAT(s->remove(Queue("emptied"), e.id, In(kPrompt)), IsOk());
  }
}

TEST_P(ConformanceTest, EveryKindIsKeptAndAGivenSequenceSortsBesideItsEntry) {
  auto s = NewSession();
  auto other = NewSession();
  ASSERT_TRUE(s && other);
  Entry write = Append(*s, Queue("rw"), Spec("write"));
  Entry queued = Append(*other, Queue("rw"), Spec("write"));
  EntrySpec read = Spec("read");
  read.sequence = write.sequence;  // a downgrade: the read entry takes the write entry's place
  Entry downgraded = Append(*s, Queue("rw"), read);
  EXPECT_EQ(downgraded.sequence, write.sequence);
  ASSERT_TRUE(downgraded.token && queued.token);
  EXPECT_GT(*downgraded.token, *queued.token) << "an entry with a given sequence still gets a newer token";
  ASSERT_THAT(s->remove(Queue("rw"), write.id, In(kPrompt)), IsOk());
  auto listed = List(*s, Queue("rw"));
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].id, downgraded.id) << "the read entry must sort ahead of the queued writer";
  EXPECT_EQ(listed[0].kind, "read");
  EXPECT_EQ(listed[1].id, queued.id);
  Entry lease = Append(*s, Queue("leases"), Spec("lease"));
  EXPECT_EQ(List(*s, Queue("leases")).at(0).kind, "lease");
}

TEST_P(ConformanceTest, ListWithOwnersReturnsTheOwnerRecord) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  Append(*s, Queue("owners"));
  auto listed = List(*s, Queue("owners"), /*with_owners=*/true);
  ASSERT_EQ(listed.size(), 1u);
  ASSERT_TRUE(listed[0].owner.has_value());
  EXPECT_EQ(listed[0].owner->host, "conformance-host");
  EXPECT_EQ(listed[0].owner->pid, ::getpid());
  EXPECT_EQ(listed[0].owner->label, "conformance");
  EXPECT_EQ(listed[0].owner->acquired_unix_ms, 1'700'000'000'000);
  ASSERT_TRUE(listed[0].token.has_value());
}

TEST_P(ConformanceTest, AQueueNeverUsedIsEmpty) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  EXPECT_TRUE(List(*s, Queue("never/used")).empty());
  EXPECT_THAT(s->find_own(Queue("never/used"), NewAttemptId(), In(kPrompt)).status(), IsOk());
}

// -------------------------------------------------------------- find_own

TEST_P(ConformanceTest, FindOwnSeesOnlyThisSessionsLiveEntry) {
  auto s = NewSession();
  auto other = NewSession();
  ASSERT_TRUE(s && other);
  const std::string attempt = NewAttemptId();
  Entry mine = Append(*s, Queue("own"), Spec("lock", attempt));
  auto found = s->find_own(Queue("own"), attempt, In(kPrompt));
  ASSERT_THAT(found.status(), IsOk());
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->id, mine.id);
  EXPECT_EQ((*found)->token, mine.token);
  auto theirs = other->find_own(Queue("own"), attempt, In(kPrompt));
  ASSERT_THAT(theirs.status(), IsOk());
  EXPECT_FALSE(theirs->has_value()) << "another session's entry was taken for this one's";
  EXPECT_FALSE(s->find_own(Queue("own"), NewAttemptId(), In(kPrompt))->has_value());
  ASSERT_THAT(other->remove(Queue("own"), mine.id, In(kPrompt)), IsOk());  // an operator's break
  EXPECT_FALSE(s->find_own(Queue("own"), attempt, In(kPrompt))->has_value()) << "a removed entry is not ours";
}

// ---------------------------------------------------------------- remove

TEST_P(ConformanceTest, RemoveIsIdempotentAndTakesAnyonesEntry) {
  auto s = NewSession();
  auto other = NewSession();
  ASSERT_TRUE(s && other);
  Entry e = Append(*s, Queue("rm"));
  Entry kept = Append(*s, Queue("rm"));
  ASSERT_THAT(other->remove(Queue("rm"), e.id, In(kPrompt)), IsOk());
  EXPECT_THAT(other->remove(Queue("rm"), e.id, In(kPrompt)), IsOk()) << "a second remove is OK";
  EXPECT_THAT(s->remove(Queue("rm"), e.id, In(kPrompt)), IsOk());
  EXPECT_THAT(Ids(List(*s, Queue("rm"))), ElementsAreArray({kept.id}));
}

// ------------------------------------------------------------------ wait

TEST_P(ConformanceTest, WaitReturnsAtOnceWhenAnEntryIsAlreadyGone) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  Entry e = Append(*s, Queue("gone"));
  Entry live = Append(*s, Queue("gone"));
  ASSERT_THAT(s->remove(Queue("gone"), e.id, In(kPrompt)), IsOk());
  std::vector<std::string> ids{live.id, e.id};
  EXPECT_THAT(s->wait_any_gone(Queue("gone"), ids, In(kPrompt), {}), IsOk());
}

TEST_P(ConformanceTest, WaitWakesWhenAnotherSessionRemovesTheEntry) {
  auto holder = NewSession();
  auto waiter = NewSession();
  ASSERT_TRUE(holder && waiter);
  Entry e = Append(*holder, Queue("wake"));
  AsyncWait wait(waiter, Queue("wake"), {e.id});
  EXPECT_TRUE(wait.Blocks());
  ASSERT_THAT(holder->remove(Queue("wake"), e.id, In(kPrompt)), IsOk());
  EXPECT_THAT(wait.Result(), IsOk());
}

TEST_P(ConformanceTest, WaitWakesWhenTheOwnersSessionCloses) {
  auto holder = NewSession();
  auto waiter = NewSession();
  ASSERT_TRUE(holder && waiter);
  Entry e = Append(*holder, Queue("owner-closes"));
  AsyncWait wait(waiter, Queue("owner-closes"), {e.id});
  EXPECT_TRUE(wait.Blocks());
  holder->close();
  EXPECT_THAT(wait.Result(), IsOk());
}

TEST_P(ConformanceTest, WaitHonoursItsDeadlineAndItsStopToken) {
  auto holder = NewSession();
  auto waiter = NewSession();
  ASSERT_TRUE(holder && waiter);
  Entry e = Append(*holder, Queue("stays"));
  std::vector<std::string> ids{e.id};
  EXPECT_THAT(waiter->wait_any_gone(Queue("stays"), ids, In(200ms), {}), StatusIs(ErrorCode::kDeadlineExceeded));
  AsyncWait wait(waiter, Queue("stays"), {e.id});
  EXPECT_TRUE(wait.Blocks());
  wait.Cancel();
  EXPECT_THAT(wait.Result(), StatusIs(ErrorCode::kCancelled));
  std::stop_source stopped;
  stopped.request_stop();
  EXPECT_THAT(waiter->wait_any_gone(Queue("stays"), ids, kNoDeadline, stopped.get_token()),
              StatusIs(ErrorCode::kCancelled))
      << "a stop requested before the call";
  EXPECT_EQ(List(*waiter, Queue("stays")).size(), 1u);
}

TEST_P(ConformanceTest, WaitEndsWithSessionLostWhenItsOwnSessionCloses) {
  auto holder = NewSession();
  auto waiter = NewSession();
  ASSERT_TRUE(holder && waiter);
  Entry e = Append(*holder, Queue("own-close"));
  AsyncWait wait(waiter, Queue("own-close"), {e.id});
  EXPECT_TRUE(wait.Blocks());
  waiter->close();
  EXPECT_THAT(wait.Result(), StatusIs(ErrorCode::kSessionLost));
}

TEST_P(ConformanceTest, WaitFollowsAHandMovedClock) {
  if (!target_->takes_manual_clock()) GTEST_SKIP() << target_->spec() << " counts leases in real time";
  auto clock = std::make_shared<ManualClock>();
  std::shared_ptr<Store> store;
  if (target_->spec() == "mem") {
    store = MemStore::create({.clock = clock});
  } else {
    store = target_->OpenAgain({.clock = clock, .connect_timeout = std::chrono::milliseconds(10'000)});
  }
  ASSERT_TRUE(store);
  // Deadlines on the store's own clock: it starts an hour after the steady
  // clock's epoch, which is ahead of real time on a machine up for less
  // than an hour (CI found it: every request "before the deadline" failed).
  auto open = [&] {
    auto s = store->open_session(clock->now() + kPrompt);
    EXPECT_THAT(s.status(), IsOk());
    return s.ok() ? *s : nullptr;
  };
  auto holder = open();
  auto waiter = open();
  ASSERT_TRUE(holder && waiter);
  auto appended = holder->append(Queue("manual"), Spec(), clock->now() + kPrompt);
  ASSERT_THAT(appended.status(), IsOk());
  const Entry e = appended->entry;
  // Short steps: a session on this clock must not count itself lost.
  AsyncWait wait(waiter, Queue("manual"), {e.id}, clock->now() + 1s);
  EXPECT_TRUE(wait.Blocks()) << "a deadline on a clock that stands still passed";
  clock->advance(1100ms);
  EXPECT_THAT(wait.Result(), StatusIs(ErrorCode::kDeadlineExceeded));
  holder->close();
  waiter->close();
}

// ------------------------------------------------------- close and notes

TEST_P(ConformanceTest, SubscribersHearCloseBeforeAnyoneSeesTheEntriesGo) {
  auto s = NewSession();
  auto observer = NewSession();
  ASSERT_TRUE(s && observer);
  Entry e = Append(*s, Queue("close-order"));
  std::atomic<int> seen_when_told{-1};
  auto sub = s->subscribe([&](SessionState state) {
    if (state != SessionState::kClosed || seen_when_told != -1) return;
    auto listed = observer->list(Queue("close-order"), {}, In(kPrompt));
    seen_when_told = listed.ok() ? static_cast<int>(listed->size()) : -2;
  });
  s->close();
  ASSERT_TRUE(Eventually([&] { return seen_when_told.load() != -1; }));
  EXPECT_EQ(seen_when_told.load(), 1) << "0: the entry was gone before the subscriber was told";
  EXPECT_TRUE(Eventually([&] { return List(*observer, Queue("close-order")).empty(); }));
  EXPECT_EQ(s->state(), SessionState::kClosed);
}

TEST_P(ConformanceTest, CloseEndsTheEntriesInEveryQueueAndIsHeardOnce) {
  auto s = NewSession();
  auto observer = NewSession();
  ASSERT_TRUE(s && observer);
  Append(*s, Queue("first"));
  Append(*s, Queue("second/nested"));
  Entry theirs = Append(*observer, Queue("first"));
  std::atomic<int> closed{0};
  auto sub = s->subscribe([&](SessionState state) { closed += state == SessionState::kClosed ? 1 : 100; });
  s->close();
  s->close();
  EXPECT_TRUE(Eventually([&] { return List(*observer, Queue("second/nested")).empty(); }));
  EXPECT_TRUE(Eventually([&] { return List(*observer, Queue("first")).size() == 1; }));
  EXPECT_THAT(Ids(List(*observer, Queue("first"))), ElementsAreArray({theirs.id}));
  EXPECT_EQ(closed.load(), 1) << "one kClosed and nothing else, however often close is called";
}

TEST_P(ConformanceTest, ASubscriberMayCallBackInAndCloseTheSession) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  Append(*s, Queue("reentrant"));
  std::atomic<int> calls{0};
  std::atomic<bool> saw_state{false};
  std::weak_ptr<Session> weak = s;
  auto sub = s->subscribe([&, weak](SessionState) {
    ++calls;
    if (auto self = weak.lock()) {
      saw_state = self->state() == SessionState::kClosed;
      self->close();  // again, from inside the call
    }
  });
  auto thrower = s->subscribe([](SessionState) { throw std::runtime_error("a listener's own bug"); });
  s->close();
  ASSERT_TRUE(Eventually([&] { return calls.load() >= 1; }));
  EXPECT_TRUE(saw_state.load());
  EXPECT_EQ(s->state(), SessionState::kClosed);
  auto observer = NewSession();
  EXPECT_TRUE(Eventually([&] { return List(*observer, Queue("reentrant")).empty(); }));
}

TEST_P(ConformanceTest, AnUnsubscribedListenerHearsNothingMore) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  std::atomic<int> calls{0};
  auto sub = s->subscribe([&](SessionState) { ++calls; });
  sub.reset();
  s->close();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(calls.load(), 0);
}

// ----------------------------------------------------------------- names

TEST_P(ConformanceTest, QueueNamesAreValidatedAlikeOnEveryStore) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  std::vector<std::string> ids{"x"};
  for (const std::string& bad :
       {std::string(), std::string("/a"), std::string("a/"), std::string("a//b"), std::string("../x"),
        std::string("a/./b"), std::string("has space"), std::string("a\nb"), std::string(600, 'x')}) {
    SCOPED_TRACE("queue '" + bad + "'");
    EXPECT_THAT(s->append(bad, Spec(), In(kPrompt)).status(), StatusIs(ErrorCode::kInvalidArgument));
    EXPECT_THAT(s->list(bad, {}, In(kPrompt)).status(), StatusIs(ErrorCode::kInvalidArgument));
    EXPECT_THAT(s->find_own(bad, NewAttemptId(), In(kPrompt)).status(), StatusIs(ErrorCode::kInvalidArgument));
    EXPECT_THAT(s->remove(bad, "x", In(kPrompt)), StatusIs(ErrorCode::kInvalidArgument));
    EXPECT_THAT(s->wait_any_gone(bad, ids, In(kPrompt), {}), StatusIs(ErrorCode::kInvalidArgument));
  }
  for (const std::string& good : {Queue("a.b_c-D/0"), Queue("x/locks"), Queue(std::string(200, 'y'))}) {
    SCOPED_TRACE("queue '" + good + "'");
    Entry e = Append(*s, good);
    EXPECT_THAT(Ids(List(*s, good)), ElementsAreArray({e.id}));
  }
}

TEST_P(ConformanceTest, NestedQueuesAreUnrelated) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  Entry parent = Append(*s, Queue("tenants"));
  Entry child = Append(*s, Queue("tenants/acct-123456789"));
  Entry grandchild = Append(*s, Queue("tenants/acct-123456789/run0000000001"));
  EXPECT_THAT(Ids(List(*s, Queue("tenants"))), ElementsAreArray({parent.id}));
  EXPECT_THAT(Ids(List(*s, Queue("tenants/acct-123456789"))), ElementsAreArray({child.id}));
  EXPECT_THAT(Ids(List(*s, Queue("tenants/acct-123456789/run0000000001"))), ElementsAreArray({grandchild.id}));
  ASSERT_THAT(s->remove(Queue("tenants"), parent.id, In(kPrompt)), IsOk());
  EXPECT_TRUE(List(*s, Queue("tenants")).empty());
  EXPECT_EQ(List(*s, Queue("tenants/acct-123456789")).size(), 1u);
}

// ------------------------------------------------------------- under load

TEST_P(ConformanceTest, ConcurrentAppendsGetDistinctTokensInQueueOrder) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 10;
  std::vector<std::shared_ptr<Session>> sessions;
  for (int t = 0; t < kThreads; ++t) sessions.push_back(NewSession());
  std::mutex mu;
  std::map<std::string, std::uint64_t> token_of;  // from the appends: a listing need not carry tokens
  std::vector<std::jthread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        Entry e = Append(*sessions[t], Queue("busy"));
        std::lock_guard<std::mutex> g(mu);
        token_of[e.id] = e.token.value_or(0);
      }
    });
  }
  threads.clear();
  auto listed = List(*sessions[0], Queue("busy"));
  ASSERT_EQ(listed.size(), static_cast<std::size_t>(kThreads * kPerThread));
  std::set<std::uint64_t> tokens;
  std::uint64_t last = 0;
  for (const Entry& e : listed) {
    std::uint64_t token = token_of.at(e.id);
    EXPECT_GT(token, last) << "queue order and token order disagree";
    last = token;
    tokens.insert(token);
  }
  EXPECT_EQ(tokens.size(), listed.size());
}

// ------------------------------------------------- asynchronous primitives

// Collects the outcomes of an asynchronous call and counts them: exactly one
// is the contract.
template <class T>
class Outcomes {
 public:
  std::function<void(T)> Callback() {
    return [this](T r) {
      std::lock_guard<std::mutex> g(mu_);
      got_.push_back(std::move(r));
      cv_.notify_all();
    };
  }
  // The first outcome, once it came (or an aborted status after kPrompt).
  T First() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, kPrompt, [&] { return !got_.empty(); })) return T(AbortedError("no outcome came"));
    return got_.front();
  }
  bool NoneWithin(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(mu_);
    return !cv_.wait_for(lock, d, [&] { return !got_.empty(); });
  }
  std::size_t Count() {
    std::lock_guard<std::mutex> g(mu_);
    return got_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<T> got_;
};

TEST_P(ConformanceTest, AsyncRequestsDoWhatTheBlockingOnesDo) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  const std::string q = Queue("async-requests");
  EntrySpec spec = Spec();
  Outcomes<Result<Appended>> appended;
  s->async_append(q, spec, In(kPrompt), appended.Callback());
  Result<Appended> a = appended.First();
  ASSERT_THAT(a.status(), IsOk());
  EXPECT_TRUE(a->entry.token.has_value());
  Entry second = Append(*s, q);

  Outcomes<Result<std::vector<Entry>>> listed;
  s->async_list(q, {}, In(kPrompt), listed.Callback());
  Result<std::vector<Entry>> l = listed.First();
  ASSERT_THAT(l.status(), IsOk());
  EXPECT_THAT(Ids(*l), ElementsAreArray(std::vector<std::string>{a->entry.id, second.id}));

  Outcomes<Result<std::optional<Entry>>> found;
  s->async_find_own(q, spec.attempt_id, In(kPrompt), found.Callback());
  Result<std::optional<Entry>> f = found.First();
  ASSERT_THAT(f.status(), IsOk());
  ASSERT_TRUE(f->has_value());
  EXPECT_EQ((*f)->id, a->entry.id);

  Outcomes<Status> removed;
  s->async_remove(q, a->entry.id, In(kPrompt), removed.Callback());
  EXPECT_THAT(removed.First(), IsOk());
  EXPECT_THAT(Ids(List(*s, q)), ElementsAreArray(std::vector<std::string>{second.id}));
  Outcomes<Status> again;
  s->async_remove(q, a->entry.id, In(kPrompt), again.Callback());
  EXPECT_THAT(again.First(), IsOk()) << "removing what is gone is OK";
  EXPECT_EQ(appended.Count() + listed.Count() + found.Count() + removed.Count() + again.Count(), 5u);

  s->close();
  Outcomes<Result<Appended>> refused;
  s->async_append(q, Spec(), In(kPrompt), refused.Callback());
  EXPECT_THAT(refused.First().status(), StatusIs(ErrorCode::kSessionLost));
}

TEST_P(ConformanceTest, AsyncWaitWakesOnRemovalAndCompletesOnce) {
  auto holder = NewSession();
  auto waiter = NewSession();
  ASSERT_TRUE(holder && waiter);
  const std::string q = Queue("async-wake");
  Entry e = Append(*holder, q);
  Outcomes<Status> done;
  std::vector<std::string> ids{e.id};
  std::shared_ptr<void> handle = waiter->async_wait_any_gone(q, ids, done.Callback());
  EXPECT_TRUE(done.NoneWithin(kStillBlocked));
  ASSERT_THAT(holder->remove(q, e.id, In(kPrompt)), IsOk());
  EXPECT_THAT(done.First(), IsOk());
  handle.reset();  // after the outcome: no second one
  EXPECT_EQ(done.Count(), 1u);
}

TEST_P(ConformanceTest, AsyncWaitCompletesAtOnceForWhatIsGoneAndWhenTheOwnerCloses) {
  auto holder = NewSession();
  auto waiter = NewSession();
  ASSERT_TRUE(holder && waiter);
  const std::string q = Queue("async-gone");
  Entry e = Append(*holder, q);
  Entry f = Append(*holder, q);
  ASSERT_THAT(holder->remove(q, e.id, In(kPrompt)), IsOk());
  Outcomes<Status> gone;
  std::vector<std::string> both{f.id, e.id};
  auto h1 = waiter->async_wait_any_gone(q, both, gone.Callback());
  EXPECT_THAT(gone.First(), IsOk());
  Outcomes<Status> closes;
  std::vector<std::string> ids{f.id};
  auto h2 = waiter->async_wait_any_gone(q, ids, closes.Callback());
  EXPECT_TRUE(closes.NoneWithin(kStillBlocked));
  holder->close();
  EXPECT_THAT(closes.First(), IsOk());
  h1.reset();
  h2.reset();
  EXPECT_EQ(gone.Count() + closes.Count(), 2u);
}

// What Session::async_wait_turn's completion gets.
struct Turn {
  Turn(Status s, bool i = false) : first(std::move(s)), second(i) {}  // NOLINT: Outcomes builds it from a Status
  Status first;
  bool second;
};

// Starts `waiter`'s async_wait_turn; its outcomes go to `out`.
std::shared_ptr<void> WaitTurn(Session& waiter, const std::string& q, std::span<const std::string> ids,
                               std::span<const std::string> ahead, const std::string& own, Outcomes<Turn>& out) {
  auto cb = out.Callback();
  return waiter.async_wait_turn(q, ids, ahead, own, [cb](Status s, bool intact) { cb(Turn(std::move(s), intact)); });
}

// Session::async_wait_turn: it wakes as async_wait_any_gone does, and never
// vouches for an own entry removed before (or with) the one waited for,
// whether the removals come while it waits or before its first look. Where
// the store vouches at all, it does for an own entry that stayed.
TEST_P(ConformanceTest, AsyncWaitTurnNeverVouchesForARemovedOwnEntry) {
  auto holder = NewSession();
  auto waiter = NewSession();
  ASSERT_TRUE(holder && waiter);
  const std::string q = Queue("async-turn");
  auto wait_turn = [&](const Entry& ahead, const Entry& own, Outcomes<Turn>& out,
                       std::vector<std::string> before = {}) {
    std::vector<std::string> ids{ahead.id};
    before.push_back(ahead.id);
    return WaitTurn(*waiter, q, ids, before, own.id, out);
  };
  for (bool early : {false, true}) {
    Entry ahead = Append(*holder, q);
    Entry own = Append(*waiter, q);
    Outcomes<Turn> done;
    std::shared_ptr<void> handle;
    if (!early) {
      handle = wait_turn(ahead, own, done);
      std::this_thread::sleep_for(kStillBlocked);  // past the wait's first look
    }
    ASSERT_THAT(holder->remove(q, own.id, In(kPrompt)), IsOk());  // the operator's `dlock break`
    ASSERT_THAT(holder->remove(q, ahead.id, In(kPrompt)), IsOk());
    if (early) handle = wait_turn(ahead, own, done);
    Turn t = done.First();
    EXPECT_THAT(t.first, IsOk()) << (early ? "early" : "while waiting");
    EXPECT_FALSE(t.second) << "vouched for a removed own entry " << (early ? "(early)" : "(while waiting)");
    handle.reset();
    EXPECT_EQ(done.Count(), 1u);
  }
  {
    // An entry ahead of the one waited for is still there: not first.
    Entry first = Append(*holder, q);
    Entry ahead = Append(*holder, q);
    Entry own = Append(*waiter, q);
    Outcomes<Turn> done;
    auto handle = wait_turn(ahead, own, done, {first.id});
    EXPECT_TRUE(done.NoneWithin(kStillBlocked));
    ASSERT_THAT(holder->remove(q, ahead.id, In(kPrompt)), IsOk());
    Turn t = done.First();
    EXPECT_THAT(t.first, IsOk());
    EXPECT_FALSE(t.second) << "vouched while an entry ahead was still there";
    handle.reset();
    ASSERT_THAT(holder->remove(q, first.id, In(kPrompt)), IsOk());
    ASSERT_THAT(waiter->remove(q, own.id, In(kPrompt)), IsOk());
  }
  Entry first = Append(*holder, q);
  Entry ahead = Append(*holder, q);
  Entry own = Append(*waiter, q);
  Outcomes<Turn> done;
  auto handle = wait_turn(ahead, own, done, {first.id});
  EXPECT_TRUE(done.NoneWithin(kStillBlocked));
  ASSERT_THAT(holder->remove(q, first.id, In(kPrompt)), IsOk());  // told, not woken
  EXPECT_TRUE(done.NoneWithin(kStillBlocked));
  EXPECT_TRUE(done.NoneWithin(kStillBlocked));
  ASSERT_THAT(holder->remove(q, ahead.id, In(kPrompt)), IsOk());
  Turn t = done.First();
  EXPECT_THAT(t.first, IsOk());
  std::printf("[ measure ] async_wait_turn vouched for an own entry that stayed: %s\n", t.second ? "yes" : "no");
  const bool vouches = GetParam().rfind("mem", 0) == 0 || GetParam().rfind("redis", 0) == 0;
  if (vouches) {
    EXPECT_TRUE(t.second) << "this store vouches (mem, redis)";
  }
  handle.reset();
  EXPECT_EQ(done.Count(), 1u);
}

// The positive side: with one entry ahead, removed while the own entry
// stays, the stores that can prove it vouch (mem, Redis, and ZooKeeper from
// the order of its watch events), so the waiter is granted without a list.
TEST_P(ConformanceTest, AsyncWaitTurnVouchesBehindOneEntryWhereTheStoreCan) {
  auto holder = NewSession();
  auto waiter = NewSession();
  ASSERT_TRUE(holder && waiter);
  const std::string q = Queue("async-turn-one");
  Entry ahead = Append(*holder, q);
  Entry own = Append(*waiter, q);
  Outcomes<Turn> done;
  std::vector<std::string> ids{ahead.id};
  auto handle = WaitTurn(*waiter, q, ids, ids, own.id, done);
  EXPECT_TRUE(done.NoneWithin(kStillBlocked));  // past the wait's first look
  ASSERT_THAT(holder->remove(q, ahead.id, In(kPrompt)), IsOk());
  Turn t = done.First();
  EXPECT_THAT(t.first, IsOk());
  const std::string& store = GetParam();
  const bool vouches = store.rfind("mem", 0) == 0 || store.rfind("redis", 0) == 0 || store.rfind("zk", 0) == 0;
  if (vouches) {
    EXPECT_TRUE(t.second) << "this store vouches behind one entry (mem, redis, zk)";
  }
  handle.reset();
  EXPECT_EQ(done.Count(), 1u);
  ASSERT_THAT(waiter->remove(q, own.id, In(kPrompt)), IsOk());
}

TEST_P(ConformanceTest, DestroyingTheHandleCancelsTheWaitWithOneOutcome) {
  auto holder = NewSession();
  auto waiter = NewSession();
  ASSERT_TRUE(holder && waiter);
  const std::string q = Queue("async-cancel");
  Entry e = Append(*holder, q);
  std::vector<std::string> ids{e.id};
  Outcomes<Status> done;
  auto handle = waiter->async_wait_any_gone(q, ids, done.Callback());
  EXPECT_TRUE(done.NoneWithin(kStillBlocked));
  handle.reset();
  EXPECT_EQ(done.Count(), 1u) << "the outcome comes before the handle's destructor returns";
  EXPECT_THAT(done.First(), StatusIs(ErrorCode::kCancelled));
  ASSERT_THAT(holder->remove(q, e.id, In(kPrompt)), IsOk());
  std::this_thread::sleep_for(kStillBlocked);  // a late second outcome would show here
  EXPECT_EQ(done.Count(), 1u);
}

TEST_P(ConformanceTest, ManyAsyncWaitsOnOneSessionEachWakeForTheirOwnEntry) {
  constexpr int kWaits = 50;
  auto holder = NewSession();
  auto waiter = NewSession();
  ASSERT_TRUE(holder && waiter);
  std::vector<Entry> entries;
  std::vector<std::unique_ptr<Outcomes<Status>>> done;
  std::vector<std::shared_ptr<void>> handles;
  for (int i = 0; i < kWaits; ++i) {
    const std::string q = Queue("many/" + std::to_string(i));
    entries.push_back(Append(*holder, q));
    done.push_back(std::make_unique<Outcomes<Status>>());
    std::vector<std::string> ids{entries.back().id};
    handles.push_back(waiter->async_wait_any_gone(q, ids, done.back()->Callback()));
  }
  // Every other one is removed; only those wake.
  for (int i = 0; i < kWaits; i += 2) {
    ASSERT_THAT(holder->remove(Queue("many/" + std::to_string(i)), entries[i].id, In(kPrompt)), IsOk());
  }
  for (int i = 0; i < kWaits; i += 2) EXPECT_THAT(done[i]->First(), IsOk()) << i;
  for (int i = 1; i < kWaits; i += 2) EXPECT_EQ(done[i]->Count(), 0u) << i;
  handles.clear();
  for (int i = 0; i < kWaits; ++i) {
    EXPECT_EQ(done[i]->Count(), 1u) << i;
    if (i % 2 == 1) {
      EXPECT_THAT(done[i]->First(), StatusIs(ErrorCode::kCancelled)) << i;
    }
  }
}

TEST_P(ConformanceTest, AsyncWaitEndsWithSessionLostWhenItsOwnSessionCloses) {
  auto holder = NewSession();
  auto waiter = NewSession();
  ASSERT_TRUE(holder && waiter);
  const std::string q = Queue("async-own-close");
  Entry e = Append(*holder, q);
  std::vector<std::string> ids{e.id};
  Outcomes<Status> done;
  auto handle = waiter->async_wait_any_gone(q, ids, done.Callback());
  EXPECT_TRUE(done.NoneWithin(kStillBlocked));
  waiter->close();
  EXPECT_THAT(done.First(), StatusIs(ErrorCode::kSessionLost));
  handle.reset();
  EXPECT_EQ(done.Count(), 1u);
}

TEST_P(ConformanceTest, AHandleMayBeDestroyedInsideItsOwnCompletion) {
  auto holder = NewSession();
  auto waiter = NewSession();
  ASSERT_TRUE(holder && waiter);
  const std::string q = Queue("async-self");
  Entry e = Append(*holder, q);
  std::vector<std::string> ids{e.id};
  std::mutex mu;
  std::shared_ptr<void> handle;
  std::promise<Status> outcome;
  {
    std::lock_guard<std::mutex> g(mu);
    handle = waiter->async_wait_any_gone(q, ids, [&](Status s) {
      std::shared_ptr<void> mine;
      {
        std::lock_guard<std::mutex> g2(mu);
        mine = std::move(handle);
      }
      mine.reset();  // the handle goes inside its own completion
      outcome.set_value(std::move(s));
    });
  }
  ASSERT_THAT(holder->remove(q, e.id, In(kPrompt)), IsOk());
  auto f = outcome.get_future();
  ASSERT_EQ(f.wait_for(kPrompt), std::future_status::ready);
  EXPECT_THAT(f.get(), IsOk());
}

// ------------------------------------------- published values (elections)
//
// update_entry, async_read_head and async_watch_head (store.hpp). A store
// whose keeps_values() is false refuses them (the first case), and the
// others are skipped on it (docs/election.md, build plan: one store at a
// time).

// Skips the test where `s` keeps no values.
#define SKIP_WITHOUT_VALUES(s)                                              \
  do {                                                                      \
    if (!(s).keeps_values()) GTEST_SKIP() << "no values on this store yet"; \
  } while (0)

EntrySpec Candidate(std::string value) {
  EntrySpec spec = Spec(std::string(entry_kind::kCandidate));
  spec.value = std::move(value);
  return spec;
}

Result<Head> ReadHead(Session& s, const std::string& q) {
  Outcomes<Result<Head>> read;
  s.async_read_head(q, {}, In(kPrompt), read.Callback());
  return read.First();
}

// Review finding: a store without values took a value and dropped it, and
// answered a head reading without it.
TEST_P(ConformanceTest, AStoreKeepsValuesOrSaysItDoesNot) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  const std::string q = Queue("values-or-not");
  EntrySpec spec = Spec();  // a lock: every store takes it (not every one takes candidates yet)
  spec.value = "10.0.0.7:8080";
  Entry e = Append(*s, q, spec);
  auto head = ReadHead(*s, q);
  if (!s->keeps_values()) {
    EXPECT_THAT(head.status(), StatusIs(ErrorCode::kUnimplemented));
    EXPECT_THAT(s->update_entry(q, e.id, {.value = "x", .owner = std::nullopt}, In(kPrompt)).status(),
                StatusIs(ErrorCode::kUnimplemented));
    Outcomes<Result<Entry>> updated;
    s->async_update_entry(q, e.id, {.value = "x", .owner = std::nullopt}, In(kPrompt), updated.Callback());
    EXPECT_THAT(updated.First().status(), StatusIs(ErrorCode::kUnimplemented));
    Outcomes<Status> watched;
    auto handle = s->async_watch_head(q, Head{}, watched.Callback());
    EXPECT_THAT(watched.First(), StatusIs(ErrorCode::kUnimplemented));
    return;
  }
  auto listed = s->list(q, {.with_owners = false, .with_values = true}, In(kPrompt));
  ASSERT_THAT(listed.status(), IsOk());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->front().value, std::optional<std::string>("10.0.0.7:8080"));
  ASSERT_THAT(head.status(), IsOk());
  ASSERT_TRUE(head->entry.has_value());
  EXPECT_EQ(head->entry->value, std::optional<std::string>("10.0.0.7:8080"));
}

TEST_P(ConformanceTest, ValuesAreListedAndChangedInPlaceKeepingTokenAndPlace) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  const std::string q = Queue("values");
  SKIP_WITHOUT_VALUES(*s);
  Entry first = Append(*s, q, Candidate("10.0.0.7:8080"));
  Entry second = Append(*s, q, Spec(std::string(entry_kind::kCandidate)));  // no value
  auto listed = s->list(q, {.with_owners = true, .with_values = true}, In(kPrompt));
  ASSERT_THAT(listed.status(), IsOk());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].value, std::optional<std::string>("10.0.0.7:8080"));
  EXPECT_EQ((*listed)[0].kind, entry_kind::kCandidate);
  EXPECT_FALSE((*listed)[1].value.has_value()) << "an entry appended without a value lists none";
  const std::uint64_t version = (*listed)[0].value_version;

  auto updated = s->update_entry(q, first.id, {.value = "10.0.0.8:8080", .owner = std::nullopt}, In(kPrompt));
  ASSERT_THAT(updated.status(), IsOk());
  EXPECT_EQ(updated->id, first.id);
  EXPECT_EQ(updated->value, std::optional<std::string>("10.0.0.8:8080"));
  EXPECT_NE(updated->value_version, version);
  // Where a value leaves no room for an owner record (zk://), the next case
  // checks the refusal instead.
  const bool owners = s->keeps_owners_beside_values();
  OwnerRecord elected = Spec().owner;
  elected.elected_unix_ms = 1'700'000'000'123;
  if (owners) {
    ASSERT_THAT(s->update_entry(q, first.id, {.value = std::nullopt, .owner = elected}, In(kPrompt)).status(), IsOk());
  }

  auto after = s->list(q, {.with_owners = true, .with_values = true}, In(kPrompt));
  ASSERT_THAT(after.status(), IsOk());
  ASSERT_EQ(after->size(), 2u);
  EXPECT_THAT(Ids(*after), ElementsAreArray(std::vector<std::string>{first.id, second.id})) << "the same place";
  EXPECT_EQ((*after)[0].token, first.token) << "an update never changes the token";
  EXPECT_EQ((*after)[0].sequence, (*listed)[0].sequence);
  EXPECT_EQ((*after)[0].kind, entry_kind::kCandidate);
  EXPECT_EQ((*after)[0].value, std::optional<std::string>("10.0.0.8:8080")) << "an owner update keeps the value";
  if (owners) {
    ASSERT_TRUE((*after)[0].owner.has_value());
    EXPECT_EQ((*after)[0].owner->elected_unix_ms, 1'700'000'000'123);
    EXPECT_EQ((*after)[0].owner->host, "conformance-host");
  }
  EXPECT_EQ(Append(*s, q).token > *first.token, true) << "tokens still grow";
}

// docs/election.md §6.1 (zk://: a candidate's data is its bare value): where
// a store keeps no owner record beside a value, an update that would need one
// is refused and changes nothing (a store that said OK and dropped the record
// would be wrong); an entry without a value keeps its record.
TEST_P(ConformanceTest, AnOwnerBesideAValueIsRefusedWhereTheStoreKeepsNone) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  const std::string q = Queue("owner-beside-value");
  SKIP_WITHOUT_VALUES(*s);
  if (s->keeps_owners_beside_values()) GTEST_SKIP() << "this store keeps owner records beside values";
  Entry candidate = Append(*s, q, Candidate("10.0.0.7:8080"));
  auto before = ReadHead(*s, q);
  ASSERT_THAT(before.status(), IsOk());
  ASSERT_TRUE(before->entry.has_value());
  OwnerRecord elected = Spec().owner;
  elected.elected_unix_ms = 1'700'000'000'123;
  EXPECT_THAT(s->update_entry(q, candidate.id, {.value = std::nullopt, .owner = elected}, In(kPrompt)).status(),
              StatusIs(ErrorCode::kUnimplemented))
      << "an owner record beside the value";
  EXPECT_THAT(s->update_entry(q, candidate.id, {.value = "10.0.0.8:8080", .owner = elected}, In(kPrompt)).status(),
              StatusIs(ErrorCode::kUnimplemented))
      << "a new value and an owner record";
  Outcomes<Result<Entry>> async_refused;
  s->async_update_entry(q, candidate.id, {.value = std::nullopt, .owner = elected}, In(kPrompt),
                        async_refused.Callback());
  EXPECT_THAT(async_refused.First().status(), StatusIs(ErrorCode::kUnimplemented));
  auto after = ReadHead(*s, q);
  ASSERT_THAT(after.status(), IsOk());
  ASSERT_TRUE(after->entry.has_value());
  EXPECT_EQ(after->entry->value, std::optional<std::string>("10.0.0.7:8080")) << "nothing changed";
  EXPECT_EQ(after->entry->value_version, before->entry->value_version) << "nothing written";

  Entry lock = Append(*s, q, Spec());  // no value: its owner record stays where it is
  ASSERT_THAT(s->update_entry(q, lock.id, {.value = std::nullopt, .owner = elected}, In(kPrompt)).status(), IsOk());
  auto listed = s->list(q, {.with_owners = true, .with_values = true}, In(kPrompt));
  ASSERT_THAT(listed.status(), IsOk());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_FALSE((*listed)[0].owner.has_value()) << "a candidate's node has no owner record";
  EXPECT_EQ((*listed)[0].value, std::optional<std::string>("10.0.0.7:8080"));
  ASSERT_TRUE((*listed)[1].owner.has_value());
  EXPECT_EQ((*listed)[1].owner->elected_unix_ms, 1'700'000'000'123);
  EXPECT_FALSE((*listed)[1].value.has_value());
}

TEST_P(ConformanceTest, AnUpdateTakesOnlyThisSessionsLiveEntry) {
  auto a = NewSession();
  auto b = NewSession();
  ASSERT_TRUE(a && b);
  const std::string q = Queue("update-refused");
  SKIP_WITHOUT_VALUES(*a);
  Entry mine = Append(*a, q, Candidate("a"));
  EXPECT_THAT(b->update_entry(q, mine.id, {.value = "b", .owner = std::nullopt}, In(kPrompt)).status(),
              StatusIs(ErrorCode::kFailedPrecondition))
      << "another session's entry";
  EXPECT_THAT(
      a->update_entry(Queue("update-elsewhere"), mine.id, {.value = "a2", .owner = std::nullopt}, In(kPrompt)).status(),
      StatusIs(ErrorCode::kFailedPrecondition))
      << "the id in another queue";
  EXPECT_THAT(
      a->update_entry(q, mine.id, {.value = std::string(64 * 1024 + 1, 'x'), .owner = std::nullopt}, In(kPrompt))
          .status(),
      StatusIs(ErrorCode::kInvalidArgument))
      << "a value over 64 KiB";
  EXPECT_THAT(
      a->update_entry(q, mine.id, {.value = std::string("caf\xc3", 4), .owner = std::nullopt}, In(kPrompt)).status(),
      StatusIs(ErrorCode::kInvalidArgument))
      << "a value that is not UTF-8";
  auto head = ReadHead(*b, q);
  ASSERT_THAT(head.status(), IsOk());
  ASSERT_TRUE(head->entry.has_value());
  EXPECT_EQ(head->entry->value, std::optional<std::string>("a")) << "no refused update took effect";
  ASSERT_THAT(a->remove(q, mine.id, In(kPrompt)), IsOk());
  EXPECT_THAT(a->update_entry(q, mine.id, {.value = "a3", .owner = std::nullopt}, In(kPrompt)).status(),
              StatusIs(ErrorCode::kFailedPrecondition))
      << "a removed entry";
  a->close();
  EXPECT_THAT(a->update_entry(q, mine.id, {.value = "a4", .owner = std::nullopt}, In(kPrompt)).status(),
              StatusIs(ErrorCode::kSessionLost));
  EXPECT_THAT(b->append(q, Candidate(std::string(64 * 1024 + 1, 'x')), In(kPrompt)).status(),
              StatusIs(ErrorCode::kInvalidArgument));
  EXPECT_THAT(b->append(q, Candidate("\xed\xa0\x80"), In(kPrompt)).status(),  // a surrogate
              StatusIs(ErrorCode::kInvalidArgument));
  EXPECT_TRUE(List(*b, q).empty());
}

TEST_P(ConformanceTest, ReadHeadGivesTheFirstEntryWithItsValue) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  const std::string q = Queue("head");
  SKIP_WITHOUT_VALUES(*s);
  auto empty = ReadHead(*s, q);
  ASSERT_THAT(empty.status(), IsOk());
  EXPECT_FALSE(empty->entry.has_value());
  Entry first = Append(*s, q, Candidate("first"));
  Entry second = Append(*s, q, Candidate("second"));
  auto head = ReadHead(*s, q);
  ASSERT_THAT(head.status(), IsOk());
  ASSERT_TRUE(head->entry.has_value());
  EXPECT_EQ(head->entry->id, first.id);
  EXPECT_EQ(head->entry->token, first.token);
  EXPECT_EQ(head->entry->value, std::optional<std::string>("first"));
  ASSERT_THAT(s->remove(q, first.id, In(kPrompt)), IsOk());
  head = ReadHead(*s, q);
  ASSERT_THAT(head.status(), IsOk());
  ASSERT_TRUE(head->entry.has_value());
  EXPECT_EQ(head->entry->id, second.id);
  EXPECT_EQ(head->entry->value, std::optional<std::string>("second"));
}

// A head watch of `q`, armed from a fresh reading by `watcher`, that has not
// fired within kStillBlocked. A store may fire once when nothing changed
// (store.hpp: Redis does, for a message about a change made before the
// reading that its subscriber had not read yet; seen under load): the watch
// is then read and armed again, a few times, so a store whose watches always
// fire at once still fails.
struct QuietHeadWatch {
  std::unique_ptr<Outcomes<Status>> outcomes;
  std::shared_ptr<void> handle;  // goes before `outcomes`
  std::string failure;           // set: never quiet
};

QuietHeadWatch ArmQuietHeadWatch(Session& watcher, const std::string& q) {
  QuietHeadWatch w;
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto seen = ReadHead(watcher, q);
    if (!seen.ok()) {
      w.failure = "read_head: " + seen.status().to_string();
      return w;
    }
    w.handle.reset();
    w.outcomes = std::make_unique<Outcomes<Status>>();
    w.handle = watcher.async_watch_head(q, *seen, w.outcomes->Callback());
    if (w.outcomes->NoneWithin(kStillBlocked)) {
      w.failure.clear();
      return w;
    }
    w.failure = "fired before any change, 5 times; the last: " + w.outcomes->First().to_string();
  }
  return w;
}

// Watches the head of `q` from a fresh reading by `watcher`, makes `change`,
// and says whether the watch fired (within kPrompt) and only once.
::testing::AssertionResult FiresOn(Session& watcher, const std::string& q, const std::function<void()>& change) {
  QuietHeadWatch w = ArmQuietHeadWatch(watcher, q);
  if (!w.failure.empty()) return ::testing::AssertionFailure() << w.failure;
  change();
  Status s = w.outcomes->First();
  w.handle.reset();
  if (!s.ok()) return ::testing::AssertionFailure() << "ended with " << s.to_string();
  if (w.outcomes->Count() != 1) return ::testing::AssertionFailure() << w.outcomes->Count() << " outcomes";
  return ::testing::AssertionSuccess();
}

TEST_P(ConformanceTest, AHeadWatchFiresOnEveryChangeOfTheHead) {
  auto leader = NewSession();
  auto next = NewSession();
  auto watcher = NewSession();
  ASSERT_TRUE(leader && next && watcher);
  const std::string q = Queue("head-watch");
  SKIP_WITHOUT_VALUES(*watcher);
  Entry led;
  EXPECT_TRUE(FiresOn(*watcher, q, [&] { led = Append(*leader, q, Candidate("one")); })) << "append to an empty queue";
  Entry behind = Append(*next, q, Candidate("two"));
  EXPECT_TRUE(FiresOn(*watcher, q, [&] {
    EXPECT_THAT(leader->update_entry(q, led.id, {.value = "one'", .owner = std::nullopt}, In(kPrompt)).status(),
                IsOk());
  })) << "the head's value changed";
  EXPECT_TRUE(FiresOn(*watcher, q, [&] { EXPECT_THAT(leader->remove(q, led.id, In(kPrompt)), IsOk()); }))
      << "the head removed";
  auto head = ReadHead(*watcher, q);
  ASSERT_THAT(head.status(), IsOk());
  ASSERT_TRUE(head->entry.has_value());
  EXPECT_EQ(head->entry->id, behind.id);
  EXPECT_TRUE(FiresOn(*watcher, q, [&] { next->close(); })) << "the head's session closed";
  head = ReadHead(*watcher, q);
  ASSERT_THAT(head.status(), IsOk());
  EXPECT_FALSE(head->entry.has_value());
}

TEST_P(ConformanceTest, AHeadWatchFiresAtOnceForAStaleReading) {
  auto s = NewSession();
  auto watcher = NewSession();
  ASSERT_TRUE(s && watcher);
  const std::string q = Queue("head-stale");
  SKIP_WITHOUT_VALUES(*s);
  auto empty = ReadHead(*watcher, q);
  ASSERT_THAT(empty.status(), IsOk());
  Entry e = Append(*s, q, Candidate("v"));
  Outcomes<Status> appended;
  auto h1 = watcher->async_watch_head(q, *empty, appended.Callback());
  EXPECT_THAT(appended.First(), IsOk()) << "the queue is no longer empty";
  auto seen = ReadHead(*watcher, q);
  ASSERT_THAT(seen.status(), IsOk());
  ASSERT_THAT(s->update_entry(q, e.id, {.value = "w", .owner = std::nullopt}, In(kPrompt)).status(), IsOk());
  Outcomes<Status> updated;
  auto h2 = watcher->async_watch_head(q, *seen, updated.Callback());
  EXPECT_THAT(updated.First(), IsOk()) << "the head's value changed since the reading";
  h1.reset();
  h2.reset();
  EXPECT_EQ(appended.Count() + updated.Count(), 2u);
}

// Review finding: mem compared only the head at arming time, so an entry
// that joined an empty queue and left again between the reading and the
// watch went unseen.
TEST_P(ConformanceTest, AHeadWatchSeesAnEntryThatCameAndWentAfterTheReading) {
  auto s = NewSession();
  auto watcher = NewSession();
  ASSERT_TRUE(s && watcher);
  const std::string q = Queue("head-came-and-went");
  SKIP_WITHOUT_VALUES(*s);
  auto empty = ReadHead(*watcher, q);
  ASSERT_THAT(empty.status(), IsOk());
  ASSERT_FALSE(empty->entry.has_value());
  Entry brief = Append(*s, q, Candidate("brief"));
  ASSERT_THAT(s->remove(q, brief.id, In(kPrompt)), IsOk());
  Outcomes<Status> fired;
  auto handle = watcher->async_watch_head(q, *empty, fired.Callback());
  EXPECT_THAT(fired.First(), IsOk()) << "a head that changed after the reading was missed";
  // And with a head: another entry ahead for a moment (a sequence given),
  // on a store that puts one there (etcd orders by creation: only a
  // downgrade takes an earlier place there, and only its own entry's).
  Entry head = Append(*s, q, Candidate("head"));
  auto seen = ReadHead(*watcher, q);
  ASSERT_THAT(seen.status(), IsOk());
  EntrySpec ahead = Candidate("ahead");
  ahead.sequence = 0;
  auto before = s->append(q, ahead, In(kPrompt));
  if (!before.ok()) {
    EXPECT_THAT(before.status(), StatusIs(ErrorCode::kFailedPrecondition));
    return;
  }
  ASSERT_THAT(s->remove(q, before->entry.id, In(kPrompt)), IsOk());
  Outcomes<Status> fired_again;
  auto h2 = watcher->async_watch_head(q, *seen, fired_again.Callback());
  EXPECT_THAT(fired_again.First(), IsOk()) << "an entry ahead for a moment was missed";
  static_cast<void>(head);
}

TEST_P(ConformanceTest, AHeadWatchIsCancelledByItsHandleAndEndsWithItsSession) {
  auto s = NewSession();
  auto watcher = NewSession();
  ASSERT_TRUE(s && watcher);
  const std::string q = Queue("head-cancel");
  SKIP_WITHOUT_VALUES(*s);
  Entry e = Append(*s, q, Candidate("v"));
  QuietHeadWatch cancelled = ArmQuietHeadWatch(*watcher, q);
  ASSERT_TRUE(cancelled.failure.empty()) << cancelled.failure;
  cancelled.handle.reset();
  EXPECT_EQ(cancelled.outcomes->Count(), 1u) << "the outcome comes before the handle's destructor returns";
  EXPECT_THAT(cancelled.outcomes->First(), StatusIs(ErrorCode::kCancelled));
  ASSERT_THAT(s->remove(q, e.id, In(kPrompt)), IsOk());
  std::this_thread::sleep_for(kStillBlocked);  // a late second outcome would show here
  EXPECT_EQ(cancelled.outcomes->Count(), 1u);

  Append(*s, q, Candidate("again"));
  QuietHeadWatch ended = ArmQuietHeadWatch(*watcher, q);
  ASSERT_TRUE(ended.failure.empty()) << ended.failure;
  watcher->close();
  EXPECT_THAT(ended.outcomes->First(), StatusIs(ErrorCode::kSessionLost));
  ended.handle.reset();
  EXPECT_EQ(ended.outcomes->Count(), 1u);
}

// Review finding (etcd, step 5): a downgrade puts its read entry beside the
// write entry it comes from, at the same sequence; where its id sorts first the
// head changed, with no event on the head's key.
TEST_P(ConformanceTest, AHeadWatchFiresWhenADowngradeTakesTheHeadsPlace) {
  auto s = NewSession();
  auto watcher = NewSession();
  ASSERT_TRUE(s && watcher);
  const std::string q = Queue("head-downgrade");
  SKIP_WITHOUT_VALUES(*s);
  Entry write = Append(*s, q, Spec("write"));
  auto seen = ReadHead(*watcher, q);
  ASSERT_THAT(seen.status(), IsOk());
  ASSERT_TRUE(seen->entry.has_value());
  ASSERT_EQ(seen->entry->id, write.id);
  Outcomes<Status> fired;
  auto handle = watcher->async_watch_head(q, *seen, fired.Callback());
  EntrySpec read = Spec("read");
  read.sequence = write.sequence;
  Entry downgraded = Append(*s, q, read);
  auto now = ReadHead(*watcher, q);
  ASSERT_THAT(now.status(), IsOk());
  ASSERT_TRUE(now->entry.has_value());
  if (now->entry->id == write.id) return;  // the head did not change on this store
  EXPECT_EQ(now->entry->id, downgraded.id);
  EXPECT_THAT(fired.First(), IsOk()) << "the head changed from " << write.id << " to " << now->entry->id
                                     << " after the reading, and the watch did not fire";
  handle.reset();
  EXPECT_EQ(fired.Count(), 1u);
}

// Review finding (etcd, step 5): update_entry keeps the token (store.hpp), also
// a downgraded read entry's.
TEST_P(ConformanceTest, AValueUpdateKeepsADowngradedReadEntrysToken) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  const std::string q = Queue("downgrade-update");
  SKIP_WITHOUT_VALUES(*s);
  Entry write = Append(*s, q, Spec("write"));
  EntrySpec read = Spec("read");
  read.sequence = write.sequence;
  read.value = "r1";
  Entry downgraded = Append(*s, q, read);
  ASSERT_TRUE(downgraded.token.has_value());
  auto updated = s->update_entry(q, downgraded.id, {.value = "r2", .owner = std::nullopt}, In(kPrompt));
  ASSERT_THAT(updated.status(), IsOk());
  EXPECT_EQ(updated->token, downgraded.token) << "the returned entry's token";
  // Listed with values: a listing without them may leave tokens out (zk://).
  auto listed = s->list(q, {.with_owners = false, .with_values = true}, In(kPrompt));
  ASSERT_THAT(listed.status(), IsOk());
  for (const Entry& e : *listed) {
    if (e.id == downgraded.id) {
      EXPECT_EQ(e.token, downgraded.token) << "the listed token";
    }
  }
  auto found = s->find_own(q, read.attempt_id, In(kPrompt));
  ASSERT_THAT(found.status(), IsOk());
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->token, downgraded.token) << "find_own's token";
}

// Review finding (etcd, step 5): an owner-only update of one's own live entry
// is refused (kFailedPrecondition: "no such entry, or not this session's") when
// another owner update of it came between its read and its Txn.
TEST_P(ConformanceTest, ConcurrentOwnerUpdatesOfOneOwnEntryAllSucceed) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  const std::string q = Queue("owner-updates");
  SKIP_WITHOUT_VALUES(*s);
  // Where a value leaves no room for an owner record, an entry without one.
  Entry e = Append(*s, q, s->keeps_owners_beside_values() ? Candidate("v") : Spec());
  std::atomic<int> refused{0};
  std::string first_refusal;
  std::mutex mu;
  auto updater = [&](int n) {
    for (int i = 0; i < 25; ++i) {
      OwnerRecord owner = Spec().owner;
      owner.elected_unix_ms = 1'700'000'000'000 + n * 1000 + i;
      auto r = s->update_entry(q, e.id, {.value = std::nullopt, .owner = owner}, In(kPrompt));
      if (!r.ok()) {
        ++refused;
        std::lock_guard<std::mutex> g(mu);
        if (first_refusal.empty()) first_refusal = r.status().to_string();
      }
    }
  };
  std::thread a(updater, 1), b(updater, 2);
  a.join();
  b.join();
  EXPECT_EQ(refused.load(), 0) << "of 50 owner updates of a live own entry; first: " << first_refusal;
}

// Review finding (etcd, step 5: gRPC refused replies over 4 MiB): values of at
// most 64 KiB each, any number of entries; a head reading (and a listing with
// values) of a queue of 72 candidates with 60 KiB values, and of a queue whose
// nested queue holds them.
TEST_P(ConformanceTest, AHeadIsReadAmongManyLargeValues) {
  auto s = NewSession();
  ASSERT_TRUE(s);
  const std::string q = Queue("large");
  SKIP_WITHOUT_VALUES(*s);
  Entry head = Append(*s, q, Candidate("small"));
  for (int i = 0; i < 72; ++i) {
    ASSERT_THAT(s->append(q + "/nested", Candidate(std::string(60 * 1024, 'a' + i % 26)), In(kPrompt)).status(),
                IsOk());
  }
  auto read = ReadHead(*s, q);
  EXPECT_THAT(read.status(), IsOk()) << "the queue itself holds one small entry; its nested queue the large ones";
  for (int i = 0; i < 72; ++i) {
    ASSERT_THAT(s->append(q, Candidate(std::string(60 * 1024, 'a' + i % 26)), In(kPrompt)).status(), IsOk());
  }
  read = ReadHead(*s, q + "/nested");
  EXPECT_THAT(read.status(), IsOk());
  auto listed = s->list(q + "/nested", {.with_owners = false, .with_values = true}, In(kPrompt));
  EXPECT_THAT(listed.status(), IsOk());
}

// Review finding (etcd, step 5: the catch-up was one reply over 4 MiB): a head
// watch from a reading after which the head's value was changed many times with
// large values (while the watch stream was down, or before the watch was made):
// the catch-up must fire it.
TEST_P(ConformanceTest, AHeadWatchFiresAfterManyLargeValueUpdates) {
  auto s = NewSession();
  auto watcher = NewSession();
  ASSERT_TRUE(s && watcher);
  const std::string q = Queue("head-catch-up");
  SKIP_WITHOUT_VALUES(*s);
  Entry e = Append(*s, q, Candidate("v"));
  auto seen = ReadHead(*watcher, q);
  ASSERT_THAT(seen.status(), IsOk());
  for (int i = 0; i < 72; ++i) {
    ASSERT_THAT(
        s->update_entry(q, e.id, {.value = std::string(60 * 1024, 'a' + i % 26), .owner = std::nullopt}, In(kPrompt))
            .status(),
        IsOk());
  }
  Outcomes<Status> fired;
  auto handle = watcher->async_watch_head(q, *seen, fired.Callback());
  EXPECT_THAT(fired.First(), IsOk()) << "the head's value changed since the reading";
  handle.reset();
  // The store's other waits still work.
  Outcomes<Status> gone;
  const std::vector<std::string> ids{e.id};
  auto wait = watcher->async_wait_any_gone(q, ids, gone.Callback());
  ASSERT_THAT(s->remove(q, e.id, In(kPrompt)), IsOk());
  EXPECT_THAT(gone.First(), IsOk());
}

INSTANTIATE_TEST_SUITE_P(Stores, ConformanceTest, ::testing::ValuesIn(testing::ConformanceSpecs()),
                         [](const auto& p) { return testing::SpecName(p.param, p.index); });

}  // namespace
}  // namespace dlock
