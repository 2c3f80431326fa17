// Regression tests for defects an adversarial review found in the first
// round of issue 11's fixes (each failed on that code; the comment above
// each test tells the interleaving). Only mem:// and a delegating wrapper
// around it are used, so each run is deterministic.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "dlock/dlock.hpp"
#include "support/child.hpp"
#include "support/manual_world.hpp"
#include "support/stores.hpp"

namespace dlock {
namespace {

using namespace std::chrono_literals;
using testing::Eventually;
using testing::ManualWorld;
using testing::RunInChild;

// ---------------------------------------------------------------------------
// Finding: "a stop request wins over a grant" was fixed in the engine
// (AwaitTurn) only. Semaphore::acquire (and so SemaphoreMutex::lock_for)
// decides its own grant in semaphore.cpp step 3 and never looks at `stop`
// there: a stop requested while the last look at the leases is on its way
// still returns a lease.
//
// Interleaving: B waits for A's lease (wait_any_gone); A releases; B's wait
// returns OK; B lists the leases (held back by delay_next); the caller
// requests stop; the list comes back with B's lease alone -> B returns a
// Lease although stop was requested before the grant was decided.
// The Mutex control case, with the same interleaving, returns nullopt.
TEST(Regressions, SemaphoreGivesUpWhenStopComesBeforeItsGrant) {
  ManualWorld w;
  auto& [clock, store, a, b] = w;
  Semaphore sa(a, "review/sem-stop", 1);
  Semaphore sb(b, "review/sem-stop", 1);
  auto held = sa.acquire(1, 1s);
  ASSERT_TRUE(held);

  std::stop_source stop;
  std::atomic<bool> done{false};
  std::optional<Lease> got;
  std::jthread waiter([&] {
    got = sb.acquire(1, kForever, stop.get_token());
    done = true;
  });
  // B holds <name>/locks and has its lease appended: 3 entries (A's lease,
  // B's lock entry, B's lease); B now waits for A's lease to go.
  ASSERT_TRUE(Eventually([&] { return store->entry_count() == 3u && store->op_count("wait") >= 1u; }));
  store->delay_next("list", 1s);
  held.reset();  // A's lease goes; B wakes and lists (held back)
  ASSERT_TRUE(Eventually([&] { return store->op_count("delayed") >= 1u; }));
  stop.request_stop();  // before the grant is decided
  clock->advance(2s);   // the list returns: only B's lease
  ASSERT_TRUE(Eventually([&] { return done.load(); }));
  waiter.join();
  EXPECT_FALSE(got.has_value()) << "Semaphore::acquire returned a lease (token " << (got ? got->fencing_token() : 0)
                                << ") although stop was requested before its grant was decided";
}

TEST(Regressions, MutexGivesUpWhenStopComesBeforeItsGrant) {
  ManualWorld w;
  auto& [clock, store, a, b] = w;
  Mutex ma(a, "review/mutex-stop");
  Mutex mb(b, "review/mutex-stop");
  auto held = ma.acquire(1s);
  ASSERT_TRUE(held);
  std::stop_source stop;
  std::atomic<bool> done{false};
  std::optional<Hold> got;
  std::jthread waiter([&] {
    got = mb.acquire(kForever, stop.get_token());
    done = true;
  });
  ASSERT_TRUE(Eventually([&] { return store->entry_count() == 2u && store->op_count("wait") >= 1u; }));
  store->delay_next("list", 1s);
  held.reset();
  ASSERT_TRUE(Eventually([&] { return store->op_count("delayed") >= 1u; }));
  stop.request_stop();
  clock->advance(2s);
  ASSERT_TRUE(Eventually([&] { return done.load(); }));
  waiter.join();
  EXPECT_FALSE(got.has_value());
  EXPECT_TRUE(Eventually([&] { return store->entry_count() == 0u; }));
}

// ---------------------------------------------------------------------------
// Finding: item 11 made a timeout <= 0 one try, but a tiny *positive* timeout
// still never tries: AcquireEntry's Run() returns "timed out" at its very
// first line (Expired()) before any request is sent. So on a free lock
// try_lock_for(0ns) succeeds while try_lock_for(1us) fails; the standard
// TimedLockable (and std::timed_mutex) attempts the lock at least once for
// any timeout.
TEST(Regressions, TinyPositiveTimeoutsStillTryOnce) {
  auto store = MemStore::create();
  auto a = Client::with_store(store);
  ASSERT_TRUE(a.session().ok());  // the session exists: nothing left to open
  Mutex m(a, "review/tiny");
  ASSERT_TRUE(m.try_lock_for(0ns)) << "control: a zero timeout is one try";
  m.unlock();
  const auto appends_before = store->op_count("append");
  EXPECT_TRUE(m.try_lock_for(1ns)) << "try_lock_for(1ns) on a free lock returned false without trying; appends made: "
                                   << store->op_count("append") - appends_before;
  if (m.owned_by_current_thread()) m.unlock();
  int failures = 0;
  for (int i = 0; i < 20; ++i) {
    if (m.try_lock_for(1us)) {
      m.unlock();
    } else {
      ++failures;
    }
  }
  EXPECT_EQ(failures, 0) << failures << " of 20 try_lock_for(1us) on a free lock returned false";
  Semaphore sem(a, "review/tiny-sem", 1);
  EXPECT_TRUE(sem.acquire(1, 1us).has_value()) << "Semaphore::acquire(1, 1us) on a free semaphore";
}

// Review finding (issue 14): on a client that has no session yet, the
// deadline of a tiny timeout passed while the session was being opened for
// the first pass, which then never tried.
TEST(Regressions, TinyTimeoutsTryOnceOnAClientWithoutASession) {
  auto store = MemStore::create();
  int failures = 0;
  for (int i = 0; i < 20; ++i) {
    auto fresh = Client::with_store(store);
    Mutex m(fresh, "review/tiny-fresh");
    if (i % 2 == 0) {
      failures += m.try_lock_for(1ns) ? 0 : 1;
      if (m.owned_by_current_thread()) m.unlock();
    } else {
      failures += m.acquire(1ns).has_value() ? 0 : 1;
    }
  }
  EXPECT_EQ(failures, 0) << failures << " of 20 tiny-timeout tries on a free lock returned without the lock";
  auto fresh = Client::with_store(store);
  EXPECT_TRUE(Semaphore(fresh, "review/tiny-fresh-sem", 1).acquire(1, 1us).has_value());
}

// ---------------------------------------------------------------------------
// Finding: a downgraded read hold gets a fresh token (mem, file: the next
// counter value; ZooKeeper: its own czxid) but the write entry's place in
// the queue. A writer that queued behind the write hold has an older,
// smaller token, and is granted after the read hold: tokens of successive
// holds of one lock go down. hold.hpp: "The fencing token: larger than that
// of every earlier hold of the same lock in the same store"; README: a
// resource should "remember the largest token it has seen and refuse
// requests carrying a smaller one" -- it would refuse this writer.
TEST(Regressions, DowngradedReadHoldNeverOutranksTheWriterQueuedBehindIt) {
  auto store = MemStore::create();
  auto a = Client::with_store(store);
  auto b = Client::with_store(store);
  ReadWriteLock rwa(a, "review/downgrade");
  ReadWriteLock rwb(b, "review/downgrade");
  rwa.writer().lock();
  const std::uint64_t write_token = rwa.writer().fencing_token().value();
  std::atomic<std::uint64_t> next_writer_token{0};
  std::jthread writer([&] {
    rwb.writer().lock();
    next_writer_token = rwb.writer().fencing_token().value();
    rwb.writer().unlock();
  });
  ASSERT_TRUE(Eventually([&] { return store->entry_count() == 2u; }));  // B queued behind A's write
  rwa.reader().lock_shared();                                           // downgrade
  const std::uint64_t read_token = rwa.reader().fencing_token().value();
  rwa.writer().unlock();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(next_writer_token.load(), 0u) << "the writer slipped in during the downgrade";
  rwa.reader().unlock_shared();
  writer.join();
  // Holds in grant order: write (A), read (A, downgraded: it continues the
  // write hold and keeps its token), write (B).
  EXPECT_EQ(read_token, write_token);
  EXPECT_GT(next_writer_token.load(), read_token)
      << "tokens in grant order: write " << write_token << ", read " << read_token << ", then write "
      << next_writer_token.load() << ": the later writer carries a smaller token than the read hold before it";
}

// ---------------------------------------------------------------------------
// A Store that delegates to a MemStore and lets a test act at two exact
// points of HoldCore::Make: inside subscribe() (before the hold's listener
// is registered) and inside state() (after Make read it).
class HookedStore final : public Store {
 public:
  explicit HookedStore(std::shared_ptr<MemStore> inner) : inner_(std::move(inner)) {}
  std::string url() const override { return inner_->url(); }
  Result<std::shared_ptr<Session>> open_session(Clock::time_point d) override {
    auto s = inner_->open_session(d);
    if (!s.ok()) return s.status();
    return std::shared_ptr<Session>(std::make_shared<HookedSession>(std::move(*s), this));
  }
  std::function<void(const std::string&)> before_subscribe;  // runs once
  std::function<void(const std::string&)> after_state_read;  // runs once
  std::atomic<int> wait_throws{0};                           // the next N wait_any_gone calls throw std::bad_alloc
  std::atomic<int> subscribe_throws{0};                      // the next N subscribe calls throw std::bad_alloc
  // Which form of append the engine used, and on which thread.
  std::atomic<int> blocking_appends{0};
  std::atomic<int> async_appends{0};
  std::atomic<std::thread::id> blocking_append_thread{};
  // Whether its sessions say their blocking wait sleeps in the calling
  // thread, and the threads that made blocking waits.
  std::atomic<bool> direct_waits{false};
  std::mutex waits_mu;
  std::vector<std::thread::id> wait_threads;

