// Waiting without a thread: many acquires pending at once, completed on
// dlock's own thread, in the three forms every lock class offers.
#include <dlock/dlock.hpp>

#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstdio>
#include <deque>
#include <future>
#include <optional>
#include <string>

using namespace std::chrono_literals;

// Any coroutine type will do; this one starts at once and never suspends
// except at its co_await.
struct Task {
  struct promise_type {
    Task get_return_object() { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

Task Charge(dlock::Mutex& order, std::promise<std::uint64_t>& done) {
  // Suspends without blocking a thread; resumes on dlock's thread.
  std::optional<dlock::Hold> hold = co_await order.async_acquire(5s);
  done.set_value(hold ? hold->fencing_token() : 0);
}  // the hold is released here

int main(int argc, char** argv) {
  auto client = dlock::Client::connect(argc > 1 ? argv[1] : "file://");

  // 1. Callbacks: 200 orders locked at once, no thread per wait. Each
  //    callback is called exactly once, on dlock's thread; keep it short.
  std::deque<dlock::Mutex> orders;  // Mutex does not move: a deque keeps them in place
  for (int i = 0; i < 200; ++i) orders.emplace_back(client, "orders/" + std::to_string(i));
  std::atomic<int> charged{0};
  std::promise<void> all_done;
  for (auto& order : orders) {
    order.async_acquire(5s, {}, [&](dlock::Result<std::optional<dlock::Hold>> r) {
      if (r.ok() && r.value()) {
        // ... work under the lock; the hold goes when `r` does
      }
      if (++charged == 200) all_done.set_value();
    });
  }
  all_done.get_future().wait();

  // 2. A future.
  std::future<std::optional<dlock::Hold>> f = orders[0].acquire_future(5s);
  if (!f.get()) return 1;

  // 3. A coroutine.
  std::promise<std::uint64_t> token;
  Charge(orders[1], token);
  std::printf("charged %d orders; coroutine token %llu\n", charged.load(),
              static_cast<unsigned long long>(token.get_future().get()));
  return 0;
}
