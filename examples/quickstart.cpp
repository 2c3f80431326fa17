// The README's "Using the library": a Mutex, a Semaphore and a ReadWriteLock
// on one store. Run it with a store URL; the default, file://, is a
// directory of this user's (/tmp/dlock-UID) that needs no server.
#include <dlock/dlock.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>         // std::unique_lock
#include <shared_mutex>  // std::shared_lock

// Stand-ins for the work an application does under its locks. A resource
// that must never see two holders at once remembers the largest fencing
// token it has seen and refuses smaller ones.
void write_ledger(std::uint64_t token) {
  std::printf("ledger written under token %llu\n", static_cast<unsigned long long>(token));
}
void deploy(std::uint64_t token) {
  std::printf("deployed under token %llu\n", static_cast<unsigned long long>(token));
}
void read_catalog() { std::puts("catalog read"); }
void rewrite_catalog() { std::puts("catalog rewritten"); }

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  auto client = dlock::Client::connect(argc > 1 ? argv[1] : "file://");  // or zk://, redis://, mem://

  dlock::Mutex m(client, "billing/nightly");
  {
    std::unique_lock lock(m);                 // blocks until held
    write_ledger(m.fencing_token().value());  // this thread holds m, so it has a token
  }
  if (m.try_lock_for(5s)) {
    write_ledger(*m.fencing_token());
    m.unlock();
  }

  dlock::Semaphore slots(client, "deploy/slots", 3);
  if (auto lease = slots.acquire(1, 30s)) {  // std::optional<dlock::Lease>
    deploy(lease->fencing_token());          // a Lease's token is a plain number
  }                                          // the permit is returned here

  dlock::ReadWriteLock catalog(client, "catalog");
  {
    std::shared_lock reading(catalog.reader());
    read_catalog();
  }
  {
    std::unique_lock writing(catalog.writer());
    rewrite_catalog();
  }
}
