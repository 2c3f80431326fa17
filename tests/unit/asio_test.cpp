// dlock/asio.hpp: Asio completion tokens over the asynchronous engine, on
// mem://. Every wait is bounded: a handler that never comes fails the test.
#include "dlock/asio.hpp"

#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "dlock/dlock.hpp"

namespace dlock {
namespace {

using namespace std::chrono_literals;

// Runs `io` on a thread of its own until it runs out of work or `limit`
// passes; joins on destruction.
class IoThread {
 public:
  explicit IoThread(asio::io_context& io) : io_(io) {
    thread_ = std::thread([this] {
      id_ = std::this_thread::get_id();
      io_.run_for(std::chrono::seconds(30));
      ran_out_ = true;
    });
  }
  ~IoThread() { join(); }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  std::thread::id id() const { return id_; }

 private:
  asio::io_context& io_;
  std::thread thread_;
  std::atomic<std::thread::id> id_{};
  std::atomic<bool> ran_out_{false};
};

std::size_t Entries(const Client& c, const std::string& name) {
  auto listed = c.list_entries(name, false);
  return listed.ok() ? listed->size() : 999;
}

// Waits (5 s at most) until `name` has `n` entries; how many it has then.
std::size_t AwaitEntries(const Client& c, const std::string& name, std::size_t n) {
  for (int i = 0; i < 500 && Entries(c, name) != n; ++i) std::this_thread::sleep_for(10ms);
  return Entries(c, name);
}

TEST(AsioTest, ACallbackRunsOnItsExecutorAndNeverInsideTheCall) {
  Client client = Client::connect("mem://");
  Mutex mutex(client, "asio/callback");
  asio::io_context io;
  std::atomic<bool> called{false};
  std::thread::id ran_on;
  std::optional<Hold> got;
  // A plain callback's executor is Asio's system executor: bound to io here.
  async_acquire(mutex, 5s, asio::bind_executor(io, [&](std::exception_ptr error, std::optional<Hold> hold) {
                  EXPECT_FALSE(error);
                  ran_on = std::this_thread::get_id();
                  got = std::move(hold);
                  called = true;
                }));
  std::this_thread::sleep_for(100ms);  // granted by now; the handler waits for its executor
  EXPECT_FALSE(called.load()) << "the handler ran off its executor";
  IoThread runner(io);  // io.run() returns only once the handler ran: it was work of io
  runner.join();
  ASSERT_TRUE(called.load());
  EXPECT_EQ(ran_on, runner.id());
  ASSERT_TRUE(got.has_value());
  EXPECT_GT(got->fencing_token(), 0u);
}

asio::awaitable<void> TakeTurn(Mutex& mutex, std::vector<int>& order, int who) {
  std::optional<Hold> hold = co_await async_acquire(mutex, 10s, asio::use_awaitable);
  if (!hold) co_return;
  order.push_back(who);  // one io thread: no lock needed
}

TEST(AsioTest, CoroutinesAwaitAndAreGrantedInOrder) {
  Client client = Client::connect("mem://");
  Mutex mutex(client, "asio/coroutines");
  std::optional<Hold> first = mutex.acquire(5s);
  ASSERT_TRUE(first.has_value());
  asio::io_context io;
  std::vector<int> order;
  for (int who = 0; who < 5; ++who) asio::co_spawn(io, TakeTurn(mutex, order, who), asio::detached);
  IoThread runner(io);
  AwaitEntries(client, "asio/coroutines", 2);
  EXPECT_TRUE(order.empty()) << "granted while the lock was held";
  first->release();
  runner.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(Entries(client, "asio/coroutines"), 0u);
}

TEST(AsioTest, AFutureTokenAndASemaphoreLease) {
  Client client = Client::connect("mem://");
  Semaphore slots(client, "asio/slots", 3);
  asio::io_context io;
  std::future<std::optional<Lease>> lease = async_acquire(slots, 2, 5s, asio::use_future);
  IoThread runner(io);
  ASSERT_EQ(lease.wait_for(10s), std::future_status::ready);
  std::optional<Lease> got = lease.get();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->permits(), 2u);
  EXPECT_FALSE(slots.try_acquire(2).has_value()) << "2 + 2 of 3 permits";
}

TEST(AsioTest, CancellingAPendingAcquireLeavesNothing) {
  Client client = Client::connect("mem://");
  Mutex mutex(client, "asio/cancel");
  std::optional<Hold> held = mutex.acquire(5s);
  ASSERT_TRUE(held.has_value());
  asio::io_context io;
  asio::cancellation_signal cancel;
  std::promise<std::pair<bool, bool>> outcome;  // (error, hold)
  async_acquire(mutex, kForever,
                asio::bind_cancellation_slot(
                    cancel.slot(), asio::bind_executor(io, [&](std::exception_ptr error, std::optional<Hold> hold) {
                      outcome.set_value({error != nullptr, hold.has_value()});
                    })));
  IoThread runner(io);
  AwaitEntries(client, "asio/cancel", 2);
  ASSERT_EQ(Entries(client, "asio/cancel"), 2u) << "the acquire never queued";
  asio::post(io, [&] { cancel.emit(asio::cancellation_type::terminal); });  // on the slot's thread
  auto f = outcome.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready) << "no outcome after the cancel";
  const auto [error, hold] = f.get();
  EXPECT_FALSE(error);
  EXPECT_FALSE(hold) << "granted although the lock is held";
  EXPECT_EQ(Entries(client, "asio/cancel"), 1u) << "the cancelled acquire left its entry";
  runner.join();
}