 private:
  class HookedSession final : public Session {
   public:
    HookedSession(std::shared_ptr<Session> inner, HookedStore* store) : inner_(std::move(inner)), store_(store) {}
    std::string id() const override { return inner_->id(); }
    SessionState state() const noexcept override {
      SessionState s = inner_->state();
      if (auto hook = std::exchange(store_->after_state_read, nullptr)) hook(id());
      return s;
    }
    std::shared_ptr<void> subscribe(std::function<void(SessionState)> fn) override {
      if (store_->subscribe_throws.fetch_sub(1) > 0) throw std::bad_alloc();
      if (auto hook = std::exchange(store_->before_subscribe, nullptr)) hook(id());
      return inner_->subscribe(std::move(fn));
    }
    Result<Appended> append(std::string_view q, const EntrySpec& s, Clock::time_point d) override {
      store_->blocking_appends.fetch_add(1);
      store_->blocking_append_thread.store(std::this_thread::get_id());
      return inner_->append(q, s, d);
    }
    void async_append(std::string_view q, const EntrySpec& s, Clock::time_point d,
                      std::function<void(Result<Appended>)> done) override {
      store_->async_appends.fetch_add(1);
      inner_->async_append(q, s, d, std::move(done));
    }
    Result<std::vector<Entry>> list(std::string_view q, const ListOptions& o, Clock::time_point d) override {
      return inner_->list(q, o, d);
    }
    Status wait_any_gone(std::string_view q, std::span<const std::string> ids, Clock::time_point d,
                         std::stop_token st) override {
      if (store_->wait_throws.fetch_sub(1) > 0) throw std::bad_alloc();
      {
        std::lock_guard<std::mutex> g(store_->waits_mu);
        store_->wait_threads.push_back(std::this_thread::get_id());
      }
      return inner_->wait_any_gone(q, ids, d, std::move(st));
    }
    bool waits_on_calling_thread() const noexcept override { return store_->direct_waits.load(); }
    Status remove(std::string_view q, std::string_view id, Clock::time_point d) override {
      return inner_->remove(q, id, d);
    }
    Result<std::optional<Entry>> find_own(std::string_view q, std::string_view a, Clock::time_point d) override {
      return inner_->find_own(q, a, d);
    }
    void close() noexcept override { inner_->close(); }

