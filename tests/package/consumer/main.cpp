// The acceptance program of the core issue, unchanged.
#include <chrono>
#include <cstdio>
#include <dlock/dlock.hpp>
#include <mutex>
#include <shared_mutex>

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  auto client = dlock::Client::connect(argc > 1 ? argv[1] : "mem://");
  dlock::Mutex m(client, "demo/mutex");
  std::uint64_t first = 0;
  {
    std::unique_lock lock(m);
    first = m.fencing_token().value();
    std::unique_lock again(m);  // reentrant in the same thread
  }
  if (!m.try_lock_for(50ms)) return 1;
  if (m.fencing_token().value() <= first) return 2;  // tokens only grow
  m.unlock();

  dlock::Semaphore sem(client, "demo/sem", 3);
  auto two = sem.acquire(2, 1s);  // std::optional<dlock::Lease>
  if (!two) return 3;
  if (sem.acquire(2, 50ms)) return 4;  // only one permit is left
  two.reset();

  dlock::ReadWriteLock rw(client, "demo/rw");
  {
    std::shared_lock r1(rw.reader());
    std::shared_lock r2(rw.reader());
  }
  { std::unique_lock w(rw.writer()); }
  std::puts("ok");
  return 0;
}