TEST(AsioTest, ATimeoutGivesNullopt) {
  Client client = Client::connect("mem://");
  Mutex mutex(client, "asio/timeout");
  std::optional<Hold> held = mutex.acquire(5s);
  ASSERT_TRUE(held.has_value());
  asio::io_context io;
  std::future<std::optional<Hold>> late = async_acquire(mutex, 50ms, asio::use_future);
  IoThread runner(io);
  ASSERT_EQ(late.wait_for(10s), std::future_status::ready);
  EXPECT_FALSE(late.get().has_value());
  EXPECT_EQ(Entries(client, "asio/timeout"), 1u);
}

// A stop_token of the caller's own reaches the acquire.
TEST(AsioTest, AStopTokenOfTheCallersOwnCancels) {
  Client client = Client::connect("mem://");
  Mutex mutex(client, "asio/stop");
  std::optional<Hold> held = mutex.acquire(5s);
  ASSERT_TRUE(held.has_value());
  asio::io_context io;
  std::stop_source stop;
  std::future<std::optional<Hold>> waiting = async_acquire(mutex, kForever, stop.get_token(), asio::use_future);
  IoThread runner(io);
  AwaitEntries(client, "asio/stop", 2);
  stop.request_stop();
  ASSERT_EQ(waiting.wait_for(10s), std::future_status::ready);
  EXPECT_FALSE(waiting.get().has_value());
  EXPECT_EQ(Entries(client, "asio/stop"), 1u);
}

// An executor that is gone before the handler runs: the handler goes with
// its Hold, and the lock is free again.
TEST(AsioTest, AHandlerThatNeverRunsReleasesItsHold) {
  Client client = Client::connect("mem://");
  Mutex mutex(client, "asio/dropped");
  {
    asio::io_context io;
    std::atomic<bool> called{false};
    async_acquire(mutex, 5s, asio::bind_executor(io, [&](std::exception_ptr, std::optional<Hold>) { called = true; }));
    AwaitEntries(client, "asio/dropped", 1);
    // A blocking call of the same client runs on the client's dlock thread
    // after the grant's step: once it returns, the handler was posted to io
    // (which never runs), and io may go.
    EXPECT_TRUE(Mutex(client, "asio/probe").acquire(0s).has_value());
    EXPECT_FALSE(called.load());
  }  // io goes, and the posted handler with it
  AwaitEntries(client, "asio/dropped", 0);
  EXPECT_EQ(Entries(client, "asio/dropped"), 0u) << "the undelivered hold was never released";
  EXPECT_TRUE(mutex.acquire(0s).has_value());
}