   private:
    std::shared_ptr<Session> inner_;
    HookedStore* store_;
  };
  std::shared_ptr<MemStore> inner_;
};

// A blocking acquire makes its requests with the store's blocking forms, on
// the calling thread (which waits anyway: no hand-over to a store thread and
// back, e.g. etcd's synchronous gRPC call, Redis's pooled connection); an
// asynchronous acquire with the asynchronous forms, never blocking the
// executor.
TEST(Engine, ABlockingAcquireRequestsOnItsOwnThreadAndAnAsynchronousOneAsynchronously) {
  auto mem = MemStore::create();
  auto hooked = std::make_shared<HookedStore>(mem);
  auto a = Client::with_store(hooked);
  Mutex m(a, "engine/request-forms");
  m.lock();
  m.unlock();
  EXPECT_EQ(hooked->blocking_appends.load(), 1);
  EXPECT_EQ(hooked->async_appends.load(), 0);
  EXPECT_EQ(hooked->blocking_append_thread.load(), std::this_thread::get_id());
  std::optional<Hold> h = m.acquire_future(5s).get();
  ASSERT_TRUE(h);
  EXPECT_EQ(hooked->async_appends.load(), 1);
  EXPECT_EQ(hooked->blocking_appends.load(), 1) << "the asynchronous acquire used the blocking form";
}

// Where the store's blocking wait sleeps in the calling thread (file://), a
// blocking acquire makes its waits there, on its own thread; elsewhere, and
// for an asynchronous acquire everywhere, the waits are asynchronous (over
// this double, which has no asynchronous wait of its own, the default's
// thread of its own: never the caller's, never the executor).
TEST(Engine, ABlockingAcquireWaitsOnItsOwnThreadWhereTheStoreCan) {
  auto mem = MemStore::create();
  auto hooked = std::make_shared<HookedStore>(mem);
  auto a = Client::with_store(hooked);
  auto holder = Client::with_store(mem);
  Mutex held(holder, "engine/wait-forms");
  Mutex m(a, "engine/wait-forms");
  // Waits, with `held` held, until it is released from another thread; the
  // threads of the blocking waits made meanwhile.
  auto waits_while = [&](const std::function<bool()>& acquire) {
    {
      std::lock_guard<std::mutex> g(hooked->waits_mu);
      hooked->wait_threads.clear();
    }
    std::optional<Hold> h = held.acquire(5s);
    EXPECT_TRUE(h);
    std::jthread releaser([&] {
      // Released once the acquire waits (its entry is second in line).
      Eventually([&] { return mem->entry_count() >= 2; }, 5s);
      std::this_thread::sleep_for(20ms);
      h->release();
    });
    EXPECT_TRUE(acquire());
    releaser.join();
    std::lock_guard<std::mutex> g(hooked->waits_mu);
    return hooked->wait_threads;
  };
  const std::thread::id here = std::this_thread::get_id();
  auto blocking = [&] {
    const bool got = m.try_lock_for(10s);
    if (got) m.unlock();
    return got;
  };
  hooked->direct_waits = true;
  std::vector<std::thread::id> threads = waits_while(blocking);
  ASSERT_FALSE(threads.empty());
  EXPECT_EQ(threads.front(), here) << "the blocking acquire did not wait on its own thread";
  threads = waits_while([&] { return m.acquire_future(10s).get().has_value(); });
  EXPECT_TRUE(std::find(threads.begin(), threads.end(), here) == threads.end()) << "an async acquire blocked a thread";
  hooked->direct_waits = false;
  threads = waits_while(blocking);
  ASSERT_FALSE(threads.empty());
  EXPECT_NE(threads.front(), here) << "a store that cannot wait on the calling thread was made to";
}

// Finding: HoldCore::Make subscribes, then reads the session's state and, if
// it is not kConnected, applies it itself -- on the acquiring thread, outside
// the session's ordered delivery. If the session was suspended just before
// the subscription and the reconnect is delivered between Make's read and
// Make's apply, the hold hears kConnected first (no change: it is kHeld) and
// then Make's stale kSuspended: it says kUncertain for good although its
// session is connected (state() keeps the worse "told" value).
TEST(Regressions, HoldMadeDuringAReconnectEndsUpHeld) {
  auto mem = MemStore::create();
  auto hooked = std::make_shared<HookedStore>(mem);
  auto a = Client::with_store(hooked);
  Mutex m(a, "review/make-race");
  ASSERT_TRUE(a.session().ok());
  // The blip: suspended after the grant, before Make subscribes, and back
  // (delivered to the new listener) right after Make read kSuspended.
  hooked->before_subscribe = [&](const std::string& id) {
    mem->suspend(id);
    hooked->after_state_read = [&](const std::string& sid) { mem->resume(sid); };
  };
  auto hold = m.acquire(1s);
  ASSERT_TRUE(hold);
  ASSERT_EQ(a.session_state(), SessionState::kConnected);
  EXPECT_TRUE(Eventually([&] { return hold->state() == HoldState::kHeld; }, 2s))
      << "the session is connected, but the hold says " << HoldStateName(hold->state()) << " for good";
}

// Finding: the acquisition engine is not exception-safe. Store methods may
// throw std::bad_alloc (item 15 says so, and made try_pending catch it), and
// so may HoldCore::Make after the grant; an exception that leaves
// AcquireEntry/AcquireHold after our entry was placed leaves the entry in the
// queue for the rest of the session's life: an orphan (item 13's class of
// leak). A granted orphan is at the head of the queue, so nobody else can
// take the lock while that session lives (a long-lived Client: forever).
TEST(Regressions, AllocationFailureWhileWaitingLeavesNoOrphan) {
  auto mem = MemStore::create();
  auto hooked = std::make_shared<HookedStore>(mem);
  auto a = Client::with_store(hooked);
  auto d = Client::with_store(mem);
  Mutex md(d, "review/orphan-oom");
  Mutex ma(a, "review/orphan-oom");
  md.lock();
  hooked->wait_throws = 1;  // out of memory inside wait_any_gone, after the append
  // The wait runs on a store thread (Session::async_wait_any_gone's default
  // over this blocking double), which turns the exception into the wait's
  // outcome: the acquire fails with an internal error rather than rethrowing
  // std::bad_alloc. What matters is what it leaves behind.
  try {
    ma.try_lock_for(1s);
    ADD_FAILURE() << "the acquire did not fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal) << e.what();
  } catch (const std::bad_alloc&) {  // where the engine itself ran out
  }
  md.unlock();
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(mem->entry_count(), 0u) << "the failed acquire's entry stayed, and is now at the head of the queue";
  EXPECT_TRUE(md.try_lock_for(300ms)) << "nobody can take the lock while client a's session lives";
  if (md.owned_by_current_thread()) md.unlock();
}

// Control: an exception in HoldCore::Make (after the grant) is covered, since
// the HoldCore already exists and its destructor releases the entry.
TEST(Regressions, AllocationFailureInHoldCreationLeavesNoOrphan) {
  auto mem = MemStore::create();
  auto hooked = std::make_shared<HookedStore>(mem);
  auto a = Client::with_store(hooked);
  Mutex ma(a, "review/orphan-oom-make");
  ASSERT_TRUE(a.session().ok());
  hooked->subscribe_throws = 1;
  EXPECT_THROW(ma.try_lock(), std::bad_alloc);
  EXPECT_TRUE(Eventually([&] { return mem->entry_count() == 0u; }, 2s));
}

// Finding (thread safety): hold.hpp says of dlock::Hold "all methods are
// thread-safe, including release() racing with a state change", but Hold
// keeps a plain std::shared_ptr<HoldCore> core_ that release() resets while
// state()/lost_token()/fencing_token() read it: a data race, and a
// use-after-free when the reset drops the last reference while the other
// thread is inside core_->state(). A watchdog thread polling a hold's
// state while the worker releases it is the everyday case. Run under TSan
// (build with -DDLOCK_SANITIZE=thread): it reports the race on core_.
TEST(Regressions, HoldStateMayBeReadWhileAnotherThreadReleases) {
  auto store = MemStore::create();
  auto a = Client::with_store(store);
  Mutex m(a, "review/hold-race");
  for (int round = 0; round < 200; ++round) {
    auto hold = m.acquire(1s);
    ASSERT_TRUE(hold);
    std::atomic<bool> go{false};
    std::jthread watchdog([&] {
      while (!go) {
      }
      for (int i = 0; i < 50; ++i) [[maybe_unused]] auto s = hold->state();
    });
    go = true;
    hold->release();
  }
}

// Finding: since item 7, lost_token() requests the stop itself when it reads
// an uncertain/lost session before the store thread has told the hold, and
// the token's stop_callbacks then run on the calling thread -- for Mutex,
// SemaphoreMutex and ReadWriteLock, inside the accessor, with the object's
// internal mutex (ThreadOwnedLock::mu_, SemaphoreMutexCore::mu_,
// ReadWriteCore::mu_) held. A callback that touches the same object
// (unlock(), hold_state(), fencing_token()) locks that mutex again on the same
// thread: a self-deadlock. Before item 7 the callbacks only ran on the store's
// thread, with no lock of the object held.
//
// Interleaving: the session is suspended; its delivery is held up in another
// hold's listener (subscribed earlier), so this hold is not told yet; the
// owning thread calls m.lost_token() -> mu_ -> HoldCore::lost_token() ->
// request_stop() -> callback -> m.hold_state() -> mu_ again.
int LostTokenCallbackScenario(bool semaphore_mutex, bool touch_object = true) {
  auto store = MemStore::create();
  auto a = Client::with_store(store);
  Mutex first(a, "review/cb-first");
  auto blocker = first.acquire(1s);  // its listener comes first in the session's order
  if (!blocker) return 3;
  std::atomic<bool> in_listener{false}, let_go{false};
  auto sub = blocker->on_state_change([&](HoldState) {
    in_listener = true;
    for (int i = 0; i < 20000 && !let_go; ++i) std::this_thread::sleep_for(1ms);
  });
  Mutex m(a, "review/cb-mutex");
  SemaphoreMutex sm(a, "review/cb-semmutex");
  std::atomic<int> callbacks{0};
  std::optional<std::stop_callback<std::function<void()>>> cb;
  if (semaphore_mutex) {
    sm.lock();
    cb.emplace(sm.lost_token(), std::function<void()>([&] {
                 ++callbacks;
                 if (touch_object) sm.unlock();  // give the lock back as soon as it is in doubt
               }));
  } else {
    m.lock();
    cb.emplace(m.lost_token(), std::function<void()>([&] {
                 ++callbacks;
                 if (touch_object) [[maybe_unused]]
                   auto st = m.hold_state();  // log how it stands
               }));
  }
  std::thread suspender([&] { store->suspend(a.session().value()->id()); });
  while (!in_listener) std::this_thread::sleep_for(1ms);
  // The session says kSuspended; this thread's hold has not been told.
  std::stop_token t = semaphore_mutex ? sm.lost_token() : m.lost_token();  // deadlocks here
  let_go = true;
  suspender.join();
  return (t.stop_requested() && callbacks == 1) ? 0 : 4;
}

// Finding (same shape): client.hpp says on_background_error "Runs on a dlock
// thread", but ThreadOwnedLock::unlock() (and SemaphoreMutexCore::unlock,
// ReadWriteCore::unlock) calls it on the caller's thread with the object's
// mutex held. An error handler that looks at the same Mutex (to log who owns
// it) deadlocks the unlocking thread.
TEST(Regressions, BackgroundErrorCallbackMayCallIntoTheMutex) {
  std::string outcome = RunInChild(
      [] {
        auto store = MemStore::create();
        std::function<void()> on_error;
        ClientOptions options;
        options.on_background_error = [&](const Status&) {
          if (on_error) on_error();
        };
        auto a = Client::with_store(store, options);
        Mutex m(a, "review/bg-error");
        on_error = [&] { [[maybe_unused]] bool mine = m.owned_by_current_thread(); };
        m.unlock();  // not locked: a no-op "reported to on_background_error"
        return 0;
      },
      std::chrono::seconds(10));
  EXPECT_EQ(outcome, "exit 0") << "Mutex::unlock() with an on_background_error that reads the Mutex: " << outcome;
}

TEST(Regressions, LostTokenStopCallbackMayTouchTheMutex) {
  std::string outcome = RunInChild([] { return LostTokenCallbackScenario(false); }, std::chrono::seconds(15));
  EXPECT_EQ(outcome, "exit 0") << "Mutex::lost_token(): " << outcome;
}

TEST(Regressions, LostTokenStopCallbackMayUnlockTheSemaphoreMutex) {
  std::string outcome = RunInChild([] { return LostTokenCallbackScenario(true); }, std::chrono::seconds(15));
  EXPECT_EQ(outcome, "exit 0") << "SemaphoreMutex::lost_token(): " << outcome;
}

// Control: the same steps with callbacks that do not touch the object.
TEST(Regressions, LostTokenStopCallbackNotTouchingTheObject) {
  EXPECT_EQ(RunInChild([] { return LostTokenCallbackScenario(false, false); }, std::chrono::seconds(15)), "exit 0");
  EXPECT_EQ(RunInChild([] { return LostTokenCallbackScenario(true, false); }, std::chrono::seconds(15)), "exit 0");
}

// ---------------------------------------------------------------------------
// Finding (CI, chaos.redis-data under TSan): an acquire that gave up while
// its session was being opened left the opener thread running, and that
// thread kept the client alive: destroying the last Client and Mutex
// returned at once, and the opener went on touching the store (closing and
// opening sessions) while the process ran its exit handlers. After the
// last handle goes, no dlock thread may still run.
//
// DISABLED: the fix (the opener holding no reference, joined by the
// destructor) was reverted after review: a session listener run by the
// opener could drop the last reference on the opener itself (use after
// free, reproduced), and a store thread dropping it could deadlock with the
// opener closing that store's session. Open; see docs/notes.md.
class GatedOpenStore final : public Store {
 public:
  explicit GatedOpenStore(std::shared_ptr<MemStore> inner) : inner_(std::move(inner)) {}
  std::string url() const override { return inner_->url(); }
  Result<std::shared_ptr<Session>> open_session(Clock::time_point d) override {
    std::unique_lock lock(mu_);
    entered_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
    lock.unlock();
    auto s = inner_->open_session(d);
    lock.lock();
    returned_ = true;
    return s;
  }
  void wait_entered() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return entered_; });
  }
  void open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool returned() {
    std::lock_guard lock(mu_);
    return returned_;
  }

 private:
  std::shared_ptr<MemStore> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false, open_ = false, returned_ = false;
};

