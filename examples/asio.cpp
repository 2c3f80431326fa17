// Asio completion tokens (dlock/asio.hpp, optional: it needs standalone
// Asio): an Asio server's coroutines lock per entity without a thread each,
// and resume on their own io_context.
#include <dlock/asio.hpp>
#include <dlock/dlock.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <cstdio>
#include <deque>
#include <optional>
#include <string>

using namespace std::chrono_literals;

asio::awaitable<void> Ship(dlock::Mutex& order, int& shipped) {
  // Suspends without a thread; resumes on this coroutine's io_context.
  std::optional<dlock::Hold> hold = co_await dlock::async_acquire(order, 5s, asio::use_awaitable);
  if (hold) ++shipped;  // one io thread: no lock needed for the count
}  // the hold is released here

int main(int argc, char** argv) {
  auto client = dlock::Client::connect(argc > 1 ? argv[1] : "file://");
  std::deque<dlock::Mutex> orders;  // Mutex does not move: a deque keeps them in place
  for (int i = 0; i < 100; ++i) orders.emplace_back(client, "shipments/" + std::to_string(i));

  asio::io_context io;
  int shipped = 0;
  for (auto& order : orders) asio::co_spawn(io, Ship(order, shipped), asio::detached);
  io.run();  // returns once every acquire has completed and its coroutine ended
  std::printf("%d orders shipped\n", shipped);
  return shipped == 100 ? 0 : 1;
}