// Review: a wrong argument is told through the handler. With use_awaitable,
// Asio starts the operation inside a noexcept await_suspend: thrown there,
// it ended the process (std::terminate).
TEST(AsioTest, AWrongArgumentIsThrownAtTheCoAwait) {
  Client client = Client::connect("mem://");
  Semaphore slots(client, "asio/wrong", 2);
  asio::io_context io;
  std::atomic<int> outcome{0};  // 1: threw dlock::Error, 2: returned, 3: threw something else
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        try {
          co_await async_acquire(slots, 0, 1s, asio::use_awaitable);
          outcome = 2;
        } catch (const Error&) {
          outcome = 1;
        } catch (...) {
          outcome = 3;
        }
      },
      asio::detached);
  io.run_for(10s);
  EXPECT_EQ(outcome.load(), 1);
}

// Review: an io_context stopped and destroyed with a coroutine still
// waiting for a lock. Asio destroys its own operations' handlers then;
// dlock's acquire kept waiting, later posted its Hold into the destroyed
// context (a use-after-free under ASan) and the lock was never released.
TEST(AsioTest, AnIoContextDestroyedWhileAnAcquireWaitsEndsTheAcquire) {
  Client client = Client::connect("mem://");
  Mutex mutex(client, "asio/gone");
  std::optional<Hold> held = mutex.acquire(5s);
  ASSERT_TRUE(held.has_value());
  std::atomic<bool> resumed{false};
  {
    asio::io_context io;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          std::optional<Hold> h = co_await async_acquire(mutex, kForever, asio::use_awaitable);
          resumed = true;
        },
        asio::detached);
    std::thread runner([&] { io.run_for(10s); });
    AwaitEntries(client, "asio/gone", 2);
    EXPECT_EQ(Entries(client, "asio/gone"), 2u) << "the acquire never queued";
    io.stop();
    runner.join();
  }  // the coroutine goes with io; its acquire is told to stop
  AwaitEntries(client, "asio/gone", 1);
  EXPECT_EQ(Entries(client, "asio/gone"), 1u) << "the abandoned acquire is still queued";
  EXPECT_FALSE(resumed.load());
  held->release();
  EXPECT_TRUE(mutex.acquire(2s).has_value()) << "the lock leaked";
}

// An executor whose post() returns late (a preempted dlock thread): its
// io_context may be destroyed before the post returns. Review: dlock's
// callback then still held the work guard and released it into the freed
// context (a use-after-free that ASan shows).
struct SlowPostExecutor {
  asio::io_context* io;
  std::atomic<bool>* posted;
  asio::execution_context& context() const noexcept { return *io; }
  void on_work_started() const noexcept { io->get_executor().on_work_started(); }
  void on_work_finished() const noexcept { io->get_executor().on_work_finished(); }
  template <class F, class A>
  void dispatch(F&& f, const A& a) const {
    io->get_executor().dispatch(std::forward<F>(f), a);
  }
  template <class F, class A>
  void post(F&& f, const A& a) const {
    io->get_executor().post(std::forward<F>(f), a);
    posted->store(true);
    std::this_thread::sleep_for(300ms);
  }
  template <class F, class A>
  void defer(F&& f, const A& a) const {
    post(std::forward<F>(f), a);
  }
  friend bool operator==(const SlowPostExecutor& a, const SlowPostExecutor& b) noexcept { return a.io == b.io; }
  friend bool operator!=(const SlowPostExecutor& a, const SlowPostExecutor& b) noexcept { return a.io != b.io; }
};

TEST(AsioTest, AnIoContextDestroyedRightAfterThePostIsSafe) {
  Client client = Client::connect("mem://");
  Mutex mutex(client, "asio/posted-then-gone");
  std::atomic<bool> posted{false}, called{false};
  {
    auto io = std::make_unique<asio::io_context>();
    async_acquire(mutex, 5s,
                  asio::bind_executor(SlowPostExecutor{io.get(), &posted},
                                      [&](std::exception_ptr, std::optional<Hold>) { called = true; }));
    for (int i = 0; i < 500 && !posted; ++i) std::this_thread::sleep_for(10ms);
    ASSERT_TRUE(posted.load());
    io.reset();
  }
  EXPECT_FALSE(called.load());
  EXPECT_TRUE(mutex.acquire(2s).has_value()) << "the undelivered hold was never released";
}

}  // namespace
}  // namespace dlock