TEST(Regressions, DestroyingTheLastHandleWaitsForTheSessionOpener) {
  auto gated = std::make_shared<GatedOpenStore>(MemStore::create());
  std::optional<Client> client = Client::with_store(gated);
  std::optional<Mutex> m;
  m.emplace(*client, "review/opener-outlives");
  std::stop_source stop;
  std::thread acquirer([&] { EXPECT_FALSE(m->acquire(10s, stop.get_token()).has_value()); });
  gated->wait_entered();  // the opener is inside open_session now
  stop.request_stop();
  acquirer.join();  // the acquire gave up; its session is still being opened

  // Destroys every handle on another thread; the gate opens only once that
  // has returned, or after a while if it is (rightly) waiting for the opener.
  std::atomic<bool> destroyed{false};
  bool opener_done_when_destroyed = false;
  std::thread destroyer([&] {
    m.reset();
    client.reset();
    opener_done_when_destroyed = gated->returned();
    destroyed = true;
  });
  for (int i = 0; i < 50 && !destroyed; ++i) std::this_thread::sleep_for(10ms);
  gated->open();
  destroyer.join();
  EXPECT_TRUE(opener_done_when_destroyed)
      << "the last Client and Mutex were gone while a dlock thread was still opening a session";
}

// Review finding: a hold's watch on its own entry ended for good after a
// store error (a file:// epoll failure, a Redis check error): a later
// `dlock break` of the entry was never told.
TEST(Regressions, AHoldsEntryWatchIsArmedAgainAfterAStoreError) {
  auto store = MemStore::create();
  Client owner = Client::with_store(store);
  Client other = Client::with_store(store);
  const std::string name = "review/rewatch";
  store->fail_next("wait", UnavailableError("injected: the watch failed"), 2);
  std::optional<Hold> h = Mutex(owner, name).acquire(5s);  // uncontended: the first wait is the hold's watch
  ASSERT_TRUE(h);
  auto listed = other.list_entries(name, false);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  ASSERT_TRUE(other.remove_entry(name, listed->front().id).ok());  // `dlock break`
  EXPECT_TRUE(Eventually([&] { return h->state() == HoldState::kLost; }, 30s))
      << "the hold is still " << HoldStateName(h->state()) << " after its entry was removed";
  EXPECT_GE(store->op_count("wait"), 3u);
}

}  // namespace
}  // namespace dlock
